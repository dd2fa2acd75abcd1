"""Helpers to build ledgers and random multi-author histories for tests and benchmarks."""

from __future__ import annotations

import dataclasses
import hashlib
import random
from pathlib import Path

from ledger.cid import CID
from ledger.ledger import Ledger
from ledger.ops import Block, Kind
from ledger.tables import (
    BLOCK,
    BUCKET,
    BY_AUTHOR,
    COMPONENT,
    COMPONENT_OP,
    COMPONENT_SIZE,
    LOG,
    MEMBER,
    META,
    NODE,
    SEQ,
)
from tests import factories as f

CONTEXTS = (
    "solving geometry problems with intersections",
    "counting lattice paths on a grid",
    "bounding a sum of positive terms",
    "a proof by induction stalls",
    "comparing two rates of growth",
    "an invariant seems to fail",
)
ACTIONS = (
    "check the boundary cases separately",
    "draw the configuration before computing",
    "look for a bijection with a simpler set",
    "verify the answer against small cases",
)


def open_ledger(
    path: Path,
    causal_horizon: int = f.PARAMS.causal_horizon,
    absorption_horizon: int = f.PARAMS.absorption_horizon,
) -> Ledger:
    """A ledger of the test network; a small `causal_horizon` makes operations a few clock levels apart ordered,
    a small `absorption_horizon` keeps near-duplicates a few clocks apart from absorbing each other (§7.6)."""
    params = dataclasses.replace(f.PARAMS, causal_horizon=causal_horizon, absorption_horizon=absorption_horizon)
    return Ledger.open(path, params)


#: tables whose contents depend on what this node saw and when, not only on the set of operations: its log and
#: Merkle tree (arrival order), block locations, metadata; components, which a node joins and never splits
#: (PROTOCOL.md §7.5); and bucket anchor clocks, which may be stale (§7.6)
_NODE_LOCAL_TABLES = (META, BLOCK, SEQ, LOG, NODE, BY_AUTHOR, COMPONENT, MEMBER, COMPONENT_OP, COMPONENT_SIZE, BUCKET)


def converged_state(ledger: Ledger) -> tuple:
    """What nodes holding the same set of operations must agree on: the snapshot, the state root, and every
    table the fold derives (records, domain index, statuses, votes, absorption, heads...), one digest per table.

    The snapshot alone misses a wrong derived table that no snapshot reads, such as a stale domain index entry.
    """
    rows: dict[bytes, list[bytes]] = {}
    for key, value in ledger.store.scan(b""):
        if key[:1] not in _NODE_LOCAL_TABLES:
            rows.setdefault(key[:1], []).append(len(key).to_bytes(4, "big") + key + value)
    tables = tuple((table.decode(), hashlib.sha256(b"|".join(rows[table])).hexdigest()) for table in sorted(rows))
    return ledger.view().snapshot(), ledger.view().state_root(), tables


def random_history(rng: random.Random, size: int, authors: int = 3) -> list[Block]:
    """A causally plausible history: adds (some near-duplicate), concurrent modifies, deletes, merges, votes.

    Parents are a random subset of recent operations, so many operations are concurrent; a few
    operations carry a clock that is too low, which the fold must treat as void.
    """
    keys = [f.author(i + 1) for i in range(authors)]
    blocks: list[Block] = []
    creators: list[Block] = []
    clocks: dict[CID, int] = {}
    for _ in range(size):
        key = rng.choice(keys)
        roll = rng.random()
        if not creators or roll < 0.3:
            kind, fields, targets = Kind.ADD, {}, []
        elif roll < 0.5:
            target = rng.choice(creators).cid
            kind, fields, targets = Kind.MODIFY, {"target": target}, [target]
        elif roll < 0.6:
            target = rng.choice(creators).cid
            kind, fields, targets = Kind.DELETE, {"target": target, "reason": "proven incorrect"}, [target]
        elif roll < 0.75 and len(creators) >= 2:
            targets = sorted(rng.sample([c.cid for c in creators], 2))
            kind, fields = Kind.MERGE, {"targets": tuple(targets), "reason": "same pattern"}
        else:
            target = rng.choice(blocks).cid  # sometimes not an experience at all
            kind, fields, targets = Kind.VOTE, {"target": target, "vote": rng.choice((1, -1))}, [target]
        if kind in (Kind.ADD, Kind.MODIFY, Kind.MERGE):
            text = f"When {rng.choice(CONTEXTS)}, {rng.choice(ACTIONS)}."
            fields["content"] = f.content(text, confidence=rng.choice((0.5, 0.75, 1.0)))
        recent = blocks[-6:]  # authors mostly build on what they saw last: clocks grow steadily
        seen = rng.sample(recent, min(len(recent), rng.randint(1, 3)))
        parents = {b.cid for b in seen} | {t for t in targets if rng.random() < 0.7}
        clock = 1 + max((clocks[p] for p in [*parents, *targets]), default=0)
        if rng.random() < 0.05:
            clock = max(1, clock - 1)  # a dishonest or buggy clock
        block = f.signed(f.operation(kind, clock=clock, parents=tuple(parents), **fields), key)
        repeated = block.cid in clocks  # the same fields can come up twice: the same operation
        clocks[block.cid] = clock
        blocks.append(block)
        if kind in (Kind.ADD, Kind.MERGE) and not repeated:
            creators.append(block)  # unique, so a merge never names one experience twice
    return blocks
