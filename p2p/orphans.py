"""Operations from the network whose parents or targets this node does not hold yet, kept out of the ledger.

The ledger logs every operation it stores, and a log is append-only, so an operation stored while it waits
for dependencies would occupy storage forever if they never come. Operations from peers therefore enter the
ledger only once all their dependencies are stored; until then they wait here, in memory, bounded like
Bitcoin Core's orphan pool (docs/PROTOCOL.md §10.4): at most MAX_PER_PEER from one peer, MAX_PER_AUTHOR by one
author and MAX_TOTAL in all (a full share evicts that peer's or author's oldest, a full pool its oldest), and
each for at most TTL seconds. Meanwhile their missing dependencies are fetched by CID from the peer that sent
them. An evicted operation is not lost to the network: sync delivers it again from any log that holds it.
"""

from __future__ import annotations

import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass

MAX_TOTAL = 10_000
MAX_PER_PEER = 2_000
MAX_PER_AUTHOR = 1_000
TTL = 600.0  # seconds


@dataclass(eq=False)
class Orphan:
    cid: bytes
    data: bytes
    missing: set[bytes]  # dependencies not stored yet
    author: str
    peer: str  # who sent it (a peer id), or "" for no peer
    source: str  # "gossip" or "sync"
    arrived: float  # monotonic


class OrphanPool:
    """Waiting operations by CID, oldest first, with their missing dependencies indexed for release."""

    def __init__(self) -> None:
        self._orphans: OrderedDict[bytes, Orphan] = OrderedDict()
        self._waiting: defaultdict[bytes, set[bytes]] = defaultdict(set)  # dependency -> orphans waiting on it
        self._by_peer: defaultdict[str, OrderedDict[bytes, None]] = defaultdict(OrderedDict)  # oldest first
        self._by_author: defaultdict[str, OrderedDict[bytes, None]] = defaultdict(OrderedDict)
        self.evicted = 0
        self.expired = 0

    def __len__(self) -> int:
        return len(self._orphans)

    def __contains__(self, cid: bytes) -> bool:
        return cid in self._orphans

    def add(self, orphan: Orphan) -> None:
        if orphan.cid in self._orphans:
            return
        if len(self._by_peer[orphan.peer]) >= MAX_PER_PEER:
            self._evict(self._orphans[next(iter(self._by_peer[orphan.peer]))])
        if len(self._by_author[orphan.author]) >= MAX_PER_AUTHOR:
            self._evict(self._orphans[next(iter(self._by_author[orphan.author]))])
        if len(self._orphans) >= MAX_TOTAL:
            self._evict(next(iter(self._orphans.values())))
        self._orphans[orphan.cid] = orphan
        self._by_peer[orphan.peer][orphan.cid] = None
        self._by_author[orphan.author][orphan.cid] = None
        for dependency in orphan.missing:
            self._waiting[dependency].add(orphan.cid)

    def take(self, cid: bytes) -> Orphan | None:
        """Remove and return the orphan `cid` (it arrived again: it is checked afresh), or None."""
        orphan = self._orphans.get(cid)
        if orphan is not None:
            self._remove(orphan)
        return orphan

    def release(self, stored: list[bytes]) -> list[Orphan]:
        """`stored` are now in the ledger: the orphans that no longer miss anything, transitively (an orphan
        waiting only on released ones is released with them, so a chain leaves in one batch, not one batch per
        link), removed from the pool, in the order they arrived."""
        ready: list[Orphan] = []
        frontier = list(stored)
        while frontier:
            dependency = frontier.pop()
            for cid in self._waiting.pop(dependency, ()):
                orphan = self._orphans.get(cid)
                if orphan is None:
                    continue
                orphan.missing.discard(dependency)
                if not orphan.missing:
                    ready.append(orphan)
                    frontier.append(orphan.cid)
        for orphan in ready:
            self._remove(orphan)
        return sorted(ready, key=lambda o: o.arrived)

    def expire(self, now: float | None = None) -> int:
        """Drop the orphans older than TTL; how many."""
        limit = (time.monotonic() if now is None else now) - TTL
        old = []
        for orphan in self._orphans.values():  # oldest first
            if orphan.arrived >= limit:
                break
            old.append(orphan)
        for orphan in old:
            self._remove(orphan)
        self.expired += len(old)
        return len(old)

    def missing_from(self, peer: str) -> list[bytes]:
        """Dependencies that orphans sent by `peer` wait for and that are not waiting here themselves (what to ask
        it for: a waiting one is already here, it misses something further back)."""
        wanted = {dep for cid in self._by_peer.get(peer, ()) for dep in self._orphans[cid].missing}
        return sorted(dep for dep in wanted if dep not in self._orphans)

    def _evict(self, orphan: Orphan) -> None:
        self._remove(orphan)
        self.evicted += 1

    def _remove(self, orphan: Orphan) -> None:
        del self._orphans[orphan.cid]
        for index, key in ((self._by_peer, orphan.peer), (self._by_author, orphan.author)):
            del index[key][orphan.cid]
            if not index[key]:
                del index[key]
        for dependency in orphan.missing:
            waiting = self._waiting.get(dependency)
            if waiting is not None:
                waiting.discard(orphan.cid)
                if not waiting:
                    del self._waiting[dependency]
