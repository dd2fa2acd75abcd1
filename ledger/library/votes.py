"""The vote tally (PROTOCOL §7.7).

Rule: for each author, the latest vote (by clock, then binary CID) on any experience resolving to E counts for E;
`up` and `down` count the authors whose counted vote is +1 or -1; an alias counts none; a vote naming a merge that
is void is void.
Invariant: Y holds each author's latest vote per experience named, R the vote counted per root. A root's counts
depend only on the members resolving to it and their authors' latest votes, so a fold counts again only the roots
whose members changed (`_tally`), or moves a merged source's counts to its new root (`_move_counts`:
bench_ledger's "merge of two roots" at 1M, 5.3 ms in 268b0ba's run, where counting the 6,707 members again cost
~270 ms).
"""

from __future__ import annotations

from ledger.cid import CID
from ledger.library.batch import _Records, _Work
from ledger.library.tables import _KIND_BYTE, _not_experience
from ledger.ops import Kind, Operation
from ledger.records import ExperienceRecord, Life, OpStatus, Vote
from ledger.tables import (
    by_target_prefix,
    component_key,
    counted_key,
    counted_prefix,
    order_cid,
    parse_by_target_key,
    parse_votes_key,
    status_key,
    votes_key,
    votes_prefix,
)


def _stands_for(record: ExperienceRecord | None) -> tuple[bool, CID | None]:
    """What decides where an experience's votes count: whether it exists, and what it is an alias of."""
    return (record is not None, record.alias_of if record is not None else None)


def _root_became_alias(records: _Records, exp_id: bytes) -> bool:
    """Whether an experience stood for itself before this fold and is an alias now (a merge's source)."""
    before, now = records.before[exp_id], records.record(exp_id)
    return before is not None and before.status is not Life.ALIAS and now is not None and now.status is Life.ALIAS


def _clear_counts(records: _Records, exp_id: bytes) -> list[tuple[str, Vote]]:
    """Delete the votes counted on an experience and zero its counts; returns them, with their authors."""
    counted = []
    for key, raw in list(records.txn.scan(counted_prefix(exp_id))):
        counted.append((parse_votes_key(key)[1], Vote.unpack(raw)))
        records.txn.delete(key)
    record = records.edit(exp_id)
    if record is not None and (record.up, record.down) != (0, 0):
        record.up = record.down = 0
        records.put(record)
    return counted


def _keep_latest(latest: dict[tuple[bytes, str], Vote], root: bytes, author: str, cast: Vote) -> None:
    """Keep `cast` as the author's vote for `root` if it is later than the one kept."""
    if (root, author) not in latest or cast.later_than(latest[(root, author)]):
        latest[(root, author)] = cast


def _count_if_later(records: _Records, root: bytes, author: str, vote: Vote) -> None:
    """Count `vote` as the author's on `root` if it is later than the vote counted there, in its place."""
    counted_raw = records.txn.get(counted_key(root, author))
    counted = Vote.unpack(counted_raw) if counted_raw is not None else None
    if counted is not None and not vote.later_than(counted):
        return
    records.txn.put(counted_key(root, author), vote.pack())
    if counted is not None and counted.value == vote.value:
        return  # the same counts: the record (hundreds of bytes, every compaction rewrites them) stays as it is
    record = records.edit(root)
    assert record is not None
    _count(record, counted, -1)
    _count(record, vote, +1)
    records.put(record)


def _count(record: ExperienceRecord, vote: Vote | None, sign: int) -> None:
    if vote is None:
        return
    if vote.value > 0:
        record.up += sign
    else:
        record.down += sign


class Votes:
    """The vote tally, as methods of the `Library`."""

    @staticmethod
    def _keep_counts(records: _Records, exp_ids: list[bytes]) -> None:
        """Give records folded again the vote counts they had: the same members resolve to them."""
        for exp_id in exp_ids:
            before, now = records.before[exp_id], records.edit(exp_id)
            if before is not None and now is not None and (before.up, before.down) != (now.up, now.down):
                now.up, now.down = before.up, before.down
                records.put(now)

    def _count_vote(self, work: _Work, cid: bytes, op: Operation) -> None:
        """Keep the author's latest vote on its target, and count it for the experience that stands for it."""
        txn, records = work.records.txn, work.records
        assert op.target is not None and op.vote is not None
        target = op.target.raw
        # an experience's record implies a placed add or merge; without one, only a void merge is kept a vote for
        # (a fold of its component may apply it). Reading the record first saves two gets of old keys per vote.
        root = records.resolved(target)
        if root is None and txn.get(component_key(target)) is None:
            txn.put(status_key(cid), _not_experience(target).pack())
            return
        vote = Vote(op.clock, CID(cid), op.vote)
        key = votes_key(target, op.author)
        raw = txn.get(key)
        if raw is None or vote.later_than(Vote.unpack(raw)):
            txn.put(key, vote.pack())
        if root is None:  # a merge that is void created no experience
            txn.put(status_key(cid), _not_experience(target).pack())
            return
        txn.put(status_key(cid), OpStatus.applied(target).pack())
        _count_if_later(records, root, op.author, vote)

    @staticmethod
    def _move_counts(records: _Records, sources: list[bytes]) -> None:
        """Move the counted votes of roots that became aliases (merged) to the roots they resolve to now.

        Only new operations were folded, so nothing else changed what stands for what: every experience
        resolving to a source before resolves to the source's new root now, which keeps its own members. A
        root's counted votes are each author's latest among its members, so the new root's are each author's
        latest among its own and the sources'. Reads the sources' counted votes, not their members: a merge
        of two roots in the 1M workload's largest component (6,707 members) cost ~270 ms counting them again.
        bench_ledger: "merge of two roots".
        """
        moved: dict[tuple[bytes, str], Vote] = {}
        for source in sorted(sources):
            root = records.resolved(source)
            assert root is not None and root != source
            for author, cast in _clear_counts(records, source):
                _keep_latest(moved, root, author, cast)
        for (root, author), cast in sorted(moved.items()):
            _count_if_later(records, root, author, cast)

    def _tally(self, work: _Work, members: list[bytes], touched: list[bytes]) -> None:
        """Count again the votes of the roots that gained or lost members: which experience stands for which changed.

        A root's count depends only on the members that resolve to it and their authors' latest votes, and
        votes are counted after every component is folded: only the roots a member resolved to before this
        fold or resolves to now, where the two differ, are counted again; the others among the `touched` records
        (folded again) keep their counts. Counting every member's votes made a fold in the 1M workload's
        largest component (6,707 members) cost ~2.5 s. `members` must hold every experience whose root may
        have changed and every one resolving to such a root: the component's members, or after an undo the
        undone merges' trees.
        """
        txn, records = work.records.txn, work.records
        was, now = records.resolved_all(members, before=True), records.resolved_all(members)
        moved = [exp_id for exp_id in members if was[exp_id] != now[exp_id]]
        roots = {root for exp_id in moved for root in (was[exp_id], now[exp_id]) if root is not None}
        vote = _KIND_BYTE[Kind.VOTE]
        for exp_id in moved:
            if (was[exp_id] is None) == (now[exp_id] is None):
                continue
            status = OpStatus.applied(exp_id) if now[exp_id] is not None else _not_experience(exp_id)
            for key, _ in txn.scan(by_target_prefix(exp_id, vote)):
                voter = order_cid(parse_by_target_key(key)[1])
                if self.clock_void(txn, self.meta(txn, voter)) is None:
                    txn.put(status_key(voter), status.pack())  # a vote counts only on an experience that exists
        for root in sorted(roots):
            _clear_counts(records, root)
        latest: dict[tuple[bytes, str], Vote] = {}
        for exp_id in members:
            root = now[exp_id]
            if root not in roots:
                continue
            for key, raw in txn.scan(votes_prefix(exp_id)):
                _keep_latest(latest, root, parse_votes_key(key)[1], Vote.unpack(raw))
        for (root, author), cast in sorted(latest.items()):
            _count_if_later(records, root, author, cast)
        self._keep_counts(records, [exp_id for exp_id in touched if exp_id not in roots])
