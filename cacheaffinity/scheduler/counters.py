"""Per-node counters of the scheduler plugin (runs in the scheduler).

Defines :class:`NodeCounters`: per cache node, how many chunk tasks were placed on
it, failed over from it, stolen by its workers, and finished on or off their
node.  The plugin and re-targeting count here; the queries, the dashboard and the
Prometheus collector read it.  Bounded like every per-node state: the live nodes
and the last :data:`~cacheaffinity.scheduler.membership.MAX_DEPARTED` that left
(:meth:`NodeCounters.prune`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cacheaffinity.scheduler.membership import Membership

__all__ = ["WORK", "NodeCounters"]

#: Counters that say this scheduler sent work to a node (or the node did some).
WORK = ("placements", "on-target", "off-target", "steals")


class NodeCounters:
    """``node -> {counter: value}`` (placements, failovers, steals, on-target,
    off-target), for the nodes :class:`Membership` still knows.

    Parameters
    ----------
    membership
        Which nodes are live or left recently (what :meth:`prune` keeps).
    """

    def __init__(self, membership: Membership):
        self.membership = membership
        #: cache node id -> its counters
        self._by_node: defaultdict[str, Counter[str]] = defaultdict(Counter)

    def add(self, node: str, name: str, n: int = 1) -> None:
        """Add ``n`` to counter ``name`` of ``node``."""
        self._by_node[node][name] += n

    def get(self, node: str) -> dict[str, int]:
        """A copy of ``node``'s counters (empty if none)."""
        c = self._by_node.get(node)
        return dict(c) if c is not None else {}

    def worked_on(self, node: str) -> bool:
        """Whether this scheduler placed chunk tasks on ``node`` or it ran or stole some."""
        c = self._by_node.get(node)
        return c is not None and any(c.get(k) for k in WORK)

    def to_dict(self) -> dict[str, dict[str, int]]:
        """``{node: {counter: value}}`` (copies), departed nodes included."""
        return {n: dict(c) for n, c in self._by_node.items()}

    def __contains__(self, node: object) -> bool:
        return node in self._by_node

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_node)

    def __len__(self) -> int:
        return len(self._by_node)

    def prune(self) -> int:
        """Forget the counters of nodes neither live nor among the last that left
        (:meth:`Membership.known_nodes`), once there are more than that many.
        Returns how many nodes were forgotten."""
        if len(self._by_node) <= self.membership.known_limit():
            return 0
        keep = self.membership.known_nodes()
        gone = [n for n in self._by_node if n not in keep]
        for n in gone:
            del self._by_node[n]
        return len(gone)
