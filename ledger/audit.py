"""Check a node's library against the reference fold (ledger/reference.py): how an operator checks a node after a
crash, an upgrade or a suspicion.

`audit` reads every operation of the log of one committed state (a `LedgerView`), folds them with the reference, and
compares, through the view's public reads only: the state root, every experience record field by field (in id
order), every operation's status (in canonical order, then the pending ones), and each author's latest vote naming
each experience. It stops at the first difference and says which experience it concerns and how.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any

from ledger import reference
from ledger.cid import CID
from ledger.errors import LedgerError
from ledger.ops import Kind, Operation, load_stored
from ledger.params import NetworkParams
from ledger.records import ExperienceRecord, OpStatus
from ledger.view import LedgerView

#: log entries read per call
_CHUNK = 10_000
#: the progress callback: (stage, done, of); stages are "reading the log", "folding", "comparing"
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True, slots=True)
class Difference:
    """The first place the library and the reference disagree."""

    experience: CID | None  # the experience it concerns (None: the log or the state root)
    what: str  # how, in words

    def to_json(self) -> dict[str, Any]:
        return {"experience": str(self.experience) if self.experience else None, "what": self.what}


@dataclass(frozen=True, slots=True)
class AuditResult:
    operations: int  # stored operations read from the log
    experiences: int  # experience records compared
    difference: Difference | None

    @property
    def matches(self) -> bool:
        return self.difference is None

    def line(self) -> str:
        if self.difference is None:
            return f"library matches the reference fold ({self.operations} operations, {self.experiences} experiences)"
        where = f"experience {self.difference.experience}" if self.difference.experience else "the ledger"
        return f"library differs from the reference fold at {where}: {self.difference.what}"

    def to_json(self) -> dict[str, Any]:
        return {
            "matches": self.matches,
            "operations": self.operations,
            "experiences": self.experiences,
            "difference": self.difference.to_json() if self.difference else None,
            "message": self.line(),
        }


def every(seconds: float, emit: Callable[[str], None]) -> Progress:
    """A progress callback that emits a line ("audit: folding 40000 of 100000") at most every `seconds`, and at the end
    of each stage: for logs, and for a command whose output is not a terminal."""
    last = [float("-inf")]

    def tell(stage: str, done: int, of: int) -> None:
        now = time.monotonic()
        if done == of or now - last[0] >= seconds:
            last[0] = now
            emit(f"audit: {stage} {done} of {of}")

    return tell


def audit(view: LedgerView, params: NetworkParams, progress: Progress | None = None) -> AuditResult:
    """Fold the view's log with the reference and compare the result with the view's library."""
    tell = progress or (lambda stage, done, of: None)
    operations, broken = read_log(view, tell)
    if broken is not None:
        return AuditResult(len(operations), 0, broken)
    expected = reference.fold(operations, params, lambda done, of: tell("folding", done, of))
    difference = compare(view, operations, expected, tell)
    return AuditResult(len(operations), len(expected.records), difference)


def read_log(view: LedgerView, tell: Progress) -> tuple[dict[bytes, Operation], Difference | None]:
    """Every operation of the view's log, each checked against the CID it is logged under."""
    operations: dict[bytes, Operation] = {}
    for start in range(0, view.log_size, _CHUNK):
        tell("reading the log", start, view.log_size)
        end = min(start + _CHUNK, view.log_size)
        try:
            entries = view.entries(start, end)
        except LedgerError as exc:
            return operations, Difference(None, f"log positions {start} to {end - 1} are unreadable ({exc})")
        for position, data in zip(range(start, end), entries, strict=True):
            cid = view.logged(position)
            if CID.for_block(data) != cid:
                return operations, Difference(None, f"log position {position} ({cid}): its bytes have another CID")
            operations[cid.raw] = load_stored(data)
    tell("reading the log", view.log_size, view.log_size)
    return operations, None


def compare(
    view: LedgerView, operations: dict[bytes, Operation], expected: reference.ReferenceLibrary, tell: Progress
) -> Difference | None:
    """The first difference between the view's library and the reference's: state root, records, statuses, votes."""
    if (root := view.state_root()) != expected.state_root:
        return Difference(None, f"state root {root.hex()} in the library, {expected.state_root.hex()} in the reference")
    total = len(expected.records) + len(operations)
    for done, found in enumerate(_record_differences(view, expected)):
        if found is not None:
            return found
        if done % reference.PROGRESS_EVERY == 0:
            tell("comparing", done, total)
    for done, (cid, want) in enumerate(_statuses_in_order(expected), start=len(expected.records)):
        if done % reference.PROGRESS_EVERY == 0:
            tell("comparing", done, total)
        try:
            have = view.status(CID(cid))
        except Exception as exc:  # damaged (a store or decoder error, a value of the wrong shape): named, not fatal
            return Difference(_about(cid, operations[cid]), f"status of {CID(cid)} unreadable ({exc})")
        if have != want:
            what = f"status of {operations[cid].kind} {CID(cid)}: {_said(have)} in the library, {_said(want)} in the"
            return Difference(_about(cid, operations[cid]), what + " reference")
    tell("comparing", total, total)
    return _vote_difference(view, operations, expected)


def _record_differences(view: LedgerView, expected: reference.ReferenceLibrary) -> Iterator[Difference | None]:
    """Each reference record against the library's, in id order, then any record the library has in excess."""
    for exp_id in sorted(expected.records):
        try:
            have = view.experience(CID(exp_id))
        except Exception as exc:  # damaged (a store or decoder error, a value of the wrong shape): named, not fatal
            yield Difference(CID(exp_id), f"its record is unreadable ({exc})")
            return
        yield _record_difference(have, expected.records[exp_id], CID(exp_id))
    try:
        extra = next((record.id for record in view.experiences() if record.id.raw not in expected.records), None)
    except Exception as exc:  # likewise
        yield Difference(None, f"the library's records are unreadable ({exc})")
        return
    if extra is not None:
        yield Difference(extra, "the library holds a record the reference fold does not")


def _record_difference(have: ExperienceRecord | None, want: ExperienceRecord, exp_id: CID) -> Difference | None:
    if have is None:
        return Difference(exp_id, "the library holds no record; the reference fold does")
    for name in (item.name for item in fields(ExperienceRecord)):
        mine, theirs = getattr(have, name), getattr(want, name)
        if mine != theirs:
            return Difference(exp_id, f"{name}: {_shown(mine)} in the library, {_shown(theirs)} in the reference")
    return None


def _statuses_in_order(expected: reference.ReferenceLibrary) -> Iterator[tuple[bytes, OpStatus]]:
    yield from ((cid, expected.statuses[cid]) for cid in expected.order)
    applied = set(expected.order)
    yield from sorted((cid, status) for cid, status in expected.statuses.items() if cid not in applied)


def _vote_difference(
    view: LedgerView, operations: dict[bytes, Operation], expected: reference.ReferenceLibrary
) -> Difference | None:
    """Each author's latest vote naming each add or merge, as written."""
    for cid in sorted(cid for cid, op in operations.items() if op.kind in (Kind.ADD, Kind.MERGE)):
        have, want = view.votes(CID(cid)), expected.votes.get(cid, {})
        if have != want:
            author = min(a for a in have.keys() | want.keys() if have.get(a) != want.get(a))
            return Difference(
                CID(cid), f"latest vote of {author}: {_shown(have.get(author))} in the library, "
                f"{_shown(want.get(author))} in the reference"
            )  # fmt: skip
    return None


def _about(cid: bytes, op: Operation) -> CID:
    """The experience an operation concerns: what it creates, or its (first) target as written."""
    if op.kind in (Kind.ADD, Kind.MERGE):
        return CID(cid)
    return op.target if op.target is not None else op.targets[0]


def _said(status: OpStatus | None) -> str:
    return "none" if status is None else str(status.to_json())


def _shown(value: object) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(str(item) for item in value) + "]"
    return str(value) if value is not None else "none"
