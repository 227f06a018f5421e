"""One coffea run of the benchmarks' analyses, and the comparison of its result.

Shared by the scripts that run the analyses on a cluster (consecutive_runs, beyond_capacity,
warm_run_profile, soak) and by the new-process child (:mod:`benchmarks._new_process_run`):

- :data:`ANALYSES`: the analyses (processor class, summary function);
- :data:`MODES` (and :data:`CACHED`, :data:`NATIVE`, :data:`COLUMN_CACHED`): the ways a run is
  executed, each on a cluster of its own (:class:`benchmarks._clusters.ModeCluster`);
- :class:`Config`: what a mode cluster and its runs are given (the consecutive runs' command
  line, which the other scripts fill from theirs);
- :func:`make_executor`, :func:`runner_options`, :func:`client_run`: one run's client side;
- :func:`reference`: the analysis once with coffea's ``IterativeExecutor`` (the truth);
- :func:`normalized` and :func:`digest`: a result as JSON gives it back, and its digest (the
  comparison of results across modes, runs and processes);
- :func:`analysis_branches`: the branches an analysis reads (small generated datasets).

Importing it sets what every worker process started from here inherits: the repository on
``PYTHONPATH`` and coffea's NanoAODSchema warnings off.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil
import sys
import time
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

from coffea import processor  # noqa: E402
from coffea.nanoevents import NanoAODSchema  # noqa: E402

import cacheaffinity  # noqa: E402
from benchmarks import _native  # noqa: E402
from benchmarks._common import make_dataset  # noqa: E402
from examples import analysis as light_analysis  # noqa: E402
from examples import realistic as realistic_analysis  # noqa: E402
from examples.realistic import branches_read  # noqa: E402

__all__ = [
    "ANALYSES",
    "CACHED",
    "COLUMN_CACHED",
    "COUNTERS",
    "Config",
    "MODES",
    "NATIVE",
    "analysis_branches",
    "client_run",
    "digest",
    "make_executor",
    "normalized",
    "prepare_data",
    "reference",
    "runner_options",
    "uproot_options",
]

MODES = ("direct", "dask-default+cache", "coffea-affinity+cache", "coffea-native", "xcache",
         "cacheaffinity")
#: modes with cacheaffinity's column cache (worker plugin, :func:`cacheaffinity.cache_totals`)
CACHED = ("dask-default+cache", "coffea-affinity+cache", "cacheaffinity")
#: coffea's own BufferCache (:mod:`benchmarks._native`)
NATIVE = "coffea-native"
#: modes with a column cache of any kind (their run 2 should decompress less than run 1)
COLUMN_CACHED = (*CACHED, NATIVE)
COUNTERS = ("hits", "misses", "bytes_written", "storage_bytes", "storage_opens", "peer_hits", "peer_bytes")
#: where a run's client side lives (``--processes``): this process, or a new one per run
PROCESSES = ("same", "new")
#: ``cacheaffinity.worker.admission`` settings a run can take (``Config.admission``)
ADMISSIONS = ("rank", "fifo")
#: analysis name -> (processor class, summary function)
ANALYSES = {
    "realistic": (realistic_analysis.TTbarLikeProcessor, realistic_analysis.summary),
    "light": (light_analysis.DimuonJetProcessor, light_analysis.summary),
}
DEFAULT_DATA = ROOT / ".bench-data" / "consecutive_runs"

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
    #: nodes): the facility node shape (:func:`benchmarks._clusters.node_cluster`); 1 is a process per node
    per_node: int = 1
    #: packs of other data each cache node holds before run 1, as a facility node's cache
    #: does after earlier work (index rows and data files in the store's format:
    #: :func:`benchmarks.store_scale.build`); the cached modes sharing our store only
    other_packs: int = 0
    #: ``cacheaffinity.worker.admission`` in every cached mode's workers (None: the default)
    admission: str | None = None

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
        if self.other_packs < 0:
            raise ValueError(f"other_packs={self.other_packs}: need >= 0 packs of other data per node")
        if self.admission not in (None, *ADMISSIONS):
            raise ValueError(f"admission={self.admission!r}: choose from {', '.join(ADMISSIONS)}")
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


def uproot_options(xrootd: bool) -> dict:
    """uproot's options for the storage: XRootD's handler for ``root://`` URLs, else none."""
    if not xrootd:
        return {}
    import uproot

    return {"handler": uproot.XRootDSource}


def delta(before: int | None, after: int | None) -> int | None:
    """``after - before`` of a counter, None if either reading is unavailable."""
    return None if before is None or after is None else after - before


def chunks(files: list[str], chunksize: int) -> list[tuple[str, int, int]]:
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


def digest(summary: Any) -> str:
    """The SHA-256 of ``summary`` as JSON (sorted keys): equal results, equal digests."""
    return hashlib.sha256(json.dumps(summary, sort_keys=True, default=str).encode()).hexdigest()


def reference(proc_cls, summary, fileset: dict, chunksize: int) -> dict:
    """The analysis (``proc_cls``, ``summary``) once with coffea's ``IterativeExecutor`` in
    this process (the comparison's truth): ``{"wall_s", "cpu_s", "summary"}``, the summary
    :func:`normalized`."""
    import io

    runner = processor.Runner(executor=processor.IterativeExecutor(status=False), schema=NanoAODSchema,
                              chunksize=chunksize, metadata_cache={})  # fmt: skip
    t0, c0 = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):  # its progress bars (status=False shows them)
        out = runner(fileset, processor_instance=proc_cls(), treename="Events")
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"wall_s": wall, "cpu_s": cpu, "summary": normalized(summary(out))}


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
