"""What a full node cache admits and evicts (pure: no SQLite, no disk, no dask).

The :class:`Policy` interface is called by the simulator (``benchmarks/simulate.py``) and
by the store's ``Admitter``; decisions are deterministic given the calls (ranks are
hashes, ``random`` is seeded).  The store runs ``rank`` (:class:`StableRank`); why, and
the others' figures: docs/design.md, "Beyond capacity"."""

from __future__ import annotations

import heapq
import math
import random
import statistics
from collections import OrderedDict, deque
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


class StableRank(Policy):
    """Keep the keys of lowest stable rank (``xxh3_64(key) / 2**64``) that are still in use.

    An entry is *stale* once not looked up for :attr:`live_factor` x its last reuse
    distance (bytes looked up between its last two lookups; never looked up again: x the
    node's *demand*, the median reuse distance of a bottom-k sample of keys, as SHARDS
    samples).  Stale entries go first (stalest first), then the highest rank.  A missed
    key is admitted into room (free or stale) or if a held entry ranks higher.

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
        super().__init__(capacity)
        self.seed, self.live, self.slack, self.sample_size, self.window = seed, live, slack, sample, window
        self._reuses: deque[float] = deque(maxlen=window)
        self.gate, self.min_live, self.quantile, self.learn = gate, min_live, quantile, learn
        #: learnt ``quantile`` of the relative change of reuse distances
        self.jitter = jitter
        #: median sampled reuse distance in bytes (None: none seen yet)
        self.demand: float | None = None
        #: key -> [size, rank, last lookup, stale from, last reuse distance] (clocks;
        #: the last two None until looked up again)
        self._entries: dict[str, list] = {}
        self._by_rank: list[tuple[float, str]] = []  # heap of (-rank, key), lazy
        self._fresh: list[tuple[float, str]] = []  # heap of (inserted, key), never looked up since, lazy
        self._due: list[tuple[float, str]] = []  # heap of (stale from, key), looked up since, lazy
        #: bottom-k sample: hash -> [rank, clock of the last lookup]
        self._sample: dict[int, list] = {}
        self._sample_heap: list[tuple[float, int]] = []  # (-rank, hash), lazy
        self._sampled = 0
        #: Bytes of other processes' lookups not saved yet: staleness must exceed it
        #: (0 with one process, as in the simulator; not persisted).
        self.grace = 0.0

    def params(self):
        return {"seed": self.seed, "live": self.live, "slack": self.slack, "sample": self.sample_size,
                "window": self.window, "gate": self.gate, "min_live": self.min_live,
                "quantile": self.quantile, "learn": self.learn}  # fmt: skip

    def __contains__(self, key):
        return key in self._entries

    def __len__(self):
        return len(self._entries)

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

    def _observe(self, h: int, r: float) -> None:
        s = self._sample.get(h)
        if s is not None:
            d = self.clock - s[1]
            s[1] = self.clock
            self._reuses.append(d)
            if len(self._reuses) >= MIN_REUSES:
                self.demand = statistics.median(self._reuses)
            return
        heap = self._sample_heap
        while heap and heap[0][1] not in self._sample:
            heapq.heappop(heap)
        if len(self._sample) >= self.sample_size:
            if not heap or r >= -heap[0][0]:
                return
            del self._sample[heapq.heappop(heap)[1]]
        self._sample[h] = [r, self.clock]
        heapq.heappush(heap, (-r, h))
        self._sampled += 1
        if len(heap) > 2 * len(self._sample) + 64:
            # keys forgotten from the sample stay in the lazy heap below its top: rebuild
            self._sample_heap = [(-v[0], k) for k, v in self._sample.items()]
            heapq.heapify(self._sample_heap)
        if self._sampled >= self.sample_size and self.demand:
            # forget keys idle for 4 reuse distances, so the sample follows a new workload
            self._sampled = 0
            cut = self.clock - 4 * self.demand
            for k in [k for k, v in self._sample.items() if v[1] < cut]:
                del self._sample[k]

    def lookup(self, key, size):
        self.clock += size
        h = key_hash(key, self.seed)
        self._observe(h, h / _TWO64)
        e = self._entries.get(key)
        if e is None:
            return False
        d = self.clock - e[2]
        prev = e[4]
        if prev:
            dev = abs(d - prev) / prev
            # up by quantile, down by 1 - quantile: rests where a fraction quantile is below
            step = self.quantile if dev > self.jitter else self.quantile - 1.0
            self.jitter = min(1.0, max(0.01, self.jitter * math.exp(self.learn * step)))
        # at least the demand: a key run early this time is not due early next time
        e[2], e[3], e[4] = self.clock, self.clock + self.live_factor * max(d, self.demand or 0.0), d
        heapq.heappush(self._due, (e[3], key))
        if len(self._due) > 4 * len(self._entries) + 64:
            self._due = [(v[3], k) for k, v in self._entries.items() if v[3] is not None]
            heapq.heapify(self._due)
        return True

    @staticmethod
    def _top(heap, valid):
        while heap:
            item = heap[0]
            if valid(item):
                return item
            heapq.heappop(heap)
        return None

    def _stalest(self) -> tuple[float, str] | None:
        """``(how long stale, key)`` of the entry stale longest, or None if none is."""
        ent = self._entries
        best = None
        due = self._top(self._due, lambda it: it[1] in ent and ent[it[1]][3] == it[0])
        if due is not None and due[0] + self.grace < self.clock:
            best = (self.clock - due[0], due[1])
        if self.demand:
            fresh = self._top(self._fresh, lambda it: it[1] in ent and ent[it[1]][3] is None
                              and ent[it[1]][2] == it[0])  # fmt: skip
            if fresh is not None:
                over = self.clock - self.live_factor * self.demand - fresh[0] - self.grace
                if over > 0 and (best is None or over > best[0]):
                    best = (over, fresh[1])
        return best

    def _highest(self):
        ent = self._entries
        return self._top(self._by_rank, lambda it: it[1] in ent)

    def admit(self, key, size):
        if key in self._entries or size > self.capacity:
            return False
        r = rank(key, self.seed)
        gated = r < self.theta or self.gate == "none"
        if self.gate == "all" and not gated:
            return False
        if self.used + size <= self.capacity or self._stalest() is not None:
            return True
        top = self._highest()
        return gated and top is not None and r < -top[0]

    def victims(self, size, key=None):
        out = []
        while self._entries and self.used + size > self.capacity:
            stale = self._stalest()
            k = stale[1] if stale is not None else self._highest()[1]
            self.remove(k)
            out.append(k)
        return out

    def _insert(self, key, size, used=None, due=None, dist=None):
        r = rank(key, self.seed)
        t = self.clock if used is None else used
        self._entries[key] = [size, r, t, due, dist]
        self.used += size
        heapq.heappush(self._by_rank, (-r, key))
        if due is None:
            heapq.heappush(self._fresh, (t, key))
        else:
            heapq.heappush(self._due, (due, key))
        if len(self._by_rank) + len(self._fresh) > 8 * len(self._entries) + 128:
            # drop the lazy heaps' dead items (bounded memory)
            ent = self._entries
            self._by_rank = [(-v[1], k) for k, v in ent.items()]
            self._fresh = [(v[2], k) for k, v in ent.items() if v[3] is None]
            heapq.heapify(self._by_rank)
            heapq.heapify(self._fresh)

    def remove(self, key):
        e = self._entries.pop(key, None)
        if e is not None:
            self.used -= e[0]

    def state(self):
        st = super().state()
        st["demand"] = self.demand
        st["reuses"] = list(self._reuses)
        st["jitter"] = self.jitter
        st["sample"] = sorted([h, v[0], v[1]] for h, v in self._sample.items())
        st["sampled"] = self._sampled
        return st

    def meta(self, key: str) -> list | None:
        """``[last lookup, stale from, last reuse distance]`` of ``key`` (what :meth:`entries`
        gives after key and size), or None if not held."""
        e = self._entries.get(key)
        return None if e is None else list(e[2:])

    def entries(self):
        """``[key, size, last lookup, stale from, last reuse distance]`` per entry (the last two
        None if never looked up since inserted), by last lookup."""
        return [[k, v[0], *v[2:]] for k, v in sorted(self._entries.items(), key=lambda kv: kv[1][2])]

    def _restore(self, state, entries):
        self.demand = state.get("demand")
        self._reuses.extend(state.get("reuses", []))
        self.jitter = state.get("jitter", 0.0)
        self._sampled = state.get("sampled", 0)
        for h, r, t in state.get("sample", []):
            self._sample[h] = [r, t]
            heapq.heappush(self._sample_heap, (-r, h))
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

    def admit(self, key, size):
        return key not in self._entries and size <= self.capacity and rank(key, self.seed) < self.theta

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
        return [[k, self._entries[k][0], *self._entries[k][2:]] for k in self._order]


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
