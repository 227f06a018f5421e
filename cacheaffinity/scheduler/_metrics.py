"""Prometheus metrics of the plugin on the scheduler's ``/metrics`` (runs in the scheduler).

Exports ``dask_cacheaffinity_*`` (default namespace) per cache node, label ``node``,
from ``CacheAffinityPlugin.snapshot()``. Worker values are summed over a node's
live workers and restart from zero with a worker process (a counter reset);
scheduler counters cover every node counted since the scheduler started. One
collector per process (``prometheus_client`` has one registry), held weakly and
pointed at the scheduler that started a plugin last. A failing collection is
logged and exports nothing from cacheaffinity; the rest of the page is served.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from distributed.core import Status

from cacheaffinity.protocol import PLUGIN_NAME
from cacheaffinity.scheduler._distributed import PrometheusCollector

if TYPE_CHECKING:
    from distributed.scheduler import Scheduler
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

logger = logging.getLogger("cacheaffinity.scheduler")

__all__ = ["CacheAffinityMetricCollector", "register_collector"]

_GONE = frozenset({Status.closing, Status.closing_gracefully, Status.closed, Status.failed})

# Metric families: (name, source key, help); source: the workers' statistics,
# the plugin's per-node counters or the newest run's forecast.
WORKER_COUNTERS = (
    ("hits", "hits", "Column cache hits (verified reads from the node's disk)."),
    ("misses", "misses", "Column cache misses."),
    ("served_bytes", "bytes_served", "Bytes served from the node's column cache."),
    ("evictions", "evictions", "Entries evicted from the node's column cache."),
    ("storage_read_bytes", "storage_bytes", "Bytes chunk tasks requested from storage."),
    ("storage_opens", "storage_opens", "Data files chunk tasks opened on storage."),
)
WORKER_GAUGES = (
    ("cached_bytes", "bytes", "Bytes stored in the node's cache directory (whole blocks)."),
    ("entries", "entries", "Entries in the node's cache directory."),
    ("capacity_bytes", "capacity", "Capacity of the node's cache in force (at most what "
     "its file system held at start)."),
    ("configured_capacity_bytes", "configured_capacity", "Capacity setting of the node's cache."),
)  # fmt: skip
UNCACHED_GAUGE = (
    "uncached",
    "1 if no worker of the cache node has a usable cache (a read-only or untrusted directory, "
    "no worker plugin): it gets no placement while cached nodes exist; else 0.",
)
WARM_COST_GAUGE = (
    "warm_steal_cost",
    "What a chunk another node held cost this node when it stole one, in its typical task "
    "durations (learned; the stealing policy takes such chunks only above this many queued "
    "tasks per thread, scaled by speeds; the prior is stealing.warm-backlog).",
)
FORECAST_GAUGES = (
    ("forecast_need_bytes", "need_bytes", "Bytes the newest run with a forecast needs on the "
     "node's cache (its chunks' sizes as earlier runs reported them)."),
    ("forecast_hit_ratio", "capacity_hit_rate", "Hit rate the node's cache allows the newest "
     "run with a forecast once every chunk was read (the whole chunks that fit, with admission rank)."),
)  # fmt: skip
SCHEDULER_COUNTERS = (
    ("placements", "placements", "Chunk tasks placed on the cache node."),
    ("failovers", "failovers", "Chunk tasks re-targeted away after the cache node left."),
    ("steals", "steals", "Chunk tasks the cache node's workers stole."),
    ("tasks_on_target", "on-target", "Chunk tasks that finished on their cache node."),
    ("tasks_off_target", "off-target", "Chunk tasks that finished on another cache node."),
)


class CacheAffinityMetricCollector(PrometheusCollector):
    """Exports the cacheaffinity plugin of one scheduler (held weakly) to Prometheus."""

    def __init__(self, server: Scheduler):
        self._server: weakref.ref | None = None
        super().__init__(server)
        self.subsystem = PLUGIN_NAME

    @property
    def server(self) -> Scheduler | None:
        """The scheduler to export (None: garbage-collected)."""
        return None if self._server is None else self._server()

    @server.setter
    def server(self, value: Scheduler | None) -> None:
        self._server = None if value is None else weakref.ref(value)

    def _families(self) -> dict[str, CounterMetricFamily | GaugeMetricFamily]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        out: dict[str, Any] = {}
        for name, _, doc in (*WORKER_COUNTERS, *SCHEDULER_COUNTERS):
            out[name] = CounterMetricFamily(self.build_name(name), doc, labels=["node"])
        for name, _, doc in (*WORKER_GAUGES, *FORECAST_GAUGES):
            out[name] = GaugeMetricFamily(self.build_name(name), doc, labels=["node"])
        for name, doc in (UNCACHED_GAUGE, WARM_COST_GAUGE):
            out[name] = GaugeMetricFamily(self.build_name(name), doc, labels=["node"])
        return out

    def describe(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """The families without samples, so the registry checks names without collecting."""
        yield from self._families().values()

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        scheduler = self.server
        if scheduler is None or scheduler.status in _GONE:
            return
        plugin = scheduler.plugins.get(PLUGIN_NAME)
        if plugin is None or not hasattr(plugin, "info"):
            return
        try:
            families = self._samples(plugin)
        except Exception:
            logger.exception("cacheaffinity: Prometheus metrics could not be collected")
            return
        yield from families

    def _samples(self, plugin: Any) -> list[CounterMetricFamily | GaugeMetricFamily]:
        families = self._families()
        snapshot = plugin.snapshot()
        nodes = snapshot["nodes"]
        for node, entry in sorted(nodes.items()):
            stats = entry.get("stats") or {}
            for name, key, _ in (*WORKER_COUNTERS, *WORKER_GAUGES):
                value = stats.get(key)
                if isinstance(value, (int, float)):
                    families[name].add_metric([node], value)
            families[UNCACHED_GAUGE[0]].add_metric([node], 1 if entry.get("uncached") else 0)
        node_counters = snapshot["node-counters"]
        counted = set(nodes) | set(node_counters)
        for node in sorted(counted):
            counters = node_counters.get(node) or {}
            for name, key, _ in SCHEDULER_COUNTERS:
                families[name].add_metric([node], counters.get(key, 0))
        stealing = snapshot.get("stealing") or {}
        for node, cost in sorted((stealing.get("warm-steal-cost") or {}).items()):
            families[WARM_COST_GAUGE[0]].add_metric([node], cost)
        forecast = snapshot.get("forecast") or {}
        for node, entry in sorted((forecast.get("nodes") or {}).items()):
            for name, key, _ in FORECAST_GAUGES:
                value = entry.get(key)
                if isinstance(value, (int, float)):
                    families[name].add_metric([node], value)
        return list(families.values())


_collector: CacheAffinityMetricCollector | None = None
_lock = threading.Lock()


def register_collector(scheduler: Scheduler) -> CacheAffinityMetricCollector | None:
    """Export ``scheduler``'s plugin on ``/metrics`` (idempotent).

    The first call registers the process's collector, later ones point it at
    ``scheduler``. None: no ``prometheus_client``, or the registry refused it (logged).
    """
    global _collector
    try:
        import prometheus_client
    except ImportError:
        logger.debug("cacheaffinity: prometheus_client not installed; no metrics exported")
        return None
    with _lock:
        if _collector is None:
            collector = CacheAffinityMetricCollector(scheduler)
            try:
                prometheus_client.REGISTRY.register(collector)
            except ValueError as e:  # names taken by another collector
                logger.warning(
                    "cacheaffinity: Prometheus metrics not registered (%s); /metrics "
                    "shows no dask_cacheaffinity_* values",
                    e,
                )
                return None
            _collector = collector
        else:
            _collector.server = scheduler
        return _collector
