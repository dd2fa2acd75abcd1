"""Late adds that take adds over (PROTOCOL §7.5, "A late add N that is F for adds after it"; §7.6).

Rule: the adds a late add N takes over fall into groups by the end of their chain of F before N. One group keeps
its experience (the one N's F's chain ends in, repointed; else the largest whose first add N takes over, renamed
to N); every other moves into what N stands for: a join (a whole experience) or a split (the adds whose chains
pass through the group). Where a merge, a delete or a modify names what moves beyond what those moves cover, N
rewinds what it touches instead (`_take_over_unfolding`, `rewind`).
Invariant: each case gives the records of folding the component from nothing (tests/test_convergence.py checks
every arrival order) and costs what it moves. bench_ledger at 1M (268b0ba's run, bench/RESULTS.md): "a copy that
sorts first" 84.4 ms; the repeated insight's "split" 17.6 ms and "join" 24.0 ms, "with a delete of an add that
leaves" 15.4 / 21.2 ms; "a late copy taking adds out of an experience an applied merge and a delete name" 6.5 ms;
each 0.9-2.6 s when the component was folded again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ledger.library.absorption import _chain_ends
from ledger.library.batch import _Records, _tree, _Work
from ledger.library.tables import _KIND_BYTE, _LAST_ORDER, _new_record
from ledger.neardup import band_keys_of_many
from ledger.ops import Kind, Operation
from ledger.records import ExperienceRecord, Life, OpStatus, Outcome
from ledger.store import Transaction
from ledger.tables import (
    absorbs_key,
    bucket_mark_key,
    bucket_prefix,
    by_target_prefix,
    order_cid,
    parse_by_target_key,
    read_u64,
    status_key,
    u64,
)


def _support(records: _Records, exp_id: bytes) -> tuple[int, bytes]:
    """The experience's support, then its id: the largest experience a takeover joins keeps its record."""
    record = records.record(exp_id)
    assert record is not None
    return record.support, exp_id


@dataclass
class _Regrouping:
    """How a late add's takeover moves the groups of adds that do not keep their experience
    (`Takeover._take_over_in_place`)."""

    host: ExperienceRecord | None  # what the late add stands for unless new: the experience kept
    deletable: bool  # whether deletes may move into it: no merge took it (a merge after such a delete would be void)
    joined: list[bytes] = field(default_factory=list)  # the first adds of the experiences that move whole
    merged: list[bytes] = field(default_factory=list)  # the merges that took those
    #: (end, adds carried, modifies naming them, whether votes name them, deletes going with them, the modifies
    #: that act on the experience at `end` again) per split
    split: list[tuple[bytes, list[bytes], list[bytes], bool, list[bytes], list[tuple[bytes, bytes]]]] = field(
        default_factory=list
    )
    #: (the first applied merge naming adds that leave, those adds) per split
    unfolding: list[tuple[bytes, list[bytes]]] = field(default_factory=list)
    refolding: list[bytes] = field(default_factory=list)  # void merges naming adds that leave, which may apply after

    def fits(self) -> bool:
        """Whether the in-place moves cover the plan: a join of one merged experience alone (taken back first), or
        a split alone into what no merge took when an applied merge names the adds that leave, and no void merge
        that may apply along with an applied one."""
        if self.refolding and self.unfolding:
            return False
        if self.merged:
            return not self.split and len(self.joined) <= 1
        if self.unfolding:
            return len(self.split) <= 1 and not self.joined and self.deletable
        return True

    def taken_back(self, taken: list[bytes]) -> tuple[bytes, list[bytes]]:
        """The merge to take back before the moves (`Takeover._unfold_joined`), and the adds that move (`taken`: those
        the late add takes over): for a split, those it carries too (one sorting after the merge would be folded
        again naming the late add, not found)."""
        if self.merged:
            return self.merged[0], taken
        merge, carried = self.unfolding[0]
        return merge, [*taken, *carried]


class Takeover:
    """Deciding how a late add takes adds over, as methods of the `Library`."""

    @staticmethod
    def _deletes_leaving(txn: Transaction, end: bytes, orders: list[bytes]) -> list[bytes] | None:
        """Of the deletes (orders) naming adds that leave the experience at `end`, those that deleted it, in
        canonical order; None if one acted on another experience (a merge that took it sorts before the delete)."""
        leaving = []
        for order in orders:
            raw = txn.get(status_key(order_cid(order)))
            if raw is None:  # new and not folded yet: it acts on what its target resolves to when it is
                continue
            status = OpStatus.unpack(raw)
            if status.outcome is not Outcome.APPLIED:  # void by its clock
                continue
            if status.experience is None or status.experience.raw != end:
                return None
            leaving.append(order)
        return sorted(leaving)

    def _staying_modifies(
        self, records: _Records, end: bytes, carried: set[bytes], leaving: list[bytes]
    ) -> tuple[list[tuple[bytes, bytes]], list[bytes]] | None:
        """What the experience at `end` folds again when deletes (orders) of adds leaving it go with them: nothing
        if its first delete stays; else the modifies (order, CID) of its other adds, in canonical order, which
        act on it again up to its new first delete, if any, and the void merges naming its other adds that may
        apply now (it is no longer deleted before them: `_stays_void`), which are folded again after the split
        (`_refold_void_merges`); None if an applied merge names one of them (then the component is folded
        again)."""
        txn = records.txn
        record = records.record(end)
        assert record is not None and record.status is Life.DELETED
        if self._first_delete(txn, record) not in leaving:
            return [], []
        left = set(leaving)
        gone = min((order for delete in record.deleted_by if (order := self._order(txn, delete.raw)) not in left),
                   default=_LAST_ORDER)  # fmt: skip
        modifies, merges = [], []
        for add in _tree(records, end):
            if add in carried:
                continue
            for key, _ in txn.scan(by_target_prefix(add)):
                kind, order = parse_by_target_key(key)
                if kind == _KIND_BYTE[Kind.MERGE] and not self._stays_void(txn, order, gone):
                    if self._is_applied(txn, order):
                        return None
                    merges.append(order)
                cid = order_cid(order)
                if (
                    kind == _KIND_BYTE[Kind.MODIFY]
                    and txn.get(status_key(cid)) is not None  # folded: a new one is folded on its own
                    and self.clock_void(txn, self.meta(txn, cid)) is None
                ):
                    modifies.append((order, cid))
        return sorted(modifies), merges

    def _take_over_in_place(self, work: _Work, component: bytes, cid: bytes, op: Operation, order: bytes) -> bool:
        """Fold a late add that is now first among adds after it (a takeover, §7.6) where it sorts; False if it
        would join an experience a merge took along with another or into one a merge took, or take adds that a
        merge names out of theirs, or move a delete where a merge's verdict could change (then what it touches is
        rewound to where it sorts: `_take_over_unfolding`).

        The adds it takes over fall into groups by the end of their chain of earliest adds before it. One group
        keeps its experience: the one its F's chain ends in (it is absorbed: `_repoint_within`), or else the
        largest experience whose first add it takes over, which it renames (`_rename`). Every other group moves
        into what the new add stands for (`_plan_join`, `_plan_split`, `_move_groups`; an applied merge that took
        what moves is taken back first, `_unfold_joined`, and the void ones that may apply now are folded again
        after, `_refold_void_merges`). Each costs what it moves, not the component: one peer could sign a copy
        near the first adds of two experiences, or near an add but not its first, and make a node fold the 1M
        workload's largest component again (1.8-2.6 s) for each; with a delete of an add that moves signed first,
        until deletes moved with them; out of the deleted experience of adds that void merges name, until those
        merges were folded again alone (0.93-0.97 s at 1M, 16-22 ms since). bench_ledger: "a copy that sorts first",
        "the repeated insight (...): a split, a join", "with a delete of an add that leaves".
        """
        txn, records = work.records.txn, work.records
        taken = dict(work.takes_over[cid])
        into = txn.get(absorbs_key(cid))
        # the chains as they were when this add was placed: adds of the batch that sort after it, not folded yet,
        # may have taken over adds on them since
        earlier = self._taken_over_after(work, order) | taken
        ends = _chain_ends(txn, earlier, [*taken, into] if into is not None else list(taken))
        groups: dict[bytes, list[bytes]] = {}
        for add in taken:
            groups.setdefault(ends[add], []).append(add)
        firsts = [end for end in groups if end in taken]  # a group whose end is taken holds that first add
        kept = ends[into] if into is not None else max(firsts, key=lambda end: _support(records, end), default=None)
        # deletes may move into what the new add stands for only if no merge took it (a merge after such a delete
        # would be void): the experience its F's chain ends in, the one it renames, or a new one
        host_id = ends[into] if into is not None else kept
        host = records.record(host_id) if host_id is not None else None
        plan = _Regrouping(host, deletable=host is None or host.status is not Life.ALIAS)
        for end in sorted(groups.keys() - {kept}):
            if end in taken and not self._plan_join(records, plan, end):  # its first: the whole experience moves
                return False
            if end not in taken and not self._plan_split(work, plan, end, earlier, groups[end]):
                return False
        if not plan.fits():
            return False
        replay = None
        if plan.merged or plan.unfolding:
            replay = self._unfold_joined(work, component, *plan.taken_back(list(taken)), host_id, order)
            if replay is None:
                return False
        if into is not None:
            self._repoint_within(work, cid, op, order, {add: taken[add] for add in groups.get(ends[into], [])})
        elif kept is not None:
            self._rename(work, component, cid, op, kept, {add: taken[add] for add in groups[kept]})
        else:
            records.put(_new_record(cid, op, support=1))
            txn.put(status_key(cid), OpStatus.applied(cid).pack())
        moved = {end: {add: taken[add] for add in adds} for end, adds in groups.items()}
        self._move_groups(work, component, cid, plan, moved)
        if replay is not None:
            self._fold_again(work, replay, order)
        self._refold_void_merges(work, component, plan.refolding, order)
        return True

    @staticmethod
    def _plan_join(records: _Records, plan: _Regrouping, end: bytes) -> bool:
        """Plan moving the whole experience whose first add `end` the late add takes over (a join); False if it is
        deleted or a merge took it and what the late add stands for is an alias into a merge."""
        record = records.record(end)
        assert record is not None
        if (record.status is Life.ALIAS or record.status is Life.DELETED) and not plan.deletable:
            return False
        if record.alias_of is not None:  # a merge took it: taken back, and folded again (`_unfold_joined`)
            plan.merged.append(record.alias_of.raw)
        plan.joined.append(end)
        return True

    def _plan_split(
        self, work: _Work, plan: _Regrouping, end: bytes, earlier: dict[bytes, bytes | None], group: list[bytes]
    ) -> bool:
        """Plan moving the adds whose chains pass through `group` out of the experience at `end` (a split), with the
        deletes and modifies naming them; False if a delete or a merge naming them could not move in place.

        A merge naming an add that leaves takes what the new add stands for where the merge sorts: one void must
        stay void (deleted then: the deletes going with the adds, or the host's own); the first applied one is
        taken back with its chain and folded again after the split (`_unfold_joined`), with what acted on its chain
        since, which the split must then leave alone (no delete of the adds that leave, their modifies before it).
        A void one that may apply now (its experience was deleted before it, what the add moves to is not) is
        folded again after the split, where it sorts (`_refold_void_merges`)."""
        txn, records = work.records.txn, work.records
        carried = self._carried_through(work, earlier, group)
        naming = [parse_by_target_key(key) for add in carried for key, _ in txn.scan(by_target_prefix(add))]
        named = [order for kind, order in naming if kind == _KIND_BYTE[Kind.DELETE]]
        deletes = self._deletes_leaving(txn, end, named)
        if deletes is None or (deletes and not plan.deletable):
            return False
        modifies = sorted(order for kind, order in naming if kind == _KIND_BYTE[Kind.MODIFY])
        merges = [order for kind, order in naming if kind == _KIND_BYTE[Kind.MERGE]]
        applied = [merge for merge in merges if self._is_applied(txn, merge)]
        again_from = min(applied, default=_LAST_ORDER)
        if applied and (deletes or any(modify > again_from for modify in modifies)):
            return False
        host = plan.host
        gone = min([*deletes, *([self._first_delete(txn, host)] if host is not None and plan.deletable else [])],
                   default=_LAST_ORDER)  # fmt: skip
        plan.refolding.extend(
            merge for merge in merges if merge < again_from and not self._stays_void(txn, merge, gone)
        )
        if applied:
            plan.unfolding.append((order_cid(again_from), carried))
        rest = self._staying_modifies(records, end, set(carried), deletes) if deletes else ([], [])
        if rest is None:
            return False
        staying, void_merges = rest
        plan.refolding.extend(void_merges)
        voted = any(kind == _KIND_BYTE[Kind.VOTE] for kind, _ in naming)
        plan.split.append((end, carried, modifies, voted, deletes, staying))
        return True

    def _move_groups(
        self,
        work: _Work,
        component: bytes,
        cid: bytes,
        plan: _Regrouping,
        groups: dict[bytes, dict[bytes, bytes | None]],
    ) -> None:
        """Move the groups the plan joins and splits into what the late add `cid` stands for (`groups`: the end of
        each group's chains -> its adds taken over, each with its F before)."""
        records = work.records
        for end in plan.joined:
            self._absorb_experience(work, component, cid, end, groups[end])
        for end, carried, modifies, voted, deletes, staying in plan.split:
            self._split_off(work, cid, end, groups[end], carried, voted)
            if deletes:
                self._undelete(records, end, deletes, staying)
                stands = records.resolved(cid)
                assert stands is not None
                self._delete_in_place(records, component, stands, deletes)
            self._move_modifies(work, component, modifies)

    def _take_over_unfolding(self, work: _Work, component: bytes, cid: bytes, op: Operation, order: bytes) -> None:
        """Fold a late add that takes adds over where it sorts when `_take_over_in_place` cannot move them alone:
        what its F and each add it takes over resolved to there is rewound to that point, with what acted on it
        since and the merges that took it since (`_unfold`), the add is folded there, and what was taken back is
        folded again after it (the adds taken over name it as F already, so they join what it stands for). It
        costs the operations of the experiences it touches, not its component's: one peer could sign a copy near
        adds that an applied merge and a delete name, or near the first adds of experiences merges took, and make
        a node fold the 1M workload's largest component again (1.8-2.6 s).
        bench_ledger: "a late copy taking adds out of an experience an applied merge and a delete name".
        """
        records = work.records
        into = records.txn.get(absorbs_key(cid))
        starts = [add for add, _ in work.takes_over[cid]] + ([into] if into is not None else [])
        rewound = sorted({self._resolved_at(records, add, order) for add in starts})
        work.unfolded.add(cid)
        self._fold_rewinding(work, component, cid, op, order, rewound, order)

    def _unfold_joined(
        self, work: _Work, component: bytes, merge: bytes, moving: list[bytes], host: bytes | None, order: bytes
    ) -> list[bytes] | None:
        """Take back a merge that took adds (`moving`) a late add at `order` moves into what it stands for (`host`
        if not new, which no merge took) — the experience it joins, or adds it takes out of theirs — and rewind
        that to where the merge sorts (`_unfold`): the adds move as if no merge had taken them, and the merge and
        what acted on them since are folded again after (it takes what it names where that stands then); returns
        the orders to fold again (the caller's tally counts the whole component's votes after a takeover). None if
        the host or an add that moves sorts after the merge: folded again, the merge would list it. Any peer can
        sign a copy near the first add of an experience a merge took, or near adds a merge names, with a clock
        below them: it folded the 1M workload's largest component again (1.1-2.6 s)."""
        txn = work.records.txn
        start = self._order(txn, merge)
        if any(self._order(txn, add) > start for add in [*moving, *([host] if host is not None else [])]):
            return None
        tree, replay = self._unfold(work, component, start, [merge], [host] if host is not None else [], order)
        work.undone.setdefault(component, []).extend(tree)
        return [start, *replay]  # the merge is folded again too

    def _carried_through(self, work: _Work, earlier: dict[bytes, bytes | None], group: list[bytes]) -> list[bytes]:
        """The adds whose chains of earliest adds (as `_chain_ends` follows them) pass through an add of `group`,
        and those adds: they go where it goes. Found from the group down: an add whose F is `parent` shares a
        bucket with it, anchored between the parent's clock and one horizon above (the anchor is where its F was
        when it was indexed, and F only moves earlier), so each step reads the parent's window of its buckets, as
        a late add does (§7.6). Reading the F of every add the experience lists instead was 48 of a 73 ms split
        in the 1M workload's largest cluster. Adds of this batch not folded yet are left to their own fold."""
        txn = work.records.txn
        carried, queue = list(group), list(group)
        seen = set(group)
        links: dict[bytes, bytes | None] = {}  # an add in a window read -> its F (as `earlier` says)
        while queue:
            parent = queue.pop()
            order = self._order(txn, parent)
            clock = read_u64(order[:8])
            bands = band_keys_of_many(
                [self._vector(txn, parent)], self._params.embedding_model, self._params.embedding_dim
            )[0]
            used = [
                band
                for band, maybe in zip(bands, txn.mark([bucket_mark_key(band) for band in bands]), strict=True)
                if maybe
            ]
            for band in used:  # an indexed add's marks are set: marking them again changes nothing
                prefix = bucket_prefix(band)
                for key in txn.keys(prefix, prefix + u64(clock), prefix + u64(clock + self._horizon + 1)):
                    other = key[len(prefix) + 8 :]  # parse_bucket_key, inlined
                    child = order_cid(other)
                    if other <= order or child in seen or other in work.new:
                        continue
                    if child not in links:
                        links[child] = earlier[child] if child in earlier else txn.get(absorbs_key(child))
                    if links[child] == parent:
                        seen.add(child)
                        carried.append(child)
                        queue.append(child)
        return carried
