"""The heart of the project: the same SET of operations gives the same library, whatever the arrival order.

Late operations (low clocks after a long history, late copies that split and join experiences) are in
tests/test_convergence_late.py: a file each, the suite's workers share them."""

import itertools
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.ops import Kind
from tests import factories as f
from tests.ledgers import ACTIONS, CONTEXTS, converged_state, open_ledger, random_history
from tests.strategies import ABSORPTION_HORIZONS, HORIZONS


def _deliveries(rng: random.Random, blocks: list, count: int) -> list[list[list[bytes]]]:
    """Several arrival schedules: shuffled, with duplicates, some operations held back to the end, random batches."""
    schedules = []
    for _ in range(count):
        order = [b.data for b in blocks]
        rng.shuffle(order)
        order += [rng.choice(order) for _ in range(rng.randint(0, 4))]  # duplicates
        delayed = [order.pop(rng.randrange(len(order))) for _ in range(rng.randint(0, len(order) // 3))]
        order += delayed
        batches, index = [], 0
        while index < len(order):
            step = rng.randint(1, 6)
            batches.append(order[index : index + step])
            index += step
        schedules.append(batches)
    return schedules


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(2, 36), horizon=HORIZONS, absorption=ABSORPTION_HORIZONS)
def test_any_arrival_order_gives_identical_snapshots_and_state_roots(tmp_path_factory, seed, size, horizon, absorption):
    rng = random.Random(seed)
    blocks = random_history(rng, size)
    results = set()
    for number, schedule in enumerate(_deliveries(rng, blocks, 4)):
        ledger = open_ledger(tmp_path_factory.mktemp(f"n{number}"), horizon, absorption)
        for batch in schedule:
            outcomes = ledger.ingest(batch)
            assert all(o.outcome != "invalid" for o in outcomes), [o.errors for o in outcomes]
        assert ledger.view().pending() == [] and ledger.view().missing() == set()
        results.add(converged_state(ledger))
        ledger.rebuild_library()
        results.add(converged_state(ledger))
        ledger.close()
    assert len(results) == 1


def test_near_duplicate_adds_in_every_order_converge(tmp_path):
    """Four adds of one insight (exact and near copies) with operations on them, delivered in all 24 orders."""
    texts = [
        "When solving geometry problems with intersections, check the bounds.",
        "When solving geometry problems with intersections, check the bounds",
        "When solving geometry problems with intersections check the bounds.",
        "When solving geometry problems with intersections, check the bounds.",
    ]
    adds = [
        f.signed(f.operation(Kind.ADD, clock=1 + i % 2, content=f.content(t)), f.author(i + 1))
        for i, t in enumerate(texts)
    ]
    vote = f.signed(f.operation(Kind.VOTE, clock=3, target=adds[1].cid, vote=1), f.author(7))
    delete = f.signed(f.operation(Kind.DELETE, clock=3, target=adds[2].cid, reason="wrong"), f.author(8))
    results = set()
    for number, order in enumerate(itertools.permutations(adds)):
        ledger = open_ledger(tmp_path / f"n{number}")
        for block in [*order, vote, delete]:
            ledger.submit(block.data)
        results.add(converged_state(ledger))
        ledger.close()
    assert len(results) == 1


def _merges_votes_and_rivals(rng: random.Random) -> list:
    """Two merges of two adds each, votes on the merges and their sources, and modifies and deletes of the sources
    that are concurrent with a merge (parents: the source) or descend from it (parents: the merge)."""
    adds = [f.add(text, f.author(i + 1)) for i, text in enumerate(f.SEED_TEXTS)]
    merges = [
        f.signed(
            f.operation(
                Kind.MERGE,
                clock=2,
                parents=(adds[i].cid, adds[i + 1].cid),
                targets=tuple(sorted((adds[i].cid, adds[i + 1].cid))),
                content=f.content(f"When {CONTEXTS[i]}, merge."),
                reason="same",
            ),
            f.author(5 + i),
        )
        for i in (0, 2)
    ]
    blocks = [*adds, *merges]
    for number in range(rng.randint(2, 8)):
        merge = rng.choice(merges)
        source = rng.choice(merge.op.targets)
        roll, key = rng.random(), f.author(20 + number)
        if roll < 0.5:  # a vote on the merge or its source, after the merge
            kind, fields = Kind.VOTE, {"target": rng.choice([merge.cid, source]), "vote": rng.choice((1, -1))}
        elif roll < 0.8:
            text = f"When {CONTEXTS[4]}, {ACTIONS[number % 4]}."
            kind, fields = Kind.MODIFY, {"target": source, "content": f.content(text)}
        else:
            kind, fields = Kind.DELETE, {"target": source, "reason": "proven incorrect"}
        if kind is Kind.VOTE or rng.random() < 0.4:  # descends from the merge
            parents, clock = (merge.cid,), 3 + rng.randrange(2)
        else:  # concurrent with it
            parents, clock = (source,), 2 + rng.randrange(3)
        blocks.append(f.signed(f.operation(kind, clock=clock, parents=parents, **fields), key))
    return blocks


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_merges_voided_by_operations_arriving_one_at_a_time_converge(tmp_path_factory, seed):
    """Each operation alone in its batch, so a modify or delete that voids a merge nothing but votes acted on
    undoes it (§7.5) instead of folding the component again; the votes naming the merge become void with it."""
    rng = random.Random(seed)
    blocks = _merges_votes_and_rivals(rng)
    order = list(blocks)
    rng.shuffle(order)
    if rng.random() < 0.6:  # mostly in causal order, so that rivals often come after the votes on the merge
        order.sort(key=lambda block: block.op.clock)
    one_by_one = open_ledger(tmp_path_factory.mktemp("one_by_one"))
    for block in order:
        assert one_by_one.submit(block.data).outcome != "invalid"
    at_once = open_ledger(tmp_path_factory.mktemp("at_once"))
    at_once.ingest([block.data for block in blocks])
    assert one_by_one.view().pending() == []
    assert converged_state(one_by_one) == converged_state(at_once)
    one_by_one.close()
    at_once.close()
