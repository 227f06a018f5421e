"""Consecutive runs of one coffea analysis, six ways, over real XRootD storage (VISPA Fig. 3).

The headline result in the form of the VISPA paper's Fig. 3: R consecutive runs of one
analysis (``--analysis``: ``realistic``, :class:`examples.realistic.TTbarLikeProcessor`, a
ttbar/HH->bbWW-like selection reading ~180 branches; or ``light``,
:class:`examples.analysis.DimuonJetProcessor`, ~10 branches) on generated NanoAOD-like LZMA-9
data (:func:`testbed.synthetic.make_dataset`), and per run the wall time, the data
still read from storage and the cache hit rate.  Every mode runs on its own local cluster
of W worker processes (1 thread each) acting as W cache nodes (each its own, initially
empty, cache directory), on the same files, in one invocation:

``direct``
    coffea ``DaskExecutor``, no cache: the baseline.
``dask-default+cache``
    ``DaskExecutor`` + ``Runner(cachestrategy=cacheaffinity.cachestrategy)``, workers with
    the cacheaffinity worker plugin, a scheduler *without* the placement plugin: Dask's
    stock placement and stock stealing (a chunk finds its columns with probability ~1/W).
``coffea-affinity+cache``
    ``DaskExecutor(worker_affinity=True)`` (coffea's ``hash % n_workers``, strict
    restrictions) + the same cache strategy and worker plugin.
``coffea-native``
    what a coffea user builds without cacheaffinity (coffea >= 2026.3):
    ``DaskExecutor(worker_affinity=True)`` + ``Runner(cachestrategy=...)`` returning
    coffea's own ``coffea.nanoevents.BufferCache`` over ``zict.File`` in the worker's local
    directory, one per worker process for its lifetime (:mod:`benchmarks._native`; codec
    ``NoCompressionCodec``; ``--native-variant`` for the docstring's Blosc/zstd codec or a
    ``zict.Buffer`` memory front, measured there); no cacheaffinity code on its cluster.
    Its hit rate comes from a counting wrapper around the BufferCache.
``xcache``
    ``DaskExecutor``, no column cache, reading through an XCache proxy (XRootD
    ``libXrdPfc``, blocks on disk in a temporary directory, prefetch 0) in front of the
    origin; XCache's cache persists across the runs (run 2 skips the origin but still
    decompresses LZMA).  Only with ``--storage xrootd``.
``cacheaffinity``
    :class:`cacheaffinity.CacheAffinityExecutor` on a scheduler with the cacheaffinity
    plugin (placement, locality-preserving stealing on: the project defaults).

Storage (``--storage``): ``xrootd`` (default) serves the files from a real ``xrootd``
origin over ``root://``, read with ``handler=uproot.XRootDSource``; because ``xrootd``
binds every interface, the script re-executes itself in a private network namespace
(``unshare -n``, as root) and everything (daemons, Dask cluster) runs there.  What the
origin sends is shaped by an HTB class on ``lo`` (``--rate``, default 1gbit as on the
VISPA cluster; only the origin's port: XCache is local to the workers, the origin is the
remote storage); that class's byte counter measures the origin's traffic for every mode.
``local`` reads the files from the local directory (no XRootD needed; no ``xcache`` mode).

Scenarios:

``stable``
    every mode, R runs, W nodes throughout.
``membership`` (``--membership-modes``, default ``cacheaffinity``)
    a separate sequence of R >= 4 runs on a fresh cluster: W nodes for runs 1-2, the last
    worker (its cache node) removed before run 3 (W-1 nodes), a new worker with a new, empty
    cache directory added before run 4 (W nodes again), unchanged from then on.  The removed
    node's shares are recorded: of the bytes the node caches held before it left
    (``removed_node_bytes_share``: what a perfect cache loses) and of the chunk tasks that ran
    (``removed_node_share``).  Targets, on what the caches served (own node or peer fetch:
    1 - the run's decompressed bytes / run 1's): run 3 >= 1 - the bytes share - 2 % (only the
    removed node's chunks are read again), run 4 >= 98 % (the new node's chunks come from
    their holders).  The own-node hit rate of lookups
    is reported beside them: steals lower it (an idle node answers a warm chunk it stole from
    its holder's pack) and a chunk that misses makes more lookups than one that hits.

Floors, measured on the ``cacheaffinity`` mode's cluster in the same invocation, one of each
per warm round, interleaved with the runs (after the runs of rounds 2, 4, ..., before those of
rounds 3, 5, ...):

``coffea-in-memory`` (floor b)
    the same executor and coffea/NanoEvents pipeline (chunk tasks, NanoEvents built per
    chunk, forms from the node) with every column buffer in a dict in the worker's memory
    (``Runner(cachestrategy=benchmarks._memory.memory_buffers)``, filled by one run after
    round 1): what a perfect in-memory column cache would give.
``processor-only`` (floor a)
    ``processor.process(events)`` alone, per chunk, on events loaded once into the worker's
    memory (:mod:`benchmarks._floor`: no file, no column cache, no form building), tasks
    pinned to their worker with ``client.submit(..., workers=[w])``; the wall time of all
    chunks: what the analysis itself costs on this cluster.

Repeats (``--repeats N``): N independent repeats, each with fresh clusters and empty caches
for every mode (the membership scenario in the first only); the mode order rotates from one
repeat to the next.  The headline (``headline`` in the JSON) is the median [min, max] over the
repeats of run-1 and run-2 wall, the floors, and the ratios (each ratio formed within a
repeat): run 1 / run 2, every mode's run 2 / cacheaffinity's (target > 1; for
``coffea-native``: >= 2), coffea-native's run 3 / cacheaffinity's, run 2 / floor
(b), run 2 / floor (a), cacheaffinity's run 1 / direct's run 1 (what the cache writes cost
the first run); ``headline.new_process``: the new-process runs' figures and ratios (every
mode's run 2 / cacheaffinity's, new-process run 2 / same-process run 2).

Every cluster's workers are warmed up when it starts (:meth:`ModeCluster.warm_up`: the
processor once on 200 events of the generator's template, not a dataset file, no column
cache), so that run 1 of every mode measures the analysis, not each fresh worker process's
first imports and first calls (the warm-up itself takes 2-6 s per cluster here; the log line
of each repeat gives it).

Runs of the modes are interleaved: all clusters of a repeat are started before round 1, and
run k of every mode is done before run k+1 of any, so drifts in the (shared) machine's load
hit all modes alike.  While one mode runs, the worker processes of the other clusters are
frozen (``SIGSTOP``, ``SIGCONT`` before their own run; ``--no-freeze-idle`` keeps them
running): five idle clusters of four workers took 0.4-0.7 of this machine's 2 cores
(heartbeats, profilers, memory monitors), which slowed and scattered every run.  Their
schedulers and nannies (in this process) keep running; ``distributed.scheduler.worker-ttl``
is off on every cluster so that a frozen worker is not removed.
Every mode keeps one coffea metadata cache for its runs (a notebook session rerunning a
cell): run 1 includes coffea's preprocessing (opening every file), later runs do not.

Processes (``--processes same,new``, default both): ``same`` is the above, every run's
client in this process.  ``new`` runs the stable scenario once more, on fresh clusters of
its own (after the ``same`` rounds of a repeat, before them in the next), with each run's
client side (``Client``, executor, ``Runner``, processor) in a new Python process started
with ``sys.executable`` (:mod:`benchmarks._new_process_run`): a batch script or restarted
kernel re-running the analysis while the workers persist.  Nothing in memory is inherited
(coffea's metadata cache is empty: coffea preprocesses, opening every file, in every run,
unless the executor serves the preprocessing from the node caches).  The child runs the
same code as ``same`` (:func:`client_run`; its ``wall_s`` is the same span, without
interpreter start, imports and connection, recorded in ``child``); this process takes the
figures around it as for ``same``.  Per run additionally: ``file_opens`` (uproot files the
workers opened, preprocessing included, the same counter for every mode) and
``last_run_stats`` (cacheaffinity's executor: ``storage_opens``, and where reported
``files_preprocessed``, ``metadata_hits``, ``preprocess_ms``).  The results of every
process's runs must be identical (``identical_across_processes``).

Per run: ``wall_s``; ``storage_bytes`` (bytes uproot requested from the storage the mode
reads: origin, XCache, or local files; coffea's ``savemetrics`` ``bytesread``, which for
cacheaffinity counts only the files a chunk really opened); ``origin_bytes`` (XRootD: bytes
the origin sent, from the tc class byte counter, preprocessing, protocol and XCache's fetches
included: "data still read from storage"); ``decompressed_bytes`` (cached modes: bytes of
decompressed column buffers inserted into the column caches = the columns that missed, less
those another node's cache sent (``peer_bytes``);
uncached modes: every run decompresses every branch the analysis reads, the uncompressed
bytes of those branches from uproot's ``TBranch.uncompressed_bytes``, ``decompressed_per_
uncached_run`` in the JSON); ``hit_rate`` (column-cache
hits / lookups from the worker caches' counters, :func:`cacheaffinity.cache_totals` deltas,
the same counter for every cached mode: the node's own cache; ``coffea-native``: its
BufferCache's ``get`` calls that found / did not find the key, :func:`benchmarks._native.stats`
deltas, and ``decompressed_bytes`` the bytes of the arrays it stored); ``peer_hits`` / ``cache_rate``
(columns another node's cache sent, cacheaffinity's peer fetch; (hits + peer hits) / lookups:
served by caches, not decompressed); ``steals`` (cacheaffinity: its stealing's moves;
stock stealing: ``confirm`` events of Dask's ``stealing`` topic); ``on_preferred`` (tasks
that ran on their cache node / all, from the cacheaffinity plugin's counters; None where
there is no preferred node); ``disk_read_bytes`` (bytes the cluster's worker processes had
read from block storage, ``read_bytes`` of ``/proc/<pid>/io`` summed: cache entries and local
files the page cache did not hold; recorded for the ``coffea-in-memory`` floor too).

    python benchmarks/consecutive_runs.py --events 160000 --files 8 --chunksize 10000 --workers 4 --runs 5 --repeats 3
    python benchmarks/consecutive_runs.py --storage local --events 2000 --files 2 --workers 2 --runs 2 --scenarios stable

Prints a table, writes benchmarks/results/consecutive_runs.json and .png (realistic analysis;
``consecutive_runs_light.json`` / ``.png`` with ``--analysis light``).  Exits non-zero
only on errors; missed targets are reported (``targets`` in the JSON).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# the harness first: it sets the environment the workers inherit before coffea is imported
from benchmarks._runs import (  # noqa: E402
    ADMISSIONS,
    ANALYSES,
    COLUMN_CACHED,
    MODES,
    PROCESSES,
    Config,
    analysis_branches,
    digest,
    normalized,
    prepare_data,
)

import dask  # noqa: E402

from benchmarks import _gctimer, _native  # noqa: E402
from benchmarks._clusters import ModeCluster  # noqa: E402
from benchmarks._common import branch_bytes, dataset_stats, print_table, print_targets, save_png, write_json  # noqa: E402
from benchmarks._consecutive_figures import (  # noqa: E402
    evaluate_targets,
    headline,
    headline_rows,
    new_process_rows,
    plot,
    table_rows,
    worker_gc_rows,
)
from benchmarks._storage import Storage  # noqa: E402
from examples.realistic import branches_read  # noqa: E402

__all__ = [
    "ANALYSES",
    "MODES",
    "analysis_branches",
    "Config",
    "ModeCluster",
    "headline",
    "headline_rows",
    "Storage",
    "evaluate_targets",
    "plot",
    "prepare_data",
    "run_benchmark",
    "table_rows",
    "write_results",
]

DEFAULT_OUT = ROOT / "benchmarks" / "results"



# ----------------------------------------------------------------------------- benchmark


def _decompressed_volume(files: list[str], analysis: str) -> dict:
    """What one run of ``analysis`` decompresses without a column cache: the uncompressed
    bytes of the branches it reads (uproot's sizes), and the files' totals."""
    proc = ANALYSES[analysis][0]()
    names = branches_read(proc, files[0])
    b = branch_bytes(files, names)
    b["branch_names"] = names
    return b


def _one_repeat(cfg: Config, storage: Storage, workdir: Path, rep: int, files: list[str],
                log) -> dict:  # fmt: skip
    """One repeat: fresh clusters (empty caches) for every mode, R interleaved rounds, the
    floors on the cacheaffinity cluster; then (``new`` in ``cfg.processes``) the stable
    scenario again on fresh clusters with every run's client side in a new process.  The
    mode order rotates with ``rep``, the order of the two phases alternates."""
    modes = list(cfg.modes)
    if modes:
        k = rep % len(modes)
        modes = modes[k:] + modes[:k]
    sequences: dict[str, dict[str, list[dict]]] = {"stable": {}, "membership": {}}
    floors: dict[str, Any] = {"coffea-in-memory": [], "processor-only": [], "fill": None, "load": None}
    new_process: dict[str, list[dict]] = {}
    phases = list(cfg.processes)[::-1] if rep % 2 else list(cfg.processes)
    for i, process in enumerate(phases):
        if i:
            storage.fresh_xcache()  # each phase's run 1 starts cold for xcache as for the others
        if process == "same":
            _repeat_phase(cfg, storage, workdir, rep, files, log, modes, "same", sequences, floors)
        elif "stable" in cfg.scenarios:
            _repeat_phase(cfg, storage, workdir, rep, files, log, modes, "new", {"stable": new_process}, None)
    out: dict[str, Any] = {"sequences": sequences, "floors": floors, "mode_order": modes}
    if "new" in cfg.processes:
        out["new_process"] = new_process
        out["process_order"] = phases
    return out


def _repeat_phase(cfg: Config, storage: Storage, workdir: Path, rep: int, files: list[str], log,
                  modes: list[str], process: str, sequences: dict, floors: dict | None) -> None:  # fmt: skip
    """The rounds of one repeat for one ``process`` setting (``same``: stable and
    membership scenarios and the floors; ``new``: the stable scenario), on clusters of
    their own; fills ``sequences`` and ``floors``."""
    clusters: dict[tuple[str, str], ModeCluster] = {}
    new = process == "new"
    tag = f"-r{rep}"
    try:
        if "stable" in cfg.scenarios:
            for mode in modes:
                clusters["stable", mode] = ModeCluster(mode, cfg, storage, workdir, tag=tag, process=process)
        if "membership" in cfg.scenarios and rep == 0 and not new:
            for mode in cfg.membership_modes:
                clusters["membership", mode] = ModeCluster(mode, cfg, storage, workdir, membership=True, tag=tag)
        t0 = time.perf_counter()
        for c in clusters.values():  # every cluster up before round 1
            c.start()
        if cfg.freeze_idle:
            for c in clusters.values():
                c.freeze()
        log(f"[repeat {rep + 1}{', new process per run' if new else ''}] {len(clusters)} clusters "
            f"started and warmed up in {time.perf_counter() - t0:.1f} s (load {os.getloadavg()[0]:.1f}; "
            "warm-up " + ", ".join(f"{m} {c.warm_up_s:.1f} s" for (_, m), c in clusters.items()) + ")")  # fmt: skip
        floor_cluster = clusters.get(("stable", "cacheaffinity")) if cfg.floors and not new else None
        def measure_floors(run: int, when: str) -> None:
            for name, fn in (("coffea-in-memory", floor_cluster.floor_in_memory),
                             ("processor-only", floor_cluster.floor_compute)):  # fmt: skip
                with floor_cluster.running():
                    r = fn()
                r["round"], r["when"] = run, when
                floors[name].append(r)
                log(f"[floor] {name:22s} {when} round {run}: {r['wall_s']:7.2f} s")

        for run in range(1, cfg.runs + 1):
            # warm rounds: one of each floor per round, before the round's runs in odd
            # rounds (3, 5, ...) and after them in even ones, so order effects cancel
            before = floor_cluster is not None and run >= 3 and run % 2 == 1
            if before:
                measure_floors(run, "before")
            for (scenario, mode), c in clusters.items():
                with c.running():
                    row = c.run()
                row["repeat"] = rep + 1
                sequences[scenario].setdefault(mode, []).append(row)
                log(_progress_line(scenario + (", new process" if new else ""), row))
            if floor_cluster is None or before:
                continue
            if run == 1:  # fill the in-memory dicts and load the events: not timed as floors
                with floor_cluster.running():
                    floors["fill"] = floor_cluster.floor_in_memory(fill=True)
                    floors["load"] = floor_cluster.load_compute_floor(files)
                    if cfg.worker_gc[0] in ("auto", "freeze"):
                        # the floors' events now live in these workers (a user's do not):
                        # out of full collections, as every other mode's run-1 state is
                        floor_cluster.client.run(_gctimer.freeze)
                log(f"[floors] in-memory fill {floors['fill']['wall_s']:.2f} s; processor-only "
                    f"load {floors['load']['seconds']:.2f} s")  # fmt: skip
            else:
                measure_floors(run, "after")
    finally:
        for c in clusters.values():
            c.close()


def run_benchmark(cfg: Config, log=print) -> dict:
    """Run every mode (and scenario) of ``cfg``, ``cfg.repeats`` times; returns the
    results document.  With several ``cfg.worker_gc`` settings, the whole benchmark
    once per setting (the document is the first setting's, with ``worker_gc``: every
    setting's headline side by side)."""
    cfg.check()
    if len(cfg.worker_gc) > 1:
        docs = {}
        for g in cfg.worker_gc:
            log(f"== worker.gc {g}")
            docs[g] = run_benchmark(dataclasses.replace(cfg, worker_gc=(g,)), log)
        doc = docs[cfg.worker_gc[0]]
        doc["worker_gc"] = {
            g: {"headline": d["headline"], "identical_results": d["identical_results"],
                "targets": d["targets"], "repeats": d["repeats"]}
            for g, d in docs.items()
        }  # fmt: skip
        summaries = [d["identical_results"] for d in docs.values()]
        doc["identical_results"] = all(summaries) and _same_results(list(docs.values()))
        return doc
    return _run_one_setting(cfg, log)


def _same_results(docs: list[dict]) -> bool:
    """Whether every document's results equal the first's (their ``result_digest``)."""
    return len({d.get("result_digest") for d in docs}) == 1


def _run_one_setting(cfg: Config, log=print) -> dict:
    files = prepare_data(cfg)
    stats = dataset_stats(files)
    volume = _decompressed_volume(files, cfg.analysis)
    log(f"analysis {cfg.analysis!r} reads {volume['branches_found']} branches: "
        f"{volume['uncompressed'] / 1e6:.1f} of {volume['total_uncompressed'] / 1e6:.1f} MB "
        f"uncompressed ({volume['uncompressed'] / max(volume['total_uncompressed'], 1):.1%})")  # fmt: skip
    workdir = Path(cfg.workdir or tempfile.mkdtemp(prefix="cacheaffinity-consecutive-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    load_before = list(os.getloadavg())
    repeats = []
    stripes = dask.config.set(
        {"cacheaffinity.client.stripe-entries": cfg.stripe_entries or cfg.chunksize}
    )
    try:
        with stripes, Storage(cfg, files, workdir) as storage:
            for rep in range(cfg.repeats):
                if rep:
                    storage.fresh_xcache()  # a cold XCache for every repeat
                repeats.append(_one_repeat(cfg, storage, workdir, rep, files, log))
            storage_info = storage.describe()
    finally:
        if cfg.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    # every result's digest (the summary as JSON gives it back: a new process's came so),
    # per process setting; one digest overall = identical across modes, runs and processes
    digests: dict[str, list[str]] = {"same": [], "new": []}
    for rp in repeats:
        _fill_uncached_decompressed(rp["sequences"], volume["uncompressed"])
        if "new_process" in rp:
            _fill_uncached_decompressed({"stable": rp["new_process"]}, volume["uncompressed"])
        rows = [r for seq in rp["sequences"].values() for m in seq.values() for r in m]
        rows += [r for name in ("coffea-in-memory", "processor-only") for r in rp["floors"][name]]
        rows += [rp["floors"]["fill"]] if rp["floors"]["fill"] else []
        digests["same"] += [digest(normalized(r.pop("summary"))) for r in rows]
        for m in (rp.get("new_process") or {}).values():
            for r in m:
                r["result_digest"] = digest(normalized(r.pop("summary")))
                digests["new"].append(r["result_digest"])
    every = digests["same"] + digests["new"]
    identical = len(set(every)) == 1
    first = every[0] if every else None
    volume.pop("branch_names")
    doc = {
        "analysis": cfg.analysis,
        "sequences": repeats[0]["sequences"],
        "repeats": repeats,
        "identical_results": identical,
        "result_digest": first,
        "processes": list(cfg.processes),
        "dataset": stats,
        "decompressed_per_uncached_run": volume,
        "storage": storage_info,
        "elapsed_s": time.perf_counter() - started,
        "load_average_before": load_before,
        "load_average_after": list(os.getloadavg()),
    }
    if "new" in cfg.processes:
        doc["new_process"] = repeats[0].get("new_process", {})
        # same-process vs new-process results: each one digest, and the same one
        doc["identical_results_per_process"] = {p: len(set(v)) == 1 for p, v in digests.items() if v}
        doc["identical_across_processes"] = (
            len(set(digests["same"])) == 1 and set(digests["same"]) == set(digests["new"])
            if digests["same"] and digests["new"] else None
        )
    doc["headline"] = headline(doc)
    doc["targets"] = evaluate_targets(doc, cfg)
    return doc


def _fill_uncached_decompressed(sequences: dict, volume: int) -> None:
    """Uncached modes decompress every column the analysis reads, every run: the column
    buffer bytes a cold cached run 1 inserts into its caches (empty at its start), the
    same measure as the cached modes'; without a cached mode, uproot's uncompressed bytes
    of the branches read (``volume``; includes ROOT's per-entry offsets, a bit larger)."""
    cold = [
        rows[0]["decompressed_bytes"]
        for rows in sequences.get("stable", {}).values()
        if rows and rows[0]["decompressed_bytes"]  # run 1 starts with empty caches
    ]
    value = max(cold) if cold else volume
    for rows in sequences.values():
        for mode, m in rows.items():
            if mode not in COLUMN_CACHED:
                for r in m:
                    r["decompressed_bytes"] = value


def _progress_line(scenario: str, r: dict) -> str:
    hit = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}"
    return (
        f"[{scenario}] {r['mode']:22s} run {r['run']}: {r['wall_s']:7.2f} s, hit {hit}, "
        f"storage {r['storage_bytes'] / 1e6:.1f} MB"
        + ("" if r["origin_bytes"] is None else f", origin {r['origin_bytes'] / 1e6:.1f} MB")
        + (f"  ({r['event']})" if r["event"] else "")
    )


# ----------------------------------------------------------------------------- output


def parse_args(argv=None) -> tuple[Config, str]:
    d = Config()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=d.workers,
                   help="W cache nodes (with --per-node 1, the default: W worker processes)")
    p.add_argument("--per-node", type=int, default=d.per_node,
                   help="worker processes per cache node, sharing its directory (the facility node "
                   "shape: --workers 2 --per-node 2 is 2 nodes x 2 processes)")
    p.add_argument("--other-packs", type=int, default=d.other_packs, metavar="N",
                   help="packs of other data each node's cache holds before run 1, as a facility "
                   "node's cache does after earlier work (default: none)")
    p.add_argument("--admission", choices=ADMISSIONS, default=d.admission,
                   help="cacheaffinity.worker.admission in the cached modes' workers (default: the "
                   "configured default, rank)")
    p.add_argument("--runs", type=int, default=d.runs, help="R consecutive runs")
    p.add_argument("--events", type=int, default=d.events)
    p.add_argument("--files", type=int, default=d.files)
    p.add_argument("--chunksize", type=int, default=d.chunksize)
    p.add_argument("--codec", default=d.codec)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--branches", nargs="*", default=None,
                   help="glob patterns of branches to generate (default: all NanoAOD branches)")
    p.add_argument("--storage", choices=("xrootd", "local"), default=d.storage)
    p.add_argument("--rate", default=d.rate, help="origin bandwidth limit (tc units); 'none' for none")
    p.add_argument("--modes", nargs="+", default=list(d.modes), choices=MODES)
    p.add_argument("--scenarios", nargs="+", default=list(d.scenarios), choices=("stable", "membership"))
    p.add_argument("--membership-modes", nargs="*", default=list(d.membership_modes), choices=MODES)
    p.add_argument("--data", default=d.data, help="where generated datasets are kept")
    p.add_argument("--workdir", default=None, help="cache directories (default: a temporary one)")
    p.add_argument("--analysis", choices=tuple(ANALYSES), default=d.analysis,
                   help="realistic: examples/realistic.py (~180 branches); light: examples/analysis.py")
    p.add_argument("--repeats", type=int, default=d.repeats,
                   help="independent repeats (fresh clusters and caches); use >= 3 for headline figures")
    p.add_argument("--no-floors", action="store_true", help="skip the two floors")
    p.add_argument("--no-freeze-idle", action="store_true",
                   help="keep the worker processes of the clusters not running unfrozen")
    p.add_argument("--native-variant", choices=_native.VARIANTS, default=d.native_variant,
                   help="coffea-native's BufferCache (benchmarks/_native.py): file (zict.File, "
                        "no compression), blosc-zstd, memory+file (zict.Buffer over zict.File)")
    p.add_argument("--stripe-entries", type=int, default=None,
                   help="entries per placement stripe (default: the chunksize)")
    p.add_argument("--worker-gc", nargs="+", default=list(d.worker_gc),
                   choices=("auto", "freeze", "python"),
                   help="Python's collector in every mode's workers (cacheaffinity.worker.gc); "
                   "several: the benchmark once per setting, side by side (default: auto)")
    p.add_argument("--name", default=None,
                   help="results file name without .json (default: consecutive_runs, or "
                   "consecutive_runs_<analysis> for another analysis)")
    p.add_argument("--processes", type=_processes, default=d.processes, metavar="same,new",
                   help="where each run's client side lives: same (one process for all runs), new "
                   "(a new Python process per run, the cluster kept), or both (default)")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    a = p.parse_args(argv)
    cfg = Config(
        workers=a.workers, runs=a.runs, events=a.events, files=a.files, chunksize=a.chunksize,
        codec=a.codec, seed=a.seed, storage=a.storage,
        branches=tuple(a.branches) if a.branches else None,
        rate=None if str(a.rate).lower() == "none" else a.rate,
        modes=tuple(a.modes), scenarios=tuple(a.scenarios),
        membership_modes=tuple(a.membership_modes), data=a.data, workdir=a.workdir,
        analysis=a.analysis, repeats=a.repeats, floors=not a.no_floors,
        stripe_entries=a.stripe_entries, freeze_idle=not a.no_freeze_idle,
        native_variant=a.native_variant, worker_gc=tuple(a.worker_gc), name=a.name,
        processes=a.processes, per_node=a.per_node, other_packs=a.other_packs, admission=a.admission,
    )  # fmt: skip
    return cfg, a.out


def _processes(text: str) -> tuple[str, ...]:
    got = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    if not got or any(x not in PROCESSES for x in got):
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of same, new")
    return got


def result_name(cfg: Config) -> str:
    """``consecutive_runs`` for the realistic analysis (the headline), else
    ``consecutive_runs_<analysis>``."""
    if cfg.name:
        return cfg.name
    return "consecutive_runs" if cfg.analysis == "realistic" else f"consecutive_runs_{cfg.analysis}"


def write_results(doc: dict, cfg: Config, out: str | os.PathLike) -> tuple[str, str]:
    """Write ``<result_name>.json`` and ``.png`` into ``out``; returns their paths."""
    out = Path(out)
    config = dataclasses.asdict(cfg)
    config["design"] = (__doc__ or "").split("\n\n", 1)[1].split("    python ")[0].strip()
    name = result_name(cfg)
    j, png = str(out / f"{name}.json"), str(out / f"{name}.png")
    write_json(j, config=config, results=doc)
    ds = doc["dataset"]
    title = (
        f"{int(ds['events']):,} events {cfg.codec}, {cfg.workers} nodes, storage "
        f"{doc['storage']['kind']}"
        + (f" ({cfg.rate})" if doc["storage"]["kind"] == "xrootd" and cfg.rate else "")
    )
    save_png(plot(doc, title), png)
    return j, png


def main(argv=None) -> int:
    cfg, out = parse_args(argv)
    cfg.check()
    if cfg.storage == "xrootd":
        from testbed import xrootd as xrd

        missing = xrd.missing_requirements()
        if missing:
            raise SystemExit(
                "--storage xrootd needs " + "; ".join(missing) + " (or use --storage local)"
            )
        for k, v in xrd.BOUNDED_CLIENT_ENV.items():
            os.environ.setdefault(k, v)
        xrd.reexec_in_private_netns()
    print(f"machine: load {os.getloadavg()}, {os.cpu_count()} cpus", flush=True)
    doc = run_benchmark(cfg)
    print_table(table_rows(doc), title="\nconsecutive runs (storage MB: bytes requested by uproot; "
                "origin MB: what the XRootD origin sent)")  # fmt: skip
    print_table(headline_rows(doc), title=f"\nheadline ({cfg.analysis} analysis): median "
                f"[min-max] over {cfg.repeats} repeat(s)")  # fmt: skip
    print()
    for name, r in doc["headline"]["ratios"].items():
        if r["median"] is not None:
            print(f"{name}: {r['median']:.3g} [{r['min']:.3g}-{r['max']:.3g}] (n={r['n']})")
    if doc["headline"].get("new_process"):
        print_table(new_process_rows(doc), title="\nnew process per run (the cluster kept): median "
                    f"[min-max] over {cfg.repeats} repeat(s)")  # fmt: skip
        for name, r in doc["headline"]["new_process"]["ratios"].items():
            if r["median"] is not None:
                print(f"{name}: {r['median']:.3g} [{r['min']:.3g}-{r['max']:.3g}] (n={r['n']})")
    print_targets(doc["targets"])
    if doc.get("worker_gc"):
        print_table(worker_gc_rows(doc), title="\nPython's collector in the workers, side by side "
                    "(run 2; full collections per worker over the run's wall)")  # fmt: skip
    print(f"\nresults identical across modes, runs and processes: {doc['identical_results']}; "
          f"elapsed {doc['elapsed_s']:.0f} s; load {doc['load_average_before']} -> "
          f"{doc['load_average_after']}")  # fmt: skip
    j, png = write_results(doc, cfg, out)
    print(f"wrote {j} and {png}")
    return 0 if doc["identical_results"] else 1


if __name__ == "__main__":
    sys.exit(main())
