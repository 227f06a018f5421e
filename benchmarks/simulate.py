"""Discrete-event simulation of consecutive analysis runs on clusters of 10 to 1000 nodes.

What we cannot run here (100 or 1000 worker nodes, 10^5 chunks, adaptive clusters) is
simulated, with the project's *real* decision code in the loop:

- placement: :class:`cacheaffinity.placement.TorusPlacement` itself (``assign`` for
  homes, ``rankings(..., 2)`` for the runner-up node the stealing policy looks at);
- cacheaffinity's stealing: the pure functions the scheduler's ``LocalityStealing``
  calls (:func:`~cacheaffinity.scheduler._stealing.track_idle`,
  :func:`~cacheaffinity.scheduler._stealing.plan_steals`,
  :func:`~cacheaffinity.scheduler._stealing.choose_steal`) with the default settings of
  ``cacheaffinity.yaml`` (idle-time 250 ms, backlog 1, warm-backlog 2, interval 100 ms, max-moves 8);
- the locator: :func:`~cacheaffinity.scheduler._locator.follow_holders` (each chunk to
  the node that processed it last, bounded by ``locator-slack`` x the node's fair share
  by threads x learned speed) and :class:`~cacheaffinity.scheduler._locator.NodeSpeed`
  (learned seconds per task: EWMA with hysteresis), fed with each task's duration, and
  :func:`~cacheaffinity.scheduler._stealing.warm_threshold` (warm steals scaled by the
  learned speeds) with :class:`~cacheaffinity.scheduler._stealing.WarmStealCost` (what a
  stolen warm chunk took its thief, learned per thief node); the bookkeeping of ``Locator.finished`` is mirrored in ``_finish``.
  ``cacheaffinity-hashlocator`` is the earlier locator (only chunks stolen last
  run, while their hash placement is unchanged; no speeds).

Modelled, not real (documented assumptions):

- **time**: one worker per node with ``threads`` threads; a thread runs one chunk task
  at a time, in priority (submission) order; all restricted chunk tasks are sent to
  their node at once (Dask does that with restricted tasks); moves are instantaneous.
- **costs per chunk** (rates from ``benchmarks/results/*.json``, in the config): a miss
  reads the compressed bytes from *shared storage* (one FIFO server of the configured
  total bandwidth: requests are served in order, one at a time), decompresses
  (LZMA-9 uproot rate per core), writes the decompressed bytes to the node's SSD and
  computes; a hit reads the decompressed bytes from the node's SSD and computes.
  With the rate ``open_bytes`` (0 by default), a chunk read from storage also reads
  that many bytes of file metadata (coffea opens the file in every chunk task).
  Each node's SSD is a FIFO server of its own bandwidth. A slow node divides its
  decompress and compute rates.
- **peer fetch** (policy ``cacheaffinity``, ``worker.peer-fetch``): a local miss whose
  holder (the node that processed the chunk last, the locator's record) is alive and still
  caches it is read from that node's SSD and sent decompressed over the receiving node's
  link (its ``link_MBps``, else ``peer_link_MBps``, 10 Gbit/s), then stored and computed:
  no storage read, no decompression.  It counts as a local miss (``hit_rate``, as the
  real counters do) and in ``served_rate`` ((hits + peer hits) / lookups).
  ``cacheaffinity-nopeers`` is the same policy without it.  A holder serves at most
  ``peer_serve_limit`` (``worker.peer-serve-limit``, 2) fetches at once, each until its
  transfer ends (per node: the model's node is one worker process); beyond that the asker
  reads storage.  A fetch whose transfer would end more than ``peer_timeout_s``
  (``worker.peer-timeout``, 5 s) after the task started is given up then, and the asker
  reads storage (``peer_timeouts``; the real counter is ``peer_failed``).
- **caches**: per node, bounded in bytes, FIFO eviction like ``ColumnCache``
  (alternatives for comparison: ``keep`` = admit only while there is room, ``random``
  eviction, and the admission policies ``rank``, ``rank-theta``, ``rank-fifo``,
  ``s3fifo``): the classes of :mod:`cacheaffinity.worker._store.admission` themselves,
  fed with every lookup (when a chunk task ends) and offered every miss. A node's cache
  survives when the node leaves (node-local disk).
- **offline optimum** (capacity scenarios, ``<mode>+optimal``): per node, over the
  lookups it recorded, the better of Belady's MIN and Belady-Size (:func:`optimal_hits`).
- **stock Dask stealing** (policy ``paper``) is a *model* of
  ``distributed.stealing.WorkStealing.balance`` for tasks without dependencies
  (transfer cost 0): every 100 ms, idle workers (fewer processing tasks than
  threads) take tasks, in random order, from workers with more processing tasks than
  threads, most occupied first, thief = least occupied per thread, while
  ``occ_thief + d <= occ_victim - d / 2`` (``d``: mean duration of the run's finished
  tasks), ignoring caches and loose restrictions.
- **stock Dask placement** (policy ``dask``): unrestricted root tasks wait in the
  scheduler's queue and go to whichever thread frees first (queuing): no affinity.
- **hash % n** (coffea's ``worker_affinity``): ``xxh3(chunk) % n`` over the sorted
  nodes, *strict* restrictions, so never stolen; tasks of a node that leaves during a
  run are assumed to go to a random live node (real Dask leaves them in
  ``no-worker``, dask/distributed issue 7346: this is the generous assumption).
- **ring** (consistent hashing, ``round(32 * weight)`` virtual nodes) and
  **rendezvous** (weighted highest random weight, ``-w / ln(u)``) are loose
  restrictions without stealing, like ``cacheaffinity-nosteal`` with the torus.

Scenarios (``--scenario``, default all): ``stable``, ``adaptive`` (nodes leave and join
between and during runs, as ``dask-jobqueue``'s ``adapt()`` does), ``burst`` (100 nodes
join 1000 at once during run 3 of 10^6 chunks, and stay: a batch system starting a burst
of worker jobs; ``--name simulate_burst`` keeps it in a file of its own), ``small_cache``
(cache = half a node's share), ``slow_node`` (one node 3x slower), ``hetero``
(heterogeneous clusters: VISPA as in the paper, the earlier VISPA model ``vispa_nfs1g``
whose node speeds differ between run 1 and later runs, 1000 nodes of 4-32 threads with
per-core speeds 0.5-2x), ``slowdown`` (one node becomes 2x slower before run 3), and
working sets larger than the caches (cacheaffinity placement, each cache policy against
the offline optimum, bytes written per run): ``beyond_capacity`` (a node's share 1.25x,
2x and 4x its cache, 6 runs), ``workload_change`` (dataset A for 3 runs, B for 3, A
for 2; share 2x the cache) and ``two_analyses`` (two column sets of the same chunks, 1x
and 0.6x the bytes, alternating; both together 2x the cache).

    python benchmarks/simulate.py [--quick] [--scenario stable adaptive ...] [--name simulate]

Writes ``benchmarks/results/simulate.json`` (config + one section per scenario) and
``simulate_<scenario>.png``.  Sections of scenarios not run this time are kept from the
file (same ``--quick``); ``scenario_stamps`` gives the commit each section was measured on,
while the file's ``commit`` is the last run's.
"""

from __future__ import annotations

import copy
import json
import heapq
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from _common import parser, print_table, pyplot, save_png, write_json
from placement import _hash_all, _mix64  # the hash baselines' helpers (benchmarks/placement.py)

from cacheaffinity.placement import TorusPlacement
from cacheaffinity.worker._store.admission import make_policy
from cacheaffinity.scheduler._locator import NodeSpeed, follow_holders
from cacheaffinity.scheduler._stealing import (
    COLD,
    THIEF_HOLDS,
    VICTIM_HOLDS,
    choose_steal,
    plan_steals,
    WarmStealCost,
    track_idle,
    warm_threshold,
)

MB = 1e6

#: Measured rates (benchmarks/results): cache_read.json (LZMA(9): uproot 33.1 MB/s of
#: decompressed bytes per core, warm cache 3806 MB/s, compression ratio 152.7/34.9 MB,
#: 1273 decompressed bytes per event for the 60 analysis branches) and executor_runs.json
#: (fully cached run 2: 150000 events on 2 workers in 3.85 s = 19.5k events/s per core).
RATES = {
    "decompress_MBps_per_core": 33.1,
    "compression_ratio": 4.37,
    "bytes_per_event": 1273,
    "compute_events_per_s_per_core": 19500,
    "cache_read_MBps_per_core": 3806,
}

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

CLUSTERS = {
    # VISPA (paper section 2.2): 7 small workers x 8 cores (1 TB SSD, 1 Gbit/s NFS link),
    # 2 medium + 1 large x 64 cores (4 TB SSD, 4 Gbit/s NFS link).  Not in the paper
    # (assumptions): the NFS server's total bandwidth (6 striped HDDs behind a 1 TB SSD
    # cache: 1000 MB/s), the SSDs' read bandwidth (1 TB: 500 MB/s, 4 TB: 2000 MB/s) and
    # per-core speeds (equal: the paper gives none).
    "vispa": {"groups": [["small", 7, 8, {"link_MBps": 125.0, "ssd_MBps": 500.0}],
                         ["medium", 2, 64, {"link_MBps": 500.0, "ssd_MBps": 2000.0}],
                         ["large", 1, 64, {"link_MBps": 500.0, "ssd_MBps": 2000.0}]],
              "storage_MBps": 1000.0, "ssd_MBps": 500.0},
    # the previous VISPA model (one 125 MB/s NFS for all, 500 MB/s SSDs): storage-bound
    # run 1, SSD-bound 64-core nodes in run 2 (node speeds differ between runs)
    "vispa_nfs1g": {"groups": [["small", 7, 8], ["big", 3, 64]], "storage_MBps": 125.0, "ssd_MBps": 500.0},
    # 1000 heterogeneous nodes: 4-32 threads, per-core speed factors 0.5-2 (lognormal)
    "h1000": {"groups": [["a", 400, 4], ["b", 300, 8], ["c", 200, 16], ["d", 100, 32]],
              "storage_MBps": 12500.0, "ssd_MBps": 2000.0, "speed_sigma": 0.3},
    "n100": {"groups": [["node", 100, 16]], "storage_MBps": 2500.0, "ssd_MBps": 2000.0},
    "n1000": {"groups": [["node", 1000, 8]], "storage_MBps": 12500.0, "ssd_MBps": 2000.0},
}

FULL = {
    "runs": 5,
    "events_per_chunk": 100_000,
    "events_spread": 0.2,
    "duration_jitter_sigma": 0.1,
    "scenarios": {
        "stable": [["vispa", 20_000], ["n100", 50_000], ["n1000", 100_000]],
        "adaptive": [["n100", 50_000], ["n1000", 100_000]],
        # 100 workers joining during run 3 of 10^6 chunks on 1000 nodes
        "burst": [["n1000", 1_000_000]],
        "small_cache": [["vispa", 20_000]],
        "slow_node": [["vispa", 20_000]],
        "hetero": [["vispa", 20_000], ["vispa_nfs1g", 20_000], ["h1000", 100_000]],
        # [cluster, chunks, node that becomes slower]; d-0040 (32 threads, per-core time
        # factor 1.48) becomes the slowest node of h1000
        "slowdown": [["vispa", 20_000, "small-0000"], ["vispa", 20_000, "large-0000"],
                     ["h1000", 100_000, "d-0040"]],
        "beyond_capacity": [["vispa", 20_000]],
        "workload_change": [["vispa", 20_000]],
        "two_analyses": [["vispa", 20_000]],
    },
    # working sets larger than the caches (scenarios beyond_capacity, workload_change,
    # two_analyses; cacheaffinity placement): the cache policies of
    # cacheaffinity.worker._store.admission against the offline optimum
    # beyond_capacity: a node's share of the dataset / its cache
    "beyond_ratios": [1.25, 2.0, 4.0],
    "capacity_policies": ["fifo", "keep", "random", "rank", "rank-theta", "rank-fifo", "s3fifo"],
    # the default chosen from these measurements (docs/design.md, "Beyond capacity")
    "capacity_default": "rank",
    "capacity_runs": 6,
    # workload_change: the dataset of each run (other files: other chunk ids), share / cache
    "workload_sequence": "AAABBBAA",
    "workload_ratio": 2.0,
    # two_analyses: two column sets of the same chunks alternating run by run (bytes
    # factor of each); the cache holds 1 / analyses_ratio of both analyses' share
    "analyses": [["X", 1.0], ["Y", 0.6]],
    "analyses_ratio": 2.0,
    # slowdown: the case's node becomes ``slowdown_factor`` x slower before run ``slowdown_run``
    "slowdown_factor": 2.0,
    "slowdown_run": 3,
    "hetero_policies": ["paper", "cacheaffinity-nosteal", "cacheaffinity", "cacheaffinity-hashlocator"],
    "adaptive": {"pool_extra": 0.1, "between_runs": 0.05, "during_run": 0.03, "at": 0.3},
    # adaptive burst: ``nodes`` new nodes join at once during run ``run``, ``at`` x the
    # run's estimated makespan after its start (a batch system starting a burst of worker
    # jobs under adapt()), and stay for the later runs; no node leaves
    "burst": {"nodes": 100, "run": 3, "at": 0.3},
    "burst_policies": ["hash%n", "paper", "cacheaffinity-nosteal", "cacheaffinity"],
    # churn sweep (cacheaffinity only, first adaptive case): nodes replaced per run
    "adaptive_sweep": [0.01, 0.02, 0.05, 0.1],
    "small_cache_fraction": 0.5,
    "slow_factor": 3.0,
    "stealing": {"idle_time": 0.25, "backlog": 1.0, "warm_backlog": 2.0, "interval": 0.1, "max_moves": 8},
    "torus": {"dimensions": 3, "replicas": 32, "seed": 0},
    "ring_vnodes_per_weight": 32,
    "locator_slack": 1.5,
    # network bandwidth between two nodes for a peer fetch where a cluster gives no
    # link bandwidth (10 Gbit/s); otherwise the receiving node's link_MBps
    "peer_link_MBps": 1250.0,
    # peer requests a holder serves at once (cacheaffinity.worker.peer-serve-limit)
    "peer_serve_limit": 2,
    # a peer fetch not done within this many seconds is given up and storage read
    # (cacheaffinity.worker.peer-timeout); None: never
    "peer_timeout_s": 5.0,
    "seed": 1,
}

QUICK = copy.deepcopy(FULL)
QUICK["runs"] = 4
QUICK["scenarios"] = {
    "stable": [["vispa", 1500], ["n100", 3000]],
    "adaptive": [["n100", 3000]],
    "burst": [["n100", 3000]],
    "small_cache": [["vispa", 1500]],
    "slow_node": [["vispa", 1500]],
    "hetero": [["vispa", 3000], ["vispa_nfs1g", 3000], ["h1000", 20_000]],
    "slowdown": [["vispa", 3000, "small-0000"], ["vispa", 3000, "large-0000"], ["h1000", 20_000, "d-0040"]],
    "beyond_capacity": [["vispa", 1500]],
    "workload_change": [["vispa", 1500]],
    "two_analyses": [["vispa", 1500]],
}
QUICK["runs"] = 5
QUICK["burst"] = {"nodes": 10, "run": 3, "at": 0.3}


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


class Simulation:
    """Consecutive runs of one policy on one cluster; caches persist between runs."""

    def __init__(self, cfg, cluster, n_chunks, policy, *, cache_capacity=None,
                 cache_policy="fifo", slow=None, churn=None, burst=None, seed=1):  # fmt: skip
        self.cfg = cfg
        self.policy = policy
        self.placement_kind, self.stealing, self.locator = POLICIES[policy]
        self.peers = policy in PEER_POLICIES and self.locator is True
        self.peer_bw = cfg.get("peer_link_MBps", 1250.0) * MB
        self.peer_serve_limit = cfg.get("peer_serve_limit")
        self.peer_timeout = cfg.get("peer_timeout_s")
        self.rng = np.random.default_rng(seed)
        rates = cfg["rates"]
        # chunks: coffea-like ids, events per chunk varying +- spread
        self.chunk_ids = [f"file-{i // 50:05d}/Events/{(i % 50) * 100000}" for i in range(n_chunks)]
        ev_rng = np.random.default_rng(seed + 1000)
        spread = cfg["events_spread"]
        events = cfg["events_per_chunk"] * ev_rng.uniform(1 - spread, 1 + spread, n_chunks)
        self.chunk_events = events
        #: cache keys of the chunks' columns (the chunk ids unless an analysis is set)
        self.keys = self.chunk_ids
        self._set_sizes(1.0)
        self.t_compute = events / rates["compute_events_per_s_per_core"]
        self.storage_bw = cluster["storage_MBps"] * MB
        self.ssd_bw = cluster["ssd_MBps"] * MB
        # per-chunk fixed cost (task dispatch, NanoEvents form, result transfer: seconds on
        # one core), 0 unless the config gives it
        self.t_overhead = float(rates.get("chunk_overhead_s", 0.0))
        # per-chunk cost of reading from storage beyond decompression (opening the file
        # over the network, reading its metadata): on the miss path only
        self.t_open = float(rates.get("open_overhead_s", 0.0))
        # bytes a chunk read from storage reads beyond its columns: the file's metadata
        # (header, directory, the TTree with its branches' basket tables), which coffea
        # reads again in every chunk task it opens the file in; 0 unless the config gives it
        self.b_open = float(rates.get("open_bytes", 0.0))
        #: cores the nodes' threads share (a cluster in a box on one machine); None: a core
        #: per thread
        self.cpu_cores = cluster.get("cpu_cores")
        # nodes (a pool; churn may add machines that start inactive)
        self.nodes: dict[str, Node] = {}
        sp_rng = np.random.default_rng(seed + 2000)
        sigma = cluster.get("speed_sigma", 0.0)
        for prefix, count, threads, *opt in cluster["groups"]:
            o = opt[0] if opt else {}
            for i in range(count):
                name = f"{prefix}-{i:04d}"
                slow_f = float(np.clip(sp_rng.lognormal(0.0, sigma), 0.5, 2.0)) if sigma else 1.0
                self.nodes[name] = Node(name, threads, slow_f, o.get("ssd_MBps", cluster["ssd_MBps"]) * MB,
                                        o["link_MBps"] * MB if "link_MBps" in o else None)  # fmt: skip
        initial = list(self.nodes)
        self.churn = churn
        if churn:
            extra = round(churn["pool_extra"] * len(initial))
            prefix, _, threads = cluster["groups"][-1][:3]
            for i in range(extra):
                name = f"{prefix}-x{i:04d}"
                self.nodes[name] = Node(name, threads, 1.0, self.ssd_bw)
        #: adaptive burst (``FULL["burst"]``): pool nodes that join at once during a run
        self.burst = burst
        if burst:
            prefix, _, threads = cluster["groups"][-1][:3]
            for i in range(burst["nodes"]):
                name = f"{prefix}-b{i:04d}"
                self.nodes[name] = Node(name, threads, 1.0, self.ssd_bw)
        for n in initial:
            self.nodes[n].alive = True
        if slow:
            self.nodes[slow[0]].slow = slow[1]
        #: coffea without a column cache (``direct``): every chunk reads and decompresses
        self.no_cache = cache_capacity == 0
        self.caches = {n: NodeCache(cache_capacity, cache_policy, seed=seed) for n in self.nodes}
        self.placement = make_placement(self.placement_kind, cfg)
        self.located: dict[int, tuple[str, str]] = {}
        #: learned seconds per task of each node (Locator.speed)
        self.speed = NodeSpeed()
        self.slack = cfg.get("locator_slack", 1.5)
        self.runs: list[dict] = []
        sc = cfg["stealing"]
        self.idle_time, self.backlog = sc["idle_time"], sc["backlog"]
        self.warm_backlog = sc.get("warm_backlog", float("inf"))
        #: LocalityStealing.warm_cost: what a stolen warm chunk costs each thief
        self.warm_cost = WarmStealCost(self.warm_backlog)
        #: chunk -> thief, for chunks its victim held when stolen (until they finish)
        self.warm_stolen: dict[int, str] = {}
        #: simulated seconds of the runs before this one (the learned cost's clock)
        self.clock = 0.0
        #: chunk -> node that processed it last (CacheAffinityPlugin.holder)
        self.holder: dict[int, str] = {}
        self.interval, self.max_moves = sc["interval"], sc["max_moves"]

    # ------------------------------------------------------------ workload
    def _set_sizes(self, factor: float) -> None:
        """Bytes and times of each chunk's columns, ``factor`` x the rates' bytes per event."""
        rates = self.cfg["rates"]
        self.bd = self.chunk_events * rates["bytes_per_event"] * factor  # decompressed bytes
        self.bc = self.bd / rates["compression_ratio"]  # compressed bytes
        self.t_decomp = self.bd / (rates["decompress_MBps_per_core"] * MB)
        self.t_cache_thread = self.bd / (rates["cache_read_MBps_per_core"] * MB)

    def set_workload(self, dataset: str | None = None, analysis: str | None = None, factor: float = 1.0):
        """The next runs read ``dataset`` (other chunk ids: other files) with ``analysis``
        (other columns of the same chunks: other cache keys, ``factor`` x the bytes)."""
        n = len(self.chunk_ids)
        prefix = f"{dataset}/" if dataset else ""
        ids = [f"{prefix}file-{i // 50:05d}/Events/{(i % 50) * 100000}" for i in range(n)]
        if ids != self.chunk_ids:  # other chunks: nothing is known about them
            self.chunk_ids = ids
            self.holder.clear()
            self.located.clear()
            self._runner_up_valid = False
        self.keys = [f"{c}#{analysis}" for c in ids] if analysis else ids
        self._set_sizes(factor)

    def record(self) -> None:
        """Record every node's lookups (``NodeCache.log``) from now on, for the optimum."""
        for cache in self.caches.values():
            cache.log = []

    # ------------------------------------------------------------ helpers
    def live(self):
        return [n for n in self.nodes.values() if n.alive]

    def weights(self):
        return {n.name: float(n.threads) for n in self.live()}

    def _set_nodes(self):
        if self.placement is not None:
            self.placement.set_nodes(self.weights())
        if self.stealing == "locality":
            self._runner_up_valid = False

    def runner_up(self, c: int):
        if not self._runner_up_valid:
            self._runner_up = self.placement.runner_up(self.chunk_ids)
            self._runner_up_valid = True
        return self._runner_up[c]

    def _enqueue(self, node: Node, c: int):
        heapq.heappush(node.queue, c)
        node.qcount += 1
        self.where[c] = node.name

    def _dequeue(self, node: Node, c: int):
        """Remove queued chunk ``c`` from ``node`` (lazily: the heap entry is skipped)."""
        node.qcount -= 1
        self.where[c] = None

    def _pop(self, node: Node):
        while node.queue:
            c = heapq.heappop(node.queue)
            if self.where.get(c) == node.name and c not in self.started:
                node.qcount -= 1
                return c
        return None

    # ------------------------------------------------------------ one run
    def run(self) -> dict:
        C = len(self.chunk_ids)
        self.where: dict[int, str | None] = {}
        self.started: set[int] = set()
        self.target: dict[int, str] = {}
        self.hashed: dict[int, str] = {}
        self.stolen: set[int] = set()
        self.idle_since: dict[str, float] = {}
        run_no = len(self.runs) + 1
        if self.churn and run_no > 1:
            self._churn(self.churn["between_runs"])
        self._set_nodes()
        for n in self.nodes.values():
            n.busy, n.queue, n.qcount, n.running, n.ssd_free, n.link_free = 0, [], 0, set(), 0.0, 0.0
        self.started_at: dict[int, float] = {}
        self.storage_free = 0.0
        self.t = 0.0
        self.events: list = []
        self.seq = 0
        self.hits = self.misses = self.steals = self.lost = self.peer_hits = 0
        self.peer_timeouts = self.warm_steals = 0
        self.warm_stolen.clear()
        self.peer_served: set[int] = set()
        self.storage_bytes = 0.0
        written0 = sum(x.written for x in self.caches.values())
        # per-run jitter of decompress and compute times (lognormal): real runs vary
        self.jitter = self.rng.lognormal(0.0, self.cfg["duration_jitter_sigma"], C)
        self.done = 0
        self.dur_sum = 0.0
        self.global_queue: list[int] = []
        live = self.live()
        if self.placement_kind == "dynamic":
            self.global_queue = list(range(C - 1, -1, -1))  # pop() from the end = priority order
        else:
            homes = self.placement.assign(self.chunk_ids)
            if self.locator is True:  # Locator.relocate: follow_holders, the real function
                alive = {n.name: n.threads * self.speed.speed(n.name) for n in live}
                placed = list(homes)
                follow_holders(homes, [self.holder.get(c) for c in range(C)], alive, self.slack,
                               runner_up=self.runner_up,
                               speed={n.name: self.speed.speed(n.name) for n in live})
                for c, (h, node) in enumerate(zip(placed, homes)):
                    if h != node:
                        self.hashed[c] = h
                    self.target[c] = node
                    self._enqueue(self.nodes[node], c)
                homes = []
            for c, node in enumerate(homes):
                if self.locator:
                    loc = self.located.get(c)
                    if loc is not None and loc[1] == node and loc[0] != node and self.nodes[loc[0]].alive:
                        self.hashed[c] = node
                        node = loc[0]
                self.target[c] = node
                self._enqueue(self.nodes[node], c)
        if self.churn:
            est = self.runs[-1]["makespan_s"] if self.runs else self._estimate()
            self._push(est * self.churn["at"], "churn", None, None)
        if self.burst and run_no == self.burst["run"]:
            est = self.runs[-1]["makespan_s"] if self.runs else self._estimate()
            self._push(est * self.burst["at"], "burst", None, None)
        for n in live:
            self._dispatch(n)
        if self.stealing != "none":
            self._push(self.interval, "tick", None, None)
        while self.done < C:
            t, _, kind, name, c = heapq.heappop(self.events)
            self.t = t
            if kind == "finish":
                self._finish(self.nodes[name], c)
            elif kind == "tick":
                if self.stealing == "locality":
                    self._steal_locality()
                else:
                    self._steal_stock()
                self._push(t + self.interval, "tick", None, None)
            elif kind == "churn":
                self._churn(self.churn["during_run"], during=True)
            elif kind == "burst":
                self._join_burst()
        out = {
            "run": run_no,
            "makespan_s": self.t,
            "hit_rate": self.hits / max(1, self.hits + self.misses),
            # own node's cache + another node's (peer fetch): not decompressed
            "served_rate": (self.hits + self.peer_hits) / max(1, self.hits + self.misses),
            "peer_hits": self.peer_hits,
            "peer_timeouts": self.peer_timeouts,
            "steals": self.steals,
            # steals of chunks the victim's node held (a hit turned into a transfer)
            "warm_steals": self.warm_steals,
            "storage_GB": self.storage_bytes / 1e9,
            # bytes stored in the node caches (SSD writes)
            "written_GB": (sum(x.written for x in self.caches.values()) - written0) / 1e9,
            "nodes": len(self.live()),
            "lost_tasks": self.lost,
        }
        self.runs.append(out)
        self.clock += self.t
        return out

    def _estimate(self):
        threads = sum(n.threads for n in self.live())
        work = float(np.sum(self.t_decomp + self.t_compute))
        return max(work / threads, (float(np.sum(self.bc)) + len(self.bc) * self.b_open) / self.storage_bw)

    def _push(self, t, kind, name, c):
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, name, c))

    def _dispatch(self, node: Node):
        while node.alive and node.busy < node.threads:
            if self.placement_kind == "dynamic":
                if not self.global_queue:
                    return
                c = self.global_queue.pop()
            else:
                c = self._pop(node)
                if c is None:
                    return
                self.where[c] = None
            self._start(node, c)

    def _start(self, node: Node, c: int):
        t = self.t
        self.started.add(c)
        node.busy += 1
        node.running.add(c)
        cpu = 1.0
        if self.cpu_cores:  # the threads busy now (this one included) share the cores
            cpu = max(1.0, sum(n.busy for n in self.nodes.values() if n.alive) / self.cpu_cores)
        f = node.slow * self.jitter[c] * cpu
        self.started_at[c] = t
        h = self.holder.get(c) if self.peers else None
        key = self.keys[c]
        if key in self.caches[node.name]:
            s = max(t, node.ssd_free)
            node.ssd_free = s + self.bd[c] / node.ssd_bw
            end = max(node.ssd_free, t + self.t_cache_thread[c] * cpu) + (self.t_compute[c] + self.t_overhead) * f
        elif (h is not None and h != node.name and self.nodes[h].alive and key in self.caches[h]
              and self._may_serve(self.nodes[h])):  # fmt: skip
            # peer fetch: the holder reads it from its SSD, sends the decompressed
            # bytes over the receiver's link, the receiver stores and computes
            src = self.nodes[h]
            s = max(t, src.ssd_free)
            src.ssd_free = s + self.bd[c] / src.ssd_bw
            bw = node.link_bw or self.peer_bw
            r = max(src.ssd_free, node.link_free)
            arrived = r + self.bd[c] / bw
            if self.peer_timeout is not None and arrived - t > self.peer_timeout:
                # worker.peer-timeout: the asker gives up, its link was busy until
                # then, and it reads storage (peer_failed in the real counters)
                give_up = t + self.peer_timeout
                node.link_free = max(node.link_free, give_up)
                heapq.heappush(src.serves, give_up)
                self.peer_timeouts += 1
                end = self._from_storage(node, c, give_up, f)
            else:
                node.link_free = arrived
                w = max(node.link_free, node.ssd_free)
                node.ssd_free = w + self.bd[c] / node.ssd_bw
                end = node.ssd_free + (self.t_compute[c] + self.t_overhead) * f
                self.peer_served.add(c)
                heapq.heappush(src.serves, node.link_free)
        else:
            end = self._from_storage(node, c, t, f)
        self._push(end, "finish", node.name, c)

    def _from_storage(self, node: Node, c: int, t: float, f: float) -> float:
        """A miss read from storage from time ``t`` on: its end time."""
        nbytes = self.bc[c] + self.b_open
        if node.link_bw is None:
            s = max(t, self.storage_free)
            self.storage_free = s + nbytes / self.storage_bw
            read_end = self.storage_free
        else:  # the node's link and the shared server, each FIFO
            s = max(t, self.storage_free, node.link_free)
            self.storage_free = s + nbytes / self.storage_bw
            node.link_free = s + nbytes / node.link_bw
            read_end = max(self.storage_free, node.link_free)
        decomp_end = read_end + (self.t_decomp[c] + self.t_open) * f
        if self.no_cache:  # no column cache: nothing written
            return decomp_end + (self.t_compute[c] + self.t_overhead) * f
        w = max(decomp_end, node.ssd_free)
        node.ssd_free = w + self.bd[c] / node.ssd_bw
        return node.ssd_free + (self.t_compute[c] + self.t_overhead) * f

    def _may_serve(self, src: Node) -> bool:
        """Whether holder ``src`` takes one more peer request (``worker.peer-serve-limit``
        requests in flight at most; a busy holder answers nothing and the asker reads
        storage)."""
        lim = self.peer_serve_limit
        if lim is None:
            return True
        ends = src.serves
        while ends and ends[0] <= self.t:
            heapq.heappop(ends)
        return len(ends) < lim

    def _finish(self, node: Node, c: int):
        if c not in node.running:  # the node left while this ran: lost
            return
        node.running.discard(c)
        node.busy -= 1
        self.done += 1
        cache = self.caches[node.name]
        if cache.lookup(self.keys[c], self.bd[c]):
            self.hits += 1
        else:
            self.misses += 1
            if c in self.peer_served:
                self.peer_hits += 1
            else:
                self.storage_bytes += self.bc[c] + self.b_open
            cache.add(self.keys[c], self.bd[c])
        self.peer_served.discard(c)
        # mean task duration (Dask's prefix duration estimate) for the stock model
        self.dur_sum += self.t_compute[c]
        if self.locator:  # CacheAffinityPlugin.transition, processing -> memory
            self.holder[c] = node.name
            seconds = self.t - self.started_at[c]
            if self.warm_stolen.pop(c, None) == node.name:  # LocalityStealing.finished
                # a warm steal's seconds are the thief's links, not its speed
                self.warm_cost.observe(node.name, seconds, self.speed.smoothed.get(node.name),
                                       self.clock + self.t)  # fmt: skip
            else:
                self.speed.observe(node.name, seconds)
            meant = self.hashed.pop(c, None)
            target = self.target.get(c)
            if meant is not None:
                self.located[c] = (node.name, meant)
            elif c in self.stolen and target is not None:
                self.located[c] = (node.name, target)
            else:
                self.located.pop(c, None)
        self.stolen.discard(c)
        self._dispatch(node)

    # ------------------------------------------------------------ stealing
    def _candidates(self, victim: Node):
        name = victim.name
        where, started = self.where, self.started
        return [c for c in set(victim.queue) if where.get(c) == name and c not in started]

    def _move(self, c: int, victim: Node, thief: Node) -> bool:
        if self.where.get(c) != victim.name or c in self.started:
            return False
        self._dequeue(victim, c)
        self._enqueue(thief, c)
        self.stolen.add(c)
        self.steals += 1
        if self.locator is True and self.holder.get(c) == victim.name:
            self.warm_stolen[c] = thief.name
            self.warm_steals += 1
        self._dispatch(thief)
        return True

    def _steal_locality(self):
        """One round of LocalityStealing.balance, with the real policy functions."""
        live = self.live()
        idle = [n.name for n in live if n.processing() < n.threads]
        names = track_idle(self.idle_since, idle, self.t, self.idle_time)
        if not names:
            return
        thieves = [self.nodes[a] for a in names]
        tset = set(names)
        victims = [
            n for n in live
            if n.name not in tset and n.processing() - n.threads > self.backlog * n.threads
        ]  # fmt: skip
        if not victims:
            return
        located, holder = self.located, self.holder
        multi = len(live) > 1

        def choose(victim, thief):
            cands = self._candidates(victim)
            if not cands:
                return None
            tn, vn = thief.name, victim.name
            thief_holds = (lambda c: holder.get(c) == tn) if self.locator is True \
                else (lambda c: located.get(c, ("",))[0] == tn)  # fmt: skip

            def where(c):
                if thief_holds(c):
                    return THIEF_HOLDS
                return VICTIM_HOLDS if holder.get(c) == vn else COLD

            return choose_steal(
                cands,
                where=where,
                priority=lambda c: (c,),
                runner_up_is_thief=(lambda cs: [self.runner_up(c) == tn for c in cs])
                if multi else None,
                take_warm=victim.processing() - victim.threads > victim.threads * (
                    warm_threshold(self.warm_cost.cost(tn, self.clock + self.t), self.speed.speed(vn),
                                   self.speed.speed(tn))
                    if self.locator is True else self.warm_backlog),
            )  # fmt: skip

        plan_steals(
            thieves,
            victims,
            nthreads=lambda n: n.threads,
            queued=lambda n: n.processing() - n.threads,
            wanted=lambda n: n.threads + 1 - n.processing(),
            choose=choose,
            move=self._move,
            backlog=self.backlog,
            max_moves=self.max_moves,
        )

    def _steal_stock(self):
        """Model of Dask's WorkStealing.balance for dependency-free tasks (see module doc)."""
        live = self.live()
        thieves = {n.name: n for n in live if n.processing() < n.threads}
        if not thieves or len(thieves) == len(live):
            return
        d = self.dur_sum / self.done if self.done else float(np.mean(self.t_compute))
        victims = sorted((n for n in live if n.processing() > n.threads),
                         key=lambda n: n.processing(), reverse=True)  # fmt: skip
        for victim in victims:
            if not thieves:
                break
            cands = self._candidates(victim)
            self.rng.shuffle(cands)
            for c in cands:
                if not thieves:
                    break
                thief = min(thieves.values(), key=lambda n: (n.processing() / n.threads, n.name))
                if thief.processing() * d + d <= victim.processing() * d - d / 2:
                    self._move(c, victim, thief)
                    if thief.processing() >= thief.threads:
                        del thieves[thief.name]
                else:
                    break

    # ------------------------------------------------------------ membership
    def _churn(self, fraction: float, during: bool = False):
        """adapt(): ``fraction`` of the live nodes leave, as many pool machines join."""
        live = [n for n in self.nodes.values() if n.alive]
        idle = [n for n in self.nodes.values() if not n.alive]
        k = max(1, round(fraction * len(live)))
        k = min(k, len(idle), len(live) - 1)
        leave = self.rng.choice(len(live), size=k, replace=False)
        join = self.rng.choice(len(idle), size=k, replace=False)
        gone = [live[i] for i in sorted(leave)]
        new = [idle[i] for i in sorted(join)]
        for n in gone:
            n.alive = False
        for n in new:
            n.alive = True
        if not during:
            return
        self._rehome(gone, new)

    def _join_burst(self):
        """``burst["nodes"]`` pool machines join at once, during the run."""
        idle = [n for n in self.nodes.values() if not n.alive]
        new = idle[: self.burst["nodes"]]
        for n in new:
            n.alive = True
        self._rehome([], new)

    def _rehome(self, gone: list, new: list):
        """During a run, after ``gone`` left and ``new`` joined: pending tasks of departed
        nodes fail over (running ones are lost); queued tasks move to a joined node that is
        now their home."""
        orphans = []
        for n in gone:
            orphans += [c for c in set(n.queue) if self.where.get(c) == n.name and c not in self.started]
            for c in n.running:
                self.started.discard(c)
                orphans.append(c)
                self.lost += 1
            n.running, n.queue, n.qcount, n.busy = set(), [], 0, 0
        for c in orphans:
            self.where[c] = None
        self._set_nodes()
        live = self.live()
        if self.placement_kind == "dynamic":
            self.global_queue.extend(sorted(orphans, reverse=True))
        elif self.placement_kind == "mod":  # strict restrictions: generous model, see doc
            for c in orphans:
                self._enqueue(live[int(self.rng.integers(len(live)))], c)
        else:
            # like CacheAffinityPlugin._retarget: orphans go to their new home; queued
            # tasks whose home is a joined node move there (not started ones only)
            joined = {n.name for n in new}
            pending = sorted(set(orphans) | {
                c for n in live for c in n.queue if self.where.get(c) == n.name and c not in self.started
            })  # fmt: skip
            homes = self.placement.assign([self.chunk_ids[c] for c in pending])
            orphan_set = set(orphans)
            for c, home in zip(pending, homes):
                if c in orphan_set:
                    self.target[c] = home
                    self.hashed.pop(c, None)
                    self._enqueue(self.nodes[home], c)
                elif home in joined and self.where.get(c) != home:
                    self._dequeue(self.nodes[self.where[c]], c)
                    self.target[c] = home
                    self.hashed.pop(c, None)
                    self._enqueue(self.nodes[home], c)
        for n in live:
            self._dispatch(n)


# ====================================================================== scenarios
def run_policy(cfg, cluster_name, n_chunks, policy, **kw) -> dict:
    cluster = CLUSTERS[cluster_name]
    sim = Simulation(cfg, cluster, n_chunks, policy, seed=cfg["seed"], **kw)
    t0 = time.perf_counter()
    runs = [sim.run() for _ in range(cfg["runs"])]
    return {"runs": runs, "sim_seconds": time.perf_counter() - t0}


def simulate_shape(cluster: dict, n_chunks: int, *, runs: int, events_per_chunk: float,
                   rates: dict | None = None, policies=("cacheaffinity", "direct"),
                   events_spread: float = 0.0, seed: int = 1, **overrides) -> dict:
    """Consecutive runs of ``policies`` on one given cluster shape (not a named one), for a
    comparison with a measurement of the same shape (``benchmarks/cluster_box.py``).

    ``cluster``: as in :data:`CLUSTERS` (``groups`` of ``[prefix, count, threads, {link_MBps,
    ssd_MBps}]``, ``storage_MBps``, ``ssd_MBps``), plus optionally ``cpu_cores``: the cores
    all nodes' threads share (one machine); ``rates``: overrides of :data:`RATES` (plus
    ``chunk_overhead_s``: a fixed per-chunk cost on one core, ``open_overhead_s``: one
    more for a chunk read from storage, and ``open_bytes``: the bytes such a chunk reads
    beyond its columns, the file's metadata, over its link and from storage).  ``direct`` is Dask's
    placement without a column cache (every chunk reads and decompresses).  Other keyword
    arguments override :data:`FULL` entries (``duration_jitter_sigma``, ``stealing``, ...).
    Returns ``{policy: [run dicts]}`` (see :meth:`Simulation.run`).
    """
    cfg = copy.deepcopy(FULL)
    cfg.update(copy.deepcopy(overrides))
    cfg["rates"] = {**RATES, **(rates or {})}
    cfg["runs"], cfg["events_per_chunk"], cfg["events_spread"] = runs, events_per_chunk, events_spread
    out = {}
    for pol in policies:
        if pol == "direct":
            sim = Simulation(cfg, cluster, n_chunks, "dask", cache_capacity=0, seed=seed)
        else:
            sim = Simulation(cfg, cluster, n_chunks, pol, seed=seed)
        out[pol] = [sim.run() for _ in range(runs)]
    return out


def node_share_bytes(cfg, cluster_name, n_chunks, threads):
    cl = CLUSTERS[cluster_name]
    total_threads = sum(g[1] * g[2] for g in cl["groups"])
    total = n_chunks * cfg["events_per_chunk"] * cfg["rates"]["bytes_per_event"]
    return total * threads / total_threads


CAPACITY_SCENARIOS = ("beyond_capacity", "workload_change", "two_analyses")


def capacity_plans(name, cfg):
    """``[(case suffix, plan, share factor, share / cache)]`` of a capacity scenario: ``plan``
    is ``(dataset, analysis, bytes factor)`` per run; the share factor scales a node's share
    of one dataset to the working set the cache is sized against."""
    runs = cfg["capacity_runs"]
    if name == "beyond_capacity":
        return [(f"x{r:g}", [(None, None, 1.0)] * runs, 1.0, r) for r in cfg["beyond_ratios"]]
    if name == "workload_change":
        seq = cfg["workload_sequence"]
        return [(seq, [(d, None, 1.0) for d in seq], 1.0, cfg["workload_ratio"])]
    an = cfg["analyses"]
    plan = [(None, an[i % len(an)][0], an[i % len(an)][1]) for i in range(runs)]
    return [("+".join(a for a, _ in an), plan, sum(f for _, f in an), cfg["analyses_ratio"])]


def optimal_runs(sims_logs, bounds, runs):
    """Per-run hit rates of the offline optimum over every node's recorded lookups: per
    node the better (more hits in all) of Belady's MIN and Belady-Size (:func:`optimal_hits`)."""
    hits = np.zeros(runs)
    looked = np.zeros(runs)
    chosen = {"min": 0, "size": 0}
    for node, (log, cap) in sims_logs.items():
        b = bounds[node] + [len(log)]
        best, which = None, None
        for variant, aware in (("min", False), ("size", True)):
            h = optimal_hits(log, cap, aware)
            if best is None or sum(h) > sum(best):
                best, which = h, variant
        chosen[which] += 1
        for r in range(runs):
            hits[r] += sum(best[b[r]:b[r + 1]])
            looked[r] += b[r + 1] - b[r]
    return [{"run": r + 1, "hit_rate": float(hits[r] / max(1, looked[r]))} for r in range(runs)], chosen


def capacity_case(cfg, cluster_name, n_chunks, plan, share_factor, ratio, policies):
    """One capacity case: each cache policy under ``cacheaffinity`` placement, caches of
    ``share / ratio`` bytes per node, the runs of ``plan``, and the offline optimum over each
    policy's own recorded lookups (``<mode>+optimal``)."""
    cl = CLUSTERS[cluster_name]
    caps = {}
    for prefix, count, threads, *_ in cl["groups"]:
        caps[threads] = share_factor * node_share_bytes(cfg, cluster_name, n_chunks, threads) / ratio
    res = {}
    for cpol in policies:
        sim = Simulation(cfg, cl, n_chunks, "cacheaffinity", cache_policy=cpol, seed=cfg["seed"])
        for n in sim.nodes.values():
            sim.caches[n.name].capacity = caps[n.threads]
        sim.record()
        bounds = {n: [] for n in sim.caches}
        t0 = time.perf_counter()
        runs = []
        for dataset, analysis, factor in plan:
            sim.set_workload(dataset, analysis, factor)
            for n, c in sim.caches.items():
                bounds[n].append(len(c.log))
            runs.append(sim.run())
        mode = f"cacheaffinity ({cpol})"
        res[mode] = {"runs": runs, "sim_seconds": time.perf_counter() - t0}
        t0 = time.perf_counter()
        logs = {n: (c.log, c.capacity) for n, c in sim.caches.items() if c.log}
        opt, chosen = optimal_runs(logs, {n: bounds[n] for n in logs}, len(plan))
        res[f"{mode}+optimal"] = {"runs": opt, "nodes_by_variant": chosen,
                                  "sim_seconds": time.perf_counter() - t0}  # fmt: skip
    res["_capacity_bytes_per_thread_count"] = caps
    res["_plan"] = [list(p) for p in plan]
    res["_share_per_cache"] = ratio
    return res


def scenario(name, cfg, cases):
    out = {}
    for cluster_name, n_chunks, *extra in cases:
        key = "/".join([cluster_name, str(n_chunks), *extra])
        res = {}
        if name in ("stable", "adaptive"):
            churn = cfg["adaptive"] if name == "adaptive" else None
            for pol in POLICIES:
                res[pol] = run_policy(cfg, cluster_name, n_chunks, pol, churn=churn)
            if churn and cluster_name == cases[0][0]:
                sweep = []
                for f in cfg["adaptive_sweep"]:
                    ch = dict(churn, between_runs=f, during_run=0.6 * f, pool_extra=max(churn["pool_extra"], 2 * f))
                    r = run_policy(cfg, cluster_name, n_chunks, "cacheaffinity", churn=ch)
                    hits = [x["hit_rate"] for x in r["runs"]]
                    served = [x["served_rate"] for x in r["runs"]]
                    sweep.append({"between_runs": f, "during_run": 0.6 * f, "hit_rates": hits,
                                  "mean_hit_runs_2plus": float(np.mean(hits[1:])),
                                  "served_rates": served,
                                  "mean_served_runs_2plus": float(np.mean(served[1:]))})  # fmt: skip
                res["_churn_sweep"] = sweep
        elif name == "burst":
            for pol in cfg["burst_policies"]:
                res[pol] = run_policy(cfg, cluster_name, n_chunks, pol, burst=cfg["burst"])
            res["_burst"] = dict(cfg["burst"])
        elif name == "small_cache":
            cl = CLUSTERS[cluster_name]
            # capacity per node: fraction of its share of the dataset (by threads)
            caps = {}
            for prefix, count, threads, *_ in cl["groups"]:
                caps[threads] = cfg["small_cache_fraction"] * node_share_bytes(cfg, cluster_name, n_chunks, threads)
            cases_ = [("dask", "fifo"), ("hash%n", "fifo"), ("paper", "fifo"),
                      ("cacheaffinity", "fifo"), ("cacheaffinity", "keep"), ("cacheaffinity", "random"),
                      ("cacheaffinity", "rank")]  # fmt: skip
            for pol, cpol in cases_:
                sim = Simulation(cfg, cl, n_chunks, pol, cache_policy=cpol, seed=cfg["seed"])
                for n in sim.nodes.values():
                    sim.caches[n.name].capacity = caps[n.threads]
                t0 = time.perf_counter()
                runs = [sim.run() for _ in range(cfg["runs"])]
                res[f"{pol} ({cpol})"] = {"runs": runs, "sim_seconds": time.perf_counter() - t0}
            res["_capacity_bytes_per_thread_count"] = caps
        elif name == "slow_node":
            cl = CLUSTERS[cluster_name]
            slow_name = f"{cl['groups'][-1][0]}-0000"
            for pol in POLICIES:
                res[pol] = run_policy(cfg, cluster_name, n_chunks, pol, slow=(slow_name, cfg["slow_factor"]))
            res["_slow_node"] = slow_name
        elif name == "hetero":
            for pol in cfg["hetero_policies"]:
                res[pol] = run_policy(cfg, cluster_name, n_chunks, pol)
        elif name in CAPACITY_SCENARIOS:
            for suffix, plan, share_factor, ratio in capacity_plans(name, cfg):
                k = f"{key}/{suffix}"
                out[k] = capacity_case(cfg, cluster_name, n_chunks, plan, share_factor, ratio,
                                       cfg["capacity_policies"])  # fmt: skip
                print_case(name, k, out[k])
            continue
        elif name == "slowdown":
            cl = CLUSTERS[cluster_name]
            slow_name = extra[0] if extra else f"{cl['groups'][-1][0]}-0000"
            for pol in cfg["hetero_policies"]:
                sim = Simulation(cfg, cl, n_chunks, pol, seed=cfg["seed"])
                t0 = time.perf_counter()
                runs = []
                for r in range(1, cfg["runs"] + 1):
                    if r == cfg["slowdown_run"]:
                        sim.nodes[slow_name].slow *= cfg["slowdown_factor"]
                    runs.append(sim.run())
                res[pol] = {"runs": runs, "sim_seconds": time.perf_counter() - t0}
            res["_slow_node"] = slow_name
            res["_slowdown_before_run"] = cfg["slowdown_run"]
        out[key] = res
        print_case(name, key, res)
        if "_churn_sweep" in res:
            print_table([{"replaced per run": f"{x['between_runs']:.0%} + {x['during_run']:.1%} during",
                          "mean hit runs 2+": f"{x['mean_hit_runs_2plus']:.1%}"} for x in res["_churn_sweep"]],
                        title="cacheaffinity, churn sweep")  # fmt: skip
    return out


def print_case(name, key, res):
    rows = []
    for pol, r in res.items():
        if pol.startswith("_"):
            continue
        row = {"policy": pol}
        for x in r["runs"]:
            row[f"hit {x['run']}"] = f"{x['hit_rate']:.1%}"
        if "makespan_s" not in r["runs"][0]:  # the offline optimum: hit rates only
            rows.append(row)
            continue
        if "written_GB" in r["runs"][0] and name in CAPACITY_SCENARIOS:
            for x in r["runs"]:
                row[f"wr {x['run']} [GB]"] = round(x["written_GB"], 1)
        if any(x.get("peer_hits") for x in r["runs"]):
            for x in r["runs"]:
                row[f"served {x['run']}"] = f"{x['served_rate']:.1%}"
        for x in r["runs"]:
            row[f"T{x['run']} [s]"] = round(x["makespan_s"], 1)
        row["steals"] = sum(x["steals"] for x in r["runs"])
        row["sim [s]"] = round(r["sim_seconds"], 1)
        rows.append(row)
    print_table(rows, title=f"\n== {name}: {key}")


def plot(name, section, path):
    plt = pyplot()
    cases = list(section)
    fig, axes = plt.subplots(2, len(cases), figsize=(5.5 * len(cases), 7.5), squeeze=False)
    for j, key in enumerate(cases):
        res = section[key]
        for pol, r in res.items():
            if pol.startswith("_"):
                continue
            runs = [x["run"] for x in r["runs"]]
            style = "-" if pol.startswith("cacheaffinity") else "--"
            if pol.endswith("+optimal"):
                if pol != "cacheaffinity (fifo)+optimal":
                    continue  # one optimum per case (the policies' differ by little)
                style = ":"
            (line,) = axes[0][j].plot(runs, [100 * x["hit_rate"] for x in r["runs"]], style, marker="o", label=pol)
            if "makespan_s" in r["runs"][0]:
                axes[1][j].plot(runs, [x["makespan_s"] for x in r["runs"]], style, marker="o", label=pol,
                                color=line.get_color())  # fmt: skip
        axes[0][j].set_title(f"{name}: {key} (nodes/chunks)")
        axes[0][j].set_ylabel("cache hit rate [%]")
        axes[1][j].set_ylabel("makespan [s] (simulated)")
        axes[1][j].set_xlabel("run")
        axes[1][j].set_yscale("log")
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xticks(runs)
    axes[0][0].legend(fontsize=7)
    save_png(fig, path)


def git_stamp() -> dict:
    """``{"commit": <HEAD sha>, "dirty": <uncommitted changes>}`` of this checkout
    (None/None outside git): the code the figures were measured with."""
    import subprocess

    try:
        sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()  # fmt: skip
        st = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}
    return {"commit": sha, "dirty": bool(st.strip())}


def main(argv=None):
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--scenario", nargs="+", default=None, choices=list(FULL["scenarios"]))
    p.add_argument("--warm-backlog", type=float, default=None,
                   help="cacheaffinity.scheduler.stealing.warm-backlog (default: the yaml's 2)")
    p.add_argument("--locator-slack", type=float, default=None,
                   help="cacheaffinity.scheduler.locator-slack (default: the yaml's 1.5)")  # fmt: skip
    p.add_argument("--peer-serve-limit", type=int, default=None,
                   help="cacheaffinity.worker.peer-serve-limit (default: the yaml's 2; 0: no limit)")
    p.add_argument("--replot", action="store_true", help="redraw the PNGs from simulate.json")
    p.add_argument("--name", default="simulate",
                   help="results file name: <out>/<name>.json and <name>_<scenario>.png")  # fmt: skip
    args = p.parse_args(argv)
    if args.replot:
        with open(os.path.join(args.out, f"{args.name}.json")) as f:
            saved = json.load(f)
        for name, section in saved["results"].items():
            plot(name, section, os.path.join(args.out, f"{args.name}_{name}.png"))
        return 0
    stamp = git_stamp()  # the code the figures are measured with (before running)
    cfg = copy.deepcopy(QUICK if args.quick else FULL)
    cfg["rates"] = dict(RATES)
    cfg["clusters"] = CLUSTERS
    if args.warm_backlog is not None:
        cfg["stealing"]["warm_backlog"] = args.warm_backlog
    if args.locator_slack is not None:
        cfg["locator_slack"] = args.locator_slack
    if args.peer_serve_limit is not None:
        cfg["peer_serve_limit"] = args.peer_serve_limit or None
    cfg["policies"] = {k: {"placement": a, "stealing": b, "locator": c} for k, (a, b, c) in POLICIES.items()}
    names = args.scenario or list(cfg["scenarios"])
    results = {}
    t0 = time.perf_counter()
    for name in names:
        results[name] = scenario(name, cfg, cfg["scenarios"][name])
        plot(name, results[name], os.path.join(args.out, f"{args.name}_{name}.png"))
    seconds = time.perf_counter() - t0
    # the sections of other scenarios already in the file (same --quick) are kept, each
    # with the commit it was measured on (scenario_stamps)
    path = os.path.join(args.out, f"{args.name}.json")
    stamps = {n: dict(stamp) for n in names}
    try:
        with open(path) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        saved = None
    if saved and bool(saved.get("config", {}).get("quick")) == bool(args.quick):
        for n, section in saved.get("results", {}).items():
            if n not in results:
                results[n] = section
                stamps[n] = saved.get("scenario_stamps", {}).get(
                    n, {"commit": saved.get("commit"), "dirty": saved.get("dirty")})
    summary = summarise(results, cfg)
    write_json(path, config={**cfg, "quick": args.quick, "scenarios_run": names}, results=results,
               summary=summary, seconds=seconds, scenario_stamps=stamps, **stamp)  # fmt: skip
    for k, v in summary.items():
        print(f"{k}: {v}")
    return 0


def capacity_summary(results, cfg) -> dict:
    """Targets of the capacity scenarios, for the default cache policy (``capacity_default``):
    steady hit rate (runs 3+ of a repeated scan, mean) at least 0.9 x the optimum's, at every
    ratio; in the second run on a new dataset, at least 0.9 x the optimum's; bytes written per
    steady run at most 20% of FIFO's.  Plus every policy's steady ratio to its optimum."""
    s = {}
    if cfg is None or "capacity_default" not in cfg:
        return s
    d = cfg["capacity_default"]
    mode = f"cacheaffinity ({d})"

    def hits(res, m, runs):
        return float(np.mean([res[m]["runs"][r]["hit_rate"] for r in runs]))

    def per_policy(res, runs):
        out = {}
        for m in res:
            if m.startswith("_") or m.endswith("+optimal"):
                continue
            h, o = hits(res, m, runs), hits(res, f"{m}+optimal", runs)
            w = float(np.mean([res[m]["runs"][r]["written_GB"] for r in runs]))
            out[m] = {"hit_rate": round(h, 4), "optimal": round(o, 4), "vs_optimal": round(h / o, 3) if o else None,
                      "written_GB": round(w, 2)}  # fmt: skip
        return out

    for key, res in results.get("beyond_capacity", {}).items():
        steady = list(range(2, len(res[mode]["runs"])))
        pp = per_policy(res, steady)
        me, fifo = pp[mode], pp.get("cacheaffinity (fifo)")
        wr = me["written_GB"] / fifo["written_GB"] if fifo and fifo["written_GB"] else None
        s[f"beyond capacity ({key}): {d}, steady runs {steady[0] + 1}-{steady[-1] + 1}"] = {
            "hit_rate": me["hit_rate"], "optimal": me["optimal"], "vs_optimal": me["vs_optimal"],
            "written_vs_fifo": None if wr is None else round(wr, 4),
            "ok": bool(me["vs_optimal"] is not None and me["vs_optimal"] >= 0.9 and wr is not None and wr <= 0.2),
            "policies": pp}  # fmt: skip
    for key, res in results.get("workload_change", {}).items():
        plan = [p[0] for p in res["_plan"]]
        second = [i for i in range(1, len(plan)) if plan[i] == plan[i - 1] and (i < 2 or plan[i - 2] != plan[i])]
        second = [i for i in second if i > 2]  # after a switch (not the first dataset)
        pp = {}
        for m in res:
            if m.startswith("_") or m.endswith("+optimal"):
                continue
            pp[m] = [{"run": i + 1, "dataset": plan[i], "hit_rate": round(res[m]["runs"][i]["hit_rate"], 4),
                      "optimal": round(res[f"{m}+optimal"]["runs"][i]["hit_rate"], 4)} for i in second]  # fmt: skip
        ratios = [x["hit_rate"] / x["optimal"] if x["optimal"] else None for x in pp[mode]]
        s[f"workload change ({key}): {d}, second run on each new dataset"] = {
            "runs": pp[mode], "vs_optimal": [None if r is None else round(r, 3) for r in ratios],
            "ok": bool(ratios and all(r is not None and r >= 0.9 for r in ratios)), "policies": pp}  # fmt: skip
    for key, res in results.get("two_analyses", {}).items():
        steady = list(range(2, len(res[mode]["runs"])))
        pp = per_policy(res, steady)
        me = pp[mode]
        s[f"two analyses ({key}): {d}, runs {steady[0] + 1}-{steady[-1] + 1}"] = {
            **{k: me[k] for k in ("hit_rate", "optimal", "vs_optimal")},
            "ok": bool(me["vs_optimal"] is not None and me["vs_optimal"] >= 0.9), "policies": pp}  # fmt: skip
    return s


def summarise(results, cfg=None):
    s = capacity_summary(results, cfg)
    for key, res in results.get("hetero", {}).items():
        ca = res["cacheaffinity"]["runs"]
        best = min(res[p]["runs"][1]["makespan_s"] for p in ("paper", "cacheaffinity") if p in res)
        s[f"hetero ({key}): cacheaffinity run 2"] = {
            "hit_rate": ca[1]["hit_rate"], "target_hit_rate": 0.98 if key.startswith("h1000") else 0.97,
            "makespan_s": ca[1]["makespan_s"], "best_stealing_makespan_s": best,
            "wall_vs_best": ca[1]["makespan_s"] / best,
            "ok": bool(ca[1]["hit_rate"] >= (0.98 if key.startswith("h1000") else 0.97)
                       and ca[1]["makespan_s"] <= 1.05 * best)}  # fmt: skip
    for key, res in results.get("slowdown", {}).items():
        r0 = res["_slowdown_before_run"] - 1
        ca = res["cacheaffinity"]["runs"]
        s[f"slowdown ({key}): {res['_slow_node']} 2x slower from run {r0 + 1}, cacheaffinity"] = {
            "next_run_hit_rate": ca[r0]["hit_rate"], "run_after_hit_rate": ca[r0 + 1]["hit_rate"] if r0 + 1 < len(ca) else None,
            "ok": bool(ca[r0]["hit_rate"] >= 0.9 and r0 + 1 < len(ca) and ca[r0 + 1]["hit_rate"] >= 0.97),
            "makespans_s": [round(x["makespan_s"], 1) for x in ca],
            "paper_makespans_s": [round(x["makespan_s"], 1) for x in res["paper"]["runs"]]}  # fmt: skip
    st, ad = results.get("stable", {}), results.get("adaptive", {})
    for key in ad:
        if key in st:
            a = np.mean([x["hit_rate"] for x in ad[key]["cacheaffinity"]["runs"][1:]])
            b = np.mean([x["hit_rate"] for x in st[key]["cacheaffinity"]["runs"][1:]])
            s[f"adaptive vs stable, cacheaffinity mean hit rate runs 2+ ({key})"] = {
                "adaptive": float(a), "stable": float(b), "points_lost": float(100 * (b - a)),
                "target_points": 5, "ok": bool(100 * (b - a) <= 5)}  # fmt: skip
            sa = np.mean([x.get("served_rate", x["hit_rate"]) for x in ad[key]["cacheaffinity"]["runs"][1:]])
            sb = np.mean([x.get("served_rate", x["hit_rate"]) for x in st[key]["cacheaffinity"]["runs"][1:]])
            s[f"adaptive vs stable, cacheaffinity mean served by caches runs 2+ ({key})"] = {
                "adaptive": float(sa), "stable": float(sb), "points_lost": float(100 * (sb - sa)),
                "target_points": 5, "ok": bool(100 * (sb - sa) <= 5),
                "note": "own node's cache + peer fetch (the locator's holder, if alive)"}  # fmt: skip
            for x in ad[key].get("_churn_sweep", []):
                s[f"churn sweep ({key}): {x['between_runs']:.0%} between + {x['during_run']:.1%} during runs"] = {
                    "mean_hit_runs_2plus": x["mean_hit_runs_2plus"],
                    "points_lost_vs_stable": float(100 * (b - x["mean_hit_runs_2plus"])),
                    "served_points_lost_vs_stable": (
                        float(100 * (sb - x["mean_served_runs_2plus"]))
                        if "mean_served_runs_2plus" in x else None
                    ),
                    "ok": bool(100 * (b - x["mean_hit_runs_2plus"]) <= 5)}  # fmt: skip
    for key, res in results.get("burst", {}).items():
        b = res["_burst"]
        r = b["run"]  # runs 1..; index r-1 is the burst's run
        rows = {}
        for pol, x in res.items():
            if pol.startswith("_"):
                continue
            runs = x["runs"]
            before = runs[r - 2]
            rows[pol] = {
                "hit_rates": [round(y["hit_rate"], 4) for y in runs],
                "served_rates": [round(y["served_rate"], 4) for y in runs],
                # what the burst costs: points below the run before it, in its run and the next
                "points_lost_burst_run": round(100 * (before["hit_rate"] - runs[r - 1]["hit_rate"]), 2),
                "points_lost_next_run": (round(100 * (before["hit_rate"] - runs[r]["hit_rate"]), 2)
                                         if r < len(runs) else None),
                "makespans_s": [round(float(y["makespan_s"]), 1) for y in runs],
                "nodes": [y["nodes"] for y in runs],
            }  # fmt: skip
        s[f"burst ({key}): {b['nodes']} nodes join during run {r}"] = rows
    for key, res in st.items():
        if "paper" in res:
            s[f"gradual fill ({key})"] = {
                "paper (torus + stock stealing)": [round(x["hit_rate"], 4) for x in res["paper"]["runs"]],
                "cacheaffinity": [round(x["hit_rate"], 4) for x in res["cacheaffinity"]["runs"]],
            }
    return s


if __name__ == "__main__":
    sys.exit(main())
