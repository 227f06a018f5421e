"""Dask's hooks of the placement plugin (runs in the scheduler).

``CacheAffinityPlugin`` (registered as ``cacheaffinity``) holds only Dask's hooks
and delegates to ``Membership``, ``TorusPlacement``, ``Locator``,
``LocalityStealing``, ``Retargeting``, ``Inheritance``, ``NodeCounters``,
``RunFigures``, ``Forecast`` and ``Queries``. It never restricts, changes or moves
tasks without a chunk identity, nor chunk tasks a user restricted (``workers=``,
hosts, ``resources=``) or actors.

Event-loop only (no locking). A hook that raises is logged by Dask and leaves the
task to Dask's placement: a cache miss, never a wrong result.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
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
from cacheaffinity.scheduler._counters import NodeCounters
from cacheaffinity.scheduler._forecast import Forecast, emptied_nodes, size_key, size_keys
from cacheaffinity.scheduler._inheritance import Inheritance
from cacheaffinity.scheduler._locator import Locator
from cacheaffinity.scheduler._membership import Membership
from cacheaffinity.scheduler._metrics import register_collector
from cacheaffinity.scheduler._pending import PendingIndex
from cacheaffinity.scheduler._queries import Queries
from cacheaffinity.scheduler._retargeting import PENDING, Retargeting
from cacheaffinity.scheduler._runs import RunFigures
from cacheaffinity.scheduler._stealing import LocalityStealing

if TYPE_CHECKING:
    from distributed.scheduler import Scheduler, TaskState, WorkerState

logger = logging.getLogger("cacheaffinity.scheduler")
task_logger = logging.getLogger("cacheaffinity.scheduler.tasks")

__all__ = ["CacheAffinityPlugin"]

# No worker has this address: the task waits in ``no-worker`` (not in Dask's
# root-task queue) until a cache node joins and the plugin places it.
_NO_NODE = "cacheaffinity://no-cache-node-yet"
# Periodic look for pending workers whose node arrived in a heartbeat.
PENDING_CALLBACK = "cacheaffinity-pending"
#: From this many pending chunk tasks on, joins are gathered (all joins of one pass
#: of the event loop are one membership change) and handled in slices that yield
#: to the event loop; a leave sets the new layout inside its hook and moves tasks in
#: slices; below, each change is handled at once, inside its hook.
SLICED_FROM = 50_000
# The pause between two slices of a membership change (a timer: see _flush_later).
_YIELD_S = 1e-6


def _compute_seconds(startstops: Any) -> float | None:
    """Seconds a finished task computed (its ``compute`` start/stop pairs), or None."""
    t = 0.0
    try:
        for x in startstops or ():
            if x["action"] == "compute":
                t += x["stop"] - x["start"]
    except (KeyError, TypeError):
        return None
    return float(t) if t > 0 else None


class CacheAffinityPlugin(SchedulerPlugin):
    """Scheduler plugin that restricts every chunk task loosely to its cache node.

    Keyword arguments override the ``cacheaffinity.scheduler`` settings of the same
    names (snake_case); ``None`` reads the config when the plugin is made. Tasks are
    re-targeted when cache nodes join or leave; results never depend on placement.

    Parameters
    ----------
    dimensions, replicas, seed, balance
        Passed to :class:`~cacheaffinity.TorusPlacement`.
    weights
        ``{node_id: weight}`` overrides of node weights.
    stealing
        Keep chunk tasks out of Dask's stealing and steal them with
        :class:`~cacheaffinity.LocalityStealing` (default). ``False`` leaves Dask's
        stealing extension as it is (it then moves chunk tasks as plain tasks).
    locator
        Send a chunk to the node that processed it last (its holder).
    locator_size
        Chunk ids the locator remembers at most.
    locator_slack
        A holder takes chunks up to this multiple of its fair share of a batch.
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
        #: The cache node of each chunk.
        self.placement = TorusPlacement(
            dimensions=c["dimensions"], replicas=c["replicas"], seed=c["seed"], balance=c["balance"]
        )
        self.membership = Membership(dict(c["weights"] or {}))
        self.locator = Locator(
            self.membership,
            self.placement,
            size=c["locator-size"],
            use_locator=bool(c["locator"]),
            slack=c["locator-slack"],
        )
        self.manage_stealing: bool = True if stealing is None else bool(stealing)
        #: The chunk-task stealing policy (set by ``start``).
        self.stealing: LocalityStealing | None = None
        self.scheduler: Scheduler | None = None
        #: Totals over all nodes (placements, failovers, steals, ...).
        self.counters: Counter[str] = Counter()
        self.node_counters = NodeCounters(self.membership)
        self.runs = RunFigures()
        self.forecast = Forecast()
        # chunk tasks whose cache refused their chunk (reported before they finish)
        self.not_kept: set = set()
        self.inheritance = Inheritance(
            self.membership, self.placement, self.node_counters, self.locator.node_tasks
        )
        #: Nodes that own a part of the placement (the cached ones, if any).
        self.owners: set[str] = set()
        # (chunk id, node) of the last chunks placed, newest last
        self.recent_placements: deque[tuple[str, str]] = deque(maxlen=c["recent-placements"])
        #: Pending chunk tasks by their nearest replica point (what a join moves).
        self.pending = PendingIndex(self.placement)
        self.sliced_from: int = SLICED_FROM
        # a membership change not handled yet: (reason, stimulus_id, worker)
        self._deferred: tuple | None = None
        # the membership change in progress (a generator of slices), and its driver
        self._steps = None
        self._flush_task: asyncio.Task | None = None
        # workers to offer unrunnable tasks to once the deferred change is done
        self._unrunnable: dict[str, str] = {}
        self.retargeting = Retargeting(
            self.membership, self.placement, self.locator, self.counters, self.node_counters
        )
        self.queries = Queries(
            self.membership, self.placement, self.locator, self.inheritance, self.counters,
            self.node_counters, self.forecast, self.recent_placements,
        )  # fmt: skip

    async def start(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.membership.bind(scheduler.workers)
        register_collector(scheduler)
        from cacheaffinity.scheduler._dashboard import install as install_dashboard

        install_dashboard(scheduler)
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
        # a worker whose plugin was set up before this one reports its node only
        # in its metrics (next heartbeat)
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
        """Stop the periodic work, give chunk tasks back to Dask's stealing (idempotent)."""
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
        """Keep per-node state to the live nodes and the last ``MAX_DEPARTED`` that left."""
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
                "worker-added", worker=worker, stimulus_id=f"cacheaffinity-add-{worker}",
                join=True,
            )

    def remove_worker(self, scheduler: Scheduler, worker: str, **kwargs: Any) -> None:
        self._sync_workers(kwargs.get("stimulus_id") or "cacheaffinity-remove")

    def log_event(self, topic: str, msg: Any) -> None:
        if topic == TASK_REPORT_TOPIC and isinstance(msg, dict):
            self.runs.report(msg)
            key = msg.get("key")
            chunk = self.locator.chunk_of.get(key)
            if chunk is not None:  # the report arrives before the task finishes
                ts = self.scheduler.tasks.get(key)
                ws = getattr(ts, "processing_on", None)
                self.forecast.reported(
                    size_key(chunk, self.locator.entries.get(key)), msg.get("chunk_bytes"),
                    self.membership.worker_node.get(ws.address) if ws is not None else None,
                    kept=not msg.get("chunks_not_kept"),
                )
                if msg.get("chunks_not_kept"):
                    self.not_kept.add(key)
        elif topic == NODE_REPORT_TOPIC and isinstance(msg, dict) and msg.get("worker"):
            self._handle_node_report(
                msg["worker"], msg.get("node"), msg.get("weight"), msg.get("uncached")
            )

    def _handle_node_report(
        self, worker: str, node=None, weight=None, uncached=None, reported: bool = True
    ) -> None:
        """A worker announced its cache node (None: its host's node) and why it caches
        nothing, if so (``reported=False``: read both from its metrics)."""
        stimulus_id = f"cacheaffinity-node-{worker}"
        if not reported:
            node = weight = uncached = None
        elif node is not None:
            node = str(node)
        if self._learn_worker(worker, node, weight, reported=reported, uncached=uncached):
            self._unrunnable[worker] = stimulus_id
            self._membership_changed(
                "node-reported", worker=worker, stimulus_id=stimulus_id, join=True
            )

    def _offer_unrunnable(self) -> None:
        """Workers whose node was reported may run the tasks waiting for a worker."""
        todo, self._unrunnable = self._unrunnable, {}
        for worker, stimulus_id in todo.items():
            ws = self.scheduler.workers.get(worker)
            if ws is not None and ws.status.name == "running":
                _distributed.schedule_unrunnable(self.scheduler, ws, stimulus_id)

    def _sync_workers(self, stimulus_id: str) -> None:
        """Drop workers the scheduler no longer has."""
        gone = self.membership.gone()
        if not gone:
            return
        self.flush()
        for addr in gone:
            self.membership.forget(addr)
        self._membership_changed("worker-removed", worker=gone, stimulus_id=stimulus_id)

    def _membership_changed(
        self, reason: str, *, stimulus_id: str, worker=None, join: bool = False
    ) -> None:
        """Rebuild the placement and re-target the tasks that must move: at once, or, with
        ``sliced_from`` pending tasks or more, in slices (``_flush_later``): a ``join``
        after the other joins of this pass of the event loop, a leave with its new layout
        set here."""
        sliced = len(self.pending) >= self.sliced_from and self.scheduler is not None
        if join and sliced:
            if self._deferred is None:
                self._deferred = (reason, stimulus_id, worker)
            if self._flush_task is None:
                self._flush_task = asyncio.ensure_future(self._flush_later())
            return
        self._deferred = None
        self._finish_steps()
        self._steps = self._membership_steps(reason, stimulus_id=stimulus_id, worker=worker)
        if sliced:
            # a leave: the new layout now (no node without workers is a home from here
            # on; Dask has already re-decided the departed workers' tasks), the tasks'
            # moves in slices (``_flush_later``)
            next(self._steps)
            if self._flush_task is None:
                self._flush_task = asyncio.ensure_future(self._flush_later())
            return
        self._finish_steps()
        self._offer_unrunnable()

    def _finish_steps(self) -> None:
        """Run the membership change in progress to its end, in one piece."""
        while self._steps is not None:
            try:
                next(self._steps)
            except StopIteration:
                self._steps = None

    def flush(self) -> None:
        """Handle a gathered or unfinished membership change now, in one piece: what
        placement, queries and leaves need first."""
        self._finish_steps()
        if self._deferred is not None:
            reason, stimulus_id, worker = self._deferred
            self._membership_changed(reason, stimulus_id=stimulus_id, worker=worker)

    @property
    def settled(self) -> bool:
        """Whether no membership change waits or runs."""
        return self._deferred is None and self._steps is None

    async def _flush_later(self) -> None:
        """Handle gathered joins, and a leave's moves, in slices, yielding to the event loop
        between them."""
        try:
            await asyncio.sleep(0)  # the joins of this pass of the loop come first
            while self._deferred is not None or self._steps is not None:
                if self._steps is None:
                    reason, stimulus_id, worker = self._deferred
                    self._deferred = None
                    self._steps = self._membership_steps(
                        reason, stimulus_id=stimulus_id, worker=worker
                    )
                try:
                    next(self._steps)
                except StopIteration:
                    self._steps = None
                    self._offer_unrunnable()
                # through the timer heap, not sleep(0): the next slice then waits behind
                # the messages and timers that came due meanwhile (sleep(0) would queue
                # it ahead of them, and they would wait two slices)
                await asyncio.sleep(_YIELD_S)
        finally:
            self._flush_task = None

    def _membership_steps(self, reason: str, *, stimulus_id: str, worker=None):
        """The membership change as a generator of slices (see ``_membership_changed``)."""
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
        yield  # the new layout is a slice of its own (its tree, if a query builds it: ~0.05 s)
        rehomed = yield from self.pending.relayout_steps()
        event = yield from self.retargeting.retarget_steps(
            self.scheduler, self.stealing, self.owners, joined, left, stimulus_id,
            rehomed, self.pending,
        )  # fmt: skip
        if event is not None:
            self._event(event)

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
        self.flush()
        entries = annotations.get(ENTRIES_ANNOTATION) or {}
        entry_of = entries.get
        # per-task loops: attributes read into locals
        stasks = scheduler.tasks
        locator = self.locator
        chunk_of = locator.chunk_of
        # parallel lists, not (task, chunk) tuples: a million tuples that outlive
        # two young collections would trigger a full one (10^6 tasks: ~1.5 s)
        todo: list[TaskState] = []
        todo_keys: list = []
        todo_chunks: list[str] = []
        append, append_key, append_chunk = todo.append, todo_keys.append, todo_chunks.append
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
                restricted += 1
                continue
            if type(chunk) is not str:
                chunk = str(chunk)
            append(ts)
            append_key(key)
            append_chunk(chunk)
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
        locator.track_many(todo_keys, todo_chunks, entries, untargeted=not node_workers)
        runs = annotations.get(RUN_ANNOTATION) or {}
        graph_run = f"graph:{stimulus_id}"
        # a run's ``tasks`` are its chunk tasks, not its preprocessing tasks
        preprocess = any(c.startswith(PREPROCESS_PREFIX) for c in todo_chunks)
        if not runs and not preprocess:  # one run: no per-task dict built for it
            self.runs.submitted_keys(todo_keys, graph_run)
            chunk_tasks = True
        else:
            run_of = {
                k: runs.get(k) or graph_run
                for k, chunk in zip(todo_keys, todo_chunks)
                if not chunk.startswith(PREPROCESS_PREFIX)
            }
            self.runs.submitted(run_of)
            chunk_tasks = bool(run_of)
        placement = self.placement
        x = placement.coordinates(todo_chunks)
        if not node_workers:
            self.pending.add(todo_keys, x)
            for ts in todo:
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
        codes = None
        if placement.balance is None:  # assign() without hashing again
            dist, idx = placement.nearest_points(x)
            layout = placement.layout()
            codes = layout.point_node[idx]
            nodes = layout.names_arr[codes].tolist()
        else:
            nodes = placement.assign(todo_chunks)
            dist = idx = None
        self.pending.add(todo_keys, x, dist, idx)
        debug = task_logger.isEnabledFor(logging.DEBUG)
        hashed = list(nodes) if debug else nodes
        located = locator.relocate(todo_keys, todo_chunks, nodes)
        if codes is not None and not located:
            counts = np.bincount(codes, minlength=len(layout.names)).tolist()
            per_node = Counter({n: c for n, c in zip(layout.names, counts) if c})
            locator.set_targets_coded(todo_keys, codes, layout.names)
        else:
            per_node = Counter(nodes)
            locator.set_targets(todo_keys, nodes)
        # one set per node, shared by its tasks: Dask replaces restriction sets,
        # never changes them in place
        restrictions = {node: set(node_workers[node]) for node in per_node}
        for ts, node in zip(todo, nodes):
            ts.worker_restrictions = restrictions[node]
            ts.loose_restrictions = True
        if chunk_tasks:
            if runs or preprocess or entries:
                per_run: defaultdict[str, list] = defaultdict(list)
                for k, chunk, node in zip(todo_keys, todo_chunks, nodes):
                    if not chunk.startswith(PREPROCESS_PREFIX):
                        per_run[runs.get(k) or graph_run].append((size_key(chunk, entry_of(k)), node))
                placed_of = per_run.items()
            else:  # one run, no entry ranges: no per-task tuples kept
                placed_of = None
            empty = emptied_nodes(node_workers, self.membership.workers, self.forecast.stored)
            if placed_of is None:
                coded = (codes, layout.names) if codes is not None and not located else None
                self.forecast.submitted_columns(graph_run, size_keys(todo_chunks), nodes, empty, coded)
            for run, placed in placed_of or ():
                self.forecast.submitted(run, placed, empty)
        if debug:
            for ts, chunk, node, h in zip(todo, todo_chunks, nodes, hashed):
                reason = "hash" if node == h else "locator"
                task_logger.debug("%s: chunk %s -> node %s (%s)", ts.key, chunk, node, reason)
        self.counters["placements"] += len(todo)
        self.counters["located"] += located
        m = self.recent_placements.maxlen or 0
        if m:
            self.recent_placements.extend(zip(todo_chunks[-m:], nodes[-m:]))
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

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        # called ~4 times per task of any kind: return before any lookup
        if finish == "forgotten":
            locator = self.locator
            if key in locator.chunk_of:
                self.pending.discard(key)
                locator.forget_task(key)
                self.runs.forget(key)
                self.not_kept.discard(key)
                if self.stealing is not None:
                    self.stealing.forget(key)
            return
        if start != "processing":
            if finish == "erred" or finish == "memory":
                self.pending.discard(key)
            elif (start == "memory" or start == "erred") and finish in PENDING:
                chunk = self.locator.chunk_of.get(key)
                if chunk is not None:  # pending again (lost data, retry)
                    self.pending.add_chunks([key], [chunk])
            return
        locator = self.locator
        if key not in locator.chunk_of:
            return
        if finish not in PENDING:
            self.pending.discard(key)
        if finish == "memory":
            membership = self.membership
            worker = kwargs.get("worker")
            node = membership.worker_node.get(worker)
            if node is not None and worker in membership.worker_uncached:
                # keeps nothing: neither a holder nor a speed sample
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
        if finish == "erred":
            self._run_erred(key, kwargs.get("exception_text"))
        # a worker may have died: re-target before Dask picks a new worker
        self._sync_workers(kwargs.get("stimulus_id") or "cacheaffinity-transition")

    def _run_erred(self, key: Any, error: Any) -> None:
        """Chunk or preprocessing task ``key`` failed: its run is marked failed."""
        ts = self.scheduler.tasks.get(key)
        run = (getattr(ts, "annotations", None) or {}).get(RUN_ANNOTATION)
        if isinstance(run, Mapping):
            run = run.get(key)
        self.runs.erred(key, run if isinstance(run, str) else None,
                        error or getattr(ts, "exception_text", None))  # fmt: skip

    def _count_steal(self, ts: TaskState, victim: WorkerState, thief: WorkerState) -> None:
        """The stealing policy moved chunk task ``ts`` from ``victim`` to ``thief``."""
        self.counters["steals"] += 1
        self.runs.steal(ts.key)
        node = self.membership.node_of(thief.address)
        if node is not None:
            self.node_counters.add(node, "steals")

    def holders(
        self,
        chunk: str | None = None,
        start: int | None = None,
        stop: int | None = None,
        worker: str | None = None,
    ) -> list[str]:
        """Handler ``cacheaffinity_holders``: a worker per other live node holding
        entries ``[start, stop)`` of ``chunk``, most likely first."""
        return self.queries.holders(chunk, start, stop, worker)

    def where(self, chunks: Iterable[str]) -> dict[str, dict]:
        """Home node and live workers of each chunk under the current membership."""
        self.flush()
        return self.queries.where(chunks)

    def info(self) -> dict:
        """A summary for clients, the dashboard and the command line."""
        self.flush()
        return self.queries.info(self.stealing, self.owners)

    def run_stats(self, run: str | None = None, last: int = 1) -> list[dict]:
        """Figures of run ``run`` (``[]`` if unknown), or of the ``last`` runs, newest last."""
        out = self.runs.get(run, last)
        for rec in out:
            rec["forecast"] = self.forecast_of(rec["run"])
        return out

    def forecast_of(self, run: str) -> dict | None:
        """The working-set forecast of ``run`` with the capacities and admission
        policies the nodes' workers report now (None: unknown run)."""
        return self.queries.forecast_of(run)

    def latest_forecast(self) -> dict | None:
        """The forecast of the newest run that has one, with its ``run`` id, or None."""
        return self.queries.latest_forecast()

    def snapshot(self) -> dict:
        """:meth:`info` plus what the dashboard page and the Prometheus collector read.

        Calls :meth:`info` as a method, so a subclass or a test may replace it.
        """
        return self.queries.snapshot(self.info())
