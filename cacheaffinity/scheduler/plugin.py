"""Cache-affine placement of chunk tasks: Dask's hooks (runs in the scheduler).

Defines :class:`CacheAffinityPlugin`, the scheduler plugin registered under the
fixed name ``cacheaffinity``.  It holds only Dask's hooks and delegates:

* :class:`~cacheaffinity.scheduler.membership.Membership`: which workers make
  up which cache node (learned from the workers' reports) and node weights;
* :class:`~cacheaffinity.placement.TorusPlacement`: the cache node of a chunk;
* :class:`~cacheaffinity.scheduler.locator.Locator`: the chunk tasks and their
  targets, where chunks were processed, the steal preference;
* :class:`~cacheaffinity.scheduler.stealing.LocalityStealing`: stealing of
  chunk tasks;
* :class:`~cacheaffinity.scheduler.retargeting.Retargeting`: moving placed
  chunk tasks when nodes join or leave;
* :class:`~cacheaffinity.scheduler.inheritance.Inheritance`: nodes that joined
  with cache entries this scheduler has no record of;
* :class:`~cacheaffinity.scheduler.counters.NodeCounters`: per-node counters;
* :class:`~cacheaffinity.scheduler.queries.Queries`: what it answers.

What it does:

* in :meth:`update_graph`, reads the chunk identity of every task annotated
  with ``cacheaffinity`` (see :mod:`cacheaffinity.client`), asks the placement
  for its cache node in one batch and restricts the task *loosely* to that
  node's live workers.  Tasks without a chunk identity, and chunk tasks a user
  restricted (``workers=``, hosts, ``resources=``), are left to Dask: the
  plugin never sets, changes or moves them;
* keeps Dask's ``WorkStealing`` extension for those tasks, which it only stops
  from seeing chunk tasks
  (:func:`~cacheaffinity.scheduler._distributed.adopt_stealing`);
* when a node leaves, re-targets its tasks (queued or released from a dead
  worker) to their next-nearest live node before Dask reschedules them; when a
  node joins, moves the not-yet-running tasks that now map to it (with a steal
  request: not when Dask's work stealing is switched off);
* marks a node whose workers have no usable cache *uncached* (with the reason,
  in :meth:`info`): it owns no part of the placement while a cached node
  exists (it may still steal work);
* adds up the figures each chunk task reports about itself per run
  (:class:`~cacheaffinity.scheduler.runs.RunFigures`, :meth:`run_stats`);
* logs its decisions to the event topic ``cacheaffinity`` and to the logger
  ``cacheaffinity.scheduler`` (per-task lines on ``cacheaffinity.scheduler.tasks``);
* :meth:`snapshot` is what the dashboard page, the Prometheus collector and the
  client read (answered by its :class:`~cacheaffinity.scheduler.queries.Queries`,
  as are :meth:`info`, :meth:`where` and :meth:`holders`).

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

from distributed.diagnostics.plugin import SchedulerPlugin

from cacheaffinity import config
from cacheaffinity._version import __version__
from cacheaffinity.placement import TorusPlacement
from cacheaffinity.protocol import (
    ANNOTATION,
    ENTRIES_ANNOTATION,
    HOLDERS_HANDLER,
    NODE_REPORT_TOPIC,
    PLUGIN_NAME,
    PREPROCESS_PREFIX,
    RUN_ANNOTATION,
    TASK_REPORT_TOPIC,
)
from cacheaffinity.scheduler import _distributed
from cacheaffinity.scheduler.counters import NodeCounters
from cacheaffinity.scheduler.forecast import Forecast, size_key
from cacheaffinity.scheduler.inheritance import Inheritance
from cacheaffinity.scheduler.locator import Locator
from cacheaffinity.scheduler.membership import Membership
from cacheaffinity.scheduler.metrics import register_collector
from cacheaffinity.scheduler.queries import Queries
from cacheaffinity.scheduler.retargeting import PENDING, Retargeting
from cacheaffinity.scheduler.runs import RunFigures
from cacheaffinity.scheduler.stealing import LocalityStealing

if TYPE_CHECKING:
    from distributed.scheduler import Scheduler, TaskState, WorkerState

logger = logging.getLogger("cacheaffinity.scheduler")
task_logger = logging.getLogger("cacheaffinity.scheduler.tasks")

__all__ = ["CacheAffinityPlugin"]

#: Restriction used while no cache node exists: no worker has this address, so
#: the task waits in ``no-worker`` (instead of Dask's root-task queue) until a
#: node joins and the plugin places it.
_NO_NODE = "cacheaffinity://no-cache-node-yet"
#: Key in ``Scheduler.periodic_callbacks`` of the look for workers whose node
#: arrived in a heartbeat (:meth:`CacheAffinityPlugin._check_pending`, every second).
PENDING_CALLBACK = "cacheaffinity-pending"


def _compute_seconds(startstops: Any) -> float | None:
    """Seconds a finished task computed (its ``compute`` start/stop pairs), or None."""
    t = 0.0
    try:
        for x in startstops or ():  # a plain loop: called once per finished chunk task
            if x["action"] == "compute":
                t += x["stop"] - x["start"]
    except (KeyError, TypeError):
        return None
    return float(t) if t > 0 else None


class CacheAffinityPlugin(SchedulerPlugin):
    """Scheduler plugin that sends every chunk task to its cache node.

    Configuration: ``cacheaffinity.scheduler`` (``dimensions``, ``replicas``,
    ``seed``, ``balance``, ``weights``, ``locator``, ``locator-size``,
    ``recent-placements``, ``stealing.*``); keyword arguments of the same names
    in snake_case override it, ``None`` reads the config when the plugin is made.

    Parameters
    ----------
    dimensions, replicas, seed, balance
        Passed to :class:`~cacheaffinity.placement.TorusPlacement`.
    weights
        ``{node_id: weight}`` overrides of node weights.
    stealing
        Keep chunk tasks out of Dask's stealing and run the locality policy for
        them (default).  ``False`` leaves the scheduler's stealing extension as
        it is (it then moves chunk tasks as plain tasks) and runs no policy.
    locator
        Send a chunk processed away from its placement's node last time to the
        node that processed it (and holds its columns), as long as its placement
        is unchanged.
    locator_size
        Chunks the locator remembers at most.
    locator_slack
        A chunk's holder keeps it up to this multiple of its fair share of a batch.
    recent_placements
        Chunk placements the dashboard page shows at most.
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
        locator_size: int | None = None,
        locator_slack: float | None = None,
        recent_placements: int | None = None,
    ):
        # the whole section (stealing.* included) and the arguments, checked here
        # once, before anything starts (cacheaffinity.config is the one place)
        c = config.settings(
            "scheduler",
            dimensions=dimensions,
            replicas=replicas,
            seed=seed,
            balance=balance,
            weights=weights,
            locator=locator,
            locator_size=locator_size,
            locator_slack=locator_slack,
            recent_placements=recent_placements,
        )
        #: The placement: :meth:`~TorusPlacement.assign` for submitted batches
        #: (bounded loads if ``balance`` is set), :meth:`~TorusPlacement.nearest`
        #: for re-targeting.
        self.placement = TorusPlacement(
            dimensions=c["dimensions"], replicas=c["replicas"], seed=c["seed"], balance=c["balance"]
        )
        #: Workers <-> cache nodes.
        self.membership = Membership(dict(c["weights"] or {}))
        #: Chunk tasks, targets, where chunks are.
        self.locator = Locator(
            self.membership,
            self.placement,
            size=c["locator-size"],
            use_locator=bool(c["locator"]),
            slack=c["locator-slack"],
        )
        #: Whether chunk tasks are kept from Dask's stealing and stolen by the policy.
        self.manage_stealing: bool = True if stealing is None else bool(stealing)
        #: The chunk-task stealing policy (set at :meth:`start`).
        self.stealing: LocalityStealing | None = None
        self.scheduler: Scheduler | None = None
        #: Counters (also exported as metrics).
        self.counters: Counter[str] = Counter()
        #: Per-node counters (placements, failovers, steals, on/off target).
        self.node_counters = NodeCounters(self.membership)
        #: Figures of the last runs, reported by their chunk tasks.
        self.runs = RunFigures()
        #: Chunk sizes and each run's working set per node (:mod:`.forecast`).
        self.forecast = Forecast()
        #: chunk tasks whose node's cache did not keep their chunk (reported before they
        #: finish; not made its holder): at most the chunk tasks the scheduler has
        self.not_kept: set = set()
        #: Nodes that joined with cache entries this scheduler has no record of.
        self.inheritance = Inheritance(
            self.membership, self.placement, self.node_counters, self.locator.node_tasks
        )
        #: Nodes that own a part of the placement (the cached ones, if any).
        self.owners: set[str] = set()
        #: (chunk id, node) of the last chunks placed, newest last (dashboard page)
        self.recent_placements: deque[tuple[str, str]] = deque(maxlen=c["recent-placements"])
        #: Moves placed chunk tasks when nodes join or leave.
        self.retargeting = Retargeting(
            self.membership, self.placement, self.locator, self.counters, self.node_counters
        )
        #: What the plugin answers (holders, where, info, snapshot, forecasts).
        self.queries = Queries(
            self.membership, self.placement, self.locator, self.inheritance, self.counters,
            self.node_counters, self.forecast, self.recent_placements,
        )  # fmt: skip

    # ============================================================ lifecycle
    async def start(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.membership.bind(scheduler.workers)
        register_collector(scheduler)  # /metrics: dask_cacheaffinity_* (idempotent)
        from cacheaffinity.scheduler.dashboard import install as install_dashboard

        install_dashboard(scheduler)  # dashboard page /cacheaffinity (idempotent)
        scheduler.handlers[HOLDERS_HANDLER] = self.holders
        if self.manage_stealing:
            _distributed.adopt_stealing(scheduler, self.locator.chunk_of)
            if self.stealing is None:
                self.stealing = LocalityStealing(
                    scheduler, self.locator, inherited=self.inheritance, on_steal=self._count_steal
                )
            self.stealing.start()
        for addr in list(scheduler.workers):
            self._learn_worker(addr)
        self._membership_changed("plugin-start", stimulus_id="cacheaffinity-start")
        # A worker whose plugin was set up before this plugin started reports its
        # node only in its metrics (next heartbeat): look for pending workers there.
        _distributed.start_periodic(scheduler, PENDING_CALLBACK, self._check_pending, 1.0)
        logger.info(
            "cacheaffinity %s placement active: %d cache nodes, %s; stealing: %s",
            __version__,
            len(self.membership.node_workers),
            self.describe(),
            self._stealing_mode(),
        )

    async def close(self) -> None:
        self._detach()

    def _detach(self) -> None:
        """Stop the periodic work and give chunk tasks back to Dask's stealing
        (idempotent; the plugin was closed, removed or replaced)."""
        if self.scheduler is not None:
            _distributed.stop_periodic(self.scheduler, PENDING_CALLBACK, self._check_pending)
            h = self.scheduler.handlers.get(HOLDERS_HANDLER)
            if getattr(h, "__self__", None) is self:
                del self.scheduler.handlers[HOLDERS_HANDLER]
        if self.stealing is not None:
            self.stealing.stop()
        if self.scheduler is not None and self.manage_stealing:
            _distributed.release_stealing(self.scheduler, self.locator.chunk_of)

    def _stealing_mode(self) -> str:
        st = self.stealing
        if st is None:
            return "left to Dask for all tasks"
        if not st.dask_stealing:
            return "off (distributed.scheduler.work-stealing: false)"
        if st.extension is None:
            return "unknown stealing extension: chunk tasks not protected"
        return "Dask for plain tasks, " + (
            "cacheaffinity policy for chunk tasks"
            if st.enabled
            else "none for chunk tasks (cacheaffinity.scheduler.stealing.enabled: false)"
        )

    def _check_pending(self) -> None:
        """Pending workers whose heartbeat now carries their node become cache nodes."""
        s = self.scheduler
        if s is None or s.plugins.get(PLUGIN_NAME) is not self:  # removed or replaced
            self._detach()  # Scheduler.remove_plugin does not call close()
            return
        for addr, _, _ in self.membership.reported_pending():
            self._handle_node_report(addr, reported=False)
        self.inheritance.note_pending()
        self._prune_nodes()

    def _prune_nodes(self) -> None:
        """Keep per-node state to the live nodes and the last ``MAX_DEPARTED`` that
        left (``Membership.known_nodes``), however many nodes come and go."""
        self.node_counters.prune()
        self.inheritance.prune()

    def describe(self) -> str:
        p = self.placement
        return (
            f"torus dimensions={p.dimensions} replicas={p.replicas} seed={p.seed} "
            f"balance={p.balance}"
        )

    def _event(self, msg: dict) -> None:
        if self.scheduler is not None:
            self.scheduler.log_event(PLUGIN_NAME, msg)

    # ============================================================ membership
    def _learn_worker(
        self, addr: str, node=None, weight=None, reported: bool = False, uncached=None
    ) -> bool:
        changed = self.membership.learn(
            addr,
            node,
            weight,
            reported=reported,
            report_expected=PLUGIN_NAME in self.scheduler.worker_plugins,
            uncached=uncached,
        )
        self.inheritance.note_worker(addr)
        return changed

    def add_worker(self, scheduler: Scheduler, worker: str) -> None:
        if self._learn_worker(worker):
            self._membership_changed(
                "worker-added", worker=worker, stimulus_id=f"cacheaffinity-add-{worker}"
            )

    def remove_worker(self, scheduler: Scheduler, worker: str, **kwargs: Any) -> None:
        self._sync_workers(kwargs.get("stimulus_id") or "cacheaffinity-remove")

    def log_event(self, topic: str, msg: Any) -> None:
        if topic == TASK_REPORT_TOPIC and isinstance(msg, dict):
            self.runs.report(msg)
            key = msg.get("key")
            chunk = self.locator.chunk_of.get(key)
            if chunk is not None:  # the report arrives before the task finishes
                self.forecast.reported(size_key(chunk, self.locator.entries.get(key)), msg.get("chunk_bytes"))
                if msg.get("chunks_not_kept"):
                    self.not_kept.add(key)
        elif topic == NODE_REPORT_TOPIC and isinstance(msg, dict) and msg.get("worker"):
            self._handle_node_report(
                msg["worker"], msg.get("node"), msg.get("weight"), msg.get("uncached")
            )

    def _handle_node_report(
        self, worker: str, node=None, weight=None, uncached=None, reported: bool = True
    ) -> None:
        """A worker plugin announced its cache node (None: unusable cache
        directory, the worker is its host's node) and, if it caches nothing,
        why (``reported=False``: read both from its metrics)."""
        stimulus_id = f"cacheaffinity-node-{worker}"
        if not reported:
            node = weight = uncached = None
        elif node is not None:
            node = str(node)
        if self._learn_worker(worker, node, weight, reported=reported, uncached=uncached):
            self._membership_changed("node-reported", worker=worker, stimulus_id=stimulus_id)
            # Tasks that waited for a cache node (no-worker) may run now.
            ws = self.scheduler.workers.get(worker)
            if ws is not None and ws.status.name == "running":
                _distributed.schedule_unrunnable(self.scheduler, ws, stimulus_id)

    def _sync_workers(self, stimulus_id: str) -> None:
        """Drop workers the scheduler no longer has (called from hooks)."""
        gone = self.membership.gone()
        if not gone:
            return
        for addr in gone:
            self.membership.forget(addr)
        self._membership_changed("worker-removed", worker=gone, stimulus_id=stimulus_id)

    def _membership_changed(self, reason: str, *, stimulus_id: str, worker=None) -> None:
        """Rebuild the placement and re-target the tasks that must move."""
        # Uncached nodes keep nothing for the next run: while a cached node
        # exists they own no part of the placement (they may still steal).
        nodes = self.membership.placement_weights()
        before = set(self.placement.nodes) if self.placement.nodes else set()
        if nodes:
            self.placement.set_nodes(nodes)
        self.owners = set(nodes)
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
                "cache nodes changed (%s): +%s -%s, %d placing",
                reason,
                sorted(joined),
                sorted(left),
                len(nodes),
            )
            uncached = self.membership.uncached_nodes()
            if uncached:
                logger.info(
                    "cacheaffinity: %d node(s) cache nothing%s: %s",
                    len(uncached),
                    "" if set(uncached) & set(nodes) else " and get no placement",
                    "; ".join(f"{n}: {r}" for n, r in sorted(uncached.items())),
                )
        event = self.retargeting.retarget(
            self.scheduler, self.stealing, self.owners, joined, left, stimulus_id
        )
        if event is not None:
            self._event(event)

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
        entries = annotations.get(ENTRIES_ANNOTATION) or {}
        entry_of = entries.get
        # Runs once per submitted graph; the loops below run once per chunk task,
        # so they read attributes into locals and call nothing per task but the
        # locator's bookkeeping.
        stasks = scheduler.tasks
        locator = self.locator
        chunk_of = locator.chunk_of
        track = locator.track
        todo: list[tuple[TaskState, str]] = []
        append = todo.append
        restricted = 0
        for key, chunk in chunks.items():
            if chunk is None:
                continue
            ts = stasks.get(key)
            if ts is None or ts.processing_on is not None or ts.state not in PENDING:
                continue
            if key not in chunk_of and (
                ts.worker_restrictions
                or ts.host_restrictions
                or ts.resource_restrictions
                or ts.actor
            ):
                # A user restricted it (workers, hosts, resources) or it is an
                # actor: the user's restrictions win, Dask places it.
                restricted += 1
                continue
            if type(chunk) is not str:
                chunk = str(chunk)
            track(key, chunk, entry_of(key))
            append((ts, chunk))
        if restricted:
            self.counters["user-restricted"] += restricted
            self._event(
                {
                    "action": "skip",
                    "tasks": restricted,
                    "reason": "chunk tasks with workers/hosts/resources restrictions are "
                    "left to Dask",
                    "stimulus_id": stimulus_id,
                }
            )
        if not todo:
            return
        node_workers = self.membership.node_workers
        runs = annotations.get(RUN_ANNOTATION) or {}
        graph_run = f"graph:{stimulus_id}"
        # a run's ``tasks`` are its chunk tasks; its preprocessing tasks report
        # their figures with the run named in the report
        self.runs.submitted(
            {
                ts.key: runs.get(ts.key) or graph_run
                for ts, chunk in todo
                if not chunk.startswith(PREPROCESS_PREFIX)
            }
        )
        if not node_workers:
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
        debug = task_logger.isEnabledFor(logging.DEBUG)
        hashed = list(nodes) if debug else nodes
        located = locator.relocate(todo, nodes)
        per_node: Counter[str] = Counter(nodes)
        # One restriction set per node, shared by its tasks of this batch (the
        # scheduler replaces restriction sets, it never changes them in place).
        restrictions = {node: set(node_workers[node]) for node in per_node}
        set_target = locator.set_target
        for (ts, _), node in zip(todo, nodes):
            set_target(ts.key, node)
            ts.worker_restrictions = restrictions[node]
            ts.loose_restrictions = True
        per_run: defaultdict[str, list] = defaultdict(list)
        for (ts, chunk), node in zip(todo, nodes):
            if not chunk.startswith(PREPROCESS_PREFIX):
                per_run[runs.get(ts.key) or graph_run].append((size_key(chunk, entry_of(ts.key)), node))
        for run, placed in per_run.items():
            self.forecast.submitted(run, placed)
        if debug:
            for (ts, chunk), node, h in zip(todo, nodes, hashed):
                reason = "hash" if node == h else "locator"
                task_logger.debug("%s: chunk %s -> node %s (%s)", ts.key, chunk, node, reason)
        self.counters["placements"] += len(todo)
        self.counters["located"] += located
        m = self.recent_placements.maxlen or 0
        if m:
            self.recent_placements.extend(zip([c for _, c in todo[-m:]], nodes[-m:]))
        for node, n in per_node.items():
            self.node_counters.add(node, "placements", n)
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

    # ============================================================ transitions
    def transition(self, key, start, finish, *args, **kwargs) -> None:
        # Called for every transition of every task (about 4 per task, chunk
        # task or not): all but "-> forgotten" and "processing ->" return after
        # two string comparisons, before any lookup.
        if finish == "forgotten":
            locator = self.locator
            if key in locator.chunk_of:
                locator.forget_task(key)
                self.runs.forget(key)
                self.not_kept.discard(key)
                if self.stealing is not None:
                    self.stealing.forget(key)
            return
        if start != "processing":
            return
        locator = self.locator
        if key not in locator.chunk_of:
            return
        if finish == "memory":
            membership = self.membership
            worker = kwargs.get("worker")
            node = membership.worker_node.get(worker)
            if node is not None and worker in membership.worker_uncached:
                # it keeps nothing: not a holder of the chunk, nor a speed sample
                locator.finished(key, None)
                on_target = locator.target.get(key) == node
            else:
                seconds = _compute_seconds(kwargs.get("startstops"))
                stealing = self.stealing
                if (
                    stealing is not None and stealing.warm_stolen and node is not None
                    and stealing.finished(key, worker, seconds, locator.speed.smoothed.get(node))
                ):  # fmt: skip
                    seconds = None  # the thief's links' time, not the node's speed
                kept = not (self.not_kept and key in self.not_kept)
                if not kept:
                    self.not_kept.discard(key)
                on_target = locator.finished(key, node, seconds, kept)
            if on_target is not None:
                which = "on-target" if on_target else "off-target"
                self.counters[which] += 1
                self.node_counters.add(node, which)
            return
        # A worker may have died: re-target before Dask picks a new worker.
        self._sync_workers(kwargs.get("stimulus_id") or "cacheaffinity-transition")

    def _count_steal(self, ts: TaskState, victim: WorkerState, thief: WorkerState) -> None:
        """The stealing policy moved chunk task ``ts`` from ``victim`` to ``thief``."""
        self.counters["steals"] += 1
        self.runs.steal(ts.key)
        node = self.membership.node_of(thief.address)
        if node is not None:
            self.node_counters.add(node, "steals")

    # ============================================================ queries
    def holders(
        self,
        chunk: str | None = None,
        start: int | None = None,
        stop: int | None = None,
        worker: str | None = None,
    ) -> list[str]:
        """Handler ``cacheaffinity_holders``: a worker per other live node holding
        entries ``[start, stop)`` of ``chunk`` (:meth:`.Queries.holders`)."""
        return self.queries.holders(chunk, start, stop, worker)

    def where(self, chunks: Iterable[str]) -> dict[str, dict]:
        """Home node and live workers of each chunk under the current membership."""
        return self.queries.where(chunks)

    def info(self) -> dict:
        """A summary for clients, the dashboard and the command line (:meth:`.Queries.info`)."""
        return self.queries.info(self.stealing, self.owners)

    def run_stats(self, run: str | None = None, last: int = 1) -> list[dict]:
        """Figures of run ``run`` (``[]`` if unknown), or of the ``last`` runs
        (newest last); see :class:`~cacheaffinity.scheduler.runs.RunFigures`."""
        out = self.runs.get(run, last)
        for rec in out:
            rec["forecast"] = self.forecast_of(rec["run"])
        return out

    def forecast_of(self, run: str) -> dict | None:
        """The working-set forecast of ``run`` (:meth:`.forecast.Forecast.get`) with the
        nodes' capacities and admission policies as their workers report them now."""
        return self.queries.forecast_of(run)

    def latest_forecast(self) -> dict | None:
        """The forecast of the newest run that has one, with its ``run`` id, or None."""
        return self.queries.latest_forecast()

    def snapshot(self) -> dict:
        """What the dashboard page and the Prometheus collector read
        (:meth:`.Queries.snapshot` of :meth:`info`, the method: a subclass or a
        test may replace it)."""
        return self.queries.snapshot(self.info())
