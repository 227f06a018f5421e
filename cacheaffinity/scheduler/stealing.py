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
  known to hold, then chunks whose next-nearest node is the thief's node, then
  the task the victim would run last;
* a task that has started is never moved (the victim refuses the
  ``steal-request`` of an executing task).

``distributed.scheduler.work-stealing: false`` or
``cacheaffinity.scheduler.stealing.enabled: false`` turn the policy off; the
extension then only carries the moves the placement plugin asks for when cache
nodes join (:meth:`move`).
"""

from __future__ import annotations

import logging
from time import monotonic
from typing import TYPE_CHECKING, Any

import dask.config
from distributed.stealing import WorkStealing

from cacheaffinity import config

if TYPE_CHECKING:
    from distributed.scheduler import Scheduler, TaskState, WorkerState

    from cacheaffinity.scheduler.plugin import CacheAffinityPlugin

logger = logging.getLogger("cacheaffinity.scheduler")

__all__ = ["LocalityStealing", "install_stealing"]


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
        for addr in list(self.idle_since):
            if addr not in idle:
                del self.idle_since[addr]
        for addr in idle:
            self.idle_since.setdefault(addr, now)
        thieves = [
            ws
            for addr, ws in idle.items()
            if now - self.idle_since[addr] >= self.idle_time
            and ws.status.name == "running"
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
        thieves.sort(key=lambda ws: self.idle_since[ws.address])
        moves = 0
        log = []
        for thief in thieves:
            # fill the thief's threads and one task of queue, so that it does not
            # fall idle (and wait idle-time again) between two stolen tasks
            wanted = thief.nthreads + 1 - len(thief.processing) - self.in_flight_tasks[thief]
            while wanted > 0 and moves < self.max_moves and victims:
                victim = max(victims, key=lambda ws: queued(ws) / ws.nthreads)
                if queued(victim) <= self.backlog * victim.nthreads:
                    victims.remove(victim)
                    continue
                ts = self._choose(victim, thief)
                if ts is None:
                    victims.remove(victim)
                    continue
                if not self.move(ts, thief, reason="steal"):
                    victims.remove(victim)
                    continue
                self.steals += 1
                moves += 1
                wanted -= 1
                self.metrics["request_count_total"][0] += 1
                log.append((ts.key, victim.address, thief.address))
                if self.plugin is not None:
                    self.plugin.note_steal(ts, victim, thief)
            if moves >= self.max_moves:
                break
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
        return self.plugin.steal_preference(candidates, victim, thief)


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
