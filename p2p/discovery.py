"""Peer discovery: a node that knows one peer comes to know the others, and keeps about TARGET_PEERS connections.

Protocol `/expledger/peers/1`, one exchange per stream, each side one frame (sync's framing): the asker sends
`{addrs}`, its own listen multiaddrs; the answer is `{addrs, peers}`, the answerer's own and up to MAX_SHARED of
its connected peers as `[peer id bytes, [multiaddr, ...]]`. Every multiaddr must end in `/p2p/` + the id it is
given for; nothing else is trusted: dialing a peer runs Noise, which proves its id, so a wrong address only fails.

Why our own exchange and not what py-libp2p 0.8.1 offers (docs/PROTOCOL.md §10.6 has the figures): GossipSub's
peer exchange is sent only with a PRUNE, i.e. when a mesh is oversubscribed, so a node that knows one peer is never
told of others in a small network; the Kademlia DHT's random walk connects as a side effect of lookups, keeps no
degree and adds its own background tasks and routing traffic to every node; mDNS cannot be confined to loopback.

The address book is bounded (MAX_KNOWN) and scored by failed dials: a peer that failed is redialled with a
backoff, and the worst is forgotten first. While a node has fewer connections than its target (`[p2p] peers`) it
asks a peer for its peers and dials the ones it is not connected to; it exchanges once with every new connection
(so both sides learn each other's listen addresses); above SURPLUS times the target it closes the newest surplus
connections that are older than TRIM_GRACE. A node whose every peer died redials its bootstrap peers
(p2p/service.py) and everyone in its book.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.network.stream.exceptions import StreamError
from libp2p.peer.id import ID

from ledger import codec
from ledger.errors import LedgerError
from p2p.host import parse_peer_addr
from p2p.sync import FrameReader, SyncError, frame

log = logging.getLogger(__name__)

PEERS_PROTOCOL = TProtocol("/expledger/peers/1")
TARGET_PEERS = 8  # connections a node dials up to, by default (GossipSub's mesh degree is 6: it needs a few more)
SURPLUS = 3  # above SURPLUS x the target, the newest connections are closed
MAX_KNOWN = 256  # peers in the address book
MAX_SHARED = 32  # peers in one answer
MAX_ADDRS = 4  # addresses per peer
MAX_MESSAGE = 16 * 1024
INTERVAL_BELOW = 1.0  # seconds between rounds while below the target and rounds find something
INTERVAL_AT = 10.0  # seconds between rounds at or above it (and at most, below it)
EXCHANGE_TIMEOUT = 5.0
TRIM_GRACE = 30.0  # seconds a connection is kept before it may be closed as surplus
BACKOFF_MAX = 60.0  # seconds between dials of a peer that keeps failing


@dataclass
class Known:
    """A peer in the address book."""

    addrs: list[str]
    failures: int = 0  # dials in a row that failed
    next_dial: float = 0.0  # monotonic: not before


class AddressBook:
    """Where peers listen, bounded: a full book forgets the peer with the most failed dials."""

    def __init__(self, own: ID) -> None:
        self.own = own
        self.known: dict[ID, Known] = {}

    def learn(self, peer: ID, addrs: Sequence[str]) -> None:
        if peer == self.own or not addrs:
            return
        entry = self.known.get(peer)
        if entry is not None:
            entry.addrs = list(dict.fromkeys([*addrs, *entry.addrs]))[:MAX_ADDRS]
            return
        if len(self.known) >= MAX_KNOWN:
            worst = max(self.known, key=lambda other: (self.known[other].failures, str(other)))
            if self.known[worst].failures == 0:
                return  # a full book of working peers keeps them
            del self.known[worst]
        self.known[peer] = Known(list(addrs)[:MAX_ADDRS])

    def dialled(self, peer: ID, ok: bool) -> None:
        entry = self.known.get(peer)
        if entry is None:
            return
        entry.failures = 0 if ok else entry.failures + 1
        entry.next_dial = time.monotonic() + (0 if ok else min(BACKOFF_MAX, 2.0**entry.failures))

    def candidates(self, exclude: set[ID]) -> list[ID]:
        now = time.monotonic()
        return [peer for peer, entry in self.known.items() if peer not in exclude and entry.next_dial <= now]


def check_addrs(peer: ID, addrs: Any, observed: str | None = None) -> list[str]:
    """The well-formed multiaddrs of `addrs` that end in /p2p/`peer` (others are dropped, not trusted). A node
    listening on 0.0.0.0 (a container) announces that: `observed`, the IPv4 address its connection comes from,
    stands in for it when given (its own addresses); otherwise such an address is dropped."""
    if type(addrs) is not list:
        return []
    found = []
    for text in addrs[:MAX_ADDRS]:
        if type(text) is not str:
            continue
        if observed and text.startswith("/ip4/0.0.0.0/"):
            text = f"/ip4/{observed}/" + text.removeprefix("/ip4/0.0.0.0/")
        try:
            named, multiaddr = parse_peer_addr(text)
        except LedgerError:
            continue
        if named == peer and not text.startswith(("/ip4/0.0.0.0/", "/ip6/::/")):
            found.append(str(multiaddr))
    return found


def decode_message(
    data: bytes, sender: ID, observed: str | None = None
) -> tuple[list[str], list[tuple[ID, list[str]]]]:
    """(the sender's own addresses, the peers it shares); raises LedgerError('peers.message') on a bad shape.
    `observed`: the IPv4 address the sender's connection comes from."""
    try:
        message = codec.decode(data)
    except LedgerError as exc:
        raise LedgerError("peers.message", f"message: {exc.message}") from None
    if type(message) is not dict or type(message.get("addrs")) is not list:
        raise LedgerError("peers.message", "message: expected a map with a list `addrs`")
    shared = []
    for row in message.get("peers", [])[:MAX_SHARED] if type(message.get("peers")) is list else []:
        if type(row) is not list or len(row) != 2 or type(row[0]) is not bytes:
            continue
        try:
            peer = ID(row[0])
        except Exception:  # libp2p's ID raises several types for bytes that are no peer id
            continue
        if addrs := check_addrs(peer, row[1]):
            shared.append((peer, addrs))
    return check_addrs(sender, message["addrs"], observed), shared


class Discovery:
    """The address book and the task that keeps this node connected to about TARGET_PEERS peers."""

    def __init__(
        self,
        host: IHost,
        own_addrs: Callable[[], list[str]],
        refused: Callable[[ID], bool],
        dial: Callable[[str], Awaitable[ID]],
        since: Callable[[ID], float | None],
        target: int = TARGET_PEERS,
        needed: Callable[[], set[ID]] = set,
    ) -> None:
        """`refused(peer)`: banned; `dial(addr)` connects; `since(peer)`: wall-clock second it connected;
        `target`: the connections to keep (0: `run` is not started; exchanges are still answered); `needed()`:
        the peers not to close now (sync is reading them, or they hold operations this node still has to fetch)."""
        self.host = host
        self.target = target
        self.book = AddressBook(host.get_id())
        self._own_addrs = own_addrs
        self._refused = refused
        self._connect = dial
        self._since = since
        self._needed = needed
        self.closing: set[ID] = set()  # connections `_trim` is closing: sync opens no new stream on them
        self._exchanged: set[ID] = set()  # connected peers exchanged with since they connected
        self.exchanges = 0
        host.set_stream_handler(PEERS_PROTOCOL, self._answer)

    def connected(self, peer: ID) -> None:
        self._exchanged.discard(peer)

    def _message(self, exclude: ID | None) -> bytes:
        shared = []
        for peer in self.host.get_connected_peers():
            entry = self.book.known.get(peer)
            if peer != exclude and entry is not None and not self._refused(peer):
                shared.append([peer.to_bytes(), entry.addrs])
        random.shuffle(shared)
        return codec.encode({"addrs": self._own_addrs(), "peers": shared[:MAX_SHARED]})

    def _learn(self, sender: ID, data: bytes, stream: INetStream) -> None:
        own, shared = decode_message(data, sender, _observed_ip(stream))
        self.book.learn(sender, own)
        for peer, addrs in shared:
            if not self._refused(peer):
                self.book.learn(peer, addrs)

    async def _answer(self, stream: INetStream) -> None:
        sender = stream.muxed_conn.peer_id  # authenticated by Noise
        try:
            with trio.fail_after(EXCHANGE_TIMEOUT):
                data = await FrameReader(stream, MAX_MESSAGE, EXCHANGE_TIMEOUT).read_frame()
                if data is None:
                    raise LedgerError("peers.message", "the stream ended before a message")
                self._learn(sender, data, stream)
                await stream.write(frame(self._message(sender)))
                await stream.close()
        except (LedgerError, StreamError, trio.TooSlowError) as exc:
            log.info("a peer exchange from %s failed: %s", sender, exc)
            await _reset(stream)
        except Exception:  # never out of a stream handler: it would reach libp2p's nursery
            log.exception("answering a peer exchange from %s failed", sender)
            await _reset(stream)

    async def exchange(self, peer: ID) -> None:
        """Tell `peer` where we listen and learn its peers."""
        try:
            with trio.fail_after(EXCHANGE_TIMEOUT):
                stream = await self.host.new_stream(peer, [PEERS_PROTOCOL])
                try:
                    await stream.write(frame(self._message(peer)))
                    await stream.close_write()
                    data = await FrameReader(stream, MAX_MESSAGE, EXCHANGE_TIMEOUT).read_frame()
                    if data is None:
                        raise LedgerError("peers.message", "the stream ended before an answer")
                    self._learn(peer, data, stream)
                    await stream.close()
                except BaseException:
                    await _reset(stream)
                    raise
            self.exchanges += 1
        except (LedgerError, SyncError, StreamError, trio.TooSlowError) as exc:
            log.info("a peer exchange with %s failed: %s", peer, exc)
        except Exception as exc:  # libp2p raises several types when a peer cannot open the protocol
            log.info("cannot exchange peers with %s: %s", peer, exc)

    async def _dial(self, peer: ID) -> None:
        entry = self.book.known.get(peer)  # a full book may have forgotten it meanwhile
        for addr in list(entry.addrs if entry else ()):
            try:
                await self._connect(addr)
                self.book.dialled(peer, ok=True)
                return
            except Exception as exc:  # libp2p raises many types for a failed dial
                log.debug("dialling %s at %s failed: %s", peer, addr, exc)
        self.book.dialled(peer, ok=False)

    async def run(self) -> None:
        """Rounds every INTERVAL_BELOW while below the target and a round changes something (a new peer known
        or dialled), backing off to INTERVAL_AT when one does not (a network smaller than the target)."""
        interval = INTERVAL_BELOW
        while True:
            connected = [peer for peer in self.host.get_connected_peers() if not self._refused(peer)]
            known = len(self.book.known)
            async with trio.open_nursery() as nursery:
                for peer in connected:
                    if peer not in self._exchanged:
                        self._exchanged.add(peer)  # once per connection, answered or not
                        nursery.start_soon(self.exchange, peer)
            dialled = 0
            if len(connected) < self.target:
                dialled = await self._grow(connected)
            elif len(connected) > SURPLUS * self.target:
                await self._trim(connected)
            below = len(connected) < self.target
            interval = INTERVAL_BELOW if below and (dialled or len(self.book.known) > known) else interval
            await trio.sleep(interval if below else INTERVAL_AT)
            interval = min(INTERVAL_AT, interval * 2)

    async def _grow(self, connected: list[ID]) -> int:
        """Ask one connected peer for its peers, dial enough of the book's; how many were dialled."""
        if connected:  # ask one more peer than those just met: a node that knows one peer learns of its peers
            await self.exchange(random.choice(connected))
        exclude = {*connected, self.book.own}
        choice = [peer for peer in self.book.candidates(exclude) if not self._refused(peer)]
        random.shuffle(choice)
        chosen = choice[: self.target - len(connected)]
        async with trio.open_nursery() as nursery:
            for peer in chosen:
                nursery.start_soon(self._dial, peer)
        return len(chosen)

    async def _trim(self, connected: list[ID]) -> None:
        """Close the newest surplus connections among those older than TRIM_GRACE (Kubo's connection manager
        does the same between its low and high water marks), except those sync needs: closing a peer in the middle
        of a read, or the one that listed operations this node still lacks, left a hub of 50 short of 300 of them.
        The oldest connections are never surplus, so a hub keeps its longest-lived peers."""
        settled, needed = time.time() - TRIM_GRACE, self._needed()
        ages = {peer: self._since(peer) for peer in connected}
        closable = sorted((since, str(peer), peer) for peer, since in ages.items() if since and since < settled)
        surplus = [peer for _, _, peer in closable[-(len(connected) - self.target) :] if peer not in needed]
        self.closing.update(surplus)
        try:
            for peer in surplus:
                log.info(
                    "closing the connection to %s: %d peers connected, %d wanted (%d spared: sync needs them)",
                    peer,
                    len(connected),
                    self.target,
                    len(needed & set(connected)),
                )
                await self.host.disconnect(peer)
        finally:
            self.closing.difference_update(surplus)


def _observed_ip(stream: INetStream) -> str | None:
    """The IPv4 address the stream's connection comes from, if the transport says."""
    try:
        remote = stream.get_remote_address()
    except Exception:  # transports differ in what they know; the address is only a help
        return None
    return remote[0] if remote and remote[0].count(".") == 3 else None


async def _reset(stream: INetStream) -> None:
    with trio.CancelScope(shield=True):
        try:
            await stream.reset()
        except Exception as exc:  # the connection may be gone already
            log.debug("resetting a peers stream failed: %s", exc)
