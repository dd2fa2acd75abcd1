"""Peers: one object per peer holding everything we know and decide about it (hypercore's `Peer` in
lib/replicator.js is the model), connection events from the swarm, liveness pings, and bans.

libp2p 0.8.1 has no ban by peer id (its connection gate filters IP ranges, and the pubsub blacklist leaves the
connection up), so a banned peer is blacklisted in pubsub, forgotten in the peerstore (else the swarm's
auto-connector redials it) and disconnected, now and whenever it connects again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import trio
from libp2p.abc import IHost, INetConn, INetStream, INetwork, INotifee
from libp2p.host.ping import ID as PING_PROTOCOL
from libp2p.host.ping import perform_ping_roundtrip
from libp2p.peer.id import ID
from multiaddr import Multiaddr

log = logging.getLogger(__name__)

#: penalties, in score points; a peer whose score falls to BAN_SCORE is disconnected and refused for BAN_SECONDS
PENALTY_INVALID_GOSSIP = 10.0  # a gossip message that is not a valid batch of valid operations
PENALTY_MISBEHAVIOUR = 20.0  # a sync answer no honest node sends
BAN_SCORE = -50.0
BAN_SECONDS = 600.0
SCORE_RECOVERY = 1 / 60  # points per second a penalised peer regains, up to 0
SYNC_BACKOFF_MAX = 60.0  # seconds between sync attempts with a peer whose syncs fail


@dataclass(frozen=True)
class PeerEvent:
    kind: Literal["connected", "disconnected"]
    peer: ID


class PeerEvents(INotifee):
    """Swarm notifications into a bounded trio channel. The swarm awaits every notifee inline on the connection
    path, so this one never blocks: a full channel drops the event (the peer table reconciles periodically)."""

    def __init__(self, send: trio.MemorySendChannel[PeerEvent]) -> None:
        self._send = send
        self.dropped = 0

    def _emit(self, kind: Literal["connected", "disconnected"], conn: INetConn) -> None:
        try:
            self._send.send_nowait(PeerEvent(kind, conn.muxed_conn.peer_id))
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            self.dropped += 1

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        self._emit("connected", conn)

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        self._emit("disconnected", conn)

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def listen(self, network: INetwork, multiaddr: Multiaddr) -> None:
        pass

    async def listen_close(self, network: INetwork, multiaddr: Multiaddr) -> None:
        pass


@dataclass(eq=False)
class Peer:
    """What this node knows about one peer, and the state of its exchanges with it."""

    id: ID
    addrs: list[str] = field(default_factory=list)
    connected_since: float | None = None  # wall-clock seconds
    node: str = ""  # the did:key whose log it serves (learned from its signed head)
    ops_received: int = 0  # operations it sent that this node stored
    gossip_messages: int = 0
    invalid: int = 0  # invalid messages or answers it sent
    score: float = 0.0
    scored_at: float = field(default_factory=time.monotonic)
    banned_until: float = 0.0  # monotonic
    sync_state: str = "idle"  # idle, syncing, fetching, in sync, failed: CODE
    head_size: int = 0  # the size of its newest head we verified (signed, consistent with the ones before)
    hinted_size: int = 0  # the largest log size its gossip claimed (a hint that prompts a sync round)
    missing: int = 0  # operations its last reconciliation found that this node lacked
    settled_size: int = -1  # its log size when a reconciliation last found nothing missing (same size: skip it)
    listed_size: int = -1  # its log size when a reconciliation last found operations missing here
    fetched: int = 0  # operations fetched from it by sync
    last_sync: float = 0.0  # wall-clock seconds of the last completed sync
    sync_failures: int = 0
    next_sync: float = 0.0  # monotonic: no sync before (backoff after failures)
    in_flight: int = 0  # sync requests open to it
    speaks_sync: bool = True  # False once it refused the sync protocol (a libp2p peer that is not a node), until
    # it reconnects: sync no longer asks it, and `status` does not wait for it
    ping_misses: int = 0  # pings in a row it did not answer in time
    wanted: trio.Event = field(default_factory=trio.Event)  # set: sync with it soon
    scope: trio.CancelScope | None = None  # its sync loop, while connected

    @property
    def first_round_pending(self) -> bool:
        """Connected and speaking sync, with no round completed since it connected (what it lists then, gossip
        did not bring)."""
        return self.connected_since is not None and self.speaks_sync and not self.last_sync

    def penalise(self, points: float, why: str) -> bool:
        """Lower the score (it recovers slowly); True if the peer should now be banned."""
        now = time.monotonic()
        self.score = min(0.0, self.score + (now - self.scored_at) * SCORE_RECOVERY) - points
        self.scored_at = now
        self.invalid += 1
        log.info("peer %s: %s (score %.0f)", self.id, why, self.score)
        return self.score <= BAN_SCORE

    @property
    def banned(self) -> bool:
        return self.banned_until > time.monotonic()

    def sync_failed(self, code: str) -> None:
        self.sync_failures += 1
        self.sync_state = f"failed: {code}"
        self.next_sync = time.monotonic() + min(SYNC_BACKOFF_MAX, 2.0**self.sync_failures)

    def to_json(self, connected: bool) -> dict[str, Any]:
        """`connected`: whether the swarm holds a connection to it now. The swarm drops a closed connection from
        its table ~0.1 s before it notifies the close (py-libp2p 0.8.1 resets the streams and sleeps in between),
        so `connected_since` alone showed a banned peer connected while the status counted it gone."""
        return {
            "peer_id": str(self.id),
            "addrs": self.addrs,
            "connected": connected,
            "connected_since": self.connected_since if connected else None,
            "node": self.node,
            "operations_received": self.ops_received,
            "gossip_messages": self.gossip_messages,
            "invalid": self.invalid,
            "score": round(self.score, 1),
            "banned_for": max(0.0, round(self.banned_until - time.monotonic(), 1)),
            "sync": {
                "state": self.sync_state,
                "head": self.head_size,
                "missing": self.missing,
                "fetched": self.fetched,
                "last": self.last_sync,
                "failures": self.sync_failures,
                "in_flight": self.in_flight,
            },
        }


async def ping(host: IHost, peer: ID, timeout: float) -> float:
    """Round trip in seconds; raises `trio.TooSlowError` when the peer is silent. The swarm notices a peer that
    closed its socket (~0.2 s) but not one frozen or cut off: such a peer stays "connected" until asked."""
    started = time.monotonic()
    with trio.fail_after(timeout):
        stream = await host.new_stream(peer, [PING_PROTOCOL])
        try:
            await perform_ping_roundtrip(stream)
        finally:
            with trio.CancelScope(shield=True):
                await stream.reset()
    return time.monotonic() - started
