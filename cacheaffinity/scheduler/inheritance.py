"""Inherited nodes: caches this scheduler has no record of (runs in the scheduler).

A cache node that joins with entries in its cache while this scheduler never
placed work on it holds chunks the locator knows nothing of: the scheduler
restarted, or the node came back with its disk.  Such a node is *inherited*
(one log line each).  Two readers act on it:

* the stealing policy counts a chunk of unknown holder queued on an inherited
  node as held by it (:func:`~cacheaffinity.scheduler.stealing.steal_preference`);
* the holders query names, for a chunk of unknown holder, its runner-up nodes
  among the inherited ones (:meth:`Inheritance.runner_ups`): where an earlier
  run's steal most likely put it.

Defines :class:`Inheritance`, the one owner of that state: the nodes looked at
(once each, when their first cache statistics arrive) and the inherited ones.
Bounded to the live nodes and the last
:data:`~cacheaffinity.scheduler.membership.MAX_DEPARTED` that left
(:meth:`Inheritance.prune`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from cacheaffinity.protocol import WORKER_METRIC

if TYPE_CHECKING:
    from cacheaffinity.placement import TorusPlacement
    from cacheaffinity.scheduler.counters import NodeCounters
    from cacheaffinity.scheduler.membership import Membership

logger = logging.getLogger("cacheaffinity.scheduler")

__all__ = ["INHERITED_ASKED", "Inheritance"]

#: Runner-up nodes (among the inherited) named for a chunk of unknown holder: a missed
#: chunk asks each of them once, after a scheduler restart only.
INHERITED_ASKED = 4


class Inheritance:
    """The nodes that joined with cache entries this scheduler has no record of.

    Parameters
    ----------
    membership
        Workers <-> nodes, the workers' reports (cache statistics), and which
        nodes :meth:`prune` keeps.
    placement
        Ranks a chunk's runner-up nodes (:meth:`runner_ups`).
    counters
        Per-node counters: a node this scheduler placed work on is not inherited.
    node_tasks
        ``node -> keys of chunk tasks meant for it`` (the locator's): neither
        is a node with tasks.
    """

    def __init__(
        self,
        membership: Membership,
        placement: TorusPlacement,
        counters: NodeCounters,
        node_tasks: Mapping[str, Any],
    ):
        self.membership = membership
        self.placement = placement
        self.counters = counters
        self.node_tasks = node_tasks
        #: Nodes whose cache statistics were looked at (once each).
        self.seen: set[str] = set()
        #: The inherited nodes (a subset of :attr:`seen`).
        self.nodes: set[str] = set()

    # ------------------------------------------------------------ noting
    def note(self, node: str, entries: Any) -> bool:
        """``node``'s workers report ``entries`` cache entries, seen for the first
        time here: it is inherited if it has some and this scheduler never sent
        it work.  Returns whether it became inherited (a node is looked at once)."""
        if node in self.seen:
            return False
        self.seen.add(node)
        if not (isinstance(entries, (int, float)) and entries > 0):
            return False
        if self.counters.worked_on(node) or node in self.node_tasks:
            return False
        self.nodes.add(node)
        logger.info(
            "cacheaffinity: node %s joined with %d cache entries this scheduler has no "
            "record of (a restart?): its queued chunks count as held by it for stealing, "
            "and it is asked for the chunks of unknown holder it is runner-up of",
            node, int(entries),
        )  # fmt: skip
        return True

    def note_worker(self, addr: str) -> None:
        """Look at the node of worker ``addr`` if not yet done, once its metrics
        carry cache statistics (before that: looked at again later)."""
        node = self.membership.worker_node.get(addr)
        if node is None or node in self.seen:
            return
        ws = self.membership.workers.get(addr)
        m = (ws.metrics or {}).get(WORKER_METRIC) if ws is not None else None
        stats = m.get("stats") if isinstance(m, dict) else None
        if isinstance(stats, dict):
            self.note(node, stats.get("entries"))

    def note_pending(self) -> None:
        """Look at the nodes whose cache statistics had not arrived when they were learned."""
        if len(self.seen) < len(self.membership.node_workers):
            for addr, node in list(self.membership.worker_node.items()):
                if node not in self.seen:
                    self.note_worker(addr)

    # ------------------------------------------------------------ reading
    def __contains__(self, node: object) -> bool:
        return node in self.nodes

    def __iter__(self) -> Iterator[str]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def runner_ups(self, chunk: str) -> list[str]:
        """The inherited nodes among ``chunk``'s next :data:`INHERITED_ASKED` nodes
        of its ranking (its placement's node left out), nearest first."""
        if not self.nodes:
            return []
        ranked = self.placement.ranking(chunk, 1 + INHERITED_ASKED)[1:]
        return [n for n in ranked if n in self.nodes]

    # ------------------------------------------------------------ bounds
    def prune(self) -> int:
        """Forget the nodes neither live nor among the last that left
        (:meth:`Membership.known_nodes`), once there are more than that many.
        Returns how many seen nodes were forgotten."""
        limit = self.membership.known_limit()
        if len(self.seen) <= limit and len(self.nodes) <= limit:
            return 0
        keep = self.membership.known_nodes()
        before = len(self.seen)
        self.seen &= keep
        self.nodes &= keep
        return before - len(self.seen)
