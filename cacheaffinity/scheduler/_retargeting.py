"""Re-targeting placed chunk tasks when cache nodes join or leave (runs in the scheduler).

A task of a node that left goes to its next-nearest live node before Dask
reschedules it (a *failover*); a task that now maps to a joined node moves there,
by its restrictions or, already on a worker, by a steal request. Tasks of nodes
that kept their workers keep their targets; a task a user restricted since is Dask's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections import Counter
    from collections.abc import Hashable, Iterable, Iterator, Set

    from distributed.scheduler import Scheduler, TaskState

    from cacheaffinity.placement import TorusPlacement
    from cacheaffinity.scheduler._counters import NodeCounters
    from cacheaffinity.scheduler._locator import Locator
    from cacheaffinity.scheduler._membership import Membership
    from cacheaffinity.scheduler._pending import PendingIndex
    from cacheaffinity.scheduler._stealing import LocalityStealing

__all__ = ["PENDING", "SLICE", "Retargeting", "user_took_over"]

#: Tasks handled per slice of a re-targeting (between yields to the event loop).
SLICE = 8_000  # ~5 us a task: ~40 ms a slice

#: States of a chunk task that may still be placed.
PENDING = frozenset({"released", "waiting", "no-worker", "processing"})


def user_took_over(ts: TaskState) -> bool:
    """Whether a user restricted chunk task ``ts`` after the plugin placed it."""
    return not ts.loose_restrictions or bool(ts.host_restrictions or ts.resource_restrictions)


class Retargeting:
    """Moves placed chunk tasks after cache nodes joined or left (``placement`` already
    rebuilt); counts ``failovers``, ``retargets`` and ``placements``."""

    def __init__(
        self,
        membership: Membership,
        placement: TorusPlacement,
        locator: Locator,
        counters: Counter[str],
        node_counters: NodeCounters,
    ):
        self.membership = membership
        self.placement = placement
        self.locator = locator
        self.counters = counters
        self.node_counters = node_counters
        #: Scan every targeted task on a join, homes from the placement (the reference
        #: the index is tested against).
        self.full_scan = False

    def set_target(self, ts: TaskState, node: str, restrictions: dict | None = None) -> None:
        """Restrict chunk task ``ts`` loosely to ``node``'s workers."""
        self.locator.set_target(ts.key, node)
        if restrictions is None:
            ts.worker_restrictions = set(self.membership.node_workers[node])
        else:  # one set per node, shared by the tasks of one re-targeting
            r = restrictions.get(node)
            if r is None:
                r = restrictions[node] = set(self.membership.node_workers[node])
            ts.worker_restrictions = r
        ts.loose_restrictions = True

    def retarget(
        self,
        scheduler: Scheduler,
        stealing: LocalityStealing | None,
        owners: Set[str],
        joined: set[str],
        left: set[str],
        stimulus_id: str,
        rehomed: Iterable[Hashable] | None = None,
        pending: PendingIndex | None = None,
    ) -> dict | None:
        """:meth:`retarget_steps` in one piece."""
        gen = self.retarget_steps(
            scheduler, stealing, owners, joined, left, stimulus_id, rehomed, pending
        )
        while True:
            try:
                next(gen)
            except StopIteration as stop:
                return stop.value

    def candidates(
        self,
        owners: Set[str],
        joined: set[str],
        left: set[str],
        changed: set[str],
        rehomed: Iterable[Hashable] | None,
    ) -> list[Hashable]:
        """Chunk tasks that may move, in the order they are handled.

        ``rehomed`` None: a full scan (every targeted task, when nodes joined). Else
        the keys whose home node changed with this layout (``PendingIndex``): with the
        untargeted tasks and the tasks of changed, departed and non-owner nodes they
        are every task the full scan would move or refresh (a task of an unchanged
        owner whose home did not change keeps its target: see ``retarget_steps``).
        """
        locator = self.locator
        node_tasks = locator.node_tasks
        keys = list(locator.untargeted_keys)
        if rehomed is None:
            scan = set(node_tasks) - joined
            if not joined:
                scan &= changed | left
        else:
            scan = ((changed | left | (set(node_tasks) - set(owners))) & set(node_tasks)) - joined
        for node in sorted(scan):
            keys.extend(node_tasks[node])
        if rehomed is not None:
            seen = set(keys)
            target = locator.target
            for k in rehomed:
                if k not in seen and target.get(k) not in joined:
                    keys.append(k)
        return keys

    def retarget_steps(
        self,
        scheduler: Scheduler,
        stealing: LocalityStealing | None,
        owners: Set[str],
        joined: set[str],
        left: set[str],
        stimulus_id: str,
        rehomed: Iterable[Hashable] | None = None,
        pending: PendingIndex | None = None,
    ) -> Iterator[None]:
        """Re-target pending chunk tasks after nodes ``joined`` or ``left``, yielding
        between slices of ``SLICE`` tasks; returns (StopIteration value) the event to
        log (None: nothing moved). A task whose target is among ``owners`` keeps it
        unless its chunk now maps to a joined node. ``rehomed``/``pending``: the
        index's changed keys and homes (None: full scan, homes from the placement)."""
        node_workers = self.membership.node_workers
        if not node_workers:
            return None
        if self.full_scan:
            rehomed = pending = None
        locator = self.locator
        node_counters = self.node_counters
        stasks = scheduler.tasks
        changed = self.membership.take_changed()
        keys = self.candidates(owners, joined, left, changed, rehomed)
        moved = failovers = requested = placed = 0
        restrictions: dict[str, set] = {}
        for lo in range(0, len(keys), SLICE):
            if lo:
                yield
                restrictions = {}  # membership may have changed meanwhile
                node_workers = self.membership.node_workers
                if not node_workers:
                    break
            pending_ts = []
            for k in keys[lo:lo + SLICE]:
                ts = stasks.get(k)
                if ts is not None and ts.state in PENDING and k in locator.chunk_of:
                    pending_ts.append(ts)
            if not pending_ts:
                continue
            homes: list = [None] * len(pending_ts)
            if pending is not None:
                home_of = pending.home
                homes = [home_of(ts.key) for ts in pending_ts]
            missing = [i for i, h in enumerate(homes) if h is None or h not in node_workers]
            if missing:
                found = self.placement.nearest([locator.chunk_of[pending_ts[i].key] for i in missing])
                for i, h in zip(missing, found):
                    homes[i] = h
            for ts, home in zip(pending_ts, homes):
                if user_took_over(ts):
                    continue
                old = locator.target.get(ts.key)
                if old in owners and home != old and home not in joined:
                    # keep a bounded-loads spill: the chunk's node set did not change
                    home = old
                if home == old and old not in changed and ts.processing_on is None:
                    continue
                victim = ts.processing_on
                if victim is not None and victim.address not in scheduler.workers:
                    # on a worker being removed: Dask releases it right after this
                    if old is not None and old not in node_workers:
                        failovers += 1
                        node_counters.add(old, "failovers")
                    self.set_target(ts, home)
                    continue
                if victim is not None:
                    if home == old or victim.address in node_workers[home]:
                        continue
                    self.set_target(ts, home)
                    thief = self.membership.pick_worker(home)
                    if stealing is not None and thief is not None:
                        requested += stealing.move(ts, thief, reason="membership")
                    moved += 1
                    continue
                if old is None:
                    placed += 1
                    node_counters.add(home, "placements")
                elif old not in node_workers:
                    failovers += 1
                    node_counters.add(old, "failovers")
                elif home != old:
                    moved += 1
                self.set_target(ts, home, restrictions)
        self.counters["failovers"] += failovers
        self.counters["retargets"] += moved
        self.counters["placements"] += placed
        if not (moved or failovers or placed):
            return None
        return {
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
