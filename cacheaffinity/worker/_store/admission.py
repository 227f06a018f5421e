"""What a full node cache admits and evicts (pure: no SQLite, no disk, no dask).

The :class:`Policy` interface is called by the simulator (``benchmarks/simulate.py``) and
by the store's ``Admitter``; decisions are deterministic given the calls (ranks are
hashes, ``random`` is seeded).  The store runs ``rank`` (:class:`StableRank`); why, and
the others' figures: docs/design.md, "Beyond capacity"."""

from __future__ import annotations

import math
import random
import statistics
from collections import OrderedDict, deque
from typing import Any, ClassVar

from cacheaffinity.worker._store.rank_tables import TWO64, Head, RankEntries, RankSample, key_hash, rank

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

#: Sampled reuse distances seen before :class:`StableRank` estimates the demand.
MIN_REUSES = 5


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

    def _stalest(self, due: Head, fresh: Head, taken) -> tuple[float, str] | None:
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

    def _plan(self, size: float, below: float, used: float | None = None) -> list[str] | None:
        """The keys to evict to make room for ``size`` bytes (stale entries, stalest first,
        then the highest ranks), or None if that would take an entry that is
        not stale and does not rank above ``below`` (nothing changes; ``used``: the bytes
        held, if just read).  Each of the table's three orders is walked once, however
        many victims it takes."""
        need = (self.used if used is None else used) + size - self.capacity
        out: list[str] = []
        taken: set[str] = set()
        t = self.table
        orders = (Head(t.due_order()), Head(t.fresh_order()), Head(t.rank_order()))
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
                n = t.size(k)
                if n is None:
                    return None
                out.append(k)
                taken.add(k)
                need -= n
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
        used = self.used
        if used + size <= self.capacity:
            return []
        return self._plan(size, r if gated else math.inf, used)

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
        st["sample"] = [[h, h / TWO64, t] for h, t in self.sample.items()]
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
