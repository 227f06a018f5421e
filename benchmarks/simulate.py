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
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from _common import git_info, parser, print_table, write_json

from benchmarks._sim_model import POLICIES, optimal_hits
from benchmarks._simulate_figures import CAPACITY_SCENARIOS, plot, print_case, summarise
from benchmarks._simulation import Simulation

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


def git_stamp() -> dict:
    """``{"commit": <HEAD sha>, "dirty": <uncommitted changes>}`` of this checkout
    (None/None outside git): the code the figures were measured with
    (:func:`benchmarks._common.git_info`)."""
    info = git_info(ROOT)
    return {"commit": info["commit"], "dirty": info["dirty"]}


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


if __name__ == "__main__":
    sys.exit(main())
