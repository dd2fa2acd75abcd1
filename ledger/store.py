"""One LevelDB per node data directory: key tables, and transactions that commit atomically with sync.

Every key starts with a one-byte table tag. A transaction reads through its own pending writes,
so the ingest pipeline can build on what it wrote earlier in the same batch; `commit` writes
everything in one `WriteBatch(sync=True)`, so an acknowledged operation survives kill -9.
"""

from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import plyvel

from ledger.errors import LedgerError

FORMAT = b"experience-ledger/store/1"

# table tags (the first byte of every key)
META = b"M"  # M name -> value
BLOCK = b"B"  # B cid -> operation bytes
SEQ = b"S"  # S cid -> u64 position in the local log
LOG = b"L"  # L u64 -> cid
NODE = b"N"  # N u8 level, u64 index -> hash of a perfect Merkle subtree (level 0: leaf hash)
OPMETA = b"K"  # K cid -> u64 clock, u8 kind, u8 counts, parent and target cids (what causality needs)
PENDING = b"P"  # P cid -> cids it still waits for
WAITER = b"W"  # W dependency cid, waiting cid -> ""
BY_AUTHOR = b"A"  # A author did, 0x00, u64 seq -> cid
BY_TARGET = b"T"  # T target cid, order -> kind byte (applied operations naming a target)
ORDER = b"O"  # O order (u64 clock, cid) -> "" (applied operations in canonical order)
UNDO = b"U"  # U cid -> how to undo that operation's fold step
EXPERIENCE = b"X"  # X experience id -> experience record
BY_DOMAIN = b"D"  # D domain path, 0x00, experience id -> "" (live experiences)
STATUS = b"V"  # V cid -> what the fold made of that operation
VOTES = b"Y"  # Y experience id, author did -> [clock, cid, value] of the vote that counts

U64 = struct.Struct(">Q")
#: the tables a transaction can scan with its own writes merged in (kept sorted per transaction)
_SCANNABLE = frozenset(tag[0] for tag in (ORDER, BY_TARGET, WAITER, VOTES))


class StoreError(LedgerError):
    """A data directory that cannot be used: missing, corrupt, or not ours. Never an empty ledger instead."""


def u64(value: int) -> bytes:
    return U64.pack(value)


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key that starts with `prefix`."""
    trimmed = prefix.rstrip(b"\xff")
    return trimmed[:-1] + bytes([trimmed[-1] + 1]) if trimmed else b"\xff" * (len(prefix) + 1)


def write_file_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new content, never a mix.

    The data is synced before the rename, so after a power loss the file is never empty.
    """
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)


class Store:
    """A LevelDB database opened with paranoid checks; errors surface as StoreError."""

    def __init__(self, path: Path, *, create: bool) -> None:
        self.path = path
        if not create and not (path / "CURRENT").exists():
            raise StoreError(
                "store.missing",
                f"{path}: the ledger database is missing (no CURRENT file); refusing to start with an empty "
                "ledger; restore the data directory from a backup, or move it away to start a new node",
            )
        try:
            self._db = plyvel.DB(
                str(path),
                create_if_missing=create,
                paranoid_checks=True,
                bloom_filter_bits=10,  # most lookups on ingest are for keys that are absent
                lru_cache_size=64 * 1024 * 1024,
                write_buffer_size=16 * 1024 * 1024,
            )
        except plyvel.CorruptionError as exc:
            raise StoreError("store.corrupt", f"{path}: the ledger database is corrupt ({exc})") from None
        except plyvel.Error as exc:
            raise StoreError("store.open", f"{path}: cannot open the ledger database ({exc})") from None
        if self.get(META + b"format") is None and (create or next(self.scan(b""), None) is None):
            # new, or created by a start that died before writing anything: nothing to lose
            self._db.put(META + b"format", FORMAT, sync=True)
        found = self.get(META + b"format")
        if found != FORMAT:
            self.close()
            raise StoreError(
                "store.format",
                f"{path}: not an experience-ledger database of this version (format {found!r}, expected {FORMAT!r})",
            )

    def get(self, key: bytes) -> bytes | None:
        try:
            return self._db.get(key, verify_checksums=True)
        except plyvel.Error as exc:
            raise self._read_error(exc) from None

    def _read_error(self, exc: plyvel.Error) -> StoreError:
        return StoreError("store.corrupt", f"{self.path}: the ledger database is damaged; reading failed ({exc})")

    def scan(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Keys with `prefix` (from `start` on, if given) in key order."""
        try:
            yield from self._db.iterator(start=start or prefix, stop=prefix_end(prefix), verify_checksums=True)
        except plyvel.Error as exc:
            raise self._read_error(exc) from None

    def transaction(self) -> Transaction:
        return Transaction(self)

    def write(self, puts: dict[bytes, bytes | None]) -> None:
        """Apply puts (None deletes) atomically and durably."""
        with self._db.write_batch(sync=True) as batch:
            for key, value in puts.items():
                if value is None:
                    batch.delete(key)
                else:
                    batch.put(key, value)

    def close(self) -> None:
        self._db.close()


class Transaction:
    """Buffered writes over a Store; reads and scans see the buffer first."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._writes: dict[bytes, bytes | None] = {}
        #: per table tag, the sorted keys written in this transaction (for merged scans)
        self._sorted: dict[int, list[bytes]] = {}

    def get(self, key: bytes) -> bytes | None:
        if key in self._writes:
            return self._writes[key]
        return self._store.get(key)

    def put(self, key: bytes, value: bytes | None) -> None:
        """Write `value` at `key`; None deletes."""
        if key not in self._writes and key[0] in _SCANNABLE:
            bisect.insort(self._sorted.setdefault(key[0], []), key)
        self._writes[key] = value

    def delete(self, key: bytes) -> None:
        self.put(key, None)

    def scan(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Like Store.scan, with this transaction's writes merged in (scannable tables only)."""
        if prefix[0] not in _SCANNABLE:
            raise ValueError(f"table {prefix[:1]!r} is not scannable inside a transaction")
        low = start or prefix
        high = prefix_end(prefix)
        keys = self._sorted.get(prefix[0], [])
        mine = keys[bisect.bisect_left(keys, low) : bisect.bisect_left(keys, high)]
        stored = self._store.scan(prefix, start)
        index = 0
        for key, value in stored:
            while index < len(mine) and mine[index] < key:
                if (written := self._writes[mine[index]]) is not None:
                    yield mine[index], written
                index += 1
            if index < len(mine) and mine[index] == key:
                if (written := self._writes[key]) is not None:
                    yield key, written
                index += 1
            else:
                yield key, value
        for key in mine[index:]:
            if (written := self._writes[key]) is not None:
                yield key, written

    def commit(self) -> None:
        self._store.write(self._writes)
        self._writes = {}
        self._sorted = {}
