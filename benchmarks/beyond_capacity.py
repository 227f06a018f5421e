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
directory, so W cache nodes (:class:`benchmarks._clusters.ModeCluster`, mode
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
own-node ``hit_rate`` = (hits - peer_hits) / (hits + misses), ``served_share`` = ``chunk_bytes_hit /
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

# the harness first: it sets the environment the workers inherit before coffea is imported
from benchmarks._runs import Config as ModeConfig  # noqa: E402
from benchmarks._runs import analysis_branches, digest, normalized  # noqa: E402
from benchmarks._runs import reference as reference_run  # noqa: E402

from benchmarks._beyond_capacity_figures import (  # noqa: E402
    ADMISSION_KEY,
    MODES,
    NAME,
    percent,
    progress_line,
    served_share,
    command,
    evaluate_targets,
    plot,
    summarize,
    table_rows,
    title,
)
from benchmarks._clusters import ModeCluster  # noqa: E402
from benchmarks._common import print_table, print_targets, save_png, write_json  # noqa: E402
from benchmarks._storage import Storage  # noqa: E402

__all__ = [
    "MODES",
    "Config",
    "admission_supported",
    "prepare_data",
    "run_benchmark",
]

DEFAULT_DATA = ROOT / ".bench-data" / NAME
DEFAULT_OUT = ROOT / "benchmarks" / "results"
#: cache counters (:func:`cacheaffinity.cache_totals`) recorded per run as differences
CACHE_COUNTERS = ("hits", "misses", "bytes_written", "writes", "packs_written", "evictions", "bytes_evicted",
                  "dropped", "skipped", "storage_bytes", "storage_opens", "peer_hits", "peer_bytes")  # fmt: skip
#: figures of :func:`cacheaffinity.run_stats` recorded per run
RUN_STATS = ("tasks", "chunks", "hits", "peer_hits", "misses", "bytes_served", "peer_bytes", "storage_bytes",
             "storage_opens", "steals", "uncached_chunks", "chunk_bytes", "chunk_bytes_hit")  # fmt: skip
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
    #: kinematics NanoEvents needs, :func:`benchmarks._runs.analysis_branches`;
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
    #: facility node shape, :func:`benchmarks._clusters.node_cluster`)
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
    analysis's own (:func:`benchmarks._runs.analysis_branches`); None: all."""
    if cfg.branches:
        return tuple(cfg.branches)
    if cfg.all_branches:
        return None
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


def _cr_config(cfg: Config) -> ModeConfig:
    """The :class:`benchmarks._runs.Config` its :class:`~benchmarks._clusters.ModeCluster` reads."""
    return ModeConfig(
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
    """A started :class:`~benchmarks._clusters.ModeCluster` (mode ``cacheaffinity``)
    whose nodes have ``capacity`` and, if not None, ``admission``."""
    c = ModeCluster("cacheaffinity", _cr_config(cfg), storage, workdir, tag=tag)
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


def run_once(c, ref_digest: str | None, all_hits_served: int | None = None) -> dict:
    """The cluster's next run, with the figures of this benchmark (see the module's doc);
    ``all_hits_served``: ``bytes_served`` of a run that hits every chunk (the calibration's
    run 2), for ``served_share``."""
    import cacheaffinity

    t0 = cacheaffinity.cache_totals(c.client)
    cpu0 = _workers_cpu_s(c.client)
    row = c.run()
    cpu1 = _workers_cpu_s(c.client)
    t1 = cacheaffinity.cache_totals(c.client)
    stats = (cacheaffinity.run_stats(c.client, last=1) or [{}])[-1] or {}
    d = {k: t1.get(k, 0) - t0.get(k, 0) for k in CACHE_COUNTERS}
    hits, misses = stats.get("hits"), stats.get("misses")
    lookups = (hits or 0) + (misses or 0)
    result = digest(normalized(row.pop("summary")))
    forecast = stats.get("forecast")
    return {
        "run": row["run"],
        "wall_s": row["wall_s"],
        # CPU seconds of the workers (sum; on a busy machine a steadier figure than the wall)
        "workers_cpu_s": None if cpu0 is None or cpu1 is None else cpu1 - cpu0,
        "preprocess_s": row["preprocess_s"],
        # own node: the hits that packs fetched from peers answered are not its own
        "hit_rate": (hits - (stats.get("peer_hits") or 0)) / lookups if hits is not None and lookups else None,
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
        "identical": None if ref_digest is None else result == ref_digest,
        "result_digest": result,
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


# ----------------------------------------------------------------------------- phases


def reference(cfg: Config, files: list[str], log) -> dict:
    """The analysis once with coffea's ``IterativeExecutor`` in this process."""
    from benchmarks._runs import ANALYSES

    proc_cls, summary = ANALYSES[cfg.analysis]
    ref = reference_run(proc_cls, summary, {"synthetic": list(files)}, cfg.chunksize)
    log(f"[reference] IterativeExecutor: {ref['wall_s']:.1f} s ({ref['cpu_s']:.1f} s CPU)")
    return {"wall_s": ref["wall_s"], "cpu_s": ref["cpu_s"], "result_digest": digest(ref["summary"])}


def calibrate(cfg: Config, storage, workdir: Path, ref_digest: str | None, log) -> dict:
    """Run 1 on caches larger than the data (each node's bytes: its working set), run 2
    (all hits) and floor (b) on the same cluster; the node capacity of the measurement."""
    c = make_cluster(cfg, storage, workdir, "-calibration", CALIBRATION_CAPACITY, None)
    try:
        with c.running():
            run1 = run_once(c, ref_digest)
            nodes = {k: dict(v) for k, v in run1["nodes"].items()}
            log(f"[calibration] run 1: {run1['wall_s']:.2f} s; node bytes: "
                + ", ".join(f"{v['bytes'] / 1e6:.1f} MB" for v in nodes.values()))  # fmt: skip
            run2 = run_once(c, ref_digest)
            log(f"[calibration] run 2 (all hits): {run2['wall_s']:.2f} s, own-node hit rate "
                f"{percent(run2['hit_rate'])}, {(run2['bytes_served'] or 0) / 1e6:.1f} MB served")  # fmt: skip
            fill = c.floor_in_memory(fill=True)
            floors = [c.floor_in_memory() for _ in range(cfg.floor_runs)]
    finally:
        c.close()
    digests = [digest(normalized(r.pop("summary"))) for r in (fill, *floors)]
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
                log(progress_line(mode, rep, r))
    finally:
        for c in clusters.values():
            c.close()
    return {"order": order, "runs": {m: rows[m] for m in cfg.modes},
            "worker_admission": {m: c.worker_admission for m, c in clusters.items()}}  # fmt: skip


def run_benchmark(cfg: Config, log=print) -> dict:
    """Reference, calibration and the repeats; returns the results document."""
    import dask

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
        with stripes, Storage(_cr_config(cfg), files, workdir) as storage:
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


def write_results(doc: dict, cfg: Config, out: str | os.PathLike) -> tuple[str, str]:
    """``beyond_capacity.json`` and ``.png`` into ``out``; returns their paths."""
    out = Path(out)
    config = dataclasses.asdict(cfg)
    config["design"] = (__doc__ or "").split("\n\n", 1)[1].split("    python ")[0].strip()
    config["command"] = command(config)
    j, png = str(out / f"{NAME}.json"), str(out / f"{NAME}.png")
    write_json(j, config=config, results=doc)
    save_png(plot(doc, title(doc, config)), png)
    return j, png


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
