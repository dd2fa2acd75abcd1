"""A node's ledger: its data directory, the single writer that ingests, and views of committed state.

Threads: one writer at a time runs `ingest` (a lock enforces it); any thread may call `view()` and
read from it while the writer works, and `nearest` to search the vector index. The writer builds
each batch on the state it last committed, writes it in one synced LevelDB write, and only then
publishes it: the vector index's backlog (an index thread inserts it), a new snapshot for views,
and the high-water mark. See docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from ledger import codec
from ledger.cid import CID
from ledger.embedder import Embedder, embedder_for, unit, unpack_float16, unpack_float16_rows
from ledger.errors import LedgerError
from ledger.index import ExactVectors, ExperienceIndex
from ledger.ingest import (
    Batch,
    Receipt,
    Submission,
    Verdict,
    WriterState,
    as_submissions,
    settle_signatures,
    triage,
)
from ledger.keyfilter import KeyFilter, covered_keys
from ledger.keys import AuthorKey
from ledger.library import Fold, Library
from ledger.merkle import TreeHead, leaf_hash, root_of_leaf_hashes, stored_size
from ledger.ops import load_stored
from ledger.params import NetworkParams
from ledger.priority import ReadPriority
from ledger.store import ReadView, Store, StoreError, Writability, write_file_atomically
from ledger.tables import NETWORK, ORDER, REBUILDING, log_key, merkle_node_key, opmeta_key, order_cid, parse_ordered_key
from ledger.validation import SignatureChecks, check_embeddings
from ledger.view import LedgerView

log = logging.getLogger(__name__)

DB_DIR = "ledger.db"
NODE_KEY = "node.key"
#: the newest signed tree head, kept outside the database as its high-water mark: a database that
#: holds less than this (a lost write-ahead log, an older copy) is refused instead of served
HEAD_FILE = "tree-head.cbor"
#: vectors inserted into the index per hold of its lock, and fewer while a read is in flight: a search waits for
#: at most one chunk. At 1M operations (~200k vectors) 32 per hold made the slowest 5% of queries spend 89% of
#: their time in `nearest`, nearly all of it waiting for the lock; 8 per hold took the queries' p99 from 50-60 to
#: 35-42 ms (windows of 20,000 operations on a copy of a 1M data directory) and costs more CPU per insert,
#: 0.9 -> 1.3-1.4 ms (~0.5 ms in a process doing nothing else, in calls of any size: likely colder caches).
#: Holds of 4 slowed the writer 12-17%.
_INDEX_CHUNK = 8
_INDEX_CHUNK_READING = 4
#: index changes committed but not yet inserted beyond which the writer waits for the index thread: it bounds
#: the memory of the backlog and the exact scoring every search adds for it (~1 ms for 4,096 vectors)
_BACKLOG_LIMIT = 4096
#: how long the writer and the index thread wait for reads in flight at a time, at most (ledger/priority.py: a
#: steady stream of reads must not starve them; the index's backlog is bounded, and the writer waits on it)
_READ_PRIORITY = 0.02
#: the mark trails the database by at most this many seconds of commits (and never a signed head)
_MARK_INTERVAL = 1.0
#: network parameters of the fold added after the first data directories were written: a directory that records
#: none of one was folded without it, and is folded again when it opens (PROTOCOL.md §7.2, §7.6)
FOLD_PARAMETERS = ("causal_horizon", "absorption_horizon")
#: start-up re-checks this many newest log entries (block present, hash right), like Bitcoin Core's -checkblocks
_RECENT_CHECK = 32
#: operations a rebuild folds again per synced write: its memory holds one chunk's operations and records
_REBUILD_CHUNK = 10_000


class Ledger:
    """The storage side of a node. Synchronous: the daemon runs `ingest` off its event loop."""

    def __init__(
        self, data_dir: Path, params: NetworkParams, store: Store, node_key: AuthorKey, embedder: Embedder
    ) -> None:
        self.data_dir = data_dir
        self.params = params
        self.store = store
        self.node_key = node_key
        self.embedder = embedder
        self.key_filter = KeyFilter(data_dir, node_key.did)
        store.key_filter = self.key_filter  # from here on every stored key of its tables sets its bits
        self.library = Library(params)
        self.library.drop_bucket_marks(store)
        self.library.list_outside(store)
        self.library.drop_vectors(store)
        self._write_lock = threading.Lock()
        #: operations taken back and folded again because a late one sorted before them, since start-up
        self.refolded = 0
        #: operations stored pending (a dependency not applied yet) since start-up: sync queues parents first, so a
        #: catch-up leaves it at 0 (when fetched chunks came in CID order, 9,955 of 10,000 waited)
        self.waited = 0
        # Invariant: _state and _snapshot describe the last committed batch; both are replaced, never
        # changed, and only by the writer after a commit (views read _snapshot from any thread).
        self._state = WriterState.read(store, stored_size(store))
        opened = store.snapshot()
        self._snapshot: ReadView = opened  # a rebuild of the library reads the database itself (`rebuild_library`)
        self._check_recent(_RECENT_CHECK)
        self._mark_lock = threading.Lock()
        # Invariant: the size of the signed head in HEAD_FILE; every head handed out is no larger
        self._mark_size = 0
        self._marked_at = 0.0
        self._check_high_water_mark()
        self._index_lock = threading.Lock()
        # Invariant (under _index_lock): the index plus the backlog is never behind a view. The backlog holds,
        # per committed batch in commit order, its changes sorted by id and its generation; `_unindexed` the
        # latest queued change per experience (None: no longer live) and `_queued` how many batches queue one;
        # `_queued_rows` the vectors of the live ones among `_unindexed`, kept as searches score them.
        self._backlog: deque[tuple[list[tuple[bytes, tuple[bytes, bytes] | None]], int]] = deque()
        self._unindexed: dict[bytes, tuple[bytes, bytes] | None] = {}
        self._queued: dict[bytes, int] = {}
        self._queued_rows = ExactVectors(params.embedding_dim, _BACKLOG_LIMIT)
        self._backlog_size = 0
        self._feeding = False  # an index thread is running (it exits when the backlog is empty)
        self._epoch = 0  # bumped by a rebuild: an index thread drops the batch it was inserting
        #: reads (searches, retrieval) in flight: the writer and the index thread let them go first
        self.reads = ReadPriority(_READ_PRIORITY)
        self._index_changed = threading.Condition(self._index_lock)
        self._index = ExperienceIndex(
            data_dir, params.embedding_model, params.embedding_dim, node_key.did, self._stored_vectors
        )
        why = self._index.load(self._state.generation)
        #: "loaded", or why the saved index could not be used and was rebuilt
        self.index_status = why or "loaded"
        if why is not None:
            self.rebuild_index(why)
        #: "loaded", or why the saved key filter could not be used and is being rebuilt (on a thread, which
        #: `Store.close` stops before the database closes; it reads the keys as they were at open, the writer
        #: adds its own)
        self.key_filter_status = self.key_filter.open(self._filter_stamp(), covered_keys(opened))

    @classmethod
    def open(
        cls,
        data_dir: Path,
        params: NetworkParams | None = None,
        embedder: Embedder | None = None,
        *,
        min_free_bytes: int = 0,
    ) -> Ledger:
        """Open a data directory, creating it when it does not exist or is empty.

        An existing directory whose database is missing, corrupt or foreign is an error: a node
        must never come up with a silently empty ledger. Writes that would leave less than `min_free_bytes`
        free are refused (`store.unwritable`, `Store.check_writable`).
        """
        data_dir = Path(data_dir)
        params = params or NetworkParams()
        embedder = embedder or embedder_for(params)  # refuses, before touching the data, a model it cannot load
        # a directory holding only the node key is one whose creation was interrupted: finish it
        fresh = not data_dir.exists() or set(os.listdir(data_dir)) <= {NODE_KEY}
        if fresh:
            data_dir.mkdir(parents=True, exist_ok=True)
            os.chmod(data_dir, 0o700)
            if not (data_dir / NODE_KEY).exists():
                AuthorKey.generate().save(data_dir / NODE_KEY)
            store = Store(data_dir / DB_DIR, create=True)
        else:
            store = Store(data_dir / DB_DIR, create=False)
        store.min_free_bytes = min_free_bytes
        try:
            node_key = AuthorKey.load(data_dir / NODE_KEY)
        except LedgerError as exc:
            store.close()
            raise StoreError(exc.code, f"node key: {exc.message}") from None
        try:
            folded_before = _check_network(store, params)
            ledger = cls(data_dir, params, store, node_key, embedder)
        except BaseException:
            store.close()
            raise
        interrupted = store.get(REBUILDING) is not None
        if folded_before:
            log.info(
                "%s: folding the library again under parameters it was folded without (%s; PROTOCOL.md §5)",
                data_dir,
                ", ".join(folded_before),
            )
        elif interrupted:
            log.info("%s: a rebuild of the library was interrupted: rebuilding it", data_dir)
        if folded_before or interrupted:
            try:
                ledger.rebuild_library()
                store.write({NETWORK: codec.encode(dataclasses.asdict(params))})  # not before: a crash folds again
            except BaseException:
                ledger.close()
                raise
        return ledger

    def close(self) -> None:
        with self._write_lock:
            try:
                _if_room("the high-water mark", self._record_high_water_mark)
                with self._index_lock:
                    while self._backlog:
                        self._index_changed.wait()
                    _if_room("the vector index", self._index.save)
                _if_room("the key filter", lambda: self.key_filter.save(self._filter_stamp()))
            finally:
                self.store.close()

    def _filter_stamp(self) -> tuple[int, int]:
        """What a saved key filter must match: a write to its tables changes the generation or the log size."""
        return self._state.generation, self._state.log_size

    def view(self) -> LedgerView:
        """Reads of the latest committed state; the view stays consistent however long it is used."""
        return LedgerView(self._snapshot, self.library, self.node_key, self.params.max_parents, self._keep_mark)

    # --- start-up checks and verification ------------------------------------------------------

    def _check_recent(self, count: int) -> None:
        size = self._state.log_size
        for position in range(max(0, size - count), size):
            self._check_entry(position)

    def _check_entry(self, position: int) -> None:
        raw = self.store.get(log_key(position))
        if raw is None:
            raise StoreError("store.corrupt", f"log entry {position} is missing")
        cid = CID(raw)
        data = self.store.block(cid.raw)
        if data is None or CID.for_block(data) != cid or self.store.get(opmeta_key(cid.raw)) is None:
            raise StoreError("store.corrupt", f"log entry {position} ({cid}): its block is missing or damaged")
        if self.store.get(merkle_node_key(0, position)) != leaf_hash(cid.raw):
            raise StoreError("store.corrupt", f"log entry {position} ({cid}): its Merkle leaf is damaged")

    def _check_high_water_mark(self) -> None:
        """Refuse a database that holds less than, or other than, the log this node last signed.

        LevelDB cannot tell that it lost its write-ahead log or was swapped for an older copy: it
        opens what is left. The node would then sign a head inconsistent with one it published.
        """
        path = self.data_dir / HEAD_FILE
        recover = (
            "restore the whole data directory from a backup, or move it away and start a new node that "
            "syncs from its peers"
        )
        try:
            mark = TreeHead.from_bytes(path.read_bytes())
        except FileNotFoundError:
            if self._state.log_size:  # written by a version that kept no mark: start keeping one
                self._record_high_water_mark()
            return
        except OSError as exc:
            raise StoreError("store.head", f"{path}: cannot read the last signed tree head ({exc.strerror})") from None
        except LedgerError as exc:
            raise StoreError("store.head", f"{path}: the last signed tree head is damaged ({exc.message})") from None
        if mark.node != self.node_key.did or not mark.verify():
            raise StoreError("store.head", f"{path}: the last signed tree head was not signed by this node's key")
        db, size = self.data_dir / DB_DIR, self._state.log_size
        if size < mark.size:
            raise StoreError(
                "store.rollback",
                f"{db}: holds {size} log entries, but this node signed a tree head of size {mark.size}: "
                "the database lost data (a deleted write-ahead log such as 000003.log, or an older copy); "
                f"{recover}",
            )
        if self.view().merkle.root(mark.size) != mark.root:
            raise StoreError(
                "store.diverged",
                f"{db}: its first {mark.size} log entries differ from those this node signed (another node's "
                f"database, or a damaged one); {recover}",
            )
        self._mark_size = mark.size

    def _record_high_water_mark(self) -> None:
        """Write the latest committed state's head as the mark (signing it is what writes it)."""
        self._latest().tree_head()
        self._marked_at = time.monotonic()

    def _keep_mark(self, head: TreeHead) -> None:
        """Before a head leaves the node, the mark on disk covers it: no later start may sign less."""
        with self._mark_lock:
            if head.size > self._mark_size:
                write_file_atomically(self.data_dir / HEAD_FILE, head.to_bytes())
                self._mark_size = head.size

    def verify(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Check everything: every table's checksums, every logged block against its CID, the Merkle root.

        Reads every key (so LevelDB verifies every block's checksum), re-hashes every logged block
        and leaf, and recomputes the root from the leaves alone.

        Takes time linear in the log (like `ipfs repo verify`); raises StoreError at the first damage.
        """
        for _ in self.store.scan(b""):  # every table
            pass
        size = self._state.log_size
        for position in range(size):
            self._check_entry(position)
            if progress and (position + 1) % 10_000 == 0:
                progress(position + 1, size)
        leaves = (self.store.get(merkle_node_key(0, position)) or b"" for position in range(size))
        if self.view().merkle.root() != root_of_leaf_hashes(leaves):
            raise StoreError("store.corrupt", "the stored Merkle subtree hashes disagree with the leaves")
        self._check_high_water_mark()

    # --- ingest (the writer) ---------------------------------------------------------------------

    def submit(self, data: bytes, expected_cid: CID | None = None) -> Receipt:
        return self.ingest([data], [expected_cid])[0]

    def ingest(
        self,
        items: Sequence[bytes | Submission],
        expected: Sequence[CID | None] | None = None,
        *,
        released: list[CID] | None = None,
    ) -> list[Receipt]:
        """Check, store, log and fold a batch in one durable write; returns after the data is synced.

        Items are operation bytes (from this process) or Submissions (with their source). An item
        that is not bytes is rejected (`ingest.type`) like any other bad operation; arguments that
        are not sequences of the right length raise IngestError. `released`, if given, receives the
        operations stored earlier that this batch applied (their last dependency arrived).
        """
        submissions = as_submissions(items, expected)
        with self._write_lock:
            self.store.check_writable()  # before any work: refused under the reserve or after a failed write
            signatures = SignatureChecks(len(submissions), self.reads.pause)
            checked = triage(submissions, self.params, self.store, signatures, self.reads.pause)
            new = [item.block for item in checked if item.block is not None]
            inconsistent = check_embeddings(new, self.embedder, self.params, self.reads.pause)  # signatures meanwhile
            settle_signatures(checked, signatures)
            for item in checked:
                if item.block is not None and item.block.cid.raw in inconsistent:
                    item.block, item.errors = None, (inconsistent[item.block.cid.raw],)
            accepted = [item.block for item in checked if item.block is not None]
            if accepted:
                batch = Batch(self.store, self.library, self._state, self.reads.pause)
                batch.store(accepted)
                self._publish(batch, batch.commit())
                if released is not None:
                    new = {block.cid.raw for block in accepted}
                    released.extend(CID(cid) for cid in batch.applied if cid not in new)
            view = self.view()
            receipts: list[Receipt] = []
            for item in checked:
                self.reads.pause()
                source = item.submission.source
                if item.first is not None:  # the same bytes came earlier in this batch: the same answer
                    first = receipts[item.first]
                    if first.verdict is not Verdict.REJECTED:
                        first = dataclasses.replace(first, verdict=Verdict.IGNORED, repeated=True)
                    receipts.append(dataclasses.replace(first, source=source))
                elif item.errors:
                    receipts.append(
                        Receipt(item.cid, Verdict.REJECTED, errors=item.errors, source=source, kind=item.kind)
                    )
                else:
                    assert item.cid is not None
                    verdict = Verdict.IGNORED if item.ignored else Verdict.ACCEPTED
                    status = view.status(item.cid)
                    # an ignored one was stored before: the library's cache may answer (`view.kind` reads)
                    kind = item.kind or self.library.meta(self._snapshot, item.cid.raw).kind
                    receipts.append(Receipt(item.cid, verdict, status, source=source, kind=kind))
            return receipts

    def _publish(self, batch: Batch, state: WriterState) -> None:
        """After the commit: the index's backlog (never behind a view), views; the mark last."""
        assert batch.fold is not None
        self.refolded += batch.fold.refolded
        self.waited += batch.waited
        self._state = state
        self._update_index(batch.fold)
        self._snapshot = self.store.snapshot()
        if time.monotonic() - self._marked_at >= _MARK_INTERVAL:  # after the commit: never ahead of the database
            _if_room("the high-water mark", self._record_high_water_mark)

    def _latest(self) -> LedgerView:
        """The writer's view: what it last committed, which views may not show yet."""
        return LedgerView(self.store, self.library, self.node_key, self.params.max_parents, self._keep_mark)

    # --- the vector index ------------------------------------------------------------------------

    def _update_index(self, fold: Fold) -> None:
        """Queue a committed batch's index changes for the index thread, which inserts them in commit order.

        HNSW inserts cost more as the index grows (0.1 ms at 5k vectors, 0.4 ms at 70k): on the
        writer's path they made ingest slow down with the library. Here the writer only queues the
        changes the fold already computed, and waits only when the backlog is over its limit.
        """
        changes = sorted(fold.changes.items())
        live = [(exp_id, change[1]) for exp_id, change in changes if change is not None]
        rows = unpack_float16_rows([values for _, values in live]) if live else None
        with self._index_lock:
            if not changes and not self._backlog:
                self._index.generation = self._state.generation
                return
            self._backlog.append((changes, self._state.generation))
            self._backlog_size += len(changes)
            for exp_id, change in changes:
                if self._unindexed.get(exp_id) is not None:
                    self._queued_rows.remove(exp_id)
                self._unindexed[exp_id] = change
                self._queued[exp_id] = self._queued.get(exp_id, 0) + 1
            if rows is not None:
                self._queued_rows.add([exp_id for exp_id, _ in live], rows)
            if not self._feeding:
                self._feeding = True
                # not a daemon: at exit the interpreter waits for the backlog instead of killing the thread mid-insert
                threading.Thread(target=self._feed, name="ledger-index").start()
            while self._backlog_size > _BACKLOG_LIMIT:
                self._index_changed.wait()

    def _feed(self) -> None:
        """The index thread: insert queued batches in commit order, a chunk per hold of the lock; exit when done.

        Each batch's changes go in the order the batch fixes (removals, then inserts by id), so the
        graph depends only on the sequence of committed batches, not on when this thread ran.
        """
        while True:
            with self._index_lock:
                if not self._backlog:
                    self._feeding = False
                    self._index_changed.notify_all()
                    return
                changes, generation = self._backlog[0]
                epoch = self._epoch
            live = [(exp_id, change) for exp_id, change in changes if change is not None]
            removals = [exp_id for exp_id, change in changes if change is None]
            try:
                start = 0
                while removals or start < len(live):
                    self.reads.pause()
                    end = start + (_INDEX_CHUNK_READING if self.reads.reading_now else _INDEX_CHUNK)
                    with self._index_lock:
                        if epoch != self._epoch:
                            break
                        self._index.update(dict(live[start:end]), removals)
                    start, removals = end, []
                with self._index_lock:
                    if epoch == self._epoch:
                        self._backlog.popleft()
                        self._forget(changes)
                        self._index.generation = generation
                        self._index_changed.notify_all()
            except Exception:  # the library is durable already; an index that fell out of step is rebuilt
                log.exception("updating the vector index failed; rebuilding it")
                with self._index_lock:
                    self._rebuild_index_locked("an update failed")

    def _forget(self, changes: list[tuple[bytes, tuple[bytes, bytes] | None]]) -> None:
        """A batch is in the index: its changes leave the backlog unless a later batch queued the same experience."""
        self._backlog_size -= len(changes)
        for exp_id, _ in changes:
            left = self._queued[exp_id] - 1
            if left:
                self._queued[exp_id] = left
            else:
                del self._queued[exp_id]
                if self._unindexed.pop(exp_id) is not None:
                    self._queued_rows.remove(exp_id)

    def nearest(self, vector: np.ndarray, count: int) -> list[tuple[CID, float]]:
        """Up to `count` experiences whose vectors are nearest `vector`, with cosine similarity.

        Covers the backlog exactly: the index's answers for experiences with a queued change are
        dropped, and the queued live vectors are scored as exact search scores them. Their rows are kept
        as batches are queued and inserted, not built by each query (~320 of them under ingest at 1M
        operations cost a query ~0.7 ms of CPU). The index may already reflect a batch newer than a
        reader's view: callers check each candidate against their view.
        """
        with self.reads.reading(), self._index_lock:
            found = self._index.search(vector, count, skip=self._unindexed)
            if len(self._queued_rows) and count > 0:
                found += self._queued_rows.search(unit(np.asarray(vector, dtype=np.float32)), count)
                found = sorted(found, key=lambda item: (-item[1], item[0]))[:count]
        return [(CID(exp_id), score) for exp_id, score in found]

    def writability(self) -> Writability:
        """Whether the store takes writes, and its free space (any thread)."""
        return self.store.writability()

    def recover(self) -> bool:
        """After a failed write, bring the store back and take writes again if there is room now; whether it
        takes writes (the writer's own next write tries the same)."""
        with self._write_lock:
            try:
                self.store.check_writable()
            except StoreError:
                return False
            return True

    def pending_count(self) -> int:
        """How many stored operations wait for dependencies (as of the last commit)."""
        return self._state.pending

    def live_count(self) -> int:
        """How many experiences are live (the index holds exactly those): cheap, unlike counting a view."""
        with self._index_lock:
            queued = sum((change is not None) - (exp_id in self._index) for exp_id, change in self._unindexed.items())
            return len(self._index) + queued

    def indexed(self) -> dict[bytes, bytes]:
        """Each experience id the vector index holds, with the version its vector comes from."""
        with self._index_lock:
            versions = self._index.versions()
            for exp_id, change in self._unindexed.items():
                if change is None:
                    versions.pop(exp_id, None)
                else:
                    versions[exp_id] = change[0]
            return versions

    def _stored_vectors(self, versions: list[bytes]) -> np.ndarray:
        """The stored embeddings of these versions: from the database as committed, which holds every version the
        index does (a block, once stored, never changes), whichever view is published."""
        rows = [unpack_float16(self.library.content(self.store, version).embedding.values) for version in versions]
        return np.stack(rows) if rows else np.empty((0, self.params.embedding_dim), dtype=np.float32)

    def _live_embeddings(self, view: LedgerView) -> Iterator[tuple[bytes, bytes, bytes]]:
        for record in view.experiences():
            if record.live:
                yield record.id.raw, record.version.raw, view.content(record.version).embedding.values

    def rebuild_index(self, why: str = "requested") -> None:
        """Index every live experience from scratch, logging progress."""
        with self._index_lock:
            self._rebuild_index_locked(why)

    def _rebuild_index_locked(self, why: str) -> None:
        """Index the latest committed library from scratch: it includes every batch in the backlog."""
        self._backlog.clear()
        self._unindexed.clear()
        self._queued.clear()
        self._queued_rows = ExactVectors(self.params.embedding_dim, _BACKLOG_LIMIT)
        self._backlog_size = 0
        self._epoch += 1
        self._index_changed.notify_all()
        latest = self._latest()
        total = sum(1 for record in latest.experiences() if record.live)
        log.info("rebuilding the vector index (%s): %d live experiences", why, total)

        def progress(done: int, of: int) -> None:
            log.info("indexed %d/%d experiences", done, of)

        self._index.rebuild(self._live_embeddings(latest), total, latest.generation, progress if total > 5000 else None)

    # --- maintenance -------------------------------------------------------------------------------

    def rebuild_library(self) -> None:
        """Fold every applied operation again from nothing: a clean rebuild of the library from the log.

        The library is cleared, then the applied operations are folded again in canonical order, a chunk per
        synced write, each on top of the ones before (as if they had arrived in that order), so memory holds
        one chunk, not the log (9.55 GB at 1M operations in one write). LevelDB drops deleted keys when it
        compacts them only if no snapshot that sees them lived while they were deleted (measured: one released
        before the compaction still keeps them); left, the fold's scans seek over the ~13 million deleted keys
        (~116 us per scan at 1M, against a few). So views read the database itself during a rebuild (the
        library as far as it is rebuilt; a rebuild runs when a data directory opens, before anyone reads it),
        and one that holds an older view keeps the deleted keys. One interrupted (a crash) is begun again by
        the next open (`REBUILDING`)."""
        with self._write_lock:
            total = sum(1 for _ in self.store.scan(ORDER))
            log.info("rebuilding the library from %d applied operations", total)
            self.store.write({REBUILDING: b""})
            self.key_filter.wait_ready()  # a rebuild of the filter reads the snapshot taken at open
            self._snapshot = self.store  # the snapshot goes
            Library.clear(self.store)
            Library.compact(self.store)
            done, after = 0, ORDER
            # the order is not cleared (the fold writes the same keys again): read a chunk at a time from where
            # the last one ended, each read with an iterator of its own
            while orders := list(itertools.islice(self.store.scan(ORDER, after + b"\x00"), _REBUILD_CHUNK)):
                after = orders[-1][0]
                chunk = [order_cid(parse_ordered_key(key)) for key, _ in orders]
                batch = Batch(self.store, self.library, self._state)
                batch.refold([(cid, load_stored(self.store.block(cid))) for cid in chunk])
                self._state = batch.commit()
                done += len(chunk)
                log.info("refolded %d/%d operations", done, total)
            self.store.write({REBUILDING: None})
            self._snapshot = self.store.snapshot()
            self.rebuild_index("the library was rebuilt")


def _if_room(what: str, write: Callable[[], None]) -> None:
    """Write a file the ledger can do without for now: the mark after a commit or at close (it may trail the
    database; a head handed out is always covered, `_keep_mark` raises instead), the vector index and the key filter
    (the next start rebuilds what does not verify). A full disk leaves the older file, and the node goes on."""
    try:
        write()
    except OSError as exc:
        log.warning("cannot write %s (%s); the next start checks the older one", what, exc.strerror)


def _check_network(store: Store, params: NetworkParams) -> list[str]:
    """A data directory belongs to one network: refuse to open it with other network parameters.

    Validity, the fold and the index all depend on them (as a blockchain node checks its genesis).
    Returns the fold's later parameters (`FOLD_PARAMETERS`) the directory was written without: its library was
    folded without them, and must be folded again.
    """
    wanted = dataclasses.asdict(params)
    raw = store.get(NETWORK)
    if raw is None:
        store.write({NETWORK: codec.encode(wanted)})
        return []
    recorded = codec.decode(raw)
    folded_before = [name for name in FOLD_PARAMETERS if name not in recorded]
    for name in folded_before:
        recorded[name] = wanted[name]
    differing = sorted(name for name in wanted.keys() | recorded.keys() if wanted.get(name) != recorded.get(name))
    if differing:
        details = ", ".join(f"{name} {recorded.get(name)!r} (asked {wanted.get(name)!r})" for name in differing)
        raise StoreError("store.network", f"{store.path}: this data directory belongs to another network: {details}")
    return folded_before
