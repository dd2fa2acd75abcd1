"""Taking back and rewinding (PROTOCOL §7.5): folding a late operation where it sorts when others acted since.

Rule: to fold an operation at `start` under what acted since, take back the applied merges it undoes with their
chains (their other sources stand for themselves again, the chains' records go), rewind each experience it
touches to `start` (its modifies, deletes and absorbed adds after it come off its record), and fold again, in
canonical order, every operation after `start` whose target (an add: its F) resolved into that set where it
sorts; a merge folded again that may apply joins the set.
Invariant: nothing outside the set read its records, so folding it again gives the records of the definition, at
the cost of what acted on the set since, never the component's: bench_ledger's "folds N operations again" at 1M
(bench/RESULTS.md, 268b0ba's run) is 2 for "a merge of an early add a merge took" and 4 for "a late copy taking
adds out of an experience an applied merge and a delete name", where folding the component again was 8,612-9,570.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from ledger.library import tables
from ledger.library.absorption import _f_before
from ledger.library.batch import _Records, _tree, _Work
from ledger.library.tables import _CONCURRENTLY_VOID, _KIND_BYTE, _LAST_ORDER, _MODIFIES
from ledger.ops import Kind, Operation, load_stored
from ledger.records import ExperienceRecord, Life, OpStatus
from ledger.store import Transaction
from ledger.tables import (
    by_target_prefix,
    component_op_key,
    component_op_prefix,
    component_size_key,
    order_cid,
    parse_by_target_key,
    parse_component_op_key,
    read_u64,
    status_key,
)


class _Following:
    """The operations of a component after `start` that may name an experience of a set that grows as they are
    read, in canonical order, each with its kind byte (`Library._unfold`).

    Every operation of the component (one key each) unless the set is small against the component (its
    experiences over `_READ_BY_NAME`, as `Library._applied_to`): then those naming one of the set (modifies,
    deletes, merges) and the set's own adds and merges (an add names its F, and one whose F resolved into an
    experience is listed in that experience's tree), each read when it joins the set. Reading every one cost
    57-180 ms at 1M for a late merge whose set held six experiences (19,000 operations after it)."""

    def __init__(self, txn: Transaction, component: bytes, start: bytes, order_of: Callable[[bytes], bytes]) -> None:
        self._txn, self._component, self._start, self._order_of = txn, component, start, order_of
        self._by_name: bool | None = None  # decided by the first set
        self._waiting: list[tuple[bytes, bytes]] = []  # heap of (order, kind byte)
        self._seen: set[bytes] = set()

    def include(self, members: Iterable[bytes], after: bytes) -> None:
        """Read, from now on, the operations after `after` naming `members`, and those of them sorting after it."""
        txn, component = self._txn, self._component
        members = list(members)
        if self._by_name is None:
            size = read_u64(txn.get(component_size_key(component)))
            self._by_name = tables._READ_BY_NAME * len(members) < size
        if not self._by_name:
            return
        orders = [self._order_of(member) for member in members]
        for member in members:
            orders.extend(parse_by_target_key(key)[1] for key, _ in txn.scan(by_target_prefix(member)))
        for order in orders:
            if order > after and order not in self._seen:
                self._seen.add(order)
                # a vote, or an operation void by its clock or naming no experience, is in no component's list
                kind = txn.get(component_op_key(component, order))
                if kind is not None:
                    heapq.heappush(self._waiting, (order, kind))

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        """(order, kind byte) of the operations to read, `start` left out."""
        if not self._by_name:
            for key, kind in self._txn.items(
                component_op_prefix(self._component), component_op_key(self._component, self._start)
            ):
                if (order := parse_component_op_key(key)) != self._start:
                    yield order, kind
            return
        while self._waiting:
            yield heapq.heappop(self._waiting)


@dataclass
class _TakeBack:
    """A take-back in progress (`Rewind._unfold`): the set it takes back, growing as operations are read, and what
    it folds again."""

    following: _Following  # the operations after its start that may name the set
    #: the adds a late add of the batch not folded yet took over, each with its F before (None: none): their F names
    #: that late add already, and their F before is what they stand for until it is folded
    pending: dict[bytes, bytes | None]
    taken: set[bytes] = field(default_factory=set)  # merges taken back or folded again that may apply, and `first`
    chains: list[bytes] = field(default_factory=list)  # the merges whose records go
    #: where each experience resolving to a chain's end joined the chain (an operation after that which names it
    #: acted on the chain): the first merge's tree where it sorts, each other source's where its merge sorts; a
    #: rewound root's tree where the start sorts
    joined: dict[bytes, bytes] = field(default_factory=dict)
    tree: list[bytes] = field(default_factory=list)  # the experiences whose votes the caller counts again
    in_tree: set[bytes] = field(default_factory=set)
    replay: list[bytes] = field(default_factory=list)  # the orders of the operations to fold again
    released: list[tuple[bytes, bytes]] = field(default_factory=list)  # (experience, order) to rewind to there


class Rewind:
    """Taking back and rewinding, as methods of the `Library`."""

    def _unfold(
        self,
        work: _Work,
        component: bytes,
        start: bytes,
        bottoms: list[bytes],
        rewound: list[bytes],
        now: bytes,
        first: bytes | None = None,
    ) -> tuple[list[bytes], list[bytes]]:
        """Take back the applied merges `bottoms` (none sorting before `start`) and the roots `rewound` to where
        `start` sorts, with what acted on them since, to fold that again; returns the experiences that resolved to
        what they went into and the merges to fold again (whose votes the caller counts again) and the orders of
        the operations to fold again, in canonical order (`_fold_again`). `first`: the operation at `start`, which
        the caller folds first (a merge folded void that may apply now, or a late add taking adds over); what
        names it (an add: its F) is folded again too.

        What acted on a merge acted on one of the merges from it up to what it went into (its chain: it and the
        merges that took it since): the operations after it whose target (for an add, its F) resolved to one of
        them where the operation sorts (`_take_back_named`). Nothing else read their records, and the sources of
        the chain's merges are as they were where each became an alias (everything after that named them acted on
        the chain): they stand for themselves again and the chain's records go (`_drop_chains`). A rewound root's
        modifies, deletes and absorbed adds after `start` are taken out of its record (`_rewind`) and folded again
        with what named its experiences since. Folding those operations again in canonical order gives the records
        of the definition. An add that a late add of the batch sorting after `now` (the operation being folded)
        took over, not folded yet, names its F before (`_fold_again` folds it there). A new operation not folded
        yet is folded after this, where it sorts (`_fold_in_place`).
        """
        records, txn = work.records, work.records.txn
        back = _TakeBack(
            _Following(txn, component, start, lambda exp_id: self._order(txn, exp_id)),
            self._taken_over_after(work, now),
        )
        for bottom in bottoms:
            self._take_chain(records, bottom, back.taken, back.chains, back.joined)
        if first is not None:
            back.taken.add(first)
        for root in sorted({records.resolved(exp_id) for exp_id in [*bottoms, *rewound]} - {None}):
            back.tree.extend(_tree(records, root))  # type: ignore[arg-type]
        back.in_tree.update(back.tree)
        for root in rewound:
            back.joined.update(dict.fromkeys(_tree(records, root), start))
        back.following.include({*back.tree, *back.taken, *back.joined}, start)
        for later, kind in back.following:
            self._take_back_named(records, back, later, kind)
        self._drop_chains(records, back.chains, back.taken)
        for root in rewound:
            self._rewind(records, component, root, start)
        for exp_id, order in back.released:
            self._rewind(records, component, exp_id, order)
        return back.tree, back.replay

    def _take_back_named(self, records: _Records, back: _TakeBack, later: bytes, kind: bytes) -> None:
        """Fold the operation at `later` (`kind`: its kind byte, if its component's list holds it) again with the
        take-back `back` if what it names (an add: its F before, `back.pending`) joined the set before it sorts.

        Most of a large component's operations after the take-back's start name nothing of the set: which do is
        read first (the kind, an add's F, cached targets), their verdicts only for those that do."""
        txn = records.txn
        cid = order_cid(later)
        kind = kind or _KIND_BYTE[self.meta(txn, cid).kind]  # a list written before it held kinds
        if kind == _KIND_BYTE[Kind.ADD]:
            named = [f for f in [_f_before(txn, cid, back.pending)] if f]
        else:
            named = self.meta(txn, cid).targets
        inside = [target in back.taken or back.joined.get(target, _LAST_ORDER) < later for target in named]
        if not any(inside):
            return
        status = txn.get(status_key(cid))
        if status is None:
            return
        # a merge void by a concurrent modify or delete stays void (§7.4 reads the whole set for that)
        if kind == _KIND_BYTE[Kind.MERGE] and OpStatus.unpack(status).code not in _CONCURRENTLY_VOID:
            self._merge_taken_back(records, back, cid, later, status, named, inside)
        back.replay.append(later)

    def _merge_taken_back(
        self,
        records: _Records,
        back: _TakeBack,
        cid: bytes,
        later: bytes,
        status: bytes,
        named: Sequence[bytes],
        inside: list[bool],
    ) -> None:
        """A merge at `later` folded again by the take-back `back` (`status`: its stored verdict; `inside`: which of
        its targets `named` joined the set): one that may apply joins the set, so what names it is folded again.

        One applied, or naming nothing outside the set, may apply. One void that names, outside the set, no
        experience or one deleted before it stays void; another void one may apply and take the experiences it
        names outside, whose records hold what acted on them since: each joins the set where the merge sorts and
        is rewound to there (`_release`)."""
        outside = [
            records.record(self._resolved_at(records, target, later))
            for target, within in zip(named, inside, strict=True)
            if not within
        ]
        if status == OpStatus.applied(cid).pack() or not outside:
            back.taken.add(cid)
        elif not any(out is None or self._first_delete(records.txn, out) < later for out in outside):
            for out in outside:
                assert out is not None, "checked above"
                self._release(records, back, out, later)
            back.taken.add(cid)
        if cid in back.taken:
            back.following.include([cid], later)
        if cid not in back.in_tree:  # the votes naming one that applies now count there (`_tally`)
            back.tree.append(cid)

    def _release(self, records: _Records, back: _TakeBack, out: ExperienceRecord, later: bytes) -> None:
        """Let the experience `out`, outside the take-back `back`, join it where the merge at `later` sorts: it is
        rewound to there (`_rewind`: what acted on it since is folded again after the merge), and a merge that
        took it since is taken back with its chain (`_take_chain`)."""
        members = _tree(records, out.id.raw)
        back.joined.update(dict.fromkeys(members, later))
        if out.alias_of is not None:  # a merge after this one took it: taken back with its chain
            self._take_chain(records, out.alias_of.raw, back.taken, back.chains, back.joined)
            end = records.resolved(out.id.raw)
            assert end is not None
            if end not in back.in_tree:  # a chain of its own: its end's tree is counted again too
                members = _tree(records, end)
        back.tree.extend(member for member in members if member not in back.in_tree)
        back.in_tree.update(members)
        back.released.append((out.id.raw, later))
        back.following.include(members, later)

    @staticmethod
    def _drop_chains(records: _Records, chains: list[bytes], taken: set[bytes]) -> None:
        """The records of the merges of the chains taken back (`chains`) go, and their sources that no merge folded
        again is (`taken`) stand for themselves again."""
        for link in chains:
            record = records.record(link)
            assert record is not None
            for source_id in record.absorbed:
                source = records.record(source_id.raw) if source_id.raw not in taken else None
                if source is not None and source.alias_of == record.id:
                    source.status, source.alias_of = Life.LIVE, None  # a source was a live root (§7.4)
                    records.put(source)
            records.drop(link)

    def _take_chain(
        self, records: _Records, bottom: bytes, taken: set[bytes], chains: list[bytes], joined: dict[bytes, bytes]
    ) -> None:
        """Add to a take-back (`_unfold`) the applied merge `bottom` with its chain, up to its end or a merge taken
        back already: each merge joins `taken` and `chains`, and its other sources' trees (and the adds absorbed
        into it, which it lists with them) join where it sorts, unless they joined earlier (a chain taken later may
        reach down to where one taken first took its end)."""
        txn = records.txn
        links: list[tuple[bytes, ExperienceRecord]] = []
        link: bytes | None = bottom
        while link is not None and link not in taken:
            record = records.record(link)
            assert record is not None and self.meta(txn, link).kind is Kind.MERGE, "only merges take experiences"
            links.append((link, record))
            link = record.alias_of.raw if record.alias_of is not None else None
        taken.update(link for link, _ in links)
        chains.extend(link for link, _ in links)
        for link, record in links:
            at = self._order(txn, link)
            joined[link] = min(joined.get(link, at), at)
            for source_id in record.absorbed:
                if source_id.raw not in taken:
                    for member in _tree(records, source_id.raw):
                        joined[member] = min(joined.get(member, at), at)

    def _taken_over_after(self, work: _Work, order: bytes) -> dict[bytes, bytes | None]:
        """The adds that late adds of the batch sorting after `order` (not folded yet) took over, each with its F
        before (None: none): their stored F names that late add already."""
        txn = work.records.txn
        return {
            add: before
            for later, pairs in work.takes_over.items()
            if self._order(txn, later) > order
            for add, before in pairs
        }

    def _rewind(self, records: _Records, component: bytes, exp_id: bytes, start: bytes) -> None:
        """Make a root's record what it was where `start` sorts: without the adds absorbed into it, the deletes of
        it and the modifies of it since, which are folded again (`_unfold`). Its heads are the maximal ones among
        its modifies before `start` (those sort before a delete after `start`, so they are applied)."""
        txn = records.txn
        record = records.record(exp_id)
        assert record is not None and record.status is not Life.ALIAS
        modifies = self._applied_to(records, component, exp_id, _MODIFIES)  # before its adds leave: some name them
        if any(order > start for order, _ in modifies):
            self._heads_before(records, record, modifies, start)
        later = [cid for cid in record.deleted_by if self._order(txn, cid.raw) > start]
        record.deleted_by = [cid for cid in record.deleted_by if cid not in later]
        record.status = Life.DELETED if record.deleted_by else Life.LIVE
        records.put(record)
        self._release_adds_after(records, record, start)

    def _release_adds_after(self, records: _Records, out: ExperienceRecord, order: bytes) -> None:
        """Take the adds absorbed into a root after `order` out of its record, to be folded again: a merge there
        may take it, and then lists them (`_add` lists an add in what its F resolved to where the add sorts)."""
        txn = records.txn
        after = {add.raw for add in out.absorbed if self._order(txn, add.raw) > order}  # its sources sort before
        if after:
            out.absorbed = [add for add in out.absorbed if add.raw not in after]
            out.support -= len(after)
            records.put(out)

    def _fold_again(self, work: _Work, replay: list[bytes], now: bytes) -> None:
        """Fold operations taken back by `_unfold` again, in canonical order, while the operation at `now` is
        folded.

        Most are adds absorbed into an F whose record is already the alias `_add` would write: only what F
        resolves to now lists them (`_absorb_again`), and the operation is not read. Reading and decoding each
        one (its content, embedding and signature) was a quarter of a take-back that folded 8,612 operations
        again at 1M, writing each alias record a tenth. An add that a late add of the batch sorting after `now`
        took over, not folded yet, is folded with its F before (its stored F names that late add already, whose
        fold then takes it over from there, as it would had it arrived after this operation)."""
        records, txn = work.records, work.records.txn
        pending = self._taken_over_after(work, now)
        work.fold.refolded += len(replay)
        for order in replay:
            cid = order_cid(order)
            op = work.fold.operations.get(cid)
            is_add = self.meta(txn, cid).kind is Kind.ADD
            into = _f_before(txn, cid, pending) if is_add else None
            status = self._absorb_again(records, cid, into) if op is None and into is not None else None
            if status is None and is_add:
                status = self._add(records, cid, op or load_stored(txn.block(cid)), into)
            elif status is None:
                status = self._rule(records, cid, op or load_stored(txn.block(cid)))
            txn.put(status_key(cid), status.pack())

    def _fold_rewinding(
        self, work: _Work, component: bytes, cid: bytes, op: Operation, order: bytes, rewound: list[bytes], now: bytes
    ) -> list[bytes]:
        """Fold the late operation `cid` at `order` after rewinding the experiences `rewound` (what it acts on, as
        they stood there) to that point, with what acted on them since and the merges that took them since
        (`_unfold`); what was taken back is folded again after it (`now`: the order of the operation being folded).
        Returns the orders folded again."""
        records, txn = work.records, work.records.txn
        stood = [records.record(exp_id) for exp_id in rewound]
        bottoms = sorted({record.alias_of.raw for record in stood if record is not None and record.alias_of})
        tree, replay = self._unfold(work, component, order, bottoms, rewound, now, first=cid)
        work.undone.setdefault(component, []).extend([*tree, cid])
        txn.put(status_key(cid), self._rule(records, cid, op).pack())
        self._fold_again(work, replay, now)
        return replay
