"""Operation bytes in append-only segment files beside LevelDB: written once, never compacted.

Blocks are immutable and content-addressed, and were a third of the database's bytes, which LevelDB's
compaction rewrote again and again as the database grew (at a million operations compaction was the
busiest thread beside the writer). As Bitcoin Core keeps blocks in blk*.dat files and only their
index in LevelDB, the database keeps, per CID, where its bytes lie: a locator (segment, offset,
length). Segments are `blocks/00000.blk`, `00001.blk`, ..., each at most `SEGMENT_BYTES` unless one
block is larger.

Durability: a transaction's blocks are written and synced (`Appender.flush`) before the LevelDB write
that holds their locators and the new end of the files (`END_KEY`), so the database never names a
byte that is not on disk. A crash between the two, or a failed write, leaves bytes past the recorded
end: opening (or the store's recovery after a failed write) truncates them (`BlockFiles.trim`). Files
shorter than the recorded end, or missing, are refused (the database names bytes that are gone).
Every read checks the bytes against their CID, so a damaged file is found, never served.
"""

from __future__ import annotations

import errno
import hashlib
import os
import struct
import threading
from pathlib import Path

from ledger.cid import CID, CID_LENGTH
from ledger.errors import LedgerError

#: the directory of segments, inside the database directory (LevelDB ignores names it did not make)
BLOCKS_DIR = "blocks"
#: a segment is closed once it holds this much (Bitcoin Core's blk files: 128 MiB)
SEGMENT_BYTES = 256 * 1024 * 1024
#: segment, offset, length
LOCATOR = struct.Struct(">IQI")
#: the end of the files as of the database's last write: segment, offset
END = struct.Struct(">IQ")
_DIGEST_SIZE = 32  # the sha2-256 digest at the end of every binary CID of the ledger


class BlockFileError(LedgerError):
    """Block files that do not hold what the database says they hold: missing, short or damaged."""


def _segment_name(segment: int) -> str:
    return f"{segment:05d}.blk"


class BlockFiles:
    """The segments of one database: reads from any thread, appends through one `Appender` at a time."""

    def __init__(self, directory: Path, end: bytes | None) -> None:
        """Open the segments up to `end` (as the database recorded it; None: no block written yet), dropping any
        bytes past it that a crash left behind."""
        self._directory = directory
        directory.mkdir(mode=0o700, exist_ok=True)
        self._end = END.unpack(end) if end is not None else (0, 0)
        self._lock = threading.Lock()  # guards the descriptors of segments opened for reading
        self._readers: dict[int, int] = {}
        self.trim()

    def trim(self) -> None:
        """Cut what lies past the committed end (a crash or a failed append left it) and refuse a segment that is
        missing or short of it."""
        last, length = self._end
        for entry in os.scandir(self._directory):
            number = _number(entry.name)
            if number is not None and number > last:
                os.unlink(entry.path)
        for segment in range(last + 1):
            path = self._directory / _segment_name(segment)
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                if segment == last and length == 0:
                    continue
                raise BlockFileError("store.corrupt", f"{path}: the block file is missing") from None
            needed = length if segment == last else 1
            if size < needed:
                raise BlockFileError(
                    "store.corrupt", f"{path}: {size} bytes, but the database names blocks up to byte {needed}"
                )
            if segment == last and size > length:
                os.truncate(path, length)

    @property
    def end(self) -> bytes:
        """The end of the files as of the last committed write (what the database records)."""
        return END.pack(*self._end)

    def appender(self) -> Appender:
        return Appender(self)

    def read(self, cid: bytes, locator: bytes) -> bytes:
        """The bytes a locator names, checked against their CID."""
        if len(locator) != LOCATOR.size:
            raise BlockFileError("store.corrupt", f"block {CID(cid)}: its locator is damaged ({len(locator)} bytes)")
        segment, offset, length = LOCATOR.unpack(locator)
        data = os.pread(self._reader(segment), length, offset)
        if len(data) != length or hashlib.sha256(data).digest() != cid[CID_LENGTH - _DIGEST_SIZE :]:
            path = self._directory / _segment_name(segment)
            raise BlockFileError(
                "store.corrupt", f"{path}: block {CID(cid)} at byte {offset} ({length} bytes) does not match its CID"
            )
        return data

    def _reader(self, segment: int) -> int:
        fd = self._readers.get(segment)
        if fd is None:
            with self._lock:
                fd = self._readers.get(segment)
                if fd is None:
                    path = self._directory / _segment_name(segment)
                    try:
                        fd = os.open(path, os.O_RDONLY)
                    except FileNotFoundError:
                        raise BlockFileError("store.corrupt", f"{path}: the block file is missing") from None
                    self._readers[segment] = fd
        return fd

    def close(self) -> None:
        with self._lock:
            for fd in self._readers.values():
                os.close(fd)
            self._readers.clear()


class Appender:
    """One transaction's new blocks: placed past the committed end, written by `flush`, kept by `committed`.

    Nothing reaches the files before `flush`; a transaction that never commits leaves them as they were, and
    one whose flush or database write fails leaves bytes past the recorded end, which the store cuts away
    (`BlockFiles.trim`) before it takes writes again.
    """

    def __init__(self, files: BlockFiles) -> None:
        self._files = files
        self._start = files._end
        self._segment, self._offset = files._end
        self._pending: list[tuple[int, int, bytes]] = []  # segment, offset, bytes
        #: bytes placed and not yet committed (what the store checks against its free-space reserve)
        self.size = 0

    def append(self, data: bytes) -> bytes:
        """Place `data` after everything before it; returns its locator."""
        if self._offset and self._offset + len(data) > SEGMENT_BYTES:
            self._segment, self._offset = self._segment + 1, 0
        locator = LOCATOR.pack(self._segment, self._offset, len(data))
        self._pending.append((self._segment, self._offset, data))
        self._offset += len(data)
        self.size += len(data)
        return locator

    @property
    def end(self) -> bytes:
        """Where the files end once this transaction's blocks are written."""
        return END.pack(self._segment, self._offset)

    def flush(self) -> None:
        """Write and sync the pending blocks (and the directory, when a segment was created)."""
        if not self._pending:
            return
        created = False
        by_segment: dict[int, list[tuple[int, bytes]]] = {}
        for segment, offset, data in self._pending:
            by_segment.setdefault(segment, []).append((offset, data))
        for segment, pieces in by_segment.items():
            path = self._files._directory / _segment_name(segment)
            created |= not path.exists()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                _write_all(fd, b"".join(data for _, data in pieces), pieces[0][0])  # contiguous within a segment
                os.fdatasync(fd)
            finally:
                os.close(fd)
        if created:
            directory = os.open(self._files._directory, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)

    def committed(self) -> None:
        """The database now records this transaction's end: later appenders start there."""
        if self._files._end != self._start:
            raise RuntimeError("block files: another transaction committed since this one began")
        self._files._end = self._start = (self._segment, self._offset)
        self._pending = []
        self.size = 0


def _write_all(fd: int, data: bytes, offset: int) -> None:
    """Write all of `data` at `offset`: on a nearly full disk pwrite writes what fits and returns a short count
    (the next call raises ENOSPC), which a single call would leave unnoticed."""
    left = memoryview(data)
    while left:
        written = os.pwrite(fd, left, offset)
        if written == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        left, offset = left[written:], offset + written


def _number(name: str) -> int | None:
    """The segment number of a file name, or None for any other file."""
    stem, dot, suffix = name.partition(".")
    return int(stem) if dot and suffix == "blk" and stem.isdigit() and len(stem) == 5 else None
