"""The simulator's parts (benchmarks/simulate.py): the policies it compares, the placements
(cacheaffinity's torus and the hash baselines), a node's column cache under an admission
policy (the store's own, :func:`cacheaffinity.worker._store.admission.make_policy`), the
offline optimum of a sequence of lookups, a node."""

from __future__ import annotations


import numpy as np

from benchmarks.placement import _hash_all, _mix64  # the hash baselines' helpers (benchmarks/placement.py)
from cacheaffinity.placement import TorusPlacement
from cacheaffinity.worker._store.admission import make_policy

__all__ = ["MB", "PEER_POLICIES", "POLICIES", "Node", "NodeCache", "make_placement", "optimal_hits"]

MB = 1e6
POLICIES = {
    # name: (placement, stealing, locator)
    "dask": ("dynamic", "none", False),
    "hash%n": ("mod", "none", False),
    "ring": ("ring", "none", False),
    "rendezvous": ("rendezvous", "none", False),
    "paper": ("torus", "stock", False),
    "cacheaffinity-nosteal": ("torus", "none", False),
    "cacheaffinity": ("torus", "locality", True),
    # the earlier locator: only for chunks stolen last run whose hash
    # placement is unchanged, no damping
    "cacheaffinity-hashlocator": ("torus", "locality", "hash"),
    # cacheaffinity with worker.peer-fetch: false (misses read from storage only)
    "cacheaffinity-nopeers": ("torus", "locality", True),
}
#: Policies whose chunk tasks fetch a local miss from the node holding the chunk
#: (cacheaffinity.worker._peers): the locator's holder, if alive and caching it.
PEER_POLICIES = {"cacheaffinity"}


# ====================================================================== placements
class Torus:
    """The project's TorusPlacement (``self.p``), nothing else."""

    def __init__(self, dimensions=3, replicas=32, seed=0, **_):
        self.p = TorusPlacement(dimensions=dimensions, replicas=replicas, seed=seed)

    def set_nodes(self, weights):
        self.p.set_nodes(weights)

    def assign(self, chunks):
        return self.p.assign(chunks)

    def runner_up(self, chunks):
        return [r[1] if len(r) > 1 else None for r in self.p.rankings(chunks, 2)]


class ModN:
    """coffea ``worker_affinity``: ``xxh3(chunk) % n`` over the sorted nodes."""

    def set_nodes(self, weights):
        self.names = np.array(sorted(weights), dtype=object)

    def assign(self, chunks):
        return self.names[_hash_all(chunks) % np.uint64(len(self.names))].tolist()


class Ring:
    """Consistent-hash ring, ``round(vnodes * weight)`` positions per node, successor."""

    def __init__(self, vnodes_per_weight=32, **_):
        self.v = vnodes_per_weight

    def set_nodes(self, weights):
        names = sorted(weights)
        counts = [max(1, round(self.v * weights[n])) for n in names]
        pos = np.concatenate([_hash_all([f"{n}#{j}" for j in range(c)]) for n, c in zip(names, counts)])
        owner = np.repeat(np.arange(len(names)), counts)
        o = np.argsort(pos, kind="stable")
        self.pos, self.owner, self.names = pos[o], owner[o], np.array(names, dtype=object)

    def assign(self, chunks):
        i = np.searchsorted(self.pos, _hash_all(chunks), side="right") % len(self.pos)
        return self.names[self.owner[i]].tolist()


class Rendezvous:
    """Weighted highest random weight: ``argmax_n -w_n / ln(u(chunk, n))``."""

    def set_nodes(self, weights):
        self.names = np.array(sorted(weights), dtype=object)
        self.w = np.array([weights[n] for n in self.names], dtype=np.float64)
        self.hn = _hash_all(list(self.names), seed=1)

    def assign(self, chunks):
        hc = _hash_all(chunks)
        n = len(self.hn)
        block = max(1, 2_000_000 // n)
        out = np.empty(len(hc), dtype=np.int64)
        for s in range(0, len(hc), block):
            u = (_mix64(hc[s : s + block, None] ^ self.hn[None, :]) >> np.uint64(11)) * 2.0**-53
            u = np.maximum(u, 2.0**-53)
            out[s : s + block] = (-self.w[None, :] / np.log(u)).argmax(axis=1)
        return self.names[out].tolist()


def make_placement(kind: str, cfg: dict):
    if kind == "torus":
        return Torus(**cfg["torus"])
    if kind == "mod":
        return ModN()
    if kind == "ring":
        return Ring(cfg["ring_vnodes_per_weight"])
    if kind == "rendezvous":
        return Rendezvous()
    return None


# ====================================================================== caches
class NodeCache:
    """Byte-bounded chunk cache of one node: the policy objects of
    :mod:`cacheaffinity.worker._store.admission` (``fifo``: ColumnCache's policy, ``keep``,
    ``random``, ``rank``, ``rank-theta``, ``rank-fifo``, ``s3fifo``) decide what is
    admitted and evicted; unbounded (``capacity`` None): everything is kept.  ``log``
    (a list, if given) records every lookup ``(key, size)`` in order; ``written`` counts
    the bytes stored.  ``rng`` is ignored (``random`` draws from its own generator, seeded
    with ``seed``)."""

    def __init__(self, capacity: float | None, policy: str, rng=None, seed: int = 0):
        self.policy, self.seed = policy, seed
        self.items: dict[str, float] = {}
        self.written = 0.0
        self.log: list | None = None
        self._p = None
        self.capacity = capacity

    @property
    def capacity(self):
        return self._capacity

    @capacity.setter
    def capacity(self, value):
        self._capacity = value
        self.items.clear()
        if value is None:
            self._p = None
        else:
            params = {"seed": self.seed} if self.policy == "random" else {}
            self._p = make_policy(self.policy, value, **params)

    def __contains__(self, key):
        return key in self.items

    def lookup(self, key: str, size: float) -> bool:
        """A chunk task looked ``key`` up: whether it is held (the policy records it)."""
        if self.log is not None:
            self.log.append((key, size))
        if self._p is not None:
            self._p.lookup(key, size)
        return key in self.items

    def add(self, key: str, size: float) -> None:
        if key in self.items:
            return
        if self._p is not None:
            gone = self._p.offer(key, size)
            if gone is None:
                return
            for k in gone:
                del self.items[k]
        self.items[key] = size
        self.written += size


# ====================================================================== offline optimum
def optimal_hits(seq: list[tuple[str, float]], capacity: float, size_aware: bool) -> list[bool]:
    """Hits of the offline optimum over one node's lookups ``seq`` (``(key, size)`` in order).

    ``size_aware=False``: Belady's MIN, generalised to sizes the usual greedy way: on a miss
    the entries of farthest next use are evicted until the object fits, and the object is
    not stored (bypass) if its own next use is farther than that of one of them.
    ``size_aware=True``: Belady-Size (the offline baseline of Song et al., NSDI 2020): the
    same with the entries ranked by ``size x distance to next use``.  Neither is exactly
    optimal for variable sizes (that is NP-hard); both are feasible offline schedules.
    """
    n = len(seq)
    inf = float("inf")
    nxt = [inf] * n
    last: dict[str, int] = {}
    for i in range(n - 1, -1, -1):
        k = seq[i][0]
        nxt[i] = last.get(k, inf)
        last[k] = i
    hits = [False] * n
    slot: dict[str, int] = {}
    # at most capacity / smallest size entries are held at once
    small = min((sz for _, sz in seq), default=1.0)
    slots = int(min(n, capacity / small if small > 0 else n)) + 2
    sizes = np.zeros(slots, dtype=np.float64)
    nexts = np.full(slots, -inf)  # -inf: free slot (never chosen)
    free = list(range(len(sizes) - 1, -1, -1))
    keys_of: list = [None] * len(sizes)
    used = 0.0
    for i, (k, sz) in enumerate(seq):
        j = slot.get(k)
        if j is not None:
            hits[i] = True
            nexts[j] = nxt[i]
            continue
        if sz > capacity or nxt[i] == inf:
            continue
        mine = sz * (nxt[i] - i) if size_aware else nxt[i]
        taken = []
        ok = True
        while used + sz > capacity:
            if size_aware:
                with np.errstate(invalid="ignore"):
                    score = sizes * (nexts - i)
                score[nexts == -inf] = -inf
            else:
                score = nexts.copy()
            score[np.isinf(nexts) & (nexts > 0)] = inf
            for t, _ in taken:
                score[t] = -inf
            t = int(np.argmax(score))
            if not score[t] > mine:
                ok = False
                break
            taken.append((t, sizes[t]))
            used -= sizes[t]
        if not ok:
            used += sum(s for _, s in taken)
            continue
        for t, _ in taken:
            del slot[keys_of[t]]
            nexts[t] = -inf
            free.append(t)
        j = free.pop()
        slot[k] = j
        keys_of[j] = k
        sizes[j], nexts[j] = sz, nxt[i]
        used += sz
    return hits


# ====================================================================== cluster model
class Node:
    __slots__ = ("alive", "busy", "link_bw", "link_free", "name", "qcount", "queue", "running",
                 "serves", "slow", "ssd_bw", "ssd_free", "started_at", "threads")

    def __init__(self, name, threads, slow=1.0, ssd_bw=None, link_bw=None):
        self.name, self.threads, self.slow = name, threads, slow
        self.ssd_bw, self.link_bw = ssd_bw, link_bw
        self.link_free = 0.0
        self.serves: list[float] = []  # heap: end times of the peer fetches it serves
        self.alive = False
        self.busy = 0
        self.queue: list[int] = []  # heap of chunk indices (= priorities)
        self.qcount = 0
        self.running: set[int] = set()
        self.ssd_free = 0.0

    def processing(self):
        return self.busy + self.qcount
