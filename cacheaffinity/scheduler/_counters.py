"""Per-node counters of the scheduler plugin (runs in the scheduler).

``NodeCounters``: per cache node, chunk tasks placed on it, failed over from it,
stolen by its workers, finished on or off their node. Kept for the live nodes and
the last ``MAX_DEPARTED`` that left.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cacheaffinity.scheduler._membership import Membership

__all__ = ["WORK", "NodeCounters"]

#: Counters saying this scheduler sent a node work or the node did some.
WORK = ("placements", "on-target", "off-target", "steals")


class NodeCounters:
    """``node -> {counter: value}`` for the nodes ``membership`` still knows."""

    def __init__(self, membership: Membership):
        self.membership = membership
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
        """Forget nodes ``Membership.known_nodes`` no longer names; returns how many."""
        if len(self._by_node) <= self.membership.known_limit():
            return 0
        keep = self.membership.known_nodes()
        gone = [n for n in self._by_node if n not in keep]
        for n in gone:
            del self._by_node[n]
        return len(gone)
