"""A Bloom filter in front of the hash-bucket marks: an add's empty buckets are known without LevelDB.

Each add looks at its 32 near-duplicate buckets (docs/PROTOCOL.md §7.6) and nearly all of them
are empty. The bucket marks (table `I`) answered that with 32 LevelDB gets per add, each one
releasing the GIL and waiting to get it back under load (the check's CPU per add at 100k
operations: ~520 us with the gets, ~440 us with the filter). The filter answers "empty" for a
bucket that has no mark; it has no false negatives, so every
verdict stays exact (a "maybe" still asks for the mark). 2^27 bits (16 MiB) and 3 positions per
bucket: with 8 million marked buckets (a million operations) 0.4% of empty buckets still cost a get.

It is derived state, like the vector index: saved beside the database at close with the
library generation, the owner's DID and a SHA-256 over it all (from `_BUILD_CHUNK` marks on; a
smaller library rebuilds it at open in a few ms). A file that is missing, damaged, another
node's or of another generation (a crash since it was saved) is never trusted: the filter is
rebuilt from the marks on a background thread, and until then every bucket is a "maybe".
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

from ledger.neardup import BAND_KEY_SIZE as KEY_SIZE
from ledger.store import write_file_atomically

log = logging.getLogger(__name__)

FILTER_FILE = "buckets.filter"
BITS_LOG2 = 27
_SHIFT = 64 - BITS_LOG2
_MASK64 = (1 << 64) - 1
#: odd 64-bit multipliers (multiplicative hashing): three well-spread positions from one bucket key
_MULTIPLIERS = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9)
_MAGIC = b"expledger-bucket-filter/2"
_HEADER = struct.Struct(">32sQQH")  # magic (padded), generation, marks, owner length; then the owner, the bits
_DIGEST_SIZE = 32
#: marks per vectorized step of a rebuild (and per check for a stop); fewer are rebuilt at open, not saved
_BUILD_CHUNK = 65536


def _set_all(bits: np.ndarray, keys: Sequence[bytes]) -> None:
    """Set the positions of many keys at once (a rebuild: millions of marks at a million operations)."""
    if not keys:
        return
    rows = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), KEY_SIZE).astype(np.uint64)
    values = np.zeros(len(keys), dtype=np.uint64)
    for column in range(KEY_SIZE):
        values = (values << np.uint64(8)) | rows[:, column]
    for multiplier in _MULTIPLIERS:
        positions = (values * np.uint64(multiplier)) >> np.uint64(_SHIFT)  # uint64 products wrap, as & _MASK64
        np.bitwise_or.at(bits, positions >> np.uint64(3), (np.uint8(1) << (positions & np.uint64(7)).astype(np.uint8)))


def _chunks(keys: Iterable[bytes]) -> Iterator[list[bytes]]:
    chunk: list[bytes] = []
    for key in keys:
        chunk.append(key)
        if len(chunk) == _BUILD_CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class BucketFilter:
    """Which buckets may hold an add; the writer asks it before a mark. Not thread-safe: the writer's alone."""

    def __init__(self, directory: Path, owner: str) -> None:
        self._path = directory / FILTER_FILE
        self._owner = owner
        self._bits = bytearray(1 << (BITS_LOG2 - 3))  # every bucket the writer marked since start-up, at least
        self._ready = False  # the bits also cover every mark stored before start-up
        self._built: bytearray | None = None  # handed over by the rebuild thread
        self._builder: threading.Thread | None = None
        self._stop = threading.Event()
        self._count = 0  # marks the bits cover (about: a mark the writer adds during a rebuild may count twice)
        self._built_count = 0

    @property
    def ready(self) -> bool:
        return self._ready or self._built is not None

    def open(self, generation: int, marks: Iterable[bytes]) -> str:
        """Load the saved filter of this `generation`, or rebuild it from `marks` (the marked bucket keys, from
        a snapshot taken by the caller); returns "loaded" or why it was rebuilt. A library with fewer than
        `_BUILD_CHUNK` marks is rebuilt at once, a larger one on a background thread."""
        why = self._load(generation)
        if why is None:
            return "loaded"
        chunks = _chunks(marks)
        first = next(chunks, [])
        if len(first) < _BUILD_CHUNK:
            bits = np.frombuffer(self._bits, dtype=np.uint8)
            _set_all(bits, first)
            self._ready, self._count = True, len(first)
            return why
        log.info("rebuilding the bucket filter in the background (%s)", why)
        self._builder = threading.Thread(
            target=self._build, args=(itertools.chain([first], chunks),), name="ledger-buckets", daemon=True
        )
        self._builder.start()
        return why

    def _build(self, chunks: Iterator[list[bytes]]) -> None:
        bits = np.zeros(len(self._bits), dtype=np.uint8)
        count = 0
        for chunk in chunks:
            if self._stop.is_set():
                return
            _set_all(bits, chunk)
            count += len(chunk)
        self._built_count = count
        self._built = bytearray(bits.tobytes())
        log.info("bucket filter rebuilt from %d marks", count)

    def _adopt(self) -> None:
        """On the writer's thread: take in the rebuilt bits (the writer's own since start-up are kept)."""
        built, self._built = self._built, None
        if built is not None:
            mine = np.frombuffer(self._bits, dtype=np.uint8)
            np.bitwise_or(mine, np.frombuffer(built, dtype=np.uint8), out=mine)
            self._ready = True
            self._count += self._built_count

    def mark(self, key: bytes) -> bool:
        """Record that the bucket `key` (band number, band hash) is marked now; False if it surely was not before.

        The bits are set before the mark's write commits: a write that fails leaves a harmless extra bit.
        """
        if not self._ready:
            self._adopt()
        value, bits, all_set = int.from_bytes(key, "big"), self._bits, True
        for multiplier in _MULTIPLIERS:
            position = ((value * multiplier) & _MASK64) >> _SHIFT
            byte, bit = position >> 3, 1 << (position & 7)
            if not bits[byte] & bit:
                bits[byte] |= bit
                all_set = False
        self._count += not all_set
        return all_set or not self._ready  # until the rebuild is in, only the marks themselves know

    def save(self, generation: int) -> None:
        """Write the filter for the library at `generation` (when the writer is idle: at close).

        Not for a library small enough to rebuild at open (writing, syncing and hashing 16 MiB made
        every close of a small ledger ~180 ms), nor while a rebuild runs (the next start rebuilds).
        """
        self._adopt()
        if not self._ready or self._count < _BUILD_CHUNK:
            return
        owner = self._owner.encode()
        body = _HEADER.pack(_MAGIC, generation, self._count, len(owner)) + owner + bytes(self._bits)
        write_file_atomically(self._path, hashlib.sha256(body).digest() + body)

    def _load(self, generation: int) -> str | None:
        try:
            stored = self._path.read_bytes()
        except FileNotFoundError:
            return "missing"
        digest, body = stored[:_DIGEST_SIZE], memoryview(stored)[_DIGEST_SIZE:]  # 16 MiB: slices without copies
        if len(body) < _HEADER.size or hashlib.sha256(body).digest() != digest:
            return "damaged (it does not match its digest)"
        magic, saved_generation, count, owner_length = _HEADER.unpack_from(body)
        owner = bytes(body[_HEADER.size : _HEADER.size + owner_length])
        bits = body[_HEADER.size + owner_length :]
        if magic.rstrip(b"\x00") != _MAGIC or len(bits) != len(self._bits):
            return "another format"
        if owner != self._owner.encode():
            return "copied from another data directory"
        if saved_generation != generation:
            return f"stale (generation {saved_generation}, library at {generation})"
        self._bits[:] = bits
        self._ready, self._count = True, count
        return None

    def close(self) -> None:
        """Stop a rebuild still running (before the database it reads closes)."""
        self._stop.set()
        if self._builder is not None:
            self._builder.join()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait for a background rebuild (tests and tools); True once the filter covers every stored mark."""
        if self._builder is not None:
            self._builder.join(timeout)
        return self.ready
