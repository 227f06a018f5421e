"""Inherited nodes: caches this scheduler has no record of (runs in the scheduler).

A node that joins with cache entries while this scheduler never sent it work
(the scheduler restarted, or the node came back with its disk) is *inherited*,
logged once. Stealing counts its queued chunks of unknown holder as held by it;
the holders query names its chunks' inherited runner-up nodes. Bounded to the
live nodes and the last ``MAX_DEPARTED`` that left.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from cacheaffinity.protocol import WORKER_METRIC

if TYPE_CHECKING:
    from cacheaffinity.placement import TorusPlacement
    from cacheaffinity.scheduler._counters import NodeCounters
    from cacheaffinity.scheduler._membership import Membership

logger = logging.getLogger("cacheaffinity.scheduler")

__all__ = ["INHERITED_ASKED", "Inheritance"]

#: Runner-up nodes of a chunk of unknown holder looked at for inherited ones.
INHERITED_ASKED = 4


class Inheritance:
    """The nodes that joined with cache entries this scheduler has no record of.

    A node with ``counters`` of work or with ``node_tasks`` is not inherited.
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
        self.seen: set[str] = set()
        self.nodes: set[str] = set()

    def note(self, node: str, entries: Any) -> bool:
        """Look at ``node`` (once) with ``entries`` in its cache; True if it is inherited."""
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
        """Look at the node of worker ``addr`` once its metrics carry cache statistics."""
        node = self.membership.worker_node.get(addr)
        if node is None or node in self.seen:
            return
        ws = self.membership.workers.get(addr)
        m = (ws.metrics or {}).get(WORKER_METRIC) if ws is not None else None
        stats = m.get("stats") if isinstance(m, dict) else None
        if isinstance(stats, dict):
            self.note(node, stats.get("entries"))

    def note_pending(self) -> None:
        """Look at the nodes whose cache statistics arrived late."""
        if len(self.seen) < len(self.membership.node_workers):
            for addr, node in list(self.membership.worker_node.items()):
                if node not in self.seen:
                    self.note_worker(addr)

    def __contains__(self, node: object) -> bool:
        return node in self.nodes

    def __iter__(self) -> Iterator[str]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def runner_ups(self, chunk: str) -> list[str]:
        """The inherited nodes among ``chunk``'s next ``INHERITED_ASKED``, nearest first."""
        if not self.nodes:
            return []
        ranked = self.placement.ranking(chunk, 1 + INHERITED_ASKED)[1:]
        return [n for n in ranked if n in self.nodes]

    def prune(self) -> int:
        """Forget nodes ``Membership.known_nodes`` no longer names; returns how many."""
        limit = self.membership.known_limit()
        if len(self.seen) <= limit and len(self.nodes) <= limit:
            return 0
        keep = self.membership.known_nodes()
        before = len(self.seen)
        self.seen &= keep
        self.nodes &= keep
        return before - len(self.seen)
