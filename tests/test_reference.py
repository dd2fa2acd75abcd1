"""Differential tests: the live library equals the reference fold of docs/PROTOCOL.md §7 (ledger/reference.py).

tests/test_convergence.py shows that every arrival order gives the same library; these show that it is the library
§7 defines. After every batch of random histories (late and low-clock operations, duplicates, near-duplicate chains
that late copies split and join, merges voided later, restarts), `ledger.audit` compares every record, every status,
every vote and the state root with the reference's (tests/differential.py). Mistakes planted in the live library
(tests/mutants.py) make it fail.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import records, reference
from ledger.cid import CID
from ledger.ops import Kind
from ledger.records import Life, Outcome
from tests import factories as f
from tests.differential import COPIES, acting_on, check, differential_run, history_of, params_for, schedule
from tests.ledgers import open_ledger, random_history
from tests.mutants import MUTANTS

HORIZONS = st.sampled_from([1, 3, 8, f.PARAMS.causal_horizon])
ABSORPTION_HORIZONS = st.sampled_from([1, 2, 3, f.PARAMS.absorption_horizon])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(2, 30), causal=HORIZONS, absorption=ABSORPTION_HORIZONS)
def test_the_library_equals_the_reference_fold_after_every_batch(tmp_path_factory, seed, size, causal, absorption):
    """Random histories with copies and operations acting on them, in random batches: after each batch (and after
    a restart of the node halfway) the library is the reference fold of what the node stores."""
    rng = random.Random(seed)
    blocks, params = history_of(seed, size), params_for(causal, absorption)
    path = tmp_path_factory.mktemp("node")
    ledger = open_ledger(path, causal, absorption)
    batches = schedule(rng, blocks)
    try:
        for number, batch in enumerate(batches):
            assert all(receipt.outcome != "invalid" for receipt in ledger.ingest(batch))
            check(ledger, params)
            if number == len(batches) // 2:
                ledger.close()
                ledger = open_ledger(path, causal, absorption)
                check(ledger, params)
    finally:
        ledger.close()


@pytest.mark.parametrize("listed", ["inline", "outside"])
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), causal=HORIZONS, absorption=ABSORPTION_HORIZONS)
def test_operations_sorting_before_a_long_history_fold_to_the_reference(
    tmp_path_factory, monkeypatch, listed, seed, causal, absorption
):
    """A history folded first, then low-clock copies and operations just above old experiences, one at a time:
    each takes back, rewinds or takes over what sorts after it, and the library stays the reference fold.
    `outside`: every record keeps its lists of absorbed ids and deletes in the U table (what only long lists do)."""
    if listed == "outside":
        monkeypatch.setattr(records, "INLINE_LIST", 0)
    rng = random.Random(seed)
    history = random_history(rng, 150)
    late = acting_on(rng, [b for b in history if b.op.clock <= 4], 10, 60)
    params = params_for(causal, absorption)
    ledger = open_ledger(tmp_path_factory.mktemp("node"), causal, absorption)
    try:
        ledger.ingest([b.data for b in history])
        check(ledger, params)
        for block in late:
            assert ledger.submit(block.data).outcome != "invalid"
            check(ledger, params)
    finally:
        ledger.close()


def test_a_merge_with_a_concurrent_modify_of_one_source_and_a_concurrent_delete_of_another_is_void_by_the_delete(
    tmp_path: Path,
) -> None:
    """§7.4: Delete > Modify > merge over all the sources, whichever source comes first in `targets`: the verdict
    names the delete (the one rule where the live library once differed from the text)."""
    a, b = f.add(f.SEED_TEXTS[0], f.author(1)), f.add(f.SEED_TEXTS[1], f.author(2))
    first, second = sorted((a, b), key=lambda block: block.cid)
    merge = f.signed(
        f.operation(Kind.MERGE, clock=2, parents=(a.cid, b.cid), targets=tuple(sorted((a.cid, b.cid))),
                    content=f.content(f.SEED_TEXTS[2]), reason="same"), f.author(3),
    )  # fmt: skip
    modify = f.signed(
        f.operation(Kind.MODIFY, clock=2, parents=(first.cid,), target=first.cid, content=f.content(f.SEED_TEXTS[3])),
        f.author(4),
    )
    delete = f.signed(
        f.operation(Kind.DELETE, clock=3, parents=(second.cid,), target=second.cid, reason="wrong"), f.author(5)
    )
    ledger = open_ledger(tmp_path)
    try:
        ledger.ingest([block.data for block in (a, b, merge, modify, delete)])
        status = ledger.view().status(merge.cid)
        assert status.code == "merge.concurrent_delete" and str(delete.cid) in status.reason
        check(ledger, f.PARAMS)
    finally:
        ledger.close()


def test_the_reference_applies_what_has_its_dependencies_and_reports_the_rest_pending() -> None:
    """§7.1 and §7.4 on a handful of operations, decided by hand: what the reference says the text says."""
    a = f.add(COPIES[0], f.author(1))
    copy = f.signed(f.operation(Kind.ADD, clock=2, content=f.content(COPIES[3])), f.author(2))
    missing = f.add(f.SEED_TEXTS[1], f.author(3))
    waiting = f.signed(f.operation(Kind.VOTE, clock=2, parents=(missing.cid,), target=a.cid, vote=1), f.author(4))
    vote = f.signed(f.operation(Kind.VOTE, clock=3, target=copy.cid, vote=-1), f.author(4))
    low = f.signed(f.operation(Kind.DELETE, clock=1, target=a.cid, reason="wrong"), f.author(5))
    folded = reference.fold({b.cid.raw: b.op for b in (a, copy, waiting, vote, low)}, f.PARAMS)
    statuses = folded.statuses
    assert statuses[copy.cid.raw].outcome is Outcome.ABSORBED and statuses[copy.cid.raw].into == a.cid
    assert statuses[waiting.cid.raw].waiting_for == (missing.cid,)
    assert statuses[low.cid.raw].code == "clock.target"
    record = folded.records[a.cid.raw]
    assert (record.status, record.support, record.absorbed, record.down) == (Life.LIVE, 2, [copy.cid], 1)
    alias = folded.records[copy.cid.raw]
    assert (alias.status, alias.alias_of, alias.support, alias.down) == (Life.ALIAS, a.cid, 1, 0)
    assert statuses[vote.cid.raw].experience == CID(copy.cid.raw)


#: the first seed of `differential_run` on which each mutant is caught (`python -m tests.mutants` finds them)
CAUGHT_AT = {
    "take-back forgets an operation": 2,
    "vote counted twice": 0,
    "first source decides a merge": 1,
    "ties go to the highest CID": 4,
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_differential_check_catches_a_mistake_planted_in_the_live_library(tmp_path, monkeypatch, mutant):
    """The same history folds to the reference without the mutant and differs from it with the mutant."""
    seed = CAUGHT_AT[mutant]
    assert differential_run(seed, tmp_path / "sound") is None
    MUTANTS[mutant](monkeypatch)
    assert differential_run(seed, tmp_path / "mutant") is not None
