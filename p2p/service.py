"""The p2p layer as one task of the daemon: the host, gossip in and out, sync with every peer, the peer table.

Everything a peer sends reaches the ledger through the node's single ingest queue (`LedgerPort.ingest`):
gossip is dropped and counted when that queue is full (sync repairs it), sync waits for room. Operations whose
dependencies are not stored yet wait in the orphan pool (`p2p.orphans`) instead of the ledger.

Start order matters in py-libp2p 0.8.1: Pubsub and GossipSub run before the host listens (a peer that opened a
pubsub stream in between crashed the node). The stop is by an event, not a cancellation: peers are
disconnected concurrently, then the host closed, shielded and bounded (`host.run()` alone leaks the listener).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

import trio
from libp2p.abc import IHost
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from ledger.cid import CID
from ledger.errors import LedgerError
from ledger.ingest import Receipt, Source, Verdict
from ledger.ops import Block, decode_block
from ledger.params import NetworkParams
from ledger.validation import examine
from ledger.view import LedgerView
from p2p import gossip
from p2p.counters import Counters
from p2p.discovery import TARGET_PEERS, Discovery
from p2p.fetch import Fetcher
from p2p.gossip import GossipBatch, GossipError, Outbox
from p2p.host import build_host, connect, dial_to_self, full_addrs, parse_peer_addr
from p2p.orphans import Orphan, OrphanPool
from p2p.peers import (
    BAN_SECONDS,
    PENALTY_INVALID_GOSSIP,
    PENALTY_MISBEHAVIOUR,
    Peer,
    PeerEvent,
    PeerEvents,
    ping,
)
from p2p.reconcile import SetIndex
from p2p.sync import (
    MAX_BLOCKS,
    ForkDetected,
    LogStates,
    Misbehaviour,
    SyncError,
    differences,
    fetch_blocks,
    serve,
    verify_head,
)

log = logging.getLogger(__name__)

CLOSE_TIMEOUT = 5.0  # seconds; closing sends a yamux GO_AWAY per connection, a stalled peer must not hold the stop
GOSSIP_QUEUE = 256  # received messages waiting for delivery (each at most 512 KiB)
EVENT_QUEUE = 1024
DELIVERIES = 8  # gossip messages handed to the ingest queue at once (each waits for a durable batch)
SYNCS = 4  # peers read at once
SYNC_INTERVAL = 10.0  # seconds between syncs with a peer when nothing asks for one sooner (a gossip hint does)
SYNC_SPACING = 1.0  # seconds at least between the end of one sync with a peer and the next
#: seconds a round with a peer whose log is longer than this node's waits for another such reconciliation to end
#: before reconciling alongside it: one after another, the second compares with what the first found missing and
#: lists nothing that one listed (a catch-up's first rounds with 4 peers at once each listed all 10,000
#: operations); a slow peer delays the others this much at most
RECONCILE_TURN = 2.0
DIAL_TIMEOUT = 5.0
REDIAL_MAX = 30.0  # seconds between dials of an unreachable bootstrap peer, at most
PING_INTERVAL = 10.0
PING_TIMEOUT = 10.0
PING_MISSES = 2  # unanswered pings in a row before a peer is dropped (a busy node answers late, not never)
ORPHAN_SWEEP = 30.0  # seconds between expiries of the orphan pool
#: what a sync request can get wrong that no honest node does (a stream cut short or slow may be the network's fault)
PENALISED_SYNC_ERRORS = ("sync.request", "sync.frame.too_large")
FORWARDERS = 4096  # recent gossip messages whose forwarder is remembered (to blame it for what ingest rejects)


class LedgerPort(Protocol):
    """What the p2p layer needs of the node (the node implements it; p2p never imports node)."""

    params: NetworkParams
    node_did: str

    def view(self) -> LedgerView: ...

    async def read(self, function: Callable[..., Any], *args: Any) -> Any: ...

    async def ingest(
        self,
        ops: Sequence[bytes | Block],
        source: Source,
        *,
        wait: bool,
        lane: str | None = None,
        queued: trio.Event | None = None,
    ) -> list[Receipt] | None:
        """Receipts once durable; None when the lane is full and `wait` is False (nothing was queued). `queued` is
        set once `ops` are in the queue (or refused), before they are durable. A Block is an operation decoded
        here from its bytes: the ledger checks it without decoding it again."""
        ...


def route_library_logs(level: int = logging.ERROR) -> None:
    """`import libp2p` sets its logger to propagate=False with no handler, so its records bypass the daemon's log
    format; route them through ours, at ERROR by default (it logs expected events, such as failed dials, at
    WARNING and ERROR; the node reports its own)."""
    library = logging.getLogger("libp2p")
    library.propagate = True
    library.setLevel(level)
    logging.getLogger("libp2p.network.auto_connector").setLevel(level)


@asynccontextmanager
async def run_host(host: IHost, pubsub: Pubsub, listen: Sequence[Multiaddr]) -> AsyncIterator[None]:
    """Pubsub, its router, then the host; inside the block the listeners are bound."""
    async with background_trio_service(pubsub), background_trio_service(pubsub.router), host.run(listen):
        try:
            yield
        finally:
            with trio.move_on_after(CLOSE_TIMEOUT) as scope:
                scope.shield = True
                async with trio.open_nursery() as nursery:
                    for peer in host.get_connected_peers():
                        nursery.start_soon(host.disconnect, peer)
                await host.close()
            if scope.cancelled_caught:
                log.warning("the p2p host did not close within %.0f s", CLOSE_TIMEOUT)


class P2PNode:
    """The network side of one node. `await nursery.start(p2p.run)` returns its multiaddrs once listening;
    `p2p.stop.set()` ends it gracefully. The node calls `committed` after every ingest batch."""

    def __init__(
        self,
        keys: KeyPair,
        listen: Sequence[str],
        bootstrap: Sequence[str],
        ledger: LedgerPort,
        states: LogStates,
        gossip_batch: int = gossip.MAX_BATCH_OPS,
        allowance: gossip.Allowance | None = None,
        target_peers: int = TARGET_PEERS,
    ) -> None:
        self.listen = [Multiaddr(addr) for addr in listen]
        self.bootstrap = list(bootstrap)
        self.ledger = ledger
        self.states = states
        self.host = build_host(keys, self.listen)
        self.id = self.host.get_id()
        self.topic = gossip.topic_for(ledger.params.network_id)
        self.pubsub = gossip.build_pubsub(self.host, self.topic)
        gossip.drop_copies_in_validation(self.pubsub)
        gossip.set_validator(self.pubsub, self.topic, self._check_gossip)
        self.stop = trio.Event()
        self.addrs: list[str] = []
        self.counters = Counters()
        self.orphans = OrphanPool()
        self.peers: dict[ID, Peer] = {}
        self.outbox = Outbox(self._publish, gossip_batch)
        self.allowance = allowance or gossip.Allowance()
        self._forwarders: OrderedDict[bytes, ID] = OrderedDict()
        #: CIDs handed to the ingest queue and not yet answered (a dependency on one of them is not missing)
        self._queued: Counter[bytes] = Counter()
        self._gossip_send, self._gossip_receive = trio.open_memory_channel[tuple[ID, bytes]](GOSSIP_QUEUE)
        self._events_send, self._events_receive = trio.open_memory_channel[PeerEvent](EVENT_QUEUE)
        self._released_send, self._released_receive = trio.open_memory_channel[Orphan](math.inf)
        self._notifee = PeerEvents(self._events_send)
        self.host.get_network().register_notifee(self._notifee)
        self._deliveries = trio.Semaphore(DELIVERIES)  # acquired by the receiver, released by the delivery
        self._syncs = trio.CapacityLimiter(SYNCS)
        self._reconciling = trio.Lock()  # one reconciliation at a time (RECONCILE_TURN)
        self.index = SetIndex()
        self.fetcher = Fetcher(
            self.host,
            self._usable,
            self._ask_everyone,
            ledger.view,
            self.counters,
            self.peer,
            self._queued,
            self._admit,
            self._submit,
            self._penalise,
        )
        self._nursery: trio.Nursery | None = None
        serve(self.host, ledger.view, ledger.read, self._served, self.index)
        self.discovery = Discovery(
            self.host,
            lambda: self.addrs,
            self._refused,
            self.connect,
            self._connected_since,
            target_peers,
            self._needed,
        )

    # --- running -----------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        async with run_host(self.host, self.pubsub, self.listen):
            subscription = await self.pubsub.subscribe(self.topic)
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(gossip.drain, subscription, self._gossip_send, self._count_dropped)
                nursery.start_soon(self._receive_gossip)
                nursery.start_soon(self.outbox.run)
                nursery.start_soon(self._watch_peers)
                nursery.start_soon(self._deliver_released)
                nursery.start_soon(self._ping_peers)
                nursery.start_soon(self._sweep_orphans)
                nursery.start_soon(self.fetcher.run)
                if self.discovery.target:
                    nursery.start_soon(self.discovery.run)
                for addr in self.bootstrap:
                    nursery.start_soon(self._keep_connected, addr)
                self.addrs = full_addrs(self.host)
                task_status.started(self.addrs)
                await self.stop.wait()
                nursery.cancel_scope.cancel()

    def peer(self, peer_id: ID) -> Peer:
        if peer_id not in self.peers:
            self.peers[peer_id] = Peer(peer_id)
        return self.peers[peer_id]

    def connected(self) -> list[Peer]:
        return [self.peer(peer_id) for peer_id in self.host.get_connected_peers()]

    def records(self) -> list[dict[str, Any]]:
        """Every peer this node knows of, connected ones first, as the `peers` method shows them: connected means
        the swarm holds a connection now, as in `sync_status`, so the two never disagree."""
        connected = set(self.host.get_connected_peers())
        listed = sorted(self.peers.values(), key=lambda peer: (peer.id not in connected, str(peer.id)))
        return [peer.to_json(peer.id in connected) for peer in listed]

    def is_connected(self, peer_id: ID) -> bool:
        """Whether the swarm holds a connection to `peer_id` now (its table, not the close notifications)."""
        return peer_id in self.host.get_connected_peers()

    def _usable(self) -> set[ID]:
        """The connected peers sync may open streams on: not those discovery is closing."""
        return set(self.host.get_connected_peers()) - self.discovery.closing

    def _needed(self) -> set[ID]:
        """The peers discovery must not close now: those sync is reading, and those that listed operations this
        node still has to fetch."""
        return {peer.id for peer in self.peers.values() if peer.in_flight} | self.fetcher.holders()

    def _ask_everyone(self) -> None:
        """Wanted operations lost their last peer: reconcile with every usable peer soon (each round still waits
        out its peer's backoff), rather than when each one's interval ends."""
        usable = self._usable()
        for peer in self.connected():
            if peer.id in usable and peer.speaks_sync:
                peer.wanted.set()

    # --- the node's side ------------------------------------------------------------------------------

    def committed(self, receipts: Sequence[Receipt], data: Sequence[bytes]) -> None:
        """After an ingest batch: gossip the new operations made here (RPC, curator), forget as missing what is now
        stored, release orphans whose dependencies are now stored. `data[i]` is the submission behind `receipts[i]`."""
        stored = []
        for receipt, op in zip(receipts, data, strict=True):
            if receipt.cid is None or receipt.verdict is Verdict.REJECTED:
                continue
            stored.append(receipt.cid.raw)
            self.fetcher.stored(receipt.cid.raw)
            if receipt.verdict is Verdict.ACCEPTED and not receipt.source.from_peer:
                self.outbox.put(op)
        for orphan in self.orphans.release(stored):
            self._released_send.send_nowait(orphan)

    async def connect(self, addr: str) -> ID:
        peer_id = await connect(self.host, addr, DIAL_TIMEOUT)
        self.peer(peer_id).addrs = [addr]
        self.discovery.book.learn(peer_id, [addr])
        return peer_id

    def _refused(self, peer_id: ID) -> bool:
        return peer_id in self.peers and self.peers[peer_id].banned

    def _connected_since(self, peer_id: ID) -> float | None:
        return self.peers[peer_id].connected_since if peer_id in self.peers else None

    async def disconnect(self, peer_id: ID) -> None:
        await self.host.disconnect(peer_id)

    def sync_status(self) -> dict[str, Any]:
        """In sync when every connected peer that speaks sync has been reconciled with since it connected and
        nothing it listed (found missing, or fetched and waiting for ingest), nor anything an orphan waits for, is
        missing here."""
        connected = self.connected()
        unreconciled = sum(1 for peer in connected if not peer.last_sync and peer.speaks_sync)
        behind = self.fetcher.behind + len(self.orphans)
        return {
            "state": "in sync" if behind == 0 and unreconciled == 0 else "catching up",
            "behind": behind,
            "stranded": len(self.fetcher.stranded),  # of those, found missing with no usable peer that listed them
            "unreconciled": unreconciled,
            "rounds": self.counters.sync_rounds,
            "fetched": self.counters.sync_fetched,
            "duplicates": self.counters.sync_duplicates,
            "peers": len(connected),
            "orphans": len(self.orphans),
        }

    def gauges(self) -> dict[str, float]:
        """What a metrics scrape shows of the network now (the counters are `counters`)."""
        sync = self.sync_status()
        peers = list(self.peers.values())
        return {
            "peers_connected": sync["peers"],
            "peers_banned": sum(1 for peer in peers if peer.banned),
            "sync_behind": sync["behind"],
            "orphans_waiting": len(self.orphans),
        }

    def counter_values(self) -> dict[str, int]:
        """The network's counters for a metrics scrape: messages, operations, syncs, forks, dropped orphans."""
        return {**vars(self.counters), "orphans_evicted": self.orphans.evicted, "orphans_expired": self.orphans.expired}

    def describe(self) -> dict[str, Any]:
        return {
            "peer_id": str(self.id),
            "addrs": self.addrs,
            "topic": self.topic,
            "sync": self.sync_status(),
            "counters": vars(self.counters),
            "orphans": {"waiting": len(self.orphans), "evicted": self.orphans.evicted, "expired": self.orphans.expired},
            "discovery": {
                "target": self.discovery.target,
                "known": len(self.discovery.book.known),
                "exchanges": self.discovery.exchanges,
            },
        }

    # --- gossip ----------------------------------------------------------------------------------

    async def _publish(self, ops: list[bytes]) -> None:
        view = self.ledger.view()
        batch = GossipBatch(tuple(ops), self.ledger.node_did, view.log_size)
        await gossip.publish(self.pubsub, self.topic, batch.encode())
        self.counters.gossip_sent += 1
        self.counters.operations_gossiped += len(ops)

    async def _check_gossip(self, forwarder: ID, origin: ID, data: bytes) -> bool:
        """The stateless front of ingest, before a message is accepted or forwarded: the batch's shape, then the
        origin's allowance, then every operation not already stored (codec, schema, text rules, signature), on a
        reader thread."""
        if forwarder == self.id:
            return True
        peer = self.peer(forwarder)
        if peer.banned:
            return False
        try:
            batch = GossipBatch.decode(data)
        except GossipError as exc:
            await self._penalise(peer, PENALTY_INVALID_GOSSIP, f"invalid gossip ({exc})")
            self.counters.gossip_rejected += 1
            return False
        view = self.ledger.view()
        new = [op for op in batch.ops if not view.has(CID.for_block(op))]
        if new and not self.allowance.take(origin, len(new)):
            self.counters.gossip_throttled += 1
            return False
        error = await self.ledger.read(_first_error, new, self.ledger.params) if new else None
        if error is not None:
            await self._penalise(peer, PENALTY_INVALID_GOSSIP, f"gossip with an invalid operation ({error})")
            self.counters.gossip_rejected += 1
            return False
        self._forwarders[_digest(data)] = forwarder
        while len(self._forwarders) > FORWARDERS:
            self._forwarders.popitem(last=False)
        return True

    def _count_dropped(self) -> None:
        self.counters.gossip_dropped += 1

    async def _receive_gossip(self) -> None:
        async with trio.open_nursery() as nursery:
            async for origin, data in self._gossip_receive:
                if origin == self.id:
                    continue
                self.counters.gossip_received += 1
                await self._deliveries.acquire()
                nursery.start_soon(self._deliver_gossip, origin, data)

    async def _deliver_gossip(self, origin: ID, data: bytes) -> None:
        try:
            batch = GossipBatch.decode(data)  # the validator accepted it
            self.counters.gossip_operations_received += len(batch.ops)
            self.counters.gossip_bytes_received += len(data)
            forwarder = self._forwarders.get(_digest(data))
            peer = self.peers.get(forwarder) if forwarder is not None else None
            if peer is not None:
                peer.gossip_messages += 1
            for candidate in self.connected():  # its sender's log grew: reconcile with it soon
                if candidate.node == batch.node and batch.size > max(candidate.head_size, candidate.hinted_size):
                    candidate.hinted_size = batch.size
                    candidate.wanted.set()
            # named by who handed it over: that is the peer to ask for what its operations miss
            sender = str(forwarder) if forwarder is not None else str(origin)
            rejected = await self._deliver(
                list(batch.ops), Source("gossip", sender), peer, wait=False, lane=f"gossip:{origin}"
            )
            if rejected and peer is not None:
                await self._penalise(peer, PENALTY_INVALID_GOSSIP, f"gossip with {rejected} operations ingest rejected")
        except Exception:  # one message must not end the node: log it, drop it (sync delivers it again)
            log.exception("delivering a gossip message from %s failed", origin)
        finally:
            self._deliveries.release()

    # --- delivery into the ledger -------------------------------------------------------------------

    async def _deliver(
        self, ops: list[bytes], source: Source, peer: Peer | None, *, wait: bool, lane: str | None = None
    ) -> int:
        """Hand `ops` to the ingest queue (in `lane`, by default the source's), keeping back (as orphans) those
        whose dependencies are neither stored, nor on their way to the ledger, nor among `ops` themselves (in any
        order: one batch applies them together); returns how many the ledger rejected.

        "On their way" matters: gossip messages are delivered concurrently, so a child's message is often checked
        before its parent's batch commits; a child queued after its parent applies with it or, if its lane is
        served first, waits in the ledger as pending until the parent's batch commits."""
        ready, present = self._admit(ops, source)
        return await self._submit(ready, present, source, peer, wait=wait, lane=lane)

    def _admit(
        self, ops: list[bytes], source: Source, cids: Sequence[bytes] | None = None
    ) -> tuple[list[bytes | Block], set[bytes]]:
        """The first half of `_deliver`, with no await: what goes to the ledger now (decoded, as Blocks, but for
        bytes that do not decode; which are operations, now counted as on their way), the rest into the orphan
        pool. `cids`: the binary CIDs of `ops`, when the caller computed them already (the fetcher checked them)."""
        view = self.ledger.view()

        def here(cid: bytes) -> bool:
            return cid in self._queued or view.has(CID(cid))

        ready: list[bytes | Block] = []
        candidates: dict[bytes, Block] = {}
        for data, cid in zip(ops, cids or [CID.for_block(data).raw for data in ops], strict=True):
            if cid in candidates or here(cid):
                continue
            # an orphan that arrives again is checked afresh: its dependencies may have come with it
            self.orphans.take(cid)
            try:
                candidates[cid] = decode_block(data)
            except LedgerError:
                ready.append(data)  # the ledger rejects it with the precise error, and the sender is blamed
        missing = {
            cid: {d.raw for d in block.op.dependencies if d.raw not in candidates and not here(d.raw)}
            for cid, block in candidates.items()
        }
        needed_by: dict[bytes, list[bytes]] = {}
        for cid, block in candidates.items():
            for dependency in block.op.dependencies:
                if dependency.raw in candidates:
                    needed_by.setdefault(dependency.raw, []).append(cid)
        waiting = [cid for cid, gone in missing.items() if gone]
        orphaned = set(waiting)
        while waiting:  # whatever needs an orphan waits too
            for child in needed_by.get(waiting.pop(), ()):
                if child not in orphaned:
                    orphaned.add(child)
                    waiting.append(child)
        now = time.monotonic()
        present: set[bytes] = set()
        for cid, block in candidates.items():
            if cid in orphaned:
                absent = missing[cid] | {d.raw for d in block.op.dependencies if d.raw in orphaned}
                self.orphans.add(Orphan(cid, block.data, absent, block.op.author, source.name, source.kind, now))
            else:
                ready.append(block)
                present.add(cid)
        self._queued.update(present)
        return ready, present

    async def _submit(
        self,
        ready: list[bytes | Block],
        present: set[bytes],
        source: Source,
        peer: Peer | None,
        *,
        wait: bool,
        lane: str | None = None,
        queued: trio.Event | None = None,
    ) -> int:
        """The second half of `_deliver`: into the ingest queue; how many the ledger rejected."""
        if not ready:
            return 0
        try:
            receipts = await self.ledger.ingest(ready, source, wait=wait, lane=lane, queued=queued)
        finally:
            self._queued.subtract(present)
            for cid in present:
                if self._queued[cid] <= 0:
                    del self._queued[cid]
        if receipts is None:
            self.counters.gossip_dropped += 1
            return 0
        accepted = sum(1 for r in receipts if r.verdict is Verdict.ACCEPTED)
        if peer is not None:
            peer.ops_received += accepted
        return sum(1 for r in receipts if r.verdict is Verdict.REJECTED)

    async def _deliver_released(self) -> None:
        """Orphans whose dependencies arrived, delivered together (in arrival order) as they come."""
        async for first in self._released_receive:
            released = [first]
            while True:
                try:
                    released.append(self._released_receive.receive_nowait())
                except trio.WouldBlock:
                    break
            by_source: dict[tuple[str, str], list[bytes]] = {}
            for orphan in released:
                by_source.setdefault((orphan.source, orphan.peer), []).append(orphan.data)
            for (kind, name), ops in by_source.items():
                try:
                    await self._deliver(ops, Source(kind, name), None, wait=True)
                except Exception:  # an orphan lost here comes again through sync
                    log.exception("delivering %d operations whose dependencies arrived failed", len(ops))

    async def _sweep_orphans(self) -> None:
        while True:
            await trio.sleep(ORPHAN_SWEEP)
            if expired := self.orphans.expire():
                log.info("dropped %d operations whose dependencies did not arrive in time", expired)

    # --- sync ----------------------------------------------------------------------------------------

    def _served(self, peer: ID, outcome: str) -> None:
        self.counters.sync_served += 1
        if outcome.startswith(PENALISED_SYNC_ERRORS) and not self.peer(peer).banned:
            peer_record = self.peer(peer)
            if peer_record.penalise(PENALTY_MISBEHAVIOUR, f"a malformed sync request ({outcome})") and self._nursery:
                self._nursery.start_soon(self.ban, peer_record, BAN_SECONDS, "malformed sync requests")

    async def _sync_loop(self, peer: Peer) -> None:
        while True:
            with trio.move_on_after(SYNC_INTERVAL):
                await peer.wanted.wait()
            if (backoff := peer.next_sync - time.monotonic()) > 0:
                await trio.sleep(backoff)
            peer.wanted = trio.Event()
            if not peer.speaks_sync or peer.id in self.discovery.closing:
                continue
            async with self._syncs:
                try:
                    await self.sync_with(peer)
                except Exception:  # a bug in one exchange must not end the node; the next round retries
                    log.exception("sync with %s failed", peer.id)
                    peer.sync_failed("sync.internal")

    async def sync_with(self, peer: Peer) -> None:
        """One round: verify the peer's signed head against the last one of its node (a fork is caught here),
        reconcile our sets to learn what it holds that we lack (fetched afterwards, each operation from one
        peer, by `self.fetcher`), then fetch what orphans from it and pending operations still miss."""
        peer.sync_state, peer.in_flight = "syncing", peer.in_flight + 1
        started, outcome = time.monotonic(), "cut short (the peer left or the node stops)"
        try:
            head = await verify_head(self.host, peer.id, self.states)
            peer.node, peer.head_size = head.node, head.size
            outcome = f"head {head.size}, unchanged since nothing was missing"
            if head.size == peer.listed_size and self.fetcher.listed_by(peer.id):
                # its log is its set: listing the same size again, while what it listed is still being fetched,
                # finds nothing new (at the 10 s round of a 10,000-operation catch-up, 4 peers listed all of it
                # again on the event loop the writer shares)
                outcome = f"head {head.size}, unchanged while what it listed is fetched"
            elif head.size != peer.settled_size:
                found, peer.missing = await self._reconcile(peer, head.size)
                peer.settled_size = -1 if peer.missing else head.size
                peer.listed_size = head.size if peer.missing else -1
                outcome = f"head {head.size}, {len(found)} listed, {peer.missing} missing here"
            # what orphans from this peer wait for, and what operations stored pending (submitted over RPC) wait for
            pending = await self.ledger.read(lambda: sorted(cid.raw for cid in self.ledger.view().missing()))
            missing = sorted(set(self.orphans.missing_from(str(peer.id))) | set(pending[:MAX_BLOCKS]))[:MAX_BLOCKS]
            if missing:
                found_blocks = await fetch_blocks(self.host, peer.id, [CID(raw) for raw in missing])
                await self._deliver(list(found_blocks.values()), Source("sync", str(peer.id)), peer, wait=True)
                outcome += f", {len(found_blocks)} of {len(missing)} dependencies fetched"
            peer.sync_state = "fetching" if peer.missing else "in sync"
            peer.sync_failures, peer.last_sync = 0, time.time()
            # gossip hints at a grown log with nearly every message under load, and gossip itself delivers most of
            # it: one round a second at most is enough to repair what gossip lost
            peer.next_sync = time.monotonic() + SYNC_SPACING
        except ForkDetected as fork:
            self.counters.forks += 1
            where = self.states.record_fork(fork) if "earlier" in fork.evidence else None
            log.error("peer %s: %s; evidence in %s; refusing it", peer.id, fork.message, where)
            peer.sync_failed(fork.code)
            outcome = f"failed: {fork.code}"
            await self.ban(peer, math.inf, "it serves a forked log")
        except Misbehaviour as exc:
            peer.sync_failed(exc.code)
            outcome = f"failed: {exc}"
            await self._penalise(peer, PENALTY_MISBEHAVIOUR, f"sync: {exc}")
        except (SyncError, LedgerError) as exc:
            peer.sync_failed(exc.code)
            outcome = f"failed: {exc}"
            peer.speaks_sync = exc.code != "sync.unsupported"
        finally:
            peer.in_flight -= 1
            # one line per round, so that a node that stays behind shows which rounds failed and why
            log.info(
                "sync round with %s: %s (%.1f s; %d failed in a row, next in %.0f s; %d wanted here, %d stranded)",
                peer.id,
                outcome,
                time.monotonic() - started,
                peer.sync_failures,
                max(0.0, peer.next_sync - time.monotonic()),
                len(self.fetcher.wanted),
                len(self.fetcher.stranded),
            )

    async def _reconcile(self, peer: Peer, size: int) -> tuple[list[tuple[int, bytes]], int]:
        """What `peer` (whose log holds `size` operations) lists (ranges where it differs from what this node holds
        or is getting) and how many operations it holds that are missing here. A peer with a longer log than this
        node's may list many: it waits for the reconciliation in progress with another peer, if any, to end (or
        RECONCILE_TURN to pass); the others do not wait."""
        turn = False
        if size > self.ledger.view().log_size:
            with trio.move_on_after(RECONCILE_TURN):
                await self._reconciling.acquire()
                turn = True
        try:
            view = self.ledger.view()
            await self.index.follow(view, self.ledger.read)
            covered: list[tuple[int, int]] = []
            found = await differences(self.host, peer.id, self.index, self.fetcher.on_the_way.index, covered)
            self.counters.sync_rounds += 1
            missing = self.fetcher.want(found, peer.id, view, first_round=peer.first_round_pending)
            return found, missing + self.fetcher.held_by(covered, peer.id)
        finally:
            if turn:
                self._reconciling.release()

    # --- peers -----------------------------------------------------------------------------------------

    async def _penalise(self, peer: Peer, points: float, why: str) -> None:
        if peer.banned:
            return
        if peer.penalise(points, why):
            await self.ban(peer, BAN_SECONDS, why)

    async def ban(self, peer: Peer, seconds: float, why: str) -> None:
        """Disconnect `peer` and refuse it for `seconds`: its gossip is ignored, its connections closed."""
        already = peer.banned
        peer.banned_until = max(peer.banned_until, time.monotonic() + seconds)
        if already:  # one ban at a time: a second disconnect would race the first
            return
        log.warning("banning peer %s for %s: %s", peer.id, "ever" if math.isinf(seconds) else f"{seconds:.0f} s", why)
        # not pubsub.add_to_blacklist: in 0.8.1 it starts a teardown task that `del`s the peer after an await, and
        # a second teardown (or the disconnect's own clean-up) then raises KeyError in a Pubsub task, ending the node;
        # the disconnect below clears pubsub's state for the peer itself
        self.pubsub.blacklisted_peers.add(peer.id)
        self.host.get_peerstore().clear_addrs(peer.id)
        await self.host.disconnect(peer.id)

    async def _watch_peers(self) -> None:
        assert self._nursery is not None
        async for event in self._events_receive:
            peer = self.peer(event.peer)
            if event.kind == "connected":
                if peer.banned:
                    await self.host.disconnect(peer.id)
                    continue
                self.pubsub.remove_from_blacklist(peer.id)  # a ban that expired
                if peer.scope is None:
                    peer.connected_since, peer.last_sync, peer.settled_size, peer.listed_size = time.time(), 0.0, -1, -1
                    # a new connection: what failed on the last one (often closed by a trim) says nothing of it
                    peer.speaks_sync, peer.sync_failures, peer.next_sync = True, 0, 0.0
                    self.discovery.connected(peer.id)
                    peer.wanted.set()
                    self._nursery.start_soon(self._run_peer, peer)
            elif not self.is_connected(peer.id):
                peer.connected_since = None
                if peer.scope is not None:
                    peer.scope.cancel()

    async def _run_peer(self, peer: Peer) -> None:
        with trio.CancelScope() as peer.scope:
            try:
                await self._sync_loop(peer)
            finally:
                peer.scope = None

    async def _keep_connected(self, addr: str) -> None:
        """Dial a bootstrap peer at start and whenever it is not connected while this node has no peer, or fewer
        than discovery's target and none other in its book to dial (always without discovery), backing off while
        it is unreachable. (Not whenever below the target: the bootstrap node of 50 closes surplus connections,
        and everyone it let go redialled it at once, each new connection's handshakes and first sync round adding
        to the load of the node that was already the busiest.)"""
        peer_id, multiaddr = parse_peer_addr(addr)
        refusal = dial_to_self(self.host, peer_id, multiaddr)
        if refusal is not None:
            log.info("bootstrap peer %s is not dialled: %s", addr, refusal)
            return
        self.peer(peer_id).addrs = [addr]
        self.discovery.book.learn(peer_id, [addr])
        backoff = 1.0
        while True:
            peer = self.peer(peer_id)
            target, connected = self.discovery.target, self.host.get_connected_peers()
            others = bool(connected) and bool(self.discovery.book.candidates({*connected, peer_id}))
            enough = target > 0 and (len(connected) >= target or others)
            if self.is_connected(peer_id) or peer.banned or enough:
                await trio.sleep(1.0)
                continue
            try:
                await connect(self.host, addr, DIAL_TIMEOUT)
                backoff = 1.0
            except Exception as exc:  # libp2p raises many types for a failed dial; each means retry
                log.info("cannot reach bootstrap peer %s (%s); retrying in %.0f s", addr, exc, backoff)
                await trio.sleep(backoff)
                backoff = min(REDIAL_MAX, backoff * 2)

    async def _ping_peers(self) -> None:
        """A frozen or cut-off peer stays "connected" for libp2p; one that does not answer a ping is dropped."""

        async def check(peer_id: ID) -> None:
            peer = self.peer(peer_id)
            if time.time() - peer.last_sync < PING_INTERVAL:  # it answered a sync round just now: alive
                peer.ping_misses = 0
                return
            try:
                await ping(self.host, peer_id, PING_TIMEOUT)
                peer.ping_misses = 0
            except trio.TooSlowError:
                peer.ping_misses += 1
                if peer.ping_misses >= PING_MISSES:
                    log.info("peer %s missed %d pings of %.0f s: disconnecting", peer_id, PING_MISSES, PING_TIMEOUT)
                    peer.ping_misses = 0
                    await self.host.disconnect(peer_id)
            except Exception as exc:  # the connection is going away; the next round sees it
                log.debug("ping to %s failed: %s", peer_id, exc)

        while True:
            await trio.sleep(PING_INTERVAL)
            async with trio.open_nursery() as nursery:
                for peer_id in self.host.get_connected_peers():
                    nursery.start_soon(check, peer_id)


def _first_error(ops: list[bytes], params: NetworkParams) -> str | None:
    for op in ops:
        _, errors = examine(op, params)
        if errors:
            return str(errors[0])
    return None


def _digest(data: bytes) -> bytes:
    return CID.for_block(data).raw
