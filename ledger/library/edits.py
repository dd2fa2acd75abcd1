"""Modifies and deletes (PROTOCOL §7.4), folded on top and where they sort (§7.5).

Rule: a modify resolves its target to E: void if E is deleted (delete beats modify), else it joins E's heads,
dropping those it has as ancestors; the visible version is the head with the highest clock, ties to the lowest
binary CID. A delete makes E deleted (final) and lists itself in E's `deleted_by`.
Invariant: E's heads are the maximal modifies of E that sort before its first delete, whatever their order; so a
late modify joins them where it sorts, and a late delete voids E's modifies after it and folds E's heads again
from those before. bench_ledger's "late on early members" at 1M (modify 14.8, delete 10.8 ms in 268b0ba's run,
bench/RESULTS.md) measures these paths, and "a delete that voids a merge" the late delete of an experience a
merge took after it (`_delete_merged_in_place`).
"""

from __future__ import annotations

from ledger.cid import CID
from ledger.library import tables
from ledger.library.batch import _Records, _tree, _Work
from ledger.library.tables import (
    _KIND_BYTE,
    _LAST_ORDER,
    _MODIFIES,
    _insert_cid,
    _sorted_cids,
    _superseded_by_delete,
    _target_deleted,
)
from ledger.ops import Operation, load_stored
from ledger.records import ExperienceRecord, Life, OpStatus
from ledger.store import ReadView
from ledger.tables import (
    by_target_prefix,
    component_op_prefix,
    component_size_key,
    order_cid,
    parse_by_target_key,
    parse_component_op_key,
    read_u64,
    status_key,
)


class Edits:
    """Modifies and deletes, as methods of the `Library`."""

    def _delete_merged_in_place(self, work: _Work, component: bytes, record: ExperienceRecord, order: bytes) -> None:
        """Fold a late delete of E (`record`), which a merge after it took, where it sorts.

        The merge is void now (`merge.target_deleted`): it is undone as a concurrent delete undoes one
        (`_undo_merges`), the delete deletes E where it sorts, and what acted on the merge since is folded again.
        Its votes become void, and the votes of its tree count where its members resolve now (`_tally`). Any peer
        can sign a delete of an add absorbed into an experience a merge took, with a clock just above the add's,
        which folded the component again.
        bench_ledger: "a delete that voids a merge".
        """
        records, txn = work.records, work.records.txn
        assert record.alias_of is not None
        merge = record.alias_of.raw
        tree, replay = self._take_back(work, component, merge, order)
        work.undone.setdefault(component, []).extend(tree)
        txn.put(status_key(merge), _target_deleted().pack())
        self._delete_in_place(records, component, record.id.raw, [order])
        self._fold_again(work, replay, order)

    def _delete_in_place(self, records: _Records, component: bytes, exp_id: bytes, deletes: list[bytes]) -> None:
        """Let deletes (orders) that act on `exp_id` now, which no merge took, delete it where they sort: its
        modifies after the first of them are void, unless a delete of it sorts before (delete beats modify)."""
        txn = records.txn
        record = records.record(exp_id)
        assert record is not None and record.status is not Life.ALIAS
        first = min(deletes)
        # its modifies after the delete, if any, end at a head after it (a modify sorts after its ancestors)
        if self._first_delete(txn, record) > first and any(self._order(txn, head.raw) > first for head in record.heads):
            self._heads_before(records, record, self._applied_to(records, component, exp_id, _MODIFIES), first)
        record.status = Life.DELETED
        applied = OpStatus.applied(exp_id).pack()
        for order in deletes:
            _insert_cid(record.deleted_by, order_cid(order))
            txn.put(status_key(order_cid(order)), applied)
        records.put(record)

    def _modify_in_place(self, records: _Records, cid: bytes, op: Operation, order: bytes) -> OpStatus:
        """Fold a modify where it sorts, acting on E, what its target resolved to there: void if a delete of E sorts
        before it, else one of E's heads unless a head has it as an ancestor (heads are the maximal modifies, so
        the order they are added in does not matter)."""
        assert op.target is not None
        exp_id = self._resolved_at(records, op.target.raw, order)
        record = records.record(exp_id)
        assert record is not None
        if self._first_delete(records.txn, record) < order:
            return _superseded_by_delete()
        return self._add_head(records, cid, record, op)

    def _first_delete(self, view: ReadView, record: ExperienceRecord) -> bytes:
        """Where the record's first delete sorts (after every order if it has none): its modifies after it are void."""
        return min((self._order(view, delete.raw) for delete in record.deleted_by), default=_LAST_ORDER)

    def _applied_to(
        self, records: _Records, component: bytes, exp_id: bytes, kinds: frozenset[bytes]
    ) -> list[tuple[bytes, bytes]]:
        """(order, CID) of the operations of `kinds` (kind bytes) whose status says they acted on `exp_id`, in
        canonical order. Each names an experience that resolves to it, so they are read from the operations
        naming those, unless the experience's adds (its support: a merge's tree holds its sources' adds) are more
        than an eighth (`_READ_BY_NAME`) as many as the component's experiences: then from the component's list
        of operations (one key each, and a status for each of `kinds`). In the 100k workload's largest component
        (682 experiences) an experience of one add costs 0.05 ms read by name against 1.7 ms from the list; one
        of 511 adds 10 ms against 1.8 ms."""
        txn = records.txn
        record = records.record(exp_id)
        assert record is not None
        applied, found = OpStatus.applied(exp_id).pack(), []
        if tables._READ_BY_NAME * record.support < read_u64(txn.get(component_size_key(component))):
            for named in _tree(records, exp_id):
                for key, _ in txn.scan(by_target_prefix(named)):
                    kind, order = parse_by_target_key(key)
                    if kind in kinds and txn.get(status_key(order_cid(order))) == applied:
                        found.append((order, order_cid(order)))
            return sorted(found)
        for key, kind in txn.items(component_op_prefix(component)):
            if kind and kind not in kinds:  # most are not of `kinds`: nothing more is read for them
                continue
            order = parse_component_op_key(key)
            cid = order_cid(order)
            if (kind or _KIND_BYTE[self.meta(txn, cid).kind]) in kinds and txn.get(status_key(cid)) == applied:
                found.append((order, cid))
        return found

    def _heads_before(
        self, records: _Records, record: ExperienceRecord, modifies: list[tuple[bytes, bytes]], start: bytes
    ) -> None:
        """Void the modifies after a late delete (delete beats modify) and give `record` the heads of those before,
        which act on it."""
        record.heads, record.version = [], record.id
        record.domain = ".".join(self.content(records.txn, record.id.raw).domain)
        for order, cid in modifies:
            if order > start:
                records.txn.put(status_key(cid), _superseded_by_delete().pack())
            else:
                status = self._add_head(records, cid, record, load_stored(records.txn.block(cid)))
                records.txn.put(status_key(cid), status.pack())

    def _modify(self, records: _Records, cid: bytes, record: ExperienceRecord, op: Operation) -> OpStatus:
        if record.status is Life.DELETED:
            return _superseded_by_delete()
        return self._add_head(records, cid, record, op)

    def _add_head(self, records: _Records, cid: bytes, record: ExperienceRecord, op: Operation) -> OpStatus:
        """Make the modify `cid` a head of `record`, dropping the heads it has as ancestors; unless a head has it
        as an ancestor, which only a late modify more than the causal horizon below that head can be (§7.2)."""
        assert op.content is not None
        old_heads = [head.raw for head in record.heads]
        above = [head for head in old_heads if self.meta(records, head).clock > op.clock]
        if any(self.is_ancestor(records, cid, head) for head in above):
            return OpStatus.applied(record.id.raw)
        seen = self.ancestors_among(records, old_heads, cid) if old_heads else set()
        heads = [head for head in old_heads if head not in seen] + [cid]
        winner = min(heads, key=lambda head: (-self.meta(records, head).clock, head))
        record.heads = _sorted_cids(heads)
        record.version = CID(winner)
        record.domain = ".".join(op.content.domain if winner == cid else self.content(records, winner).domain)
        records.put(record)
        return OpStatus.applied(record.id.raw)
