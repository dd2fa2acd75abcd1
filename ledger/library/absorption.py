"""Near-duplicate absorption (PROTOCOL §7.6, and the add step of §7.4).

Rule: an add is absorbed into F, the canonically earliest add that sorts before it, is not void by its clock, lies
at most `absorption_horizon` clocks below it, shares a band with it and nearly duplicates it (the exact cosine
test): it becomes F's alias, and what F resolves to where the add sorts gains a supporter and lists it. A late add
becomes F of the adds after it, within the horizon, whose F is missing or sorts after it (`takeover`).
Invariant: F only moves earlier. A bucket keeps adds by anchor (F's clock when indexed), so finding F stops at the
best one found, and a late add reads only the anchors from its clock to one horizon above: without the horizon a
late copy read 157,889 bucket keys (283 ms); bench_ledger's "a copy that sorts first" and "one after it" at 1M
(84.4 / 24.8 ms in 268b0ba's run, bench/RESULTS.md) measure it. The key filter's bucket marks answer for the
empty buckets (80% of the writer's scans), for the ingest ratio.
"""

from __future__ import annotations

from ledger.cid import CID
from ledger.library.batch import _Records
from ledger.library.tables import _alias, _insert_cid, _new_record, _sorted_cids, _written_by_alias
from ledger.neardup import exact_cosine_exceeds, exact_cosines_exceed
from ledger.ops import Operation
from ledger.records import OpStatus, Outcome
from ledger.store import Transaction
from ledger.tables import (
    LAST_ADD,
    absorbs_key,
    bucket_key,
    bucket_mark_key,
    bucket_prefix,
    order_cid,
    parse_bucket_key,
    read_u64,
    u64,
)


def _f_before(txn: Transaction, add: bytes, earlier: dict[bytes, bytes | None]) -> bytes | None:
    """An add's F, or, if a late add not folded yet took it over (`earlier`), its F before that (None: none)."""
    return earlier[add] if add in earlier else txn.get(absorbs_key(add))


def _chain_ends(txn: Transaction, earlier: dict[bytes, bytes | None], starts: list[bytes]) -> dict[bytes, bytes]:
    """For each of `starts` (and the adds on the way), the end of its chain of earliest adds before a late add
    took adds over (`earlier`: the earliest add each had before, which the stored one replaced; None: none)."""
    ends: dict[bytes, bytes] = {}
    for start in starts:
        chain, add = [], start
        while add not in ends:
            chain.append(add)
            before = _f_before(txn, add, earlier)
            if before is None:
                ends[add] = add
            else:
                add = before
        ends.update(dict.fromkeys(chain, ends[add]))
    return ends


def _list_absorbed(records: _Records, cid: bytes, into: bytes) -> OpStatus:
    """List an add absorbed into `into` in what that resolves to now, which gains one supporter; its verdict."""
    root = records.resolved(into)
    stands = records.edit(root) if root is not None else None
    assert stands is not None, "an earlier add in the component has been folded"
    stands.support += 1
    _insert_cid(stands.absorbed, cid)
    records.put(stands)
    return OpStatus(Outcome.ABSORBED, into=CID(into))


class Absorption:
    """Near-duplicate absorption, as methods of the `Library`."""

    def _absorption(
        self, txn: Transaction, cid: bytes, order: bytes, values: bytes, bands: list[bytes]
    ) -> tuple[bytes | None, list[tuple[bytes, bytes | None]]]:
        """Index a new add by its hash bands, find the earliest earlier add it nearly duplicates at most the
        absorption horizon below it (`_earliest_near`), and the later adds whose earliest it now is
        (`_taking_over`, from `_after_in_buckets`) (§7.6); returns the first (None if none) and the second, whose
        components it joins, each with its earliest before (None if none).

        Most buckets are empty: the key filter holds a mark per non-empty bucket and answers for all 32 at
        once, where opening an iterator seeks every level of the database (80% of the writer's scans; their
        cost grew with the database). A bucket it may hold (all of them while it is rebuilt) is read.
        """
        verdicts: dict[bytes, bool] = {}  # add (order) -> whether this one nearly duplicates it
        last = txn.get(LAST_ADD)
        late = last is not None and last > order  # some add sorts after this one: it may absorb them
        if not late:
            txn.put(LAST_ADD, order)
        marks = [bucket_mark_key(band) for band in bands]
        used = [band for band, maybe in zip(bands, txn.mark(marks), strict=True) if maybe]
        earliest = self._earliest_near(txn, order, values, used, verdicts)
        # before this add's own keys are in the transaction: merging them in sorted every bucket's keys
        following = self._after_in_buckets(txn, order, used) if late else set()
        for band in bands:
            txn.put(bucket_key(band, order, earliest or order), b"")
        into = order_cid(earliest) if earliest is not None else None
        if into is not None:
            txn.put(absorbs_key(cid), into)
        following.discard(order)
        return into, self._taking_over(txn, cid, order, values, following, verdicts)

    def _near(self, txn: Transaction, values: bytes, other: bytes, verdicts: dict[bytes, bool]) -> bool:
        """Whether the add with embedding `values` nearly duplicates the add at order `other` (the exact test,
        remembered in `verdicts`)."""
        if other not in verdicts:
            verdicts[other] = exact_cosine_exceeds(values, self._vector(txn, order_cid(other)), self._threshold)
        return verdicts[other]

    def _earliest_near(
        self, txn: Transaction, order: bytes, values: bytes, used: list[bytes], verdicts: dict[bytes, bool]
    ) -> bytes | None:
        """The order of F: the earliest add before the add at `order` it nearly duplicates, at most the horizon
        below it, in the buckets `used` (those that may hold adds); None if none.

        A bucket is kept in the order of its adds' anchors (`bucket_key`: the clock of an add's F when it was
        indexed, then its own order). An add sorts no earlier than its anchor, so finding the earliest earlier
        one stops at the first key past the best found: for a copy in a cluster, the cluster's first add in its
        window. An anchor is at most the horizon below its add, so the search starts two horizons below.
        """
        earliest: bytes | None = None
        bound = order  # F sorts before this add and before the earliest near-duplicate found so far
        clock = read_u64(order[:8])
        lowest = u64(max(clock - self._horizon, 0))  # F's clock is no lower than this (orders start with the clock)
        lowest_anchor = u64(max(clock - 2 * self._horizon, 0))
        for band in used:  # an empty bucket (most are) has nothing to test
            limit = bucket_key(band, bound, bound)
            for key, _ in txn.scan(bucket_prefix(band), bucket_prefix(band) + lowest_anchor):
                if key >= limit:  # an add's anchor sorts before it: every add from here on sorts after `bound`
                    break
                other = parse_bucket_key(key, band)
                if lowest <= other < bound and self._near(txn, values, other, verdicts):
                    earliest = bound = other
                    limit = bucket_key(band, bound, bound)
        return earliest

    def _after_in_buckets(self, txn: Transaction, order: bytes, used: list[bytes]) -> set[bytes]:
        """The adds (orders) after the late add at `order` in its buckets `used` that it may take over.

        A late add may take over only adds whose F sorts after it (or that have none) and that lie at most the
        horizon above it, whose anchors lie between the two clocks, so it reads that range of its buckets: a
        late copy reads the copies of its window, not every copy of the insight (~158,000 keys in the 1M
        workload's largest cluster, a 283 ms read for one signature, without the horizon). F only moves
        earlier, so an anchor stays where a takeover leaves it.
        bench_ledger: "a copy that sorts first" and "one after it".
        """
        highest = u64(read_u64(order[:8]) + self._horizon + 1)  # an add this one may take over sorts before this
        following: set[bytes] = set()
        for band in used:  # the adds of a cluster of copies share most buckets: each is looked at once
            start = bucket_key(band, order, order)
            anchored = len(start) - len(order)  # parse_bucket_key, inlined
            keys = txn.keys(bucket_prefix(band), start, bucket_prefix(band) + highest)
            following.update(other for key in keys if (other := key[anchored:]) < highest)
        return following

    def _taking_over(
        self,
        txn: Transaction,
        cid: bytes,
        order: bytes,
        values: bytes,
        following: set[bytes],
        verdicts: dict[bytes, bool],
    ) -> list[tuple[bytes, bytes | None]]:
        """Of the adds after the late add `cid` in its buckets (`following`, orders), those whose F it now is, each
        with its F before (None: none); each one's stored F becomes `cid`."""
        # whether its F sorts before this add first: one that a late add took over since it was indexed does (its
        # anchor is where its F was), and needs no exact test
        candidates = []
        for other in sorted(following):
            current = txn.get(absorbs_key(order_cid(other)))
            if current is None or self._order(txn, current) > order:
                candidates.append((other, current))
        untested = [other for other, _ in candidates if other not in verdicts]
        vectors = [self._vector(txn, order_cid(other)) for other in untested]
        verdicts.update(zip(untested, exact_cosines_exceed(values, vectors, self._threshold), strict=True))
        taken = []
        for other, current in candidates:
            if verdicts.get(other, False):
                txn.put(absorbs_key(order_cid(other)), cid)  # this add now sorts first among its near-duplicates
                taken.append((order_cid(other), current))
        return taken

    @staticmethod
    def _absorb_again(records: _Records, cid: bytes, into: bytes) -> OpStatus | None:
        """`_add`'s verdict for an add absorbed into `into` whose record is that alias already (as `_alias` writes it:
        no heads, absorbed adds, deletes or counts, its own version); None if its record is another."""
        if not _written_by_alias(records.record(cid), cid, into):
            return None
        return _list_absorbed(records, cid, into)

    def _carry(self, records: _Records, start: bytes, adds: list[tuple[bytes, bytes]], *, gain: bool) -> None:
        """Add absorbed adds (order, CID) to what `start` resolves to where each sorts, or take them out of it: the
        record listing each, and the merges above it, gain or lose one supporter per add (as `_add` did)."""
        stops, end = self._merge_stops(records, start)
        listed: dict[bytes, list[bytes]] = {}
        for order, add in adds:
            stands = next((exp_id for exp_id, merged in stops if merged > order), end)
            listed.setdefault(stands, []).append(add)
        count = 0
        for exp_id in [*(exp_id for exp_id, _ in stops), end]:
            count += len(listed.get(exp_id, ()))
            if not count:
                continue
            record = records.edit(exp_id)
            assert record is not None
            record.support += count if gain else -count
            if gain and exp_id in listed:
                record.absorbed = _sorted_cids([*(add.raw for add in record.absorbed), *listed[exp_id]])
            elif exp_id in listed:
                leaving = set(listed[exp_id])
                record.absorbed = [add for add in record.absorbed if add.raw not in leaving]
            records.put(record)

    def _absorb_late(self, records: _Records, cid: bytes, op: Operation, order: bytes) -> OpStatus:
        """A late add absorbed into an earlier one, F, and first among no later adds of another experience (§7.6):
        what F resolved to where the add sorts gains it, and each merge it went into since then gains one support."""
        into = records.txn.get(absorbs_key(cid))
        if into is None:  # a new experience, which a merge of the same batch joined to the component
            records.put(_new_record(cid, op, support=1))
            return OpStatus.applied(cid)
        self._carry(records, into, [(order, cid)], gain=True)
        records.put(_alias(cid, op, into))
        return OpStatus(Outcome.ABSORBED, into=CID(into))

    @staticmethod
    def _add(records: _Records, cid: bytes, op: Operation, into: bytes | None) -> OpStatus:
        """A new experience, absorbed into `into` (F: the canonically earliest earlier add it nearly duplicates,
        §7.6), if any."""
        if into is None:
            records.put(_new_record(cid, op, support=1))
            return OpStatus.applied(cid)
        status = _list_absorbed(records, cid, into)
        records.put(_alias(cid, op, into))
        return status
