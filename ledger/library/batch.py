"""One batch's fold in progress: the records it reads and writes, the band keys of its adds, and what it changed.

Rule: a fold writes only into the batch's transaction. `_Records` writes each changed record once (`flush`),
keeping the domain index (D) and the lists kept outside records (U) in step; `Fold` tells the ledger which live
versions changed, for the vector index after the commit.
Invariant: `_Records.before` holds each record as it was before this fold touched it (the vote tally and the
index read the difference). A decoded record `_LargeRecords` keeps is used only while the stored bytes are the
ones it came from, so a failed batch or a rebuild cannot make it stale: it serves bench_ledger's ingest ratio and
last tenth at 1M (bench/RESULTS.md, "The ledger at scale"; decoding the repeated insight's 4,928 absorbed adds
cost 5-9 ms per batch).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ledger.cid import CID
from ledger.library.tables import _listed_in
from ledger.neardup import band_keys_of_many
from ledger.ops import Operation
from ledger.params import NetworkParams
from ledger.priority import NEVER
from ledger.records import ExperienceRecord, Life
from ledger.store import ReadView, Transaction
from ledger.tables import by_domain_key, experience_key, listed_key


@dataclass
class Fold:
    """What one batch's fold changed outside its transaction, for the ledger to publish after the commit."""

    operations: dict[bytes, Operation]  # the new operations being folded (not yet in the store)
    #: experiences whose live version changed: the version and its float16 embedding, or None (not live now)
    changes: dict[bytes, tuple[bytes, bytes] | None] = field(default_factory=dict)
    refolded: int = 0  # operations taken back and folded again because a late one sorted before them
    changed: bool = False  # whether any operation was folded (the library's generation moves on)


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
