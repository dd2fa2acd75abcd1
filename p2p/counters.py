"""The network's counters: what `peers` shows as its own (`self.counters`) and the metrics scrape exports, kept by
the p2p node and its fetch pipeline."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Counters:
    gossip_received: int = 0
    gossip_operations_received: int = 0  # operations in the messages received (duplicates of stored ones included)
    gossip_bytes_received: int = 0
    gossip_rejected: int = 0
    gossip_dropped: int = 0  # our queue or the node's ingest queue was full
    gossip_throttled: int = 0  # its origin had used up its allowance of operations
    gossip_sent: int = 0
    operations_gossiped: int = 0
    sync_rounds: int = 0  # reconciliations completed
    sync_fetched: int = 0  # operations received by sync (each missing one is fetched from one peer)
    sync_duplicates: int = 0  # of those, ones this node held or had queued by the time they arrived
    sync_bytes_received: int = 0  # of the operations fetched
    sync_served: int = 0
    forks: int = 0
