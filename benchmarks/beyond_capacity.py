"""Beyond capacity: re-runs whose working set is twice the node caches, FIFO vs rank admission.

With first-in-first-out eviction, a re-run whose working set is larger than the node caches
gets almost no hits, run after run (every run evicts what the next one needs first).  The
``rank`` admission policy (:class:`cacheaffinity.worker._store.admission.StableRank`, setting
``cacheaffinity.worker.admission``) keeps the lowest-stable-rank part of a repeated scan: about
capacity / working set of it should hit from run 3 on (the simulator's figures:
``benchmarks/simulate.py``, ``simulate_capacity.json``).  This is the measurement on a real
cluster, with the realistic analysis (:class:`examples.realistic.TTbarLikeProcessor`) on
generated NanoAOD-like LZMA-9 data (:func:`testbed.synthetic.make_dataset`, basket clusters
of ``--basket-events`` entries, by default the chunksize: every chunk decompresses only its
own baskets), read from local files.

Size: what hits there can be depends on how many chunks a node has (rank keeps whole chunk
packs: about capacity / pack size of them), so the default has 64 chunks, 16 per node; a
run's time is mostly per chunk (on 2 cores, ~0.6 CPU s for a chunk that misses and ~0.35 s
for one that hits with the analysis's branches; ~2.6 s for a miss when the files hold all
~1500 NanoAOD branches, ``--all-branches``, which each miss's file open parses), so the
files hold the branches the analysis reads (and the kinematics NanoEvents needs): the whole
benchmark (3 repeats) takes 13-15 minutes on 2 cores (one repeat: 6.7 minutes, reference and
calibration included, while another benchmark ran on the machine), the dataset's generation
2 minutes more the first time.

Clusters: ``LocalCluster`` of W worker processes (1 thread each), each with its own cache
directory, so W cache nodes (:class:`benchmarks.consecutive_runs.ModeCluster`, mode
``cacheaffinity``: placement, stealing and peer fetch as the project's defaults; placement
stripes of one chunksize).  Every cluster's workers are warmed up before run 1 (the
processor on 200 events of the template), and the idle cluster's workers are frozen
(``SIGSTOP``) while the other mode runs (``--no-freeze-idle``: not).

1. **Reference**: the analysis once with coffea's ``IterativeExecutor`` in this process (same
   chunksize); every run's result must equal it exactly (:func:`examples.realistic.summary`:
   integer histograms exactly, weighted sums to 10 significant digits).
2. **Calibration**, on a cluster with caches far larger than the data (50 GiB each): run 1,
   then each node's stored bytes (``bytes`` of :func:`cacheaffinity.cache_stats`: the
   node's working set, column packs, forms and preprocessing documents); the node capacity of
   the measurement is ``--capacity-fraction`` (0.5) x the **mean** node's bytes
   (``--capacity-basis max``: the largest node's); total capacity = half the working set.
   Node identities are new in every fresh directory and so is the hash placement: the mean
   is what every cluster shares (a node's own share varies with the placement, recorded per
   run).  On the same cluster: run 2 (every chunk a hit: ``warm_all_hits_s``), then floor (b)
   of ``consecutive_runs.py`` (``coffea-in-memory``: the same pipeline with every column
   buffer in worker memory; one filling run, then ``--floor-runs`` timed ones, the fastest):
   ``floor_s``.
3. **Modes** ``fifo`` and ``rank`` (``--modes``), side by side: for each repeat
   (``--repeats``, default 3) a fresh cluster with fresh, empty cache directories per mode,
   node capacity as above, ``cacheaffinity.worker.admission`` set to the mode (with
   ``dask.config.set`` around the cluster's creation, as every other cacheaffinity worker
   setting of the benchmarks; the workers' own value is read back and recorded), runs 1..R
   (``--runs``, 5) interleaved: run k of both modes before run k+1 of either, the mode order
   alternating from one repeat to the next.  While the key is not a setting of the checked-out
   cacheaffinity (``admission_supported`` false in the JSON), it is not set and both modes
   run the store's FIFO.

Per run: ``wall_s`` (coffea's preprocessing included: run 1 pays it, later runs use the
Runner's metadata cache); from :func:`cacheaffinity.run_stats` (the run's chunk tasks) the
own-node ``hit_rate`` = hits / (hits + misses), ``served_share`` = ``chunk_bytes_hit /
chunk_bytes`` (the share of the run's chunk bytes the own node's cache served; with a
scheduler that does not report them, ``bytes_served`` / the calibration's all-hits run's: a
chunk that misses makes more lookups than one that hits, about 307 against 228 with this
analysis, so the hit rate of lookups is below the share of chunks hit, 43 % when half hit;
the forecast's ``hit_rate`` is a share of bytes), ``peer_hits``,
``storage_bytes`` and ``storage_opens`` (files opened by chunk tasks), and the ``forecast``
when the scheduler reports one (``{"hit_rate", "nodes": {node: {"need_bytes", "capacity",
"hit_rate"}}}``);
from the workers' cache counters (:func:`cacheaffinity.cache_totals`, difference around the
run) ``bytes_written`` (bytes stored into the node caches), ``writes``, ``evictions``,
``bytes_evicted``, ``dropped``; per node after the run its bytes, entries and capacity;
``identical`` (the result equals the reference).

Targets (``targets`` in the JSON, PASS / MISS printed; medians over the repeats):

- rank's own-node hit rate in runs 3-5 >= 0.45 (the lowest of the three runs' medians;
  FIFO's, expected about 0, in the note), and the same of the served share;
- rank's run 3 faster than FIFO's run 3 by at least the hits' share of decompression:
  per repeat ``gain = fifo_run3_s - rank_run3_s`` against ``expected_gain_s =
  served_share_rank_run3 x (fifo_run3_s - floor_s)``: FIFO's run 3 misses (almost)
  everything; a chunk that hits saves at most what separates a run that misses every chunk
  from one that finds every buffer in memory (floor (b)), and the served share is the share
  of chunks (bytes) that hit.  Passes when the median gain >= the median expected gain
  (beside it: ``expected_gain_lookups_s`` with the lookup hit rate, ``expected_gain_warm_s``
  with the all-hits cacheaffinity run instead of floor (b));
- results identical to the IterativeExecutor reference in every run of every mode;
- the forecast (a share of bytes) within 10 points of the measured served share in runs 2-5
  (per mode, the largest difference over runs and repeats; only where the scheduler reports
  one; the difference from the hit rate of lookups in the note).

    python benchmarks/beyond_capacity.py                  # 96k events, 64 chunks, 3 repeats
    python benchmarks/beyond_capacity.py --quick          # a smoke test (~2 min)

Prints a table and the targets, writes benchmarks/results/beyond_capacity.json and .png
(hit rate, wall time and bytes written by run, per mode).  Exits non-zero only on errors
(a result differing from the reference is one); missed targets are reported.
:func:`render` gives the markdown table of docs/benchmarks.md from the JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Only the standard library and benchmarks._common at the top: tools/render_readme.py
# imports :func:`render` without dask or coffea; the benchmark imports them when it runs.
from benchmarks._common import not_measured, print_table, pyplot, read_results, save_png, spread, write_json  # noqa: E402

__all__ = [
    "MODES",
    "Config",
    "admission_supported",
    "evaluate_targets",
    "plot",
    "prepare_data",
    "render",
    "run_benchmark",
    "summarize",
    "table_rows",
]

#: values of ``cacheaffinity.worker.admission`` compared
MODES = ("fifo", "rank")
ADMISSION_KEY = "cacheaffinity.worker.admission"
NAME = "beyond_capacity"
DEFAULT_DATA = ROOT / ".bench-data" / NAME
DEFAULT_OUT = ROOT / "benchmarks" / "results"
#: cache counters (:func:`cacheaffinity.cache_totals`) recorded per run as differences
CACHE_COUNTERS = ("hits", "misses", "bytes_written", "writes", "packs_written", "evictions", "bytes_evicted",
                  "dropped", "skipped", "storage_bytes", "storage_opens", "peer_hits", "peer_bytes")  # fmt: skip
#: figures of :func:`cacheaffinity.run_stats` recorded per run
RUN_STATS = ("tasks", "chunks", "hits", "peer_hits", "misses", "bytes_served", "peer_bytes", "storage_bytes",
             "storage_opens", "steals", "uncached_chunks", "chunk_bytes", "chunk_bytes_hit")  # fmt: skip
#: targets
HIT_RATE_TARGET = 0.45
FORECAST_POINTS = 0.10
#: the calibration cluster's node capacity: far above any working set measured here
CALIBRATION_CAPACITY = "50 GiB"
#: --quick: a smoke test of every step (~2 min on 2 cores)
QUICK = {"events": 4000, "files": 2, "chunksize": 250, "repeats": 1, "floor_runs": 1}


@dataclasses.dataclass
class Config:
    """What to run (the command-line options, see ``--help``)."""

    workers: int = 4
    runs: int = 5
    events: int = 96_000
    files: int = 4
    chunksize: int = 1_500
    #: entries per basket cluster of the generated files (None: the chunksize)
    basket_events: int | None = None
    codec: str = "lzma"
    seed: int = 11
    #: glob patterns of the branches to generate (None: the analysis's own and the
    #: kinematics NanoEvents needs, :func:`benchmarks.consecutive_runs.analysis_branches`;
    #: ``all_branches``: every NanoAOD branch)
    branches: tuple[str, ...] | None = None
    all_branches: bool = False
    modes: tuple[str, ...] = MODES
    repeats: int = 3
    #: node capacity = fraction x the calibration's mean (or largest) node bytes
    capacity_fraction: float = 0.5
    capacity_basis: str = "mean"
    #: timed floor (b) runs after the filling one (the fastest is the floor)
    floor_runs: int = 2
    freeze_idle: bool = True
    data: str = str(DEFAULT_DATA)
    workdir: str | None = None
    quick: bool = False
    progress: bool = True
    analysis: str = "realistic"
    #: worker processes per cache node sharing its directory (``workers`` nodes; the
    #: facility node shape, :mod:`benchmarks._nodes`)
    per_node: int = 1

    def check(self) -> None:
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise ValueError(f"modes={self.modes!r}: choose from {', '.join(MODES)}")
        if self.workers < 1:
            raise ValueError(f"workers={self.workers}: need >= 1")
        if self.per_node < 1:
            raise ValueError(f"per_node={self.per_node}: need >= 1")
        if self.runs < 3:
            raise ValueError(f"runs={self.runs}: need >= 3 (the targets look at run 3)")
        if self.repeats < 1:
            raise ValueError(f"repeats={self.repeats}: need >= 1")
        if not 0 < self.capacity_fraction:
            raise ValueError(f"capacity_fraction={self.capacity_fraction}: need > 0")
        if self.capacity_basis not in ("mean", "max"):
            raise ValueError(f"capacity_basis={self.capacity_basis!r}: use mean or max")
        if self.floor_runs < 1:
            raise ValueError(f"floor_runs={self.floor_runs}: need >= 1")
        if self.analysis != "realistic":
            raise ValueError(f"analysis={self.analysis!r}: only 'realistic' is measured here")

    @property
    def baskets(self) -> int:
        return self.basket_events or self.chunksize


def admission_supported() -> bool:
    """Whether the checked-out cacheaffinity has the ``cacheaffinity.worker.admission``
    setting (a packaged default); without it the key is not set (the schema refuses unknown
    worker keys) and every mode runs the store's FIFO."""
    from cacheaffinity import config

    try:
        config.default("worker.admission")
    except KeyError:
        return False
    return True


# ----------------------------------------------------------------------------- data


def generated_branches(cfg: Config) -> tuple[str, ...] | None:
    """The branch patterns to generate: ``cfg.branches``, else (unless ``all_branches``) the
    analysis's own (:func:`benchmarks.consecutive_runs.analysis_branches`); None: all."""
    if cfg.branches:
        return tuple(cfg.branches)
    if cfg.all_branches:
        return None
    from benchmarks.consecutive_runs import analysis_branches

    return analysis_branches(cfg.analysis)


def prepare_data(cfg: Config) -> list[str]:
    """The dataset's files, generated once per (events, files, basket clusters, codec, seed,
    branches) under ``cfg.data`` and reused."""
    from benchmarks._common import make_dataset

    branches = generated_branches(cfg)
    name = f"{cfg.codec}-{cfg.events}ev-{cfg.files}f-b{cfg.baskets}-seed{cfg.seed}"
    if branches:
        name += "-" + re.sub(r"[^A-Za-z0-9]+", "", "".join(branches))[:40]
    d = Path(cfg.data) / name
    stamp = d / "params.json"
    params = {"events": cfg.events, "files": cfg.files, "codec": cfg.codec, "seed": cfg.seed,
              "basket_events": cfg.baskets, "branches": list(branches) if branches else None}  # fmt: skip
    if not stamp.exists() or json.loads(stamp.read_text()) != params:
        shutil.rmtree(d, ignore_errors=True)
        t0 = time.perf_counter()
        make_dataset(
            d, events=cfg.events, files=cfg.files, codec=cfg.codec, seed=cfg.seed,
            branches=list(branches) if branches else None, basket_events=cfg.baskets,
            progress=cfg.progress,
        )  # fmt: skip
        stamp.write_text(json.dumps(params))
        print(f"generated {cfg.events} events in {cfg.files} files in {time.perf_counter() - t0:.0f} s: {d}",
              flush=True)  # fmt: skip
    return sorted(str(f) for f in d.glob("nano_*.root"))


# ----------------------------------------------------------------------------- clusters


def _cr_config(cfg: Config):
    """The :class:`benchmarks.consecutive_runs.Config` its :class:`ModeCluster` reads."""
    from benchmarks import consecutive_runs as cr

    return cr.Config(
        workers=cfg.workers, runs=cfg.runs, events=cfg.events, files=cfg.files, chunksize=cfg.chunksize,
        codec=cfg.codec, seed=cfg.seed, branches=cfg.branches, storage="local", rate=None,
        modes=("cacheaffinity",), scenarios=("stable",), membership_modes=(), data=cfg.data,
        analysis=cfg.analysis, repeats=1, floors=True, freeze_idle=cfg.freeze_idle, processes=("same",),
        progress=cfg.progress, per_node=cfg.per_node,
    )  # fmt: skip


def _worker_admission() -> Any:
    """In a worker: the admission setting it sees (None where the key does not exist)."""
    import dask

    return dask.config.get(ADMISSION_KEY, None)


def make_cluster(cfg: Config, storage, workdir: Path, tag: str, capacity: int | str,
                 admission: str | None):  # fmt: skip
    """A started :class:`~benchmarks.consecutive_runs.ModeCluster` (mode ``cacheaffinity``)
    whose nodes have ``capacity`` and, if not None, ``admission``."""
    from benchmarks import consecutive_runs as cr

    c = cr.ModeCluster("cacheaffinity", _cr_config(cfg), storage, workdir, tag=tag)
    c.settings["cacheaffinity.worker.capacity"] = capacity
    if admission is not None:
        c.settings[ADMISSION_KEY] = admission
    c.start()
    c.worker_admission = sorted({str(v) for v in c.client.run(_worker_admission).values()})
    return c


def _cpu_s() -> float:
    """In a worker: CPU seconds of this process so far (every thread, user + system)."""
    t = os.times()
    return t.user + t.system


def _workers_cpu_s(client) -> float | None:
    try:
        return sum(client.run(_cpu_s).values())
    except Exception:  # noqa: BLE001 - a figure, not worth failing the run
        return None


def _nodes(client) -> dict[str, dict]:
    """Per cache node: bytes, entries and capacity now (:func:`cacheaffinity.cache_stats`)."""
    import cacheaffinity

    return {
        node: {k: int(s.get(k) or 0) for k in ("bytes", "entries", "capacity")}
        for node, s in sorted(cacheaffinity.cache_stats(client).items())
    }


def served_share(stats: dict, all_hits_served: int | None = None) -> float | None:
    """The share of the run's chunk bytes its own node's cache served: ``chunk_bytes_hit /
    chunk_bytes`` of :func:`cacheaffinity.run_stats` (the bytes of the packs each chunk read
    from its node's cache, of all it read or stored), else (a scheduler without those
    figures) ``bytes_served`` / ``all_hits_served``."""
    total, hit = stats.get("chunk_bytes"), stats.get("chunk_bytes_hit")
    if total:
        return (hit or 0) / total
    if all_hits_served and stats.get("bytes_served") is not None:
        return stats["bytes_served"] / all_hits_served
    return None


def run_once(c, ref_digest: str | None, all_hits_served: int | None = None) -> dict:
    """The cluster's next run, with the figures of this benchmark (see the module's doc);
    ``all_hits_served``: ``bytes_served`` of a run that hits every chunk (the calibration's
    run 2), for ``served_share``."""
    import cacheaffinity

    from benchmarks import consecutive_runs as cr

    t0 = cacheaffinity.cache_totals(c.client)
    cpu0 = _workers_cpu_s(c.client)
    row = c.run()
    cpu1 = _workers_cpu_s(c.client)
    t1 = cacheaffinity.cache_totals(c.client)
    stats = (cacheaffinity.run_stats(c.client, last=1) or [{}])[-1] or {}
    d = {k: t1.get(k, 0) - t0.get(k, 0) for k in CACHE_COUNTERS}
    hits, misses = stats.get("hits"), stats.get("misses")
    lookups = (hits or 0) + (misses or 0)
    digest = cr._digest(cr.normalized(row.pop("summary")))
    forecast = stats.get("forecast")
    return {
        "run": row["run"],
        "wall_s": row["wall_s"],
        # CPU seconds of the workers (sum; on a busy machine a steadier figure than the wall)
        "workers_cpu_s": None if cpu0 is None or cpu1 is None else cpu1 - cpu0,
        "preprocess_s": row["preprocess_s"],
        "hit_rate": hits / lookups if hits is not None and lookups else None,
        "served_share": served_share(stats, all_hits_served),
        "chunk_bytes": stats.get("chunk_bytes"),
        "chunk_bytes_hit": stats.get("chunk_bytes_hit"),
        "bytes_served": stats.get("bytes_served"),
        "peer_bytes": stats.get("peer_bytes"),
        "hits": hits,
        "misses": misses,
        "peer_hits": stats.get("peer_hits"),
        "storage_bytes": stats.get("storage_bytes"),
        "storage_opens": stats.get("storage_opens"),
        "bytes_written": d["bytes_written"],
        "evictions": d["evictions"],
        "bytes_evicted": d["bytes_evicted"],
        "forecast": forecast if isinstance(forecast, dict) else None,
        "identical": None if ref_digest is None else digest == ref_digest,
        "result_digest": digest,
        # the workers' own counters (the same lookups counted per process) and coffea's
        "cache_counters": d,
        "cache_hit_rate": row["hit_rate"],
        "coffea_bytesread": row["storage_bytes"],
        "steals": row["steals"],
        "on_preferred": row["on_preferred"],
        "disk_read_bytes": row["disk_read_bytes"],
        "run_stats": {k: stats.get(k) for k in RUN_STATS},
        "nodes": _nodes(c.client),
    }


def _progress(mode: str, rep: int, r: dict) -> str:
    hit = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}"
    fc = (r.get("forecast") or {}).get("hit_rate")
    return (f"[repeat {rep + 1}] {mode:5s} run {r['run']}: {r['wall_s']:7.2f} s, own-node hits {hit}"
            + ("" if fc is None else f" (forecast {fc:.1%})")
            + f", peer hits {r['peer_hits']}, written {r['bytes_written'] / 1e6:.1f} MB, "
            f"evictions {r['evictions']}, files opened {r['storage_opens']}, "
            f"identical {r['identical']}")  # fmt: skip


# ----------------------------------------------------------------------------- phases


def reference(cfg: Config, files: list[str], log) -> dict:
    """The analysis once with coffea's ``IterativeExecutor`` in this process."""
    from coffea import processor
    from coffea.nanoevents import NanoAODSchema

    from benchmarks import consecutive_runs as cr

    proc_cls, summary = cr.ANALYSES[cfg.analysis]
    runner = processor.Runner(executor=processor.IterativeExecutor(), schema=NanoAODSchema,
                              chunksize=cfg.chunksize)  # fmt: skip
    t0, c0 = time.perf_counter(), time.process_time()
    out = runner({"synthetic": list(files)}, processor_instance=proc_cls(), treename="Events")
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    digest = cr._digest(cr.normalized(summary(out)))
    log(f"[reference] IterativeExecutor: {wall:.1f} s ({cpu:.1f} s CPU)")
    return {"wall_s": wall, "cpu_s": cpu, "result_digest": digest}


def calibrate(cfg: Config, storage, workdir: Path, ref_digest: str | None, log) -> dict:
    """Run 1 on caches larger than the data (each node's bytes: its working set), run 2
    (all hits) and floor (b) on the same cluster; the node capacity of the measurement."""
    from benchmarks import consecutive_runs as cr

    c = make_cluster(cfg, storage, workdir, "-calibration", CALIBRATION_CAPACITY, None)
    try:
        with c.running():
            run1 = run_once(c, ref_digest)
            nodes = {k: dict(v) for k, v in run1["nodes"].items()}
            log(f"[calibration] run 1: {run1['wall_s']:.2f} s; node bytes: "
                + ", ".join(f"{v['bytes'] / 1e6:.1f} MB" for v in nodes.values()))  # fmt: skip
            run2 = run_once(c, ref_digest)
            log(f"[calibration] run 2 (all hits): {run2['wall_s']:.2f} s, own-node hit rate "
                f"{_pct(run2['hit_rate'])}, {(run2['bytes_served'] or 0) / 1e6:.1f} MB served")  # fmt: skip
            fill = c.floor_in_memory(fill=True)
            floors = [c.floor_in_memory() for _ in range(cfg.floor_runs)]
    finally:
        c.close()
    digests = [cr._digest(cr.normalized(r.pop("summary"))) for r in (fill, *floors)]
    need = [v["bytes"] for v in nodes.values()]
    basis = statistics.mean(need) if cfg.capacity_basis == "mean" else max(need)
    capacity = max(int(cfg.capacity_fraction * basis), 1)
    floor_s = min(r["wall_s"] for r in floors)  # a floor: the fastest of the timed runs
    log(f"[calibration] floor (b) coffea-in-memory: {floor_s:.2f} s (fill {fill['wall_s']:.2f} s); node "
        f"capacity {capacity / 1e6:.1f} MB = {cfg.capacity_fraction:g} x the {cfg.capacity_basis} node's "
        f"{basis / 1e6:.1f} MB")  # fmt: skip
    return {
        "node_bytes": nodes,
        "need_mean_bytes": statistics.mean(need),
        "need_max_bytes": max(need),
        "need_total_bytes": sum(need),
        "capacity_basis": cfg.capacity_basis,
        "capacity_fraction": cfg.capacity_fraction,
        "capacity_bytes": capacity,
        "run1": run1,
        "warm_all_hits_s": run2["wall_s"],
        "all_hits_bytes_served": run2["bytes_served"],
        "run2": run2,
        "worker_admission": c.worker_admission,
        "floor_fill_s": fill["wall_s"],
        "floor_runs_s": [r["wall_s"] for r in floors],
        "floor_s": floor_s,
        "floor_identical": None if ref_digest is None else all(x == ref_digest for x in digests),
    }


def one_repeat(cfg: Config, storage, workdir: Path, rep: int, capacity: int, admission: bool,
               ref_digest: str | None, all_hits_served: int | None, log) -> dict:  # fmt: skip
    """Fresh clusters (fresh caches) for every mode, runs 1..R interleaved; the mode order
    alternates with ``rep``."""
    order = list(cfg.modes) if rep % 2 == 0 else list(cfg.modes)[::-1]
    clusters: dict[str, Any] = {}
    rows: dict[str, list[dict]] = {m: [] for m in order}
    try:
        t0 = time.perf_counter()
        for mode in order:
            clusters[mode] = make_cluster(cfg, storage, workdir, f"-{mode}-r{rep}", capacity,
                                          mode if admission else None)  # fmt: skip
            if cfg.freeze_idle:
                clusters[mode].freeze()
        log(f"[repeat {rep + 1}] clusters {', '.join(order)} started in {time.perf_counter() - t0:.1f} s; "
            "workers' admission: " + ", ".join(f"{m} {c.worker_admission}" for m, c in clusters.items()))
        for _ in range(cfg.runs):
            for mode in order:
                c = clusters[mode]
                with c.running():
                    r = run_once(c, ref_digest, all_hits_served)
                r["repeat"] = rep + 1
                rows[mode].append(r)
                log(_progress(mode, rep, r))
    finally:
        for c in clusters.values():
            c.close()
    return {"order": order, "runs": {m: rows[m] for m in cfg.modes},
            "worker_admission": {m: c.worker_admission for m, c in clusters.items()}}  # fmt: skip


def run_benchmark(cfg: Config, log=print) -> dict:
    """Reference, calibration and the repeats; returns the results document."""
    import dask

    from benchmarks import consecutive_runs as cr
    from benchmarks._common import dataset_stats

    cfg.check()
    started = time.perf_counter()
    load_before = list(os.getloadavg())
    supported = admission_supported()
    if not supported:
        log(f"NOTE: {ADMISSION_KEY} is not a setting of this cacheaffinity: it is not set, and "
            f"every mode ({', '.join(cfg.modes)}) runs the store's FIFO")  # fmt: skip
    files = prepare_data(cfg)
    stats = dataset_stats(files)
    ref = reference(cfg, files, log)
    workdir = Path(cfg.workdir or tempfile.mkdtemp(prefix="cacheaffinity-beyond-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stripes = dask.config.set({"cacheaffinity.client.stripe-entries": cfg.chunksize})
    repeats = []
    try:
        with stripes, cr.Storage(_cr_config(cfg), files, workdir) as storage:
            cal = calibrate(cfg, storage, workdir, ref["result_digest"], log)
            for rep in range(cfg.repeats):
                repeats.append(one_repeat(cfg, storage, workdir, rep, cal["capacity_bytes"], supported,
                                          ref["result_digest"], cal["all_hits_bytes_served"], log))  # fmt: skip
    finally:
        if cfg.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    rows = [r for rp in repeats for m in rp["runs"].values() for r in m]
    rows += [cal["run1"], cal["run2"]]
    identical = all(r["identical"] for r in rows) and bool(cal["floor_identical"])
    doc = {
        "analysis": cfg.analysis,
        "admission_key": ADMISSION_KEY,
        "admission_supported": supported,
        "dataset": stats,
        "chunks": cal["run1"]["run_stats"].get("chunks"),
        "reference": ref,
        "calibration": cal,
        "repeats": repeats,
        "identical_results": identical,
        "elapsed_s": time.perf_counter() - started,
        "load_average_before": load_before,
        "load_average_after": list(os.getloadavg()),
    }
    doc["summary"] = summarize(doc)
    doc["targets"] = evaluate_targets(doc)
    return doc


# ----------------------------------------------------------------------------- figures


def _runs(doc: dict, mode: str, i: int) -> list[dict]:
    """Run ``i`` (1-based) of ``mode`` in every repeat."""
    out = []
    for rp in doc["repeats"]:
        rows = rp["runs"].get(mode) or []
        if len(rows) >= i:
            out.append(rows[i - 1])
    return out


def summarize(doc: dict) -> dict:
    """Per mode and run, median [min, max] over the repeats of the run's figures; the
    run-3 comparison (measured and expected gain per repeat, then summarised)."""
    modes = list(doc["repeats"][0]["runs"]) if doc["repeats"] else []
    n_runs = max((len(v) for rp in doc["repeats"] for v in rp["runs"].values()), default=0)
    per: dict[str, list[dict]] = {}
    for mode in modes:
        per[mode] = []
        for i in range(1, n_runs + 1):
            rows = _runs(doc, mode, i)
            fc = [(r.get("forecast") or {}).get("hit_rate") for r in rows]
            per[mode].append({
                "run": i,
                "wall_s": spread([r["wall_s"] for r in rows]),
                "workers_cpu_s": spread([r.get("workers_cpu_s") for r in rows]),
                "hit_rate": spread([r["hit_rate"] for r in rows]),
                "served_share": spread([r.get("served_share") for r in rows]),
                "peer_hits": spread([r["peer_hits"] for r in rows]),
                "written_MB": spread([r["bytes_written"] / 1e6 for r in rows]),
                "evictions": spread([r["evictions"] for r in rows]),
                "storage_MB": spread([None if r["storage_bytes"] is None else r["storage_bytes"] / 1e6 for r in rows]),
                "storage_opens": spread([r["storage_opens"] for r in rows]),
                "forecast_hit_rate": spread(fc),
                "identical": all(r["identical"] for r in rows) if rows and all(
                    r["identical"] is not None for r in rows) else None,
            })  # fmt: skip
    cal = doc["calibration"]
    keys = ("fifo_run3_s", "rank_run3_s", "rank_run3_hit_rate", "rank_run3_served_share", "gain_s",
            "expected_gain_s", "expected_gain_lookups_s", "expected_gain_warm_s")  # fmt: skip
    gain: dict[str, list] = {k: [] for k in keys}
    for rp in doc["repeats"]:
        f, r = rp["runs"].get("fifo") or [], rp["runs"].get("rank") or []
        if len(f) < 3 or len(r) < 3:
            continue
        fs, rs = f[2]["wall_s"], r[2]["wall_s"]
        h = r[2]["hit_rate"] or 0.0
        share = r[2].get("served_share")
        share = h if share is None else share
        gain["fifo_run3_s"].append(fs)
        gain["rank_run3_s"].append(rs)
        gain["rank_run3_hit_rate"].append(h)
        gain["rank_run3_served_share"].append(share)
        gain["gain_s"].append(fs - rs)
        # the hits' share of the work a miss costs beyond a run with every buffer in memory
        gain["expected_gain_s"].append(share * (fs - cal["floor_s"]))
        gain["expected_gain_lookups_s"].append(h * (fs - cal["floor_s"]))
        gain["expected_gain_warm_s"].append(share * (fs - cal["warm_all_hits_s"]))
    return {
        "modes": per,
        "run3": {k: spread(v) for k, v in gain.items()},
        "floor_s": cal["floor_s"],
        "warm_all_hits_s": cal["warm_all_hits_s"],
        "capacity_bytes": cal["capacity_bytes"],
        "need_mean_bytes": cal["need_mean_bytes"],
    }


def evaluate_targets(doc: dict) -> dict:
    """The targets, each ``{"value", "limit", "pass", "note"}`` (pass None: not measured)."""
    s = doc["summary"]
    out: dict[str, dict] = {}
    fallback = "" if doc.get("admission_supported") else (
        f" ({ADMISSION_KEY} not a setting of this commit: both modes ran FIFO)")

    def target(name, value, limit, ok, note=""):
        out[name] = {"value": value, "limit": limit, "pass": None if value is None or ok is None else bool(ok),
                     "note": note + fallback}  # fmt: skip

    def medians(mode, key):
        runs = (s["modes"].get(mode) or [])[2:5]
        return [x[key]["median"] for x in runs]

    for key, what in (("hit_rate", "own-node hit rate (hits / lookups, run_stats)"),
                      ("served_share", "own-node served share (chunk bytes hit / chunk bytes, run_stats)")):  # fmt: skip
        rank, fifo = medians("rank", key), medians("fifo", key)
        if rank and None not in rank:
            low = min(rank)
            note = "runs 3-5 medians: " + ", ".join(f"{v:.3f}" for v in rank)
            if fifo and None not in fifo:
                note += "; FIFO's: " + ", ".join(f"{v:.3f}" for v in fifo)
            target(f"rank {what}, runs 3-5 (lowest median)", low, f">= {HIT_RATE_TARGET}",
                   low >= HIT_RATE_TARGET, note)  # fmt: skip
    g = s["run3"]
    if g["gain_s"]["median"] is not None:
        gain, exp = g["gain_s"]["median"], g["expected_gain_s"]["median"]
        note = (f"FIFO run 3 {g['fifo_run3_s']['median']:.2f} s, rank run 3 {g['rank_run3_s']['median']:.2f} s, "
                f"rank run 3 served share {g['rank_run3_served_share']['median']:.3f} (hit rate "
                f"{g['rank_run3_hit_rate']['median']:.3f}), floor (b) {s['floor_s']:.2f} s; expected gain with the "
                f"lookup hit rate {g['expected_gain_lookups_s']['median']:.2f} s, with the all-hits run "
                f"({s['warm_all_hits_s']:.2f} s) instead of floor (b) {g['expected_gain_warm_s']['median']:.2f} s")  # fmt: skip
        name = "rank run 3 faster than FIFO run 3 by >= served share x (FIFO run 3 - floor (b)) [s]"
        target(name, gain, f">= {exp:.2f}", gain >= exp if exp > 0 else None,
               note + ("" if exp > 0 else "; nothing expected (no hits, or FIFO's run 3 not slower than the floor)"))  # fmt: skip
    rows = [r for rp in doc["repeats"] for m in rp["runs"].values() for r in m]
    n_diff = sum(1 for r in rows if r["identical"] is False)
    target("results identical to IterativeExecutor (every run, mode and repeat; calibration and floors)",
           1.0 if doc["identical_results"] else 0.0, "== 1", doc["identical_results"],
           f"{n_diff} of {len(rows)} runs differ")  # fmt: skip
    for mode in s["modes"]:
        diffs: dict[str, list] = {"hit_rate": [], "served_share": []}
        for rp in doc["repeats"]:
            for r in (rp["runs"].get(mode) or [])[1:5]:
                fc = (r.get("forecast") or {}).get("hit_rate")
                for k in diffs:
                    if fc is not None and r.get(k) is not None:
                        diffs[k].append(abs(fc - r[k]))
        name = (f"{mode}: forecast within {FORECAST_POINTS * 100:.0f} points of the own-node served share "
                "(bytes), runs 2-5")  # fmt: skip
        if diffs["served_share"]:
            worst = max(diffs["served_share"])
            note = f"largest difference of {len(diffs['served_share'])} runs"
            if diffs["hit_rate"]:
                note += f"; from the hit rate of lookups: {max(diffs['hit_rate']):.3f}"
            target(name, worst, f"<= {FORECAST_POINTS}", worst <= FORECAST_POINTS + 1e-12, note)
        else:
            out[name] = {"value": None, "limit": f"<= {FORECAST_POINTS}", "pass": None,
                         "note": "no forecast reported by the scheduler"}  # fmt: skip
    return out


def table_rows(doc: dict) -> list[dict]:
    """Per mode and run: medians over the repeats (the terminal table)."""
    out = []
    for mode, runs in doc["summary"]["modes"].items():
        for x in runs:
            out.append({
                "mode": mode, "run": x["run"],
                "hit rate": _pct(x["hit_rate"]["median"]),
                "served share": _pct(x["served_share"]["median"]),
                "forecast": _pct(x["forecast_hit_rate"]["median"]),
                "wall [s]": _num(x["wall_s"]),
                "workers CPU [s]": _num(x["workers_cpu_s"]),
                "written MB": _num(x["written_MB"]),
                "evictions": x["evictions"]["median"],
                "peer hits": x["peer_hits"]["median"],
                "storage MB": x["storage_MB"]["median"],
                "files opened": x["storage_opens"]["median"],
                "identical": {True: "yes", False: "NO", None: "-"}[x["identical"]],
            })  # fmt: skip
    return out


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _num(s: dict, fmt=lambda v: f"{v:.3g}") -> str:
    if not s or s.get("median") is None:
        return "-"
    if s.get("n", 1) > 1 and s["min"] != s["max"]:
        return f"{fmt(s['median'])} [{fmt(s['min'])}, {fmt(s['max'])}]"
    return fmt(s["median"])


def plot(doc: dict, title: str = ""):
    """Three panels by run, one colour per mode (median, bars min-max over the repeats):
    own-node hit rate (solid; dashed: served share; dotted: the forecast, where reported), wall
    time, MB written into the caches."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    panels = ((("hit_rate", "-", "hit rate"), ("served_share", "--", "served share"),
               ("forecast_hit_rate", ":", "forecast")), "own-node hits [%]", 100.0), \
        ((("wall_s", "-", ""),), "wall time [s]", 1.0), ((("written_MB", "-", ""),), "MB written to the caches", 1.0)
    modes = doc["summary"]["modes"]
    for ax, (series, label, scale) in zip(axes, panels):
        for k, (mode, runs) in enumerate(modes.items()):
            for key, ls, what in series:
                pts = [(x["run"], x[key]) for x in runs if x[key]["median"] is not None]
                if not pts:
                    continue
                xs = [r + (k - 0.5) * 0.08 for r, _ in pts]
                med = [p["median"] * scale for _, p in pts]
                err = [[(p["median"] - p["min"]) * scale for _, p in pts],
                       [(p["max"] - p["median"]) * scale for _, p in pts]]  # fmt: skip
                ax.errorbar(xs, med, yerr=err, marker={"-": "o", "--": "s"}.get(ls, "x"), ls=ls, capsize=3,
                            label=f"{mode} {what}".strip(), color=f"C{k}", ms=4)  # fmt: skip
        if series[0][0] == "hit_rate":
            ax.axhline(100 * HIT_RATE_TARGET, color="grey", ls=":", lw=1)
            ax.set_ylim(-3, 103)
        if series[0][0] == "wall_s":
            cal = doc["calibration"]
            ax.axhline(cal["floor_s"], color="grey", ls=":", lw=1, label="floor (b)")
            ax.axhline(cal["warm_all_hits_s"], color="grey", ls="--", lw=1, label="all hits")
        if series[0][0] != "hit_rate":
            ax.set_ylim(bottom=0)
        ax.set_xlabel("run")
        ax.set_ylabel(label)
        ax.set_xticks(sorted({x["run"] for runs in modes.values() for x in runs}))
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def _title(doc: dict, cfg: dict) -> str:
    cap = doc["calibration"]["capacity_bytes"]
    need = doc["calibration"]["need_mean_bytes"]
    return (f"{int(doc['dataset']['events']):,} events {cfg['codec']}, {cfg['workers']} nodes, "
            f"{doc.get('chunks')} chunks; node caches {cap / 1e6:.3g} MB = {cap / need:.2f} x the mean "
            f"node's working set; median [min, max] of {cfg['repeats']} repeat(s)"
            + ("" if doc.get("admission_supported") else f"\n({ADMISSION_KEY} not available: both modes FIFO)"))


def command(cfg: dict) -> str:
    """The command line that measures with ``cfg`` (as the JSON records it)."""
    cmd = (f"python benchmarks/beyond_capacity.py --events {cfg['events']} --files {cfg['files']} "
           f"--chunksize {cfg['chunksize']} --workers {cfg['workers']} --runs {cfg['runs']} "
           f"--repeats {cfg['repeats']}")  # fmt: skip
    if cfg.get("basket_events"):
        cmd += f" --basket-events {cfg['basket_events']}"
    if cfg.get("capacity_fraction", 0.5) != 0.5 or cfg.get("capacity_basis", "mean") != "mean":
        cmd += f" --capacity-fraction {cfg['capacity_fraction']:g} --capacity-basis {cfg['capacity_basis']}"
    if cfg.get("floor_runs", 2) != 2:
        cmd += f" --floor-runs {cfg['floor_runs']}"
    if tuple(cfg.get("modes") or MODES) != MODES:
        cmd += " --modes " + " ".join(cfg["modes"])
    if cfg.get("branches"):
        cmd += " --branches " + " ".join(cfg["branches"])
    if cfg.get("all_branches"):
        cmd += " --all-branches"
    return cmd


def print_targets(targets: dict) -> None:
    print()
    for name, t in targets.items():
        v = t["value"]
        vs = "-" if v is None else f"{v:.4g}"
        verdict = {True: "PASS", False: "MISS", None: "n/a "}[t["pass"]]
        print(f"{verdict}  {name}: {vs} ({t['limit']}) {t['note']}")


def write_results(doc: dict, cfg: Config, out: str | os.PathLike) -> tuple[str, str]:
    """``beyond_capacity.json`` and ``.png`` into ``out``; returns their paths."""
    out = Path(out)
    config = dataclasses.asdict(cfg)
    config["design"] = (__doc__ or "").split("\n\n", 1)[1].split("    python ")[0].strip()
    config["command"] = command(config)
    j, png = str(out / f"{NAME}.json"), str(out / f"{NAME}.png")
    write_json(j, config=config, results=doc)
    save_png(plot(doc, _title(doc, config)), png)
    return j, png


# ----------------------------------------------------------------------------- docs


def render(results: str, name: str = NAME) -> str:
    """Markdown for docs/benchmarks.md from ``<results>/<name>.json``: per mode and run the
    own-node hit rate, the served share (and the forecast, where reported), wall time and MB
    written into the node caches (median [min, max] over the repeats); the targets; the
    command and commit.  Hook: ``"beyond_capacity": render`` in tools/render_readme.py's
    ``RENDERERS`` (a ``<!-- table:beyond_capacity -->`` marker in docs/benchmarks.md)."""
    doc = read_results(results, name)
    if doc is None:
        return not_measured("beyond_capacity.py", name)
    r, c = doc["results"], doc["config"]
    s = r["summary"]
    forecast = any(x["forecast_hit_rate"]["median"] is not None for runs in s["modes"].values() for x in runs)
    head = ("| mode | run | own-node hit rate | served share |" + (" forecast |" if forecast else "")
            + " wall [s] | MB written |")  # fmt: skip
    rows = [head, "|" + " --- |" * (head.count("|") - 1)]

    def pct(v):
        return f"{100 * v:.1f}%"

    for mode, runs in s["modes"].items():
        for x in runs:
            cells = [f"`{mode}`", str(x["run"]), _num(x["hit_rate"], pct), _num(x["served_share"], pct)]
            if forecast:
                cells.append(_num(x["forecast_hit_rate"], pct))
            cells += [_num(x["wall_s"]), _num(x["written_MB"], lambda v: f"{v:.1f}")]
            rows.append("| " + " | ".join(cells) + " |")
    rows.append("")
    cal = r["calibration"]
    ds = r["dataset"]
    g = s["run3"]
    rows.append(
        f"{int(ds['events']):,} events ({ds['branches']} branches, LZMA-9, basket clusters of "
        f"{c.get('basket_events') or c['chunksize']} entries), {r.get('chunks')} chunks of {c['chunksize']} "
        f"entries, {c['workers']} nodes (worker processes); node caches {cal['capacity_bytes'] / 1e6:.1f} MB = "
        f"{cal['capacity_fraction']:g} x the {cal['capacity_basis']} node's working set "
        f"({cal['need_mean_bytes'] / 1e6:.1f} MB mean, {cal['need_max_bytes'] / 1e6:.1f} MB largest, from a "
        f"calibration run on large caches). Median [min, max] over {c['repeats']} repeat(s), fresh clusters and "
        f"caches each, the modes' runs interleaved. Hit rate: hits / lookups of the run's chunk tasks; served "
        f"share: the share of the run's chunk bytes its node's cache served (a missed chunk makes more lookups "
        f"than a hit one, so the hit rate is below the share of chunks hit; the forecast is a share of "
        f"bytes). All hits "
        f"{cal['warm_all_hits_s']:.2f} s; floor (b), every buffer in worker memory, {cal['floor_s']:.2f} s."
        + ("" if g["gain_s"]["median"] is None else
           f" Run 3, FIFO - rank: {_num(g['gain_s'])} s; expected from the served share x (FIFO run 3 - "
           f"floor (b)): {_num(g['expected_gain_s'])} s.")
        + ("" if r.get("admission_supported") else
           f" **`{r.get('admission_key', ADMISSION_KEY)}` was not a setting of this commit: both modes ran FIFO.**")
    )  # fmt: skip
    rows.append("")
    for t_name, t in r["targets"].items():
        verdict = {True: "met", False: "**missed**", None: "not measured"}[t["pass"]]
        v = t["value"]
        vs = "-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))
        rows.append(f"- {t_name}: {vs} (target {t['limit']}: {verdict}){'; ' + t['note'] if t['note'] else ''}")
    rows.append("")
    sha = doc.get("commit")
    commit = f"`{sha[:7]}`" if sha else "unknown commit"
    if doc.get("dirty"):
        commit += " (+ local changes)"
    date = ((doc.get("machine") or {}).get("time") or "")[:10]
    before, after = r.get("load_average_before"), r.get("load_average_after")
    load = "" if not before or not after else f", load average {before[0]:.1f} -> {after[0]:.1f}"
    rows.append(f"Measured on {commit}, {date}{load}, {r['elapsed_s'] / 60:.0f} min: "
                f"`{c.get('command') or command(c)}`.")  # fmt: skip
    return "\n".join(rows) + "\n"


# ----------------------------------------------------------------------------- main


def parse_args(argv=None) -> tuple[Config, str]:
    d = Config()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke test: " + ", ".join(f"{k} {v}" for k, v in QUICK.items())
                   + " (~2 min)")  # fmt: skip
    p.add_argument("--workers", type=int, default=d.workers,
                   help="W cache nodes (with --per-node 1, the default: W worker processes)")
    p.add_argument("--per-node", type=int, default=d.per_node,
                   help="worker processes per cache node, sharing its directory (facility node shape)")
    p.add_argument("--runs", type=int, default=d.runs)
    p.add_argument("--events", type=int, default=None, help=f"default {d.events}")
    p.add_argument("--files", type=int, default=None, help=f"default {d.files}")
    p.add_argument("--chunksize", type=int, default=None, help=f"default {d.chunksize}")
    p.add_argument("--basket-events", type=int, default=None, help="entries per basket cluster (default: the chunksize)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--branches", nargs="*", default=None,
                   help="glob patterns of branches to generate (default: the analysis's, see --all-branches)")
    p.add_argument("--all-branches", action="store_true",
                   help="generate every NanoAOD branch (~1500: each miss opens a file with all of them)")
    p.add_argument("--modes", nargs="+", default=list(d.modes), choices=MODES)
    p.add_argument("--repeats", type=int, default=None, help=f"default {d.repeats}")
    p.add_argument("--capacity-fraction", type=float, default=d.capacity_fraction,
                   help="node capacity / the calibration's node bytes")
    p.add_argument("--capacity-basis", choices=("mean", "max"), default=d.capacity_basis,
                   help="the mean node's bytes or the largest node's")
    p.add_argument("--floor-runs", type=int, default=None, help=f"timed floor (b) runs (default {d.floor_runs})")
    p.add_argument("--no-freeze-idle", action="store_true", help="keep the idle cluster's workers running")
    p.add_argument("--data", default=d.data, help="where generated datasets are kept")
    p.add_argument("--workdir", default=None, help="cache directories (default: a temporary one)")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    a = p.parse_args(argv)
    q = QUICK if a.quick else {}

    def pick(name):
        v = getattr(a, name)
        return v if v is not None else q.get(name, getattr(d, name))

    branches = tuple(a.branches) if a.branches else None
    cfg = Config(
        workers=a.workers, runs=a.runs, events=pick("events"), files=pick("files"), chunksize=pick("chunksize"),
        basket_events=a.basket_events, seed=a.seed, branches=branches, all_branches=a.all_branches,
        modes=tuple(a.modes),
        repeats=pick("repeats"), capacity_fraction=a.capacity_fraction, capacity_basis=a.capacity_basis,
        floor_runs=pick("floor_runs"), freeze_idle=not a.no_freeze_idle, data=a.data, workdir=a.workdir,
        quick=a.quick, per_node=a.per_node,
    )  # fmt: skip
    return cfg, a.out


def main(argv=None) -> int:
    cfg, out = parse_args(argv)
    cfg.check()
    # coffea's NanoAODSchema warns about every cross-reference a file lacks, in every worker
    os.environ.setdefault("PYTHONWARNINGS", "ignore::RuntimeWarning:coffea.nanoevents.schemas.nanoaod")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        dict.fromkeys(filter(None, [str(ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]))
    )
    import warnings

    warnings.filterwarnings("ignore", category=RuntimeWarning, module="coffea.nanoevents.schemas.nanoaod")
    print(f"machine: load {os.getloadavg()}, {os.cpu_count()} cpus", flush=True)
    doc = run_benchmark(cfg)
    print_table(table_rows(doc), title=f"\nbeyond capacity: median [min, max] over {cfg.repeats} repeat(s); "
                f"node caches {doc['calibration']['capacity_bytes'] / 1e6:.1f} MB, mean node working set "
                f"{doc['calibration']['need_mean_bytes'] / 1e6:.1f} MB")  # fmt: skip
    g = doc["summary"]["run3"]
    if g["gain_s"]["median"] is not None:
        print(f"\nrun 3: FIFO {g['fifo_run3_s']['median']:.2f} s, rank {g['rank_run3_s']['median']:.2f} s; gain "
              f"{g['gain_s']['median']:.2f} s, expected >= {g['expected_gain_s']['median']:.2f} s "
              f"(served share x (FIFO run 3 - floor (b) {doc['calibration']['floor_s']:.2f} s)); with the all-hits run "
              f"{doc['calibration']['warm_all_hits_s']:.2f} s: {g['expected_gain_warm_s']['median']:.2f} s")  # fmt: skip
    print_targets(doc["targets"])
    print(f"\nresults identical to IterativeExecutor: {doc['identical_results']}; elapsed "
          f"{doc['elapsed_s']:.0f} s; load {doc['load_average_before']} -> {doc['load_average_after']}")  # fmt: skip
    j, png = write_results(doc, cfg, out)
    print(f"wrote {j} and {png}")
    return 0 if doc["identical_results"] else 1


if __name__ == "__main__":
    sys.exit(main())
