"""Merges (PROTOCOL §7.4), folded on top, where they sort, and taken back (§7.5).

Rule: a merge is void when a source is named by an applied delete that does not descend from it
(`merge.concurrent_delete`) or by an applied modify neither its ancestor nor its descendant
(`merge.concurrent_modify`), over the whole applied set, Delete > Modify > merge; else void if a resolved source
is deleted (`merge.target_deleted`); else it creates a live record (support the sum of its sources', absorbed the
resolved sources) and each source becomes its alias.
Invariant: a merge void by concurrency stays void (only its verdict's wording may change: `_reword`). A new modify
or delete that voids an applied merge undoes it before its batch folds (`_undo_merges`): alone when nothing but
votes acted on it (`_undo`), else with what acted on it (`rewind`). bench_ledger at 1M measures each path (268b0ba's
run, bench/RESULTS.md): "a merge of two early roots sorting just after them" 2.4 ms, "a delete that voids a merge"
6.3 ms and "another once it is void" 1.6 ms, "a delete that voids a merge void merges name" 7.6 ms, "a modify
that voids a merge and one of another member in one batch" 15.5 ms, "a merge of an early add a merge took and a
new add" 8.6 ms; each cost 0.9-2.3 s when the component was folded again.
"""

from __future__ import annotations

from collections.abc import Iterator

from ledger.cid import CID
from ledger.library.batch import _Records, _tree, _Work
from ledger.library.order import OpMeta
from ledger.library.tables import (
    _ACTS_ON,
    _CONCURRENTLY_VOID,
    _FIRST_ORDER,
    _KIND_BYTE,
    _NOT_EXPERIENCE,
    _REWORDABLE,
    _TARGET_DELETED,
    _new_record,
    _not_experience,
    _sorted_cids,
    _target_deleted,
)
from ledger.ops import Kind, Operation, load_stored
from ledger.records import Life, OpStatus, Outcome
from ledger.store import Transaction
from ledger.tables import by_target_prefix, component_key, order_cid, parse_by_target_key, status_key


class Merges:
    """Merges, as methods of the `Library`."""

    def _undo_merges(self, work: _Work, component: bytes, voiding: list[bytes]) -> list[bytes]:
        """Undo the applied merges the new modifies and deletes at `voiding` (orders) void, before any new operation
        of the component is folded; returns the experiences that resolved to what they went into.

        One that nothing but votes has acted on since it was folded changed only its own record and its sources'
        (each became its alias), so voiding it gives back the records of the fold without it: its record goes,
        and each source stands for itself (`_undo`). One that something else acted on is taken back with what
        acted on it, which is folded again (`_unfold`, `_fold_again`; the batch's new operations are folded after,
        each where it sorts: every late add of it that took adds over is not folded yet). Where the returned
        experiences' votes count is counted again by the caller: only theirs, not the whole component's (in a 200k
        workload's largest component, 1,363 experiences, counting them all was 13-25 ms of a 16-27 ms undo).
        One peer could otherwise make the node fold a large component again for two signatures: a merge of two
        small roots, then a modify concurrent with it (~1.2 s in the 1M workload's largest component), or such a
        modify and any other operation of the component in one batch.
        bench_ledger: "a modify that voids a merge and one of another member in one batch".
        """
        records, txn = work.records, work.records.txn
        trees: list[bytes] = []
        for order in voiding:
            for merge in sorted(work.voids_merge[order]):  # found by `_place`: finding them again walks the ancestry
                merge_cid = order_cid(merge)
                if not self._is_applied(txn, merge):
                    continue  # folded again as an earlier one was undone: void too
                status = self._concurrently_voided(records, merge_cid, self.meta(txn, merge_cid))
                assert status is not None, "the new operation is concurrent with it"
                tree, replay = self._take_back(work, component, merge_cid, _FIRST_ORDER)
                trees.extend(tree)
                txn.put(status_key(merge_cid), status.pack())
                self._fold_again(work, replay, _FIRST_ORDER)
        return trees

    def _take_back(self, work: _Work, component: bytes, merge: bytes, now: bytes) -> tuple[list[bytes], list[bytes]]:
        """Undo an applied merge: by itself if nothing but votes acted on it (`_undo`), else with what acted on it
        (`_unfold` from where it sorts; `now`: the order of the operation being folded; the caller writes the merge's
        own verdict); returns the experiences that resolved to what it went into and the operations to fold again
        (`_fold_again`)."""
        if self._acted_on_by_none(work.records, merge):
            tree = _tree(work.records, merge)
            self._undo(work.records, merge)
            return tree, []
        return self._unfold(work, component, self._order(work.records.txn, merge), [merge], [], now)

    def _undo(self, records: _Records, merge: bytes) -> None:
        """Undo an applied merge that nothing but votes acted on: its record goes, its sources stand for themselves,
        and the void merges naming it, folded already, are void as merges of no experience (§7.4 reads that first).
        bench_ledger: "a delete that voids a merge void merges name".
        """
        txn = records.txn
        record = records.record(merge)
        assert record is not None
        for source_id in record.absorbed:
            source = records.record(source_id.raw)
            assert source is not None
            source.status, source.alias_of = Life.LIVE, None  # a source was a live root (§7.4)
            records.put(source)
        records.drop(merge)
        for key, _ in list(txn.scan(by_target_prefix(merge, _KIND_BYTE[Kind.MERGE]))):
            naming = order_cid(parse_by_target_key(key)[1])
            meta = self.meta(txn, naming)
            if (
                txn.get(status_key(naming)) is not None
                and self.clock_void(txn, meta) is None
                # one naming an operation void by its clock was never placed: `_place` gave its verdict
                and all(txn.get(component_key(target)) is not None for target in meta.targets)
            ):
                missing = next(target for target in meta.targets if records.record(target) is None)
                txn.put(status_key(naming), _not_experience(missing).pack())

    def _acted_on_by_none(self, records: _Records, merge: bytes) -> bool:
        """Whether no operation after the applied merge acted on it: it has no modify and no delete (either would
        have left heads or deleted it, also through a source), no applied merge names it (that one made it an
        alias), and no add was absorbed into it (it lists only its sources). Votes naming it change counts only:
        they become void with it (the tally after the undo rewrites their statuses), so the workload's merges,
        voted on within seconds, are undone too; void merges naming it stay void (`_undo` rewords them)."""
        record = records.record(merge)
        if record is None or record.status is not Life.LIVE or record.heads:
            return False
        sources = [records.record(exp_id.raw) for exp_id in record.absorbed]
        if any(source is None or source.alias_of != record.id for source in sources):
            return False
        # a late add absorbed into a source before the merge added one to both (`_absorb_late`)
        assert record.support == sum(source.support for source in sources if source is not None)
        return True

    @staticmethod
    def _is_applied(txn: Transaction, order: bytes) -> bool:
        """Whether the operation at `order` is applied (an applied add or merge's verdict names itself)."""
        cid = order_cid(order)
        return txn.get(status_key(cid)) == OpStatus.applied(cid).pack()

    def _stays_void(self, txn: Transaction, merge: bytes, deleted: bytes) -> bool:
        """Whether the merge at `merge` keeps its verdict when an add it names moves to an experience whose first
        delete sorts at `deleted` (`_LAST_ORDER`: none), the rest of what it names staying where it was: it is void
        by its clock, by a concurrent modify or delete (§7.4 reads the operations naming its targets, which are the
        same), as naming an experience that stays none, or as naming one deleted before it and that one is (a
        source deleted before a merge voids it, whichever). One applied would take the other experience, one
        new is not folded yet (it is folded after, where it sorts)."""
        raw = txn.get(status_key(order_cid(merge)))
        if raw is None:
            return True
        status = OpStatus.unpack(raw)
        if status.outcome is not Outcome.VOID:
            return False
        if status.code in _CONCURRENTLY_VOID or status.code == _NOT_EXPERIENCE:
            return True
        return self.clock_void(txn, self.meta(txn, order_cid(merge))) is not None or (
            status.code == _TARGET_DELETED and deleted < merge
        )

    def _merge_in_place(self, work: _Work, component: bytes, cid: bytes, op: Operation, order: bytes) -> None:
        """Fold a late merge where it sorts (what acted on the experiences it takes since is folded again after it:
        `_merge_unfolding`). One signed late is concurrent with the modifies and deletes of its targets it does not
        descend from, and void by them: it changes no record.

        If nothing after it but votes and absorbed adds acted on the experiences it takes (`_acted_on_after`),
        they are as they were where it sorts but for those adds, so its verdict is the one folding it on top gives
        (§7.4): its sources become its aliases, and the adds absorbed into them after it move to its record (`_add`
        lists an add in what its F resolved to where the add sorts; the merge's support counts them already). Any
        peer can sign a merge of two small roots with a clock just above theirs: it folded the 1M workload's
        largest component again (9,565 operations, 1.5-2.3 s).
        bench_ledger: "a merge of two early roots sorting just after them".
        """
        records, txn = work.records, work.records.txn
        meta = self.meta(txn, cid)
        ends = records.resolved_all(list(meta.targets))
        roots = sorted({end for end in ends.values() if end is not None})
        voided = self._concurrently_voided(records, cid, meta) if None not in ends.values() else None
        if voided is not None:  # void wherever it sorts (§7.4): it changes no record
            txn.put(status_key(cid), voided.pack())
            return
        if None not in ends.values() and self._acted_on_after(records, component, roots, order):
            self._merge_unfolding(work, component, cid, op, order, order)
            return
        status = self._rule(records, cid, op)
        txn.put(status_key(cid), status.pack())
        if status.outcome is Outcome.APPLIED:
            merge = records.record(cid)
            assert merge is not None
            for root in roots:
                source = records.record(root)
                assert source is not None
                later = {add.raw for add in source.absorbed if self._order(txn, add.raw) > order}
                if later:
                    source.absorbed = [add for add in source.absorbed if add.raw not in later]
                    source.support -= len(later)
                    records.put(source)
                    merge.absorbed = _sorted_cids([*(add.raw for add in merge.absorbed), *later])
            records.put(merge)

    def _merge_unfolding(
        self, work: _Work, component: bytes, cid: bytes, op: Operation, order: bytes, now: bytes
    ) -> list[bytes]:
        """Fold a late merge where it sorts when something after it acted on an experience it takes: what each of
        its targets resolved to there is rewound to that point and what acted on it since taken back with the
        merges that took it since (`_unfold`), the merge's verdict is the one folding it there gives, and what was
        taken back is folded again after it; returns the orders folded again after it (`now`: the order of the
        operation being folded). One whose target was deleted before it is void (§7.4) and changes no record. Any
        peer can sign a merge of two experiences that merges, modifies or deletes acted on since, with a clock
        just above theirs.
        bench_ledger: "a merge of an early add a merge took and a new add".
        """
        records, txn = work.records, work.records.txn
        rewound = sorted({self._resolved_at(records, target, order) for target in self.meta(txn, cid).targets})
        stood = [records.record(exp_id) for exp_id in rewound]
        if any(record is not None and self._first_delete(txn, record) < order for record in stood):
            txn.put(status_key(cid), _target_deleted().pack())
            return []
        return self._fold_rewinding(work, component, cid, op, order, rewound, now)

    def _refold_void_merges(self, work: _Work, component: bytes, merges: list[bytes], now: bytes) -> None:
        """Fold again, where they sort, the void merges (orders) naming adds a split moved, or adds of an experience
        whose first delete it moved, that may apply now (`_stays_void` could not keep them void), in canonical
        order: each is folded again as a late merge, with what acted on its targets since (`_merge_unfolding`; one
        whose target was deleted before it stays void); one that an earlier one folded again with it is done (it
        named what that one rewound), and one that names none of that acts on other experiences."""
        txn = work.records.txn
        done: set[bytes] = set()
        for order in sorted(set(merges)):
            if order in done:
                continue
            cid = order_cid(order)
            op = work.fold.operations.get(cid) or load_stored(txn.block(cid))
            done.update(self._merge_unfolding(work, component, cid, op, order, now))

    def _acted_on_after(self, records: _Records, component: bytes, roots: list[bytes], order: bytes) -> bool:
        """Whether an operation after `order` other than a vote or an absorbed add acted on one of `roots`
        (experiences that stand for themselves): a merge that took it (the root would be that merge, sorting after
        `order`), or a modify or delete applied to it. Void ones stay void with a merge at `order` that takes the
        roots: a modify void by a delete sorting before it (one after `order` was applied to a root; one before
        voids the merge too), a merge void by a concurrent modify or delete of a target (it names the same targets)
        or by a deleted source (likewise), an operation void by its clock."""
        txn = records.txn
        for root in roots:
            if self.meta(txn, root).kind is Kind.MERGE and self._order(txn, root) > order:
                return True
            if any(later > order for later, _ in self._applied_to(records, component, root, _ACTS_ON)):
                return True
        return False

    def _concurrent_merges(self, txn: Transaction, target: bytes, cid: bytes) -> Iterator[tuple[bytes, bool]]:
        """(order, voided) of the merges naming `target` that the modify or delete `cid` does not descend from,
        and so voids (§7.4). `voided`: the merge is void already, so one more concurrent operation can only
        reword its verdict (merge.concurrent_*), not change any record. Without this, each modify naming a
        source of a void merge folded the merge's component again: ~180 ms per operation in a 200k
        workload's largest component, ~1.2 s at 1M, for as many as one peer cared to sign."""
        modify = self.meta(txn, cid).kind is Kind.MODIFY
        for key, _ in txn.scan(by_target_prefix(target, _KIND_BYTE[Kind.MERGE])):
            merge = parse_by_target_key(key)[1]
            merge_cid = order_cid(merge)
            if self.is_ancestor(txn, merge_cid, cid):
                continue
            if modify and self.is_ancestor(txn, cid, merge_cid):
                continue  # e.g. a late modify more than the causal horizon below the merge (§7.2)
            raw = txn.get(status_key(merge_cid))  # None: a merge of this batch, not folded yet
            yield merge, raw is not None and OpStatus.unpack(raw).outcome is not Outcome.APPLIED

    def _reword(self, work: _Work) -> None:
        """The verdicts of void merges that new modifies or deletes of their sources are concurrent with: the
        concurrency rules come first in §7.4 and name the first such operation, which may now be another.
        bench_ledger: "a delete that voids a merge ..., another once it is void".
        """
        records = work.records
        for merge in sorted(work.reworded):
            cid = order_cid(merge)
            raw = records.txn.get(status_key(cid))
            assert raw is not None
            if OpStatus.unpack(raw).code in _REWORDABLE:
                status = self._concurrently_voided(records, cid, self.meta(records.txn, cid))
                assert status is not None, "a new operation is concurrent with it"
                records.txn.put(status_key(cid), status.pack())

    def _merge(self, records: _Records, cid: bytes, op: Operation, meta: OpMeta) -> OpStatus:
        voided = self._concurrently_voided(records, cid, meta)
        if voided is not None:
            return voided
        roots = sorted({records.resolved(target) for target in meta.targets})  # type: ignore[type-var]
        sources = [records.record(root) for root in roots]
        if any(source is None or source.status is Life.DELETED for source in sources):
            return _target_deleted()
        record = _new_record(cid, op, support=sum(source.support for source in sources if source))
        record.absorbed = _sorted_cids(roots)
        for source in sources:
            assert source is not None
            source.status, source.alias_of = Life.ALIAS, CID(cid)
            records.put(source)
        records.put(record)
        return OpStatus.applied(cid)

    def _concurrently_voided(self, records: _Records, cid: bytes, meta: OpMeta) -> OpStatus | None:
        """The merge's verdict if a delete or modify of a source is concurrent with it, found among the whole applied
        set (§7.4: Delete > Modify > merge over all the sources, naming the canonically first); None if none is."""
        for kind in (_KIND_BYTE[Kind.DELETE], _KIND_BYTE[Kind.MODIFY]):
            found = [first for target in meta.targets if (first := self._first_concurrent(records, cid, target, kind))]
            if not found:
                continue
            other = order_cid(min(found))
            if kind == _KIND_BYTE[Kind.DELETE]:
                return OpStatus.void("merge.concurrent_delete", f"{CID(other)} deletes a source (delete beats merge)")
            return OpStatus.void("merge.concurrent_modify", f"{CID(other)} modifies a source (modify beats merge)")
        return None

    def _first_concurrent(self, records: _Records, merge: bytes, target: bytes, kind: bytes) -> bytes | None:
        """The order of the canonically first delete (or modify: `kind`) naming `target` that voids the merge."""
        for key, _ in records.scan(by_target_prefix(target, kind)):
            order = parse_by_target_key(key)[1]
            other = order_cid(order)
            if self.clock_void(records, self.meta(records, other)) is not None:
                continue  # void by its clock: it acts on nothing, not even a merge
            if kind == _KIND_BYTE[Kind.DELETE] and not self.is_ancestor(records, merge, other):
                return order
            if (
                kind == _KIND_BYTE[Kind.MODIFY]
                and not self.is_ancestor(records, other, merge)
                and not self.is_ancestor(records, merge, other)
            ):
                return order
        return None
