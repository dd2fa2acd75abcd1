"""The differential scenario: random histories whose library is compared with the reference fold after each step.

Shared by tests/test_reference.py and tests/mutants.py (which plants mistakes in the live library for it to catch).
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

from ledger.audit import AuditResult, audit
from ledger.ledger import Ledger
from ledger.ops import Block, Kind
from ledger.params import NetworkParams
from tests import factories as f
from tests.ledgers import ACTIONS, CONTEXTS, open_ledger, random_history

#: near-duplicates of each other (from their own authors), but the second and third are not near each other: late
#: copies of one of them join experiences, or take adds out of one (the chain of tests/test_convergence.py)
COPIES = (
    "When solving geometry problems with intersections, check all of the bounds.",
    "When solving geometry problems with many intersections, check all the bounds.",
    "When solving geometry problems with intersections, always check the bounds.",
    "When solving geometry problems with intersections, check the bounds.",
)


def params_for(causal: int, absorption: int) -> NetworkParams:
    return dataclasses.replace(f.PARAMS, causal_horizon=causal, absorption_horizon=absorption)


def acting_on(rng: random.Random, history: list[Block], count: int, first_key: int) -> list[Block]:
    """Copies at low clocks, and modifies, deletes, merges and votes just above the experiences they name, some
    concurrent with merges of them (no parents but the target), some descending from what acted on it before."""
    creators = [b for b in history if b.op.kind in (Kind.ADD, Kind.MERGE)]
    made: list[Block] = []
    for number in range(count):
        key, roll = f.author(first_key + number), rng.random()
        if roll < 0.35 or len(creators) < 2:
            text = rng.choice(COPIES)
            block = f.signed(f.operation(Kind.ADD, clock=rng.randint(1, 6), content=f.content(text)), key)
            creators.append(block)
            made.append(block)
            continue
        target = rng.choice(creators)
        on = [b for b in made if target.cid in (b.op.target, *b.op.targets)]
        parents = {target.cid} | ({rng.choice(on).cid} if on and rng.random() < 0.5 else set())
        clock = 1 + max(b.op.clock for b in [*history, *made] if b.cid in parents) + rng.randrange(3)
        text = f"When {rng.choice(CONTEXTS)}, {rng.choice(ACTIONS)}."
        if roll < 0.5:
            kind, fields = Kind.VOTE, {"target": target.cid, "vote": rng.choice((1, -1))}
        elif roll < 0.7:
            kind, fields = Kind.MODIFY, {"target": target.cid, "content": f.content(text)}
        elif roll < 0.85:
            kind, fields = Kind.DELETE, {"target": target.cid, "reason": "proven incorrect"}
        else:
            other = rng.choice([c for c in creators if c.cid != target.cid])
            parents |= {other.cid}
            clock = max(clock, 1 + other.op.clock)
            targets = tuple(sorted((target.cid, other.cid)))
            kind, fields = Kind.MERGE, {"targets": targets, "content": f.content(text), "reason": "same"}
        block = f.signed(f.operation(kind, clock=clock, parents=tuple(parents), **fields), key)
        made.append(block)
        if kind is Kind.MERGE:
            creators.append(block)
    return made


def schedule(rng: random.Random, blocks: list[Block]) -> list[list[bytes]]:
    """Shuffled into batches of one to six, with duplicates, and some operations held back to the end."""
    order = [b.data for b in blocks]
    rng.shuffle(order)
    order += [rng.choice(order) for _ in range(rng.randint(0, 3))]
    held = [order.pop(rng.randrange(len(order))) for _ in range(rng.randint(0, len(order) // 4))]
    order += held
    batches = []
    while order:
        step = rng.randint(1, 6)
        batches.append(order[:step])
        order = order[step:]
    return batches


def check(ledger: Ledger, params: NetworkParams) -> AuditResult:
    result = audit(ledger.view(), params)
    assert result.matches, result.line()
    return result


def history_of(seed: int, size: int) -> list[Block]:
    rng = random.Random(seed)
    history = random_history(rng, size)
    return history + acting_on(rng, history, rng.randint(3, 14), 20)


def differential_run(seed: int, path: Path) -> str | None:
    """The differential scenario on one seed: a history with copies and what acts on them in random batches, then
    operations sorting before it one at a time, audited after each step; the first difference's line, else None."""
    rng = random.Random(seed)
    causal, absorption = rng.choice([1, 3, 8, 1024]), rng.choice([1, 2, 3, 4096])
    params = params_for(causal, absorption)
    history = history_of(seed, rng.randint(10, 60))
    late = acting_on(rng, [b for b in history if b.op.clock <= 3], 8, 90)
    ledger = open_ledger(path, causal, absorption)
    try:
        steps = [*schedule(rng, history), *([block.data] for block in late)]
        for batch in steps:
            ledger.ingest(batch)
            result = audit(ledger.view(), params)
            if not result.matches:
                return result.line()
    except Exception as exc:  # a mutant may also break the fold itself
        return f"the fold failed: {exc!r}"
    finally:
        ledger.close()
    return None
