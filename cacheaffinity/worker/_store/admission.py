"""What a full node cache admits and evicts (pure: no SQLite, no disk, no dask).

The :class:`Policy` interface is called by the simulator (``benchmarks/simulate.py``) and
by the store's ``Admitter``; decisions are deterministic given the calls (ranks are
hashes, ``random`` is seeded).  The store runs ``rank`` (:class:`StableRank`); why, and
the others' figures: docs/design.md, "Beyond capacity"."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import random
import statistics
from collections import OrderedDict, deque
from collections.abc import Iterator
from typing import Any, ClassVar

import xxhash

__all__ = [
    "POLICIES",
    "Fifo",
    "Keep",
    "Policy",
    "RandomEvict",
    "RankFifo",
    "RankTheta",
    "S3Fifo",
    "StableRank",
    "key_hash",
    "make_policy",
    "first_of",
    "rank",
]

_TWO64 = float(2**64)
#: Sampled reuse distances seen before :class:`StableRank` estimates the demand.
MIN_REUSES = 5


def key_hash(key: str, seed: int = 0) -> int:
    """The 64-bit xxh3 hash of ``key`` (UTF-8) with ``seed``."""
    return xxhash.xxh3_64_intdigest(key.encode("utf-8", "surrogatepass"), seed=seed)


def rank(key: str, seed: int = 0) -> float:
    """The stable rank of ``key`` in [0, 1): ``xxh3_64(key, seed) / 2**64``."""
    return key_hash(key, seed) / _TWO64


def first_of(items: Iterator[tuple], exclude=()) -> tuple | None:
    """The first of ``items`` (``(value, key)``, an entries table's order) whose key is not
    in ``exclude``, or None; ``items`` closed."""
    with contextlib.closing(items):  # type: ignore[type-var]
        for it in items:
            if it[1] not in exclude:
                return it
    return None


class _Head:
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


class Policy:
    """Base of the policies: byte accounting and the shared interface (``capacity`` in bytes)."""

    name: ClassVar[str] = ""

    def __init__(self, capacity: float):
        self.capacity = capacity
        #: bytes of the entries held
        self.used = 0
        #: bytes looked up so far (the policy's clock)
        self.clock = 0

    def __contains__(self, key: str) -> bool:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def lookup(self, key: str, size: float) -> bool:
        """Record a lookup of ``key`` (``size`` bytes); return whether it is held."""
        self.clock += size
        return key in self

    def admit(self, key: str, size: float) -> bool:
        """Whether :meth:`offer` would store ``key`` (changes nothing)."""
        return key not in self and size <= self.capacity

    def offer(self, key: str, size: float) -> list[str] | None:
        """Store ``key`` after a miss if admitted: the keys evicted to make room
        (held no more), or None if not admitted (nothing changed)."""
        if not self.admit(key, size):
            return None
        out = self.victims(size, key)
        self._insert(key, size)
        return out

    def victims(self, size: float, key: str | None = None) -> list[str]:
        """Evict until ``size`` more bytes fit; return the evicted keys."""
        raise NotImplementedError

    def remove(self, key: str) -> None:
        """Forget ``key`` (its entry vanished); no-op if not held."""
        raise NotImplementedError

    def _insert(self, key: str, size: float) -> None:
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        """The constructor's keyword arguments."""
        return {}

    def state(self) -> dict[str, Any]:
        """The policy's own state, JSON-serialisable, without its entries (bounded in size)."""
        return {"policy": self.name, "capacity": self.capacity, "clock": self.clock, "params": self.params()}

    def entries(self) -> list[list]:
        """``[key, size, ...]`` per entry, oldest first (what the store keeps in rows)."""
        raise NotImplementedError

    @classmethod
    def from_state(cls, state: dict[str, Any], entries: list[list] = ()) -> Policy:
        """The policy of ``state`` (any subclass: by its ``policy`` name) holding
        ``entries`` (as :meth:`entries` gave them)."""
        klass = POLICIES[state["policy"]]
        p = klass(state["capacity"], **state.get("params", {}))
        p.clock = state["clock"]
        p._restore(state, entries)
        return p

    def _restore(self, state: dict[str, Any], entries: list[list]) -> None:
        for key, size, *_ in entries:
            self._insert(key, size)


class Fifo(Policy):
    """Admit everything that fits; evict the oldest entry (the store's FIFO)."""

    name = "fifo"

    def __init__(self, capacity: float):
        super().__init__(capacity)
        self._items: OrderedDict[str, float] = OrderedDict()

    def __contains__(self, key):
        return key in self._items

    def __len__(self):
        return len(self._items)

    def victims(self, size, key=None):
        out = []
        while self._items and self.used + size > self.capacity:
            k, s = self._items.popitem(last=False)
            self.used -= s
            out.append(k)
        return out

    def _insert(self, key, size):
        self._items[key] = size
        self.used += size

    def remove(self, key):
        s = self._items.pop(key, None)
        if s is not None:
            self.used -= s

    def entries(self):
        return [[k, s] for k, s in self._items.items()]


class Keep(Fifo):
    """Admit only while there is room; never evict."""

    name = "keep"

    def admit(self, key, size):
        return key not in self._items and self.used + size <= self.capacity


class RandomEvict(Fifo):
    """Admit everything that fits; evict uniformly random entries (generator seeded by ``seed``)."""

    name = "random"

    def __init__(self, capacity: float, seed: int = 0):
        super().__init__(capacity)
        self.seed = seed
        self._rng = random.Random(seed)
        self._keys: list[str] = []
        self._pos: dict[str, int] = {}

    def params(self):
        return {"seed": self.seed}

    def victims(self, size, key=None):
        out = []
        while self._keys and self.used + size > self.capacity:
            k = self._keys[self._rng.randrange(len(self._keys))]
            self.remove(k)
            out.append(k)
        return out

    def _insert(self, key, size):
        super()._insert(key, size)
        self._pos[key] = len(self._keys)
        self._keys.append(key)

    def remove(self, key):
        i = self._pos.pop(key, None)
        if i is None:
            return
        last = self._keys.pop()
        if i < len(self._keys):
            self._keys[i] = last
            self._pos[last] = i
        super().remove(key)

    def entries(self):
        """``[key, size]`` per entry, in the order the draws index."""
        return [[k, self._items[k]] for k in self._keys]

    def state(self):
        st = super().state()
        version, internal, gauss = self._rng.getstate()
        st["rng"] = [version, list(internal), gauss]
        return st

    def _restore(self, state, entries):
        super()._restore(state, entries)
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))


class RankEntries:
    """The entries of a :class:`StableRank` in memory (the simulator's; the store keeps them
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
    """The bottom-k sample of :class:`StableRank` in memory: key hash -> clock of its last
    lookup, and the largest hash (the store's: ``admitter.IndexSample``)."""

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


class StableRank(Policy):
    """Keep the keys of lowest stable rank (``xxh3_64(key) / 2**64``) that are still in use.

    An entry is *stale* once not looked up for :attr:`live_factor` x its last reuse
    distance (bytes looked up between its last two lookups; below the demand: twice the
    demand minus it; never looked up again: x the node's *demand*, the median reuse
    distance of a bottom-k sample of keys, as SHARDS samples).  Stale entries go first
    (stalest first), then the highest rank.  A missed key is admitted into room: free,
    stale, or of held entries that all rank higher.

    Every decision asks the entries and the sample for one entry or one extreme (a hash
    lookup or the top of an ordered index), never for all of them: what the store keeps
    in its index costs the same per operation whatever it holds (``entries``/``sample``:
    :class:`RankEntries`/:class:`RankSample` by default, the store's in its index).

    Parameters
    ----------
    live, min_live
        Bounds of the stale factor ``1 + jitter``.
    slack
        ``theta = min(1, slack * capacity / demand)``.
    sample
        Keys in the bottom-k sample.
    window
        The demand is the median of the last ``window`` sampled reuse distances (once
        :data:`MIN_REUSES` were seen).
    gate
        Where keys of rank ``theta`` or more are refused: ``"none"`` (never),
        ``"compete"`` (where a live entry would have to go) or ``"all"`` (even into room).
    quantile, jitter, learn
        ``jitter`` estimates (from the value given, in steps of rate ``learn``) the
        ``quantile`` of the relative change of an entry's reuse distance between two hits.
    """

    name = "rank"

    def __init__(self, capacity: float, seed: int = 0, live: float = 1.25, slack: float = 1.1,
                 sample: int = 1024, window: int = 63, gate: str = "none", min_live: float = 1.05,
                 quantile: float = 0.98, jitter: float = 0.25, learn: float = 0.2):  # fmt: skip
        self.table: RankEntries = RankEntries()
        self.sample: RankSample = RankSample()
        super().__init__(capacity)
        self.seed, self.live, self.slack, self.sample_size, self.window = seed, live, slack, sample, window
        self._reuses: deque[float] = deque(maxlen=window)
        self.gate, self.min_live, self.quantile, self.learn = gate, min_live, quantile, learn
        #: learnt ``quantile`` of the relative change of reuse distances
        self.jitter = jitter
        #: median sampled reuse distance in bytes (None: none seen yet)
        self.demand: float | None = None
        self._sampled = 0
        #: Bytes of other processes' lookups not saved yet: staleness must exceed it
        #: (0 with one process, as in the simulator; not persisted).
        self.grace = 0.0

    @property
    def used(self) -> float:  # type: ignore[override]
        return self.table.used

    @used.setter
    def used(self, value: float) -> None:  # Policy.__init__'s 0: the entries count their bytes
        pass

    def params(self):
        return {"seed": self.seed, "live": self.live, "slack": self.slack, "sample": self.sample_size,
                "window": self.window, "gate": self.gate, "min_live": self.min_live,
                "quantile": self.quantile, "learn": self.learn}  # fmt: skip

    def __contains__(self, key):
        return key in self.table

    def __len__(self):
        return len(self.table)

    @property
    def theta(self) -> float:
        """Admission threshold on the rank: ``min(1, slack * capacity / demand)``."""
        if not self.demand:
            return 1.0
        return min(1.0, self.slack * self.capacity / self.demand)

    @property
    def live_factor(self) -> float:
        """Stale after this many reuse distances: ``1 + jitter`` within ``[min_live, live]``."""
        return min(self.live, max(self.min_live, 1.0 + self.jitter))

    def _observe(self, h: int, size: float) -> None:
        smp = self.sample
        t = smp.get(h)
        if t is not None:
            if self.clock - t <= size:
                return  # nothing else looked up since: the same lookup recorded twice
            smp.set(h, self.clock)
            self._reuses.append(self.clock - t)
            if len(self._reuses) >= MIN_REUSES:
                self.demand = statistics.median(self._reuses)
            return
        if len(smp) >= self.sample_size:
            top = smp.largest()
            if top is None or h >= top:
                return
            smp.remove(top)
        smp.set(h, self.clock)
        self._sampled += 1
        if self._sampled >= self.sample_size and self.demand:
            # forget keys idle for 4 reuse distances, so the sample follows a new workload
            self._sampled = 0
            smp.forget_before(self.clock - 4 * self.demand)

    def lookup(self, key, size, h=None):
        """A lookup of ``key`` (``h``: its :func:`key_hash` with this seed, if known)."""
        e = self.table.get(key)
        if e is not None and e[2] >= self.clock and not self.demand:
            # Nothing was looked up since its last lookup or its insert (a value put twice, a
            # miss and the hit its insert answers): without a demand to go by, that reuse
            # distance of one entry would make it stale within a few lookups.
            return True
        self.clock += size
        self._observe(key_hash(key, self.seed) if h is None else h, size)
        if e is None:
            return False
        d = self.clock - e[2]
        prev = e[4]
        if prev:
            dev = abs(d - prev) / prev
            # up by quantile, down by 1 - quantile: rests where a fraction quantile is below
            step = self.quantile if dev > self.jitter else self.quantile - 1.0
            self.jitter = min(1.0, max(0.01, self.jitter * math.exp(self.learn * step)))
        # A key run early this time (d below the demand) may run as late next time as it ran
        # early now: due no earlier than the demand's mirror image (a node's chunk order is
        # not the same every run: the last chunk of one run can be the first of the next).
        demand = self.demand or 0.0
        self.table.touch(key, self.clock, self.clock + self.live_factor * max(d, 2.0 * demand - d), d)
        return True

    def _stalest(self, due: _Head, fresh: _Head, taken) -> tuple[float, str] | None:
        """``(how long stale, key)`` of the entry stale longest (keys in ``taken``
        skipped), or None if none is."""
        best = None
        first = due.get(taken)
        if first is not None and first[0] + self.grace < self.clock:
            best = (self.clock - first[0], first[1])
        if self.demand:
            oldest = fresh.get(taken)
            if oldest is not None:
                over = self.clock - self.live_factor * self.demand - oldest[0] - self.grace
                if over > 0 and (best is None or over > best[0]):
                    best = (over, oldest[1])
        return best

    def _plan(self, size: float, below: float) -> list[str] | None:
        """The keys to evict to make room for ``size`` bytes (stale entries, stalest first,
        then the highest ranks), or None if that would take an entry that is
        not stale and does not rank above ``below`` (nothing changes).  Each of the
        table's three orders is walked once, however many victims it takes."""
        need = self.used + size - self.capacity
        out: list[str] = []
        taken: set[str] = set()
        t = self.table
        orders = (_Head(t.due_order()), _Head(t.fresh_order()), _Head(t.rank_order()))
        due, fresh, by_rank = orders
        try:
            while need > 0:
                stale = self._stalest(due, fresh, taken)
                if stale is not None:
                    k = stale[1]
                else:
                    top = by_rank.get(taken)
                    if top is None or top[0] <= below:
                        return None
                    k = top[1]
                e = t.get(k)
                if e is None:
                    return None
                out.append(k)
                taken.add(k)
                need -= e[0]
            return out
        finally:
            for order in orders:
                order.close()

    def _room(self, key: str, size: float) -> list[str] | None:
        """The keys to evict for ``key`` (``[]``: it fits), or None if it is not admitted:
        into room, into the room of stale entries, or in place of entries that rank higher,
        all of them: a key never displaces a live entry of lower rank (where one victim of
        higher rank is not room enough, the next might rank lower: refused)."""
        if size > self.capacity or key in self.table:
            return None
        r = rank(key, self.seed)
        gated = r < self.theta or self.gate == "none"
        if self.gate == "all" and not gated:
            return None
        if self.used + size <= self.capacity:
            return []
        return self._plan(size, r if gated else math.inf)

    def admit(self, key, size):
        return self._room(key, size) is not None

    def offer(self, key, size):
        """As :meth:`Policy.offer`, the victims planned once (the admission's own plan)."""
        out = self._room(key, size)
        if out is None:
            return None
        for k in out:
            self.remove(k)
        self._insert(key, size)
        return out

    def _insert(self, key, size, used=None, due=None, dist=None):
        self.table.add(key, size, rank(key, self.seed), self.clock if used is None else used, due, dist)

    def remove(self, key):
        self.table.remove(key)

    def scalars(self) -> dict[str, Any]:
        """:meth:`state` without the sample (the store keeps it in its index)."""
        st = super().state()
        st["demand"] = self.demand
        st["reuses"] = list(self._reuses)
        st["jitter"] = self.jitter
        st["sampled"] = self._sampled
        return st

    def set_scalars(self, st: dict[str, Any]) -> None:
        """Adopt what :meth:`scalars` gave (capacity and parameters stay this policy's)."""
        self.clock = float(st["clock"])
        self.demand = None if st.get("demand") is None else float(st["demand"])
        self._reuses.clear()
        self._reuses.extend(float(x) for x in st.get("reuses", []))
        self.jitter = float(st.get("jitter", self.jitter))
        self._sampled = int(st.get("sampled", 0))

    def state(self):
        st = self.scalars()
        st["sample"] = [[h, h / _TWO64, t] for h, t in self.sample.items()]
        return st

    def meta(self, key: str) -> list | None:
        """``[last lookup, stale from, last reuse distance]`` of ``key`` (what :meth:`entries`
        gives after key and size), or None if not held."""
        e = self.table.get(key)
        return None if e is None else list(e[2:])

    def entries(self):
        """``[key, size, last lookup, stale from, last reuse distance]`` per entry (the last two
        None if never looked up since inserted), by last lookup."""
        return [[k, size, *rest] for k, size, _, *rest in sorted(self.table.items(), key=lambda it: it[3])]

    def _restore(self, state, entries):
        self.set_scalars({**state, "jitter": state.get("jitter", 0.0)})
        for h, _, t in state.get("sample", []):
            self.sample.set(h, t)
        for key, size, *rest in entries:
            self._insert(key, size, *rest[:3])


class RankTheta(StableRank):
    """:class:`StableRank` whose ``theta`` also refuses keys where a live entry would go."""

    name = "rank-theta"

    def __init__(self, capacity: float, gate: str = "compete", **kw: Any):
        super().__init__(capacity, gate=gate, **kw)


class RankFifo(StableRank):
    """Admission by stable rank below ``theta``; first in, first out among the admitted."""

    name = "rank-fifo"

    def __init__(self, capacity: float, slack: float = 0.95, **kw: Any):
        super().__init__(capacity, slack=slack, **kw)
        self._order: OrderedDict[str, None] = OrderedDict()

    offer = Policy.offer  # its own admit and victims, not rank's plan

    def admit(self, key, size):
        return key not in self.table and size <= self.capacity and rank(key, self.seed) < self.theta

    def victims(self, size, key=None):
        out = []
        while self._order and self.used + size > self.capacity:
            k, _ = self._order.popitem(last=False)
            self.remove(k)
            out.append(k)
        return out

    def _insert(self, key, size, used=None, due=None, dist=None):
        super()._insert(key, size, used, due, dist)
        self._order[key] = None

    def remove(self, key):
        self._order.pop(key, None)
        super().remove(key)

    def entries(self):
        return [[k, e[0], *e[2:]] for k in self._order if (e := self.table.get(k)) is not None]


class S3Fifo(Policy):
    """S3-FIFO (Yang et al., SOSP 2023): a probationary FIFO (``small`` of the capacity), a
    main FIFO with 2-bit frequencies and a ghost FIFO; an entry leaving the small FIFO with
    ``promote`` hits or more moves to the main one (1, as in libCacheSim)."""

    name = "s3fifo"

    def __init__(self, capacity: float, small: float = 0.1, promote: int = 1):
        super().__init__(capacity)
        self.small, self.promote = small, promote
        #: key -> [size, freq, queue ("S" or "M")]
        self._entries: dict[str, list] = {}
        self._s: OrderedDict[str, None] = OrderedDict()
        self._m: OrderedDict[str, None] = OrderedDict()
        self._s_used = 0
        #: hashes of keys evicted from the small FIFO, oldest first, at most len(self) (>= 16)
        self._ghost: OrderedDict[int, None] = OrderedDict()

    def params(self):
        return {"small": self.small, "promote": self.promote}

    def __contains__(self, key):
        return key in self._entries

    def __len__(self):
        return len(self._entries)

    def lookup(self, key, size):
        self.clock += size
        e = self._entries.get(key)
        if e is None:
            return False
        e[1] = min(3, e[1] + 1)
        return True

    def _ghost_add(self, h):
        self._ghost[h] = None
        self._ghost.move_to_end(h)
        bound = max(16, len(self._entries))
        while len(self._ghost) > bound:
            self._ghost.popitem(last=False)

    def victims(self, size, key=None):
        out = []
        while self._entries and self.used + size > self.capacity:
            if self._s and (self._s_used >= self.small * self.capacity or not self._m):
                k, _ = self._s.popitem(last=False)
                e = self._entries[k]
                if e[1] >= self.promote:
                    e[1], e[2] = 0, "M"
                    self._s_used -= e[0]
                    self._m[k] = None
                    continue
                self._s_used -= e[0]
                self.used -= e[0]
                del self._entries[k]
                self._ghost_add(key_hash(k))
                out.append(k)
            else:
                k, _ = self._m.popitem(last=False)
                e = self._entries[k]
                if e[1] > 0:
                    e[1] -= 1
                    self._m[k] = None
                    continue
                self.used -= e[0]
                del self._entries[k]
                out.append(k)
        return out

    def _insert(self, key, size, queue=None, freq=0):
        h = key_hash(key)
        if queue is None:
            queue = "M" if h in self._ghost else "S"
            self._ghost.pop(h, None)
        self._entries[key] = [size, freq, queue]
        self.used += size
        if queue == "M":
            self._m[key] = None
        else:
            self._s[key] = None
            self._s_used += size

    def remove(self, key):
        e = self._entries.pop(key, None)
        if e is None:
            return
        self.used -= e[0]
        if e[2] == "S":
            self._s.pop(key, None)
            self._s_used -= e[0]
        else:
            self._m.pop(key, None)

    def state(self):
        st = super().state()
        st["ghost"] = list(self._ghost)
        return st

    def entries(self):
        return [[k, *self._entries[k][:2], "S"] for k in self._s] + [[k, *self._entries[k][:2], "M"] for k in self._m]

    def _restore(self, state, entries):
        for key, size, freq, queue in entries:
            self._insert(key, size, queue=queue, freq=freq)
        for h in state.get("ghost", []):
            self._ghost[h] = None


POLICIES: dict[str, type[Policy]] = {
    c.name: c for c in (Fifo, Keep, RandomEvict, StableRank, RankTheta, RankFifo, S3Fifo)
}


def make_policy(name: str, capacity: float, **params: Any) -> Policy:
    """A policy by name (:data:`POLICIES`) for a cache of ``capacity`` bytes."""
    try:
        klass = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown cache policy {name!r}; known: {', '.join(POLICIES)}") from None
    return klass(capacity, **params)
