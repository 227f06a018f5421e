"""Locality-preserving stealing of chunk tasks (runs in the scheduler).

``LocalityStealing`` and the pure functions it is made of, which
``benchmarks/simulate.py`` runs on its own nodes and chunks (keep them free of
scheduler objects). Plain tasks stay with Dask's ``WorkStealing``, which only stops
seeing chunk tasks: it ignores loose restrictions and prices a task without
dependencies at zero transfer cost, so it would scatter chunks.
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

    from cacheaffinity.scheduler._locator import Locator

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

CALLBACK_NAME = "cacheaffinity-stealing"
#: Queued tasks a stealing round looks at, in all its choices (~1 us each): once a
#: round has looked at this many, it makes no further choice and its remaining moves
#: wait for the next round (``interval`` later), so that a round over long queues
#: (10^6 pending over few nodes) does not hold the event loop; a choice is exact (it
#: looks at its whole queue) and the first one is always made.
ROUND_SCAN = 40_000

# Where a candidate's chunk is cached, as choose_steal ranks it (lowest taken first);
# COLD: on no node or on a third one.
THIEF_HOLDS = 0
COLD = 1
VICTIM_HOLDS = 2
NO_CHUNK = 3

# the task the victim would run last has the largest priority
_priority = attrgetter("priority")


def track_idle(
    idle_since: dict[Any, float], idle: Iterable[Any], now: float, idle_time: float
) -> list[Any]:
    """Update ``idle_since`` (worker -> first seen idle) and return the workers idle
    for at least ``idle_time``, longest idle first."""
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

    ``warm_backlog`` is what such a chunk costs the thief, in its tasks; waiting on
    the victim costs ``queued / threads`` victim tasks, hence the speed ratio.
    """
    if not (victim_speed > 0 and thief_speed > 0):
        return warm_backlog
    return warm_backlog * victim_speed / thief_speed


class WarmStealCost:
    """What a stolen warm chunk costs each thief node, in its typical task durations.

    Learned (EWMA, weight ``alpha``) from stolen warm chunks that ran on their
    thief; never below ``prior`` (``stealing.warm-backlog``: a warm steal also
    moves the chunk's cache home). A node without observations uses the median of
    the others. What lies above ``prior`` fades with ``half_life`` seconds, so a
    link that recovered is tried again.
    """

    def __init__(self, prior: float, *, alpha: float = 0.5, half_life: float = 600.0):
        if not prior >= 0:
            raise ValueError(f"WarmStealCost prior={prior!r} must be >= 0, e.g. 2")
        if not 0 < alpha <= 1:
            raise ValueError(f"WarmStealCost alpha={alpha!r} must be in (0, 1], e.g. 0.5")
        if not half_life > 0:
            raise ValueError(f"WarmStealCost half_life={half_life!r} must be > 0 s, e.g. 600")
        self.prior, self.alpha, self.half_life = float(prior), alpha, half_life
        # node -> (cost, monotonic time learned); the policy prunes departed nodes
        self.learned: dict[str, tuple[float, float]] = {}
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
        """Learn from a warm chunk that took ``seconds`` on thief ``node``, whose tasks
        typically take ``typical``; returns the ratio (None: nothing learned)."""
        if not (typical is not None and typical > 0 and seconds >= 0):
            return None
        ratio = seconds / typical
        old = self._faded(node, now)
        value = ratio if old is None else old + self.alpha * (ratio - old)
        self.learned[node] = (value, now)
        self.observed += 1
        return ratio

    def cost(self, node: str | None, now: float) -> float:
        """Thief ``node``'s cost of a warm chunk, in its tasks (at least ``prior``)."""
        value = self._faded(node, now) if node is not None else None
        if value is None:
            if not self.learned:
                return self.prior
            values = sorted(v for v in (self._faded(n, now) for n in self.learned) if v is not None)
            value = values[len(values) // 2]
        return max(self.prior, value)

    def to_dict(self, now: float) -> dict[str, float]:
        """node -> its current (faded) cost."""
        return {n: round(max(self.prior, self._faded(n, now) or 0.0), 2) for n in self.learned}

    def retain(self, nodes) -> int:
        """Forget every node not in ``nodes``; returns how many were forgotten."""
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

    Each thief, in order, takes up to ``wanted(thief)`` tasks one at a time from the
    victim with the most queued tasks per thread while that is above ``backlog``,
    at most ``max_moves`` in all. ``move`` must update what ``queued`` and
    ``wanted`` report; a victim is dropped when ``choose`` or ``move`` fails.
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
    """The task a thief takes from a victim's candidates (None: none may be taken).

    Lowest ``where`` rank first (``VICTIM_HOLDS`` only if ``take_warm``), then the
    task the victim would run last (largest ``priority``; empty counts as largest;
    first on a tie). Among cold or warm chunks, one of the ``look`` last whose
    runner-up node is the thief's goes first (``runner_up_is_thief`` answers for a
    list). ``where`` and ``priority`` are called at most once per candidate.
    """
    best: Any = None
    best_rank = NO_CHUNK + 1
    best_pr: Any = None
    same: list[Any] = []  # the candidates of best_rank, in candidate order
    uniform = True  # priorities in ``same`` non-empty, of one length: no negation needed
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
            later = pr > best_pr
        else:
            uniform = False
            later = _negated(pr) < _negated(best_pr)
        if later:
            best, best_pr = t, pr
    if best is None or best_rank not in (COLD, VICTIM_HOLDS) or runner_up_is_thief is None:
        return best
    if uniform:
        # the window starts with ``best`` (nlargest is stable): ask for it alone first
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
    """``choose_steal`` with the scheduler's objects and the locator's holders.

    A chunk of unknown holder counts as held by the victim if its node is ``inherited``.
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
            # an inherited node (scheduler restart) most likely holds what it was sent
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

    Every ``interval``, a worker idle for ``idle_time`` takes queued chunk tasks
    from workers with more than ``backlog`` queued tasks per thread, at most
    ``max_moves`` per round, preferring chunks its node holds, then chunks nobody
    holds, and among those the task the victim would run last. A chunk the
    victim's node holds moves only above a backlog scaled by what such a chunk
    costs the thief (``warm_backlog`` until learned) and by victim speed over
    thief speed. Started tasks never move, nor tasks a user's restriction keeps
    off the thief. Moves use Dask's ``steal-request`` protocol through its
    stealing extension: with ``distributed.scheduler.work-stealing: false``,
    nothing moves.

    Not a scheduler extension: :class:`~cacheaffinity.CacheAffinityPlugin` owns it.

    Parameters
    ----------
    scheduler
        The scheduler.
    locator
        Chunk tasks and where chunks are (the plugin's ``Locator``).
    inherited
        Nodes that joined with cache entries of no record here: their queued
        chunks of unknown holder count as held by them.
    enabled, idle_time, backlog, interval, max_moves, warm_backlog
        Override the ``cacheaffinity.scheduler.stealing`` settings of the same
        names (``None``: the config).
    on_steal
        Called with ``(task, victim, thief)`` for every move of the policy.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        locator: Any,  # the plugin's Locator (private)
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
        self.inherited = inherited
        self.on_steal = on_steal
        #: Whether Dask's work stealing is on (else nothing ever moves).
        self.dask_stealing: bool = bool(dask.config.get("distributed.scheduler.work-stealing"))
        #: Whether :meth:`balance` moves chunk tasks at all.
        self.enabled: bool = (
            bool(config.get("scheduler.stealing.enabled", enabled)) and self.dask_stealing
        )
        self.idle_time: float = config.get_seconds("scheduler.stealing.idle-time", idle_time)
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
        #: What a stolen warm chunk costs each thief node, learned.
        self.warm_cost = WarmStealCost(prior)
        # task key -> (thief address, thief node) of warm chunks stolen, until they finish
        self.warm_stolen: dict[Any, tuple[str, str]] = {}
        self.max_moves: int = int(config.get("scheduler.stealing.max-moves", max_moves))
        if self.max_moves < 0:
            raise ValueError(
                f"cacheaffinity.scheduler.stealing.max-moves={self.max_moves!r} must be >= 0"
            )
        self.interval: float = config.get_seconds("scheduler.stealing.interval", interval)
        if self.interval <= 0:
            raise ValueError(
                f"cacheaffinity.scheduler.stealing.interval={self.interval!r} must be > 0, "
                "e.g. '100ms'"
            )
        self.idle_since: dict[str, float] = {}
        #: Moves requested by the policy (not by membership changes).
        self.steals: int = 0
        #: Moves requested because a cache node joined.
        self.membership_moves: int = 0
        #: Moves not made because they would break a user's restriction.
        self.refused: int = 0
        # within one round: (victim, thief) -> candidates; only our own steal
        # requests change them meanwhile
        self._round: dict[tuple[str, str], list[TaskState]] = {}
        # queued tasks this round's choices looked at (ROUND_SCAN)
        self._scanned = 0

    @property
    def warm_backlog(self) -> float:
        """Queued tasks per thread (x victim speed / thief speed) above which a chunk
        the victim's node holds may be stolen, until the thief's cost is learned."""
        return self.warm_cost.prior

    @warm_backlog.setter
    def warm_backlog(self, value: float) -> None:
        self.warm_cost.prior = float(value)

    def start(self) -> None:
        """Run :meth:`balance` every ``interval`` (idempotent; not when disabled)."""
        if self.enabled:
            _distributed.start_periodic(self.scheduler, CALLBACK_NAME, self.balance, self.interval)

    def stop(self) -> None:
        """Stop the periodic policy (idempotent); moves in flight complete."""
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

    def move(self, ts: TaskState, thief: WorkerState, reason: str) -> bool:
        """Ask the worker processing chunk task ``ts`` to hand it to ``thief``.

        Returns whether a request was sent: never without a stealing extension nor
        to a worker a user's restriction rules out. A started task stays put.
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
            return _distributed.queued(ext, ws)

        # by address: ``ws in thieves`` on a list calls WorkerState.__eq__ per pair,
        # ~0.3 s a round with 1000 idle workers
        thief_addrs = {ws.address for ws in thieves}
        victims = [
            ws
            for ws in s.workers.values()
            if ws.address not in thief_addrs and queued(ws) > self.backlog * ws.nthreads
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
        self._scanned = 0
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
        """``plan_steals`` with the scheduler's workers (one round)."""
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
        if self._scanned >= ROUND_SCAN:
            return None  # this round has looked at enough: the next one goes on
        ext = self.extension
        pair = (victim.address, thief.address)
        candidates = self._round.get(pair)
        if candidates is None:
            candidates = _distributed.stealable_from(
                self.scheduler, ext, victim, thief, self.locator.chunk_of
            )
        elif ext is not None:
            in_flight = _distributed.in_flight(ext)
            candidates = [ts for ts in candidates if ts not in in_flight]
        self._round[pair] = candidates
        if not candidates:
            return None
        self._scanned += len(candidates)
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

    def finished(
        self, key: Any, worker: str | None, seconds: float | None, typical: float | None
    ) -> bool:
        """Learn the cost of a warm chunk this policy stole, if ``key`` ran on its thief.

        ``typical`` is that node's seconds per task so far. Returns whether it did:
        then ``seconds`` measured the thief's links, not the node's speed.
        """
        rec = self.warm_stolen.pop(key, None)
        if rec is None or seconds is None or worker != rec[0]:
            return False  # not a warm steal, or the victim kept it (it had started)
        node = rec[1]
        ratio = self.warm_cost.observe(node, seconds, typical, monotonic())
        membership = self.locator.membership
        if len(self.warm_cost.learned) > membership.known_limit():
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
