"""The library as docs/PROTOCOL.md §7 defines it, folded from nothing: slow, direct, and easy to check against the text.

`fold` takes the set of operations a node stores, applies those whose dependencies all apply (§7.1), sorts them in
canonical order (§7.2) and folds them one at a time from an empty library (§7.4, with §7.6's F), then decides the
votes on the result (§7.7). It yields the typed records, statuses and votes the live library keeps
(ledger/records.py), so the two can be compared field by field (ledger/audit.py, tests/test_reference.py).

It shares nothing with the incremental engine (ledger/library.py) but the operation types, the records, the
near-duplicate predicate (ledger/neardup.py) and the state root (§9). Where the engine keeps components, rewinds and
take-overs so that a late operation costs what it touches, this keeps every record in memory and folds each
operation once, in order: what §7.5 says the engine's work must equal.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from ledger.cid import CID
from ledger.neardup import band_keys_of_many, exact_cosine_exceeds
from ledger.ops import Kind, Operation
from ledger.params import NetworkParams
from ledger.records import ExperienceRecord, Life, OpStatus, Outcome, Vote
from ledger.stateroot import StateRoot

#: the reasons of the verdicts, as a status words them (§7.4)
CLOCK_PARENT = OpStatus.void("clock.parent", "its clock does not exceed every parent's")
CLOCK_TARGET = OpStatus.void("clock.target", "its clock does not exceed its target's")
MODIFY_OF_DELETED = OpStatus.void("superseded.deleted", "its experience was deleted (delete beats modify)")
SOURCE_DELETED = OpStatus.void("merge.target_deleted", "a source was deleted before the merge")
_CREATES = (Kind.ADD, Kind.MERGE)
PROGRESS_EVERY = 10_000


def not_experience(target: bytes) -> OpStatus:
    return OpStatus.void("target.not_experience", f"target {CID(target)} did not create an experience")


@dataclass
class ReferenceLibrary:
    """What §7 makes of a set of operations."""

    #: every experience record, by id (an add's or merge's binary CID)
    records: dict[bytes, ExperienceRecord]
    #: every stored operation's status as a node reports it: superseded modifies and pending operations included
    statuses: dict[bytes, OpStatus]
    #: per id naming an experience, each author's latest vote naming it as written (§7.7)
    votes: dict[bytes, dict[str, Vote]]
    #: §9: the digest of the set of stored operations, applied or pending
    state_root: bytes
    order: list[bytes] = field(default_factory=list)  # the applied operations in canonical order

    def resolve(self, exp_id: bytes) -> bytes:
        return _resolve(self.records, exp_id)


def fold(
    operations: Mapping[bytes, Operation], params: NetworkParams, progress: Callable[[int, int], None] | None = None
) -> ReferenceLibrary:
    """The library of the operations (binary CID -> operation) a node stores; `progress(done, of)` is told every
    `PROGRESS_EVERY` operations folded."""
    return _Fold(operations, params).run(progress or (lambda done, of: None))


def _resolve(records: Mapping[bytes, ExperienceRecord], exp_id: bytes) -> bytes:
    """§7.3: follow `alias_of` to a record that is not an alias."""
    record = records[exp_id]
    while record.status is Life.ALIAS:
        assert record.alias_of is not None
        record = records[record.alias_of.raw]
    return record.id.raw


def _dependencies(op: Operation) -> list[bytes]:
    """§7.1: parents and targets, each once, in that order."""
    targets = op.targets if op.kind is Kind.MERGE else ((op.target,) if op.target is not None else ())
    return list(dict.fromkeys([parent.raw for parent in op.parents] + [target.raw for target in targets]))


def _targets(op: Operation) -> list[bytes]:
    if op.kind is Kind.MERGE:
        return [target.raw for target in op.targets]
    return [op.target.raw] if op.target is not None else []


def _insert(cids: list[CID], raw: bytes) -> None:
    """Keep a list of CIDs sorted by binary CID, each once (§7.3)."""
    at = bisect.bisect_left(cids, raw, key=_raw)
    if at == len(cids) or cids[at].raw != raw:
        cids.insert(at, CID(raw))


def _raw(cid: CID) -> bytes:
    return cid.raw


class _Fold:
    def __init__(self, operations: Mapping[bytes, Operation], params: NetworkParams) -> None:
        self.ops = operations
        self.params = params
        self.threshold = Fraction(params.near_duplicate_cosine)
        self.records: dict[bytes, ExperienceRecord] = {}
        self.statuses: dict[bytes, OpStatus] = {}
        self.applied = self._applied()
        self.order = sorted(self.applied, key=lambda cid: (operations[cid].clock, cid))
        self.clock_void = {cid: status for cid in self.order if (status := self._clock_verdict(cid)) is not None}
        self.names = self._names()
        #: applied operations naming each id as written, by kind, in canonical order (the merge rules read them)
        self.naming: dict[tuple[bytes, Kind], list[bytes]] = {}
        for cid in self.order:
            for target in _targets(operations[cid]):
                self.naming.setdefault((target, operations[cid].kind), []).append(cid)
        self.buckets: dict[bytes, list[tuple[int, bytes]]] = {}  # band key -> adds folded, in canonical order
        adds = [cid for cid in self.order if operations[cid].kind is Kind.ADD]
        embeddings = [self._values(cid) for cid in adds]
        bands = band_keys_of_many(embeddings, params.embedding_model, params.embedding_dim)
        self.bands = dict(zip(adds, bands, strict=True))

    def run(self, progress: Callable[[int, int], None]) -> ReferenceLibrary:
        votes = []
        for done, cid in enumerate(self.order):
            if done % PROGRESS_EVERY == 0:
                progress(done, len(self.order))
            op = self.ops[cid]
            if cid in self.clock_void:
                self.statuses[cid] = self.clock_void[cid]
            elif op.kind is Kind.VOTE:
                votes.append(cid)
            else:
                self.statuses[cid] = self._step(cid, op)
        written = self._count_votes(votes)
        self._supersede()
        for cid in self.ops.keys() - self.applied:
            waiting = tuple(CID(dep) for dep in _dependencies(self.ops[cid]) if dep not in self.applied)
            self.statuses[cid] = OpStatus(Outcome.PENDING, waiting_for=waiting)
        progress(len(self.order), len(self.order))
        root = StateRoot()
        for cid in self.ops:
            root.add(cid)
        return ReferenceLibrary(self.records, self.statuses, written, root.digest(), self.order)

    # --- §7.1, §7.2: what applies, in which order, and what descends from what ---------------------------------

    def _applied(self) -> set[bytes]:
        """The operations whose dependencies are all stored and applied, transitively."""
        waiting_on: dict[bytes, list[bytes]] = {}
        missing: dict[bytes, int] = {}
        ready = []
        for cid, op in self.ops.items():
            deps = _dependencies(op)
            if any(dep not in self.ops for dep in deps):
                continue
            missing[cid] = len(deps)
            for dep in deps:
                waiting_on.setdefault(dep, []).append(cid)
            if not deps:
                ready.append(cid)
        applied = set()
        while ready:
            cid = ready.pop()
            applied.add(cid)
            for waiter in waiting_on.get(cid, []):
                missing[waiter] -= 1
                if missing[waiter] == 0:
                    ready.append(waiter)
        return applied

    def is_ancestor(self, a: bytes, b: bytes) -> bool:
        """§7.2: b's clock exceeds a's by more than the causal horizon, or a is reachable from b through parents,
        walking only through operations whose clock exceeds a's."""
        floor = self.ops[a].clock
        if self.ops[b].clock - floor > self.params.causal_horizon:
            return True
        stack, seen = [parent.raw for parent in self.ops[b].parents], set()
        while stack:
            parent = stack.pop()
            if parent == a:
                return True
            if parent in seen:
                continue
            seen.add(parent)
            if self.ops[parent].clock > floor:
                stack.extend(p.raw for p in self.ops[parent].parents)
        return False

    # --- §7.4: the step for each operation ------------------------------------------------------------------

    def _clock_verdict(self, cid: bytes) -> OpStatus | None:
        op = self.ops[cid]
        if any(self.ops[parent.raw].clock >= op.clock for parent in op.parents):
            return CLOCK_PARENT
        if any(self.ops[target].clock >= op.clock for target in _targets(op)):
            return CLOCK_TARGET
        return None

    def _names(self) -> set[bytes]:
        """The ids that name an experience: adds not void by their clock, and such merges whose every target does
        (a merge's targets sort before it unless it is void by its clock, so one pass in order decides)."""
        names: set[bytes] = set()
        for cid in self.order:
            op = self.ops[cid]
            if op.kind in _CREATES and cid not in self.clock_void and all(t in names for t in _targets(op)):
                names.add(cid)
        return names

    def _step(self, cid: bytes, op: Operation) -> OpStatus:
        targets = _targets(op)
        for target in targets:
            if target not in self.names:
                return not_experience(target)
        for target in targets:
            if target not in self.records:
                return not_experience(target)
        if op.kind is Kind.ADD:
            return self._add(cid, op)
        if op.kind is Kind.MERGE:
            return self._merge(cid, op)
        record = self.records[_resolve(self.records, targets[0])]
        if op.kind is Kind.DELETE:
            record.status = Life.DELETED
            _insert(record.deleted_by, cid)
            return OpStatus.applied(record.id.raw)
        if record.status is Life.DELETED:
            return MODIFY_OF_DELETED
        heads = [head.raw for head in record.heads if not self.is_ancestor(head.raw, cid)] + [cid]
        visible = min(heads, key=lambda head: (-self.ops[head].clock, head))
        record.heads = [CID(head) for head in sorted(heads)]
        record.version = CID(visible)
        record.domain = self._domain(visible)
        return OpStatus.applied(record.id.raw)

    def _add(self, cid: bytes, op: Operation) -> OpStatus:
        into = self._earliest_near_duplicate(cid)
        record = self._new_record(cid, support=1)
        self.records[cid] = record
        for band in self.bands[cid]:
            self.buckets.setdefault(band, []).append((op.clock, cid))
        if into is None:
            return OpStatus.applied(cid)
        record.status, record.alias_of = Life.ALIAS, CID(into)
        stands = self.records[_resolve(self.records, into)]
        stands.support += 1
        _insert(stands.absorbed, cid)
        return OpStatus(Outcome.ABSORBED, into=CID(into))

    def _earliest_near_duplicate(self, cid: bytes) -> bytes | None:
        """§7.6: the canonically earliest add folded before this one (so sorting before it, not void by its clock)
        at most `absorption_horizon` clocks below it, sharing a band with it, that it nearly duplicates."""
        lowest = self.ops[cid].clock - self.params.absorption_horizon
        candidates: set[tuple[int, bytes]] = set()
        for band in self.bands[cid]:
            bucket = self.buckets.get(band, [])
            candidates.update(bucket[bisect.bisect_left(bucket, (lowest, b"")) :])
        values = self._values(cid)
        for _, other in sorted(candidates):
            if exact_cosine_exceeds(values, self._values(other), self.threshold):
                return other
        return None

    def _merge(self, cid: bytes, op: Operation) -> OpStatus:
        concurrent = self._concurrent_verdict(cid, op)
        if concurrent is not None:
            return concurrent
        sources = sorted({_resolve(self.records, target.raw) for target in op.targets})
        if any(self.records[source].status is Life.DELETED for source in sources):
            return SOURCE_DELETED
        record = self._new_record(cid, support=sum(self.records[source].support for source in sources))
        record.absorbed = [CID(source) for source in sources]
        for source in sources:
            self.records[source].status, self.records[source].alias_of = Life.ALIAS, CID(cid)
        self.records[cid] = record
        return OpStatus.applied(cid)

    def _concurrent_verdict(self, merge: bytes, op: Operation) -> OpStatus | None:
        """Delete > Modify > merge over all the sources: the canonically first delete of a source (as written) that
        does not descend from the merge, else the first modify of one concurrent with it; none void by its clock."""
        sources = [target.raw for target in op.targets]
        deletes = [d for s in sources for d in self.naming.get((s, Kind.DELETE), []) if d not in self.clock_void]
        voiding = [d for d in deletes if not self.is_ancestor(merge, d)]
        if voiding:
            first = min(voiding, key=lambda d: (self.ops[d].clock, d))
            return OpStatus.void("merge.concurrent_delete", f"{CID(first)} deletes a source (delete beats merge)")
        modifies = [m for s in sources for m in self.naming.get((s, Kind.MODIFY), []) if m not in self.clock_void]
        voiding = [m for m in modifies if not self.is_ancestor(m, merge) and not self.is_ancestor(merge, m)]
        if voiding:
            first = min(voiding, key=lambda m: (self.ops[m].clock, m))
            return OpStatus.void("merge.concurrent_modify", f"{CID(first)} modifies a source (modify beats merge)")
        return None

    def _new_record(self, cid: bytes, support: int) -> ExperienceRecord:
        """§7.3: live, its own version, domain, author and clock, nothing listed, no votes."""
        op = self.ops[cid]
        return ExperienceRecord(
            id=CID(cid),
            created_by=op.author,
            clock=op.clock,
            status=Life.LIVE,
            alias_of=None,
            version=CID(cid),
            heads=[],
            domain=self._domain(cid),
            support=support,
        )

    def _domain(self, version: bytes) -> str:
        content = self.ops[version].content
        assert content is not None
        return ".".join(content.domain)

    def _values(self, add: bytes) -> bytes:
        content = self.ops[add].content
        assert content is not None
        return content.embedding.values

    # --- §7.7: votes; §7.4: statuses once everything is folded ----------------------------------------------

    def _count_votes(self, votes: list[bytes]) -> dict[bytes, dict[str, Vote]]:
        """Decide each vote on the folded library, count each author's latest per experience that stands for
        itself, and return each author's latest vote per id as written."""
        written: dict[bytes, dict[str, Vote]] = {}
        counted: dict[tuple[bytes, str], Vote] = {}
        for cid in votes:
            op = self.ops[cid]
            assert op.target is not None and op.vote is not None
            target, vote = op.target.raw, Vote(op.clock, CID(cid), op.vote)
            if target not in self.names:
                self.statuses[cid] = not_experience(target)
                continue
            _keep_latest(written.setdefault(target, {}), op.author, vote)
            if target not in self.records:
                self.statuses[cid] = not_experience(target)
                continue
            self.statuses[cid] = OpStatus.applied(target)
            key = (_resolve(self.records, target), op.author)
            if key not in counted or vote.later_than(counted[key]):
                counted[key] = vote
        for (root, _), vote in counted.items():
            if vote.value > 0:
                self.records[root].up += 1
            else:
                self.records[root].down += 1
        return written

    def _supersede(self) -> None:
        """An applied modify reads superseded when what it acted on now resolves to a deleted experience, or to one
        whose heads do not hold it."""
        for cid, status in self.statuses.items():
            if status.outcome is not Outcome.APPLIED or self.ops[cid].kind is not Kind.MODIFY:
                continue
            assert status.experience is not None
            now = self.records[_resolve(self.records, status.experience.raw)]
            if now.status is Life.DELETED:
                code, reason = "superseded.deleted", "its experience was deleted"
            elif CID(cid) not in now.heads:
                code, reason = "superseded.modified", "a later modify that saw it replaced it"
            else:
                continue
            self.statuses[cid] = OpStatus(Outcome.SUPERSEDED, status.experience, code=code, reason=reason)


def _keep_latest(votes: dict[str, Vote], author: str, vote: Vote) -> None:
    if author not in votes or vote.later_than(votes[author]):
        votes[author] = vote
