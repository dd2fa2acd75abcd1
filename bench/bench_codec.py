"""Ledger-core throughput: encode+sign, decode+validate+verify, and bare pynacl verify in the same run.

Usage: python -m bench.bench_codec [--ops N] [--rounds R]

The rounds interleave the three measurements so machine noise hits them alike; the figure that
matters is the ratio of full decode+validate+verify to bare Ed25519 verification of the same
messages (target: at least 0.5).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable

import nacl.signing

from ledger.cid import CID
from ledger.embedder import HashingEmbedder, pack_float16
from ledger.keys import AuthorKey, public_key_from_did
from ledger.ops import Block, Embedding, Experience, Kind, Operation, sign
from ledger.params import NetworkParams
from ledger.validation import validate

CONTEXTS = [
    "solving geometry problems with intersections",
    "counting lattice paths",
    "bounding a sum",
    "a proof by induction stalls",
    "comparing two rates",
    "an invariant seems to fail",
    "probabilities of dependent events",
    "optimising over integers",
    "a function is defined piecewise",
]
ACTIONS = [
    "check the boundary cases separately",
    "draw the configuration before computing",
    "look for a bijection with a simpler set",
    "strengthen the hypothesis",
    "verify the answer against small cases",
    "separate the cases by parity",
    "name every quantity first",
]


def make_operations(count: int, params: NetworkParams, seed: int = 7) -> list[tuple[Operation, AuthorKey]]:
    """A realistic mix: mostly adds, then modifies, votes, deletes and merges, from 20 authors."""
    rng = random.Random(seed)
    embedder = HashingEmbedder(params.embedding_dim)
    keys = [AuthorKey(bytes([i + 1]) * 32) for i in range(20)]
    known: list[CID] = [CID.for_block(bytes([i])) for i in range(8)]  # stand-ins for earlier experiences
    result = []
    for index in range(count):
        text = f"When {rng.choice(CONTEXTS)}, {rng.choice(ACTIONS)} and {rng.choice(ACTIONS)}."
        content = Experience(
            text,
            ("math", rng.choice(["geometry", "algebra", "combinatorics"])),
            rng.random(),
            Embedding(embedder.model_id, embedder.dim, pack_float16(embedder.embed([text])[0])),
        )
        parents = tuple(sorted(set(rng.sample(known, 2))))
        roll = rng.random()
        common = {"author": "", "clock": index + 1, "parents": parents, "created": 1_700_000_000 + index}
        if roll < 0.6:
            op = Operation(Kind.ADD, content=content, **common)
        elif roll < 0.75:
            op = Operation(Kind.MODIFY, target=rng.choice(known), content=content, **common)
        elif roll < 0.85:
            op = Operation(Kind.VOTE, target=rng.choice(known), vote=rng.choice((1, -1)), **common)
        elif roll < 0.95:
            op = Operation(Kind.DELETE, target=rng.choice(known), reason="proven incorrect in evaluation", **common)
        else:
            op = Operation(Kind.MERGE, targets=parents, content=content, reason="same pattern", **common)
        result.append((op, rng.choice(keys)))
        known.append(CID.for_block(index.to_bytes(8, "big")))
    return result


def rate(action: Callable[[], None], count: int) -> float:
    start = time.perf_counter()
    action()
    return count / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    params = NetworkParams(embedding_model="feature-hash-v1")  # embedding is not part of this measure
    operations = make_operations(args.ops, params)
    blocks: list[Block] = [sign(op, key) for op, key in operations]
    bare = [
        (nacl.signing.VerifyKey(public_key_from_did(b.op.author)), b.signing_bytes(), b.op.signature) for b in blocks
    ]
    mean_bytes = statistics.mean(len(b.data) for b in blocks)

    def encode_sign() -> None:
        for op, key in operations:
            sign(op, key)

    def decode_validate_verify() -> None:
        for block in blocks:
            validate(block.data, params)

    def bare_verify() -> None:
        for verify_key, message, signature in bare:
            verify_key.verify(message, signature)

    figures: dict[str, list[float]] = {"encode+sign": [], "decode+validate+verify": [], "bare pynacl verify": []}
    for round_number in range(1, args.rounds + 1):
        figures["encode+sign"].append(rate(encode_sign, len(operations)))
        figures["decode+validate+verify"].append(rate(decode_validate_verify, len(blocks)))
        figures["bare pynacl verify"].append(rate(bare_verify, len(blocks)))
        print(f"round {round_number}/{args.rounds} done", file=sys.stderr, flush=True)

    print(f"{len(blocks)} operations, mean {mean_bytes:.0f} bytes, median of {args.rounds} rounds")
    medians = {name: statistics.median(values) for name, values in figures.items()}
    for name, value in medians.items():
        print(f"  {name:<24} {value:>9,.0f} ops/s")
    ratio = medians["decode+validate+verify"] / medians["bare pynacl verify"]
    verdict = "met" if ratio >= 0.5 else "NOT met"
    print(f"  ratio decode+validate+verify / bare verify: {ratio:.2f} (target >= 0.50: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
