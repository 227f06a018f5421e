"""Cache-affine placement of chunk tasks (runs in the scheduler).

Defines :class:`CacheAffinityPlugin`, the scheduler plugin registered under the
fixed name ``cacheaffinity``.  It

* learns each worker's *cache node* from the worker (the ``cacheaffinity``
  worker metric sent at registration and with every heartbeat, or the
  ``cacheaffinity-node`` stream message); a worker that reports none is its own
  node ``host:<ip>``.  Several workers may share one node.  A node's weight is
  its total threads unless ``cacheaffinity.scheduler.weights`` or the worker's
  ``cacheaffinity.worker.weight`` say otherwise;
* in :meth:`update_graph`, reads the chunk identity of every task annotated
  with ``cacheaffinity`` (see :mod:`cacheaffinity.client`), asks
  :class:`~cacheaffinity.placement.TorusPlacement` for its cache node in one
  batch and restricts the task *loosely* to that node's live workers;
  tasks without a chunk identity are left to Dask;
* when a node leaves, re-targets its tasks (queued or released from a dead
  worker) to their next-nearest live node before Dask reschedules them; when a
  node joins, moves the not-yet-running tasks that now map to it;
* remembers where each chunk was last processed (the *locator*), which the
  stealing policy uses to prefer thieves that already hold a chunk;
* logs its decisions to the event topic ``cacheaffinity`` and to the logger
  ``cacheaffinity.scheduler`` (per-task lines on ``cacheaffinity.scheduler.tasks``).

It never touches disk: worker-side caching lives in :mod:`cacheaffinity.worker`.

Notes
-----
All methods run on the scheduler's event loop; no locking is needed.  A
failure inside a hook is logged by Dask and leaves the task to Dask's own
placement, which costs a cache miss, never a result.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict, deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash
from distributed.diagnostics.plugin import SchedulerPlugin

from cacheaffinity import __version__, config
from cacheaffinity.placement import TorusPlacement
from cacheaffinity.protocol import (
    ANNOTATION,
    DIRECTORY_WIDE,
    HOST_NODE_PREFIX,
    NODE_REPORT_TOPIC,
    PLUGIN_NAME,
    WORKER_METRIC,
)
from cacheaffinity.scheduler.metrics import register_collector
from cacheaffinity.scheduler.stealing import (
    LocalityStealing,
    choose_steal,
    install_stealing,
)

if TYPE_CHECKING:
    from distributed.scheduler import Scheduler, TaskState, WorkerState

logger = logging.getLogger("cacheaffinity.scheduler")
task_logger = logging.getLogger("cacheaffinity.scheduler.tasks")

__all__ = ["CacheAffinityPlugin"]

#: Task states in which a chunk task has not finished and may still be placed.
_PENDING = frozenset({"released", "waiting", "no-worker", "processing"})
#: Restriction used while no cache node exists: no worker has this address, so
#: the task waits in ``no-worker`` (instead of Dask's root-task queue) until a
#: node joins and the plugin places it.
_NO_NODE = "cacheaffinity://no-cache-node-yet"



#: Chunks whose last processing node the plugin remembers (~100 bytes each).
HOLDER_CAP = 2_000_000


def _digest(chunk: str) -> int:
    return xxhash.xxh3_64_intdigest(chunk.encode())


class CacheAffinityPlugin(SchedulerPlugin):
    """Scheduler plugin that sends every chunk task to its cache node.

    Configuration: ``cacheaffinity.scheduler`` (``dimensions``, ``replicas``,
    ``seed``, ``balance``, ``weights``, ``stealing.*``); keyword arguments of the
    same names override it, ``None`` reads the config when the plugin is made.

    Parameters
    ----------
    dimensions, replicas, seed, balance
        Passed to :class:`~cacheaffinity.placement.TorusPlacement`.
    weights
        ``{node_id: weight}`` overrides of node weights.
    stealing
        Install :class:`~cacheaffinity.scheduler.stealing.LocalityStealing` in
        place of Dask's stealing (default: always; its policy is switched by
        ``cacheaffinity.scheduler.stealing.enabled``).  ``False`` keeps the
        scheduler's stealing extension as it is.
    locator
        ``cacheaffinity.scheduler.locator``: send a chunk that was stolen last
        time to the node that processed it (and holds its columns), as long as
        its placement is unchanged.
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(
        self,
        *,
        dimensions: int | None = None,
        replicas: int | None = None,
        seed: int | None = None,
        balance: float | None = None,
        weights: dict[str, float] | None = None,
        stealing: bool | None = None,
        locator: bool | None = None,
    ):
        dimensions = config.get("scheduler.dimensions", dimensions)
        replicas = config.get("scheduler.replicas", replicas)
        seed = config.get("scheduler.seed", seed)
        balance = config.get("scheduler.balance", balance)
        weights = dict(config.get("scheduler.weights", weights) or {})
        for node, w in weights.items():
            if not isinstance(w, (int, float)) or not np.isfinite(w) or w <= 0:
                raise ValueError(
                    f"cacheaffinity.scheduler.weights[{node!r}]={w!r} must be a number > 0"
                )
        #: Nearest-node placement (a chunk's *home*), used for re-targeting.
        self.home = TorusPlacement(dimensions=dimensions, replicas=replicas, seed=seed)
        #: Placement of submitted batches (bounded loads if ``balance`` is set).
        self.placement = (
            self.home
            if balance is None
            else TorusPlacement(
                dimensions=dimensions, replicas=replicas, seed=seed, balance=balance
            )
        )
        #: Configured weight overrides.
        self.weight_overrides: dict[str, float] = weights
        #: Whether to install the locality-preserving stealing extension.
        self.install_stealing: bool = True if stealing is None else bool(stealing)
        #: Whether a stolen chunk goes, next time, to the node that processed it.
        self.use_locator: bool = bool(config.get("scheduler.locator", locator))

        self.scheduler: Scheduler | None = None
        #: worker address -> cache node id
        self.worker_node: dict[str, str] = {}
        #: cache node id -> live worker addresses
        self.node_workers: dict[str, set[str]] = {}
        #: workers whose node report is still to come
        self.pending_workers: set[str] = set()
        self._pending_pc = None  # PeriodicCallback of _check_pending, while started
        #: cache node id -> weight reported by its workers
        self.node_reported_weight: dict[str, float] = {}
        #: task key -> chunk id, for every chunk task the scheduler knows
        self.chunk_of: dict[Any, str] = {}
        #: task key -> cache node the task is meant for
        self.target: dict[Any, str] = {}
        #: cache node id -> keys of tasks meant for it
        self.node_tasks: defaultdict[str, set] = defaultdict(set)
        #: chunk id -> (cache node that last processed it, node placement chose for it)
        self.located: dict[str, tuple[str, str]] = {}
        #: task key -> placement's node, for tasks the locator sent elsewhere
        self.hashed: dict[Any, str] = {}
        #: keys of chunk tasks the stealing policy moved (until they finish)
        self.stolen: set = set()
        #: xxh3-64 of a chunk id -> cache node that processed it last (its cache
        #: holds it unless evicted since); the stealing policy leaves such chunks
        #: with their node unless its queue is long.  Oldest entries are dropped
        #: beyond HOLDER_CAP.
        self.holder: dict[int, str] = {}
        #: Counters (also exported as metrics).
        self.counters: Counter[str] = Counter()
        #: cache node id -> per-node counters (placements, failovers, steals)
        self.node_counters: defaultdict[str, Counter[str]] = defaultdict(Counter)
        #: (chunk id, node) of the last chunks placed, newest last (dashboard page)
        self.recent_placements: deque[tuple[str, str]] = deque(maxlen=5000)
        #: nodes whose set of live workers changed since the last re-targeting
        self.workers_changed: set[str] = set()

    # ============================================================ lifecycle
    async def start(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        register_collector(scheduler)  # /metrics: dask_cacheaffinity_* (idempotent)
        from cacheaffinity.scheduler.dashboard import install as install_dashboard

        install_dashboard(scheduler)  # dashboard page /cacheaffinity (idempotent)
        if self.install_stealing:
            await install_stealing(scheduler, self)
        for addr in list(scheduler.workers):
            self._learn_worker(addr)
        self._membership_changed("plugin-start", stimulus_id="cacheaffinity-start")
        if self._pending_pc is None:
            # A worker whose plugin was set up before this plugin started reports its
            # node only in its metrics (next heartbeat): look for pending workers there.
            from tornado.ioloop import PeriodicCallback

            self._pending_pc = PeriodicCallback(self._check_pending, 1000)
            self._pending_pc.start()
        logger.info(
            "cacheaffinity %s placement active: %d cache nodes, %s",
            __version__,
            len(self.node_workers),
            self.describe(),
        )

    async def close(self) -> None:
        if self._pending_pc is not None:
            self._pending_pc.stop()

    def _check_pending(self) -> None:
        """Pending workers whose heartbeat now carries their node become cache nodes."""
        s = self.scheduler
        if s is None or s.plugins.get(PLUGIN_NAME) is not self:  # removed or replaced
            if self._pending_pc is not None:
                self._pending_pc.stop()
            return
        for addr in list(self.pending_workers):
            ws = s.workers.get(addr)
            if ws is None:
                self.pending_workers.discard(addr)
            elif isinstance((ws.metrics or {}).get(WORKER_METRIC), dict):
                node, weight = self._node_of_metrics(ws)
                self._handle_node_report(addr, node, weight)

    def describe(self) -> str:
        p = self.placement
        return (
            f"torus dimensions={p.dimensions} replicas={p.replicas} seed={p.seed} "
            f"balance={p.balance}"
        )

    @property
    def stealing(self) -> LocalityStealing | None:
        ext = self.scheduler.extensions.get("stealing") if self.scheduler else None
        return ext if isinstance(ext, LocalityStealing) else None

    def _event(self, msg: dict) -> None:
        if self.scheduler is not None:
            self.scheduler.log_event(PLUGIN_NAME, msg)

    # ============================================================ membership
    def _node_of_metrics(self, ws: WorkerState) -> tuple[str, float | None]:
        info = (ws.metrics or {}).get(WORKER_METRIC)
        if isinstance(info, dict) and info.get("node"):
            w = info.get("weight")
            return str(info["node"]), (float(w) if w is not None else None)
        return HOST_NODE_PREFIX + ws.host, None

    def _learn_worker(
        self, addr: str, node: str | None = None, weight=None, reported: bool = False
    ) -> bool:
        """Record the node of worker ``addr``; True if membership changed."""
        ws = self.scheduler.workers.get(addr)
        if ws is None:
            return False
        if node is None and not reported:
            info = (ws.metrics or {}).get(WORKER_METRIC)
            if not isinstance(info, dict) and PLUGIN_NAME in self.scheduler.worker_plugins:
                # The registered worker plugin is being set up on this worker and
                # will report its node; until then the worker is no cache node.
                self.pending_workers.add(addr)
                return False
        self.pending_workers.discard(addr)
        if node is None:
            node, weight = self._node_of_metrics(ws)
        old = self.worker_node.get(addr)
        if weight is not None:
            self.node_reported_weight[node] = weight
        if old == node:
            return False
        if old is not None:
            self._forget_worker(addr)
        self.worker_node[addr] = node
        self.node_workers.setdefault(node, set()).add(addr)
        self.workers_changed.add(node)
        return True

    def _forget_worker(self, addr: str) -> str | None:
        self.pending_workers.discard(addr)
        node = self.worker_node.pop(addr, None)
        if node is not None:
            self.workers_changed.add(node)
            members = self.node_workers.get(node)
            if members is not None:
                members.discard(addr)
                if not members:
                    del self.node_workers[node]
                    self.node_reported_weight.pop(node, None)
        return node

    def node_weight(self, node: str) -> float:
        """Weight of a live node: configured, reported, or its total threads."""
        if node in self.weight_overrides:
            return float(self.weight_overrides[node])
        if node in self.node_reported_weight:
            return self.node_reported_weight[node]
        workers = self.scheduler.workers
        threads = sum(
            workers[a].nthreads for a in self.node_workers.get(node, ()) if a in workers
        )
        return float(max(threads, 1))

    def add_worker(self, scheduler: Scheduler, worker: str) -> None:
        if self._learn_worker(worker):
            self._membership_changed(
                "worker-added", worker=worker, stimulus_id=f"cacheaffinity-add-{worker}"
            )

    def remove_worker(self, scheduler: Scheduler, worker: str, **kwargs: Any) -> None:
        self._sync_workers(kwargs.get("stimulus_id") or "cacheaffinity-remove")

    def log_event(self, topic: str, msg: Any) -> None:
        if topic == NODE_REPORT_TOPIC and isinstance(msg, dict) and msg.get("worker"):
            self._handle_node_report(msg["worker"], msg.get("node"), msg.get("weight"))

    def _handle_node_report(self, worker: str, node=None, weight=None) -> None:
        """A worker plugin announced its cache node (None: unusable cache
        directory, the worker is its host's node)."""
        stimulus_id = f"cacheaffinity-node-{worker}"
        if self._learn_worker(worker, None if node is None else str(node), weight, reported=True):
            self._membership_changed("node-reported", worker=worker, stimulus_id=stimulus_id)
            # Tasks that waited for a cache node (no-worker) may run now.
            ws = self.scheduler.workers.get(worker)
            if ws is not None and ws.status.name == "running":
                s = self.scheduler
                s.transitions(s.bulk_schedule_unrunnable_after_adding_worker(ws), stimulus_id)

    def _sync_workers(self, stimulus_id: str) -> None:
        """Drop workers the scheduler no longer has (called from hooks)."""
        gone = [a for a in self.worker_node if a not in self.scheduler.workers]
        if not gone:
            return
        for addr in gone:
            self._forget_worker(addr)
        self._membership_changed("worker-removed", worker=gone, stimulus_id=stimulus_id)

    def _membership_changed(self, reason: str, *, stimulus_id: str, worker=None) -> None:
        """Rebuild the placement and re-target the tasks that must move."""
        nodes = {n: self.node_weight(n) for n in self.node_workers}
        before = set(self.home.nodes) if self.home.nodes else set()
        if nodes:
            self.home.set_nodes(nodes)
            if self.placement is not self.home:
                self.placement.set_nodes(nodes)
        joined = set(nodes) - before
        left = before - set(nodes)
        self._event(
            {
                "action": "membership",
                "reason": reason,
                "worker": worker,
                "nodes": len(nodes),
                "joined": sorted(joined),
                "left": sorted(left),
                "stimulus_id": stimulus_id,
            }
        )
        if joined or left:
            logger.info(
                "cache nodes changed (%s): +%s -%s, %d live",
                reason,
                sorted(joined),
                sorted(left),
                len(nodes),
            )
        self._retarget(joined, left, stimulus_id)

    # ============================================================ placement
    def update_graph(
        self,
        scheduler: Scheduler,
        *,
        keys: set,
        tasks: list,
        annotations: dict[str, dict],
        stimulus_id: str,
        **kwargs: Any,
    ) -> None:
        chunks = annotations.get(ANNOTATION)
        if not chunks:
            return
        stasks = scheduler.tasks
        todo: list[tuple[TaskState, str]] = []
        for key, chunk in chunks.items():
            if chunk is None:
                continue
            ts = stasks.get(key)
            if ts is None or ts.state not in _PENDING or ts.processing_on is not None:
                continue
            chunk = str(chunk)
            self.chunk_of[key] = chunk
            todo.append((ts, chunk))
        if not todo:
            return
        if not self.node_workers:
            for ts, _ in todo:
                ts.worker_restrictions = {_NO_NODE}
                ts.loose_restrictions = True
            self._event(
                {
                    "action": "place",
                    "tasks": len(todo),
                    "reason": "no cache node yet: tasks wait for one",
                    "stimulus_id": stimulus_id,
                }
            )
            return
        nodes = self.placement.assign([c for _, c in todo])
        per_node: Counter[str] = Counter(nodes)
        located = 0
        if self.use_locator and self.located:
            # Stolen last time, and placed on the same node as then: the thief's
            # node holds the chunk, its hash-preferred node does not.
            live, where = self.node_workers, self.located
            for i, ((ts, chunk), node) in enumerate(zip(todo, nodes)):
                loc = where.get(chunk)
                if loc is not None and loc[1] == node and loc[0] != node and loc[0] in live:
                    self.hashed[ts.key] = node
                    nodes[i] = loc[0]
                    per_node[node] -= 1
                    per_node[loc[0]] += 1
                    located += 1
        # One restriction set per node, shared by its tasks of this batch (the
        # scheduler replaces restriction sets, it never changes them in place).
        restrictions = {node: set(self.node_workers[node]) for node in per_node}
        target, node_tasks = self.target, self.node_tasks
        for (ts, _), node in zip(todo, nodes):
            key = ts.key
            old = target.get(key)
            if old is not None and old != node:
                node_tasks[old].discard(key)
            target[key] = node
            node_tasks[node].add(key)
            ts.worker_restrictions = restrictions[node]
            ts.loose_restrictions = True
        if task_logger.isEnabledFor(logging.DEBUG):
            for (ts, chunk), node in zip(todo, nodes):
                reason = "locator" if ts.key in self.hashed else "hash"
                task_logger.debug("%s: chunk %s -> node %s (%s)", ts.key, chunk, node, reason)
        per_node = +per_node  # drop nodes that lost all their chunks to the locator
        self.counters["placements"] += len(todo)
        self.counters["located"] += located
        m = self.recent_placements.maxlen
        self.recent_placements.extend(zip([c for _, c in todo[-m:]], nodes[-m:]))
        for node, n in per_node.items():
            self.node_counters[node]["placements"] += n
        self._event(
            {
                "action": "place",
                "tasks": len(todo),
                "nodes": dict(per_node),
                "located": located,
                "reason": "nearest cache node on the torus"
                + ("" if self.placement.balance is None else " with bounded loads")
                + (f"; {located} to the node that processed them last" if located else ""),
                "stimulus_id": stimulus_id,
            }
        )

    def _set_target(self, ts: TaskState, node: str, restrictions: dict | None = None) -> None:
        old = self.target.get(ts.key)
        if old is not None and old != node:
            self.node_tasks[old].discard(ts.key)
        self.target[ts.key] = node
        self.node_tasks[node].add(ts.key)
        if restrictions is None:
            ts.worker_restrictions = set(self.node_workers[node])
        else:  # one set per node, shared by the tasks of one re-targeting
            r = restrictions.get(node)
            if r is None:
                r = restrictions[node] = set(self.node_workers[node])
            ts.worker_restrictions = r
        ts.loose_restrictions = True

    def _retarget(self, joined: set[str], left: set[str], stimulus_id: str) -> None:
        """Re-target pending chunk tasks after nodes joined or left."""
        if not self.node_workers:
            return
        stasks = self.scheduler.tasks
        changed, self.workers_changed = self.workers_changed, set()
        # Tasks waiting for any node, and tasks of nodes whose workers changed.
        # Without a joined node, a task whose node kept its workers keeps its
        # target and its (equal) restrictions: only those of changed nodes are
        # looked at. A joined node may take tasks from any node: all are.
        keys = [k for k in self.chunk_of if k not in self.target]
        scan = set(self.node_tasks) - joined
        if not joined:
            scan &= changed | left
        for node in scan:
            keys.extend(self.node_tasks[node])
        pending = []
        for k in keys:
            ts = stasks.get(k)
            if ts is not None and ts.state in _PENDING:
                pending.append(ts)
        if not pending:
            return
        homes = self.home.assign([self.chunk_of[ts.key] for ts in pending])
        moved = failovers = requested = placed = 0
        stealing = self.stealing
        restrictions: dict[str, set] = {}
        for ts, home in zip(pending, homes):
            old = self.target.get(ts.key)
            if old in self.node_workers and home != old and home not in joined:
                # Unchanged node set for this chunk: keep it (e.g. balance spill).
                home = old
            if home == old and old not in changed and ts.processing_on is None:
                continue  # same node, same workers: nothing to change
            victim = ts.processing_on
            if victim is not None and victim.address not in self.scheduler.workers:
                # On a worker being removed: Dask releases it right after this.
                if old is not None and old not in self.node_workers:
                    failovers += 1
                    self.node_counters[old]["failovers"] += 1
                self._set_target(ts, home)
                continue
            if victim is not None:
                if home == old or ts.processing_on.address in self.node_workers[home]:
                    continue
                # Already on a worker: ask it to hand the task over, if not started.
                self._set_target(ts, home)
                thief = self._pick_worker(home)
                if stealing is not None and thief is not None:
                    requested += stealing.move(ts, thief, reason="membership")
                moved += 1
                continue
            if old is None:
                placed += 1
                self.node_counters[home]["placements"] += 1
            elif old not in self.node_workers:
                failovers += 1
                self.node_counters[old]["failovers"] += 1
            elif home != old:
                moved += 1
            self._set_target(ts, home, restrictions)
        self.counters["failovers"] += failovers
        self.counters["retargets"] += moved
        self.counters["placements"] += placed
        if moved or failovers or placed:
            self._event(
                {
                    "action": "retarget",
                    "placed": placed,
                    "failovers": failovers,
                    "moved": moved,
                    "move-requests": requested,
                    "joined": sorted(joined),
                    "left": sorted(left),
                    "reason": "cache nodes changed",
                    "stimulus_id": stimulus_id,
                }
            )

    def _pick_worker(self, node: str) -> WorkerState | None:
        workers = self.scheduler.workers
        live = [workers[a] for a in self.node_workers.get(node, ()) if a in workers]
        if not live:
            return None
        return min(live, key=lambda ws: (len(ws.processing) / ws.nthreads, ws.address))

    # ============================================================ transitions
    def transition(self, key, start, finish, *args, stimulus_id=None, **kwargs) -> None:
        chunk = self.chunk_of.get(key)
        if chunk is None:
            return
        if finish == "forgotten":
            self.chunk_of.pop(key, None)
            self.hashed.pop(key, None)
            self.stolen.discard(key)
            node = self.target.pop(key, None)
            if node is not None:
                tasks = self.node_tasks.get(node)
                if tasks is not None:
                    tasks.discard(key)
                    if not tasks:
                        del self.node_tasks[node]
            return
        if start == "processing" and finish == "memory":
            worker = kwargs.get("worker")
            node = self.worker_node.get(worker)
            stolen = key in self.stolen
            self.stolen.discard(key)
            meant = self.hashed.pop(key, None)
            if node is not None:
                h = _digest(chunk)
                holder = self.holder
                holder.pop(h, None)  # re-insert: newest last
                holder[h] = node
                if len(holder) > HOLDER_CAP:
                    del holder[next(iter(holder))]
                target = self.target.get(key)
                if meant is not None:  # sent by the locator: keep what placement chose
                    self.located[chunk] = (node, meant)
                elif stolen and target is not None:  # the thief's node holds it now
                    self.located[chunk] = (node, target)
                else:  # on its placement's node (or moved by a membership change)
                    self.located.pop(chunk, None)
                if node == target:
                    self.counters["on-target"] += 1
                    self.node_counters[node]["on-target"] += 1
                else:
                    self.counters["off-target"] += 1
                    self.node_counters[node]["off-target"] += 1
            return
        if start == "processing" and finish != "memory":
            # A worker may have died: re-target before Dask picks a new worker.
            self._sync_workers(stimulus_id or "cacheaffinity-transition")

    def note_steal(self, ts: TaskState, victim: WorkerState, thief: WorkerState) -> None:
        """Called by the stealing policy when it moves a chunk task."""
        if ts.key in self.chunk_of:
            self.stolen.add(ts.key)
        self.counters["steals"] += 1
        node = self.worker_node.get(thief.address)
        if node is not None:
            self.node_counters[node]["steals"] += 1

    def steal_preference(
        self,
        candidates: list[TaskState],
        victim: WorkerState,
        thief: WorkerState,
        *,
        take_warm: bool = True,
    ) -> TaskState | None:
        """Which of the victim's queued tasks a thief should take (None: none).

        Prefer chunks the thief's node is known to hold (the locator), then
        chunks no node holds (those whose next-nearest node is the thief's node
        first), then, if ``take_warm``, chunks the victim's node holds, then the
        task the victim would run last.
        """
        thief_node = self.worker_node.get(thief.address)
        victim_node = self.worker_node.get(victim.address)
        located, home, holder = self.located, self.home, self.holder
        return choose_steal(
            candidates,
            priority=lambda ts: ts.priority,
            chunk=lambda ts: self.chunk_of.get(ts.key),
            thief_holds=lambda c: thief_node is not None
            and located.get(c, ("",))[0] == thief_node,
            runner_up_is_thief=None
            if thief_node is None or len(self.node_workers) <= 1
            else lambda c: home.ranking(c, 2)[1:] == [thief_node],
            victim_holds=None
            if victim_node is None
            else lambda c: holder.get(_digest(c)) == victim_node,
            take_warm=take_warm,
        )

    # ============================================================ queries
    def where(self, chunks: Iterable[str]) -> dict[str, dict]:
        """Home node and live workers of each chunk under the current membership."""
        chunks = [str(c) for c in chunks]
        if not chunks:
            return {}
        if not self.node_workers:
            return {c: {"node": None, "workers": []} for c in chunks}
        homes = self.home.assign(chunks)
        return {
            c: {"node": n, "workers": sorted(self.node_workers.get(n, ()))}
            for c, n in zip(chunks, homes)
        }

    def info(self) -> dict:
        """A summary for clients, the dashboard and the command line."""
        nodes = {}
        workers = self.scheduler.workers if self.scheduler else {}
        for node, addrs in self.node_workers.items():
            stats: Counter[str] = Counter()
            directory = None
            for a in addrs:
                ws = workers.get(a)
                m = (ws.metrics or {}).get(WORKER_METRIC) if ws is not None else None
                if isinstance(m, dict):
                    directory = m.get("directory", directory)
                    for k, v in (m.get("stats") or {}).items():
                        if not isinstance(v, (int, float)):
                            continue
                        if k in DIRECTORY_WIDE:  # the same directory seen by each worker
                            stats[k] = max(stats[k], v)
                        else:  # per-process counters add up
                            stats[k] += v
            nodes[node] = {
                "workers": sorted(addrs),
                "weight": self.node_weight(node),
                "directory": directory,
                "stats": dict(stats),
                "counters": dict(self.node_counters.get(node, {})),
                "tasks": len(self.node_tasks.get(node, ())),
            }
        stealing = self.stealing
        return {
            "version": __version__,
            "placement": {
                "dimensions": self.placement.dimensions,
                "replicas": self.placement.replicas,
                "seed": self.placement.seed,
                "balance": self.placement.balance,
            },
            "nodes": nodes,
            "counters": dict(self.counters),
            "stealing": None
            if stealing is None
            else {
                "enabled": stealing.enabled,
                "steals": stealing.steals,
                "membership-moves": stealing.membership_moves,
            },
            "tracked-tasks": len(self.chunk_of),
            "located-chunks": len(self.located),
            "held-chunks": len(self.holder),
        }
