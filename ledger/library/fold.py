"""The fold driver: the `Library`, and one batch's fold (PROTOCOL §7).

Rule: the library is a pure function of the set of applied operations. A batch's operations are placed in
canonical order (clock voids recorded where they sort, votes kept for the tally, the others put in their
components); then each component they changed is folded: the applied merges its new modifies and deletes void are
undone first, its new operations that sort before an old one are folded where they sort, one at a time in
canonical order, each as if it had arrived alone after the ones before, and the rest on top; then the void merges'
verdicts are reworded, the changed live versions published for the vector index, and the votes counted.
Invariant: the records are those of folding each component from nothing in canonical order, whatever order the
operations arrived in (tests/test_convergence.py); no late operation folds its component again. A late add costs
about what one sorting last does (bench_ledger's "late add ... ratio (target <= 20)", 0.9 at 1M in 268b0ba's run,
bench/RESULTS.md), and ingest keeps its ratio (>= 0.25) and last tenth (>= 0.8) at 1M.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

from ledger.library.absorption import Absorption
from ledger.library.batch import Fold, _BandKeys, _LargeRecords, _Records, _Work
from ledger.library.components import Components
from ledger.library.edits import Edits
from ledger.library.merges import Merges
from ledger.library.order import CanonicalOrder, _PlainMeta
from ledger.library.reading import Reading
from ledger.library.regroup import Regroup
from ledger.library.rewind import Rewind
from ledger.library.tables import _KIND_BYTE, _insert_cid, _not_experience
from ledger.library.takeover import Takeover
from ledger.library.upgrades import Upgrades
from ledger.library.votes import Votes, _root_became_alias, _stands_for
from ledger.ops import Kind, Operation, load_stored
from ledger.params import NetworkParams
from ledger.priority import NEVER
from ledger.records import Life, OpStatus
from ledger.store import Transaction
from ledger.tables import absorbs_key, by_target_key, component_key, order_cid, order_key, ordered_key, status_key


class Library(
    CanonicalOrder, Reading, Upgrades, Components, Absorption, Edits, Votes, Merges, Rewind, Takeover, Regroup
):
    """Reads and folds the library's tables. Holds no view: every read names the one it reads.

    Each rule of PROTOCOL §7 is a class of its own module in this package; this one composes them, holds the
    caches they share, and drives the fold.
    """

    def __init__(self, params: NetworkParams) -> None:
        self._params = params
        self._threshold = Fraction(params.near_duplicate_cosine)
        self._horizon = params.absorption_horizon
        # Invariant: entries are immutable facts about content-addressed operations: any thread may fill it
        # (so it may know operations a view does not: a CID from outside a view is looked up past it).
        # They are plain tuples of ints and bytes, which the garbage collector stops tracking: 20,000
        # objects fewer for every full collection to visit (a pause of every thread, queries included).
        self._meta: dict[bytes, _PlainMeta] = {}
        self._blocks: dict[bytes, bytes] = {}  # likewise: CID -> block of an operation carrying content
        self._large_records = _LargeRecords()

    def fold(
        self,
        txn: Transaction,
        ready: list[tuple[bytes, Operation]],
        pause: Callable[[], None] = NEVER.pause,
    ) -> Fold:
        """Fold newly applied operations: place each in its component, fold the components they changed,
        then count the votes. Writes only into `txn`; the returned Fold says what the index must follow.
        `pause()` is called between operations and components (reads go first); a rebuild folds in chunks and
        logs each (`Ledger.rebuild_library`)."""
        ordered = sorted(ready, key=lambda item: order_key(item[1].clock, item[0]))
        adds = [(cid, op.content.embedding.values) for cid, op in ordered if op.kind is Kind.ADD and op.content]
        work = _Work(
            Fold(dict(ready), changed=bool(ready)), _Records(txn, self._large_records), _BandKeys(adds, self._params)
        )
        votes = []
        for cid, op in ordered:
            pause()
            order = order_key(op.clock, cid)
            meta = self.meta(txn, cid)
            txn.put(ordered_key(order), b"")
            for target in meta.targets:
                txn.put(by_target_key(target, _KIND_BYTE[op.kind], order), b"")
            void = self.clock_void(txn, meta)
            if void is not None:  # void wherever it sorts, and read by no rule: recorded in place
                txn.put(status_key(cid), void.pack())
            elif op.kind is Kind.VOTE:
                votes.append((cid, op))
            else:
                self._place(work, cid, op, meta, order)
        for component in list(work.placed):
            pause()
            self._fold_component(work, component)
        self._reword(work)
        self._publish_changes(work)
        for cid, op in votes:
            pause()
            self._count_vote(work, cid, op)
        work.records.flush(pause)
        return work.fold

    def _fold_component(self, work: _Work, component: bytes) -> None:
        """Fold a component's new operations: those that sort before an old one where they sort (`_fold_in_place`),
        in canonical order, each as if it had arrived alone after the ones before it, then the others on top.

        Only the component's operations from its first new one up to one after its last are read, and a late one
        rewrites the records of what it acts on (and what acted on them since), not the component's.
        """
        txn, records = work.records.txn, work.records
        records.recent = []  # a component's records are read by its own fold only
        placed = sorted(work.placed[component])
        # a new operation that voids a merge, wherever the merge sorts (§7.4), undoes it and folds again what acted
        # on it since (`_undo_merges`), before any new operation is folded
        voiding = [order for order in placed if order in work.voids_merge]
        undone = self._undo_merges(work, component, voiding) if voiding else None
        late = self._late(txn, component, placed, work.new)
        for order in late:
            self._fold_in_place(work, component, order)
        for order in placed[len(late) :]:
            cid = order_cid(order)
            op = work.fold.operations.get(cid) or load_stored(txn.block(cid))
            txn.put(status_key(cid), self._rule(records, cid, op).pack())
        # which experience stands for which decides where votes count; one created by this fold had none
        touched = [exp_id for exp_id in records.recent if records.before[exp_id] is not None]
        changed = [
            exp_id
            for exp_id in touched
            if exp_id not in work.repointed
            and _stands_for(records.record(exp_id)) != _stands_for(records.before[exp_id])
        ]
        # the trees of what this fold took back and folded again
        taken_back = None
        if undone is not None or component in work.undone:
            taken_back = [*(undone or []), *work.undone.get(component, [])]
            # a take-back dropped records and folded them again, without their counts: those that stand for what
            # they did count as they did (where members moved, the counts below change them; the property tests
            # found a merge a take-back let apply void again, its chain's records folded again the same)
            self._keep_counts(records, [exp_id for exp_id in touched if exp_id not in changed])
        # a late add that took adds over moved them between roots that stand for what they did; with a take-back,
        # one it created may stand for itself again, which no record it read says (the property tests found a
        # copy renaming an experience a merge took, the merge then taken back by a split: the votes stayed on it)
        took_over = any(txn.get(component_key(cid)) == component for cid in work.takes_over if cid not in work.unfolded)
        if changed and all(_root_became_alias(records, exp_id) for exp_id in changed):
            self._move_counts(records, changed)
        elif changed or (took_over and taken_back is not None):
            # after take-backs only their trees resolve elsewhere (and to where they did); other late operations
            # changed other roots
            if taken_back is not None and set(changed) <= set(taken_back) and not took_over:
                self._tally(work, taken_back, touched)
            else:
                self._tally(work, self._members(txn, component), touched)

    def _fold_in_place(self, work: _Work, component: bytes, order: bytes) -> None:
        """Fold a late add, merge, modify or delete where it sorts, without folding its component again.

        None makes an alias, so a modify, a delete or an absorbed add acts on one record, E: what its target
        (an add's F) resolved to where it sorts (§7.4). A modify's heads are the maximal ones among E's modifies
        that sort before E's first delete, whatever their order; a delete voids E's modifies after it; an
        absorbed add adds to E's support and so to the merges E went into since. Beyond that only a merge can
        change: one naming the target that the operation voids (§7.4's concurrency rules; `_place` marks those,
        and `_undo_merges` undid them), or one that took E as a source and is void if E was deleted before it;
        and an add that is F for later adds changes theirs (PROTOCOL.md §7.5). A late merge, or an add taking
        adds over, rewrites what it takes or moves and what acted on that since. In a 200k workload's largest
        component (1,363 experiences, ~1,940 operations) such operations cost 160-270 ms when the component was
        folded again, each changing one to five records.
        bench_ledger: "late on early members" and "late add ... ratio (target <= 20)".
        """
        cid = order_cid(order)
        op = work.fold.operations[cid]
        records, txn = work.records, work.records.txn
        if op.kind is Kind.ADD and cid in work.takes_over:
            if not self._take_over_in_place(work, component, cid, op, order):
                self._take_over_unfolding(work, component, cid, op, order)
            return
        if op.kind is Kind.ADD:
            txn.put(status_key(cid), self._absorb_late(records, cid, op, order).pack())
            return
        if op.kind is Kind.MERGE:
            self._merge_in_place(work, component, cid, op, order)
            return
        assert op.kind in (Kind.MODIFY, Kind.DELETE) and op.target is not None, "votes are in no component"
        target = op.target.raw
        if records.record(target) is None:  # a merge that is void created no experience
            txn.put(status_key(cid), _not_experience(target).pack())
            return
        if op.kind is Kind.MODIFY:
            txn.put(status_key(cid), self._modify_in_place(records, cid, op, order).pack())
            return
        exp_id = self._resolved_at(records, target, order)
        record = records.record(exp_id)
        assert record is not None
        if record.status is Life.ALIAS:  # a merge after the delete took E as a source: it is void now
            self._delete_merged_in_place(work, component, record, order)
        else:
            self._delete_in_place(records, component, exp_id, [order])

    def _publish_changes(self, work: _Work) -> None:
        """The live versions this fold changed, for the vector index."""
        records, fold = work.records, work.fold
        for exp_id, before in records.before.items():
            now = records.record(exp_id)
            was = before.version.raw if before is not None and before.live else None
            version = now.version.raw if now is not None and now.live else None
            if was != version:
                values = self.content(records.txn, version, fold.operations).embedding.values if version else None
                fold.changes[exp_id] = (version, values) if version and values else None

    def _rule(self, records: _Records, cid: bytes, op: Operation) -> OpStatus:
        meta = self.meta(records.txn, cid)
        for target in meta.targets:
            if records.record(target) is None:
                return _not_experience(target)
        if op.kind is Kind.ADD:
            return self._add(records, cid, op, records.txn.get(absorbs_key(cid)))
        if op.kind is Kind.MERGE:
            return self._merge(records, cid, op, meta)
        exp_id = records.resolved(meta.targets[0])
        assert exp_id is not None
        record = records.record(exp_id)
        assert record is not None
        if op.kind is Kind.MODIFY:
            return self._modify(records, cid, record, op)
        record.status = Life.DELETED
        _insert_cid(record.deleted_by, cid)
        records.put(record)
        return OpStatus.applied(exp_id)
