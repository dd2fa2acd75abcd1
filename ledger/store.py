"""One LevelDB per node data directory: key tables, and transactions that commit atomically with sync.

Every key starts with a one-byte table tag. A transaction reads through its own pending writes,
so the ingest pipeline can build on what it wrote earlier in the same batch; `commit` writes
everything in one `WriteBatch(sync=True)`, so an acknowledged operation survives kill -9.
Operation bytes live in append-only files inside the database directory (ledger/blockfile.py);
the B table holds where: a transaction syncs its blocks before the write that names them.

A write that fails (a full disk) stops writes until the store is back in its last good state
(`Store.check_writable`): LevelDB may have left a torn record at the end of its log and would append
the next writes after it, where its recovery at the next open stops; every acknowledged write after it
was lost (issue 54). A free-space reserve refuses writes before the disk is full.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import plyvel

from ledger.blockfile import BLOCKS_DIR, LOCATOR, BlockFileError, BlockFiles
from ledger.cid import CID_LENGTH
from ledger.errors import LedgerError
from ledger.neardup import BAND_KEY_SIZE
from ledger.priority import NEVER
from ledger.tablelinks import TableLinks
from ledger.tables import (
    ABSORBS,
    BLOCK,
    BLOCKS_END,
    BUCKET,
    BY_TARGET,
    COMPONENT_OP,
    COUNTED,
    FORMAT_KEY,
    HEAD,
    LISTED,
    MEMBER,
    META,
    ORDER,
    U64,
    VOTES,
    WAITER,
    block_key,
    bucket_key,
    cid_of_key,
    head_key,
    opmeta_key,
    order_cid,
    prefix_end,
)

log = logging.getLogger(__name__)

FORMAT = b"experience-ledger/store/4"
#: format 1 keyed the heads by CID alone; opening such a database orders them by clock (format 2)
FORMAT_HEADS_BY_CID = b"experience-ledger/store/1"
#: format 2 kept operation bytes in the B table; opening such a database moves them to block files (format 3)
FORMAT_BLOCKS_IN_TABLE = b"experience-ledger/store/2"
#: format 3 keyed the hash buckets by band and order alone; opening such a database adds the anchors (format 4)
FORMAT_BUCKETS_BY_ORDER = b"experience-ledger/store/3"


#: the tables a transaction can scan with its own writes merged in (kept sorted per transaction)
_SCANNABLE = frozenset(
    tag[0] for tag in (ORDER, BY_TARGET, WAITER, VOTES, HEAD, COUNTED, MEMBER, COMPONENT_OP, BUCKET, LISTED)
)
#: key bytes that name the group a transaction keeps a table's written keys sorted in, where not the tag alone:
#: a batch writes ~8,000 bucket keys at 1M, and inserting each into one sorted list took ~11 us per operation,
#: but a transaction scans one bucket at a time
_GROUP_LENGTH = {BUCKET[0]: 1 + BAND_KEY_SIZE, LISTED[0]: 1 + CID_LENGTH}
#: up to this many of a transaction's writes in a range, `Transaction.items` puts each into the stored pairs
_FEW_WRITES = 64

#: blocks moved into the block files (bucket keys rewritten) per synced write while a database is upgraded
_UPGRADE_CHUNK = 100_000
#: puts added to a write batch between two of the writer's pause points (~1 ms)
_PUTS_BETWEEN_PAUSES = 1_000
#: a key no table uses: a synced delete of it shows that LevelDB takes writes again after a failed one
_PROBE_KEY = META + b"probe"
#: a key range that holds no key (every key starts with a table's letter): compacting it makes LevelDB write its
#: memtable into a table and start a new log, without rewriting any table
_NO_KEYS = (b"\x00", b"\x00\x00")
_MB = 1 << 20


class ReadView(Protocol):
    """What reading code needs: a store, a snapshot of it, or a transaction that reads its own writes."""

    def get(self, key: bytes) -> bytes | None: ...

    def block(self, cid: bytes) -> bytes | None: ...

    def scan(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]: ...


class StoredKeys(Protocol):
    """What the store asks of the filter of its stored keys (`ledger.keyfilter.KeyFilter`, which the ledger attaches):
    the filter reads the store's tables, so the store names only this, and the modules import one way."""

    def may_hold(self, key: bytes) -> bool: ...

    def add(self, key: bytes) -> None: ...

    def add_all(self, keys: Sequence[bytes]) -> list[bool]: ...

    def close(self) -> None: ...


class StoreError(LedgerError):
    """A data directory that cannot be used: missing, corrupt, or not ours. Never an empty ledger instead."""


@dataclass(frozen=True, slots=True)
class Writability:
    """Whether the store takes writes and the free space it has: what a node's `status` shows."""

    #: "ok"; "reserve": free space under the reserve, writes refused until space is freed; "stopped": a write
    #: failed, writes refused until the store is recovered (once there is room: `Store.check_writable`)
    state: str
    free_bytes: int
    min_free_bytes: int
    #: why writes are refused (None when they are not)
    reason: str | None = None

    @property
    def writable(self) -> bool:
        return self.state == "ok"

    def to_json(self) -> dict[str, object]:
        return {
            "writable": self.writable,
            "state": self.state,
            "free_bytes": self.free_bytes,
            "min_free_bytes": self.min_free_bytes,
            "reason": self.reason,
        }


def _megabytes(size: int) -> str:
    return f"{size / _MB:.1f} MB"


def _condition(exc: Exception) -> str:
    """What went wrong, without paths or reprs (`[Errno 28] No space left on device: '/x'` and
    `b'IO error: /x/000006.log: No space left on device'` both give `no space left on device`)."""
    if isinstance(exc, OSError) and exc.strerror:
        text = exc.strerror
    else:
        raw = exc.args[0] if exc.args else ""
        text = (raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)).rsplit(": ", 1)[-1]
    return text[:1].lower() + text[1:] if text else type(exc).__name__


def _free_bytes(path: Path) -> int:
    """Free space on `path`'s file system for an unprivileged process."""
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def write_file_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new content, never a mix.

    The data is synced before the rename, so after a power loss the file is never empty.
    """
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if os.write(fd, data) != len(data):  # a short write: the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(temporary))
        os.fsync(fd)
    except OSError:
        temporary.unlink(missing_ok=True)  # a full disk: nothing half-written stays behind
        raise
    finally:
        os.close(fd)
    os.replace(temporary, path)


class Store:
    """A LevelDB database opened with paranoid checks; errors surface as StoreError."""

    def __init__(self, path: Path, *, create: bool) -> None:
        self.path = path
        #: answers most gets of keys that are not stored without LevelDB (ledger/keyfilter.py); the ledger attaches it
        self.key_filter: StoredKeys | None = None
        #: writes that would leave less free space than this are refused (`store.unwritable`): before LevelDB
        #: meets a full disk (geth's --datadir.minfreedisk); the node sets it from `[store] min_free_mb`
        self.min_free_bytes = 0
        #: why writes are stopped after a failed one (None: they are not); set and cleared by the writer alone
        self._failure: str | None = None
        #: the newest LevelDB log when a write failed: the store recovers once LevelDB writes a newer one
        self._failed_log = 0
        #: False once recovering failed with room to do it: LevelDB refuses writes until the node restarts
        self._recoverable = True
        self._refusing = False  # the last write was refused for the reserve (logged once, not per write)
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
                # Compaction rewrites every byte ~10 times as the database grows, on the writer's cores.
                # Blocks, CIDs, signatures and float16 vectors do not compress (snappy saved ~11% of the
                # disk), and larger memtables and files mean fewer, larger compactions: at 100k-120k
                # operations compaction CPU fell from 6.2 s to 1.4 s per 20,000 operations.
                compression=None,
                write_buffer_size=64 * 1024 * 1024,
                max_file_size=8 * 1024 * 1024,
            )
        except plyvel.CorruptionError as exc:
            raise StoreError("store.corrupt", f"{path}: the ledger database is corrupt ({exc})") from None
        except plyvel.IOError as exc:
            if _condition(exc) == "no space left on device":  # LevelDB writes the log it recovers into a table
                raise StoreError(
                    "store.unwritable",
                    f"{path}: no space left to open the ledger database ({_megabytes(_free_bytes(path))} free); "
                    "free some space and start again",
                ) from None
            raise StoreError("store.open", f"{path}: cannot open the ledger database ({exc})") from None
        except plyvel.Error as exc:
            raise StoreError("store.open", f"{path}: cannot open the ledger database ({exc})") from None
        if self.get(FORMAT_KEY) is None and (create or next(self.scan(b""), None) is None):
            # new, or created by a start that died before writing anything: nothing to lose
            self._db.put(FORMAT_KEY, FORMAT, sync=True)
        found = self.get(FORMAT_KEY)
        if found not in (FORMAT, FORMAT_BUCKETS_BY_ORDER, FORMAT_BLOCKS_IN_TABLE, FORMAT_HEADS_BY_CID):
            self._db.close()
            raise StoreError(
                "store.format",
                f"{path}: not an experience-ledger database of this version (format {found!r}, expected {FORMAT!r})",
            )
        try:
            if found == FORMAT_HEADS_BY_CID:
                self._order_heads_by_clock()
            # bytes past the recorded end (a crash, or an upgrade that was interrupted) are cut away
            self.blocks = BlockFiles(path / BLOCKS_DIR, self.get(BLOCKS_END))
            if found in (FORMAT_HEADS_BY_CID, FORMAT_BLOCKS_IN_TABLE):
                self._move_blocks_to_files()
            if found != FORMAT:
                self._anchor_buckets()
        except BlockFileError as exc:
            self._db.close()
            raise StoreError(exc.code, exc.message) from None
        except OSError as exc:
            self._db.close()
            raise StoreError("store.write", f"{path}: upgrading the store failed ({exc})") from None
        except BaseException:
            self._db.close()
            raise
        self._links = TableLinks(path)

    def _order_heads_by_clock(self) -> None:
        """Rewrite format 1's heads (keyed by CID) newest first, in one synced batch with the new format.

        Choosing a new operation's parents sorted every head by clock: 186,671 heads at a million
        operations took ~3 s, and anyone can add a head by sending an operation without parents.
        """
        log.info("%s: upgrading the store from format 1 to 2: ordering the heads by clock", self.path)
        moved = 0
        with self._db.write_batch(transaction=True, sync=True) as batch:  # transaction: an error writes nothing
            for key, _ in self.scan(HEAD):
                cid = cid_of_key(key)
                meta = self.get(opmeta_key(cid))
                if meta is None:
                    raise StoreError("store.corrupt", f"{self.path}: head {cid.hex()} has no operation metadata")
                batch.delete(key)
                batch.put(head_key(U64.unpack_from(meta)[0], cid), b"")
                moved += 1
            batch.put(FORMAT_KEY, FORMAT_BLOCKS_IN_TABLE)
        # the old keys sort before the new ones: until compacted away, every scan of the heads skipped them all
        self.compact(HEAD)
        log.info("%s: store format 2: %d heads ordered by clock", self.path, moved)

    def _move_blocks_to_files(self) -> None:
        """Move format 2's operation bytes from the B table into block files, then record format 3.

        Chunks of blocks are written and synced, and each chunk's locators replace its bytes in one synced
        write with the files' new end; the format changes with the last. An interrupted upgrade resumes:
        bytes past the recorded end are cut away at open, and a B value that is not a locator is a block
        still to move (every block is longer than a locator).
        """
        log.info("%s: upgrading the store from format 2 to 3: moving operation bytes into block files", self.path)
        moved, chunk = 0, []
        for key, value in self.scan(BLOCK):
            if len(value) != LOCATOR.size:
                chunk.append((key, value))
            if len(chunk) == _UPGRADE_CHUNK:
                moved += self._move_chunk(chunk, final=False)
                chunk = []
                log.info("%s: moved %d operations into block files", self.path, moved)
        moved += self._move_chunk(chunk, final=True)
        self.compact(BLOCK)  # the bytes the locators replaced
        log.info("%s: store format 3: %d operations in block files", self.path, moved)

    def _anchor_buckets(self) -> None:
        """Rewrite format 3's bucket keys with their anchors (`bucket_key`), then record format 4.

        An absorbed add's anchor is the clock of the F the E table records now: that is where it would have
        been indexed had it arrived last, and F only moves earlier. Keys are rewritten in synced chunks, each
        deleting the old keys it replaces, and the format changes with the last; an interrupted upgrade resumes
        from the old keys left (a new key is 8 bytes longer).
        """
        log.info("%s: upgrading the store from format 3 to 4: anchoring the hash buckets", self.path)
        clocks: dict[bytes, bytes] = {}  # F -> its clock, 8 bytes
        anchors: dict[bytes, bytes] = {}  # absorbed add -> its F's clock
        for key, into in self.scan(ABSORBS):
            if into not in clocks:
                meta = self.get(opmeta_key(into))
                if meta is None:
                    raise StoreError("store.corrupt", f"{self.path}: add {into.hex()} has no operation metadata")
                clocks[into] = meta[:8]
            anchors[cid_of_key(key)] = clocks[into]
        old_size = 1 + BAND_KEY_SIZE + 8 + CID_LENGTH
        rewritten, chunk = 0, []
        for key, _ in self.scan(BUCKET):  # an iterator reads a snapshot: the chunks written meanwhile are not in it
            if len(key) == old_size:
                chunk.append(key)
            if len(chunk) == _UPGRADE_CHUNK:
                rewritten += self._anchor_chunk(chunk, anchors, final=False)
                chunk = []
                if rewritten % (10 * _UPGRADE_CHUNK) == 0:  # ~3 s apart: 8 million keys at a million operations
                    log.info("%s: anchored %d bucket keys", self.path, rewritten)
        rewritten += self._anchor_chunk(chunk, anchors, final=True)
        self.compact(BUCKET)  # the old keys
        log.info("%s: store format 4: %d bucket keys anchored", self.path, rewritten)

    def _anchor_chunk(self, keys: list[bytes], anchors: dict[bytes, bytes], *, final: bool) -> int:
        with self._db.write_batch(transaction=True, sync=True) as batch:
            for key in keys:
                band, order = key[1 : 1 + BAND_KEY_SIZE], key[1 + BAND_KEY_SIZE :]
                batch.delete(key)
                batch.put(bucket_key(band, order, anchors.get(order_cid(order), order)), b"")
            if final:
                batch.put(FORMAT_KEY, FORMAT)
        return len(keys)

    def _move_chunk(self, chunk: list[tuple[bytes, bytes]], *, final: bool) -> int:
        appender = self.blocks.appender()
        locators = [(key, appender.append(value)) for key, value in chunk]
        appender.flush()
        with self._db.write_batch(transaction=True, sync=True) as batch:
            for key, locator in locators:
                batch.put(key, locator)
            batch.put(BLOCKS_END, appender.end)
            if final:
                batch.put(FORMAT_KEY, FORMAT_BUCKETS_BY_ORDER)
        appender.committed()
        return len(chunk)

    def get(self, key: bytes) -> bytes | None:
        if self.key_filter is not None and not self.key_filter.may_hold(key):
            return None
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

    def items(self, prefix: bytes, start: bytes | None = None) -> list[tuple[bytes, bytes]]:
        """The pairs `scan` yields, as one list (see `keys`)."""
        try:
            return list(self._db.iterator(start=start or prefix, stop=prefix_end(prefix), verify_checksums=True))
        except plyvel.Error as exc:
            raise self._read_error(exc) from None

    def keys(self, prefix: bytes, start: bytes | None = None, stop: bytes | None = None) -> list[bytes]:
        """The keys `scan` yields (up to `stop`, if given), as one list: a long range costs LevelDB's iteration,
        not a Python step per key."""
        try:
            return list(
                self._db.iterator(
                    start=start or prefix, stop=stop or prefix_end(prefix), include_value=False, verify_checksums=True
                )
            )
        except plyvel.Error as exc:
            raise self._read_error(exc) from None

    def block(self, cid: bytes) -> bytes | None:
        """The bytes of a stored operation, checked against its CID; None if it is not stored."""
        locator = self.get(block_key(cid))
        return None if locator is None else self._read_block(cid, locator)

    def _read_block(self, cid: bytes, locator: bytes) -> bytes:
        try:
            return self.blocks.read(cid, locator)
        except BlockFileError as exc:
            raise StoreError(exc.code, exc.message) from None
        except OSError as exc:
            raise StoreError("store.corrupt", f"{self.path}: reading a block failed ({exc})") from None

    def transaction(self) -> Transaction:
        return Transaction(self)

    def compact(self, table: bytes) -> None:
        """Compact one table's key range: keys deleted in bulk stop costing every read that seeks over them."""
        self._db.compact_range(start=table, stop=prefix_end(table))

    def snapshot(self) -> Snapshot:
        """A consistent, read-only view of everything committed so far; safe to read from any thread."""
        return Snapshot(self, self._db.snapshot())

    def write(self, puts: dict[bytes, bytes | None]) -> None:
        """Apply puts (None deletes) atomically and durably."""
        self.check_writable()
        if self.key_filter is not None:  # before the write: no reader is ever told a stored key is absent
            for key, value in puts.items():
                if value is not None:
                    self.key_filter.add(key)
        self._apply(puts)

    def _apply(self, puts: dict[bytes, bytes | None], pause: Callable[[], None] = NEVER.pause) -> None:
        """Write puts whose keys are already in the key filter; `pause()` every `_PUTS_BETWEEN_PAUSES` puts.

        Building a batch's write holds the GIL throughout (~25,000 puts at 1M operations, ~30 ms of the
        ~185 ms the writer went on without a pause point after its last component): reads go first here too.
        """
        try:
            with self._db.write_batch(transaction=True, sync=True) as batch:  # an error building it writes nothing
                for done, (key, value) in enumerate(puts.items()):
                    if done % _PUTS_BETWEEN_PAUSES == 0:
                        pause()
                    if value is None:
                        batch.delete(key)
                    else:
                        batch.put(key, value)
        except plyvel.Error as exc:  # the write itself failed: its record in the log may be torn
            raise self._write_failed(exc, "the database") from None

    # --- free space and failed writes -------------------------------------------------------------

    def free_bytes(self) -> int:
        """Free space on the database's file system (one statvfs, a few microseconds)."""
        return _free_bytes(self.path)

    def writability(self) -> Writability:
        free = self.free_bytes()
        if self._failure is not None:
            return Writability("stopped", free, self.min_free_bytes, self._failure)
        if self._refusing or free < self.min_free_bytes:  # refusing: the last write would have gone under it
            return Writability("reserve", free, self.min_free_bytes, "free space is under the reserve")
        return Writability("ok", free, self.min_free_bytes)

    def check_writable(self, incoming: int = 0) -> None:
        """Refuse (`store.unwritable`) a write of about `incoming` bytes that the store cannot take safely: one
        that would leave less free space than the reserve, or any after a failed write until `_recover` has
        brought the store back to its last good state (tried here, so the next write after space is freed
        resumes)."""
        if self._failure is not None:
            self._recover()
        free = self.free_bytes()
        # a reserve of 0 refuses nothing: a write may meet the full disk, and fails and recovers like any other
        if self.min_free_bytes and free - incoming < self.min_free_bytes:
            if not self._refusing:
                log.warning(
                    "%s: %s free, under the reserve of %s ([store] min_free_mb): refusing writes until space is freed",
                    self.path,
                    _megabytes(free),
                    _megabytes(self.min_free_bytes),
                )
                self._refusing = True
            raise StoreError(
                "store.unwritable",
                f"the store takes no writes: {_megabytes(free)} free, under the reserve of "
                f"{_megabytes(self.min_free_bytes)}; writes resume once space is freed, reads go on",
            )
        if self._refusing:
            log.warning("%s: %s free: taking writes again", self.path, _megabytes(free))
            self._refusing = False

    def _write_failed(self, exc: Exception, what: str) -> StoreError:
        """Stop writes after a failed one; the error for the client names the condition, the log the details."""
        condition = _condition(exc)
        log.error("%s: a write to %s failed (%s); writes stop until the store is recovered", self.path, what, exc)
        self._failure = f"a write to {what} failed: {condition}"
        self._failed_log = self._newest_log()
        return StoreError(
            "store.unwritable",
            f"the write failed ({condition}), nothing of it was kept; writes stop until the store recovers "
            f"({_megabytes(self.free_bytes())} free), reads go on",
        )

    def _recover(self) -> None:
        """Bring the store back to its last good state after a failed write, once there is room for it.

        A LevelDB write that fails midway (ENOSPC) leaves a torn record at the end of its log, and LevelDB
        appends the next writes after it; at the next open its recovery stops at the torn record (a checksum
        mismatch) and loses them all. The memtable holds exactly the writes that succeeded: compacting an empty
        range writes it into a table and starts a new log, and the old one is deleted (a crash before that
        reopens it, and LevelDB drops a torn record at a log's end cleanly). A synced write then shows that
        LevelDB takes writes again (after a failed sync or compaction it refuses them all until reopened: the
        store stays stopped, and a restart recovers it). Block bytes past the committed end are cut away.
        """
        if not self._recoverable:
            raise StoreError("store.unwritable", f"the store takes no writes ({self._failure}); reads go on")
        free, log_bytes = self.free_bytes(), self._log_bytes()
        needed = self.min_free_bytes + log_bytes  # the memtable becomes a table about the size of the log
        if free < needed:
            raise StoreError(
                "store.unwritable",
                f"the store takes no writes after a failed one ({self._failure}): {_megabytes(free)} free, "
                f"recovering needs {_megabytes(needed)}; reads go on",
            )
        try:
            self._db.compact_range(start=_NO_KEYS[0], stop=_NO_KEYS[1])
            rotated = self._newest_log() > self._failed_log
            if rotated:  # never a write into the torn log
                self._db.delete(_PROBE_KEY, sync=True)
                self.blocks.trim()
        except (plyvel.Error, OSError) as exc:
            problem: str | None = _condition(exc)
        else:
            problem = None if rotated else "LevelDB did not start a new log"
        if problem is not None:
            log.error("%s: recovering from the failed write failed (%s); a restart recovers it", self.path, problem)
            self._recoverable = False
            self._failure = f"{self._failure}; recovering failed ({problem}): restart the node"
            raise StoreError("store.unwritable", f"the store takes no writes ({self._failure}); reads go on")
        log.warning("%s: recovered from the failed write (%s): taking writes again", self.path, self._failure)
        self._failure = None

    def _log_files(self) -> list[tuple[int, int]]:
        """LevelDB's write-ahead logs: (number, size) each."""
        found = []
        for entry in os.scandir(self.path):
            stem, _, suffix = entry.name.partition(".")
            if suffix == "log" and stem.isdigit():
                found.append((int(stem), entry.stat().st_size))
        return found

    def _newest_log(self) -> int:
        return max((number for number, _ in self._log_files()), default=0)

    def _log_bytes(self) -> int:
        return sum(size for _, size in self._log_files())

    def close(self) -> None:
        if self.key_filter is not None:
            self.key_filter.close()  # its rebuild thread reads the database
        self._db.close()
        self.blocks.close()
        self._links.close()


class Snapshot:
    """Reads of the database as it was when the snapshot was taken (LevelDB keeps those versions)."""

    def __init__(self, store: Store, snapshot: plyvel.Snapshot) -> None:
        self._store = store
        self._snapshot = snapshot

    def get(self, key: bytes) -> bytes | None:
        # the store's filter of stored keys has every committed key's bits set (before its write), so "absent" holds
        # for any snapshot: sync's checks of what is stored (most keys absent during a catch-up, several per
        # operation on the event loop) skip LevelDB as the writer's gets do
        keys = self._store.key_filter
        if keys is not None and not keys.may_hold(key):
            return None
        try:
            return self._snapshot.get(key, verify_checksums=True)
        except plyvel.Error as exc:
            raise self._store._read_error(exc) from None

    def block(self, cid: bytes) -> bytes | None:
        """The bytes of an operation stored when the snapshot was taken (block files only grow)."""
        locator = self.get(block_key(cid))
        return None if locator is None else self._store._read_block(cid, locator)

    def scan(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        try:
            yield from self._snapshot.iterator(start=start or prefix, stop=prefix_end(prefix), verify_checksums=True)
        except plyvel.Error as exc:
            raise self._store._read_error(exc) from None

    def keys(self, prefix: bytes) -> Iterator[bytes]:
        """The keys with `prefix`, in key order (the values are not copied out: a rebuild of a filter)."""
        try:
            yield from self._snapshot.iterator(
                prefix=prefix, include_value=False, fill_cache=False, verify_checksums=True
            )
        except plyvel.Error as exc:
            raise self._store._read_error(exc) from None


class Transaction:
    """Buffered writes over a Store; reads and scans see the buffer first."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._writes: dict[bytes, bytes | None] = {}
        #: per table tag (or group, `_GROUP_LENGTH`), the sorted keys written in this transaction (for merged scans)
        self._sorted: dict[bytes, list[bytes]] = {}
        self._appender = store.blocks.appender()
        self._blocks: dict[bytes, bytes] = {}  # the operations this transaction stores, by CID

    def get(self, key: bytes) -> bytes | None:
        if key in self._writes:
            return self._writes[key]
        return self._store.get(key)

    def block(self, cid: bytes) -> bytes | None:
        if cid in self._blocks:
            return self._blocks[cid]
        return self._store.block(cid)

    def put_block(self, cid: bytes, data: bytes) -> None:
        """Store an operation's bytes: into the block files at the commit, and its locator into the B table."""
        self._blocks[cid] = data
        self.put(block_key(cid), self._appender.append(data))

    def put(self, key: bytes, value: bytes | None) -> None:
        """Write `value` at `key`; None deletes.

        A key goes into the store's key filter here, not at the commit: the writer holds the GIL through
        the commit, and every query in flight waits it out: setting a batch's ~30,000 keys' bits there
        took it from ~80 to ~135 ms per 1,000 operations (at 1M).
        """
        if value is not None and self._store.key_filter is not None:
            self._store.key_filter.add(key)
        if key not in self._writes and key[0] in _SCANNABLE:
            bisect.insort(self._sorted.setdefault(key[: _GROUP_LENGTH.get(key[0], 1)], []), key)
        self._writes[key] = value

    def delete(self, key: bytes) -> None:
        self.put(key, None)

    def mark(self, marks: list[bytes]) -> list[bool]:
        """Set keys kept in the key filter alone (bucket marks; its bits are set now, and a commit that fails leaves
        harmless bits); returns, per key, whether it may have been set before (False is sure)."""
        key_filter = self._store.key_filter
        return [True] * len(marks) if key_filter is None else key_filter.add_all(marks)

    def scan(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Like Store.scan, with this transaction's writes merged in (scannable tables only)."""
        mine = self._written_in(prefix, start)
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

    def items(self, prefix: bytes, start: bytes | None = None) -> list[tuple[bytes, bytes]]:
        """The pairs `scan` yields, as one list (see `Store.keys`): a component's ~10,000 operations at 1M took
        6-10 ms through `scan`, 4.5 ms as one list. This transaction's writes are put in place one by one when
        they are few (each insertion moves the list's tail), else merged by `scan` (a rebuild writes everything)."""
        mine = self._written_in(prefix, start)
        if len(mine) > _FEW_WRITES:
            return list(self.scan(prefix, start))
        merged = self._store.items(prefix, start)
        for key in mine:
            index = bisect.bisect_left(merged, (key,))  # (key,) sorts just before (key, value)
            present = index < len(merged) and merged[index][0] == key
            if (written := self._writes[key]) is None:
                if present:
                    del merged[index]
            elif present:
                merged[index] = (key, written)
            else:
                merged.insert(index, (key, written))
        return merged

    def keys(self, prefix: bytes, start: bytes | None = None, stop: bytes | None = None) -> list[bytes]:
        """The keys `scan` yields (up to `stop`, if given), as one list (see `Store.keys`)."""
        mine = self._written_in(prefix, start, stop)
        stored = self._store.keys(prefix, start, stop)
        if not mine:
            return stored
        written = self._writes
        return sorted({key for key in stored if key not in written} | {key for key in mine if written[key] is not None})

    def _written_in(self, prefix: bytes, start: bytes | None, stop: bytes | None = None) -> list[bytes]:
        """The keys this transaction wrote (or deleted) in a scan's range, in key order."""
        if prefix[0] not in _SCANNABLE:
            raise ValueError(f"table {prefix[:1]!r} is not scannable inside a transaction")
        group = _GROUP_LENGTH.get(prefix[0], 1)
        if len(prefix) < group:
            raise ValueError(f"table {prefix[:1]!r} is scannable inside a transaction by {group - 1}-byte groups only")
        keys = self._sorted.get(prefix[:group], [])
        return keys[bisect.bisect_left(keys, start or prefix) : bisect.bisect_left(keys, stop or prefix_end(prefix))]

    def commit(self, pause: Callable[[], None] = NEVER.pause) -> None:
        """Sync the new blocks, then write everything that names them (and the files' new end) in one write
        (`pause()` between groups of puts: reads go first). Refused (`store.unwritable`) under the free-space
        reserve or after a failed write (`Store.check_writable`)."""
        self._store.check_writable(self._appender.size)
        if self._blocks:
            try:
                self._appender.flush()
            except OSError as exc:  # a torn append past the committed end: cut away before writes resume
                raise self._store._write_failed(exc, "the block files") from None
            self.put(BLOCKS_END, self._appender.end)
        self._store._apply(self._writes, pause)  # every key of it is in the key filter since its put
        if self._blocks:
            self._appender.committed()
        self._writes = {}
        self._sorted = {}
        self._blocks = {}
