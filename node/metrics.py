"""Prometheus metrics in a registry owned by the node (never the global one), so tests can run several nodes."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


class NodeMetrics:
    """Every metric of one node. Labels are bounded: method names are the registered ones, codes are the ledger's."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._known_methods: frozenset[str] = frozenset()
        r = self.registry
        self.operations = Counter(
            "expledger_operations",
            "Operations received, by source kind, verdict (accepted/ignored/rejected) and code",
            ["source", "verdict", "code"],
            registry=r,
        )
        self.ingest_batch_size = Histogram(
            "expledger_ingest_batch_operations",
            "Operations per ingest batch (one synced write)",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.ingest_seconds = Histogram(
            "expledger_ingest_batch_seconds",
            "Time to check, store and fold one batch",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ingest_queue = Gauge("expledger_ingest_queue", "Submissions waiting for the writer", registry=r)
        self.ingest_refused = Counter(
            "expledger_ingest_refused", "Submissions refused because the ingest queue was full", registry=r
        )
        self.log_size = Gauge("expledger_log_size", "Operations in this node's log", registry=r)
        self.pending = Gauge("expledger_pending_operations", "Operations waiting for dependencies", registry=r)
        self.waited = Counter(
            "expledger_operations_waited",
            "Operations stored pending because a dependency was not applied yet (later in their batch included)",
            registry=r,
        )
        self.live_experiences = Gauge("expledger_live_experiences", "Live experiences in the library", registry=r)
        self.rpc_calls = Counter(
            "expledger_rpc_calls", "JSON-RPC calls by method and outcome", ["method", "outcome"], registry=r
        )
        self.rpc_seconds = Histogram(
            "expledger_rpc_call_seconds", "JSON-RPC handler time", ["method"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.retrieval_seconds = Histogram(
            "expledger_retrieval_seconds",
            "Time to answer a retrieval (embedding included)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.http_rejected = Counter(
            "expledger_http_rejected", "HTTP requests refused before dispatch", ["reason"], registry=r
        )
        self.ws_subscribers = Gauge("expledger_ws_subscribers", "Open event subscriptions", registry=r)
        self.ws_events_sent = Counter("expledger_ws_events_sent", "Events delivered to subscribers", registry=r)
        self.ws_events_dropped = Counter(
            "expledger_ws_events_dropped", "Events dropped because a subscriber was slow", registry=r
        )

    def set_known_methods(self, names: frozenset[str]) -> None:
        """Only registered method names become label values; anything else is 'unknown' (bounded cardinality)."""
        self._known_methods = names

    def observe_call(self, method: str, outcome: str, seconds: float) -> None:
        label = method if method in self._known_methods else "unknown"
        self.rpc_calls.labels(label, outcome).inc()
        self.rpc_seconds.labels(label).observe(seconds)

    def watch_network(self, read: Callable[[], tuple[Mapping[str, int], Mapping[str, float]]]) -> None:
        """Expose the network's counters and gauges, read from it at each scrape (`read` returns both maps), as
        expledger_p2p_<name>."""
        self.registry.register(_NetworkCollector(read))


class _NetworkCollector(Collector):
    def __init__(self, read: Callable[[], tuple[Mapping[str, int], Mapping[str, float]]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        counters, gauges = self._read()
        for name, value in counters.items():
            yield CounterMetricFamily(f"expledger_p2p_{name}", f"p2p: {name.replace('_', ' ')}", value=value)
        for name, value in gauges.items():
            yield GaugeMetricFamily(f"expledger_p2p_{name}", f"p2p: {name.replace('_', ' ')}", value=value)
