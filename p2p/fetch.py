"""Sync's fetch pipeline: what reconciliation found missing, fetched from the peers that listed it.

A sync round (p2p/service.py) only learns which operations a peer holds that this node lacks (`Fetcher.want`);
the `Fetcher` task fetches them, so that an operation several peers listed is read once, not once per peer.

An operation is wanted until it is stored. One whose listing peers all left or failed is kept, stranded, until a
later round finds a holder (and the node is told at once, to ask its other peers): forgetting it, as before, left
the hub of 50 daemons 300 operations short with `status` unable to tell, since no later round listed them anew.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio
from libp2p.abc import IHost
from libp2p.peer.id import ID

from ledger.cid import CID
from ledger.errors import LedgerError
from ledger.ingest import Source
from ledger.ops import Block
from ledger.view import LedgerView
from p2p.counters import Counters
from p2p.peers import PENALTY_MISBEHAVIOUR, Peer
from p2p.reconcile import LEAF_BITS, SetIndex, bucket_of
from p2p.sync import MAX_BLOCKS, Misbehaviour, SyncError, fetch_blocks

log = logging.getLogger(__name__)

FETCH_GRACE = 1.0  # seconds a missing operation waits for gossip before sync fetches it
FETCH_WINDOW = 8 * MAX_BLOCKS  # operations fetched at once, over every peer that has them
INGEST_SLOTS = FETCH_WINDOW // MAX_BLOCKS  # fetched chunks queued for ingest (a window's) while the next is fetched
PEER_CHUNKS = 2  # chunks fetched from one peer at once
#: seconds a stranded operation is kept for a round to list it again (every connected holder reconciles again within
#: SYNC_INTERVAL); after that it is forgotten, so that a peer that listed operations it never had and left cannot
#: keep this node "catching up" for ever
STRANDED_KEEP = 300.0

#: `admit(ops, source, cids)`: (what goes to the ingest queue now, decoded where it decodes; which of those are
#: operations); `cids` are the binary CIDs of `ops`
Admit = Callable[[list[bytes], Source, list[bytes]], tuple[list[bytes | Block], set[bytes]]]
#: `submit(ready, present, source, peer, wait=, lane=, queued=)`: into the ingest queue; how many the ledger rejected
Submit = Callable[..., Awaitable[int]]
#: `penalise(peer, points, why)`
Penalise = Callable[[Peer, float, str], Awaitable[None]]


class OnTheWay:
    """The operations found missing and not yet through ingest (wanted, being fetched, or queued): their fingerprints
    (`index`), so that a round compares a peer's with what this node holds or is getting, and by leaf bucket, to
    find those of a range whose fingerprints agree."""

    def __init__(self) -> None:
        self.index = SetIndex()
        self._by_bucket: dict[int, set[bytes]] = {}

    def add(self, cids: list[bytes]) -> None:
        new = [cid for cid in cids if cid not in self._by_bucket.get(bucket_of(cid), ())]
        for cid in new:
            self._by_bucket.setdefault(bucket_of(cid), set()).add(cid)
        self.index.add(new)

    def discard(self, cids: list[bytes]) -> None:
        gone = []
        for cid in cids:
            bucket = self._by_bucket.get(bucket_of(cid))
            if bucket is not None and cid in bucket:
                bucket.discard(cid)
                gone.append(cid)
                if not bucket:
                    del self._by_bucket[bucket_of(cid)]
        self.index.add(gone, -1)

    def within(self, level: int, prefix: int) -> list[bytes]:
        """Those in the range `prefix` at `level` bits."""
        shift = LEAF_BITS - level
        if len(self._by_bucket) < 1 << shift:  # fewer buckets in use than the range spans
            return [cid for bucket, cids in self._by_bucket.items() if bucket >> shift == prefix for cid in cids]
        return [
            cid for bucket in range(prefix << shift, (prefix + 1) << shift) for cid in self._by_bucket.get(bucket, ())
        ]


@dataclass
class Want:
    """An operation a reconciliation found missing: its clock (fetch order) and the peers that listed it."""

    clock: int
    since: float  # monotonic, when first found
    peers: set[ID] = field(default_factory=set)
    in_flight: bool = False
    stranded_at: float = 0.0  # monotonic, when it was last set aside for want of a usable peer
    #: listed by a peer's first round since it connected: held before the two met, so gossip will not bring it
    unheard: bool = False


class Fetcher:
    """Each missing operation is fetched once, from one peer that listed it, lowest clocks first, and queued for
    ingest in clock order (so every dependency is stored or on its way: nothing waits as an orphan or pending).

    `queued` is the node's count of CIDs handed to the ingest queue and not yet answered (shared, not copied):
    an operation there is not missing. `usable()`: the connected peers sync may open streams on (not those being
    closed); `stranded()` is called when operations lose their last usable peer."""

    def __init__(
        self,
        host: IHost,
        usable: Callable[[], set[ID]],
        stranded: Callable[[], None],
        view: Callable[[], LedgerView],
        counters: Counters,
        peer: Callable[[ID], Peer],
        queued: Counter[bytes],
        admit: Admit,
        submit: Submit,
        penalise: Penalise,
    ) -> None:
        self.host = host
        self._usable = usable
        self._on_stranded = stranded
        self._view = view
        self.counters = counters
        self._peer = peer
        self._queued = queued
        self._admit = admit
        self._submit = submit
        self._penalise = penalise
        self.wanted: dict[bytes, Want] = {}
        self.on_the_way = OnTheWay()  # wanted, and fetched until ingest answered
        self.stranded: set[bytes] = set()  # wanted ones no usable peer listed: off the heap until one does
        self._fetch_order: list[tuple[int, bytes]] = []  # heap of (clock, CID) of wanted ones (some stale)
        self._wanted_changed = trio.Event()
        self._ingest_slots = trio.Semaphore(INGEST_SLOTS)
        self.fetched_queued = 0  # operations fetched and waiting for ingest

    @property
    def behind(self) -> int:
        """Operations found missing here and not yet stored (wanted, or fetched and waiting for ingest)."""
        return len(self.wanted) + self.fetched_queued

    def stored(self, cid: bytes) -> None:
        """`cid` was stored, having arrived another way (gossip): no longer missing, unless a fetch of it is on."""
        want = self.wanted.get(cid)
        if want is not None and not want.in_flight:
            del self.wanted[cid]
            self.stranded.discard(cid)
            self.on_the_way.discard([cid])

    def holders(self) -> set[ID]:
        """The peers that listed an operation still wanted (those being fetched from among them): O(wanted)."""
        return set().union(*(want.peers for want in self.wanted.values()))

    def listed_by(self, peer: ID) -> bool:
        """Whether an operation `peer` listed is still wanted from it (not yet fetched, nor failed there)."""
        return any(peer in want.peers for want in self.wanted.values())

    def want(self, found: list[tuple[int, bytes]], peer: ID, view: LedgerView, *, first_round: bool = False) -> int:
        """Record which of `found` (listed by `peer`) this node lacks; how many. One already wanted is lacking
        without a look at the store (a catch-up from several peers hears of each missing operation from each).
        `first_round`: the first listing since `peer` connected, which names what it held before: gossip sent that
        while the two were apart and will not send it again, so it waits for the other peers' first rounds (to be
        fetched from all of them) but not FETCH_GRACE (a node that starts or joins is in sync a second sooner)."""
        wanted = self.wanted
        lacking = [
            (clock, cid)
            for clock, cid in found
            if cid in wanted or (cid not in self._queued and not view.has(CID(cid)))
        ]
        # more than a window missing is a catch-up, not gossip in flight: no grace
        now = time.monotonic() - (FETCH_GRACE if len(lacking) > FETCH_WINDOW else 0.0)
        new = []
        for clock, cid in lacking:
            want = wanted.get(cid)
            if want is None:
                want = wanted[cid] = Want(clock, now)
                heapq.heappush(self._fetch_order, (clock, cid))
                new.append(cid)
            self._held(cid, want, peer)
            want.unheard |= first_round
        self.on_the_way.add(new)
        if lacking:
            self._wanted_changed.set()
        return len(lacking)

    def held_by(self, ranges: list[tuple[int, int]], peer: ID) -> int:
        """`peer` holds every operation on its way here in `ranges` (its fingerprints of them equal those of what this
        node holds and is getting): it may be asked for the wanted ones among them. How many those are."""
        found = [
            (self.wanted[cid].clock, cid)
            for level, prefix in ranges
            for cid in self.on_the_way.within(level, prefix)
            if cid in self.wanted
        ]
        for _, cid in found:
            self._held(cid, self.wanted[cid], peer)
        if found:
            self._wanted_changed.set()
        return len(found)

    def _held(self, cid: bytes, want: Want, peer: ID) -> None:
        """`peer` holds the wanted `cid`: one of those it may be fetched from (back in line if it was stranded)."""
        if cid in self.stranded:
            self.stranded.discard(cid)
            heapq.heappush(self._fetch_order, (want.clock, cid))
        want.peers.add(peer)

    async def run(self) -> None:
        """Fetch what reconciliation found missing, each operation from one peer that listed it: in windows of
        the lowest clocks first, split into clock-contiguous chunks over the peers, fetched at once, each queued
        for ingest in clock order as soon as it and the chunks before it arrived (so every dependency is stored or
        on its way: nothing waits as an orphan, and the writer starts on a window's first chunk while the rest
        come: waiting for the whole window left it idle ~2 s at the start of a 10,000-operation catch-up).
        An operation waits FETCH_GRACE after it was found, since gossip usually delivers it meanwhile."""
        turn = trio.Event()  # set once the previous chunk is in the ingest queue: chunks queue in clock order
        turn.set()
        async with trio.open_nursery() as ingesting:
            while True:
                if len(self.wanted) == len(self.stranded):  # nothing to fetch until a round lists some
                    self._fetch_order.clear()  # what is left there is stale
                    with trio.move_on_after(STRANDED_KEEP if self.stranded else math.inf):
                        await self._wanted_changed.wait()
                    self._wanted_changed = trio.Event()
                    self._expire()
                    continue
                window = self._window()
                if not window:
                    await trio.sleep(FETCH_GRACE / 4)
                    continue
                chunks = self._assign(window)
                results: list[dict[bytes, bytes]] = [{} for _ in chunks]
                arrived = [trio.Event() for _ in chunks]
                async with trio.open_nursery() as fetching:
                    for number, (peer_id, cids) in enumerate(chunks):
                        fetching.start_soon(self._fetch_chunk, peer_id, cids, results, number, arrived[number])
                    for number, (peer_id, cids) in enumerate(chunks):
                        await arrived[number].wait()
                        arrived_blocks = results[number]
                        self._settle(peer_id, cids, arrived_blocks)
                        peer = self._peer(peer_id)
                        source = Source("sync", str(peer_id))
                        ready, present = self._admit(list(arrived_blocks.values()), source, list(arrived_blocks))
                        await self._ingest_slots.acquire()
                        self.fetched_queued += len(ready)
                        queued = trio.Event()
                        ingesting.start_soon(
                            self._ingest_fetched, ready, present, list(arrived_blocks), source, peer, turn, queued
                        )
                        turn = queued

    def _window(self) -> list[bytes]:
        """The CIDs to fetch next, lowest clocks first: off the heap of wanted ones, skipping those gone (arrived
        another way), setting aside as stranded those no usable peer listed, and holding back those found less than
        FETCH_GRACE ago (those a first round listed only until every usable peer's first round is over).
        O(window log wanted), so a catch-up of a million operations stays linear."""
        ripe, usable, view = time.monotonic() - FETCH_GRACE, self._usable(), self._view()
        first_rounds_over = not any(self._peer(peer_id).first_round_pending for peer_id in usable)
        window: dict[bytes, None] = {}  # in order, without repeats
        held_back: list[tuple[int, bytes]] = []
        stranded = len(self.stranded)
        while self._fetch_order and len(window) < FETCH_WINDOW:
            clock, cid = heapq.heappop(self._fetch_order)
            want = self.wanted.get(cid)
            if want is None or want.in_flight or cid in window or cid in self.stranded:  # stale, or pushed twice
                continue
            want.peers &= usable
            if cid in self._queued or view.has(CID(cid)):
                del self.wanted[cid]
                self.on_the_way.discard([cid])
            elif not want.peers:
                self.stranded.add(cid)
                want.stranded_at = time.monotonic()
            elif want.since > ripe and not (want.unheard and first_rounds_over):
                held_back.append((clock, cid))
            else:
                window[cid] = None
        for item in held_back:
            heapq.heappush(self._fetch_order, item)
        if len(self.stranded) > stranded:
            log.info(
                "%d wanted operations have no usable peer that listed them (%d in all): kept until a round lists "
                "them; asking the other peers",
                len(self.stranded) - stranded,
                len(self.stranded),
            )
            self._on_stranded()
        return list(window)

    def _assign(self, window: list[bytes]) -> list[tuple[ID, list[bytes]]]:
        """Clock-contiguous chunks of at most MAX_BLOCKS, each to the least-loaded peer that holds all of it, at most
        PEER_CHUNKS to one peer: the window ends where no holder has room, and the rest goes back on the heap. A
        peer answers the requests it gets at once together, so 8 chunks from one peer (the only holder known when a
        catch-up begins) arrived together, the first 0.25 s after it was found, the writer idle meanwhile."""
        load: Counter[ID] = Counter()
        taken: Counter[ID] = Counter()  # chunks per peer
        chunks: list[tuple[ID, list[bytes]]] = []
        for number, cid in enumerate(window):
            want = self.wanted[cid]
            if chunks and chunks[-1][0] in want.peers and len(chunks[-1][1]) < MAX_BLOCKS:
                want.in_flight = True
                chunks[-1][1].append(cid)
                load[chunks[-1][0]] += 1
                continue
            room = sorted((peer_id for peer_id in want.peers if taken[peer_id] < PEER_CHUNKS), key=str)
            if not room:
                for rest in window[number:]:
                    heapq.heappush(self._fetch_order, (self.wanted[rest].clock, rest))
                break
            want.in_flight = True
            chosen = min(room, key=lambda peer_id: load[peer_id])
            chunks.append((chosen, [cid]))
            load[chosen] += 1
            taken[chosen] += 1
        return chunks

    def _expire(self) -> None:
        """Forget the operations stranded for STRANDED_KEEP (no round listed them again meanwhile)."""
        old = time.monotonic() - STRANDED_KEEP
        expired = [cid for cid in self.stranded if self.wanted[cid].stranded_at < old]
        for cid in expired:
            self.stranded.discard(cid)
            del self.wanted[cid]
        self.on_the_way.discard(expired)
        if expired:
            log.warning("forgot %d wanted operations no round listed again in %.0f s", len(expired), STRANDED_KEEP)

    async def _fetch_chunk(
        self, peer_id: ID, cids: list[bytes], results: list[dict[bytes, bytes]], number: int, arrived: trio.Event
    ) -> None:
        """Fetch one chunk into `results[number]` (left empty if the fetch failed); `arrived` is set either way."""
        peer = self._peer(peer_id)
        try:
            results[number] = await fetch_blocks(self.host, peer_id, [CID(raw) for raw in cids])
            log.info("fetched %d of %d operations from %s", len(results[number]), len(cids), peer_id)
        except Misbehaviour as exc:
            await self._penalise(peer, PENALTY_MISBEHAVIOUR, f"sync: {exc}")
        except (SyncError, LedgerError) as exc:
            log.info("fetching %d operations from %s failed: %s", len(cids), peer_id, exc)
        except Exception:  # a bug in one exchange must not end the node; another peer or round gets them
            log.exception("fetching %d operations from %s failed", len(cids), peer_id)
        finally:
            arrived.set()

    def _settle(self, peer_id: ID, cids: list[bytes], arrived: dict[bytes, bytes]) -> None:
        """Forget what arrived (operations by binary CID); what the peer did not send is asked of another peer that
        listed it, or stranded (`_window`) when none is left. A peer that listed an operation holds it (a log only
        grows), so one it did not send means a failed exchange (py-libp2p may show a reset stream as a clean end),
        not that none has it."""
        view = self._view()
        self.counters.sync_fetched += len(arrived)
        self.counters.sync_bytes_received += sum(len(data) for data in arrived.values())
        self.counters.sync_duplicates += sum(1 for cid in arrived if cid in self._queued or view.has(CID(cid)))
        self._peer(peer_id).fetched += len(arrived)
        for cid in cids:
            want = self.wanted.get(cid)
            if want is None:
                continue
            if cid in arrived:
                del self.wanted[cid]
            else:
                want.in_flight = False
                want.peers.discard(peer_id)
                heapq.heappush(self._fetch_order, (want.clock, cid))

    async def _ingest_fetched(
        self,
        ready: list[bytes | Block],
        present: set[bytes],
        arrived: list[bytes],
        source: Source,
        peer: Peer,
        turn: trio.Event,
        queued: trio.Event,
    ) -> None:
        """Queue a fetched chunk for ingest after the chunk before it (`turn`), so no operation reaches the ledger
        before its dependencies: one that did would wait there as pending, its writes made and undone, and its
        dependency's arrival would cost a scan for its waiters (41% of a 10,000-operation catch-up's ingest once)."""
        try:
            await turn.wait()
            if await self._submit(ready, present, source, peer, wait=True, lane="sync", queued=queued):
                await self._penalise(peer, PENALTY_MISBEHAVIOUR, "sync: it served operations ingest rejected")
        except Exception:  # one chunk must not end the node; what it held is found missing again by the next round
            log.exception("ingesting %d operations fetched from %s failed", len(ready), peer.id)
        finally:
            queued.set()
            self.fetched_queued -= len(ready)
            self.on_the_way.discard(arrived)  # stored (so in the log's fingerprints), or not coming
            self._ingest_slots.release()
