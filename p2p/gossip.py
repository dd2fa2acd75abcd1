"""GossipSub for the ledger: one topic per network, batches of operations per message, an exception-safe
validator, and a subscription drained at once into our own bounded channel.

Every default of py-libp2p 0.8.1 that hurt us is set explicitly (../shared/notes/libp2p-0.8.1.md): spam
protection and adaptive gossip off, heartbeat 1 s, `/meshsub/1.1.0` only, and the sequence counter seeded from
`time.time_ns()` so a restarted node's messages are not dropped by peers as already seen ("equivocation").
One message costs milliseconds of CPU on every node whatever its size, so a message carries a batch.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio
from libp2p.abc import IHost, ISubscriptionAPI
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub

from ledger import codec
from ledger.errors import LedgerError

log = logging.getLogger(__name__)

#: 0.8.1 drops, silently and at the sender, an RPC over 1 MiB (rpc_queue.DefaultMaxMessageSize); keep far below
MAX_MESSAGE_BYTES = 512 * 1024
MAX_BATCH_OPS = 1000
#: operation bytes per message: the CBOR framing of a batch adds a few bytes per operation and ~100 in all
MESSAGE_BUDGET = MAX_MESSAGE_BYTES - 16 * 1024
FLUSH_DELAY = 0.03  # seconds an operation may wait for others to share its message
#: libp2p's per-peer outbound queue holds 32 and drops silently when full (rpc_queue.OutBoundQueueSize)
OUTBOUND_QUEUE = 32
ROOM_POLL = 0.002  # seconds; the queue has no "not full" event to wait on
PUBLISH_PATIENCE = 1.0  # seconds a publish waits for a slow peer's queue before that peer misses it


class GossipError(LedgerError):
    """A gossip message that is not a batch of operations; the sender is at fault."""


def topic_for(network_id: str) -> str:
    """One topic per network: peers of another network never see (or forward) our operations."""
    return f"/expledger/{network_id}/ops/1"


@dataclass(frozen=True, slots=True)
class GossipBatch:
    """One gossip message: operations, and the log its sender had when it sent them (`node` signed a head of
    `size`): a receiver that has read less of that node's log knows to sync. The hint is never trusted beyond
    that; sync asks for a signed head."""

    ops: tuple[bytes, ...]
    node: str
    size: int

    def encode(self) -> bytes:
        return codec.encode({"ops": list(self.ops), "node": self.node, "size": self.size})

    @classmethod
    def decode(cls, data: bytes) -> GossipBatch:
        try:
            record = codec.decode(data)
        except LedgerError as exc:
            raise GossipError("gossip.codec", f"message: {exc.message}") from None
        if type(record) is not dict or record.keys() != {"ops", "node", "size"}:
            raise GossipError("gossip.schema", "message: expected a map of exactly ops, node, size")
        ops, node, size = record["ops"], record["node"], record["size"]
        if type(ops) is not list or not 1 <= len(ops) <= MAX_BATCH_OPS or any(type(op) is not bytes for op in ops):
            raise GossipError("gossip.ops", f"ops: expected 1 to {MAX_BATCH_OPS} operations as byte strings")
        if type(node) is not str or not node.startswith("did:key:") or len(node) > 128:
            raise GossipError("gossip.node", "node: expected a did:key")
        if type(size) is not int or not 0 <= size < 1 << 63:
            raise GossipError("gossip.size", "size: expected a log size")
        return cls(tuple(ops), node, size)


def build_pubsub(host: IHost, topic: str) -> Pubsub:
    """GossipSub + Pubsub on `host`, signing with the host key and verifying every message (the operations
    inside keep their own author signatures); start both before `host.run()` (see `service.run_host`)."""
    router = GossipSub(
        protocols=[PROTOCOL_ID_V11],
        degree=6,
        degree_low=4,
        degree_high=12,
        heartbeat_interval=1,
        adaptive_gossip_enabled=False,
        spam_protection_enabled=False,
    )
    pubsub = Pubsub(host, router, strict_signing=True, allowed_topics={topic})
    pubsub.counter = time.time_ns()  # seqno = ++counter; 0.8.1's int(time()) repeats ids across restarts
    return pubsub


async def publish(pubsub: Pubsub, topic: str, data: bytes) -> None:
    """Publish once every peer's outbound queue has room, waiting at most PUBLISH_PATIENCE (a stalled peer then
    misses the message and sync repairs it). Bare publishes in a loop lose all but 32 of a burst."""
    with trio.move_on_after(PUBLISH_PATIENCE):
        while any(len(queue) >= OUTBOUND_QUEUE - 1 for queue in pubsub.peer_queues.values()):
            await trio.sleep(ROOM_POLL)
    await pubsub.publish(topic, data)


#: (forwarder, origin, data) -> accept? The forwarder is the connected peer that handed us the message, the
#: origin the peer that published it (its signature on the message is checked by Pubsub).
Check = Callable[[ID, ID, bytes], Awaitable[bool]]


def set_validator(pubsub: Pubsub, topic: str, check: Check) -> None:
    """Register `check` as the topic's validator. libp2p caches a reject by message id for 300 s, so reject only
    what is invalid forever, never "cannot apply yet". An exception rejects the message (a raising validator
    would otherwise end the process)."""

    async def validator(forwarder: ID, msg: rpc_pb2.Message) -> bool:
        try:
            return await check(forwarder, ID(msg.from_id), msg.data)
        except Exception:
            log.exception("the gossip validator failed on a message from %s; rejecting it", forwarder)
            return False

    pubsub.set_topic_validator(topic, validator, is_async_validator=True)


async def drain(
    subscription: ISubscriptionAPI, out: trio.MemorySendChannel[tuple[ID, bytes]], dropped: Callable[[], None]
) -> None:
    """Move messages out of libp2p's 32-entry subscription channel as they arrive (a slow reader there loses
    them silently); a full `out` drops the message and counts it: gossip is best effort, sync repairs."""
    async with out:
        while True:
            msg = await subscription.get()
            try:
                out.send_nowait((ID(msg.from_id), msg.data))
            except trio.WouldBlock:
                dropped()


class Outbox:
    """Operations waiting to be gossiped: sent as one message when it would reach MAX_MESSAGE_BYTES or `most`
    operations (MAX_BATCH_OPS at most), or FLUSH_DELAY after the first one arrived."""

    def __init__(self, send: Callable[[list[bytes]], Awaitable[None]], most: int = MAX_BATCH_OPS) -> None:
        self._send = send
        self._most = min(most, MAX_BATCH_OPS)
        self._ops: deque[bytes] = deque()
        self._bytes = 0
        self._arrived = trio.Event()
        self._full = trio.Event()

    def put(self, op: bytes) -> None:
        """Queue `op`; one too large for any message (a network may allow 1 MiB operations) is left to sync."""
        if len(op) > MESSAGE_BUDGET:
            return
        self._ops.append(op)
        self._bytes += len(op)
        self._arrived.set()
        if self._bytes >= MESSAGE_BUDGET or len(self._ops) >= self._most:
            self._full.set()

    async def run(self) -> None:
        while True:
            await self._arrived.wait()
            with trio.move_on_after(FLUSH_DELAY):
                await self._full.wait()
            self._arrived, self._full = trio.Event(), trio.Event()
            waiting = len(self._ops)  # what arrives during the sends waits for company in the next round
            while waiting:
                batch = self._take(waiting)
                waiting -= len(batch)
                await self._send(batch)

    def _take(self, most: int) -> list[bytes]:
        """The next message's operations, at most `most` (at least one: an operation is far smaller than a
        message)."""
        batch = [self._ops.popleft()]
        size = len(batch[0])
        while len(batch) < min(most, self._most) and size + len(self._ops[0]) <= MESSAGE_BUDGET:
            size += len(self._ops[0])
            batch.append(self._ops.popleft())
        self._bytes -= size
        return batch


ALLOWANCE_RATE = 50.0  # new operations per second one publisher may have every node take by gossip
ALLOWANCE_BURST = 1000  # and at once (a seed library, a learning run's output); past it, sync brings them


class Allowance:
    """A token bucket per origin: how many operations one publisher may have accepted per second (sustained) and
    at once (burst). Valid operations are the cheapest flood there is (every node stores and forwards them), so
    past its allowance an origin's messages are dropped at the first hop, unpenalised: they are valid, and sync
    still brings whatever an honest node published in a burst."""

    def __init__(
        self, rate: float = ALLOWANCE_RATE, burst: float = ALLOWANCE_BURST, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: dict[ID, tuple[float, float]] = {}  # origin -> (tokens, when)

    def take(self, origin: ID, operations: int) -> bool:
        """Spend `operations` of `origin`'s allowance; False (and nothing spent) if it has not that many left."""
        now = self._clock()
        tokens, then = self._buckets.get(origin, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        allowed = tokens >= operations
        self._buckets[origin] = (tokens - operations if allowed else tokens, now)
        if len(self._buckets) > 4096:  # forget the fullest buckets first: they are the ones back at `burst`
            for key, _ in sorted(self._buckets.items(), key=lambda item: -item[1][0])[:1024]:
                del self._buckets[key]
        return allowed


def drop_copies_in_validation(pubsub: Pubsub) -> None:
    """py-libp2p 0.8.1 marks a message seen only after its (async) validation, so the copies that other mesh peers
    forward meanwhile are each validated, delivered and forwarded again (measured among 3 nodes: 1.5 operations
    received per operation). A copy that arrives while one is in validation is dropped here, as go-libp2p does
    by marking a message seen before validating it; a copy after a failed validation is still validated."""
    push = pubsub.push_msg
    validating: set[bytes] = set()

    async def push_msg(forwarder: ID, message: rpc_pb2.Message) -> None:
        key = pubsub._msg_id_constructor(message)
        if key in validating:
            return
        validating.add(key)
        try:
            await push(forwarder, message)
        finally:
            validating.discard(key)

    pubsub.push_msg = push_msg  # type: ignore[method-assign]
