"""What the scheduler plugin answers (runs in the scheduler).

``Queries`` is the plugin's read-only side (it changes only the ``holder-queries``
counter): the ``cacheaffinity_holders`` handler workers ask for peers holding a
chunk's columns, ``where``, ``info`` (node statistics summed over workers,
directory-wide ones taken once), ``snapshot`` and forecasts. The plugin's methods
of the same names are the API.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Set
from time import monotonic
from typing import TYPE_CHECKING

from cacheaffinity._version import __version__
from cacheaffinity.protocol import DIRECTORY_WIDE, WORKER_METRIC

if TYPE_CHECKING:
    from collections import deque

    from cacheaffinity.placement import TorusPlacement
    from cacheaffinity.scheduler._counters import NodeCounters
    from cacheaffinity.scheduler._forecast import Forecast
    from cacheaffinity.scheduler._inheritance import Inheritance
    from cacheaffinity.scheduler._locator import Locator
    from cacheaffinity.scheduler._membership import Membership
    from cacheaffinity.scheduler._stealing import LocalityStealing

__all__ = ["Queries"]


class Queries:
    """Answers about the placement, the nodes and the runs, read from the plugin's components."""

    def __init__(
        self,
        membership: Membership,
        placement: TorusPlacement,
        locator: Locator,
        inheritance: Inheritance,
        counters: Counter[str],
        node_counters: NodeCounters,
        forecast: Forecast,
        recent_placements: deque[tuple[str, str]],
    ):
        self.membership = membership
        self.placement = placement
        self.locator = locator
        self.inheritance = inheritance
        self.counters = counters
        self.node_counters = node_counters
        self.forecast = forecast
        self.recent_placements = recent_placements

    def holders(
        self,
        chunk: str | None = None,
        start: int | None = None,
        stop: int | None = None,
        worker: str | None = None,
    ) -> list[str]:
        """One worker per live node likely to hold ``[start, stop)`` of ``chunk``.

        Holders first (most entries first), then the placement's nodes of its
        stripes, then, without a record, its inherited runner-up nodes; ``worker``'s
        own node left out.
        """
        if not isinstance(chunk, str):
            return []
        if not (isinstance(start, int) and isinstance(stop, int)):
            start = stop = None
        own = self.membership.worker_node.get(worker)
        node_workers = self.membership.node_workers
        out = []
        locator = self.locator
        nodes = locator.holders_of_range(chunk, start, stop)
        inheritance = self.inheritance
        if inheritance and node_workers and not locator.recorded(chunk, start, stop):
            # no record (a restarted scheduler): where a steal would have put it
            for node in inheritance.runner_ups(chunk):
                if node not in nodes:
                    nodes.append(node)
        for node in nodes:
            workers = node_workers.get(node)
            if node != own and workers:
                out.append(min(workers))
        self.counters["holder-queries"] += 1
        return out

    def where(self, chunks: Iterable[str]) -> dict[str, dict]:
        """Home node and live workers of each chunk under the current membership."""
        chunks = [str(c) for c in chunks]
        if not chunks:
            return {}
        node_workers = self.membership.node_workers
        if not node_workers:
            return {c: {"node": None, "workers": []} for c in chunks}
        homes = self.placement.nearest(chunks)
        return {
            c: {"node": n, "workers": sorted(node_workers.get(n, ()))}
            for c, n in zip(chunks, homes)
        }

    def info(self, stealing: LocalityStealing | None, owners: Set[str]) -> dict:
        """A summary for clients, the dashboard and the command line; ``owners``: the
        nodes that own a part of the placement."""
        membership = self.membership
        locator = self.locator
        nodes = {}
        workers = membership.workers
        for node, addrs in membership.node_workers.items():
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
                "weight": membership.weight(node),
                "uncached": membership.uncached(node),
                "placing": node in owners,
                "directory": directory,
                "admission": admission,
                "stats": dict(stats),
                "counters": self.node_counters.get(node),
                "tasks": len(locator.node_tasks.get(node, ())),
            }
        placement = self.placement
        return {
            "version": __version__,
            "placement": {
                "dimensions": placement.dimensions,
                "replicas": placement.replicas,
                "seed": placement.seed,
                "balance": placement.balance,
            },
            "nodes": nodes,
            "counters": dict(self.counters),
            "stealing": None
            if stealing is None
            else {
                "enabled": stealing.enabled,
                "dask-stealing": stealing.dask_stealing,
                "steals": stealing.steals,
                "membership-moves": stealing.membership_moves,
                "refused": stealing.refused,
                "warm-steal-cost": stealing.warm_cost.to_dict(monotonic()),
                "warm-backlog": stealing.warm_backlog,
            },
            "tracked-tasks": len(locator.chunk_of),
            "held-chunks": len(locator.holder),
            "locator-size": locator.size,
            "node-speed": locator.speed.to_dict(),
        }

    def forecast_of(self, run: str) -> dict | None:
        """``Forecast.get`` of ``run`` with the capacities and policies the workers report."""
        capacity: dict[str, int] = {}
        policy: dict[str, str] = {}
        workers = self.membership.workers
        for node, addrs in self.membership.node_workers.items():
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
        return self.forecast.get(run, capacity, policy)

    def latest_forecast(self) -> dict | None:
        """The forecast of the newest run that has one (with its ``run`` id), or None."""
        for run in reversed(list(self.forecast.runs)):
            out = self.forecast_of(run)
            if out is not None:
                return {"run": run, **out}
        return None

    def snapshot(self, info: dict) -> dict:
        """``info`` plus the per-node counters (departed nodes too), recent placements,
        the placement's immutable ``layout`` and the latest forecast (copies)."""
        info["node-counters"] = self.node_counters.to_dict()
        info["recent-placements"] = list(self.recent_placements)
        info["recent-placements-size"] = self.recent_placements.maxlen
        info["layout"] = self.placement.layout()
        info["forecast"] = self.latest_forecast()
        return info
