"""Locality-preserving stealing of chunk tasks (runs in the scheduler).

Defines :class:`LocalityStealing`, the stealing policy for the tasks the
cacheaffinity placement plugin places (*chunk tasks*), and the pure functions
it is made of (also run by ``benchmarks/simulate.py``).

Tasks without a chunk identity are none of its business: Dask's own
``WorkStealing`` extension stays ``scheduler.extensions["stealing"]`` and
balances them exactly as in stock Dask; it only stops seeing chunk tasks (see
:class:`~cacheaffinity.scheduler._distributed.ChunkAwareWorkStealing`).  Dask's
stealing ignores loose restrictions and prices a task without dependencies at
zero transfer cost, so it would move chunk tasks freely and destroy the
chunk -> cache-node assignment.  For chunk tasks this policy runs instead,
every ``cacheaffinity.scheduler.stealing.interval``:

* a worker may take a chunk task from another worker only after it has been
  idle for at least ``cacheaffinity.scheduler.stealing.idle-time``;
* and only from a victim whose queue holds more than
  ``cacheaffinity.scheduler.stealing.backlog`` tasks per thread beyond what it
  is executing;
* at most ``cacheaffinity.scheduler.stealing.max-moves`` moves per interval;
* among the victim's queued chunk tasks it prefers chunks the thief's cache
  node is known to hold, then chunks no node is known to hold (whose
  next-nearest node is the thief's node first), then the task the victim would
  run last (:func:`choose_steal`, fed by :func:`steal_preference` with the
  locator's answer to "which node holds this task's chunk");
* a chunk the victim's node holds is taken by a thief that does not hold it
  only if the victim's queue holds more than what such a chunk costs the
  thief, in its tasks, per thread, scaled by the nodes' learned speeds
  (:func:`warm_threshold`: a victim twice as slow as the thief gives up its
  warm chunks at half that backlog).  The cost is
  ``cacheaffinity.scheduler.stealing.warm-backlog`` until learned from the
  thief's own stolen warm chunks, never below it (:class:`WarmStealCost`);
* a task that has started is never moved (the victim refuses the request);
* a move never breaks a restriction a user set (resources, workers, hosts with
  ``allow_other_workers=False``).

Moves use Dask's ``steal-request``/``steal-response`` protocol through the
stock extension, so both share one in-flight bookkeeping, Dask's ``stealing``
event topic and its ``dask_stealing_request_count_total`` metric.

Switches: ``distributed.scheduler.work-stealing: false`` leaves the scheduler
without a stealing extension: nothing is moved, neither plain tasks (stock
Dask) nor chunk tasks (this policy, nor the moves of cache nodes joining).
``cacheaffinity.scheduler.stealing.enabled: false`` turns this policy off
(chunk tasks stay where placement sent them); Dask still steals plain tasks.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Container, Iterable, Sequence
from operator import attrgetter
from time import monotonic
from typing import TYPE_CHECKING, Any

import dask.config

from cacheaffinity import config
from cacheaffinity.scheduler import _distributed

if TYPE_CHECKING:
    from distributed.scheduler import Scheduler, TaskState, WorkerState
    from distributed.stealing import WorkStealing

    from cacheaffinity.scheduler.locator import Locator

logger = logging.getLogger("cacheaffinity.scheduler")
task_logger = logging.getLogger("cacheaffinity.scheduler.tasks")

__all__ = [
    "COLD",
    "NO_CHUNK",
    "THIEF_HOLDS",
    "VICTIM_HOLDS",
    "LocalityStealing",
    "WarmStealCost",
    "choose_steal",
    "plan_steals",
    "steal_preference",
    "track_idle",
    "warm_threshold",
]

#: Key of the policy's callback in ``Scheduler.periodic_callbacks``.
CALLBACK_NAME = "cacheaffinity-stealing"

#: Where a candidate's chunk is known to be cached, as :func:`choose_steal`
#: ranks it (a lower rank is taken first): on the thief's node, ...
THIEF_HOLDS = 0
#: ... on no node (or on a third one), ...
COLD = 1
#: ... on the victim's node (a steal turns a cache hit into a read), ...
VICTIM_HOLDS = 2
#: ... or the task has no chunk.
NO_CHUNK = 3

#: A Dask task's priority (a tuple; the task the victim would run last is the largest).
_priority = attrgetter("priority")


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


def warm_threshold(warm_backlog: float, victim_speed: float, thief_speed: float) -> float:
    """Queued tasks per thread above which a victim gives up chunks it holds.

    A queued task on the victim starts after ``queued/threads`` x its seconds
    per task; on the thief, as a cache miss, it takes about ``warm_backlog`` x
    the thief's seconds per task (the policy passes the thief's
    :meth:`WarmStealCost.cost`).  With speeds relative to a typical node
    (:meth:`~cacheaffinity.scheduler.locator.NodeSpeed.speed`), the move pays
    off above ``warm_backlog x victim_speed / thief_speed`` tasks per thread.
    """
    if not (victim_speed > 0 and thief_speed > 0):
        return warm_backlog
    return warm_backlog * victim_speed / thief_speed


class WarmStealCost:
    """What a stolen warm chunk costs each thief node, learned, in its own tasks.

    A chunk the victim's node holds is, on the thief, a cache miss: its columns
    come from the victim's node (peer fetch) or from storage, over the thief's
    links.  ``prior`` (``stealing.warm-backlog``) is what that is assumed to
    cost, in the thief's typical task durations, until it is measured.
    :meth:`observe` measures it when such a stolen task finishes on the thief:
    its duration over the thief's typical task duration (the locator's
    :class:`~cacheaffinity.scheduler.locator.NodeSpeed` before this task).  On a
    slow link (the peer fetch gives up at ``worker.peer-timeout`` and storage
    answers over the same link) that is tens of tasks, not ``prior``.

    :meth:`cost` is the node's learned cost (the newest observation weighs
    ``alpha``), never below ``prior`` (a warm steal also moves the chunk's cache
    home, which its duration does not show); a node that has stolen no warm
    chunk yet uses the median of the nodes that have (links are alike more
    often than not).  What was learned above ``prior`` fades with ``half_life``
    seconds, so that a link that recovered is tried again, at one warm steal
    per node and half-life at most.
    """

    def __init__(self, prior: float, *, alpha: float = 0.5, half_life: float = 600.0):
        if not prior >= 0:
            raise ValueError(f"WarmStealCost prior={prior!r} must be >= 0, e.g. 2")
        if not 0 < alpha <= 1:
            raise ValueError(f"WarmStealCost alpha={alpha!r} must be in (0, 1], e.g. 0.5")
        if not half_life > 0:
            raise ValueError(f"WarmStealCost half_life={half_life!r} must be > 0 s, e.g. 600")
        self.prior, self.alpha, self.half_life = float(prior), alpha, half_life
        #: node -> (learned cost in its tasks, time it was learned).  Bounded: the
        #: policy keeps it to the live nodes and the last ones that left
        #: (:meth:`retain`, :meth:`LocalityStealing.finished`).
        self.learned: dict[str, tuple[float, float]] = {}
        #: Observations made (stolen warm chunks finished on their thief).
        self.observed: int = 0

    def _faded(self, node: str, now: float) -> float | None:
        rec = self.learned.get(node)
        if rec is None:
            return None
        value, at = rec
        if value <= self.prior:
            return value
        return self.prior + (value - self.prior) * 0.5 ** (max(0.0, now - at) / self.half_life)

    def observe(self, node: str, seconds: float, typical: float | None, now: float) -> float | None:
        """A warm chunk stolen by ``node`` took ``seconds`` there, where its
        tasks typically take ``typical`` seconds; returns the cost observed (in
        tasks; None: no typical duration known, nothing learned)."""
        if not (typical is not None and typical > 0 and seconds >= 0):
            return None
        ratio = seconds / typical
        old = self._faded(node, now)
        value = ratio if old is None else old + self.alpha * (ratio - old)
        self.learned[node] = (value, now)
        self.observed += 1
        return ratio

    def cost(self, node: str | None, now: float) -> float:
        """Thief ``node``'s cost of a warm chunk, in its tasks (>= ``prior``)."""
        value = self._faded(node, now) if node is not None else None
        if value is None:
            if not self.learned:
                return self.prior
            values = sorted(v for v in (self._faded(n, now) for n in self.learned) if v is not None)
            value = values[len(values) // 2]
        return max(self.prior, value)

    def to_dict(self, now: float) -> dict[str, float]:
        """node -> its current learned cost (faded), for the dashboard and logs."""
        return {n: round(max(self.prior, self._faded(n, now) or 0.0), 2) for n in self.learned}

    def retain(self, nodes) -> int:
        """Forget the costs learned of nodes not in ``nodes`` (a container of node
        ids); returns how many were forgotten."""
        gone = [n for n in self.learned if n not in nodes]
        for n in gone:
            del self.learned[n]
        return len(gone)


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


def _negated(priority: tuple | None) -> tuple:
    return tuple(-x for x in priority) if priority else ()


def choose_steal(
    candidates: Iterable[Any],
    *,
    where: Callable[[Any], int],
    priority: Callable[[Any], tuple | None],
    runner_up_is_thief: Callable[[list[Any]], list[bool]] | None = None,
    take_warm: bool = True,
    look: int = 64,
) -> Any:
    """The cache-aware preference among a victim's queued tasks (the one rule).

    ``where(task)`` says where the task's chunk is known to be cached
    (:data:`THIEF_HOLDS`, :data:`COLD`, :data:`VICTIM_HOLDS` or
    :data:`NO_CHUNK`), and tasks are taken in that order; chunks the victim's
    node holds only if ``take_warm`` (such a steal turns a cache hit into a read
    from storage).  Within a rank, the task the victim would run last (largest
    ``priority``; the first such candidate on a tie; an empty priority counts
    as the largest).  Within the cold (or warm) chunks, one of the ``look``
    tasks the victim would run last whose runner-up node is the thief's comes
    first: ``runner_up_is_thief(tasks)`` answers for a list of tasks at once
    (None: do not look).  Returns None when nothing may be taken.

    ``where`` and ``priority`` are called at most once per candidate; the
    ``look`` tasks are those of :func:`heapq.nlargest` (the same tasks, in the
    same order, as sorting by ``priority``, largest first).
    """
    best: Any = None
    best_rank = NO_CHUNK + 1
    best_pr: Any = None
    same: list[Any] = []  # the candidates of best_rank, in candidate order
    uniform = True  # every priority in ``same`` non-empty and of one length
    for t in candidates:
        rank = where(t)
        if rank > best_rank or (rank == VICTIM_HOLDS and not take_warm):
            continue
        pr = priority(t)
        if rank < best_rank:
            best, best_rank, best_pr, same, uniform = t, rank, pr, [t], bool(pr)
            continue
        same.append(t)
        if uniform and pr and len(pr) == len(best_pr):
            later = pr > best_pr  # as the negated priorities compare, without negating
        else:
            uniform = False
            later = _negated(pr) < _negated(best_pr)
        if later:
            best, best_pr = t, pr
    if best is None or best_rank not in (COLD, VICTIM_HOLDS) or runner_up_is_thief is None:
        return best
    if uniform:
        # the look window starts with ``best`` (nlargest is stable): ask for it alone first
        if runner_up_is_thief([best])[0]:
            return best
        window = heapq.nlargest(look, same, key=priority)[1:]
    else:
        window = heapq.nlargest(look, same, key=priority)
    if window:
        for t, yes in zip(window, runner_up_is_thief(window)):
            if yes:
                return t
    return best


def steal_preference(
    locator: Locator,
    candidates: list[TaskState],
    victim: WorkerState,
    thief: WorkerState,
    *,
    take_warm: bool = True,
    inherited: Container[str] = (),
) -> TaskState | None:
    """Which of the victim's queued chunk tasks the thief should take (None: none).

    :func:`choose_steal` with the scheduler's objects: where a task's chunk is
    cached is the locator's answer
    (:meth:`~cacheaffinity.scheduler.locator.Locator.holder_of_task`, one
    look-up per task), the runner-up nodes come from the placement in one batch.
    A chunk of unknown holder counts as held by the victim if its node is
    ``inherited`` (:class:`~cacheaffinity.scheduler.inheritance.Inheritance`).
    """
    node_of = locator.membership.worker_node
    thief_node = node_of.get(thief.address)
    victim_node = node_of.get(victim.address)
    chunk_of, placement = locator.chunk_of, locator.placement
    holder_of_task = locator.holder_of_task

    def where(ts: TaskState) -> int:
        key = ts.key
        chunk = chunk_of.get(key)
        if chunk is None:
            return NO_CHUNK
        h = holder_of_task(key, chunk)
        if h is None:
            # no record; a node that came with a cache (scheduler restart) most
            # likely holds what it was sent
            return VICTIM_HOLDS if victim_node in inherited else COLD
        if h == thief_node:
            return THIEF_HOLDS
        if h == victim_node:
            return VICTIM_HOLDS
        return COLD

    runner_up = None
    if thief_node is not None and len(locator.membership.node_workers) > 1:

        def runner_up(tasks: list[TaskState]) -> list[bool]:
            if len(tasks) == 1:
                return [placement.ranking(chunk_of[tasks[0].key], 2)[1:] == [thief_node]]
            ranked = placement.rankings([chunk_of[ts.key] for ts in tasks], 2)
            return [nodes[1:] == [thief_node] for nodes in ranked]

    return choose_steal(
        candidates,
        where=where,
        priority=_priority,
        runner_up_is_thief=runner_up,
        take_warm=take_warm,
    )


class LocalityStealing:
    """Throttled, cache-aware stealing of chunk tasks.

    Configuration lives in ``cacheaffinity.scheduler.stealing``; keyword
    arguments of the same names in snake_case override it (``None`` = config).
    Not a scheduler extension nor a plugin: the placement plugin owns it and
    calls :meth:`start`/:meth:`stop`; moves go through the scheduler's stealing
    extension.

    Parameters
    ----------
    scheduler
        The scheduler.
    locator
        Chunk tasks, where chunks are, and the steal preference.
    inherited
        Nodes that joined with cache entries of no record here
        (:class:`~cacheaffinity.scheduler.inheritance.Inheritance`): their queued
        chunks of unknown holder count as held by them.
    enabled, idle_time, backlog, interval, max_moves, warm_backlog
        See the module docstring.
    on_steal
        Called with ``(task, victim, thief)`` for every move of the policy
        (the plugin's counters).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        locator: Locator,
        *,
        inherited: Container[str] = (),
        enabled: bool | None = None,
        idle_time: str | float | None = None,
        backlog: float | None = None,
        interval: str | float | None = None,
        max_moves: int | None = None,
        warm_backlog: float | None = None,
        on_steal: Callable[[TaskState, WorkerState, WorkerState], Any] | None = None,
    ):
        self.scheduler = scheduler
        self.locator = locator
        #: Nodes whose queued chunks of unknown holder count as held by them.
        self.inherited = inherited
        #: Called with ``(task, victim, thief)`` for every move of the policy.
        self.on_steal = on_steal
        #: Whether Dask's work stealing is on (else nothing ever moves).
        self.dask_stealing: bool = bool(dask.config.get("distributed.scheduler.work-stealing"))
        #: Whether :meth:`balance` moves chunk tasks at all.
        self.enabled: bool = (
            bool(config.get("scheduler.stealing.enabled", enabled)) and self.dask_stealing
        )
        #: Seconds a thief must have been idle.
        self.idle_time: float = config.get_seconds("scheduler.stealing.idle-time", idle_time)
        #: Queued tasks per thread above which a worker may be stolen from.
        self.backlog: float = float(config.get("scheduler.stealing.backlog", backlog))
        if self.backlog < 0:
            raise ValueError(
                f"cacheaffinity.scheduler.stealing.backlog={self.backlog!r} must be >= 0"
            )
        prior = float(config.get("scheduler.stealing.warm-backlog", warm_backlog))
        if not prior >= 0:
            raise ValueError(
                f"cacheaffinity.scheduler.stealing.warm-backlog={prior!r} must be >= 0, e.g. 2"
            )
        #: What a stolen warm chunk costs each thief, learned (prior: warm-backlog).
        self.warm_cost = WarmStealCost(prior)
        #: task key -> (thief address, thief node) of warm chunks stolen, until they finish
        self.warm_stolen: dict[Any, tuple[str, str]] = {}
        #: Moves per interval at most.
        self.max_moves: int = int(config.get("scheduler.stealing.max-moves", max_moves))
        if self.max_moves < 0:
            raise ValueError(
                f"cacheaffinity.scheduler.stealing.max-moves={self.max_moves!r} must be >= 0"
            )
        #: Seconds between two rounds of the policy.
        self.interval: float = config.get_seconds("scheduler.stealing.interval", interval)
        if self.interval <= 0:
            raise ValueError(
                f"cacheaffinity.scheduler.stealing.interval={self.interval!r} must be > 0, "
                "e.g. '100ms'"
            )
        #: address -> monotonic time the worker was first seen idle.
        self.idle_since: dict[str, float] = {}
        #: Moves requested by the policy (not by membership changes).
        self.steals: int = 0
        #: Moves requested because a cache node joined.
        self.membership_moves: int = 0
        #: Moves not made because they would break a user's restriction.
        self.refused: int = 0
        #: During a round of :meth:`balance`: ``(victim, thief)`` -> the victim's
        #: tasks the thief may take (:meth:`_choose`); nothing changes them within
        #: a round but the policy's own steal requests.
        self._round: dict[tuple[str, str], list[TaskState]] = {}

    @property
    def warm_backlog(self) -> float:
        """Queued tasks per thread (x victim speed / thief speed) above which a
        chunk the victim's node holds may go to a thief that does not hold it,
        until the thief's cost of such a chunk is learned (:class:`WarmStealCost`)."""
        return self.warm_cost.prior

    @warm_backlog.setter
    def warm_backlog(self, value: float) -> None:
        self.warm_cost.prior = float(value)

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Run :meth:`balance` every ``interval`` (idempotent; not when disabled)."""
        if self.enabled:
            _distributed.start_periodic(self.scheduler, CALLBACK_NAME, self.balance, self.interval)

    def stop(self) -> None:
        """Stop the periodic policy (idempotent).  Moves in flight complete."""
        _distributed.stop_periodic(self.scheduler, CALLBACK_NAME, self.balance)

    @property
    def extension(self) -> WorkStealing | None:
        """The scheduler's stealing extension if it leaves chunk tasks to us."""
        return _distributed.stealing_extension(self.scheduler)

    @property
    def in_flight(self) -> dict[TaskState, dict]:
        """Chunk tasks with a steal request under way (the stock extension's record)."""
        chunk = self.locator.chunk_of
        return {
            ts: info
            for ts, info in _distributed.in_flight(self.extension).items()
            if ts.key in chunk
        }

    # ------------------------------------------------------------ moves
    def move(self, ts: TaskState, thief: WorkerState, reason: str) -> bool:
        """Ask the worker processing chunk task ``ts`` to hand it to ``thief``.

        The victim answers through the stock ``steal-response`` handler; a task
        that has started executing stays where it is.  Nothing moves without
        the scheduler's stealing extension (``distributed.scheduler.work-stealing:
        false``), and never to a worker a user's restriction rules out.
        Returns whether a request was sent.
        """
        ext = self.extension
        victim = ts.processing_on
        if ext is None or victim is None or victim is thief:
            return False
        if thief.address not in self.scheduler.workers:
            return False
        if not _distributed.may_run_on(self.scheduler, ts, thief):
            self.refused += 1
            task_logger.debug(
                "%s: not moved to %s (%s): a restriction rules it out",
                ts.key, thief.address, reason,
            )
            return False
        if not _distributed.request_move(ext, ts, victim, thief):
            return False
        if reason == "membership":
            self.membership_moves += 1
        return True

    # ------------------------------------------------------------ policy
    def balance(self) -> None:
        """One round of the throttled, cache-aware stealing policy."""
        ext = self.extension
        if not self.enabled or self.max_moves == 0 or ext is None:
            return
        s = self.scheduler
        now = monotonic()
        idle = _distributed.idle_workers(s)
        thieves = [idle[a] for a in track_idle(self.idle_since, idle, now, self.idle_time)]
        if not thieves:
            return

        def queued(ws: WorkerState) -> int:
            # tasks beyond those it can run now, net of moves under way
            return _distributed.queued(ext, ws)

        victims = [
            ws
            for ws in s.workers.values()
            if ws not in thieves and queued(ws) > self.backlog * ws.nthreads
        ]
        if not victims:
            return

        locator = self.locator
        node_of = locator.membership.worker_node

        def move(ts: TaskState, victim: WorkerState, thief: WorkerState) -> bool:
            if not self.move(ts, thief, reason="steal"):
                return False
            self.steals += 1
            vn, tn = node_of.get(victim.address), node_of.get(thief.address)
            chunk = locator.chunk_of.get(ts.key)
            if vn is not None and tn is not None and chunk is not None:
                h = locator.holder_of_task(ts.key, chunk)
                if h == vn or (h is None and vn in self.inherited):  # as steal_preference
                    self.warm_stolen[ts.key] = (thief.address, tn)
            self.locator.note_steal(ts.key)
            if self.on_steal is not None:
                self.on_steal(ts, victim, thief)
            return True

        self._round.clear()
        try:
            moved = self._plan(thieves, victims, queued, move)
        finally:
            self._round.clear()
        _distributed.record_requests(ext, moved, now)

    def _plan(
        self,
        thieves: list[WorkerState],
        victims: list[WorkerState],
        queued: Callable[[WorkerState], int],
        move: Callable[[TaskState, WorkerState, WorkerState], bool],
    ) -> list[tuple[TaskState, WorkerState, WorkerState]]:
        """:func:`plan_steals` with the scheduler's workers (one round)."""
        return plan_steals(
            thieves,
            victims,
            nthreads=lambda ws: ws.nthreads,
            queued=queued,
            # fill the thief's threads and one task of queue, so that it does not
            # fall idle (and wait idle-time again) between two stolen tasks
            wanted=lambda ws: 1 - queued(ws),
            choose=self._choose,
            move=move,
            backlog=self.backlog,
            max_moves=self.max_moves,
        )

    def _choose(self, victim: WorkerState, thief: WorkerState) -> TaskState | None:
        """The victim's queued chunk task the thief should take, or None."""
        ext = self.extension
        pair = (victim.address, thief.address)
        candidates = self._round.get(pair)
        if candidates is None:
            candidates = _distributed.stealable_from(
                self.scheduler, ext, victim, thief, self.locator.chunk_of
            )
        elif ext is not None:
            # the same pair again in this round: only our steal requests changed
            in_flight = _distributed.in_flight(ext)
            candidates = [ts for ts in candidates if ts not in in_flight]
        self._round[pair] = candidates
        if not candidates:
            return None
        queued = _distributed.queued(ext, victim)
        node_of = self.locator.membership.worker_node
        speed = self.locator.speed.speed
        vn, tn = node_of.get(victim.address), node_of.get(thief.address)
        threshold = warm_threshold(
            self.warm_cost.cost(tn, monotonic()),
            speed(vn) if vn is not None else 1.0,
            speed(tn) if tn is not None else 1.0,
        )
        return steal_preference(
            self.locator, candidates, victim, thief,
            take_warm=queued > threshold * victim.nthreads, inherited=self.inherited,
        )  # fmt: skip

    # ------------------------------------------------------------ learning
    def finished(
        self, key: Any, worker: str | None, seconds: float | None, typical: float | None
    ) -> bool:
        """Chunk task ``key`` finished on ``worker`` in ``seconds`` (compute
        time); ``typical``: that node's seconds per task before it (the
        locator's :class:`~cacheaffinity.scheduler.locator.NodeSpeed`).  Learns
        the cost of a warm chunk this policy stole, if it ran on its thief, and
        returns whether it did: that duration is the thief's links' time, not
        a sample of the node's speed."""
        rec = self.warm_stolen.pop(key, None)
        if rec is None or seconds is None or worker != rec[0]:
            return False  # not a warm steal, or the victim kept it (it had started)
        node = rec[1]
        ratio = self.warm_cost.observe(node, seconds, typical, monotonic())
        membership = self.locator.membership
        if len(self.warm_cost.learned) > membership.known_limit():
            # nodes come and go: keep the live ones and the last that left
            self.warm_cost.retain(membership.known_nodes())
        if ratio is not None and ratio > 2 * max(self.warm_backlog, 1.0):
            logger.info(
                "stealing: a warm chunk stolen by node %s took %.1f s, %.0fx its typical "
                "task (%.2f s): its columns came over its links (peer fetch or storage). "
                "It now takes chunks another node holds only above %.0f queued tasks per "
                "thread (x victim speed / its speed; learned, fades with a half-life of %.0f s)",
                node, seconds, ratio, typical, self.warm_cost.cost(node, monotonic()),
                self.warm_cost.half_life,
            )
        return True

    def forget(self, key: Any) -> None:
        """Task ``key`` was forgotten."""
        if self.warm_stolen:
            self.warm_stolen.pop(key, None)
