"""Re-targeting chunk tasks when cache nodes join or leave (runs in the scheduler).

This module owns what happens to chunk tasks that are already placed when the
membership changes (:meth:`~.plugin.CacheAffinityPlugin._membership_changed`
calls :meth:`Retargeting.retarget`):

- a task of a node that left (queued, or released from a dead worker) goes to
  its next-nearest live node before Dask reschedules it (a *failover*);
- a task that now maps to a node that joined moves there: a queued one by its
  restrictions, one already on a worker by a steal request (not when Dask's
  work stealing is off);
- a task whose node kept its workers keeps its target, and a task a user
  restricted since it was placed is Dask's (:func:`user_took_over`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections import Counter
    from collections.abc import Set

    from distributed.scheduler import Scheduler, TaskState

    from cacheaffinity.placement import TorusPlacement
    from cacheaffinity.scheduler.counters import NodeCounters
    from cacheaffinity.scheduler.locator import Locator
    from cacheaffinity.scheduler.membership import Membership
    from cacheaffinity.scheduler.stealing import LocalityStealing

__all__ = ["PENDING", "Retargeting", "user_took_over"]

#: Task states in which a chunk task has not finished and may still be placed.
PENDING = frozenset({"released", "waiting", "no-worker", "processing"})


def user_took_over(ts: TaskState) -> bool:
    """Whether restrictions other than the plugin's own (loose, worker-only) were
    set on a chunk task after it was placed."""
    return not ts.loose_restrictions or bool(ts.host_restrictions or ts.resource_restrictions)


class Retargeting:
    """Moves placed chunk tasks after cache nodes joined or left.

    Parameters
    ----------
    membership, placement, locator
        Workers <-> nodes, the placement (already rebuilt for the new node
        set), the chunk tasks and their targets.
    counters
        The plugin's totals (``failovers``, ``retargets``, ``placements``).
    node_counters
        Per-node counters (``failovers``, ``placements``).
    """

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

    def set_target(self, ts: TaskState, node: str, restrictions: dict | None = None) -> None:
        """Target chunk task ``ts`` at ``node``: loose restrictions to its workers."""
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
    ) -> dict | None:
        """Re-target pending chunk tasks after nodes ``joined`` or ``left``;
        ``owners``: the nodes that own a part of the placement now (a task whose
        target is one keeps it unless its chunk maps to a joined node).  Returns
        the event to log (None: nothing moved)."""
        node_workers = self.membership.node_workers
        if not node_workers:
            return None
        locator = self.locator
        node_counters = self.node_counters
        stasks = scheduler.tasks
        changed = self.membership.take_changed()
        # Tasks waiting for any node, and tasks of nodes whose workers changed.
        # Without a joined node, a task whose node kept its workers keeps its
        # target and its (equal) restrictions: only those of changed nodes are
        # looked at. A joined node may take tasks from any node: all are.
        keys = locator.untargeted()
        scan = set(locator.node_tasks) - joined
        if not joined:
            scan &= changed | left
        for node in scan:
            keys.extend(locator.node_tasks[node])
        pending = []
        for k in keys:
            ts = stasks.get(k)
            if ts is not None and ts.state in PENDING:
                pending.append(ts)
        if not pending:
            return None
        homes = self.placement.nearest([locator.chunk_of[ts.key] for ts in pending])
        moved = failovers = requested = placed = 0
        restrictions: dict[str, set] = {}
        for ts, home in zip(pending, homes):
            if user_took_over(ts):
                continue  # restricted by a user since it was placed: Dask's now
            old = locator.target.get(ts.key)
            if old in owners and home != old and home not in joined:
                # Unchanged node set for this chunk: keep it (e.g. balance spill).
                home = old
            if home == old and old not in changed and ts.processing_on is None:
                continue  # same node, same workers: nothing to change
            victim = ts.processing_on
            if victim is not None and victim.address not in scheduler.workers:
                # On a worker being removed: Dask releases it right after this.
                if old is not None and old not in node_workers:
                    failovers += 1
                    node_counters.add(old, "failovers")
                self.set_target(ts, home)
                continue
            if victim is not None:
                if home == old or victim.address in node_workers[home]:
                    continue
                # Already on a worker: ask it to hand the task over, if not started.
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
