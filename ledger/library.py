"""The materialized library: a deterministic fold of the applied operations, one component at a time.

The library is a pure function of the SET of applied operations (docs/PROTOCOL.md §7). Votes are
tallied without regard to order: each author's latest vote counts (§7.7). Every other operation
belongs to a *component*: experiences linked by absorption (§7.6) and by merges, with
the operations acting on them. No rule reads outside its component, so a component's records are
the fold of its own operations in canonical order (Lamport clock, binary CID), and an operation
that arrives late changes what it touches in its component, not the library (§7.5). One that
sorts after everything in its component, the usual case, is folded on top.

The library owns its tables (X experiences, U their lists too long to keep in them, D by domain,
V statuses, O order, T by target, Y and R votes, C/G/Q components, E the add each absorbed add is
absorbed into, Z hash buckets). Reading takes any `ReadView`; folding writes into
the batch's transaction and returns a `Fold` of what changed for the vector index, which the
ledger publishes after the commit. It keeps no per-experience state in memory, but for the decoded
forms of a few large records, each checked against the bytes it was decoded from before it is used.
"""

from __future__ import annotations

import bisect
import heapq
import logging
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import NamedTuple

from ledger import codec
from ledger.cid import CID, CID_LENGTH
from ledger.neardup import band_keys_of_many, exact_cosine_exceeds, exact_cosines_exceed
from ledger.ops import Experience, Kind, Operation, load_stored
from ledger.params import NetworkParams
from ledger.priority import NEVER
from ledger.records import INLINE_LIST, ExperienceRecord, Life, OpStatus, Outcome, Vote, list_digest
from ledger.store import (
    ABSORBS,
    BUCKET,
    BUCKET_MARK,
    BUCKETS_MARKED,
    BY_DOMAIN,
    BY_TARGET,
    COMPONENT,
    COMPONENT_OP,
    COMPONENT_SIZE,
    COUNTED,
    EXPERIENCE,
    LAST_ADD,
    LISTED,
    LISTS_OUTSIDE,
    MEMBER,
    ORDER,
    STATUS,
    VECTOR,
    VOTES,
    ReadView,
    Store,
    StoreError,
    Transaction,
    absorbs_key,
    bucket_key,
    bucket_mark_key,
    bucket_prefix,
    by_domain_key,
    by_domain_prefix,
    by_target_key,
    by_target_prefix,
    cid_of_key,
    component_key,
    component_op_key,
    component_op_prefix,
    component_size_key,
    counted_key,
    counted_prefix,
    experience_key,
    head_key,
    listed_key,
    listed_prefix,
    member_key,
    member_prefix,
    opmeta_key,
    order_cid,
    order_key,
    ordered_key,
    parse_bucket_key,
    parse_by_domain_key,
    parse_by_target_key,
    parse_component_op_key,
    parse_listed_key,
    parse_member_key,
    parse_ordered_key,
    parse_votes_key,
    read_u64,
    status_key,
    u64,
    votes_key,
    votes_prefix,
)

log = logging.getLogger(__name__)

_KINDS = list(Kind)
_KIND_INDEX = {kind: index for index, kind in enumerate(_KINDS)}
_KIND_BYTE = {kind: bytes([index]) for index, kind in enumerate(_KINDS)}
#: the kinds of operation that act on an experience, and of those the modifies (`Library._applied_to`)
_ACTS_ON = frozenset({_KIND_BYTE[Kind.MODIFY], _KIND_BYTE[Kind.DELETE]})
_MODIFIES = frozenset({_KIND_BYTE[Kind.MODIFY]})
#: the operations acting on an experience are read from those naming its adds unless it has more adds than the
#: component has experiences over this (then from the component's list of operations): at 100k operations, ~20 µs
#: per add against ~2.5 µs per experience of the component
_READ_BY_NAME = 8
_META_HEAD = struct.Struct(">QBBB")
#: sorts after every order (u64 clock, CID)
_LAST_ORDER = b"\xff" * 9
#: sorts before every order: an undo before a batch's new operations are folded has every late add of it pending
_FIRST_ORDER = b""
#: operations whose metadata is cached (cleared when full): causality reads recent operations. The entries
#: are plain tuples the garbage collector does not track, so the limit bounds memory only (a cache of
#: objects was once unbounded, and full collections, which visit every tracked object, grew with it)
_META_CACHE_LIMIT = 20_000
#: bucket marks deleted per write when a data directory that stored them is opened
_DROP_CHUNK = 100_000
#: keys per synced write when long lists move out of the records of a data directory written before the U table
_MOVE_CHUNK = 100_000
#: blocks of operations carrying content, cached (cleared when full) as bytes, which the garbage collector does
#: not track: a retrieval reads ~13 of them, and each LevelDB get lets the GIL go, for a query under ingest a
#: wait of up to the switch interval to get it back
_CONTENT_CACHE_LIMIT = 4096
#: `OpMeta` as the cache holds it: (clock, index of the kind in `_KINDS`, parents, targets)
_PlainMeta = tuple[int, int, tuple[bytes, ...], tuple[bytes, ...]]
#: the tables the fold writes; a rebuild clears them
TABLES = (EXPERIENCE, BY_DOMAIN, STATUS, ORDER, BY_TARGET, VOTES, COUNTED, COMPONENT, MEMBER, COMPONENT_OP,
          COMPONENT_SIZE, ABSORBS, BUCKET, LISTED)  # fmt: skip
_CLEARED = tuple(table for table in TABLES if table != ORDER)  # a rebuild reads the order, and writes it the same
_CREATES = (Kind.ADD, Kind.MERGE)  # the kinds whose CID names an experience
#: the verdicts of a merge that one more concurrent modify or delete of a source can reword but not reverse (§7.4)
_REWORDABLE = frozenset({"merge.concurrent_delete", "merge.concurrent_modify", "merge.target_deleted"})
#: the verdicts of a merge that no record can change: §7.4 reads the whole set of operations for them
_CONCURRENTLY_VOID = frozenset({"merge.concurrent_delete", "merge.concurrent_modify"})
_TARGET_DELETED, _NOT_EXPERIENCE = "merge.target_deleted", "target.not_experience"


class OpMeta(NamedTuple):
    """What causality needs of an operation, stored compactly beside its block."""

    clock: int
    kind: Kind
    parents: tuple[bytes, ...]
    targets: tuple[bytes, ...]

    @classmethod
    def of(cls, op: Operation) -> OpMeta:
        targets = op.targets if op.kind is Kind.MERGE else ((op.target,) if op.target is not None else ())
        return cls(op.clock, op.kind, tuple(p.raw for p in op.parents), tuple(t.raw for t in targets))

    def encode(self) -> bytes:
        head = _META_HEAD.pack(self.clock, _KIND_INDEX[self.kind], len(self.parents), len(self.targets))
        return head + b"".join(self.parents) + b"".join(self.targets)

    @staticmethod
    def decode_plain(raw: bytes) -> _PlainMeta:
        """The stored form as a plain tuple of ints and bytes, the form the cache keeps."""
        clock, kind, n_parents, n_targets = _META_HEAD.unpack_from(raw)
        links = [raw[i : i + 36] for i in range(_META_HEAD.size, len(raw), 36)]
        return clock, kind, tuple(links[:n_parents]), tuple(links[n_parents : n_parents + n_targets])

    @property
    def dependencies(self) -> list[bytes]:
        """Parents and targets, each once: an operation applies when all of them have."""
        return list(dict.fromkeys(self.parents + self.targets))


@dataclass
class Fold:
    """What one batch's fold changed outside its transaction, for the ledger to publish after the commit."""

    operations: dict[bytes, Operation]  # the new operations being folded (not yet in the store)
    #: experiences whose live version changed: the version and its float16 embedding, or None (not live now)
    changes: dict[bytes, tuple[bytes, bytes] | None] = field(default_factory=dict)
    refolded: int = 0  # operations taken back and folded again because a late one sorted before them
    changed: bool = False  # whether any operation was folded (the library's generation moves on)


def _listed_in(view: ReadView) -> Callable[[CID, bytes, bytes], list[CID]]:
    """What `ExperienceRecord.unpack` calls for a list kept in the U table: it reads the list, in CID order (the
    order of the record's lists), and checks it against the digest the record holds."""

    def listed(exp_id: CID, tag: bytes, digest: bytes) -> list[CID]:
        cids = [CID(parse_listed_key(key)) for key, _ in view.scan(listed_prefix(exp_id.raw, tag))]
        if list_digest(cids) != digest:
            raise StoreError(
                "store.corrupt", f"experience {exp_id}: the {len(cids)} ids listed for it ({tag!r}) are not its own"
            )
        return cids

    return listed


class _LargeRecords:
    """The decoded forms of the largest records the writer read or wrote lately, with the bytes of each.

    A popular experience has thousands of absorbed adds (4,928 for the 1M workload's largest), and nearly every
    batch absorbs one more: decoding its list took 5-9 ms per batch, reading it from the U table as long. A kept
    form is used only if the stored bytes are still the ones it came from (they hold the digest of each list kept
    outside them), so a failed batch or a rebuild cannot make it stale. The writer alone uses it.
    """

    MIN_SIZE = 16 * 1024  # bytes: smaller records decode in well under a millisecond
    ENTRIES = 16

    def __init__(self) -> None:
        self._kept: OrderedDict[bytes, tuple[bytes, ExperienceRecord]] = OrderedDict()

    def unpack(self, exp_id: bytes, raw: bytes, view: ReadView) -> ExperienceRecord:
        """The record stored as `raw` in `view` (which holds the lists it keeps outside it)."""
        found = self._kept.get(exp_id)
        if found is not None and found[0] == raw:
            self._kept.move_to_end(exp_id)
            return found[1].copy()
        record = ExperienceRecord.unpack(raw, _listed_in(view))
        self.keep(exp_id, raw, record)
        return record

    def keep(self, exp_id: bytes, raw: bytes, record: ExperienceRecord) -> None:
        """Remember `record` as the decoded form of `raw` (a copy: the caller may go on changing its own)."""
        if len(raw) >= self.MIN_SIZE or record.lists_outside:
            self._kept[exp_id] = (raw, record.copy())
            self._kept.move_to_end(exp_id)
            if len(self._kept) > self.ENTRIES:
                self._kept.popitem(last=False)


class _Records:
    """Reads and writes of experience records during one fold, with the domain index kept in step.

    Remembers each record as it was before this fold touched it, so the fold can tell afterwards
    which live versions and which aliases changed. Records are written back once, by `flush`: a
    record that many operations of a batch change (a popular experience, with a long `absorbed`
    list) is encoded once per batch, not once per operation.
    """

    def __init__(self, txn: Transaction, large: _LargeRecords) -> None:
        self.txn = txn
        self._large = large
        self._current: dict[bytes, ExperienceRecord | None] = {}
        self._dirty: set[bytes] = set()
        self.before: dict[bytes, ExperienceRecord | None] = {}
        self.recent: list[bytes] = []  # the records first read since the caller last cleared it
        #: each record's key in the domain index as this fold last wrote it (None: none): a caller may change an
        #: object it has put and put it again, so the old key cannot be read from the object put before
        self._indexed: dict[bytes, bytes | None] = {}
        self._realiased: dict[bytes, bytes] = {}  # aliases rewritten unread (`realias`) -> what they were aliases of
        #: experience -> what it resolves to now, for each experience on a path `resolved` walked; emptied when an
        #: alias changes. A take-back that lists 4,926 absorbed adds again resolved each through a chain of ~45
        #: copies (one link per window of the absorption horizon, §7.6): a quarter of its time
        self._ends: dict[bytes, bytes] = {}
        #: experience -> whether its record as last read or put is an alias, and of what: `put` tells if that
        #: changed (the record put may be the object put or handed out by `edit` before, changed since)
        self._links: dict[bytes, tuple[bool, CID | None]] = {}
        #: experience -> the entries of the lists its stored record keeps in the U table, where it keeps any there (as
        #: read, or as this fold last flushed it): `flush` writes what changed
        self._outside: dict[bytes, set[bytes]] = {}

    def get(self, key: bytes) -> bytes | None:
        return self.txn.get(key)

    def scan(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        return self.txn.scan(prefix, start)

    def block(self, cid: bytes) -> bytes | None:
        return self.txn.block(cid)

    def _load(self, exp_id: bytes) -> ExperienceRecord | None:
        if exp_id not in self._current:
            raw = self.txn.get(experience_key(exp_id))
            self._current[exp_id] = self._large.unpack(exp_id, raw, self.txn) if raw is not None else None
            self.before[exp_id] = self._current[exp_id]
            if (loaded := self._current[exp_id]) is not None and loaded.lists_outside:
                self._outside[exp_id] = loaded.outside()
            if exp_id in self._realiased:
                before = self.before[exp_id] = self._current[exp_id].copy()  # type: ignore[union-attr]
                before.alias_of = CID(self._realiased[exp_id])
            self.recent.append(exp_id)
            if (found := self._current[exp_id]) is not None:
                self._links[exp_id] = (found.status is Life.ALIAS, found.alias_of)
        return self._current[exp_id]

    def record(self, exp_id: bytes) -> ExperienceRecord | None:
        """The record as this fold last wrote it; a copy the caller may change and put back."""
        found = self._load(exp_id)
        return found.copy() if found is not None else None

    def edit(self, exp_id: bytes) -> ExperienceRecord | None:
        """The record as this fold last wrote it, to change in place and `put` back: `record` copies it, which for
        a popular experience (thousands of absorbed adds) cost more than the change when a fold changed it once
        per absorbed add or counted vote."""
        found = self._load(exp_id)
        if found is None:
            return None
        if found is self.before[exp_id]:  # as read: `before` keeps it
            found = self._current[exp_id] = found.copy()
        self._indexed.setdefault(exp_id, by_domain_key(found.domain, exp_id) if found.live else None)
        return found

    def put(self, record: ExperienceRecord) -> None:
        exp_id = record.id.raw
        old = self._load(exp_id)
        link = (record.status is Life.ALIAS, record.alias_of)
        if self._links.get(exp_id, link) != link:
            self._ends.clear()
        self._links[exp_id] = link
        self._current[exp_id] = record
        self._dirty.add(exp_id)
        was = self._indexed.get(exp_id, by_domain_key(old.domain, exp_id) if old and old.live else None)
        now = self._indexed[exp_id] = by_domain_key(record.domain, exp_id) if record.live else None
        if was != now:
            if was is not None:
                self.txn.delete(was)
            if now is not None:
                self.txn.put(now, b"")

    def realias(self, exp_id: bytes, old: bytes, new: bytes) -> None:
        """Make the alias `exp_id` of `old` an alias of `new`. One this fold has not read is rewritten in its stored
        form, not decoded and encoded again: a takeover rewrites thousands (~70 us each)."""
        if exp_id in self._current:
            record = self.record(exp_id)
            assert record is not None and record.alias_of == CID(old)
            record.alias_of = CID(new)
            self.put(record)
            return
        raw = self.txn.get(experience_key(exp_id))
        assert raw is not None
        self.txn.put(experience_key(exp_id), ExperienceRecord.realiased(raw, old, new))
        self._realiased.setdefault(exp_id, old)

    def drop(self, exp_id: bytes) -> None:
        """Remove a record (a take-back folds what made it again)."""
        old = self._load(exp_id)
        self._ends.clear()
        self._links.pop(exp_id, None)
        if old is not None:
            self._dirty.add(exp_id)
            was = self._indexed.get(exp_id, by_domain_key(old.domain, exp_id) if old.live else None)
            if was is not None:
                self.txn.delete(was)
        self._indexed[exp_id] = None
        self._current[exp_id] = None

    def flush(self, pause: Callable[[], None] = NEVER.pause) -> None:
        """Write every record changed since the last flush into the transaction (`pause()` between records)."""
        for exp_id in sorted(self._dirty):
            pause()
            found = self._current[exp_id]
            if exp_id in self._outside or (found is not None and found.lists_outside):
                self._list_outside(exp_id, found)
            if found is None:
                self.txn.put(experience_key(exp_id), None)
                continue
            raw = found.pack()
            self._large.keep(exp_id, raw, found)
            self.txn.put(experience_key(exp_id), raw)
        self._dirty.clear()

    def _list_outside(self, exp_id: bytes, record: ExperienceRecord | None) -> None:
        """Write the U keys of the lists a record keeps outside it that changed since it was read or flushed."""
        was = self._outside.pop(exp_id, set())
        now = record.outside() if record is not None else set()
        for gone in sorted(was - now):
            self.txn.delete(listed_key(exp_id, gone))
        for new in sorted(now - was):
            self.txn.put(listed_key(exp_id, new), b"")
        if now:
            self._outside[exp_id] = now

    def resolved(self, exp_id: bytes) -> bytes | None:
        """The experience standing for `exp_id` now (following aliases); None if `exp_id` has no record."""
        if (end := self._ends.get(exp_id)) is not None:
            return end
        record = self._load(exp_id)
        if record is None:
            return None
        path = []
        while record is not None and record.status is Life.ALIAS:
            if (end := self._ends.get(exp_id)) is not None:
                exp_id = end
                break
            assert record.alias_of is not None
            path.append(exp_id)
            exp_id = record.alias_of.raw
            record = self._load(exp_id)
        if record is not None:  # a link to a dropped record is not remembered
            self._ends.update(dict.fromkeys(path, exp_id))
        return exp_id

    def resolved_all(self, exp_ids: list[bytes], before: bool = False) -> dict[bytes, bytes | None]:
        """`resolved` for each of `exp_ids`, each alias on the way read once: copies of an insight join through
        chains of absorbed adds (one link per window of the absorption horizon, §7.6), which share their tails."""
        read = self._before if before else self._load
        ends: dict[bytes, bytes] = {}  # an alias -> what it resolves to
        found: dict[bytes, bytes | None] = {}
        for start in exp_ids:
            if read(start) is None:
                found[start] = None
                continue
            path, exp_id = [], start
            while exp_id not in ends:
                record = read(exp_id)
                if record is None or record.status is not Life.ALIAS:
                    break
                assert record.alias_of is not None
                path.append(exp_id)
                exp_id = record.alias_of.raw
            end = ends.get(exp_id, exp_id)
            ends.update(dict.fromkeys(path, end))
            found[start] = end
        return found

    def _before(self, exp_id: bytes) -> ExperienceRecord | None:
        self._load(exp_id)
        return self.before[exp_id]


@dataclass
class _Work:
    """One batch's fold in progress: the components it must fold, and from which position."""

    fold: Fold
    records: _Records
    bands: _BandKeys
    new: set[bytes] = field(default_factory=set)  # orders of the operations this batch folds
    #: new add -> the adds it is now first among (§7.6), each with the add that was first before (None: itself)
    takes_over: dict[bytes, list[tuple[bytes, bytes | None]]] = field(default_factory=dict)
    #: aliases a takeover folded in place made aliases of the new add: each resolves to what it did, renamed
    repointed: set[bytes] = field(default_factory=set)
    placed: dict[bytes, list[bytes]] = field(default_factory=dict)  # component -> the orders of its new operations
    #: new modify or delete -> the applied merges of its target it is concurrent with: it voids them wherever they sort
    voids_merge: dict[bytes, list[bytes]] = field(default_factory=dict)
    #: void merges a new modify or delete of a source is concurrent with: their verdict may name another rule
    reworded: set[bytes] = field(default_factory=set)
    #: component -> the trees of the merges a late delete undid where it sorts (`Library._delete_merged_in_place`)
    undone: dict[bytes, list[bytes]] = field(default_factory=dict)
    #: late adds that took adds over folded by rewinding what they touch (`Library._take_over_unfolding`): the
    #: trees they changed are in `undone`
    unfolded: set[bytes] = field(default_factory=set)


#: adds per matrix product of their band keys: a library rebuild folds every add at once, and one product
#: for 200,000 adds would hold ~1.6 GB of float64
_BAND_CHUNK = 1024


class _BandKeys:
    """The band keys of the adds a fold places, a chunk at a time in fold order (one matrix product each)."""

    def __init__(self, adds: list[tuple[bytes, bytes]], params: NetworkParams) -> None:
        """`adds`: (CID, float16 embedding) of every add of the fold, in fold order."""
        self._adds, self._params = adds, params
        self._next = 0
        self._keys: dict[bytes, list[bytes]] = {}

    def of(self, cid: bytes) -> list[bytes]:
        while cid not in self._keys:
            chunk = self._adds[self._next : self._next + _BAND_CHUNK]
            assert chunk, "adds are placed in fold order, each in the fold's list"
            self._next += len(chunk)
            keys = band_keys_of_many(
                [values for _, values in chunk], self._params.embedding_model, self._params.embedding_dim
            )
            self._keys = {add: add_keys for (add, _), add_keys in zip(chunk, keys, strict=True)}
        return self._keys[cid]


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
            self._by_name = _READ_BY_NAME * len(members) < size
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


def _sorted_cids(raws: Iterable[bytes]) -> list[CID]:
    return [CID(raw) for raw in sorted(set(raws))]


def _insert_cid(cids: list[CID], raw: bytes) -> None:
    """Add `raw` to a list of CIDs sorted by binary CID, unless it is there (a popular experience's
    `absorbed` list is long: rebuilding it for each absorption cost time growing with the ledger)."""
    at = bisect.bisect_left(cids, raw, key=_raw)
    if at == len(cids) or cids[at].raw != raw:
        cids.insert(at, CID(raw))


def _raw(cid: CID) -> bytes:
    return cid.raw


class Library:
    """Reads and folds the library's tables. Holds no view: every read names the one it reads."""

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

    # --- reading -----------------------------------------------------------------------------

    def meta(self, view: ReadView, cid_raw: bytes, cached: bool = True) -> OpMeta:
        """An operation's clock, kind, parents and targets. From the cache, which the writer fills as it folds,
        unless `cached` is False: then only if `view` holds the operation (for a CID from outside the view)."""
        found = self._meta.get(cid_raw) if cached else None
        if found is None:
            raw = view.get(opmeta_key(cid_raw))
            if raw is None:
                raise KeyError(f"no operation {CID(cid_raw)}")
            found = OpMeta.decode_plain(raw)
            if len(self._meta) >= _META_CACHE_LIMIT:
                self._meta.clear()
            self._meta[cid_raw] = found
        clock, kind, parents, targets = found
        return OpMeta(clock, _KINDS[kind], parents, targets)

    @staticmethod
    def record(view: ReadView, exp_id: bytes) -> ExperienceRecord | None:
        raw = view.get(experience_key(exp_id))
        return ExperienceRecord.unpack(raw, _listed_in(view)) if raw is not None else None

    @staticmethod
    def status(view: ReadView, cid_raw: bytes) -> OpStatus | None:
        """The stored verdict of a folded operation (superseded modifies still read 'applied' here)."""
        raw = view.get(status_key(cid_raw))
        return OpStatus.unpack(raw) if raw is not None else None

    def content(self, view: ReadView, op_cid: bytes, folding: dict[bytes, Operation] | None = None) -> Experience:
        """The experience an add, modify or merge carries (operations being folded come from memory)."""
        op = (folding or {}).get(op_cid)
        if op is None:
            block = self._blocks.get(op_cid)
            if block is None:
                block = view.block(op_cid)
                if block is None:
                    raise KeyError(f"no operation {CID(op_cid)}")
                if len(self._blocks) >= _CONTENT_CACHE_LIMIT:
                    self._blocks.clear()
                self._blocks[op_cid] = block
            op = load_stored(block)
        assert op.content is not None
        return op.content

    def _vector(self, view: ReadView, add: bytes) -> bytes:
        """An add's float16 embedding, from its operation. The fold reads one rarely (112 times in 10,000 operations
        after 1M: most hash buckets are empty), where keeping every add's vector in a table of its own was 8% of
        the bytes written, which LevelDB's compaction writes again and again."""
        return self.content(view, add).embedding.values

    def resolve(self, view: ReadView, exp_id: bytes) -> bytes:
        """Follow aliases (merged or absorbed experiences) to the experience that stands for them."""
        record = self.record(view, exp_id)
        while record is not None and record.status is Life.ALIAS:
            assert record.alias_of is not None
            exp_id = record.alias_of.raw
            record = self.record(view, exp_id)
        return exp_id

    @staticmethod
    def experiences(view: ReadView, start: bytes | None = None) -> Iterator[ExperienceRecord]:
        """Every experience record in id order (from id `start` on)."""
        listed = _listed_in(view)
        for _, raw in view.scan(EXPERIENCE, experience_key(start) if start else None):
            yield ExperienceRecord.unpack(raw, listed)

    @staticmethod
    def in_domain(view: ReadView, domain: str, *, subdomains: bool) -> Iterator[bytes]:
        """Ids of live experiences in exactly `domain` or (subdomains) under it."""
        for key, _ in view.scan(by_domain_prefix(domain, subdomains=subdomains)):
            yield parse_by_domain_key(key)

    @staticmethod
    def naming(view: ReadView, target: bytes) -> Iterator[bytes]:
        """Applied operations naming `target`, in fold order."""
        for order in sorted(parse_by_target_key(key)[1] for key, _ in view.scan(by_target_prefix(target))):
            yield order_cid(order)

    @staticmethod
    def applied_in_order(view: ReadView) -> Iterator[bytes]:
        for key, _ in view.scan(ORDER):
            yield order_cid(parse_ordered_key(key))

    @staticmethod
    def votes(view: ReadView, exp_id: bytes) -> dict[str, Vote]:
        """Each author's latest vote naming an experience (what counts is tallied on the experience it resolves to)."""
        return {parse_votes_key(key)[1]: Vote.unpack(raw) for key, raw in view.scan(votes_prefix(exp_id))}

    def snapshot(self, view: ReadView) -> bytes:
        """Every experience record (and list kept outside one), operation status and vote: equal bytes, equal
        library."""
        return codec.encode(
            {
                "experiences": [raw for _, raw in view.scan(EXPERIENCE)],
                "listed": [key for key, _ in view.scan(LISTED)],
                "statuses": [[CID(cid_of_key(key)), raw] for key, raw in view.scan(STATUS)],
                "votes": [[key, raw] for key, raw in view.scan(VOTES)],
                "counted": [[key, raw] for key, raw in view.scan(COUNTED)],
            }
        )

    def is_ancestor(self, view: ReadView, ancestor: bytes, descendant: bytes) -> bool:
        """Whether `ancestor` is an ancestor of `descendant` (§7.2)."""
        return ancestor in self.ancestors_among(view, [ancestor], descendant)

    def ancestors_among(self, view: ReadView, candidates: list[bytes], descendant: bytes) -> set[bytes]:
        """Which `candidates` are ancestors of `descendant` (§7.2): more than the causal horizon below its
        clock, or reachable through parent links, walking only through operations whose clock exceeds the
        candidate's.

        So a walk covers at most `causal_horizon` clock levels. Without the horizon, answering "no" visited
        every ancestor of `descendant` above the candidate: in a 200k workload directory, a modify made by
        this node of a source of a merge 59,700 levels older read 268,000 metadata records (2.3 s). Direct
        parents cost one lookup. A head has no children, so it is no one's ancestor: one lookup instead of
        a walk (the heads include the operations being folded: the ingest path moves them first).
        """
        meta = self.meta(view, descendant)
        found = set(candidates).intersection(meta.parents)
        for candidate in set(candidates) - found:
            floor = self.meta(view, candidate).clock
            if meta.clock - floor > self._params.causal_horizon:
                found.add(candidate)
                continue
            if view.get(head_key(floor, candidate)) is not None:
                continue
            stack = list(meta.parents)
            seen: set[bytes] = set()
            while stack:
                parent = stack.pop()
                if parent == candidate:
                    found.add(candidate)
                    break
                if parent in seen:
                    continue
                seen.add(parent)
                parent_meta = self.meta(view, parent)
                if parent_meta.clock > floor:
                    stack.extend(parent_meta.parents)
        return found

    def clock_void(self, view: ReadView, meta: OpMeta) -> OpStatus | None:
        """The void status of an operation whose clock does not exceed its parents' or targets' (§7.4)."""
        if any(self.meta(view, parent).clock >= meta.clock for parent in meta.parents):
            return OpStatus.void("clock.parent", "its clock does not exceed every parent's")
        if any(self.meta(view, target).clock >= meta.clock for target in meta.targets):
            return OpStatus.void("clock.target", "its clock does not exceed its target's")
        return None

    # --- writing (the writer only) -------------------------------------------------------------

    @staticmethod
    def drop_bucket_marks(store: Store) -> None:
        """Delete the bucket marks a data directory written before they moved into the key filter holds (I).

        Deleted in chunks (`_delete_table`), then compacted away: until then every open would seek over their
        tombstones. An interrupted drop goes on at the next open.
        """
        dropped = _delete_table(store, BUCKET_MARK, "bucket marks")
        if not dropped and store.get(BUCKETS_MARKED) is None:
            return
        store.write({BUCKETS_MARKED: None})
        store.compact(BUCKET_MARK)
        log.info("%s: dropped %d bucket marks: the key filter holds them", store.path, dropped)

    @staticmethod
    def drop_vectors(store: Store) -> None:
        """Delete the vectors of adds (F) a data directory written before the fold read them from the operations
        holds, in chunks (`_delete_table`), then compact them away; an interrupted drop goes on at the next open."""
        dropped = _delete_table(store, VECTOR, "vectors of adds")
        if dropped:
            store.compact(VECTOR)
            log.info("%s: dropped %d vectors of adds: the fold reads them from the operations", store.path, dropped)

    @staticmethod
    def list_outside(store: Store) -> None:
        """Move the long lists of records written before the U table held them there, once per data directory (at
        open; the bytes of such a record change, nothing it says does).

        Records are rewritten with their U keys in synced chunks, and the directory is marked done after the last;
        an interrupted move goes on at the next open (a record moved already packs as it is stored).
        """
        if store.get(LISTS_OUTSIDE) is not None:
            return
        moved, writes = 0, {}
        listed = _listed_in(store)
        for key, raw in store.scan(EXPERIENCE):
            if len(raw) <= INLINE_LIST * CID_LENGTH:  # too short to hold a list longer than a record keeps itself
                continue
            record = ExperienceRecord.unpack(raw, listed)
            if (packed := record.pack()) == raw:
                continue
            writes[key] = packed
            writes.update((listed_key(record.id.raw, entry), b"") for entry in record.outside())
            moved += 1
            if len(writes) >= _MOVE_CHUNK:
                store.write(writes)
                writes = {}
                log.info("%s: moved the long lists of %d records into their own table", store.path, moved)
        store.write({**writes, LISTS_OUTSIDE: b""})
        if moved:
            log.info("%s: the long lists of %d records are in their own table", store.path, moved)

    @staticmethod
    def clear(store: Store) -> None:
        """Delete every table the fold writes but the canonical order of the applied operations (a rebuild folds
        them again from nothing, in that order, and the fold writes the same keys there), in synced chunks
        (`_delete_table`): one transaction held the whole library (9.55 GB at 1M operations)."""
        cleared = sum(_delete_table(store, table, "keys of the library") for table in _CLEARED)
        store.write({LAST_ADD: None})
        log.info("%s: cleared the library (%d keys)", store.path, cleared)

    @staticmethod
    def compact(store: Store) -> None:
        """Compact the tables `clear` emptied: their deleted keys go (once no snapshot taken before lives), which
        every scan of the fold would seek over (18 ms per bucket scan at 1M)."""
        for table in _CLEARED:
            store.compact(table)
        log.info("%s: compacted the cleared library", store.path)

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

    # --- components (§7.5) -------------------------------------------------------------------------

    def _place(self, work: _Work, cid: bytes, op: Operation, meta: OpMeta, order: bytes) -> None:
        """Put an operation into its component (joining the components it links), or record it void."""
        txn = work.records.txn
        components = [txn.get(component_key(target)) for target in meta.targets]
        for target, found in zip(meta.targets, components, strict=True):
            # only a placed add or merge has a component: one void by its clock created no experience, and like a
            # vote or a modify as target, the operation is void wherever it sorts
            if found is None:
                txn.put(status_key(cid), _not_experience(target).pack())
                return
        if op.kind in _CREATES:
            component = cid
            txn.put(component_key(cid), cid)
            txn.put(member_key(cid, cid), b"")
            txn.put(component_size_key(cid), u64(1))
        else:
            found = components[0]
            assert found is not None, "checked above"
            component = found
        txn.put(component_op_key(component, order), _KIND_BYTE[op.kind])
        work.new.add(order)
        work.placed.setdefault(component, []).append(order)
        if op.kind in (Kind.DELETE, Kind.MODIFY):
            # a merge of the target is void if this operation is concurrent with it, wherever it sorts (§7.4); one
            # that is void already stays void, so only its verdict is read again (not its component folded)
            for merge, voided in self._concurrent_merges(txn, meta.targets[0], cid):
                if voided:
                    work.reworded.add(merge)
                else:
                    work.voids_merge.setdefault(order, []).append(merge)
        links = list(meta.targets) if op.kind is Kind.MERGE else []
        if op.kind is Kind.ADD:
            assert op.content is not None
            into, taken = self._absorption(txn, cid, order, op.content.embedding.values, work.bands.of(cid))
            links = ([into] if into is not None else []) + [other for other, _ in taken]
            if taken:
                work.takes_over[cid] = taken
        for other in links:
            found = txn.get(component_key(other))
            assert found is not None
            component = self._join(work, component, found)

    def _absorption(
        self, txn: Transaction, cid: bytes, order: bytes, values: bytes, bands: list[bytes]
    ) -> tuple[bytes | None, list[tuple[bytes, bytes | None]]]:
        """Index a new add by its hash bands, find the earliest earlier add it nearly duplicates at most the
        absorption horizon below it, and the later adds whose earliest it now is (§7.6); returns the first (None
        if none) and the second, whose components it joins, each with its earliest before (None if none).

        A bucket is kept in the order of its adds' anchors (`bucket_key`: the clock of an add's F when it was
        indexed, then its own order). An add sorts no earlier than its anchor, so finding the earliest earlier
        one stops at the first key past the best found: for a copy in a cluster, the cluster's first add in its
        window. An anchor is at most the horizon below its add, so the search starts two horizons below. A
        late add may take over only adds whose F sorts after it (or that have none) and that lie at most the
        horizon above it, whose anchors lie between the two clocks, so it reads that range of its buckets: a
        late copy reads the copies of its window, not every copy of the insight (~158,000 keys in the 1M
        workload's largest cluster, a 283 ms read for one signature, without the horizon). F only moves
        earlier, so an anchor stays where a takeover leaves it.

        Most buckets are empty: the key filter holds a mark per non-empty bucket and answers for all 32 at
        once, where opening an iterator seeks every level of the database (80% of the writer's scans; their
        cost grew with the database). A bucket it may hold (all of them while it is rebuilt) is read.
        """
        threshold = self._threshold
        verdicts: dict[bytes, bool] = {}

        def near(other: bytes) -> bool:
            if other not in verdicts:
                verdicts[other] = exact_cosine_exceeds(values, self._vector(txn, order_cid(other)), threshold)
            return verdicts[other]

        earliest: bytes | None = None
        bound = order  # F sorts before this add and before the earliest near-duplicate found so far
        clock = read_u64(order[:8])
        lowest = u64(max(clock - self._horizon, 0))  # F's clock is no lower than this (orders start with the clock)
        lowest_anchor = u64(max(clock - 2 * self._horizon, 0))
        highest = u64(clock + self._horizon + 1)  # an add this one may take over sorts before this
        following: set[bytes] = set()  # the adds after this one in its buckets that it may take over
        last = txn.get(LAST_ADD)
        late = last is not None and last > order  # some add sorts after this one: it may absorb them
        if not late:
            txn.put(LAST_ADD, order)
        marks = [bucket_mark_key(band) for band in bands]
        used = [band for band, maybe in zip(bands, txn.mark(marks), strict=True) if maybe]
        for band in used:  # an empty bucket (most are) has nothing to test
            limit = bucket_key(band, bound, bound)
            for key, _ in txn.scan(bucket_prefix(band), bucket_prefix(band) + lowest_anchor):
                if key >= limit:  # an add's anchor sorts before it: every add from here on sorts after `bound`
                    break
                other = parse_bucket_key(key, band)
                if lowest <= other < bound and near(other):
                    earliest = bound = other
                    limit = bucket_key(band, bound, bound)
        if late:
            for band in used:  # the adds of a cluster of copies share most buckets: each is looked at once
                start = bucket_key(band, order, order)
                anchored = len(start) - len(order)  # parse_bucket_key, inlined
                # before this add's own keys are in the transaction: merging them in sorted every bucket's keys
                keys = txn.keys(bucket_prefix(band), start, bucket_prefix(band) + highest)
                following.update(other for key in keys if (other := key[anchored:]) < highest)
        for band in bands:
            txn.put(bucket_key(band, order, earliest or order), b"")
        into = order_cid(earliest) if earliest is not None else None
        if into is not None:
            txn.put(absorbs_key(cid), into)
        following.discard(order)
        # whether its F sorts before this add first: one that a late add took over since it was indexed does (its
        # anchor is where its F was), and needs no exact test
        candidates = []
        for other in sorted(following):
            current = txn.get(absorbs_key(order_cid(other)))
            if current is None or self._order(txn, current) > order:
                candidates.append((other, current))
        untested = [other for other, _ in candidates if other not in verdicts]
        tested = exact_cosines_exceed(values, [self._vector(txn, order_cid(other)) for other in untested], threshold)
        verdicts.update(zip(untested, tested, strict=True))
        taken = []
        for other, current in candidates:
            if verdicts.get(other, False):
                txn.put(absorbs_key(order_cid(other)), cid)  # this add now sorts first among its near-duplicates
                taken.append((order_cid(other), current))
        return into, taken

    def _join(self, work: _Work, a: bytes, b: bytes) -> bytes:
        """Join two components (the smaller moves into the larger); returns the joined one's id."""
        if a == b:
            return a
        txn = work.records.txn
        sizes = {c: read_u64(txn.get(component_size_key(c))) for c in (a, b)}
        keep, move = (a, b) if sizes[a] >= sizes[b] else (b, a)
        for key, _ in list(txn.scan(member_prefix(move))):
            exp_id = parse_member_key(key)
            txn.delete(key)
            txn.put(member_key(keep, exp_id), b"")
            txn.put(component_key(exp_id), keep)
        for key, kind in list(txn.scan(component_op_prefix(move))):
            txn.delete(key)
            txn.put(component_op_key(keep, parse_component_op_key(key)), kind)
        txn.put(component_size_key(keep), u64(sizes[a] + sizes[b]))
        txn.delete(component_size_key(move))
        # both halves were folded apart, which is right for all their operations before the first new one
        work.placed[keep] = work.placed.pop(move, []) + work.placed.get(keep, [])
        return keep

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

    @staticmethod
    def _late(txn: Transaction, component: bytes, placed: list[bytes], new: set[bytes]) -> list[bytes]:
        """The component's new operations that an old one sorts after, in canonical order (`placed`: all its
        new ones). Reads its operations from the first new one up to the first old one after the last."""
        last_old = None
        for key, _ in txn.scan(component_op_prefix(component), component_op_key(component, placed[0])):
            order = parse_component_op_key(key)
            if order not in new:
                last_old = order
                if order > placed[-1]:
                    break
        return [order for order in placed if last_old is not None and order < last_old]

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
        them where the operation sorts. Nothing else read their records, and the sources of the chain's merges are
        as they were where each became an alias (everything after that named them acted on the chain): they stand
        for themselves again and the chain's records go. A rewound root's modifies, deletes and absorbed adds after
        `start` are taken out of its record (`_rewind`) and folded again with what named its experiences since.
        Folding those operations again in canonical order gives the records of the definition. A merge folded
        again that may apply joins the set, so what named it is folded again too. One void for a reason other than
        concurrency may apply and take the experiences it names outside, which no delete before it deleted: each
        joins the set where that merge sorts and is rewound to there (`_rewind`: what acted on it since is folded
        again after the merge), and a merge that took one since is taken back with its chain (`_take_chain`).
        An add that a late add of the batch sorting after `now` (the operation being folded) took over, not
        folded yet, names its F before (`_fold_again` folds it there). A new operation not folded yet is folded
        after this, where it sorts (`_fold_in_place`).
        """
        records, txn = work.records, work.records.txn
        # the adds a late add of the batch not folded yet took over: their F names it already, and their F before
        # is what they stand for until it is folded
        pending = self._taken_over_after(work, now)
        taken: set[bytes] = set()
        chains: list[bytes] = []
        # where each experience resolving to a chain's end joined the chain (an operation after that which names
        # it acted on the chain): the first merge's tree where it sorts, each other source's where its merge sorts;
        # a rewound root's tree where `start` sorts
        joined: dict[bytes, bytes] = {}
        for bottom in bottoms:
            self._take_chain(records, bottom, taken, chains, joined)
        if first is not None:
            taken.add(first)
        tree: list[bytes] = []
        for root in sorted({records.resolved(exp_id) for exp_id in [*bottoms, *rewound]} - {None}):
            tree.extend(_tree(records, root))  # type: ignore[arg-type]
        in_tree = set(tree)
        for root in rewound:
            joined.update(dict.fromkeys(_tree(records, root), start))
        replay, released = [], []
        applied = OpStatus.applied
        add_byte, merge_byte = _KIND_BYTE[Kind.ADD], _KIND_BYTE[Kind.MERGE]
        following = _Following(txn, component, start, lambda exp_id: self._order(txn, exp_id))
        following.include({*tree, *taken, *joined}, start)
        # most of a large component's operations after `start` name nothing of the set: which do is read first (the
        # kind, an add's F, cached targets), their verdicts only for those that do
        for later, kind in following:
            cid = order_cid(later)
            kind = kind or _KIND_BYTE[self.meta(txn, cid).kind]  # a list written before it held kinds
            if kind == add_byte:
                named = [f for f in [_f_before(txn, cid, pending)] if f]
            else:
                named = self.meta(txn, cid).targets
            inside = [target in taken or joined.get(target, _LAST_ORDER) < later for target in named]
            if not any(inside):
                continue
            status = txn.get(status_key(cid))
            if status is None:
                continue
            # a merge void by a concurrent modify or delete stays void (§7.4 reads the whole set for that), as does
            # one naming, outside the set, no experience or one deleted before it; another void one may apply: it
            # would take what it names outside, whose records hold what acted on them since. One that may apply
            # joins the set: what names it may act again.
            if kind == merge_byte and OpStatus.unpack(status).code not in _CONCURRENTLY_VOID:
                outside = [
                    records.record(self._resolved_at(records, target, later))
                    for target, within in zip(named, inside, strict=True)
                    if not within
                ]
                if status == applied(cid).pack() or not outside:
                    taken.add(cid)
                elif not any(out is None or self._first_delete(txn, out) < later for out in outside):
                    for out in outside:
                        members = _tree(records, out.id.raw)
                        joined.update(dict.fromkeys(members, later))
                        if out.alias_of is not None:  # a merge after this one took it: taken back with its chain
                            self._take_chain(records, out.alias_of.raw, taken, chains, joined)
                            end = records.resolved(out.id.raw)
                            assert end is not None
                            if end not in in_tree:  # a chain of its own: its end's tree is counted again too
                                members = _tree(records, end)
                        tree.extend(member for member in members if member not in in_tree)
                        in_tree.update(members)
                        released.append((out.id.raw, later))
                        following.include(members, later)
                    taken.add(cid)
                if cid in taken:
                    following.include([cid], later)
                if cid not in in_tree:  # the votes naming one that applies now count there (`_tally`)
                    tree.append(cid)
            replay.append(later)
        for link in chains:
            record = records.record(link)
            assert record is not None
            for source_id in record.absorbed:
                source = records.record(source_id.raw) if source_id.raw not in taken else None
                if source is not None and source.alias_of == record.id:
                    source.status, source.alias_of = Life.LIVE, None  # a source was a live root (§7.4)
                    records.put(source)
            records.drop(link)
        for root in rewound:
            self._rewind(records, component, root, start)
        for exp_id, order in released:
            self._rewind(records, component, exp_id, order)
        return tree, replay

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

    @staticmethod
    def _absorb_again(records: _Records, cid: bytes, into: bytes) -> OpStatus | None:
        """`_add`'s verdict for an add absorbed into `into` whose record is that alias already (as `_alias` writes it:
        no heads, absorbed adds, deletes or counts, its own version); None if its record is another."""
        if not _written_by_alias(records.record(cid), cid, into):
            return None
        return _list_absorbed(records, cid, into)

    def _undo(self, records: _Records, merge: bytes) -> None:
        """Undo an applied merge that nothing but votes acted on: its record goes, its sources stand for themselves,
        and the void merges naming it, folded already, are void as merges of no experience (§7.4 reads that first)."""
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

    def _delete_merged_in_place(self, work: _Work, component: bytes, record: ExperienceRecord, order: bytes) -> None:
        """Fold a late delete of E (`record`), which a merge after it took, where it sorts.

        The merge is void now (`merge.target_deleted`): it is undone as a concurrent delete undoes one
        (`_undo_merges`), the delete deletes E where it sorts, and what acted on the merge since is folded again.
        Its votes become void, and the votes of its tree count where its members resolve now (`_tally`). Any peer
        can sign a delete of an add absorbed into an experience a merge took, with a clock just above the add's,
        which folded the component again.
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
        just above theirs."""
        records, txn = work.records, work.records.txn
        rewound = sorted({self._resolved_at(records, target, order) for target in self.meta(txn, cid).targets})
        stood = [records.record(exp_id) for exp_id in rewound]
        if any(record is not None and self._first_delete(txn, record) < order for record in stood):
            txn.put(status_key(cid), _target_deleted().pack())
            return []
        return self._fold_rewinding(work, component, cid, op, order, rewound, now)

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

    def _take_over_in_place(self, work: _Work, component: bytes, cid: bytes, op: Operation, order: bytes) -> bool:
        """Fold a late add that is now first among adds after it (a takeover, §7.6) where it sorts; False if it
        would join an experience a merge took along with another or into one a merge took, or take adds that a
        merge names out of theirs, or move a delete where a merge's verdict could change (then what it touches is
        rewound to where it sorts: `_take_over_unfolding`).

        The adds it takes over fall into groups by the end of their chain of earliest adds before it. One group
        keeps its experience: the one its F's chain ends in (it is absorbed: `_repoint_within`), or else the
        largest experience whose first add it takes over, which it renames (`_rename`). Every other group moves
        into what the new add stands for: a whole experience whose first it takes over (`_absorb_experience`: a
        join, its deletes with it; a merge that took it is taken back first, `_unfold_joined`), or else the adds
        whose chains pass through the adds taken over (`_split_off`: they leave their experience; the deletes
        naming them go with them, `_undelete` and `_delete_in_place`, and the modifies naming them are folded
        again, `_move_modifies`; the applied merge naming them is taken back first, `_unfold_joined`, and the void
        ones that may apply now are folded again after, `_refold_void_merges`). Each costs what it moves, not the
        component: one peer could sign a copy near the first adds of two experiences, or near an add but not its
        first, and make a node fold the 1M workload's largest component again (1.8-2.6 s) for each; with a delete
        of an add that moves signed first, until deletes moved with them; out of the deleted experience of adds
        that void merges name, until those merges were folded again alone (0.93-0.97 s at 1M, 16-22 ms since).
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
        deletable = host is None or host.status is not Life.ALIAS
        joined, split, merged = [], [], []
        unfolding: list[tuple[bytes, list[bytes]]] = []  # (applied merge naming adds that leave, those adds)
        refolding: list[bytes] = []  # void merges naming adds that leave, which may apply after the split
        for end in sorted(groups.keys() - {kept}):
            if end in taken:  # its first: the whole experience moves
                record = records.record(end)
                assert record is not None
                if (record.status is Life.ALIAS or record.status is Life.DELETED) and not deletable:
                    return False
                if record.alias_of is not None:  # a merge took it: taken back, and folded again (below)
                    merged.append(record.alias_of.raw)
                joined.append(end)
                continue
            carried = self._carried_through(work, earlier, groups[end])
            naming = [parse_by_target_key(key) for add in carried for key, _ in txn.scan(by_target_prefix(add))]
            named = [order for kind, order in naming if kind == _KIND_BYTE[Kind.DELETE]]
            deletes = self._deletes_leaving(txn, end, named)
            if deletes is None or (deletes and not deletable):
                return False
            modifies = sorted(order for kind, order in naming if kind == _KIND_BYTE[Kind.MODIFY])
            # a merge naming an add that leaves takes what the new add stands for where the merge sorts: one void
            # must stay void (deleted then: the deletes going with the adds, or the host's own); the first applied
            # one is taken back with its chain and folded again after the split (`_unfold_joined`), with what
            # acted on its chain since, which the split must then leave alone (no delete of the adds that leave,
            # their modifies before it)
            merges = [order for kind, order in naming if kind == _KIND_BYTE[Kind.MERGE]]
            applied = [merge for merge in merges if self._is_applied(txn, merge)]
            again_from = min(applied, default=_LAST_ORDER)
            if applied and (deletes or any(modify > again_from for modify in modifies)):
                return False
            gone = min([*deletes, *([self._first_delete(txn, host)] if host is not None and deletable else [])],
                       default=_LAST_ORDER)  # fmt: skip
            # a void one that may apply now (its experience was deleted before it, what the add moves to is not)
            # is folded again after the split, where it sorts (`_refold_void_merges`)
            refolding.extend(merge for merge in merges if merge < again_from and not self._stays_void(txn, merge, gone))
            if applied:
                unfolding.append((order_cid(again_from), carried))
            rest = self._staying_modifies(records, end, set(carried), deletes) if deletes else ([], [])
            if rest is None:
                return False
            staying, void_merges = rest
            refolding.extend(void_merges)
            voted = any(kind == _KIND_BYTE[Kind.VOTE] for kind, _ in naming)
            split.append((end, carried, modifies, voted, deletes, staying))
        if refolding and unfolding:  # with an applied one
            return False
        replay = None
        if merged:  # only a join of one merged experience alone, below
            if split or len(joined) > 1:
                return False
            replay = self._unfold_joined(work, component, merged[0], list(taken), host_id, order)
            if replay is None:
                return False
        elif unfolding:  # only a split alone, into what no merge took
            if len(split) > 1 or joined or not deletable:
                return False
            # every add it takes over: one sorting after the merge would be folded again naming it, not found
            merge, carried = unfolding[0]
            replay = self._unfold_joined(work, component, merge, [*taken, *carried], host_id, order)
            if replay is None:
                return False
        if into is not None:
            self._repoint_within(work, cid, op, order, {add: taken[add] for add in groups.get(ends[into], [])})
        elif kept is not None:
            self._rename(work, component, cid, op, kept, {add: taken[add] for add in groups[kept]})
        else:
            records.put(_new_record(cid, op, support=1))
            txn.put(status_key(cid), OpStatus.applied(cid).pack())
        for end in joined:
            self._absorb_experience(work, component, cid, end, {add: taken[add] for add in groups[end]})
        for end, carried, modifies, voted, deletes, staying in split:
            self._split_off(work, cid, end, {add: taken[add] for add in groups[end]}, carried, voted)
            if deletes:
                self._undelete(records, end, deletes, staying)
                stands = records.resolved(cid)
                assert stands is not None
                self._delete_in_place(records, component, stands, deletes)
            self._move_modifies(work, component, modifies)
        if replay is not None:
            self._fold_again(work, replay, order)
        self._refold_void_merges(work, component, refolding, order)
        return True

    def _take_over_unfolding(self, work: _Work, component: bytes, cid: bytes, op: Operation, order: bytes) -> None:
        """Fold a late add that takes adds over where it sorts when `_take_over_in_place` cannot move them alone:
        what its F and each add it takes over resolved to there is rewound to that point, with what acted on it
        since and the merges that took it since (`_unfold`), the add is folded there, and what was taken back is
        folded again after it (the adds taken over name it as F already, so they join what it stands for). It
        costs the operations of the experiences it touches, not its component's: one peer could sign a copy near
        adds that an applied merge and a delete name, or near the first adds of experiences merges took, and make
        a node fold the 1M workload's largest component again (1.8-2.6 s)."""
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
        again and again, folded the 1M workload's largest component again: 1.4-2.0 s for 9,636 operations."""
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

    def _merge_stops(self, records: _Records, start: bytes) -> tuple[list[tuple[bytes, bytes]], bytes]:
        """The records on `start`'s chain of aliases that are aliases of merges, each with that merge's order,
        and the chain's end: where an operation sorting at `order` resolves `start` (`_resolved_at`) is the first
        of them whose merge sorts after it, or the end."""
        stops, exp_id = [], start
        record = records.record(exp_id)
        while record is not None and record.status is Life.ALIAS:
            assert record.alias_of is not None
            link = record.alias_of.raw
            if self.meta(records.txn, link).kind is Kind.MERGE:
                stops.append((exp_id, self._order(records.txn, link)))
            exp_id, record = link, records.record(link)
        return stops, exp_id

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

    def _resolved_at(self, records: _Records, exp_id: bytes, order: bytes) -> bytes:
        """What `exp_id` resolved to where `order` sorts: aliases made by merges that sort after it were not
        made yet (an absorbed add's alias is made where the add sorts, before anything naming it)."""
        record = records.record(exp_id)
        while record is not None and record.status is Life.ALIAS:
            assert record.alias_of is not None
            link = record.alias_of.raw
            if self.meta(records.txn, link).kind is Kind.MERGE and self._order(records.txn, link) > order:
                break
            exp_id, record = link, records.record(link)
        return exp_id

    def _order(self, view: ReadView, cid: bytes) -> bytes:
        return order_key(self.meta(view, cid).clock, cid)

    def _first_delete(self, view: ReadView, record: ExperienceRecord) -> bytes:
        """Where the record's first delete sorts (after every order if it has none): its modifies after it are void."""
        return min((self._order(view, delete.raw) for delete in record.deleted_by), default=_LAST_ORDER)

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
        concurrency rules come first in §7.4 and name the first such operation, which may now be another."""
        records = work.records
        for merge in sorted(work.reworded):
            cid = order_cid(merge)
            raw = records.txn.get(status_key(cid))
            assert raw is not None
            if OpStatus.unpack(raw).code in _REWORDABLE:
                status = self._concurrently_voided(records, cid, self.meta(records.txn, cid))
                assert status is not None, "a new operation is concurrent with it"
                records.txn.put(status_key(cid), status.pack())

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
        if _READ_BY_NAME * record.support < read_u64(txn.get(component_size_key(component))):
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

    @staticmethod
    def _keep_counts(records: _Records, exp_ids: list[bytes]) -> None:
        """Give records folded again the vote counts they had: the same members resolve to them."""
        for exp_id in exp_ids:
            before, now = records.before[exp_id], records.edit(exp_id)
            if before is not None and now is not None and (before.up, before.down) != (now.up, now.down):
                now.up, now.down = before.up, before.down
                records.put(now)

    @staticmethod
    def _members(txn: Transaction, component: bytes) -> list[bytes]:
        return [parse_member_key(key) for key, _ in txn.scan(member_prefix(component))]

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

    # --- votes (§7.7) ----------------------------------------------------------------------------

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

    # --- the rules (docs/PROTOCOL.md §7.4) ------------------------------------------------------------

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
        delete, modify = _KIND_BYTE[Kind.DELETE], _KIND_BYTE[Kind.MODIFY]
        for kind in (delete, modify):
            found = [first for target in meta.targets if (first := self._first_concurrent(records, cid, target, kind))]
            if not found:
                continue
            other = order_cid(min(found))
            if kind == delete:
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


def _delete_table(store: Store, prefix: bytes, what: str) -> int:
    """Delete every key under `prefix` in synced chunks read from one iterator (its snapshot does not see the
    deletions), logging progress; returns how many: one write of millions of keys holds them all in memory."""
    deleted, chunk = 0, {}
    for key, _ in store.scan(prefix):
        chunk[key] = None
        if len(chunk) == _DROP_CHUNK:
            store.write(chunk)
            deleted, chunk = deleted + len(chunk), {}
            log.info("%s: deleted %d %s", store.path, deleted, what)
    if chunk:
        store.write(chunk)
    return deleted + len(chunk)


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


def _support(records: _Records, exp_id: bytes) -> tuple[int, bytes]:
    """The experience's support, then its id: the largest experience a takeover joins keeps its record."""
    record = records.record(exp_id)
    assert record is not None
    return record.support, exp_id


def _stands_for(record: ExperienceRecord | None) -> tuple[bool, CID | None]:
    """What decides where an experience's votes count: whether it exists, and what it is an alias of."""
    return (record is not None, record.alias_of if record is not None else None)


def _tree(records: _Records, root: bytes) -> list[bytes]:
    """The experiences that resolve to `root`: it and, transitively, those its record lists as absorbed (a merge
    lists its sources, a root the adds absorbed while it stood for them; each takes its own list along)."""
    tree, stack = [], [root]
    while stack:
        exp_id = stack.pop()
        tree.append(exp_id)
        record = records.record(exp_id)
        assert record is not None
        stack.extend(absorbed.raw for absorbed in record.absorbed)
    return tree


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


def _target_deleted() -> OpStatus:
    return OpStatus.void("merge.target_deleted", "a source was deleted before the merge")


def _superseded_by_delete() -> OpStatus:
    return OpStatus.void("superseded.deleted", "its experience was deleted (delete beats modify)")


def _not_experience(target: bytes) -> OpStatus:
    return OpStatus.void("target.not_experience", f"target {CID(target)} did not create an experience")


def _alias(cid: bytes, op: Operation, into: bytes) -> ExperienceRecord:
    """The record of an add absorbed into the add `into`."""
    record = _new_record(cid, op, support=1)
    record.status, record.alias_of = Life.ALIAS, CID(into)
    return record


def _list_absorbed(records: _Records, cid: bytes, into: bytes) -> OpStatus:
    """List an add absorbed into `into` in what that resolves to now, which gains one supporter; its verdict."""
    root = records.resolved(into)
    stands = records.edit(root) if root is not None else None
    assert stands is not None, "an earlier add in the component has been folded"
    stands.support += 1
    _insert_cid(stands.absorbed, cid)
    records.put(stands)
    return OpStatus(Outcome.ABSORBED, into=CID(into))


def _written_by_alias(record: ExperienceRecord | None, cid: bytes, into: bytes) -> bool:
    """Whether an add's record is what `_alias(cid, op, into)` writes (its author, clock and domain are the add's)."""
    return (
        record is not None
        and record.status is Life.ALIAS
        and record.alias_of == CID(into)
        and (record.version.raw, record.support, record.up, record.down) == (cid, 1, 0, 0)
        and not (record.heads or record.absorbed or record.deleted_by)
    )


def _new_record(cid: bytes, op: Operation, support: int) -> ExperienceRecord:
    assert op.content is not None
    return ExperienceRecord(
        id=CID(cid),
        created_by=op.author,
        clock=op.clock,
        status=Life.LIVE,
        alias_of=None,
        version=CID(cid),
        heads=[],
        domain=".".join(op.content.domain),
        support=support,
    )
