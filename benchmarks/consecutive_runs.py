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
    cache directory added before run 4 (W nodes again), unchanged from then on.  Targets: run 3
    hit rate >= (1 - 1/W) - 2 %, run 4 >= (1 - 1/(W'+1)) - 2 % with W' = W-1 nodes before the
    addition.  The share of chunks whose home was the removed node is recorded as well
    (1 - share is what a perfect cache can hit).

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
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# coffea's NanoAODSchema warns about every cross-reference a file lacks, in every worker
os.environ.setdefault("PYTHONWARNINGS", "ignore::RuntimeWarning:coffea.nanoevents.schemas.nanoaod")
os.environ["PYTHONPATH"] = os.pathsep.join(
    dict.fromkeys(filter(None, [str(ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]))
)

import warnings  # noqa: E402

warnings.filterwarnings("ignore", category=RuntimeWarning, module="coffea.nanoevents.schemas.nanoaod")

import dask  # noqa: E402
import psutil  # noqa: E402
from coffea import processor  # noqa: E402
from coffea.nanoevents import NanoAODSchema  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

import cacheaffinity  # noqa: E402
from benchmarks import _floor, _gctimer, _native, _new_process_run  # noqa: E402
from benchmarks._common import (  # noqa: E402
    branch_bytes,
    dataset_stats,
    make_dataset,
    print_table,
    pyplot,
    save_png,
    spread,
    write_json,
)
from benchmarks._memory import memory_buffers  # noqa: E402
from benchmarks._nodes import node_cluster  # noqa: E402
from examples import analysis as light_analysis  # noqa: E402
from examples import realistic as realistic_analysis  # noqa: E402
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
]

MODES = ("direct", "dask-default+cache", "coffea-affinity+cache", "coffea-native", "xcache",
         "cacheaffinity")
#: modes with cacheaffinity's column cache (worker plugin, :func:`cacheaffinity.cache_totals`)
CACHED = ("dask-default+cache", "coffea-affinity+cache", "cacheaffinity")
#: coffea's own BufferCache (:mod:`benchmarks._native`)
NATIVE = "coffea-native"
#: modes with a column cache of any kind (their run 2 should decompress less than run 1)
COLUMN_CACHED = (*CACHED, NATIVE)
#: Target: cacheaffinity's run 2 at least this many times faster than coffea-native's
NATIVE_TARGET = 2.0
COUNTERS = ("hits", "misses", "bytes_written", "storage_bytes", "storage_opens", "peer_hits", "peer_bytes")
#: where a run's client side lives (``--processes``): this process, or a new one per run
PROCESSES = ("same", "new")
#: targets of the new-process runs: (name, limit text, test)
NEW_PROCESS_TARGETS = {
    "cacheaffinity new-process run 2 / same-process run 2": ("<= 1.10", lambda v: v <= 1.10),
    "coffea-native new-process run 2 / cacheaffinity new-process run 2": (">= 3", lambda v: v >= 3),
    "direct new-process run 2 / cacheaffinity new-process run 2": (">= 4", lambda v: v >= 4),
}
#: analysis name -> (processor class, summary function)
ANALYSES = {
    "realistic": (realistic_analysis.TTbarLikeProcessor, realistic_analysis.summary),
    "light": (light_analysis.DimuonJetProcessor, light_analysis.summary),
}
DEFAULT_DATA = ROOT / ".bench-data" / "consecutive_runs"
DEFAULT_OUT = ROOT / "benchmarks" / "results"


@dataclasses.dataclass
class Config:
    """What to run (the command-line options, see ``--help``)."""

    workers: int = 4
    runs: int = 5
    events: int = 320_000
    files: int = 16
    chunksize: int = 5_000
    codec: str = "lzma"
    seed: int = 11
    #: glob patterns of the branches to write (None: every NanoAOD branch, ~1500, realistic;
    #: a subset makes small test sizes fast: coffea builds a file's form for every chunk)
    branches: tuple[str, ...] | None = None
    storage: str = "xrootd"
    rate: str | None = "1gbit"
    modes: tuple[str, ...] = MODES
    scenarios: tuple[str, ...] = ("stable", "membership")
    membership_modes: tuple[str, ...] = ("cacheaffinity",)
    data: str = str(DEFAULT_DATA)
    workdir: str | None = None
    xcache_blocksize: str = "1m"
    progress: bool = True
    #: which processor: "realistic" (examples/realistic.py, ~180 branches) or "light"
    #: (examples/analysis.py, dimuon mass + jet HT, ~10 branches)
    analysis: str = "realistic"
    #: independent repeats (fresh clusters and caches each); headline = median [min, max]
    repeats: int = 1
    #: measure the floors (coffea-in-memory, processor-only) on the cacheaffinity cluster
    floors: bool = True
    #: entries per placement stripe (``cacheaffinity.client.stripe-entries``); None: the
    #: chunksize, so that a small benchmark dataset has as many placement units as chunks
    #: (the default 200,000 would give one unit per generated file)
    stripe_entries: int | None = None
    #: freeze (SIGSTOP) the worker processes of the clusters not running (see above)
    freeze_idle: bool = True
    #: the coffea-native mode's BufferCache (:data:`benchmarks._native.VARIANTS`)
    native_variant: str = "file"
    #: Python's collector in every mode's workers (``cacheaffinity.worker.gc``: auto,
    #: freeze, python); the modes without the worker plugin get the same: with auto or
    #: freeze (worker processes here are nanny children) ``gc.collect(); gc.freeze()``
    #: after their run 1.  Several (``--worker-gc auto python``): the whole benchmark
    #: once per setting, side by side in one invocation.
    worker_gc: tuple[str, ...] = ("auto",)
    #: results file name (None: :func:`result_name`'s default)
    name: str | None = None
    #: where each run's client side lives: ``same`` (one process for every run, as in a
    #: notebook session) and/or ``new`` (a new Python process per run, the cluster kept)
    processes: tuple[str, ...] = ("same", "new")
    #: worker processes per cache node, sharing its directory (``workers`` is the number of
    #: nodes): the facility node shape (:mod:`benchmarks._nodes`); 1 is a process per node
    per_node: int = 1

    @property
    def worker_processes(self) -> int:
        return self.workers * self.per_node

    def check(self) -> None:
        bad = [m for m in (*self.modes, *self.membership_modes) if m not in MODES]
        if bad:
            raise ValueError(f"unknown mode {bad[0]!r}; choose from {', '.join(MODES)}")
        if self.storage not in ("xrootd", "local"):
            raise ValueError(f"storage={self.storage!r}: use 'xrootd' or 'local'")
        if self.storage == "local" and "xcache" in (*self.modes, *self.membership_modes):
            self.modes = tuple(m for m in self.modes if m != "xcache")
            self.membership_modes = tuple(m for m in self.membership_modes if m != "xcache")
        for s in self.scenarios:
            if s not in ("stable", "membership"):
                raise ValueError(f"unknown scenario {s!r}; use stable and/or membership")
        if self.native_variant not in _native.VARIANTS:
            raise ValueError(
                f"native_variant={self.native_variant!r}: choose from {', '.join(_native.VARIANTS)}"
            )
        if self.native_variant == "blosc-zstd" and NATIVE in (*self.modes, *self.membership_modes):
            import importlib.util

            if importlib.util.find_spec("numcodecs") is None:
                raise ValueError("--native-variant blosc-zstd needs numcodecs: pip install numcodecs")
        bad_proc = [p for p in self.processes if p not in PROCESSES]
        if bad_proc or not self.processes:
            raise ValueError(f"processes={self.processes!r}: use same and/or new")
        bad_gc = [g for g in self.worker_gc if g not in ("auto", "freeze", "python")]
        if bad_gc or not self.worker_gc:
            raise ValueError(f"worker_gc={self.worker_gc!r}: use auto, freeze and/or python")
        if self.analysis not in ANALYSES:
            raise ValueError(f"analysis={self.analysis!r}: choose from {', '.join(ANALYSES)}")
        if self.repeats < 1:
            raise ValueError(f"repeats={self.repeats}: need >= 1 (the headline wants 3)")
        if self.workers < 2:
            raise ValueError(f"workers={self.workers}: need >= 2 (one is removed)")
        if self.runs < 2:
            raise ValueError(f"runs={self.runs}: need >= 2 consecutive runs")
        if self.per_node < 1:
            raise ValueError(f"per_node={self.per_node}: need >= 1 worker process per node")
        if self.per_node > 1 and "membership" in self.scenarios:
            raise ValueError(
                f"per_node={self.per_node}: the membership scenario removes and adds single worker "
                "processes; use --scenarios stable with a node shape"
            )
        if "membership" in self.scenarios and self.runs < 4:
            raise ValueError(
                f"runs={self.runs}: the membership scenario removes a node before run 3 and "
                "adds one before run 4; use --runs 4 or more, or --scenarios stable"
            )


# ----------------------------------------------------------------------------- data


def prepare_data(cfg: Config) -> list[str]:
    """The dataset's files, generated once per (events, files, codec, seed) and reused."""
    name = f"{cfg.codec}-{cfg.events}ev-{cfg.files}f-seed{cfg.seed}"
    if cfg.branches:
        name += "-" + re.sub(r"[^A-Za-z0-9]+", "", "".join(cfg.branches))[:40]
    d = Path(cfg.data) / name
    stamp = d / "params.json"
    params = {"events": cfg.events, "files": cfg.files, "codec": cfg.codec, "seed": cfg.seed}
    if cfg.branches:
        params["branches"] = list(cfg.branches)
    if not stamp.exists() or json.loads(stamp.read_text()) != params:
        shutil.rmtree(d, ignore_errors=True)
        make_dataset(
            d, events=cfg.events, files=cfg.files, codec=cfg.codec, seed=cfg.seed,
            branches=list(cfg.branches) if cfg.branches else None, progress=cfg.progress,
        )  # fmt: skip
        stamp.write_text(json.dumps(params))
    for p in (Path(cfg.data), d):  # the xrootd user must reach and read the files
        os.chmod(p, os.stat(p).st_mode | 0o005)
    return sorted(str(f) for f in d.glob("nano_*.root"))


# ----------------------------------------------------------------------------- storage


class Storage:
    """Where the files come from: a local directory, or an XRootD origin (+ XCache).

    With XRootD (inside a private network namespace), :meth:`origin_bytes` is the byte
    counter of the HTB class that carries what the origin sends (installed even without a
    ``rate``, at 100gbit, so that every mode's origin traffic is measured the same way).
    """

    def __init__(self, cfg: Config, files: list[str], workdir: Path):
        self.cfg, self.files, self.workdir = cfg, files, workdir
        self.origin = self.xcache = None
        self._stack = contextlib.ExitStack()
        self._xcache_stack: contextlib.ExitStack | None = None
        self._xcache_gen = 0

    def __enter__(self) -> Storage:
        if self.cfg.storage == "local":
            return self
        from testbed import xrootd as xrd

        for k, v in xrd.BOUNDED_CLIENT_ENV.items():
            os.environ.setdefault(k, v)
        export = Path(self.files[0]).parent
        self.origin = self._stack.enter_context(xrd.XRootDServer(export))
        if "xcache" in (*self.cfg.modes, *self.cfg.membership_modes):
            os.chmod(self.workdir, 0o755)
            self.fresh_xcache()
        xrd.limit_loopback_bandwidth(self.cfg.rate or "100gbit", port=self.origin.port)
        self._stack.callback(xrd.remove_loopback_bandwidth_limit)
        return self

    def fresh_xcache(self) -> None:
        """(Re)start XCache with a new, empty cache directory (before every repeat, so
        that each repeat's run 1 starts cold for the xcache mode as for the others)."""
        if self.origin is None or "xcache" not in (*self.cfg.modes, *self.cfg.membership_modes):
            return
        from testbed import xrootd as xrd

        if self._xcache_stack is not None:
            self._xcache_stack.close()
        self._xcache_gen += 1
        self._xcache_stack = contextlib.ExitStack()
        cache_dir = self.workdir / f"xcache-{self._xcache_gen}"
        self.xcache = self._xcache_stack.enter_context(
            xrd.XCacheServer(self.origin, cache_dir, blocksize=self.cfg.xcache_blocksize, prefetch=0)
        )

    def __exit__(self, *exc) -> None:
        if self._xcache_stack is not None:
            self._xcache_stack.close()
        self._stack.close()

    def fileset(self, mode: str) -> dict[str, list[str]]:
        if self.origin is None:
            return {"synthetic": list(self.files)}
        server = self.xcache if mode == "xcache" else self.origin
        return {"synthetic": [server.file_url(Path(f).name) for f in self.files]}

    def uproot_options(self) -> dict:
        return uproot_options(self.origin is not None)

    def origin_bytes(self) -> int | None:
        """Bytes the origin has sent so far (tc class 1:10), None without XRootD."""
        if self.origin is None:
            return None
        out = subprocess.run(
            [shutil.which("tc") or "/usr/sbin/tc", "-s", "class", "show", "dev", "lo"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        m = re.search(r"class htb 1:10 .*?\n\s*Sent (\d+) bytes", out, re.S)
        if not m:
            raise RuntimeError(f"no byte counter of tc class 1:10 in:\n{out}")
        return int(m.group(1))

    def describe(self) -> dict:
        if self.origin is None:
            return {"kind": "local", "directory": str(Path(self.files[0]).parent)}
        from testbed import xrootd as xrd

        return {
            "kind": "xrootd",
            "origin": self.origin.url,
            "xcache": self.xcache.url if self.xcache else None,
            "xcache_blocksize": self.cfg.xcache_blocksize,
            "xcache_prefetch": 0,
            "origin_rate_limit": self.cfg.rate,
            "qdisc": xrd.loopback_qdisc(),
        }


def uproot_options(xrootd: bool) -> dict:
    """uproot's options for the storage: XRootD's handler for ``root://`` URLs, else none."""
    if not xrootd:
        return {}
    import uproot

    return {"handler": uproot.XRootDSource}


# ----------------------------------------------------------------------------- one mode


def _stock_steals(client, since: float) -> int:
    return sum(
        1
        for t, m in client.get_events("stealing")
        if t >= since and isinstance(m, (tuple, list)) and m and m[0] == "confirm"
    )


def _wait_nodes(client, n: int, plugin: bool, timeout: float = 60.0, processes: int | None = None) -> None:
    """Wait until the cluster has ``processes`` (default ``n``) workers in ``n`` cache nodes."""
    deadline = time.monotonic() + timeout
    want = n if processes is None else processes
    while True:
        workers = len(client.scheduler_info(n_workers=-1)["workers"])
        nodes = len(cacheaffinity.check(client)["nodes"]) if plugin else n
        if workers == want and nodes == n:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"cluster has {workers} workers / {nodes} nodes, waited for {want} / {n}")
        time.sleep(0.1)


def _delta(before: int | None, after: int | None) -> int | None:
    """``after - before`` of a counter, None if either reading is unavailable."""
    return None if before is None or after is None else after - before


def _chunks(files: list[str], chunksize: int) -> list[tuple[str, int, int]]:
    """(file, start, stop) of every chunk: the same split as coffea's Runner (n =
    round(entries / chunksize) equal chunks per file)."""
    import math

    import uproot

    out = []
    for f in files:
        with uproot.open(f) as rf:
            entries = rf["Events"].num_entries
        n = max(round(entries / chunksize), 1)
        size = math.ceil(entries / n)
        out += [(f, s, min(s + size, entries)) for s in range(0, entries, size)]
    return out


def make_executor(mode: str, client):
    """The mode's coffea executor on ``client`` (what the mode's user script builds)."""
    if mode == "cacheaffinity":
        return cacheaffinity.CacheAffinityExecutor(client=client, status=False)
    return processor.DaskExecutor(
        client=client, status=False, worker_affinity=mode in ("coffea-affinity+cache", NATIVE),
    )  # fmt: skip


def runner_options(mode: str, cfg: Config) -> dict:
    """The mode's ``processor.Runner`` keywords besides the executor and metadata cache."""
    kw: dict[str, Any] = {"schema": NanoAODSchema, "chunksize": cfg.chunksize, "savemetrics": True}
    if mode in CACHED:
        kw["cachestrategy"] = cacheaffinity.cachestrategy
    elif mode == NATIVE:  # one BufferCache per worker process, built on its first chunk
        kw["cachestrategy"] = functools.partial(_native.buffer_cache, cfg.native_variant)
    return kw


def client_run(mode: str, cfg: Config, executor, fileset: dict, uproot_opts: dict,
               metadata_cache: dict | None = None) -> dict:  # fmt: skip
    """The client side of one run (same-process and new-process paths alike): a ``Runner``
    with ``metadata_cache``, coffea's preprocessing timed on its own, then the run.

    Returns ``wall_s`` (preprocessing + Runner call), ``preprocess_s``, ``storage_bytes``
    (coffea's ``bytesread``), ``summary`` (the analysis's comparable output) and
    ``last_run_stats`` (the executor's, None for coffea's ``DaskExecutor``).
    """
    proc_cls, summary = ANALYSES[cfg.analysis]
    runner = processor.Runner(executor=executor, metadata_cache=metadata_cache, **runner_options(mode, cfg))
    t0 = time.perf_counter()
    # coffea's preprocessing (each file opened for its entry count), timed on its own: in
    # one process run 1 pays it and later runs find the counts in the Runner's metadata
    # cache (as in one notebook session); the run call below then preprocesses from it
    runner.preprocess(fileset, treename="Events", uproot_options=uproot_opts)
    preprocess = time.perf_counter() - t0
    out, metrics = runner(
        fileset, processor_instance=proc_cls(), treename="Events", uproot_options=uproot_opts,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    stats = getattr(executor, "last_run_stats", None)
    return {
        "wall_s": wall,
        "preprocess_s": preprocess,
        "storage_bytes": int(metrics.get("bytesread", 0)),
        "summary": summary(out),
        "last_run_stats": dict(stats) if stats else None,
    }


def normalized(summary: Any) -> Any:
    """``summary`` as JSON gives it back (what a new-process run hands its parent)."""
    return json.loads(json.dumps(summary, sort_keys=True, default=str))


def _digest(summary: Any) -> str:
    return hashlib.sha256(json.dumps(summary, sort_keys=True, default=str).encode()).hexdigest()


class ModeCluster:
    """One mode's cluster: W worker processes (= W cache nodes) and its executor.

    :meth:`start` brings the cluster up (every mode's cluster is started before round 1,
    so no mode runs while another's processes are still starting); :meth:`run` does the
    next consecutive run and returns its row; on the ``cacheaffinity`` cluster,
    :meth:`floor_in_memory` and :meth:`floor_compute` measure the two floors.
    ``membership``: remove the last worker before run 3, add a new one before run 4.
    ``process="new"``: every run's client side (Client, executor, Runner, processor) in a
    new Python process (:mod:`benchmarks._new_process_run`); the cluster and its caches
    persist, the measurements around the run are this process's, as for ``same``.
    """

    def __init__(self, mode: str, cfg: Config, storage: Storage, workdir: Path, *,
                 membership: bool = False, tag: str = "", process: str = "same"):  # fmt: skip
        self.mode, self.cfg, self.storage, self.membership = mode, cfg, storage, membership
        self.process = process
        suffix = ("-membership" if membership else "") + ("-new" if process == "new" else "")
        self.cache_root = workdir / f"caches-{mode}{suffix}{tag}"
        self.plugin = mode == "cacheaffinity"
        self.cached = mode in CACHED
        self.native = mode == NATIVE
        self.settings: dict[str, Any] = {
            "distributed.scheduler.preload": ["cacheaffinity"] if self.plugin else [],
            "distributed.worker.preload": ["cacheaffinity"] if self.cached else [],
            "cacheaffinity.worker.directory": str(self.cache_root / "node-{name}"),
            "cacheaffinity.worker.capacity": "50 GiB",
            "cacheaffinity.worker.gc": cfg.worker_gc[0],
            # frozen workers (cfg.freeze_idle) send no heartbeats: never remove them for it
            "distributed.scheduler.worker-ttl": None,
        }
        self._frozen: list[int] = []
        self.stack = contextlib.ExitStack()
        self.metadata_cache: dict = {}
        self.memory_metadata_cache: dict = {}
        self.run_no = 0
        self.n_nodes = cfg.workers
        self.floor_chunks: list[tuple[str, str]] | None = None  # (key, worker)
        self.processor, self.summary = ANALYSES[cfg.analysis]

    def start(self) -> ModeCluster:
        shutil.rmtree(self.cache_root, ignore_errors=True)
        cfg = self.cfg
        # coffea-native's cache lives in each worker's local directory: put those beside
        # the other modes' cache directories (same disk; removed with the cluster)
        local = {"local_directory": str(self.cache_root)} if self.native else {}
        with dask.config.set(self.settings):  # read when the scheduler and workers start
            if cfg.per_node == 1:
                cluster = LocalCluster(
                    n_workers=cfg.workers, threads_per_worker=1, processes=True,
                    host="127.0.0.1", dashboard_address="127.0.0.1:0", **local,
                )  # fmt: skip
            else:  # the node's processes share its directory (node-<n>)
                cluster = node_cluster(cfg.workers, cfg.per_node, lambda n: self.cache_root / f"node-{n}",
                                       local_directory=local.get("local_directory"))  # fmt: skip
            self.cluster = self.stack.enter_context(cluster)
            self.client = self.stack.enter_context(Client(self.cluster))
            self.client.wait_for_workers(cfg.worker_processes)
        self.warm_up()
        self.client.run(_gctimer.install)
        self.client.run(_new_process_run.file_opens)  # install the counter
        if self.plugin:
            _wait_nodes(self.client, cfg.workers, True, processes=cfg.worker_processes)
        # new process: each run's child builds its own (this process only measures)
        self.executor = make_executor(self.mode, self.client) if self.process == "same" else None
        return self

    def warm_up(self) -> float:
        """Every worker runs the processor once on a few events of the generator's template
        (not a dataset file, no column cache; :func:`benchmarks._floor.warm_up`), so that run 1
        measures the analysis, not the worker processes' first imports.  Returns the slowest
        worker's seconds (recorded per cluster as ``warm_up_s``)."""
        from benchmarks._common import template_path

        out = self.client.run(_floor.warm_up, str(template_path()), self.processor())
        self.warm_up_s = max(r["seconds"] for r in out.values())
        return self.warm_up_s

    def freeze(self) -> None:
        """Stop (SIGSTOP) this cluster's worker processes while other modes run."""
        if self._frozen:
            return
        pids = sorted(set(self.client.run(os.getpid).values()))
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        self._frozen = pids
        # a signal is delivered asynchronously: a worker busy on another core may still run
        # for a moment after kill() returns; wait until every one is stopped
        deadline = time.monotonic() + 5.0
        for pid in pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                while psutil.Process(pid).status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
                    time.sleep(0.002)

    def thaw(self) -> None:
        """Continue (SIGCONT) the worker processes :meth:`freeze` stopped."""
        pids, self._frozen = self._frozen, []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    @contextlib.contextmanager
    def running(self) -> Iterator[ModeCluster]:
        """This cluster thawed for the duration, frozen again after (``cfg.freeze_idle``)."""
        self.thaw()
        try:
            yield self
        finally:
            if self.cfg.freeze_idle:
                self.freeze()

    def close(self) -> None:
        self.thaw()  # a stopped worker would never answer its nanny's close
        self.stack.close()

    def _membership_event(self) -> tuple[str | None, float | None]:
        client, cfg = self.client, self.cfg
        if self.run_no == 3:
            # the node that leaves: the last worker's; its share of chunks = what misses
            names = {str(w["name"]): a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}
            leaving = names[str(max(int(n) for n in names))]
            removed_share = None
            if self.plugin:
                nodes = cacheaffinity.check(client)["nodes"]
                node = next(n for n, d in nodes.items() if leaving in d["workers"])
                done = sum(d["counters"].get("on-target", 0) + d["counters"].get("off-target", 0) for d in nodes.values())
                mine = nodes[node]["counters"].get("on-target", 0) + nodes[node]["counters"].get("off-target", 0)
                removed_share = mine / done if done else None
            self.cluster.scale(cfg.workers - 1)
            self.n_nodes = cfg.workers - 1
            _wait_nodes(client, self.n_nodes, self.plugin)
            return f"removed worker {leaving}", removed_share
        if self.run_no == 4:
            # a new cache node: a new, empty directory (LocalCluster reuses the freed
            # worker name, so node-{name} would be the removed node coming back)
            added = {**self.settings, "cacheaffinity.worker.directory": str(self.cache_root / "added-{name}")}
            with dask.config.set(added):  # the new worker reads it when it starts
                self.cluster.scale(cfg.workers)
                client.wait_for_workers(cfg.workers)
            self.n_nodes = cfg.workers
            _wait_nodes(client, self.n_nodes, self.plugin)
            return "added a worker with a new cache directory", None
        return None, None

    def _runner(self, **kw) -> processor.Runner:
        return processor.Runner(
            executor=self.executor, schema=NanoAODSchema, chunksize=self.cfg.chunksize,
            savemetrics=True, **kw,
        )  # fmt: skip

    def run(self) -> dict:
        """The next consecutive run: its row (wall, bytes, hit rate, ...)."""
        client, mode, storage = self.client, self.mode, self.storage
        self.run_no += 1
        event, removed_share = self._membership_event() if self.membership else (None, None)
        cached, plugin = self.cached, self.plugin
        before = self.cache_totals()
        c0 = cacheaffinity.check(client)["counters"] if plugin else {}
        disk0 = self.disk_read_bytes()
        o0 = storage.origin_bytes()
        opens0 = self.file_opens()
        since = time.time()
        fileset, uproot_opts = storage.fileset(mode), storage.uproot_options()
        client.run(_gctimer.read)  # reset
        if self.process == "new":
            res = _new_process_run.spawn(self.child_spec(fileset))
        else:
            res = client_run(mode, self.cfg, self.executor, fileset, uproot_opts, self.metadata_cache)
        wall = res["wall_s"]
        gc_run = _gctimer.summary(client.run(_gctimer.read))
        if self.run_no == 1 and not plugin and self.cfg.worker_gc[0] in ("auto", "freeze"):
            # what the worker plugin does after its first chunk task, for modes without it
            client.run(_gctimer.freeze)
        disk1 = self.disk_read_bytes()
        o1 = storage.origin_bytes()
        opens1 = self.file_opens()
        after = self.cache_totals()
        cached = cached or self.native
        d = {k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS} if cached else {}
        lookups = d.get("hits", 0) + d.get("misses", 0)
        row: dict[str, Any] = {
            "mode": mode,
            "run": self.run_no,
            "process": self.process,
            "nodes": self.n_nodes,
            "event": event,
            "wall_s": wall,
            "preprocess_s": res["preprocess_s"],
            "storage_bytes": res["storage_bytes"],
            "origin_bytes": None if o0 is None else o1 - o0,
            # columns fetched from another node's cache are stored here too, not decompressed
            "decompressed_bytes": d.get("bytes_written", 0) - d.get("peer_bytes", 0) if cached else None,
            "hit_rate": d["hits"] / lookups if cached and lookups else None,
            "hits": d.get("hits"),
            "misses": d.get("misses"),
            "peer_hits": d.get("peer_hits") if self.cached else None,  # cacheaffinity's peer fetch
            "cache_rate": (d["hits"] + d.get("peer_hits", 0)) / lookups if cached and lookups else None,
            "files_opened": d.get("storage_opens") if plugin else None,
            # uproot files the workers opened (coffea's preprocessing and chunk tasks,
            # cacheaffinity's misses): the same counter for every mode
            "file_opens": None if opens0 is None or opens1 is None
            else sum(n - opens0.get(w, 0) for w, n in opens1.items()),
            # the executor's figures of the run (cacheaffinity), as the run's client got them
            "last_run_stats": res["last_run_stats"],
            # what the workers read from block storage (not the page cache): cache entries
            # on the node's disk, and local dataset files (storage local)
            "disk_read_bytes": _delta(disk0, disk1),
            "steals": None,
            "on_preferred": None,
            # Python's full collections, seconds per worker (median over the workers)
            "gc_full_s": gc_run.get("full_s"),
            "gc_full_share": gc_run["full_s"] / wall if gc_run.get("full_s") is not None else None,
            "gc_frozen_objects": gc_run.get("frozen"),
            "summary": res["summary"],
        }
        if "child" in res:  # the new process: its pid, imports, connection, whole life
            row["child"] = res["child"]
        if removed_share is not None:
            row["removed_node_share"] = removed_share
        if plugin:
            c1 = cacheaffinity.check(client)["counters"]
            on = c1.get("on-target", 0) - c0.get("on-target", 0)
            off = c1.get("off-target", 0) - c0.get("off-target", 0)
            row["steals"] = c1.get("steals", 0) - c0.get("steals", 0)
            row["on_preferred"] = on / (on + off) if on + off else None
        elif mode not in ("coffea-affinity+cache", NATIVE):  # strict restrictions: no steals
            row["steals"] = _stock_steals(client, since)
        else:
            row["steals"] = 0
        return row

    def cache_totals(self) -> dict[str, int]:
        """The column-cache counters summed over the workers so far (:data:`COUNTERS`;
        empty for the uncached modes): cacheaffinity's (:func:`cacheaffinity.cache_totals`),
        or coffea-native's BufferCache counts (:func:`benchmarks._native.stats`)."""
        if self.cached:
            return cacheaffinity.cache_totals(self.client)
        if not self.native:
            return {}
        out = dict.fromkeys(COUNTERS, 0)
        for st in self.client.run(_native.stats).values():
            for k in ("hits", "misses", "bytes_written"):
                out[k] += st[k]
        return out

    def native_stats(self) -> dict[str, dict]:
        """coffea-native: per worker, :func:`benchmarks._native.stats` (entries, files,
        bytes on disk, directory)."""
        return self.client.run(_native.stats) if self.native else {}

    # ------------------------------------------------------------------ floors

    def floor_in_memory(self, fill: bool = False) -> dict:
        """Floor (b), ``coffea-in-memory``: the same executor and coffea/NanoEvents
        pipeline with every column buffer in a dict of the worker process
        (``Runner(cachestrategy=benchmarks._memory.memory_buffers)``) and the forms from
        the node; ``fill``: the first such run, which fills the dicts (not a floor)."""
        storage = self.storage
        runner = self._runner(metadata_cache=self.memory_metadata_cache, cachestrategy=memory_buffers)
        disk0 = self.disk_read_bytes()
        self.client.run(_gctimer.read)  # reset
        t0 = time.perf_counter()
        out, metrics = runner(
            storage.fileset(self.mode), processor_instance=self.processor(), treename="Events",
            uproot_options=storage.uproot_options(),
        )  # fmt: skip
        wall = time.perf_counter() - t0
        gc_run = _gctimer.summary(self.client.run(_gctimer.read))
        disk1 = self.disk_read_bytes()
        return {"mode": "coffea-in-memory" + (" (fill)" if fill else ""), "wall_s": wall,
                "storage_bytes": int(metrics.get("bytesread", 0)), "summary": self.summary(out),
                "disk_read_bytes": _delta(disk0, disk1), "gc_full_s": gc_run.get("full_s"),
                "gc_full_share": gc_run["full_s"] / wall if gc_run.get("full_s") is not None else None}  # fmt: skip

    def child_spec(self, fileset: dict) -> dict:
        """What a new-process run needs (:func:`benchmarks._new_process_run.main`)."""
        cfg = self.cfg
        return {
            "mode": self.mode,
            "scheduler": self.cluster.scheduler_address,
            "config": {"chunksize": cfg.chunksize, "analysis": cfg.analysis,
                       "native_variant": cfg.native_variant},  # fmt: skip
            "fileset": fileset,
            "xrootd": self.storage.origin is not None,
            # client-side settings a user's script (or its environment) sets
            "dask_config": {"cacheaffinity.client": dask.config.get("cacheaffinity.client", {})},
        }

    def file_opens(self) -> dict[str, int] | None:
        """Per worker, uproot files it opened so far (:func:`benchmarks._new_process_run.file_opens`)."""
        try:
            return self.client.run(_new_process_run.file_opens)
        except Exception:  # noqa: BLE001 - a figure, not worth failing the run
            return None

    def disk_read_bytes(self) -> int | None:
        """Bytes this cluster's worker processes have read from block storage so far
        (``/proc/<pid>/io`` ``read_bytes``, summed), None where the kernel does not say."""
        got = list(self.client.run(_floor.io_read_bytes).values())
        return None if not got or any(v is None for v in got) else sum(got)

    def load_compute_floor(self, files: list[str]) -> dict:
        """Load every chunk's events into a worker's memory (round robin over workers)
        for floor (a); returns what was loaded."""
        workers = sorted(self.client.scheduler_info(n_workers=-1)["workers"])
        futs, self.floor_chunks = [], []
        t0 = time.perf_counter()
        for i, (f, start, stop) in enumerate(_chunks(files, self.cfg.chunksize)):
            key = f"{Path(f).name}/{start}-{stop}"
            w = workers[i % len(workers)]
            self.floor_chunks.append((key, w))
            futs.append(self.client.submit(
                _floor.load, key, f, "Events", start, stop, "synthetic", self.processor(),
                workers=[w], allow_other_workers=False, pure=False, key=f"floor-load-{key}",
            ))  # fmt: skip
        loaded = self.client.gather(futs)
        return {
            "chunks": len(loaded),
            "seconds": time.perf_counter() - t0,
            "bytes_in_memory": sum(x["bytes"] for x in loaded),
            "buffers_per_chunk": max(x["buffers"] for x in loaded),
        }

    def floor_compute(self) -> dict:
        """Floor (a), ``processor-only``: ``processor.process(events)`` per chunk on events
        already in the worker's memory, pinned to that worker; wall time of all chunks."""
        assert self.floor_chunks is not None, "load_compute_floor first"
        proc = self.processor()
        t0 = time.perf_counter()
        futs = [
            self.client.submit(_floor.process, key, proc, workers=[w], allow_other_workers=False,
                               pure=False)  # fmt: skip
            for key, w in self.floor_chunks
        ]
        done = self.client.gather(futs)
        wall = time.perf_counter() - t0
        acc = None
        for d in done:
            acc = d["out"] if acc is None else processor.accumulate([acc, d["out"]])
        return {"mode": "processor-only", "wall_s": wall,
                "process_s_sum": sum(d["seconds"] for d in done), "summary": self.summary(acc)}  # fmt: skip


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
        digests["same"] += [_digest(normalized(r.pop("summary"))) for r in rows]
        for m in (rp.get("new_process") or {}).values():
            for r in m:
                r["result_digest"] = _digest(normalized(r.pop("summary")))
                digests["new"].append(r["result_digest"])
    every = digests["same"] + digests["new"]
    identical = len(set(every)) == 1
    digest = every[0] if every else None
    volume.pop("branch_names")
    doc = {
        "analysis": cfg.analysis,
        "sequences": repeats[0]["sequences"],
        "repeats": repeats,
        "identical_results": identical,
        "result_digest": digest,
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


def headline(doc: dict) -> dict:
    """Median [min, max] over the repeats of every headline figure.

    Per mode: run-1 and run-2 wall, decompressed MB and hit rate of run 2; floors: per
    repeat the median of its floor runs; ratios are formed per repeat, then summarised.
    """
    per_mode: dict[str, dict] = {}
    ratios: dict[str, list] = {}
    floors_b, floors_a, floors_b_disk, floors_b_gc = [], [], [], []
    for rp in doc["repeats"]:
        stable = rp["sequences"].get("stable", {})
        fb = [r["wall_s"] for r in rp["floors"]["coffea-in-memory"]]
        fa = [r["wall_s"] for r in rp["floors"]["processor-only"]]
        fb_med = statistics.median(fb) if fb else None
        fa_med = statistics.median(fa) if fa else None
        floors_b.append(fb_med)
        floors_a.append(fa_med)
        fb_disk = [r["disk_read_bytes"] for r in rp["floors"]["coffea-in-memory"]
                   if r.get("disk_read_bytes") is not None]  # fmt: skip
        if fb_disk:
            floors_b_disk.append(_mb(statistics.median(fb_disk)))
        for mode, rows in stable.items():
            pm = per_mode.setdefault(mode, {"run1_wall_s": [], "run2_wall_s": [], "run2_hit_rate": [],
                                            "run2_cache_rate": [],
                                            "run1_decompressed_MB": [], "run2_decompressed_MB": [],
                                            "run2_origin_MB": []})  # fmt: skip
            pm["run1_wall_s"].append(rows[0]["wall_s"])
            if rows[0].get("preprocess_s") is not None:
                pm.setdefault("run1_preprocess_s", []).append(rows[0]["preprocess_s"])
            pm["run1_decompressed_MB"].append(_mb(rows[0]["decompressed_bytes"]))
            if len(rows) >= 2:
                pm["run2_wall_s"].append(rows[1]["wall_s"])
                pm["run2_hit_rate"].append(rows[1]["hit_rate"])
                pm["run2_cache_rate"].append(rows[1].get("cache_rate"))
                pm["run2_decompressed_MB"].append(_mb(rows[1]["decompressed_bytes"]))
                pm["run2_origin_MB"].append(_mb(rows[1]["origin_bytes"]))
                if rows[1].get("disk_read_bytes") is not None:
                    pm.setdefault("run2_disk_read_MB", []).append(_mb(rows[1]["disk_read_bytes"]))
                # Python's full collections per worker, share of the warm run's wall
                pm.setdefault("run2_gc_full_share", []).append(rows[1].get("gc_full_share"))
        fb_gc = [r.get("gc_full_share") for r in rp["floors"]["coffea-in-memory"]]
        fb_gc = [v for v in fb_gc if v is not None]
        if fb_gc:
            floors_b_gc.append(statistics.median(fb_gc))
        ca = stable.get("cacheaffinity")
        if not ca or len(ca) < 2:
            continue
        r2 = ca[1]["wall_s"]

        def add(name, v):
            ratios.setdefault(name, []).append(v)

        add("cacheaffinity run 1 / run 2", ca[0]["wall_s"] / r2)
        if ca[0].get("preprocess_s") is not None:
            # the same without coffea's preprocessing (run 1 pays it, later runs find the
            # entry counts in the Runner's metadata cache): the part the column cache changes
            add("cacheaffinity run 1 / run 2 without coffea's preprocessing",
                (ca[0]["wall_s"] - ca[0]["preprocess_s"]) / (r2 - ca[1]["preprocess_s"]))
        for mode, rows in stable.items():
            if mode != "cacheaffinity" and len(rows) >= 2:
                add(f"{mode} run 2 / cacheaffinity run 2", rows[1]["wall_s"] / r2)
        nat = stable.get(NATIVE)
        if nat and len(nat) >= 3 and len(ca) >= 3:  # the peer coffea users have, once more warm
            add(f"{NATIVE} run 3 / cacheaffinity run 3", nat[2]["wall_s"] / ca[2]["wall_s"])
        if "direct" in stable:
            add("cacheaffinity run 1 / direct run 1", ca[0]["wall_s"] / stable["direct"][0]["wall_s"])
        if fb_med:
            add("cacheaffinity run 2 / floor (b) coffea-in-memory", r2 / fb_med)
        if fa_med:
            add("cacheaffinity run 2 / floor (a) processor-only", r2 / fa_med)
    out = {
        "repeats": len(doc["repeats"]),
        "modes": {m: {k: spread(v) for k, v in d.items()} for m, d in per_mode.items()},
        "floors": {"coffea-in-memory": spread(floors_b), "processor-only": spread(floors_a)},
        # MB the floor's workers read from block storage (none expected: buffers in memory)
        **({"floor_b_disk_read_MB": spread(floors_b_disk)} if floors_b_disk else {}),
        **({"floor_b_gc_full_share": spread(floors_b_gc)} if floors_b_gc else {}),
        "ratios": {k: spread(v) for k, v in ratios.items()},
    }
    if any(rp.get("new_process") for rp in doc["repeats"]):
        out["new_process"] = new_process_headline(doc)
    return out


def new_process_headline(doc: dict) -> dict:
    """The new-process runs' figures, median [min, max] over the repeats: per mode run-1
    and run-2 wall, coffea's preprocessing, uproot files the workers opened, the whole
    child process, and (cacheaffinity's executor, where it reports them) ``storage_opens``,
    ``files_preprocessed``, ``metadata_hits``, ``preprocess_ms``; ratios formed per repeat:
    every mode's run 2 / cacheaffinity's, every mode's new-process run 2 / its
    same-process run 2 (the same repeat)."""
    per_mode: dict[str, dict[str, list]] = {}
    ratios: dict[str, list] = {}
    for rp in doc["repeats"]:
        new = rp.get("new_process") or {}
        same = rp["sequences"].get("stable", {})
        for mode, rows in new.items():
            pm = per_mode.setdefault(mode, {})
            for i, r in enumerate(rows[:2], start=1):
                st = r.get("last_run_stats") or {}
                ms = st.get("preprocess_ms")
                for k, v in (("wall_s", r["wall_s"]), ("preprocess_s", r.get("preprocess_s")),
                             ("file_opens", r.get("file_opens")), ("hit_rate", r.get("hit_rate")),
                             ("process_s", (r.get("child") or {}).get("process_s")),
                             ("storage_opens", st.get("storage_opens")),
                             ("files_preprocessed", st.get("files_preprocessed")),
                             ("metadata_hits", st.get("metadata_hits")),
                             ("reported_preprocess_s", None if ms is None else ms / 1000)):  # fmt: skip
                    pm.setdefault(f"run{i}_{k}", []).append(v)
            if len(rows) >= 2 and len(same.get(mode) or []) >= 2:
                ratios.setdefault(f"{mode} new-process run 2 / same-process run 2", []).append(
                    rows[1]["wall_s"] / same[mode][1]["wall_s"])
        ca = new.get("cacheaffinity")
        if ca and len(ca) >= 2:
            for mode, rows in new.items():
                if mode != "cacheaffinity" and len(rows) >= 2:
                    ratios.setdefault(f"{mode} new-process run 2 / cacheaffinity new-process run 2",
                                      []).append(rows[1]["wall_s"] / ca[1]["wall_s"])  # fmt: skip
    return {
        "modes": {m: {k: spread(v) for k, v in d.items()} for m, d in per_mode.items()},
        "ratios": {k: spread(v) for k, v in ratios.items()},
    }


def _mb(b):
    return None if b is None else b / 1e6


def _progress_line(scenario: str, r: dict) -> str:
    hit = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}"
    return (
        f"[{scenario}] {r['mode']:22s} run {r['run']}: {r['wall_s']:7.2f} s, hit {hit}, "
        f"storage {r['storage_bytes'] / 1e6:.1f} MB"
        + ("" if r["origin_bytes"] is None else f", origin {r['origin_bytes'] / 1e6:.1f} MB")
        + (f"  ({r['event']})" if r["event"] else "")
    )


def evaluate_targets(doc: dict, cfg: Config) -> dict:
    """The issue's targets, each with the measured value and pass/fail (None: not measured).

    Wall-time targets use the headline's medians over the repeats; hit-rate targets use
    the first repeat (the membership scenario runs there only).
    """
    stable = doc["sequences"]["stable"]
    ratios = doc["headline"]["ratios"]
    w = cfg.workers
    out: dict[str, dict] = {}

    def target(name, value, limit, ok, note=""):
        out[name] = {"value": value, "limit": limit, "pass": None if value is None else ok, "note": note}

    def med(name):
        return (ratios.get(name) or {}).get("median")

    def rng(name):
        r = ratios.get(name) or {}
        return "" if r.get("min") is None else f"min {r['min']:.3g}, max {r['max']:.3g}, n {r['n']}"

    ca = stable.get("cacheaffinity")
    if ca and len(ca) >= 2:
        hr = ca[1]["hit_rate"]
        target("cacheaffinity run-2 hit rate (stable)", hr, ">= 0.99", hr is not None and hr >= 0.99)
        cr = ca[1].get("cache_rate")
        if cr is not None:
            target(
                "cacheaffinity run-2 served by caches (stable; own node + peer fetch)",
                cr, ">= 0.99", cr >= 0.99,
            )  # fmt: skip
        name = "cacheaffinity run 1 / run 2"
        v = med(name)
        target(name, v, ">= 5", v is not None and v >= 5, rng(name))
        for mode in stable:
            name = f"{mode} run 2 / cacheaffinity run 2"
            if name in ratios and mode == NATIVE:  # target: at least 2x faster than it
                v = med(name)
                target(name, v, f">= {NATIVE_TARGET:g}", v is not None and v >= NATIVE_TARGET,
                       rng(name))  # fmt: skip
            elif name in ratios:
                v = med(name)
                target(name, v, "> 1", v is not None and v > 1, rng(name))
        name = f"{NATIVE} run 3 / cacheaffinity run 3"
        if name in ratios:
            v = med(name)
            target(name, v, "reported", True, rng(name))
        name = "cacheaffinity run 1 / run 2 without coffea's preprocessing"
        if name in ratios:
            v = med(name)
            target(name, v, "reported", True, rng(name))
        name = "cacheaffinity run 2 / floor (b) coffea-in-memory"
        v = med(name)
        target(name, v, "<= 1.00", v is not None and v <= 1.00, rng(name))
        name = "cacheaffinity run 2 / floor (a) processor-only"
        v = med(name)
        target(name, v, "<= 1.6", v is not None and v <= 1.6, rng(name))
        name = "cacheaffinity run 1 / direct run 1"
        v = med(name)
        target(name, v, "<= 1.03", v is not None and v <= 1.03, rng(name))
        r1 = doc["headline"]["modes"]["cacheaffinity"]["run1_wall_s"]["median"]
        target("run 1 >= 60 s (full size)", r1, ">= 60", r1 >= 60)
        g = doc["headline"]["modes"]["cacheaffinity"].get("run2_gc_full_share") or {}
        if g.get("median") is not None:
            target(
                f"cacheaffinity run 2: full garbage collections per worker / wall "
                f"(worker.gc {cfg.worker_gc[0]})", g["median"], "<= 0.05", g["median"] <= 0.05,
                f"min {g['min']:.3g}, max {g['max']:.3g}, n {g['n']}",
            )  # fmt: skip
    new_process_targets(doc, target)
    dd = stable.get("dask-default+cache")
    if ca and dd and len(dd) >= 2 and len(ca) >= 2 and dd[1]["hit_rate"] is not None:
        target(
            "dask-default+cache run-2 hit rate below cacheaffinity's",
            dd[1]["hit_rate"], f"< {ca[1]['hit_rate']}",
            ca[1]["hit_rate"] is not None and dd[1]["hit_rate"] < ca[1]["hit_rate"],
            f"expected ~1/W = {1 / w:.3f}",
        )
    for mode, rows in doc["sequences"]["membership"].items():
        if len(rows) >= 4:
            limit3 = (1 - 1 / w) - 0.02
            h3 = rows[2]["hit_rate"]
            target(
                f"{mode} run-3 hit rate after a node was removed (W={w})", h3, f">= {limit3:.4f}",
                h3 is not None and h3 >= limit3,
                f"share of chunks on the removed node: {rows[2].get('removed_node_share')}",
            )
            limit4 = (1 - 1 / w) - 0.02  # W' + 1 = w nodes after the addition
            h4 = rows[3]["hit_rate"]
            target(
                f"{mode} run-4 hit rate after a node was added (W'={w - 1} -> {w})", h4,
                f">= {limit4:.4f}", h4 is not None and h4 >= limit4,
            )  # fmt: skip
    return out


def new_process_targets(doc: dict, target) -> None:
    """The new-process runs' targets (:data:`NEW_PROCESS_TARGETS` and cacheaffinity's run 2
    opening no file, in every repeat), each ``target(name, value, limit, ok, note)``."""
    h = (doc.get("headline") or {}).get("new_process")
    if not h:
        return
    opens = (h["modes"].get("cacheaffinity") or {}).get("run2_file_opens") or {}
    if opens.get("max") is not None:
        target("cacheaffinity new-process run 2: files opened (preprocessing included)", opens["max"],
               "== 0", opens["max"] == 0, f"most of any repeat; median {opens['median']:g}, n {opens['n']}")  # fmt: skip
    for name, (limit, ok) in NEW_PROCESS_TARGETS.items():
        r = h["ratios"].get(name) or {}
        if r.get("median") is not None:
            target(name, r["median"], limit, ok(r["median"]),
                   f"min {r['min']:.3g}, max {r['max']:.3g}, n {r['n']}")  # fmt: skip
    if doc.get("identical_across_processes") is not None:
        v = doc["identical_across_processes"]
        target("results identical in same-process and new-process runs", float(v), "== 1", v)


# ----------------------------------------------------------------------------- output


def headline_rows(doc: dict) -> list[dict]:
    """The headline table: per mode, median [min, max] over the repeats."""
    h = doc["headline"]
    rows = []

    def fmt(s, unit="", pct=False):
        if not s or s.get("median") is None:
            return None
        f = (lambda v: f"{v:.1%}") if pct else (lambda v: f"{v:.3g}")
        if s["n"] > 1 and s["min"] != s["max"]:
            return f"{f(s['median'])} [{f(s['min'])}-{f(s['max'])}]{unit}"
        return f"{f(s['median'])}{unit}"

    for mode, m in h["modes"].items():
        rows.append({
            "mode": mode,
            "run 1 [s]": fmt(m["run1_wall_s"]),
            "run 2 [s]": fmt(m["run2_wall_s"]),
            "run 2 decompr. MB": fmt(m["run2_decompressed_MB"]),
            "run 2 origin MB": fmt(m["run2_origin_MB"]),
            "run 2 hit rate": fmt(m["run2_hit_rate"], pct=True),
            "run 2 served by caches": fmt(m.get("run2_cache_rate") or {}, pct=True),
            "run 2 full GC / wall": fmt(m.get("run2_gc_full_share") or {}, pct=True),
        })  # fmt: skip
    for name, s in h["floors"].items():
        gc_share = h.get("floor_b_gc_full_share") if name == "coffea-in-memory" else None
        rows.append({"mode": f"floor: {name}", "run 2 [s]": fmt(s),
                     "run 2 decompr. MB": "0" if s.get("median") is not None else None,
                     "run 2 full GC / wall": fmt(gc_share or {}, pct=True)})  # fmt: skip
    return rows


def new_process_rows(doc: dict) -> list[dict]:
    """The new-process table: per mode, median [min, max] over the repeats."""
    h = (doc.get("headline") or {}).get("new_process") or {}
    rows = []

    def fmt(s):
        if not s or s.get("median") is None:
            return None
        if s["n"] > 1 and s["min"] != s["max"]:
            return f"{s['median']:.3g} [{s['min']:.3g}-{s['max']:.3g}]"
        return f"{s['median']:.3g}"

    for mode, m in h.get("modes", {}).items():
        rows.append({
            "mode": mode,
            "run 1 [s]": fmt(m.get("run1_wall_s")),
            "run 2 [s]": fmt(m.get("run2_wall_s")),
            "run 2 / same-process run 2": fmt(h["ratios"].get(f"{mode} new-process run 2 / same-process run 2")),
            "run 2 files opened": fmt(m.get("run2_file_opens")),
            "run 2 preprocessing [s]": fmt(m.get("run2_preprocess_s")),
            "run 2 storage_opens (executor)": fmt(m.get("run2_storage_opens")),
            "process [s]": fmt(m.get("run2_process_s")),
        })  # fmt: skip
    return rows


def worker_gc_rows(doc: dict) -> list[dict]:
    """Side by side per ``worker.gc`` setting (``--worker-gc`` with several): per mode,
    run-2 wall and full collections' share of it (median [min, max] over the repeats)."""
    rows = []
    for g, d in (doc.get("worker_gc") or {}).items():
        h = d["headline"]
        for mode, m in h["modes"].items():
            w, s = m["run2_wall_s"], m.get("run2_gc_full_share") or {}
            rows.append({
                "worker.gc": g, "mode": mode,
                "run 2 [s]": None if w["median"] is None else f"{w['median']:.3g}",
                "run 2 full GC / wall": None if s.get("median") is None else
                f"{s['median']:.1%} [{s['min']:.1%}-{s['max']:.1%}]",
            })  # fmt: skip
        fb = h["floors"].get("coffea-in-memory") or {}
        s = h.get("floor_b_gc_full_share") or {}
        rows.append({
            "worker.gc": g, "mode": "floor: coffea-in-memory",
            "run 2 [s]": None if fb.get("median") is None else f"{fb['median']:.3g}",
            "run 2 full GC / wall": None if s.get("median") is None else
            f"{s['median']:.1%} [{s['min']:.1%}-{s['max']:.1%}]",
        })  # fmt: skip
    return rows


def table_rows(doc: dict) -> list[dict]:
    """One row per repeat, scenario, mode and run, for :func:`benchmarks._common.print_table`."""
    rows = []
    for rp in doc.get("repeats") or [{"sequences": doc["sequences"]}]:
        seqs = dict(rp["sequences"])
        if rp.get("new_process"):
            seqs["stable, new process"] = rp["new_process"]
        for scenario, modes in seqs.items():
            for mode, runs in modes.items():
                for r in runs:
                    rows.append(
                        {
                            "rep": r.get("repeat", 1),
                            "scenario": scenario,
                            "mode": mode,
                            "run": r["run"],
                            "nodes": r["nodes"],
                            "wall [s]": r["wall_s"],
                            "storage MB": r["storage_bytes"] / 1e6,
                            "origin MB": None if r["origin_bytes"] is None else r["origin_bytes"] / 1e6,
                            "decompr. MB": None
                            if r["decompressed_bytes"] is None
                            else r["decompressed_bytes"] / 1e6,
                            "hit rate": None if r["hit_rate"] is None else f"{r['hit_rate']:.1%}",
                            "steals": r["steals"],
                            "on pref.": None
                            if r["on_preferred"] is None
                            else f"{r['on_preferred']:.1%}",
                        }
                    )
    return rows


def plot(doc: dict, title: str = ""):
    """Fig.-3 style: per mode, bars = data read from storage per run, points = wall time;
    bottom panel: hit rate per run.  Returns the matplotlib figure."""
    plt = pyplot()
    stable = doc["sequences"]["stable"]
    membership = doc["sequences"].get("membership") or {}
    panels = [(f"{m}", rows) for m, rows in stable.items()] + [
        (f"{m}\n(node -1 before run 3, +1 before 4)", rows) for m, rows in membership.items()
    ]
    if not panels:  # --processes new alone
        panels = [(f"{m}\n(new process per run)", rows) for m, rows in (doc.get("new_process") or {}).items()]
    n = len(panels)
    fig, axes = plt.subplots(2, n, figsize=(3.1 * n, 6), squeeze=False, sharex="col",
                             gridspec_kw={"height_ratios": [2, 1]})  # fmt: skip
    wmax = max(r["wall_s"] for _, rows in panels for r in rows)
    use_origin = all(r["origin_bytes"] is not None for _, rows in panels for r in rows)
    key = "origin_bytes" if use_origin else "storage_bytes"
    bmax = max(max(r[key] for _, rows in panels for r in rows), 1) / 1e6
    for i, (name, rows) in enumerate(panels):
        ax, axh = axes[0][i], axes[1][i]
        runs = [r["run"] for r in rows]
        ax.bar(runs, [r[key] / 1e6 for r in rows], color="C0", alpha=0.6)
        ax.set_ylim(0, bmax * 1.15)
        ax.set_title(name, fontsize=9)
        if i == 0:
            ax.set_ylabel(("origin" if use_origin else "storage") + " MB read (bars)", color="C0")
        tw = ax.twinx()
        tw.plot(runs, [r["wall_s"] for r in rows], "o-", color="C3")
        tw.set_ylim(0, wmax * 1.15)
        if i == n - 1:
            tw.set_ylabel("wall time [s] (points)", color="C3")
        else:
            tw.set_yticklabels([])
        hr = [None if r["hit_rate"] is None else 100 * r["hit_rate"] for r in rows]
        if any(h is not None for h in hr):
            axh.bar(runs, [h or 0 for h in hr], color="C2")
        else:
            axh.text(0.5, 0.5, "no column cache", ha="center", va="center", transform=axh.transAxes)
        axh.set_ylim(0, 105)
        axh.set_xlabel("run")
        axh.set_xticks(runs)
        if i == 0:
            axh.set_ylabel("hit rate [%]")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def print_targets(targets: dict) -> None:
    print()
    for name, t in targets.items():
        v = t["value"]
        vs = "-" if v is None else f"{v:.4g}"
        verdict = {True: "PASS", False: "MISS", None: "n/a"}[t["pass"]]
        print(f"{verdict:4s}  {name}: {vs} ({t['limit']}) {t['note']}")


def parse_args(argv=None) -> tuple[Config, str]:
    d = Config()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=d.workers,
                   help="W cache nodes (with --per-node 1, the default: W worker processes)")
    p.add_argument("--per-node", type=int, default=d.per_node,
                   help="worker processes per cache node, sharing its directory (the facility node "
                   "shape: --workers 2 --per-node 2 is 2 nodes x 2 processes)")
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
        processes=a.processes, per_node=a.per_node,
    )  # fmt: skip
    return cfg, a.out


def _processes(text: str) -> tuple[str, ...]:
    got = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    if not got or any(x not in PROCESSES for x in got):
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of same, new")
    return got


def analysis_branches(analysis: str = "realistic", template: str | None = None) -> tuple[str, ...]:
    """The branches ``analysis`` reads from the template, plus the kinematics (pt, eta, phi,
    mass, charge) NanoEvents' behaviours need for each collection read: ``--branches`` for
    small generated datasets that hold only what the analysis reads (tests, notebook)."""
    import uproot

    from benchmarks._common import template_path

    path = template or template_path()
    read = branches_read(ANALYSES[analysis][0](), path)
    colls = {b.split("_")[0] for b in read if "_" in b}
    with uproot.open(path) as f:
        names = set(f["Events"].keys())
    kin = {f"{c}_{k}" for c in colls for k in ("pt", "eta", "phi", "mass", "charge")}
    return tuple(sorted(set(read) | (kin & names)))


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
