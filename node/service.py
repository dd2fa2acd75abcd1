"""The node's core on trio: one ingest task owns every write; reads run on worker threads; events fan out.

The ledger is synchronous (plyvel). Every submission, from any source, goes into one bounded
queue; the ingest task takes what is waiting (up to `ingest.batch`) and hands it to
`Ledger.ingest` on the single writer thread, so many small submissions share one synced write
and the event loop never blocks. A full queue refuses a submission at once (`Busy`), never
silently. The queue has one lane per source, served in turn, so a flood waits behind itself.
Reads go to a separate pool of reader threads over the ledger's committed views, so a write in
progress does not delay them (measured: reads during a 200 ms write waited 202 ms with one shared
limiter, 11 ms with separate ones). Database calls are never abandoned on
cancellation: closing LevelDB under a thread still reading it crashes the process.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import trio

from ledger.cid import CID
from ledger.errors import LedgerError
from ledger.ingest import Receipt, Source, Submission, Verdict
from ledger.keys import AuthorKey
from ledger.ledger import Ledger
from ledger.local_index import LocalRetrieval
from ledger.ops import Block, Kind, Operation, sign
from ledger.retrieval import Retriever
from ledger.view import LedgerView
from node.config import Config
from node.events import EventHub
from node.metrics import NodeMetrics

log = logging.getLogger(__name__)

T = TypeVar("T")
READER_THREADS = 4
LANE_SHARE = 8  # one source may fill an eighth of the ingest queue (at least a batch)
#: seconds between two tries to take writes again after a failed write (the next write tries too)
RECOVER_INTERVAL = 2.0
#: the code of a write the store refused: free space under the reserve, or after a failed write
STORE_UNWRITABLE = "store.unwritable"


class Busy(Exception):
    """The ingest queue is full: the submission was refused, not queued."""


class Stopping(Exception):
    """The node is shutting down and takes no more submissions."""


class IngestFailed(Exception):
    """The batch holding a submission could not be written (the ledger is unchanged; the error is logged).

    `code` is `store.unwritable` when the store refused it (its message then says why, without paths: a client
    may read it), else `ingest.failed` (a bug: the message is generic, the traceback is in the log)."""

    def __init__(self, cause: BaseException) -> None:
        if isinstance(cause, LedgerError) and cause.code == STORE_UNWRITABLE:
            self.code, message = STORE_UNWRITABLE, cause.message
        else:
            self.code, message = "ingest.failed", "the write failed; the node logged why"
        super().__init__(message)


@dataclass(eq=False)
class _Waiting:
    submission: Submission
    done: trio.Event = field(default_factory=trio.Event)
    receipt: Receipt | None = None
    error: BaseException | None = None


class IngestQueue:
    """Submissions waiting for the ingest task: a first-in, first-out lane per source (the RPC clients, each
    gossip origin, each peer read by sync), served one submission per lane in turn. Bitcoin Core's message handler
    does the same for peers: a peer that floods the node with valid operations fills its own lane and waits
    behind itself, while the others' operations go into the next batch. Across lanes order is not kept; the
    ledger holds an operation whose dependencies are still queued as pending, and applies it when they arrive."""

    def __init__(self, capacity: int, lane_capacity: int) -> None:
        self.capacity = capacity
        self.lane_capacity = lane_capacity
        self._lanes: dict[str, deque[_Waiting]] = {}  # in the order they are served
        self._size = 0
        self._closed = False
        self._items = trio.lowlevel.ParkingLot()  # the ingest task, waiting for submissions
        self._room = trio.lowlevel.ParkingLot()  # senders waiting for room

    def __len__(self) -> int:
        return self._size

    def has_room(self, lane: str, count: int) -> bool:
        return self._size + count <= self.capacity and len(self._lanes.get(lane, ())) + count <= self.lane_capacity

    def put_nowait(self, lane: str, items: Sequence[_Waiting]) -> bool:
        """Queue all of `items` in `lane`, or none of them (False) if the queue or the lane has no room."""
        if self._closed:
            raise Stopping("the node is stopping")
        if not self.has_room(lane, len(items)):
            return False
        self._lanes.setdefault(lane, deque()).extend(items)
        self._size += len(items)
        self._items.unpark_all()
        return True

    async def put(self, lane: str, items: Sequence[_Waiting]) -> None:
        """Queue `items` in `lane` one by one, each as soon as there is room."""
        for item in items:
            while not self.put_nowait(lane, [item]):
                await self._room.park()

    async def take(self, most: int) -> list[_Waiting]:
        """Up to `most` submissions, one per lane in turn; [] once the queue is closed and empty."""
        while not self._size:
            if self._closed:
                return []
            await self._items.park()
        batch: list[_Waiting] = []
        while len(batch) < most and self._lanes:
            for lane in list(self._lanes):
                waiting = self._lanes[lane]
                batch.append(waiting.popleft())
                if not waiting:
                    del self._lanes[lane]
                if len(batch) == most:
                    break
        self._size -= len(batch)
        self._room.unpark_all()
        return batch

    def close(self) -> None:
        """Take no more; what is queued is still taken."""
        self._closed = True
        self._items.unpark_all()
        self._room.unpark_all()


class Node:
    """A ledger served on trio: the ingest queue and task, reader threads, operations built for clients."""

    def __init__(
        self,
        ledger: Ledger,
        author: AuthorKey,
        config: Config,
        metrics: NodeMetrics,
        hub: EventHub,
        local: LocalRetrieval | None = None,
    ) -> None:
        """`local`: the node-local retrieval model and index, if `[retrieval] model` names one."""
        self.ledger = ledger
        self.author = author
        self.config = config
        self.metrics = metrics
        self.hub = hub
        self.retriever = Retriever(ledger, local)
        self.started = time.time()
        self.params = ledger.params
        self.node_did = ledger.node_key.did
        #: called on the event loop after every ingest batch with its receipts and submitted bytes (the network
        #: gossips what was made here and releases operations that waited for what was stored)
        self.committed: list[Callable[[list[Receipt], list[bytes]], None]] = []
        self._queue = IngestQueue(config.ingest.queue, max(config.ingest.batch, config.ingest.queue // LANE_SHARE))
        self._writer = trio.CapacityLimiter(1)
        self._readers = trio.CapacityLimiter(READER_THREADS)
        metrics.ingest_queue.set_function(self.queued)  # read at each scrape, not set at each submission

    # --- writes: the queue and the ingest task ----------------------------------------------------

    async def submit(self, submission: Submission) -> Receipt:
        """Queue one submission and wait until the batch holding it is durable; its receipt then."""
        waiting = _Waiting(submission)
        if not self._queue.put_nowait(_lane(submission.source), [waiting]):
            self.metrics.ingest_refused.inc()
            raise Busy(f"the ingest queue is full ({len(self._queue)} waiting); retry later")
        await waiting.done.wait()
        if waiting.error is not None:
            raise IngestFailed(waiting.error) from waiting.error
        assert waiting.receipt is not None
        return waiting.receipt

    async def ingest(
        self,
        ops: Sequence[bytes | Block],
        source: Source,
        *,
        wait: bool,
        lane: str | None = None,
        queued: trio.Event | None = None,
    ) -> list[Receipt] | None:
        """Queue operations from the network (bytes, or Blocks the network decoded from them) and wait until they
        are durable; their receipts. With `wait` False (gossip) a lane without room for all of them refuses them
        all at once: None, nothing queued. `lane` defaults to the source's (gossip queues by origin: a flood
        forwarded by an honest peer is still the flood's). `queued` is set once they are all in the queue (or
        refused)."""
        waiting = [_Waiting(Submission.of(item, source)) for item in ops]
        lane = lane or _lane(source)
        try:
            if not wait:
                if not self._queue.put_nowait(lane, waiting):
                    self.metrics.ingest_refused.inc(len(waiting))
                    return None
            else:
                await self._queue.put(lane, waiting)
        finally:
            if queued is not None:
                queued.set()
        if waiting:
            # a lane is served in order and batches are written one after another: once the last is answered, all
            # are (one wait, not a pass through the scheduler per operation: 10,000 of a catch-up's)
            await waiting[-1].done.wait()
        for item in waiting:
            if item.error is not None:
                raise IngestFailed(item.error) from item.error
        return [item.receipt for item in waiting if item.receipt is not None]

    def view(self) -> LedgerView:
        return self.ledger.view()

    def queued(self) -> int:
        return len(self._queue)

    def close_queue(self) -> None:
        """Take no more submissions; the ingest task finishes what is queued, then returns."""
        self._queue.close()

    async def run_ingest(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The single writer: each round takes everything waiting (up to a batch, lanes in turn) into one synced
        write."""
        task_status.started()
        while batch := await self._queue.take(self.config.ingest.batch):
            await self._ingest(batch)

    async def _ingest(self, batch: list[_Waiting]) -> None:
        started = time.perf_counter()
        try:
            receipts, released = await trio.to_thread.run_sync(
                self._ingest_sync, [waiting.submission for waiting in batch], limiter=self._writer
            )
        except Exception as exc:  # a failed write changed nothing; each waiting client is told, the node goes on
            if isinstance(exc, LedgerError) and exc.code == STORE_UNWRITABLE:  # the store logged it once, not per batch
                log.debug("an ingest batch of %d submissions refused: %s", len(batch), exc.message)
            else:
                log.exception("an ingest batch of %d submissions failed", len(batch))
            for waiting in batch:
                waiting.error = exc
                waiting.done.set()
            return
        for waiting, receipt in zip(batch, receipts, strict=True):
            waiting.receipt = receipt
            waiting.done.set()
        # per batch, not per operation: this runs on the event loop, under the GIL the writer thread needs
        outcomes = Counter((receipt.source.kind, receipt.verdict.value, receipt.code or "") for receipt in receipts)
        for labels, count in outcomes.items():
            self.metrics.operations.labels(*labels).inc(count)
        accepted = [receipt for receipt in receipts if receipt.verdict is Verdict.ACCEPTED]
        if self.hub.listening:
            for receipt in accepted:
                self.hub.publish(
                    "operation", _event(receipt.cid, receipt.kind, receipt.outcome, receipt.code, receipt.source)
                )
            for event in released:
                self.hub.publish("operation", event)
        else:
            self.hub.skip(len(accepted) + len(released))
        for listener in self.committed:
            listener(receipts, [waiting.submission.data for waiting in batch])
        self.metrics.ingest_batch_size.observe(len(batch))
        self.metrics.ingest_seconds.observe(time.perf_counter() - started)

    async def recover_writes(self, stop: trio.Event) -> None:
        """While writes are stopped after a failed one, try every `RECOVER_INTERVAL` to take them again (once
        space is back), so `status` shows it without waiting for a write; returns when `stop` is set."""
        while not stop.is_set():
            with trio.move_on_after(RECOVER_INTERVAL):
                await stop.wait()
            if not stop.is_set() and self.ledger.writability().state == "stopped":
                await trio.to_thread.run_sync(self.ledger.recover, limiter=self._writer)

    def _ingest_sync(self, submissions: list[Submission]) -> tuple[list[Receipt], list[dict[str, Any]]]:
        """On the writer thread: ingest, then describe what the batch applied beyond its own submissions."""
        released: list[CID] = []
        waited = self.ledger.waited
        receipts = self.ledger.ingest(submissions, released=released)
        self.metrics.waited.inc(self.ledger.waited - waited)
        view = self.ledger.view()
        events = []
        for cid in released:
            block, status = view.block(cid), view.status(cid)
            assert block is not None and status is not None
            events.append(_event(cid, block.op.kind, status.outcome.value, status.code, Source("pending")))
        self.metrics.log_size.set(view.log_size)
        self.metrics.pending.set(self.ledger.pending_count())
        self.metrics.live_experiences.set(self.ledger.live_count())
        return receipts, events

    # --- reads on worker threads --------------------------------------------------------------

    async def read(self, function: Callable[..., T], *args: Any) -> T:
        """Run a read (of a view, the index, the embedder) on a reader thread, never on the event loop."""
        return await trio.to_thread.run_sync(partial(function, *args), limiter=self._readers)

    # --- operations made for clients ------------------------------------------------------------

    def build(self, kind: Kind, on: Sequence[CID] = (), **fields: Any) -> Block:
        """Sign an operation by this node's author that takes effect: parents are the heads, the clock is above
        every parent and of the experiences it acts `on` (on a reader thread: it reads a view)."""
        parents, clock = self.ledger.view().parents_and_clock(on)
        op = Operation(kind, self.author.did, clock, parents, int(time.time()), **fields)
        return sign(op, self.author)


def _lane(source: Source) -> str:
    return f"{source.kind}:{source.name}"


def _event(cid: CID | None, kind: Kind | None, outcome: str, code: str | None, source: Source) -> dict[str, Any]:
    return {
        "cid": str(cid),
        "kind": kind.value if kind else None,
        "outcome": outcome,
        "code": code,
        "source": source.kind,
    }
