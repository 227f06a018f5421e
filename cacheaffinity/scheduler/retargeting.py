"""Re-targeting chunk tasks when cache nodes join or leave (runs in the scheduler).

This module owns what happens to chunk tasks that are already placed when the
membership changes (:meth:`~.plugin.CacheAffinityPlugin._membership_changed`):

- a task of a node that left (queued, or released from a dead worker) goes to
  its next-nearest live node before Dask reschedules it (a *failover*);
- a task that now maps to a node that joined moves there: a queued one by its
  restrictions, one already on a worker by a steal request (not when Dask's
  work stealing is off);
- a task whose node kept its workers keeps its target, and a task a user
  restricted since it was placed is Dask's (:func:`user_took_over`).

The functions take the :class:`~.plugin.CacheAffinityPlugin` whose placement,
membership, locator and counters they use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distributed.scheduler import TaskState

    from cacheaffinity.scheduler.plugin import CacheAffinityPlugin

__all__ = ["PENDING", "retarget", "set_target", "user_took_over"]

#: Task states in which a chunk task has not finished and may still be placed.
PENDING = frozenset({"released", "waiting", "no-worker", "processing"})


def user_took_over(ts: TaskState) -> bool:
    """Whether restrictions other than the plugin's own (loose, worker-only) were
    set on a chunk task after it was placed."""
    return not ts.loose_restrictions or bool(ts.host_restrictions or ts.resource_restrictions)


def set_target(
    plugin: CacheAffinityPlugin, ts: TaskState, node: str, restrictions: dict | None = None
) -> None:
    """Target chunk task ``ts`` at ``node``: loose restrictions to its workers."""
    plugin.locator.set_target(ts.key, node)
    if restrictions is None:
        ts.worker_restrictions = set(plugin.membership.node_workers[node])
    else:  # one set per node, shared by the tasks of one re-targeting
        r = restrictions.get(node)
        if r is None:
            r = restrictions[node] = set(plugin.membership.node_workers[node])
        ts.worker_restrictions = r
    ts.loose_restrictions = True


def retarget(plugin: CacheAffinityPlugin, joined: set[str], left: set[str], stimulus_id: str) -> None:
    """Re-target pending chunk tasks after nodes joined or left."""
    node_workers = plugin.membership.node_workers
    if not node_workers:
        return
    locator = plugin.locator
    stasks = plugin.scheduler.tasks
    changed = plugin.membership.take_changed()
    owners = plugin.owners
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
        return
    homes = plugin.placement.nearest([locator.chunk_of[ts.key] for ts in pending])
    moved = failovers = requested = placed = 0
    stealing = plugin.stealing
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
        if victim is not None and victim.address not in plugin.scheduler.workers:
            # On a worker being removed: Dask releases it right after this.
            if old is not None and old not in node_workers:
                failovers += 1
                plugin.node_counters[old]["failovers"] += 1
            set_target(plugin, ts, home)
            continue
        if victim is not None:
            if home == old or victim.address in node_workers[home]:
                continue
            # Already on a worker: ask it to hand the task over, if not started.
            set_target(plugin, ts, home)
            thief = plugin.membership.pick_worker(home)
            if stealing is not None and thief is not None:
                requested += stealing.move(ts, thief, reason="membership")
            moved += 1
            continue
        if old is None:
            placed += 1
            plugin.node_counters[home]["placements"] += 1
        elif old not in node_workers:
            failovers += 1
            plugin.node_counters[old]["failovers"] += 1
        elif home != old:
            moved += 1
        set_target(plugin, ts, home, restrictions)
    plugin.counters["failovers"] += failovers
    plugin.counters["retargets"] += moved
    plugin.counters["placements"] += placed
    if moved or failovers or placed:
        plugin._event(
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
