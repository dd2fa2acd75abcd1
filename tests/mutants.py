"""Mistakes planted in the live library (ledger/library/) that the differential tests must catch.

Each mutant is applied with a `MonkeyPatch` for one run and undone after it. `python -m tests.mutants [seeds]` runs
the differential scenario of tests/test_reference.py on seeds 0, 1, ... under each mutant and prints the first seed
whose audit finds a difference (or whose fold fails), and the audit's line; `test_reference.py` checks each mutant
on the seed found here. The last two rules are ones every arrival order gets wrong the same way, which the
order-independence tests (tests/test_convergence.py) cannot see.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from ledger.cid import CID
from ledger.library import Library, OpMeta, _Records, tables, votes
from ledger.ops import Kind
from ledger.records import OpStatus
from ledger.tables import by_target_prefix, order_cid, parse_by_target_key
from tests.differential import differential_run


def _forgetting_take_back(patch: pytest.MonkeyPatch) -> None:
    """A take-back that forgets the last operation it took back: it is not folded again."""
    fold_again = Library._fold_again
    patch.setattr(Library, "_fold_again", lambda self, work, replay, now: fold_again(self, work, replay[:-1], now))


def _vote_counted_twice(patch: pytest.MonkeyPatch) -> None:
    """Each counted vote moves `up` or `down` twice."""
    count = votes._count

    def twice(record, vote, sign):  # type: ignore[no-untyped-def]
        count(record, vote, sign)
        count(record, vote, sign)

    patch.setattr(votes, "_count", twice)


def _first_source_decides(patch: pytest.MonkeyPatch) -> None:
    """The rule before PROTOCOL §7.4 was settled: the first source with a concurrent delete or modify decides, so a
    modify of the first source beats a delete of the second."""

    def voided(self: Library, records: _Records, cid: bytes, meta: OpMeta) -> OpStatus | None:
        delete, modify = tables._KIND_BYTE[Kind.DELETE], tables._KIND_BYTE[Kind.MODIFY]
        for target in meta.targets:
            for kind in (delete, modify):
                for key, _ in records.scan(by_target_prefix(target, kind)):
                    other = order_cid(parse_by_target_key(key)[1])
                    if self.clock_void(records, self.meta(records, other)) is not None:
                        continue
                    if kind == delete and not self.is_ancestor(records, cid, other):
                        return OpStatus.void(
                            "merge.concurrent_delete", f"{CID(other)} deletes a source (delete beats merge)"
                        )
                    if (
                        kind == modify
                        and not self.is_ancestor(records, other, cid)
                        and not self.is_ancestor(records, cid, other)
                    ):
                        return OpStatus.void(
                            "merge.concurrent_modify", f"{CID(other)} modifies a source (modify beats merge)"
                        )
        return None

    patch.setattr(Library, "_concurrently_voided", voided)


def _ties_to_the_highest_cid(patch: pytest.MonkeyPatch) -> None:
    """The visible version among heads of one clock is the one with the highest binary CID, not the lowest."""

    def add_head(self: Library, records: _Records, cid: bytes, record, op):  # type: ignore[no-untyped-def]
        old = [head.raw for head in record.heads]
        seen = self.ancestors_among(records, old, cid) if old else set()
        heads = [head for head in old if head not in seen] + [cid]
        winner = max(heads, key=lambda head: (self.meta(records, head).clock, head))
        record.heads, record.version = tables._sorted_cids(heads), CID(winner)
        record.domain = ".".join(op.content.domain if winner == cid else self.content(records, winner).domain)
        records.put(record)
        return OpStatus.applied(record.id.raw)

    patch.setattr(Library, "_add_head", add_head)


MUTANTS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "take-back forgets an operation": _forgetting_take_back,
    "vote counted twice": _vote_counted_twice,
    "first source decides a merge": _first_source_decides,
    "ties go to the highest CID": _ties_to_the_highest_cid,
}


def first_catch(name: str, seeds: range) -> tuple[int, str] | None:
    """The first seed on which the mutant `name` is caught, with what the audit said."""
    with pytest.MonkeyPatch.context() as patch:
        MUTANTS[name](patch)
        for seed in seeds:
            with tempfile.TemporaryDirectory() as directory:
                found = differential_run(seed, Path(directory))
            if found is not None:
                return seed, found
    return None


def main(argv: list[str]) -> int:
    seeds = range(int(argv[0]) if argv else 40)
    escaped = 0
    for name in MUTANTS:
        caught = first_catch(name, seeds)
        print(f"{name}: " + (f"caught at seed {caught[0]}: {caught[1]}" if caught else f"NOT caught in {seeds}"))
        escaped += caught is None
    return 1 if escaped else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
