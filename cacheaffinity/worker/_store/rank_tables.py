"""Stable ranks of keys (:func:`rank`), and the ``rank`` policy's entries and bottom-k
sample in memory (the simulator's; the store keeps them in its index:
``admitter.IndexEntries``/``index_sample.IndexSample``, the same interface), with the walk of their
orders a victim plan makes (:class:`Head`, :func:`first_of`)."""

from __future__ import annotations

import contextlib
import heapq
import itertools
from collections.abc import Iterator

import xxhash

__all__ = ["TWO64", "Head", "RankEntries", "RankSample", "first_of", "key_hash", "rank"]

TWO64 = float(2**64)


def key_hash(key: str, seed: int = 0) -> int:
    """The 64-bit xxh3 hash of ``key`` (UTF-8) with ``seed``."""
    return xxhash.xxh3_64_intdigest(key.encode("utf-8", "surrogatepass"), seed=seed)


def rank(key: str, seed: int = 0) -> float:
    """The stable rank of ``key`` in [0, 1): ``xxh3_64(key, seed) / 2**64``."""
    return key_hash(key, seed) / TWO64


def first_of(items: Iterator[tuple], exclude=()) -> tuple | None:
    """The first of ``items`` (``(value, key)``, an entries table's order) whose key is not
    in ``exclude``, or None; ``items`` closed."""
    with contextlib.closing(items):  # type: ignore[type-var]
        for it in items:
            if it[1] not in exclude:
                return it
    return None


class Head:
    """One order of an entries table during a victim plan: its first key not taken yet.
    The plan only ever adds to ``taken``, so what was passed stays passed: each entry is
    read at most once per plan, whatever the plan takes (a plan of ``k`` victims costs
    ``O(k)`` steps of each order, not ``O(k)`` steps per victim)."""

    __slots__ = ("_items", "_head")

    def __init__(self, items: Iterator[tuple]):
        self._items = items
        self._head: tuple | None = None

    def get(self, taken) -> tuple | None:
        head = self._head
        while head is None or head[1] in taken:
            head = next(self._items, None)
            if head is None:
                break
        self._head = head
        return head

    def close(self) -> None:
        self._items.close()  # type: ignore[attr-defined]


class RankEntries:
    """The entries of a ``StableRank`` in memory (the simulator's; the store keeps them
    as columns of its index rows: ``admitter.IndexEntries``, the same interface).

    Each entry is ``(size, rank, last lookup, stale from, last reuse distance)`` (clocks;
    the last two None until looked up again) and has an insertion number: ties of the
    orders below go to the older entry (the store: the row id)."""

    def __init__(self) -> None:
        #: key -> [size, rank, last lookup, stale from, last reuse distance, insertion number]
        self._e: dict[str, list] = {}
        self._seq = itertools.count()
        self._by_rank: list[tuple[float, int, str]] = []  # (-rank, -number, key), lazy
        self._fresh: list[tuple[float, int, str]] = []  # (inserted, number, key): never looked up since, lazy
        self._due: list[tuple[float, int, str]] = []  # (stale from, number, key): looked up since, lazy
        #: bytes of the entries held
        self.used = 0.0

    def __len__(self) -> int:
        return len(self._e)

    def __contains__(self, key: str) -> bool:
        return key in self._e

    def get(self, key: str) -> tuple | None:
        """``(size, rank, last lookup, stale from, last reuse distance)`` of ``key``, or None."""
        e = self._e.get(key)
        return None if e is None else tuple(e[:5])

    def size(self, key: str) -> float | None:
        """The size of ``key``, or None if not held."""
        e = self._e.get(key)
        return None if e is None else e[0]

    def add(self, key: str, size: float, r: float, used: float, due: float | None, dist: float | None) -> None:
        n = next(self._seq)
        self._e[key] = [size, r, used, due, dist, n]
        self.used += size
        heapq.heappush(self._by_rank, (-r, -n, key))
        if due is None:
            heapq.heappush(self._fresh, (used, n, key))
        else:
            heapq.heappush(self._due, (due, n, key))
        if len(self._by_rank) + len(self._fresh) > 8 * len(self._e) + 128:
            # drop the lazy heaps' dead items (bounded memory)
            self._by_rank = [(-v[1], -v[5], k) for k, v in self._e.items()]
            self._fresh = [(v[2], v[5], k) for k, v in self._e.items() if v[3] is None]
            heapq.heapify(self._by_rank)
            heapq.heapify(self._fresh)

    def touch(self, key: str, used: float, due: float, dist: float) -> None:
        """``key`` was looked up at ``used``: stale from ``due``."""
        e = self._e[key]
        e[2], e[3], e[4] = used, due, dist
        heapq.heappush(self._due, (due, e[5], key))
        if len(self._due) > 4 * len(self._e) + 64:
            self._due = [(v[3], v[5], k) for k, v in self._e.items() if v[3] is not None]
            heapq.heapify(self._due)

    def remove(self, key: str) -> None:
        e = self._e.pop(key, None)
        if e is not None:
            self.used -= e[0]

    @staticmethod
    def _walk(heap, valid) -> Iterator[tuple]:
        """The valid items of ``heap`` in its order (invalid ones dropped): the others are
        popped as they are passed and pushed back when the walk is closed."""
        held = []
        try:
            while heap:
                it = heapq.heappop(heap)
                if valid(it):
                    held.append(it)
                    yield it
        finally:
            for it in held:
                heapq.heappush(heap, it)

    def due_order(self) -> Iterator[tuple[float, str]]:
        """``(stale from, key)`` of the looked-up entries, stale first first (close it)."""
        e = self._e
        for it in self._walk(self._due, lambda it: (v := e.get(it[2])) is not None and v[5] == it[1] and v[3] == it[0]):
            yield it[0], it[2]

    def fresh_order(self) -> Iterator[tuple[float, str]]:
        """``(inserted, key)`` of the entries not looked up since inserted, oldest first (close it)."""
        e = self._e

        def valid(it):
            return (v := e.get(it[2])) is not None and v[5] == it[1] and v[3] is None

        for it in self._walk(self._fresh, valid):
            yield it[0], it[2]

    def rank_order(self) -> Iterator[tuple[float, str]]:
        """``(rank, key)`` of the entries, highest rank first (ties: the newer) (close it)."""
        e = self._e
        for it in self._walk(self._by_rank, lambda it: (v := e.get(it[2])) is not None and v[5] == -it[1]):
            yield -it[0], it[2]

    def first_due(self, exclude=()) -> tuple[float, str] | None:
        """``(stale from, key)`` of the looked-up entry stale first (keys in ``exclude`` skipped)."""
        return first_of(self.due_order(), exclude)

    def first_fresh(self, exclude=()) -> tuple[float, str] | None:
        """``(inserted, key)`` of the oldest entry not looked up since inserted."""
        return first_of(self.fresh_order(), exclude)

    def highest(self, exclude=()) -> tuple[float, str] | None:
        """``(rank, key)`` of the entry of highest rank."""
        return first_of(self.rank_order(), exclude)

    def items(self) -> list[tuple]:
        """``(key, size, rank, last lookup, stale from, distance)`` of every entry, oldest first."""
        return [(k, *v[:5]) for k, v in sorted(self._e.items(), key=lambda kv: kv[1][5])]


class RankSample:
    """The bottom-k sample of a ``StableRank`` in memory: key hash -> clock of its last
    lookup, and the largest hash (the store's: ``index_sample.IndexSample``)."""

    def __init__(self) -> None:
        self._t: dict[int, float] = {}
        self._heap: list[int] = []  # -hash, lazy

    def __len__(self) -> int:
        return len(self._t)

    def get(self, h: int) -> float | None:
        return self._t.get(h)

    def set(self, h: int, t: float) -> None:
        """Record ``h`` (new or held) as looked up at ``t``."""
        if h not in self._t:
            heapq.heappush(self._heap, -h)
            if len(self._heap) > 2 * len(self._t) + 64:
                # hashes forgotten from the sample stay in the lazy heap below its top: rebuild
                self._heap = [-k for k in self._t]
                heapq.heapify(self._heap)
        self._t[h] = t

    def largest(self) -> int | None:
        heap = self._heap
        while heap and -heap[0] not in self._t:
            heapq.heappop(heap)
        return -heap[0] if heap else None

    def remove(self, h: int) -> None:
        self._t.pop(h, None)

    def forget_before(self, cut: float) -> None:
        """Forget the hashes last looked up before ``cut``."""
        for h in [h for h, t in self._t.items() if t < cut]:
            del self._t[h]

    def items(self) -> list[tuple[int, float]]:
        return sorted(self._t.items())
