"""A Bloom filter in front of the tables whose keys the writer looks up and mostly does not find.

Per operation the writer asks LevelDB for ~2.7 keys that are not there: the block of a new
operation (is it stored?), an author's vote on an experience (`Y`, `R`), a new add's experience
record (`X`) and absorption (`E`). Each
such get consults a table file on every level of the database, and LevelDB charges those reads to
the first file, which it compacts when its allowance of seeks runs out: at a million operations
the absent gets cost about a quarter of the compaction thread's CPU (windows of 60,000 operations
on copies of the 1M directory: ~770 -> ~570 us per operation; half in windows without a memtable
flush, 513-575 -> 244-268 us).

The filter answers "absent" only for a key it never saw: it has no false negatives, so every
verdict stays exact (a "maybe" still reads LevelDB). A key's bits are set before the write that
holds it (by `Transaction.put`, or `Store.write`), so no reader, on any thread, is told a committed
key is absent. 2^28 bits (32 MiB), 3 positions from a BLAKE2b digest of the key: with the 10 million
keys of a million operations of the workload ~0.12% of absent keys still cost a get.

It also holds the mark of every non-empty near-duplicate bucket (`I` band key, §7.6), which no table
stores: a new add looks up its 32 marks, and reads only the buckets that may hold an add (all of
them while the filter is being rebuilt). In a table the marks were a quarter of the database's
entries at a million operations, and 31 writes per add.

Below `_BUILD_CHUNK` keys it is an exact set of them instead: a Bloom filter's 32 MiB are zeroed by the system a
page at a time as its bits are first set, and a small ledger's few thousand keys touched thousands of pages, more
system time than its writes (a property test's hundreds of small ledgers: 13.7 -> 2.6 s of system time). The
bits are made from the set once it holds `_BUILD_CHUNK` keys.

It is derived state, like the vector index: saved beside the database at close with a stamp (the
library generation and the log size: every write to these tables changes one of them), the
owner's DID and a SHA-256 over it all (from `_BUILD_CHUNK` keys on; a smaller ledger rebuilds it at
open in a few ms). A file that is missing, damaged, another node's or of another stamp (a crash
since it was saved) is never trusted: the filter is rebuilt from the keys of a snapshot on a
background thread, and until then every key is a "maybe".
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import struct
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from ledger.neardup import BAND_KEY_SIZE
from ledger.store import Snapshot, write_file_atomically
from ledger.tables import ABSORBS, BLOCK, BUCKET, BUCKET_MARK, COUNTED, EXPERIENCE, VOTES, bucket_mark_key

log = logging.getLogger(__name__)

FILTER_FILE = "keys.filter"
#: the file of the filter this one replaced (bucket marks only); removed at open
OLD_FILTER_FILE = "buckets.filter"
#: the tables the filter covers (see above); a get of a key of any other table goes to LevelDB
STORED_TABLES = (BLOCK, VOTES, COUNTED, EXPERIENCE, ABSORBS)
#: the keys the filter holds: those of its tables, and bucket marks (kept in the filter alone)
TABLES = (*STORED_TABLES, BUCKET_MARK)
_TAGS = frozenset(table[0] for table in TABLES)
BITS_LOG2 = 28
_SHIFT = 32 - BITS_LOG2
_POSITIONS = 3
_DIGEST = struct.Struct(">3I")  # three 32-bit words of the key's digest: one bit position each
_MAGIC = b"expledger-key-filter/1"
_HEADER = struct.Struct(">32sQQQH")  # magic (padded), generation, log size, keys, owner length; then owner, bits
_DIGEST_SIZE = 32
#: keys per vectorized step of a rebuild (and per check for a stop); fewer are rebuilt at open, not saved
_BUILD_CHUNK = 65536

#: what a saved filter must match: (library generation, log size)
Stamp = tuple[int, int]


def _digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=_DIGEST.size).digest()


def _positions(keys: Sequence[bytes]) -> np.ndarray:
    """Each key's bit positions, one row per key."""
    words = np.frombuffer(b"".join(map(_digest, keys)), dtype=">u4").astype(np.uint32)
    return (words >> np.uint32(_SHIFT)).reshape(len(keys), _POSITIONS)


def _set_all(bits: np.ndarray, keys: Sequence[bytes]) -> None:
    """Set the positions of many keys at once (a rebuild: ~10 million keys at a million operations)."""
    if keys:
        _set(bits, _positions(keys))


def _set(bits: np.ndarray, positions: np.ndarray) -> None:
    np.bitwise_or.at(bits, positions >> np.uint32(3), (np.uint8(1) << (positions & np.uint32(7)).astype(np.uint8)))


def _all_set(bits: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Per row of positions, whether every one of its bits is set."""
    return (((bits[positions >> np.uint32(3)] >> (positions & np.uint32(7)).astype(np.uint8)) & 1) == 1).all(axis=1)


def covered_keys(snapshot: Snapshot) -> Iterator[bytes]:
    """Every key the filter holds, from a snapshot: the keys of its tables, and a mark per non-empty bucket."""
    for table in STORED_TABLES:
        yield from snapshot.keys(table)
    previous = None
    for key in snapshot.keys(BUCKET):
        mark = bucket_mark_key(key[1 : 1 + BAND_KEY_SIZE])
        if mark != previous:  # a bucket's entries are adjacent
            yield mark
            previous = mark


def _chunks(keys: Iterable[bytes]) -> Iterator[list[bytes]]:
    chunk: list[bytes] = []
    for key in keys:
        chunk.append(key)
        if len(chunk) == _BUILD_CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _zeroed_bits() -> np.ndarray:
    """Zeroed lazily by the system (calloc): a page costs when a bit of it is first set."""
    return np.zeros(1 << (BITS_LOG2 - 3), dtype=np.uint8)


class KeyFilter:
    """Which keys of `TABLES` may be stored. `add` is the writer's alone; `may_hold` is safe from any thread."""

    def __init__(self, directory: Path, owner: str) -> None:
        self._path = directory / FILTER_FILE
        self._old_path = directory / OLD_FILTER_FILE
        self._owner = owner
        #: while the ledger is small: exactly the keys stored (None once the bits hold them)
        self._exact: set[bytes] | None = set()
        # the bits: every key the writer stored since start-up, at least (allocated when the set is given up)
        self._bits = np.zeros(0, dtype=np.uint8)
        self._bytes = memoryview(self._bits)  # for one key at a time: indexing gives ints, far faster than numpy
        self._ready = False  # the bits also cover every key stored before start-up
        self._built: np.ndarray | None = None  # handed over by the rebuild thread
        self._builder: threading.Thread | None = None
        self._stop = threading.Event()
        # keys the bits cover (about: a key written twice, or during a rebuild, may count twice); while the exact set
        # stands its size is the count, added here when the bits take it over
        self._count = 0
        self._built_count = 0
        self._saved_stamp: Stamp | None = None  # the stamp of the file on disk, when it holds these bits

    def open(self, stamp: Stamp, keys: Iterable[bytes]) -> str:
        """Load the saved filter of this `stamp`, or rebuild it from `keys` (`covered_keys` of a snapshot taken
        by the caller after it attached the filter to the store); returns "loaded" or why it was rebuilt.
        Fewer than `_BUILD_CHUNK` keys are rebuilt at once, more on a background thread."""
        self._old_path.unlink(missing_ok=True)
        why = self._load(stamp)
        if why is None:
            return "loaded"
        chunks = _chunks(keys)
        first = next(chunks, [])
        if len(first) < _BUILD_CHUNK:
            assert self._exact is not None
            self._exact.update(first)
            self._ready = True
            self._give_up_exact_keys_if_many()
            return why
        self._give_up_exact_keys()
        log.info("rebuilding the key filter in the background (%s)", why)
        self._builder = threading.Thread(
            target=self._build, args=(itertools.chain([first], chunks),), name="ledger-key-filter", daemon=True
        )
        self._builder.start()
        return why

    def _build(self, chunks: Iterator[list[bytes]]) -> None:
        bits = _zeroed_bits()
        count = 0
        for chunk in chunks:
            if self._stop.is_set():
                return
            _set_all(bits, chunk)
            count += len(chunk)
        self._built_count = count
        self._built = bits
        log.info("key filter rebuilt from %d keys", count)

    def _give_up_exact_keys_if_many(self) -> None:
        if self._exact is not None and len(self._exact) >= _BUILD_CHUNK:
            self._give_up_exact_keys()

    def _give_up_exact_keys(self) -> None:
        """From here on, the Bloom filter: its bits get the keys of the set, then replace it (a reader on another
        thread that still holds the set is asking of a snapshot taken before any key the set lacks was written)."""
        if self._exact is None:
            return
        bits = _zeroed_bits()
        _set_all(bits, list(self._exact))
        self._bits, self._bytes, self._count = bits, memoryview(bits), self._count + len(self._exact)
        self._exact = None

    def _adopt(self) -> None:
        """On the writer's thread: take in the rebuilt bits (the writer's own since start-up are kept)."""
        built, self._built = self._built, None
        if built is not None:
            np.bitwise_or(self._bits, built, out=self._bits)
            self._count += self._built_count
            self._ready = True  # only now: a reader on another thread saw "maybe" until every bit was in

    def may_hold(self, key: bytes) -> bool:
        """False only if `key` (of a covered table) is surely not stored."""
        if not self._ready or key[0] not in _TAGS:
            return True
        exact = self._exact
        if exact is not None:
            return key in exact
        bits = self._bytes
        for word in _DIGEST.unpack(_digest(key)):
            position = word >> _SHIFT
            if not bits[position >> 3] & (1 << (position & 7)):
                return False
        return True

    def add_all(self, keys: Sequence[bytes]) -> list[bool]:
        """`add` for many keys of covered tables at once (a new add's 32 bucket marks); returns, per key, what
        `may_hold` answered just before. One pass: asking, then adding, hashed the keys and read their bits
        twice (116 against 64 us per add)."""
        if self._built is not None:
            self._adopt()
        if not keys:
            return []
        if self._exact is not None:
            held = [key in self._exact for key in keys]
            self._exact.update(keys)
            self._give_up_exact_keys_if_many()
            return held if self._ready else [True] * len(keys)
        positions = _positions(keys)
        held = _all_set(self._bits, positions)
        self._count += int((~held).sum())
        _set(self._bits, positions)
        return held.tolist() if self._ready else [True] * len(keys)

    def add(self, key: bytes) -> None:
        """Record that `key` is about to be stored (before its write: a write that fails leaves harmless bits)."""
        if self._built is not None:
            self._adopt()
        if key[0] not in _TAGS:
            return
        if self._exact is not None:
            self._exact.add(key)
            self._give_up_exact_keys_if_many()
            return
        bits, new = self._bytes, False
        for word in _DIGEST.unpack(_digest(key)):
            position = word >> _SHIFT
            byte, bit = position >> 3, 1 << (position & 7)
            if not bits[byte] & bit:
                bits[byte] |= bit
                new = True
        self._count += new

    def save(self, stamp: Stamp) -> None:
        """Write the filter for the database at `stamp` (when the writer is idle: at close).

        Not for a ledger small enough to rebuild at open (writing, syncing and hashing 32 MiB would
        slow every close of a small ledger), nor while a rebuild runs (the next start rebuilds), nor when
        the file already holds this stamp's bits (a start and stop with nothing written).
        """
        if self._built is not None:
            self._adopt()
        if not self._ready or self._exact is not None or self._count < _BUILD_CHUNK or stamp == self._saved_stamp:
            return
        owner = self._owner.encode()
        body = _HEADER.pack(_MAGIC, *stamp, self._count, len(owner)) + owner + self._bits.tobytes()
        write_file_atomically(self._path, hashlib.sha256(body).digest() + body)
        self._saved_stamp = stamp

    def _load(self, stamp: Stamp) -> str | None:
        try:
            stored = self._path.read_bytes()
        except FileNotFoundError:
            return "missing"
        digest, body = stored[:_DIGEST_SIZE], memoryview(stored)[_DIGEST_SIZE:]  # 32 MiB: slices without copies
        if len(body) < _HEADER.size or hashlib.sha256(body).digest() != digest:
            return "damaged (it does not match its digest)"
        magic, generation, log_size, count, owner_length = _HEADER.unpack_from(body)
        owner = bytes(body[_HEADER.size : _HEADER.size + owner_length])
        bits = body[_HEADER.size + owner_length :]
        if magic.rstrip(b"\x00") != _MAGIC or len(bits) != 1 << (BITS_LOG2 - 3):
            return "another format"
        if owner != self._owner.encode():
            return "copied from another data directory"
        if (generation, log_size) != stamp:
            return (
                f"stale (saved at generation {generation} and log size {log_size}, "
                f"the ledger is at {stamp[0]} and {stamp[1]})"
            )
        self._give_up_exact_keys()  # the keys written since start-up, if any, go into the bits loaded
        self._bits[:] = np.bitwise_or(self._bits, np.frombuffer(bits, dtype=np.uint8))
        self._ready, self._count, self._saved_stamp = True, count, stamp
        return None

    def close(self) -> None:
        """Stop a rebuild still running (before the database it reads closes)."""
        self._stop.set()
        if self._builder is not None:
            self._builder.join()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait for a background rebuild (tests and tools); True once the filter covers every stored key.

        Called by the writer's thread (or with the writer idle): it takes the rebuilt bits in."""
        if self._builder is not None:
            self._builder.join(timeout)
        if self._built is not None:
            self._adopt()
        return self._ready
