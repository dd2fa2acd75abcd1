"""Moving adds between experiences for a late add that takes adds over (PROTOCOL §7.5; `takeover` decides which).

Rule: repoint (the adds taken over become aliases of the late add N and nothing else changes), rename (N takes the
record of the first add R it takes over; R and the adds become its aliases), join (an experience no merge took
moves into what N stands for; its deletes and modifies act there again where they sort), split (adds leave their
experience with the deletes naming them; the modifies naming them act again where they sort).
Invariant: each add moved is listed by, and counts one supporter in, what its F resolved to where the add sorts,
and in each merge above that (`_carry`); the fold counts again the votes of the roots whose members moved.
"""

from __future__ import annotations

from ledger.cid import CID
from ledger.library.batch import _Records, _Work
from ledger.library.tables import _ACTS_ON, _KIND_BYTE, _MODIFIES, _alias, _insert_cid, _new_record, _sorted_cids
from ledger.ops import Kind, Operation, load_stored
from ledger.records import Life, OpStatus, Outcome
from ledger.tables import by_target_prefix, order_cid, parse_by_target_key, status_key


class Regroup:
    """Moving adds between experiences for a takeover, as methods of the `Library`."""

    def _undelete(
        self, records: _Records, end: bytes, leaving: list[bytes], staying: list[tuple[bytes, bytes]]
    ) -> None:
        """Take the deletes (orders) of adds that left the experience at `end` off it: it is live again unless
        another deletes it, and its modifies (`staying`, when its first delete left) act on it again up to its new
        first delete."""
        txn = records.txn
        record = records.record(end)
        assert record is not None
        gone = {order_cid(order) for order in leaving}
        record.deleted_by = [delete for delete in record.deleted_by if delete.raw not in gone]
        if not record.deleted_by:
            record.status = Life.LIVE
        if staying:
            self._heads_before(records, record, staying, self._first_delete(txn, record))
        records.put(record)

    def _rename(
        self, work: _Work, component: bytes, cid: bytes, op: Operation, old: bytes, taken: dict[bytes, bytes | None]
    ) -> None:
        """Fold a late add absorbed into no add that takes over the first add R of an experience and adds whose
        chains end at R (`taken`): every add that resolved to R resolves to the new add, and no operation of R's
        experience sorts before R. The new add's record is R's with its own id, creator and clock (and its text,
        unless a modify's is visible) and one more supporter, R and the adds taken over are its aliases, and what
        named R as its experience names the new add (the verdicts of modifies and deletes, the counted votes,
        moved by the fold as a root's that became an alias, and the merge R went into, which with the merges
        after it gains the supporter). A copy of an insight sorting before all its copies, which one peer can sign
        again and again, folded the 1M workload's largest component again: 1.4-2.0 s for 9,636 operations.
        bench_ledger: "a copy that sorts first".
        """
        txn, records = work.records.txn, work.records
        record = records.record(old)
        assert record is not None
        assert record.alias_of is None or self.meta(txn, record.alias_of.raw).kind is Kind.MERGE, "R stood for itself"
        acted = self._applied_to(records, component, old, _ACTS_ON)  # found through R's record, which changes
        first = _new_record(cid, op, support=record.support + 1)
        first.status, first.alias_of, first.heads = record.status, record.alias_of, record.heads
        if record.version.raw != old:  # a modify's text is visible, not R's
            first.version, first.domain = record.version, record.domain
        first.absorbed, first.deleted_by = record.absorbed, record.deleted_by
        _insert_cid(first.absorbed, old)
        records.put(first)
        records.put(_alias(old, load_stored(txn.block(old)), cid))
        absorbed = OpStatus(Outcome.ABSORBED, into=CID(cid)).pack()
        for add, before in taken.items():
            if before is not None:
                records.realias(add, before, cid)
                work.repointed.add(add)
            txn.put(status_key(add), absorbed)
        txn.put(status_key(cid), OpStatus.applied(cid).pack())
        link = first.alias_of
        while link is not None:  # the merges R's experience went into, each later one taking the one before
            merge = records.record(link.raw)
            assert merge is not None
            if link == first.alias_of:
                merge.absorbed = _sorted_cids([source.raw for source in merge.absorbed if source.raw != old] + [cid])
            merge.support += 1
            records.put(merge)
            link = merge.alias_of
        # R's counted votes move to what it resolves to after the fold (`_move_counts`: R stood for itself, and
        # is an alias now), which is the new add unless a merge of this batch took it
        if record.alias_of is not None:
            work.repointed.add(old)
        # only modifies and deletes say they acted on R (R's status says it is absorbed now)
        applied = OpStatus.applied(cid).pack()
        for _, acting in acted:
            txn.put(status_key(acting), applied)

    def _repoint_within(
        self, work: _Work, cid: bytes, op: Operation, order: bytes, taken: dict[bytes, bytes | None]
    ) -> None:
        """Fold a late absorbed add that is now F of later adds of its own experience (§7.6): each add taken over
        resolves through it to the end of the chain it resolved through before, so no experience changes. The
        new add is absorbed where it sorts; each add taken over becomes its alias and says it is absorbed into
        it. With the absorption horizon a copy inside a cluster is such an add (it takes over the copies of its
        window whose earlier near-duplicates in theirs all sort after it), which any peer can sign at any clock."""
        txn, records = work.records.txn, work.records
        txn.put(status_key(cid), self._absorb_late(records, cid, op, order).pack())
        absorbed = OpStatus(Outcome.ABSORBED, into=CID(cid)).pack()
        for add, before in taken.items():
            assert before is not None, "each was absorbed before"
            records.realias(add, before, cid)
            work.repointed.add(add)  # it resolves to what it did: its votes count where they did
            txn.put(status_key(add), absorbed)

    def _absorb_experience(
        self, work: _Work, component: bytes, cid: bytes, first: bytes, taken: dict[bytes, bytes | None]
    ) -> None:
        """Move an experience that no merge took into what the late add `cid` stands for (a join, §7.6): its
        first add (`first`) and the adds taken over with it become aliases of the new add, each of its adds adds
        to the support of what it joins where it sorts, its deletes delete that where they sort
        (`_delete_in_place`; the caller checked no merge took it), and its modifies are folded again there where
        they sort (`_modify_in_place`; those its deletes voided stay void: what it joins is deleted no later).
        Merges naming it are void and stay void (their rules read the operations naming their targets, and a
        delete of any experience involved is final); its counted votes move with it (`_move_counts`: a root that
        became an alias)."""
        txn, records = work.records.txn, work.records
        record = records.record(first)
        assert record is not None and record.status is not Life.ALIAS
        adds = [first, *(add.raw for add in record.absorbed)]
        applied = OpStatus.applied(first).pack()
        modifies = sorted(
            parse_by_target_key(key)[1]
            for add in adds
            for key, _ in txn.scan(by_target_prefix(add, _KIND_BYTE[Kind.MODIFY]))
            if txn.get(status_key(order_cid(parse_by_target_key(key)[1]))) == applied
        )
        records.put(_alias(first, load_stored(txn.block(first)), cid))
        absorbed = OpStatus(Outcome.ABSORBED, into=CID(cid)).pack()
        for add, before in taken.items():
            if before is not None:
                records.realias(add, before, cid)
                work.repointed.add(add)  # its votes were counted on the first's experience, and move with them
            txn.put(status_key(add), absorbed)
        self._carry(records, cid, [(self._order(txn, add), add) for add in adds], gain=True)
        if record.deleted_by:
            stands = records.resolved(cid)
            assert stands is not None
            self._delete_in_place(records, component, stands, [self._order(txn, d.raw) for d in record.deleted_by])
        for modify in modifies:
            modify_cid = order_cid(modify)
            op = work.fold.operations.get(modify_cid) or load_stored(txn.block(modify_cid))
            txn.put(status_key(modify_cid), self._modify_in_place(records, modify_cid, op, modify).pack())

    def _split_off(
        self,
        work: _Work,
        cid: bytes,
        end: bytes,
        taken: dict[bytes, bytes | None],
        carried: list[bytes],
        voted: bool,
    ) -> None:
        """Move the adds whose chains of earliest adds pass through adds the late add `cid` takes over (`carried`,
        which votes name if `voted`, and no delete or merge) out of the experience their chains end in (at
        `end`) and into what the new add stands for: each leaves the support of what it joined where it sorts and
        adds to that of its new one; the adds taken over become aliases of the new add. Votes naming the adds
        leaving count elsewhere now: then the fold counts the votes of the experiences that lost or gained members
        again (`_tally`), which costs their members, not the component's operations."""
        txn, records = work.records.txn, work.records
        orders = [(self._order(txn, add), add) for add in carried]
        self._carry(records, end, orders, gain=False)
        absorbed = OpStatus(Outcome.ABSORBED, into=CID(cid)).pack()
        for add, before in taken.items():
            assert before is not None, "an add whose chain ends elsewhere was absorbed"
            if voted:  # read and written back, so the fold sees it resolve elsewhere and counts votes again
                record = records.record(add)
                assert record is not None and record.alias_of == CID(before)
                record.alias_of = CID(cid)
                records.put(record)
            else:
                records.realias(add, before, cid)
                work.repointed.add(add)  # no vote counted through it: every count stays
            txn.put(status_key(add), absorbed)
        self._carry(records, cid, orders, gain=True)

    def _move_modifies(self, work: _Work, component: bytes, modifies: list[bytes]) -> None:
        """Fold again, where they sort, the modifies (orders) of adds that left their experience: each leaves the
        heads of the record it acted on, which are folded again from that record's other modifies (as after a
        late delete: those before its first delete, if any), and acts on what its target resolves to now there."""
        records, txn = work.records, work.records.txn
        acted_on: dict[bytes, list[bytes]] = {}
        folded = []  # not: a new one this fold has not reached (it acts on what its target resolves to then), or
        for order in modifies:  # one void by its clock, which acts on nothing wherever it sorts
            raw = txn.get(status_key(order_cid(order)))
            if raw is None or self.clock_void(txn, self.meta(txn, order_cid(order))) is not None:
                continue
            folded.append(order)
            status = OpStatus.unpack(raw)
            if status.outcome is Outcome.APPLIED and status.experience is not None:
                acted_on.setdefault(status.experience.raw, []).append(order)
        for exp_id, leaving in sorted(acted_on.items()):
            record = records.record(exp_id)
            assert record is not None
            modifies = self._applied_to(records, component, exp_id, _MODIFIES)
            staying = [(order, cid) for order, cid in modifies if order not in leaving]
            self._heads_before(records, record, staying, self._first_delete(txn, record))
            records.put(record)
        for order in folded:
            cid = order_cid(order)
            op = work.fold.operations.get(cid) or load_stored(txn.block(cid))
            txn.put(status_key(cid), self._modify_in_place(records, cid, op, order).pack())
