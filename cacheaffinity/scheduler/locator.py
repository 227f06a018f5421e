"""What the scheduler knows about chunk tasks and chunks (runs in the scheduler).

Defines :class:`Locator`, the memory of the scheduler side:

* per chunk task the scheduler holds (freed when Dask forgets the task): its
  chunk id, its target cache node, the node's tasks, whether the stealing
  policy moved it, and the node placement chose when the locator sent it
  elsewhere;
* per chunk, bounded by ``cacheaffinity.scheduler.locator-size`` (oldest
  entries dropped first): the node that processed it last (its *holder*, whose
  cache holds it unless evicted since) and, for chunks processed away from
  their placement's node, where they went (the *locator*: next time such a
  chunk goes to the node that holds it while its placement is unchanged);

and the steal preference built on it (:meth:`Locator.steal_preference`).
Chunks are remembered by the 64-bit xxh3 digest of their id (:func:`chunk_digest`).

Notes
-----
Event-loop only (no locking).  Forgetting a chunk costs at most a cache miss.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import xxhash

if TYPE_CHECKING:
    from distributed.scheduler import TaskState, WorkerState

    from cacheaffinity.placement import TorusPlacement
    from cacheaffinity.scheduler.membership import Membership

__all__ = ["Locator", "choose_steal", "chunk_digest"]


def choose_steal(
    candidates: Iterable[Any],
    *,
    priority: Callable[[Any], tuple | None],
    chunk: Callable[[Any], str | None],
    thief_holds: Callable[[str], bool],
    runner_up_is_thief: Callable[[str], bool] | None,
    victim_holds: Callable[[str], bool] | None = None,
    take_warm: bool = True,
    look: int = 64,
) -> Any:
    """The cache-aware preference among a victim's queued tasks.

    Chunks the thief's node is known to hold first (``thief_holds``), then
    chunks nobody is known to hold (cold), then chunks the victim's node holds
    (``victim_holds``; taken only if ``take_warm``: such a steal turns a cache
    hit into a read from storage), then tasks without a chunk.  Within the
    cold (or warm) chunks, one of the ``look`` tasks the victim would run last
    whose runner-up node is the thief's (``runner_up_is_thief``; None: do not
    look), else the task the victim would run last (largest ``priority``).
    Returns None when nothing may be taken.
    """
    candidates = list(candidates)
    best = None
    best_rank = None
    rank_of: dict[int, int] = {}
    for t in candidates:
        c = chunk(t)
        if c is None:
            rank = 4
        elif thief_holds(c):
            rank = 0
        elif victim_holds is not None and victim_holds(c):
            if not take_warm:
                continue
            rank = 3
        else:
            rank = 2
        rank_of[id(t)] = rank
        pr = priority(t)
        r = (rank, tuple(-x for x in pr) if pr else ())
        if best_rank is None or r < best_rank:
            best, best_rank = t, r
    if best_rank is not None and best_rank[0] in (2, 3) and runner_up_is_thief is not None:
        same = [t for t in candidates if rank_of.get(id(t)) == best_rank[0]]
        for t in sorted(same, key=priority, reverse=True)[:look]:
            if runner_up_is_thief(chunk(t)):
                return t
    return best


def chunk_digest(chunk: str) -> int:
    """The key under which the locator remembers a chunk (xxh3-64 of its id)."""
    return xxhash.xxh3_64_intdigest(chunk.encode("utf-8", "surrogatepass"))


def _remember(d: OrderedDict, key: Hashable, value: Any, size: int) -> None:
    """Set ``d[key] = value`` as the newest entry; drop the oldest beyond ``size``."""
    if key in d:
        d.move_to_end(key)
    d[key] = value
    while len(d) > size:
        d.popitem(last=False)


class Locator:
    """Chunk tasks, their targets, and where chunks were processed.

    Parameters
    ----------
    membership
        Workers <-> cache nodes.
    placement
        The placement (its :meth:`~cacheaffinity.placement.TorusPlacement.ranking`
        names a chunk's runner-up node for the steal preference).
    size
        Chunks remembered at most (``cacheaffinity.scheduler.locator-size``).
    use_locator
        ``cacheaffinity.scheduler.locator``: send a chunk processed elsewhere
        last time to its holder.
    """

    def __init__(
        self,
        membership: Membership,
        placement: TorusPlacement,
        *,
        size: int,
        use_locator: bool = True,
    ):
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(
                f"cacheaffinity.scheduler.locator-size={size!r} must be an integer >= 0, "
                "e.g. 2000000 (~280 MB of scheduler memory, up to ~600 MB if all were stolen)"
            )
        self.membership = membership
        self.placement = placement
        #: Chunks remembered at most.
        self.size: int = size
        #: Whether a chunk processed elsewhere goes to its holder next time.
        self.use_locator: bool = bool(use_locator)
        #: task key -> chunk id, for every chunk task the plugin places
        self.chunk_of: dict[Hashable, str] = {}
        #: task key -> cache node the task is meant for
        self.target: dict[Hashable, str] = {}
        #: cache node id -> keys of tasks meant for it
        self.node_tasks: defaultdict[str, set] = defaultdict(set)
        #: task key -> placement's node, for tasks the locator sent elsewhere
        self.hashed: dict[Hashable, str] = {}
        #: keys of chunk tasks the stealing policy moved (until they finish)
        self.stolen: set = set()
        #: chunk digest -> (node that processed it, node placement chose), for
        #: chunks processed away from their placement's node; newest last
        self.located: OrderedDict[int, tuple[str, str]] = OrderedDict()
        #: chunk digest -> node that processed it last; newest last
        self.holder: OrderedDict[int, str] = OrderedDict()

    # ------------------------------------------------------------ tasks
    def track(self, key: Hashable, chunk: str) -> None:
        """``key`` is a chunk task of ``chunk`` the plugin places."""
        self.chunk_of[key] = chunk

    def is_chunk_task(self, key: Hashable) -> bool:
        return key in self.chunk_of

    def set_target(self, key: Hashable, node: str) -> str | None:
        """Make ``node`` the target of task ``key``; returns the previous target."""
        old = self.target.get(key)
        if old is not None and old != node:
            self.node_tasks[old].discard(key)
        self.target[key] = node
        self.node_tasks[node].add(key)
        return old

    def forget_task(self, key: Hashable) -> None:
        """Dask forgot task ``key``."""
        self.chunk_of.pop(key, None)
        self.hashed.pop(key, None)
        self.stolen.discard(key)
        node = self.target.pop(key, None)
        if node is not None:
            tasks = self.node_tasks.get(node)
            if tasks is not None:
                tasks.discard(key)
                if not tasks:
                    del self.node_tasks[node]

    def untargeted(self) -> list[Hashable]:
        """Chunk tasks without a target (they wait for a cache node)."""
        return [k for k in self.chunk_of if k not in self.target]

    # ------------------------------------------------------------ chunks
    def relocate(self, todo: Sequence[tuple[TaskState, str]], nodes: list[str]) -> int:
        """Send chunks processed elsewhere last time to their holder.

        ``nodes[i]`` is the placement's node of ``todo[i]``; it is replaced by
        the holder when the chunk was processed on a live node other than its
        placement's and its placement is unchanged.  Returns how many moved.
        """
        if not self.use_locator or not self.located:
            return 0
        live, where = self.membership.node_workers, self.located
        moved = 0
        for i, ((ts, chunk), node) in enumerate(zip(todo, nodes)):
            loc = where.get(chunk_digest(chunk))
            if loc is not None and loc[1] == node and loc[0] != node and loc[0] in live:
                self.hashed[ts.key] = node
                nodes[i] = loc[0]
                moved += 1
        return moved

    def where_located(self, chunk: str) -> tuple[str, str] | None:
        """``(holder node, placement's node)`` of a chunk processed away from its
        placement's node, else None."""
        return self.located.get(chunk_digest(chunk))

    def set_located(self, chunk: str, holder: str, placed: str) -> None:
        """Remember that ``holder`` processed ``chunk`` while placement chose ``placed``."""
        _remember(self.located, chunk_digest(chunk), (holder, placed), self.size)

    def holder_of(self, chunk: str) -> str | None:
        """The node that processed ``chunk`` last (None: unknown or forgotten)."""
        return self.holder.get(chunk_digest(chunk))

    def forget_holder(self, chunk: str) -> None:
        self.holder.pop(chunk_digest(chunk), None)

    def finished(self, key: Hashable, node: str | None) -> bool | None:
        """Task ``key`` finished on ``node``: remember where its chunk is.

        Returns whether it ran on its target node (None: not a tracked chunk
        task or unknown node).
        """
        chunk = self.chunk_of.get(key)
        stolen = key in self.stolen
        self.stolen.discard(key)
        meant = self.hashed.pop(key, None)
        if chunk is None or node is None:
            return None
        h = chunk_digest(chunk)
        _remember(self.holder, h, node, self.size)
        target = self.target.get(key)
        if meant is not None:  # sent by the locator: keep what placement chose
            _remember(self.located, h, (node, meant), self.size)
        elif stolen and target is not None:  # the thief's node holds it now
            _remember(self.located, h, (node, target), self.size)
        else:  # on its placement's node (or moved by a membership change)
            self.located.pop(h, None)
        return node == target

    def note_steal(self, key: Hashable) -> None:
        """The stealing policy moved chunk task ``key``."""
        if key in self.chunk_of:
            self.stolen.add(key)

    def steal_preference(
        self,
        candidates: list[TaskState],
        victim: WorkerState,
        thief: WorkerState,
        *,
        take_warm: bool = True,
    ) -> TaskState | None:
        """Which of the victim's queued chunk tasks the thief should take (None: none).

        Chunks the thief's node is known to hold first, then chunks no node
        holds (those whose next-nearest node is the thief's first), then, if
        ``take_warm``, chunks the victim's node holds; see :func:`choose_steal`.
        """
        node_of = self.membership.worker_node
        thief_node = node_of.get(thief.address)
        victim_node = node_of.get(victim.address)
        located, holder, placement = self.located, self.holder, self.placement
        return choose_steal(
            candidates,
            priority=lambda ts: ts.priority,
            chunk=lambda ts: self.chunk_of.get(ts.key),
            thief_holds=lambda c: thief_node is not None
            and located.get(chunk_digest(c), ("",))[0] == thief_node,
            runner_up_is_thief=None
            if thief_node is None or len(self.membership.node_workers) <= 1
            else lambda c: placement.ranking(c, 2)[1:] == [thief_node],
            victim_holds=None
            if victim_node is None
            else lambda c: holder.get(chunk_digest(c)) == victim_node,
            take_warm=take_warm,
        )
