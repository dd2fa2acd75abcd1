"""Fan-out of node events to websocket subscribers.

Publishing never waits: each subscriber has its own bounded queue, and when it is full the *oldest* queued event
is dropped for that subscriber only and counted. Dropping the oldest keeps the freshest events and puts the gap
right where the sender reports it: the "lagged" notice is followed by an event whose seq jumps by exactly
`missed`. Every event carries a hub-wide sequence number, so a client can always check.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from node.metrics import NodeMetrics


@dataclass(eq=False)
class Subscription:
    """One subscriber's queue plus how many events it has missed since it last looked."""

    send: trio.MemorySendChannel[dict[str, Any]]
    receive: trio.MemoryReceiveChannel[dict[str, Any]]
    missed: int = field(default=0)
    closing: bool = field(default=False)  # set at node stop: queued events are not worth delaying shutdown for

    def take_missed(self) -> int:
        missed, self.missed = self.missed, 0
        return missed


class HubClosed(Exception):
    """Subscribing after shutdown began."""


class EventHub:
    """Many subscribers, one producer side that never blocks the node."""

    def __init__(self, metrics: NodeMetrics, queue_size: int = 256) -> None:
        self._metrics = metrics
        self._queue_size = queue_size
        self._subscribers: set[Subscription] = set()
        self._seq = 0
        self._closed = False

    def publish(self, kind: str, data: Any) -> int:
        """Queue an event for every subscriber; synchronous so it can be called from any task."""
        self._seq += 1
        event = {"type": kind, "seq": self._seq, "data": data}
        dropped = 0
        for sub in self._subscribers:
            try:
                sub.send.send_nowait(event)
            except trio.WouldBlock:
                # Full queue means nobody waits on it, and publish() has no checkpoint: evict, then append.
                sub.receive.receive_nowait()
                sub.send.send_nowait(event)
                sub.missed += 1
                dropped += 1
        if dropped:
            self._metrics.ws_events_dropped.inc(dropped)  # once per publish: the counter takes a lock
        return self._seq

    @property
    def listening(self) -> bool:
        """Whether anyone subscribes: a producer may then skip building events that nobody would get."""
        return bool(self._subscribers)

    def skip(self, count: int) -> None:
        """Number `count` events that were not built because nobody listened, so `seq` still counts every event."""
        self._seq += count

    @contextmanager
    def subscribe(self) -> Iterator[Subscription]:
        if self._closed:
            raise HubClosed
        send, receive = trio.open_memory_channel[dict[str, Any]](self._queue_size)
        sub = Subscription(send, receive)
        self._subscribers.add(sub)
        self._metrics.ws_subscribers.inc()
        try:
            yield sub
        finally:
            self._subscribers.discard(sub)
            self._metrics.ws_subscribers.dec()
            send.close()
            receive.close()

    def close(self) -> None:
        """End every subscription's stream; senders stop at the next event instead of draining their queue. Events
        published later (the ingest task drains its queue after the server stops) reach nobody."""
        self._closed = True
        for sub in self._subscribers:
            sub.closing = True
            sub.send.close()
        self._subscribers.clear()
