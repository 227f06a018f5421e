"""Which workers make up which cache node (runs in the scheduler).

``Membership`` maps workers to the node they report (``cacheaffinity`` worker
metric or ``cacheaffinity-node`` report, :mod:`cacheaffinity.protocol`; none: the
host's node ``host:<ip>``) and weighs nodes: configured weight, else reported,
else total threads. A node none of whose workers has a usable cache is
*uncached* and owns no placement while a cached node exists.

Event-loop only (no locking). Memory is per live worker and node plus the last
``MAX_DEPARTED`` departed nodes, whose learned per-node state others keep.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cacheaffinity.protocol import HOST_NODE_PREFIX, NO_WORKER_PLUGIN, WORKER_METRIC

if TYPE_CHECKING:
    from distributed.scheduler import WorkerState

__all__ = ["MAX_DEPARTED", "Membership"]

#: Departed nodes remembered: a node back soon (restart, scale down and up) keeps
#: its learned state, yet ever new nodes (batch jobs) do not grow memory.
MAX_DEPARTED = 256


class Membership:
    """Workers <-> cache nodes of one scheduler; ``weight_overrides`` is the
    validated ``cacheaffinity.scheduler.weights``."""

    def __init__(self, weight_overrides: Mapping[str, float] | None = None):
        self.weight_overrides: dict[str, float] = dict(weight_overrides or {})
        self.workers: Mapping[str, WorkerState] = {}
        self.worker_node: dict[str, str] = {}
        self.node_workers: dict[str, set[str]] = {}
        self.pending_workers: set[str] = set()
        self.node_reported_weight: dict[str, float] = {}
        self.changed: set[str] = set()
        # worker -> why it caches nothing (absent: it caches)
        self.worker_uncached: dict[str, str] = {}
        # nodes whose last worker left, newest last, at most MAX_DEPARTED
        self.departed: OrderedDict[str, None] = OrderedDict()

    def bind(self, workers: Mapping[str, WorkerState]) -> None:
        """Read worker states from the scheduler's ``workers``."""
        self.workers = workers

    @staticmethod
    def node_of_metrics(ws: WorkerState) -> tuple[str, float | None]:
        """The node (and weight) a worker reports in its metrics, else its host's node."""
        info = (ws.metrics or {}).get(WORKER_METRIC)
        if isinstance(info, dict) and info.get("node"):
            w = info.get("weight")
            return str(info["node"]), (float(w) if w is not None else None)
        return HOST_NODE_PREFIX + ws.host, None

    @staticmethod
    def uncached_of_metrics(ws: WorkerState) -> str | None:
        """Why a worker caches nothing, from its metrics (None: it caches)."""
        info = (ws.metrics or {}).get(WORKER_METRIC)
        if not isinstance(info, dict):
            return NO_WORKER_PLUGIN
        reason = info.get("uncached")
        return str(reason) if reason else None

    @staticmethod
    def has_report(ws: WorkerState) -> bool:
        """Whether the worker's metrics carry a cacheaffinity report."""
        return isinstance((ws.metrics or {}).get(WORKER_METRIC), dict)

    def learn(
        self,
        addr: str,
        node: str | None = None,
        weight: Any = None,
        *,
        reported: bool = False,
        report_expected: bool = False,
        uncached: str | None = None,
    ) -> bool:
        """Record the node of worker ``addr``; True if membership changed.

        Not ``reported``: node and ``uncached`` come from the worker's metrics; with
        ``report_expected`` and no report yet the worker is *pending* (no node).
        A change of a worker's uncached state is a membership change.
        """
        ws = self.workers.get(addr)
        if ws is None:
            return False
        if node is None and not reported and report_expected and not self.has_report(ws):
            self.pending_workers.add(addr)
            return False
        self.pending_workers.discard(addr)
        if not reported:
            uncached = self.uncached_of_metrics(ws)
        if node is None:
            node, weight = self.node_of_metrics(ws)
            if reported and not uncached:
                uncached = "no cache node reported"
        old = self.worker_node.get(addr)
        if weight is not None:
            self.node_reported_weight[node] = float(weight)
        was = self.worker_uncached.get(addr)
        if uncached:
            self.worker_uncached[addr] = str(uncached)
        else:
            self.worker_uncached.pop(addr, None)
        if old == node:
            if bool(was) != bool(uncached):
                self.changed.add(node)
                return True
            return False
        if old is not None:
            self.forget(addr)
        self.worker_node[addr] = node
        self.node_workers.setdefault(node, set()).add(addr)
        self.departed.pop(node, None)
        self.changed.add(node)
        return True

    def forget(self, addr: str) -> str | None:
        """Drop worker ``addr``; returns its node (None if it had none)."""
        self.pending_workers.discard(addr)
        self.worker_uncached.pop(addr, None)
        node = self.worker_node.pop(addr, None)
        if node is not None:
            self.changed.add(node)
            members = self.node_workers.get(node)
            if members is not None:
                members.discard(addr)
                if not members:
                    del self.node_workers[node]
                    self.node_reported_weight.pop(node, None)
                    self._departed(node)
        return node

    def _departed(self, node: str) -> None:
        """``node``'s last worker left."""
        departed = self.departed
        departed.pop(node, None)
        departed[node] = None
        while len(departed) > MAX_DEPARTED:
            departed.popitem(last=False)

    def known_limit(self) -> int:
        """How many nodes ``known_nodes`` can name at most now."""
        return len(self.node_workers) + MAX_DEPARTED

    def known_nodes(self) -> set[str]:
        """The live nodes and the last ``MAX_DEPARTED`` that left: whose state is kept."""
        return set(self.node_workers) | set(self.departed)

    def gone(self) -> list[str]:
        """Workers with a node that the scheduler no longer has."""
        return [a for a in self.worker_node if a not in self.workers]

    def reported_pending(self) -> list[tuple[str, str, float | None]]:
        """``(addr, node, weight)`` of pending workers whose metrics now carry their
        node; drops pending workers the scheduler no longer has."""
        out = []
        for addr in list(self.pending_workers):
            ws = self.workers.get(addr)
            if ws is None:
                self.pending_workers.discard(addr)
            elif self.has_report(ws):
                out.append((addr, *self.node_of_metrics(ws)))
        return out

    def take_changed(self) -> set[str]:
        """Nodes whose workers changed since the last call."""
        changed, self.changed = self.changed, set()
        return changed

    def weight(self, node: str) -> float:
        """Weight of a live node: configured, reported, or its total threads."""
        if node in self.weight_overrides:
            return float(self.weight_overrides[node])
        if node in self.node_reported_weight:
            return self.node_reported_weight[node]
        workers = self.workers
        threads = sum(
            workers[a].nthreads for a in self.node_workers.get(node, ()) if a in workers
        )
        return float(max(threads, 1))

    def weights(self) -> dict[str, float]:
        """``{node: weight}`` of every live node."""
        return {n: self.weight(n) for n in self.node_workers}

    def uncached(self, node: str) -> str | None:
        """Why live node ``node`` caches nothing (its workers' reasons), or None."""
        workers = self.node_workers.get(node)
        if not workers:
            return None
        reasons = [self.worker_uncached.get(a) for a in workers]
        if not all(reasons):
            return None
        return "; ".join(sorted(set(reasons)))

    def uncached_nodes(self) -> dict[str, str]:
        """``{node: reason}`` of the live nodes that cache nothing."""
        out = {}
        for node in self.node_workers:
            reason = self.uncached(node)
            if reason:
                out[node] = reason
        return out

    def placement_weights(self) -> dict[str, float]:
        """``{node: weight}`` of the nodes that own a part of the placement: the
        cached nodes, or every live node while none caches."""
        weights = self.weights()
        uncached = self.uncached_nodes()
        cached = {n: w for n, w in weights.items() if n not in uncached}
        return cached or weights

    def node_of(self, addr: str) -> str | None:
        """The cache node of worker ``addr`` (None: none known)."""
        return self.worker_node.get(addr)

    def live_workers(self, node: str) -> list[WorkerState]:
        """Worker states of a node's workers the scheduler still has."""
        workers = self.workers
        return [workers[a] for a in self.node_workers.get(node, ()) if a in workers]

    def pick_worker(self, node: str) -> WorkerState | None:
        """The node's least loaded live worker (tasks per thread, then address)."""
        live = self.live_workers(node)
        if not live:
            return None
        return min(live, key=lambda ws: (len(ws.processing) / ws.nthreads, ws.address))
