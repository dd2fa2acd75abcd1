"""A realistic stream of signed operations from many honest authors, for the ledger benchmarks."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator

from ledger.cid import CID
from ledger.embedder import embedder_for, pack_float16
from ledger.keys import AuthorKey
from ledger.ops import Block, Embedding, Experience, Kind, Operation, sign
from ledger.params import NetworkParams

SUBJECTS = [
    "geometry problems with intersections",
    "lattice path counts",
    "sums of positive terms",
    "proofs by induction",
    "rates of growth",
    "invariants under moves",
    "dependent events",
    "integer optimisation",
    "piecewise functions",
    "recurrences",
    "modular arithmetic",
    "inequalities",
]
VERBS = ["check", "draw", "bound", "enumerate", "verify", "separate", "name", "test", "compare", "simplify"]
OBJECTS = [
    "the boundary cases",
    "a small instance",
    "each quantity",
    "the extreme values",
    "both directions",
    "the parity",
    "the degenerate cases",
    "every assumption",
    "the units",
    "the symmetric cases",
]

#: the insight 2% of adds repeat on purpose (near-duplicates): the largest cluster of copies
REPEATED = f"When working on {SUBJECTS[0]}, {VERBS[0]} {OBJECTS[0]}."
#: experiences further back than this are no longer targeted (a living library's activity is recent)
_WINDOW = 5000
#: share of each kind in the stream; votes dominate, as usage feedback does in a living library
MIX = ((Kind.ADD, 0.25), (Kind.MODIFY, 0.10), (Kind.DELETE, 0.03), (Kind.MERGE, 0.02), (Kind.VOTE, 0.60))


def _word(serial: int) -> str:
    """A distinct letters-only word per serial number (numbers would fail the generality rule)."""
    letters = ""
    while True:
        serial, digit = divmod(serial, 26)
        letters += chr(ord("a") + digit)
        if not serial:
            return "variant" + letters


def _text(rng: random.Random, serial: int) -> str:
    """Mostly distinct texts (a serial word and random pseudo-words); 2% repeat on purpose (near-duplicates)."""
    if rng.random() < 0.02:
        return REPEATED
    noise = " ".join("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=6)) for _ in range(4))
    return f"When working on {rng.choice(SUBJECTS)}, {rng.choice(VERBS)} {rng.choice(OBJECTS)} {noise} {_word(serial)}."


def operations(count: int, params: NetworkParams, seed: int = 1, authors: int = 20) -> Iterator[Block]:
    """`count` signed operations in a causal order with honest Lamport clocks and some concurrency."""
    rng = random.Random(seed)
    embedder = embedder_for(params)
    keys = [AuthorKey(bytes([i + 1]) * 32) for i in range(authors)]
    # CIDs are kept as raw bytes: containers of bytes and ints are not tracked by the garbage
    # collector, so the generator's state does not lengthen the full collections the benchmarks measure
    live: list[bytes] = []
    recent: list[tuple[bytes, int]] = []
    clocks: dict[bytes, int] = {}
    latest_modify: dict[bytes, bytes] = {}  # clients build a modify on the version they read
    kinds, weights = zip(*MIX, strict=True)
    for serial in range(count):
        kind = rng.choices(kinds, weights)[0] if len(live) >= 2 else Kind.ADD
        fields: dict[str, object] = {}
        if kind in (Kind.ADD, Kind.MODIFY, Kind.MERGE):
            text = _text(rng, serial)
            vector = pack_float16(embedder.embed([text])[0])
            fields["content"] = Experience(
                text,
                ("math", rng.choice(SUBJECTS[:4]).split()[0]),
                rng.random(),
                Embedding(embedder.model_id, embedder.dim, vector),
            )
        if kind in (Kind.MODIFY, Kind.VOTE):
            fields["target"] = CID(rng.choice(live[-2000:]))
        if kind is Kind.VOTE:
            fields["vote"] = rng.choice((1, 1, 1, -1))
        elif kind is Kind.DELETE:
            fields["target"] = CID(live.pop(rng.randrange(max(0, len(live) - 2000), len(live))))
            fields["reason"] = "proven incorrect in evaluation"
        elif kind is Kind.MERGE:
            a, b = live.pop(), live.pop(rng.randrange(max(0, len(live) - 50), len(live)))
            fields["targets"], fields["reason"] = tuple(sorted((CID(a), CID(b)))), "same pattern"
        window = recent[-8:]
        parents = {raw for raw, _ in rng.sample(window, min(len(window), rng.randint(1, 2)))}
        target = fields["target"].raw if isinstance(fields.get("target"), CID) else None
        if kind is Kind.MODIFY and target in latest_modify:
            parents.add(latest_modify[target])
        merged = [cid.raw for cid in fields.get("targets", ())]
        links = [*parents, *([target] if target else []), *merged]
        clock = 1 + max((clocks[link] for link in links), default=0)
        op = Operation(kind, "", clock, tuple(CID(raw) for raw in sorted(parents)), 1_700_000_000 + serial, **fields)
        block = sign(op, rng.choice(keys))
        cid = block.cid.raw
        clocks[cid] = clock
        if kind is Kind.MODIFY:
            latest_modify[target] = cid
        recent.append((cid, clock))
        if kind in (Kind.ADD, Kind.MERGE):
            live.append(cid)
        if len(live) > 2 * _WINDOW:  # only recent experiences are targeted: keep the generator's memory flat
            del live[:_WINDOW]
            keep = set(live) | {cid for cid, _ in recent[-8:]} | set(latest_modify.values())
            clocks = {cid: clock for cid, clock in clocks.items() if cid in keep}
            recent = recent[-8:]
            latest_modify = {target: cid for target, cid in latest_modify.items() if target in keep}
        if serial % 10_000 == 9_999:
            print(f"  generated {serial + 1:,}/{count:,} operations", file=sys.stderr, flush=True)
        yield block
