"""Which workers make up which cache node (runs in the scheduler).

Defines :class:`Membership`: worker address <-> cache node id, node weights,
and the workers whose node report is still to come.  The placement plugin
(:mod:`cacheaffinity.scheduler.plugin`) feeds it from Dask's hooks; the
locator and the stealing policy read it.

A worker's cache node comes from the worker (the ``cacheaffinity`` worker
metric or the ``cacheaffinity-node`` report, see :mod:`cacheaffinity.protocol`);
a worker that reports none is its own host's node ``host:<ip>``.  A node's
weight is, in order: ``cacheaffinity.scheduler.weights[node]``, the weight its
workers report, or its total threads.

A node is *uncached* when none of its workers has a usable cache: each says so
in its report (``uncached``: why), or has no cacheaffinity worker plugin at all.
An uncached node keeps nothing for the next run, so it owns no part of the
placement while a cached node exists (:meth:`Membership.placement_weights`).

Notes
-----
Event-loop only (no locking).  Memory is per live worker and per live node, not
per chunk, plus the last :data:`MAX_DEPARTED` nodes that left
(:attr:`Membership.departed`): what others learned per node (the locator's
node speeds, the stealing policy's warm-steal costs) is kept for those and
dropped for older ones, so that a scheduler serving ever new nodes (batch jobs
on new hosts, cache directories of new names) does not grow without bound.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cacheaffinity.protocol import HOST_NODE_PREFIX, NO_WORKER_PLUGIN, WORKER_METRIC

if TYPE_CHECKING:
    from distributed.scheduler import WorkerState

__all__ = ["MAX_DEPARTED", "Membership"]

#: Nodes that left remembered at most (:attr:`Membership.departed`): per-node state
#: learned elsewhere (node speeds, warm-steal costs) is kept for live nodes and these,
#: so a node that comes back soon (a restart, a scale-down and up) keeps it.
MAX_DEPARTED = 256


class Membership:
    """Workers <-> cache nodes of one scheduler.

    Parameters
    ----------
    weight_overrides
        ``{node_id: weight}`` (``cacheaffinity.scheduler.weights``), validated
        by the caller.
    """

    def __init__(self, weight_overrides: Mapping[str, float] | None = None):
        #: Configured weight overrides.
        self.weight_overrides: dict[str, float] = dict(weight_overrides or {})
        #: The scheduler's workers (``Scheduler.workers``), set by :meth:`bind`.
        self.workers: Mapping[str, WorkerState] = {}
        #: worker address -> cache node id
        self.worker_node: dict[str, str] = {}
        #: cache node id -> live worker addresses
        self.node_workers: dict[str, set[str]] = {}
        #: workers whose node report is still to come
        self.pending_workers: set[str] = set()
        #: cache node id -> weight reported by its workers
        self.node_reported_weight: dict[str, float] = {}
        #: nodes whose set of live workers changed since :meth:`take_changed`
        self.changed: set[str] = set()
        #: worker address -> why it caches nothing (workers with a cache are absent)
        self.worker_uncached: dict[str, str] = {}
        #: Nodes whose last worker left, most recent last: at most
        #: :data:`MAX_DEPARTED` (the oldest dropped first); a node that gets a
        #: worker again leaves it.  Per-node state of nodes neither live nor here
        #: may be dropped (:meth:`known_nodes`).
        self.departed: OrderedDict[str, None] = OrderedDict()

    def bind(self, workers: Mapping[str, WorkerState]) -> None:
        """Read worker states from ``workers`` (the scheduler's ``workers``)."""
        self.workers = workers

    # ------------------------------------------------------------ reports
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

        ``node=None`` and not ``reported``: read it from the worker's metrics;
        if ``report_expected`` (the worker plugin is registered) and there is
        no report yet, the worker becomes *pending* (no node) until it reports.
        ``uncached``: why a reporting worker caches nothing (read from the
        metrics when not ``reported``).  A change of a node's uncached state is
        a membership change.
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
        """``node``'s last worker left: the newest of :attr:`departed`."""
        departed = self.departed
        departed.pop(node, None)
        departed[node] = None
        while len(departed) > MAX_DEPARTED:
            departed.popitem(last=False)

    def known_limit(self) -> int:
        """How many nodes :meth:`known_nodes` can name at most now."""
        return len(self.node_workers) + MAX_DEPARTED

    def known_nodes(self) -> set[str]:
        """The live nodes and the last :data:`MAX_DEPARTED` that left: the nodes whose
        learned per-node state is kept (others' is dropped, see :attr:`departed`)."""
        return set(self.node_workers) | set(self.departed)

    def gone(self) -> list[str]:
        """Workers with a node that the scheduler no longer has."""
        return [a for a in self.worker_node if a not in self.workers]

    def reported_pending(self) -> list[tuple[str, str, float | None]]:
        """Pending workers whose metrics now carry their node: ``(addr, node, weight)``.

        Pending workers the scheduler no longer has are dropped.
        """
        out = []
        for addr in list(self.pending_workers):
            ws = self.workers.get(addr)
            if ws is None:
                self.pending_workers.discard(addr)
            elif self.has_report(ws):
                out.append((addr, *self.node_of_metrics(ws)))
        return out

    def take_changed(self) -> set[str]:
        """Nodes whose workers changed since the last call (and reset)."""
        changed, self.changed = self.changed, set()
        return changed

    # ------------------------------------------------------------ queries
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
