"""Locality-preserving work stealing (runs in the scheduler).

Defines :class:`LocalityStealing`, a drop-in replacement of Dask's
:class:`distributed.stealing.WorkStealing` that the cacheaffinity scheduler
plugin installs as ``scheduler.extensions["stealing"]``.

Dask's stock stealing ignores loose restrictions and prices a task without
dependencies at zero transfer cost, so it moves chunk tasks freely and destroys
the chunk -> cache-node assignment.  This class keeps the stock machinery that
other parts of Dask read (``stealable``, ``metrics``, ``cost_multipliers``,
``in_flight``, the ``steal-request``/``steal-response`` protocol, the
``stealing`` event topic) and replaces only the *policy* in :meth:`balance`:

* a worker may take a task from another worker only after it has been idle for
  at least ``cacheaffinity.scheduler.stealing.idle-time``;
* and only from a victim whose queue holds more than
  ``cacheaffinity.scheduler.stealing.backlog`` tasks per thread beyond what it
  is executing;
* at most ``cacheaffinity.scheduler.stealing.max-moves`` moves per
  ``cacheaffinity.scheduler.stealing.interval``;
* among the victim's queued tasks it prefers chunks the thief's cache node is
  known to hold, then chunks no node is known to hold (whose next-nearest node
  is the thief's node first), then the task the victim would run last;
* a chunk the victim's node holds (it processed it before) is taken by a thief
  that does not hold it only if the victim's queue holds more than
  ``cacheaffinity.scheduler.stealing.warm-backlog`` tasks per thread: such a
  steal turns a cache hit into a read from storage and a decompression, which
  costs about as much as that many cached chunks (LZMA: 8-10x);
* a task that has started is never moved (the victim refuses the
  ``steal-request`` of an executing task).

``distributed.scheduler.work-stealing: false`` or
``cacheaffinity.scheduler.stealing.enabled: false`` turn the policy off; the
extension then only carries the moves the placement plugin asks for when cache
nodes join (:meth:`move`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from time import monotonic
from typing import TYPE_CHECKING, Any

import dask.config
from distributed.stealing import WorkStealing

from cacheaffinity import config

if TYPE_CHECKING:
    from distributed.scheduler import Scheduler, TaskState, WorkerState

    from cacheaffinity.scheduler.plugin import CacheAffinityPlugin

logger = logging.getLogger("cacheaffinity.scheduler")

__all__ = [
    "LocalityStealing",
    "choose_steal",
    "install_stealing",
    "plan_steals",
    "track_idle",
]


# ---------------------------------------------------------------------------
# The policy as pure functions of plain data.  LocalityStealing (below) calls
# them with scheduler objects; benchmarks/simulate.py calls them with the
# simulator's nodes and chunks, so both run the same decisions.
# ---------------------------------------------------------------------------
def track_idle(
    idle_since: dict[Any, float], idle: Iterable[Any], now: float, idle_time: float
) -> list[Any]:
    """Update ``idle_since`` (worker -> time first seen idle) with the workers
    idle now, and return the thieves: workers idle for at least ``idle_time``,
    longest idle first (ties in the order of ``idle``)."""
    idle = list(idle)
    current = set(idle)
    for w in list(idle_since):
        if w not in current:
            del idle_since[w]
    for w in idle:
        idle_since.setdefault(w, now)
    thieves = [w for w in idle if now - idle_since[w] >= idle_time]
    thieves.sort(key=idle_since.__getitem__)
    return thieves


def plan_steals(
    thieves: Sequence[Any],
    victims: Iterable[Any],
    *,
    nthreads: Callable[[Any], int],
    queued: Callable[[Any], int],
    wanted: Callable[[Any], int],
    choose: Callable[[Any, Any], Any],
    move: Callable[[Any, Any, Any], bool],
    backlog: float,
    max_moves: int,
) -> list[tuple[Any, Any, Any]]:
    """One round of the throttled policy; returns ``[(task, victim, thief)]``.

    ``thieves`` in order (longest idle first); each asks for ``wanted(thief)``
    tasks (its free threads plus one queued task), taken one at a time from the
    victim with the most ``queued`` tasks per thread, as long as that victim has
    more than ``backlog`` queued tasks per thread, ``choose(victim, thief)``
    names a task (None: nothing to take) and ``move(task, victim, thief)``
    succeeds (it must update what ``queued`` and ``wanted`` report); at most
    ``max_moves`` moves in all.
    """
    victims = list(victims)
    moves = 0
    log: list[tuple[Any, Any, Any]] = []
    for thief in thieves:
        want = wanted(thief)
        while want > 0 and moves < max_moves and victims:
            victim = max(victims, key=lambda v: queued(v) / nthreads(v))
            if queued(victim) <= backlog * nthreads(victim):
                victims.remove(victim)
                continue
            task = choose(victim, thief)
            if task is None or not move(task, victim, thief):
                victims.remove(victim)
                continue
            moves += 1
            want -= 1
            log.append((task, victim, thief))
        if moves >= max_moves:
            break
    return log


def choose_steal(
    candidates: Iterable[Any],
    *,
    priority: Callable[[Any], tuple | None],
    chunk: Callable[[Any], str | None],
    thief_holds: Callable[[str], bool],
    runner_up_is_thief: Callable[[str], bool] | None,
    victim_holds: Callable[[str], bool] | None = None,
    take_warm: bool = True,
    look: int = 64,
) -> Any:
    """The cache-aware preference among a victim's queued tasks.

    Chunks the thief's node is known to hold first (``thief_holds``), then
    chunks nobody is known to hold (cold), then chunks the victim's node holds
    (``victim_holds``; taken only if ``take_warm``: such a steal turns a cache
    hit into a read from storage), then tasks without a chunk.  Within the
    cold (or warm) chunks, one of the ``look`` tasks the victim would run last
    whose runner-up node is the thief's (``runner_up_is_thief``; None: do not
    look), else the task the victim would run last (largest ``priority``).
    Returns None when nothing may be taken.
    """
    candidates = list(candidates)
    best = None
    best_rank = None
    rank_of: dict[int, int] = {}
    for t in candidates:
        c = chunk(t)
        if c is None:
            rank = 4
        elif thief_holds(c):
            rank = 0
        elif victim_holds is not None and victim_holds(c):
            if not take_warm:
                continue
            rank = 3
        else:
            rank = 2
        rank_of[id(t)] = rank
        pr = priority(t)
        r = (rank, tuple(-x for x in pr) if pr else ())
        if best_rank is None or r < best_rank:
            best, best_rank = t, r
    if best_rank is not None and best_rank[0] in (2, 3) and runner_up_is_thief is not None:
        same = [t for t in candidates if rank_of.get(id(t)) == best_rank[0]]
        for t in sorted(same, key=priority, reverse=True)[:look]:
            if runner_up_is_thief(chunk(t)):
                return t
    return best


class LocalityStealing(WorkStealing):
    """Throttled, cache-aware work stealing.

    Configuration lives in ``cacheaffinity.scheduler.stealing``; keyword
    arguments of the same names in snake_case override it (``None`` = config).

    Parameters
    ----------
    scheduler
        The scheduler.
    plugin
        The cacheaffinity placement plugin, consulted for chunk identities, the
        locator (where a chunk was last processed) and rankings.
    enabled, idle_time, backlog, interval, max_moves
        See the module docstring.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        plugin: CacheAffinityPlugin | None = None,
        *,
        enabled: bool | None = None,
        idle_time: str | float | None = None,
        backlog: float | None = None,
        interval: str | float | None = None,
        max_moves: int | None = None,
        warm_backlog: float | None = None,
    ):
        super().__init__(scheduler)
        #: The placement plugin (chunk ids, locator, rankings).
        self.plugin = plugin
        #: Whether :meth:`balance` moves anything at all.
        self.enabled: bool = bool(config.get("scheduler.stealing.enabled", enabled)) and bool(
            dask.config.get("distributed.scheduler.work-stealing")
        )
        #: Seconds a thief must have been idle.
        self.idle_time: float = config.get_seconds("scheduler.stealing.idle-time", idle_time)
        #: Queued tasks per thread above which a worker may be stolen from.
        self.backlog: float = float(config.get("scheduler.stealing.backlog", backlog))
        if self.backlog < 0:
            raise ValueError(
                f"cacheaffinity.scheduler.stealing.backlog={self.backlog!r} must be >= 0"
            )
        #: Queued tasks per thread above which a chunk the victim's node holds may
        #: be taken by a thief that does not hold it.
        self.warm_backlog: float = float(
            config.get("scheduler.stealing.warm-backlog", warm_backlog)
        )
        if self.warm_backlog < 0:
            raise ValueError(
                f"cacheaffinity.scheduler.stealing.warm-backlog={self.warm_backlog!r} "
                "must be >= 0"
            )
        #: Moves per interval at most.
        self.max_moves: int = int(config.get("scheduler.stealing.max-moves", max_moves))
        if self.max_moves < 0:
            raise ValueError(
                f"cacheaffinity.scheduler.stealing.max-moves={self.max_moves!r} must be >= 0"
            )
        # WorkStealing keeps its period in seconds in ``_callback_time``.
        self._callback_time = config.get_seconds("scheduler.stealing.interval", interval)
        if self._callback_time <= 0:
            raise ValueError(
                "cacheaffinity.scheduler.stealing.interval must be > 0, e.g. '100ms'"
            )
        #: address -> monotonic time the worker was first seen idle.
        self.idle_since: dict[str, float] = {}
        #: Moves requested by the policy (not by membership changes).
        self.steals: int = 0
        #: Moves requested because a cache node joined.
        self.membership_moves: int = 0

    # ------------------------------------------------------------------ moves
    def move(self, ts: TaskState, thief: WorkerState, reason: str) -> bool:
        """Ask the worker processing ``ts`` to hand it to ``thief``.

        The victim answers through the stock ``steal-response`` handler; a task
        that has started executing stays where it is.  Returns whether a
        request was sent.
        """
        victim = ts.processing_on
        if victim is None or victim is thief or ts in self.in_flight:
            return False
        if thief.address not in self.scheduler.workers:
            return False
        out = self.move_task_request(ts, victim, thief)
        if out in ("in-flight", "comm-closed"):
            return False
        if reason == "membership":
            self.membership_moves += 1
        return True

    # ----------------------------------------------------------------- policy
    def balance(self) -> None:
        """One round of the throttled, cache-aware stealing policy."""
        if not self.enabled or self.max_moves == 0:
            return
        s = self.scheduler
        now = monotonic()
        idle = s.idle
        thieves = [
            idle[a]
            for a in track_idle(self.idle_since, idle, now, self.idle_time)
            if idle[a].status.name == "running"
        ]
        if not thieves:
            return

        def queued(ws: WorkerState) -> int:
            # tasks beyond those it can run now, net of moves under way
            return len(ws.processing) + self.in_flight_tasks[ws] - ws.nthreads

        victims = [
            ws
            for ws in s.workers.values()
            if ws not in thieves and queued(ws) > self.backlog * ws.nthreads
        ]
        if not victims:
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "no victim for %d idle thieves; queues %s",
                    len(thieves),
                    {ws.name: queued(ws) for ws in s.workers.values()},
                )
            return

        def move(ts: TaskState, victim: WorkerState, thief: WorkerState) -> bool:
            if not self.move(ts, thief, reason="steal"):
                return False
            self.steals += 1
            self.metrics["request_count_total"][0] += 1
            if self.plugin is not None:
                self.plugin.note_steal(ts, victim, thief)
            return True

        moved = plan_steals(
            thieves,
            victims,
            nthreads=lambda ws: ws.nthreads,
            queued=queued,
            # fill the thief's threads and one task of queue, so that it does not
            # fall idle (and wait idle-time again) between two stolen tasks
            wanted=lambda ws: ws.nthreads + 1 - len(ws.processing) - self.in_flight_tasks[ws],
            choose=self._choose,
            move=move,
            backlog=self.backlog,
            max_moves=self.max_moves,
        )
        log = [(ts.key, victim.address, thief.address) for ts, victim, thief in moved]
        if log:
            self.log(("request", [(now, 0, k, 0, v, 0, t, 0) for k, v, t in log]))
            self.count += 1

    def _choose(self, victim: WorkerState, thief: WorkerState) -> TaskState | None:
        """The victim's queued task the thief should take, or None."""
        candidates = [
            ts
            for ts in victim.processing
            if ts not in self.in_flight and not ts.actor and not _executing(victim, ts)
        ]
        if not candidates:
            return None
        if self.plugin is None:
            # the task the victim would run last (largest priority tuple)
            return max(candidates, key=lambda ts: ts.priority)
        queued = len(victim.processing) + self.in_flight_tasks[victim] - victim.nthreads
        return self.plugin.steal_preference(
            candidates, victim, thief, take_warm=queued > self.warm_backlog * victim.nthreads
        )


def _executing(ws: WorkerState, ts: TaskState) -> bool:
    return ts in ws.executing or ts in ws.long_running


async def install_stealing(
    scheduler: Scheduler, plugin: CacheAffinityPlugin
) -> LocalityStealing:
    """Replace the scheduler's stealing extension by :class:`LocalityStealing`.

    Idempotent: an installed ``LocalityStealing`` is reused.  The stock
    extension (if any) is stopped and unregistered first, so exactly one
    object answers ``steal-response`` messages.
    """
    current: Any = scheduler.extensions.get("stealing")
    if isinstance(current, LocalityStealing):
        current.plugin = plugin
        return current
    if current is not None:
        current.teardown()
        for name, p in list(scheduler.plugins.items()):
            if p is current:
                del scheduler.plugins[name]
    ext = LocalityStealing(scheduler, plugin)
    scheduler.extensions["stealing"] = ext
    # The scheduler starts its plugins once; this one arrives after that.
    await ext.start()
    return ext
