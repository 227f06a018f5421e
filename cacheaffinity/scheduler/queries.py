"""What the scheduler plugin answers (runs in the scheduler).

This module owns the plugin's read-only side, which changes nothing:

- :func:`holders`: the ``cacheaffinity_holders`` handler workers ask for peers
  that hold a chunk's columns (:mod:`cacheaffinity.worker.peers`);
- :func:`where`: home node and workers of chunks (``cacheaffinity.where``);
- :func:`info`: the summary for clients, the dashboard and the command line,
  per-node worker statistics added up (directory-wide figures taken once);
- :func:`snapshot`: :func:`info` plus what readers in the scheduler process
  use (the dashboard page, the Prometheus collector).

The functions take the :class:`~.plugin.CacheAffinityPlugin`; its methods of
the same names are the API.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from time import monotonic
from typing import TYPE_CHECKING

from cacheaffinity._version import __version__
from cacheaffinity.protocol import DIRECTORY_WIDE, WORKER_METRIC

if TYPE_CHECKING:
    from cacheaffinity.scheduler.plugin import CacheAffinityPlugin

__all__ = ["holders", "info", "snapshot", "where"]


#: Runner-up nodes (among the inherited) named for a chunk of unknown holder: a missed
#: chunk asks each of them once, after a scheduler restart only.
INHERITED_ASKED = 4


def holders(
    plugin: CacheAffinityPlugin,
    chunk: str | None = None,
    start: int | None = None,
    stop: int | None = None,
    worker: str | None = None,
) -> list[str]:
    """Handler ``cacheaffinity_holders``: one worker address per other live
    node that processed entries ``[start, stop)`` of ``chunk`` (most first),
    then the placement's nodes of its stripes, and (no holder recorded) its
    runner-up nodes among :attr:`Locator.inherited`; ``worker``'s
    own node left out.  A worker asks this once per chunk task that missed a column
    (:mod:`cacheaffinity.worker.peers`)."""
    if not isinstance(chunk, str):
        return []
    if not (isinstance(start, int) and isinstance(stop, int)):
        start = stop = None
    own = plugin.membership.worker_node.get(worker)
    node_workers = plugin.membership.node_workers
    out = []
    nodes = plugin.locator.holders_of_range(chunk, start, stop)
    inherited = plugin.locator.inherited
    if inherited and node_workers and not plugin.locator.recorded(chunk, start, stop):
        # no record (a restarted scheduler): where a steal would have put it, if that
        # node came with a cache this scheduler has not seen filled
        for node in plugin.placement.ranking(chunk, 1 + INHERITED_ASKED)[1:]:
            if node in inherited and node not in nodes:
                nodes.append(node)
    for node in nodes:
        workers = node_workers.get(node)
        if node != own and workers:
            out.append(min(workers))
    plugin.counters["holder-queries"] += 1
    return out


def where(plugin: CacheAffinityPlugin, chunks: Iterable[str]) -> dict[str, dict]:
    """Home node and live workers of each chunk under the current membership."""
    chunks = [str(c) for c in chunks]
    if not chunks:
        return {}
    if not plugin.membership.node_workers:
        return {c: {"node": None, "workers": []} for c in chunks}
    homes = plugin.placement.nearest(chunks)
    return {
        c: {"node": n, "workers": sorted(plugin.membership.node_workers.get(n, ()))}
        for c, n in zip(chunks, homes)
    }

def info(plugin: CacheAffinityPlugin) -> dict:
    """A summary for clients, the dashboard and the command line."""
    nodes = {}
    workers = plugin.scheduler.workers if plugin.scheduler else {}
    for node, addrs in plugin.membership.node_workers.items():
        stats: Counter[str] = Counter()
        directory = admission = None
        for a in addrs:
            ws = workers.get(a)
            m = (ws.metrics or {}).get(WORKER_METRIC) if ws is not None else None
            if isinstance(m, dict):
                directory = m.get("directory", directory)
                admission = m.get("admission", admission)
                for k, v in (m.get("stats") or {}).items():
                    if not isinstance(v, (int, float)):
                        continue
                    if k in DIRECTORY_WIDE:  # the same directory seen by each worker
                        stats[k] = max(stats[k], v)
                    else:  # per-process counters add up
                        stats[k] += v
        nodes[node] = {
            "workers": sorted(addrs),
            "hosts": sorted({workers[a].host for a in addrs if a in workers}),
            "weight": plugin.membership.weight(node),
            "uncached": plugin.membership.uncached(node),
            "placing": node in plugin.owners,
            "directory": directory,
            "admission": admission,
            "stats": dict(stats),
            "counters": dict(plugin.node_counters.get(node, {})),
            "tasks": len(plugin.locator.node_tasks.get(node, ())),
        }
    stealing = plugin.stealing
    return {
        "version": __version__,
        "placement": {
            "dimensions": plugin.placement.dimensions,
            "replicas": plugin.placement.replicas,
            "seed": plugin.placement.seed,
            "balance": plugin.placement.balance,
        },
        "nodes": nodes,
        "counters": dict(plugin.counters),
        "stealing": None
        if stealing is None
        else {
            "enabled": stealing.enabled,
            "dask-stealing": stealing.dask_stealing,
            "steals": stealing.steals,
            "membership-moves": stealing.membership_moves,
            "refused": stealing.refused,
            # node -> what a warm chunk it stole cost it, in its typical tasks (learned)
            "warm-steal-cost": stealing.warm_cost.to_dict(monotonic()),
            "warm-backlog": stealing.warm_backlog,
        },
        "tracked-tasks": len(plugin.locator.chunk_of),
        "held-chunks": len(plugin.locator.holder),
        "locator-size": plugin.locator.size,
        "node-speed": plugin.locator.speed.to_dict(),
    }


def forecast(plugin: CacheAffinityPlugin, run: str) -> dict | None:
    """:meth:`.forecast.Forecast.get` of ``run`` with each node's capacity in force
    and admission policy from its workers' metrics."""
    capacity: dict[str, int] = {}
    policy: dict[str, str] = {}
    workers = plugin.scheduler.workers if plugin.scheduler else {}
    for node, addrs in plugin.membership.node_workers.items():
        for a in addrs:
            ws = workers.get(a)
            m = (ws.metrics or {}).get(WORKER_METRIC) if ws is not None else None
            if not isinstance(m, dict):
                continue
            cap = (m.get("stats") or {}).get("capacity")
            if isinstance(cap, (int, float)):
                capacity[node] = max(capacity.get(node, 0), int(cap))
            if isinstance(m.get("admission"), str):
                policy[node] = m["admission"]
    return plugin.forecast.get(run, capacity, policy)


def latest_forecast(plugin: CacheAffinityPlugin) -> dict | None:
    """The forecast of the newest run that has one (with its ``run`` id), or None."""
    for run in reversed(list(plugin.forecast.runs)):
        out = forecast(plugin, run)
        if out is not None:
            return {"run": run, **out}
    return None


def snapshot(plugin: CacheAffinityPlugin) -> dict:
    """What the dashboard page and the Prometheus collector read.

    :meth:`info` plus, for readers in the scheduler process:
    ``"node-counters"`` (``{node: {counter: value}}``, departed nodes
    included), ``"recent-placements"`` (``[(chunk, node)]``, newest last),
    ``"recent-placements-size"`` (its bound) and ``"layout"`` (the
    placement's immutable node set, :meth:`TorusPlacement.layout`).
    Containers are copies; calling it changes nothing.
    """
    out = plugin.info()  # the method: a subclass or a test may replace it
    out["node-counters"] = {n: dict(c) for n, c in plugin.node_counters.items()}
    out["recent-placements"] = list(plugin.recent_placements)
    out["recent-placements-size"] = plugin.recent_placements.maxlen
    out["layout"] = plugin.placement.layout()
    out["forecast"] = latest_forecast(plugin)
    return out
