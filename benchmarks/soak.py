"""A soak: hundreds of runs on one long-lived cluster, and nothing grows.

One cluster lives for the whole soak: a scheduler with the cacheaffinity plugin in a
process of its own (so that its RSS is the scheduler's alone, not this client's), and W
worker processes under nannies in this process, as ``LocalCluster`` makes them (1 thread
each, worker names 0..W-1, each its own cache directory ``node-{name}`` with a capacity
small enough that the caches evict).  A deterministic schedule (``--seed``) of N runs
(``--runs``) mixes:

* three analyses: ``light`` (:class:`examples.analysis.DimuonJetProcessor`, ~10 branches),
  ``realistic`` (:class:`examples.realistic.TTbarLikeProcessor`, ~180 branches) and
  ``other`` (:class:`OtherColumnsProcessor`: collections neither of the others reads:
  generator jets and dressed leptons, isolated tracks, secondary vertices, soft-activity
  jets, FSR photons, track and calorimeter MET), over two generated NanoAOD-like LZMA
  datasets (:func:`testbed.synthetic.make_dataset`, different seeds and sizes, holding
  the branches the three analyses read);
* two users, ``alice`` and ``bob``, each with a ``distributed.Client`` and executor of
  their own (a session: each keeps coffea's metadata cache), now and then running at the
  same time (two threads);
* one chunksize change (``--chunksize`` to ``--chunksize-after``, at ``--chunksize-change-at``,
  default half way);
* a worker killed (``SIGKILL`` of the worker process, during the run) every
  ``--kill-every`` runs: its nanny starts a new one with the same name, hence the same
  cache directory;
* the cluster scaled down by one worker (``cluster.scale``) every ``--scale-every`` runs and
  back up ``--scaled-down-runs`` runs later (the worker comes back under the same name,
  with the same cache directory);
* a new-process client every ``--new-process-every`` runs: a ``sys.executable`` process
  (this script, ``--child``) that connects to the scheduler and runs the analysis, with
  nothing inherited (as :mod:`benchmarks._new_process_run`).

Every run's result is compared with its reference, coffea's ``IterativeExecutor`` in this
process, computed once per (analysis, dataset, chunksize) before the soak: ``wrong_results``
counts mismatches; a run that does not end within ``--timeout`` seconds counts in
``hung_runs`` (its client is abandoned, the user gets a new one, the soak goes on); a run
that raises, in ``failed_runs``.

After every step (one run, or two at once) the soak waits until the scheduler holds no task
and the workers have stored their queued cache writes, then samples:

* the scheduler process's RSS (and of it anonymous and file-backed memory), open file
  descriptors and threads, and the length of every container (dict, list, set, deque, ...)
  reachable from the cacheaffinity scheduler plugin through cacheaffinity objects
  (``plugin.locator.holder``, ``plugin.runs.task_run``, ``plugin.stealing.warm_cost.learned``
  ...; walked generically, so new structures are included; a dict of containers also gives
  ``name[*]``, the sum of their lengths) and of the module-level containers and
  ``functools`` caches of the loaded ``cacheaffinity`` modules (``module.*``); the same of
  Dask's own scheduler structures (``dask.*``: tasks, task groups and prefixes, clients,
  event topics, the connection pool, the stealing extension);
* each worker's RSS (anonymous, file-backed), open file descriptors (``/proc/<pid>/fd``)
  and threads, its cacheaffinity worker plugin's containers and its modules' (the same
  walk), its connection pool, and its cache counters (bytes, entries, evictions);
* per cache directory: the SQLite index files' bytes (the WAL among them), data file bytes
  (in whole blocks, as the cache accounts them) against the capacity, every byte of the
  directory;
* log records since the last sample: lines the scheduler process wrote (its log file;
  ``distributed`` and ``cacheaffinity`` at INFO), records of the ``distributed`` and
  ``cacheaffinity`` loggers the workers emitted (a counting handler, installed by a
  worker plugin, so restarted workers count too; workers log at WARNING as under
  ``LocalCluster``, cacheaffinity at INFO) and in this process;
* per run: wall time, hit rate (``hits / (hits + misses)`` of the run's own figures,
  :func:`cacheaffinity.run_stats`: columns served from the node's packs, those fetched
  from a peer's included) and ``peer_hits`` (column parts fetched from peers).

Derived figures (top level of the JSON):

``scheduler_rss_mb_per_100_runs``
    least-squares slope of the scheduler's RSS (MB) over the run count, samples after the
    warm-up (``--warmup`` runs), x 100 (``scheduler_anon_mb_per_100_runs``: of its
    anonymous memory);
``worker_rss_mb_per_100_runs``
    the same per worker slot (worker name), maximum over the slots.  A slot's series is
    cut into segments at every new process (killed and restarted, or scaled down and up);
    a new process's samples count once it has lived ``--restart-warmup`` runs (its
    imports, first chunks, first connections), and the slope is the pooled within-segment
    one (one slope, an intercept per segment), so the drop at a restart is not read as
    shrinking nor the new process's climb as growth between processes
    (``worker_anon_mb_per_100_runs``, ``worker_file_mb_per_100_runs``: of anonymous and
    file-backed memory);
``fd_growth``, ``thread_growth``
    per slot, the sum over its segments (as above, after the warm-up) of last minus first
    sample: what its worker processes gained while they lived; maximum over the slots
    (``scheduler_fd_growth``, ``scheduler_thread_growth``: the scheduler's, last minus
    first after the warm-up).  ``fd_net_growth``, ``thread_net_growth``: the same net of
    the pools (descriptors less pooled connections, threads less those of on-demand
    thread pools: :func:`_pools`).  ``fd_late_growth``, ``thread_late_growth``,
    ``fd_net_late_growth``, ``thread_net_late_growth`` (and the scheduler's): how much
    the last sample exceeds every earlier one before the last third of the runs after the
    warm-up, maximum over the slots: > 0 only while still growing at the end.
    :func:`check_bounds` asserts the net late growth: a worker opens a pooled connection
    or two per peer when it first fetches from it and asyncio's executor starts threads
    as concurrent peer requests come, a few more once, which last-minus-first counts;
``plugin_state_growth`` / ``plugin_state_growth_by_structure``
    per structure of the scheduler plugin (``plugin.*``) and its modules (``module.*``),
    last minus first after the warm-up (with its slope per 100 runs, first, last, maximum,
    late growth, cap: a deque's ``maxlen``); the maximum over the structures;
    ``worker_plugin_state_growth_by_structure`` and ``dask_state_growth_by_structure``
    likewise (worker structures by slot and segment, as the RSS);
``series``
    every sample, one list per figure (:func:`columnar`); the runs, one row each, are
    ``results.runs``;
``cache_over_capacity``
    samples (node x step) in which a cache directory's data files held more than its
    capacity (``evictions``: the caches' evictions in all); ``phases``: hit rates between
    events (kills, scalings, the chunksize change); ``log_per_step``: log lines and
    records per step; ``bounds``: what :func:`check_bounds` finds violated (empty: all
    held).

    python benchmarks/soak.py --runs 300                 # the full soak (~30-40 min here)
    python benchmarks/soak.py --runs 40 --name soak_40   # a small one
    python benchmarks/soak.py --quick                    # 12 runs, tiny data

Prints a summary table, writes ``benchmarks/results/<name>.json`` (``soak`` by default)
and ``.png``.  Exits 1 if a bound of :func:`check_bounds` is violated (wrong, hung or failed
runs, descriptors or threads still growing, a cache over its capacity, a plugin structure
beyond its bound), else 0.  The 300-run soak wants the machine to itself: other load
stretches every run (the timeout is generous) but changes no bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
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

import awkward as ak  # noqa: E402
import cloudpickle  # noqa: E402
import dask  # noqa: E402
import hist  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402
from coffea import processor  # noqa: E402
from coffea.nanoevents import NanoAODSchema  # noqa: E402
from distributed import Client, Nanny, SpecCluster  # noqa: E402
from distributed.deploy.spec import ProcessInterface  # noqa: E402
from distributed.diagnostics.plugin import WorkerPlugin  # noqa: E402

import cacheaffinity  # noqa: E402
from cacheaffinity.worker._directory import DATA_DIR  # noqa: E402
from cacheaffinity.worker._forms import FormStore  # noqa: E402
from benchmarks._nodes import node_names  # noqa: E402
from benchmarks._common import (  # noqa: E402
    DEFAULT_OUT,
    make_dataset,
    not_measured,
    print_table,
    pyplot,
    read_results,
    save_png,
    template_path,
    write_json,
)
from examples import analysis as light_analysis  # noqa: E402
from examples import realistic as realistic_analysis  # noqa: E402

if __name__ != "__main__":
    # The probes below run in the scheduler and the workers: sent by value, so that the
    # scheduler never imports this module (and with it coffea: ~100 MB of its RSS).
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

__all__ = [
    "ANALYSES",
    "Config",
    "OtherColumnsProcessor",
    "analyse",
    "check_bounds",
    "make_schedule",
    "plot",
    "prepare_datasets",
    "run_soak",
    "summary_rows",
]

DEFAULT_DATA = ROOT / ".bench-data" / "soak"
USERS = ("alice", "bob")
LOGGERS = ("distributed", "cacheaffinity")
#: cache directory files of the SQLite index (``cacheaffinity.worker._store.layout``)
INDEX_FILES = ("columns.sqlite3", "columns.sqlite3-wal", "columns.sqlite3-shm")
BLOCK = 4096


# ----------------------------------------------------------------------------- analyses


class OtherColumnsProcessor(processor.ProcessorABC):
    """Collections neither the light nor the realistic analysis reads: generator jets and
    dressed leptons, isolated tracks, secondary vertices, soft-activity jets, FSR photons,
    track and calorimeter MET.  Integer histograms and counts only (exact whatever the
    order chunks are added in)."""

    def process(self, events):
        dataset = events.metadata["dataset"]
        gj = events.GenJet
        gj = gj[(gj.pt > 20) & (np.abs(gj.eta) < 4.7)]
        dl = events.GenDressedLepton
        trk = events.IsoTrack
        iso = trk[(trk.pt > 5) & (trk.pfRelIso03_all < 0.2)]
        sv = events.SV
        good_sv = sv[(sv.dlenSig > 3) & (sv.ndof > 0) & (np.abs(sv.z) < 30)]
        soft = events.SoftActivityJet
        fsr = events.FsrPhoton
        h_ngen = hist.Hist.new.Integer(0, 20, name="n", label="generator jets").Int64()
        h_ngen.fill(n=ak.to_numpy(ak.num(gj)))
        h_flav = hist.Hist.new.Integer(-1, 6, name="flav", label="hadron flavour").Int64()
        h_flav.fill(flav=ak.to_numpy(ak.flatten(gj.hadronFlavour)))
        h_lep = hist.Hist.new.IntCategory([-15, -13, -11, 11, 13, 15], name="pdg").Int64()
        h_lep.fill(pdg=ak.to_numpy(ak.flatten(dl.pdgId)))
        h_trk = hist.Hist.new.Reg(40, 0, 200, name="pt", label="isolated track pT").Int64()
        h_trk.fill(pt=ak.to_numpy(ak.flatten(iso.pt)))
        h_sv = hist.Hist.new.Reg(30, 0, 6, name="m", label="SV mass").Reg(20, 0, 2, name="r", label="SV r").Int64()
        h_sv.fill(m=ak.to_numpy(ak.flatten(good_sv.mass)), r=ak.to_numpy(ak.flatten(np.hypot(good_sv.x, good_sv.y))))
        h_soft = hist.Hist.new.Reg(25, 0, 250, name="pt", label="soft-activity jet pT").Int64()
        h_soft.fill(pt=ak.to_numpy(ak.flatten(soft.pt)))
        h_met = hist.Hist.new.Reg(30, 0, 300, name="tk", label="TkMET").Reg(
            30, 0, 300, name="calo", label="CaloMET"
        ).Int64()
        h_met.fill(tk=ak.to_numpy(events.TkMET.pt), calo=ak.to_numpy(events.CaloMET.pt))
        return {
            dataset: {
                "entries": len(events),
                "ngen": h_ngen,
                "flavour": h_flav,
                "lepton_pdg": h_lep,
                "isotrack_pt": h_trk,
                "sv_mass": h_sv,
                "soft_pt": h_soft,
                "met": h_met,
                "fsr_photons": int(ak.sum(ak.num(fsr[fsr.pt > 2]))),
                "sv_tracks": int(ak.sum(sv.ndof > 0)),
            }
        }

    def postprocess(self, accumulator):
        return accumulator


def other_summary(out: dict) -> dict:
    """Comparable plain-Python summary of :class:`OtherColumnsProcessor`'s output."""
    result = {}
    for dataset, d in sorted(out.items()):
        result[dataset] = {
            k: (np.asarray(v.view(flow=True)).tolist() if isinstance(v, hist.Hist) else v)
            for k, v in sorted(d.items())
        }
    return result


#: name -> (processor class, summary function)
ANALYSES = {
    "light": (light_analysis.DimuonJetProcessor, light_analysis.summary),
    "realistic": (realistic_analysis.TTbarLikeProcessor, realistic_analysis.summary),
    "other": (OtherColumnsProcessor, other_summary),
}
#: how often each analysis is drawn
ANALYSIS_WEIGHTS = {"light": 0.4, "realistic": 0.35, "other": 0.25}


def normalized(summary: Any) -> Any:
    """``summary`` as JSON gives it back (what a new-process run hands its parent)."""
    return json.loads(json.dumps(summary, sort_keys=True, default=str))


# ----------------------------------------------------------------------------- config


@dataclasses.dataclass
class Config:
    """What to run (the command-line options, see ``--help``)."""

    runs: int = 300
    #: cache nodes (with ``per_node`` 1, the default: worker processes)
    workers: int = 4
    #: worker processes per cache node, sharing its directory (the facility node shape,
    #: :mod:`benchmarks._nodes`; names ``"<node>-<process>"``)
    per_node: int = 1
    seed: int = 36
    #: dataset name -> (events, files, generator seed)
    datasets: dict = dataclasses.field(
        default_factory=lambda: {"dy": [6000, 3, 101], "tt": [4000, 2, 202]}
    )
    basket_events: int = 250
    chunksize: int = 500
    chunksize_after: int = 300
    #: the run before which the chunksize changes (None: half way)
    chunksize_change_at: int | None = None
    #: node cache capacity (each node)
    capacity: str = "16 MiB"
    kill_every: int = 25
    scale_every: int = 40
    scaled_down_runs: int = 5
    new_process_every: int = 10
    #: share of steps in which both users run at once
    concurrent_share: float = 0.15
    #: seconds a run may take before it counts as hung
    timeout: float = 240.0
    warmup: int = 20
    #: runs a new worker process (killed and restarted, scaled up) lives before it counts
    restart_warmup: int = 10
    #: Dask's statistical profiler in the workers (``distributed.worker.profile.enabled``,
    #: on by default: a profile per second, ``profile_history`` of them, tens of MB per
    #: worker here)
    profiler: bool = True
    #: profiles (1 s cycles) a worker keeps, ``distributed.admin.low-level-log-length``
    #: (Dask's default 1000: ~17 min, longer than a worker lives in the soak, so its RSS
    #: would grow all its life; None: Dask's default)
    profile_history: int | None = 60
    data: str = str(DEFAULT_DATA)
    workdir: str | None = None
    progress: bool = True

    def change_at(self) -> int:
        return self.chunksize_change_at if self.chunksize_change_at is not None else self.runs // 2 + 1

    def processes(self) -> int:
        return self.workers * self.per_node

    def check(self) -> None:
        if self.per_node < 1:
            raise ValueError(f"per_node={self.per_node}: need >= 1 worker process per node")
        if self.per_node > 1 and self.scale_every:
            raise ValueError(f"per_node={self.per_node}: scaling removes and adds single worker processes "
                             "of no node; give --scale-every 0 with --per-node")
        if self.workers < 2 and self.scale_every:
            raise ValueError(f"workers={self.workers}: need >= 2 (one is scaled away)")
        if self.runs < 2:
            raise ValueError(f"runs={self.runs}: need >= 2")
        if not 0 <= self.concurrent_share <= 1:
            raise ValueError(f"concurrent_share={self.concurrent_share}: a share in [0, 1]")
        if len(self.datasets) < 1:
            raise ValueError("no dataset")


# ----------------------------------------------------------------------------- data


def analysis_branches(template: str | None = None) -> list[str]:
    """The branches the three analyses read from the template, plus the kinematics
    NanoEvents' behaviours need for each collection read (the datasets hold these only:
    coffea builds a file's form for every chunk, so fewer branches keep runs short)."""
    import uproot

    path = template or template_path()
    read: set[str] = set()
    for proc_cls, _ in ANALYSES.values():
        read |= set(realistic_analysis.branches_read(proc_cls(), path))
    colls = {b.split("_")[0] for b in read if "_" in b}
    with uproot.open(path) as f:
        names = set(f["Events"].keys())
    kin = {f"{c}_{k}" for c in colls for k in ("pt", "eta", "phi", "mass", "charge")}
    return sorted(read | (kin & names))


def prepare_datasets(cfg: Config) -> dict[str, list[str]]:
    """``{name: files}`` of the soak's datasets (LZMA, the branches of
    :func:`analysis_branches`), generated once per parameters and reused."""
    branches = analysis_branches()
    out = {}
    for name, (events, files, seed) in sorted(cfg.datasets.items()):
        d = Path(cfg.data) / f"{name}-{events}ev-{files}f-seed{seed}-b{cfg.basket_events}"
        stamp = d / "params.json"
        params = {"events": events, "files": files, "seed": seed, "basket_events": cfg.basket_events,
                  "branches": branches}  # fmt: skip
        if not stamp.exists() or json.loads(stamp.read_text()) != params:
            shutil.rmtree(d, ignore_errors=True)
            make_dataset(
                d, events=events, files=files, codec="lzma", seed=seed, branches=branches,
                basket_events=cfg.basket_events, progress=cfg.progress,
            )  # fmt: skip
            stamp.write_text(json.dumps(params))
        out[name] = sorted(str(f) for f in d.glob("nano_*.root"))
    return out


def chunk_ids(files: dict[str, list[str]]) -> int:
    """Chunk ids the soak's runs can place: every placement stripe of every file
    (:func:`cacheaffinity.coffea._identity.default_stripe_entries`, whatever the chunksize)
    and one preprocessing id per file: what bounds the locator's ``holder``."""
    import uproot

    from cacheaffinity.coffea._identity import default_stripe_entries

    n = 0
    for fs in files.values():
        for f in fs:
            with uproot.open(f) as rf:
                entries = rf["Events"].num_entries
            n += -(-entries // default_stripe_entries(entries)) + 1
    return n


# ----------------------------------------------------------------------------- schedule


@dataclasses.dataclass
class RunSpec:
    run: int
    user: str
    analysis: str
    dataset: str
    chunksize: int
    process: str = "same"  # or "new"


@dataclasses.dataclass
class Step:
    step: int
    runs: list[RunSpec]
    #: before the step: "scale-down", "scale-up", "chunksize"
    events: list[str] = dataclasses.field(default_factory=list)
    #: kill a worker during the step: (slot index among the live workers, n: it dies when
    #: starting its n-th task of the step)
    kill: tuple[int, float] | None = None

    def describe(self) -> str:
        ev = list(self.events) + (["kill"] if self.kill else [])
        return ",".join(ev)


def make_schedule(cfg: Config) -> list[Step]:
    """The soak's steps: deterministic for ``cfg.seed`` (and the other settings).

    The first runs are a tour of every (analysis, dataset) pair, and the first runs after
    the chunksize change one of every dataset, so that every chunk the workload has is
    placed early (structures per chunk stop growing then); the rest are drawn at random
    (analysis by :data:`ANALYSIS_WEIGHTS`, dataset and user uniformly, ``alice`` 60 %),
    with a kill's run on the largest dataset (every worker gets tasks)."""
    rng = random.Random(cfg.seed)
    names = sorted(cfg.datasets)
    analyses = list(ANALYSIS_WEIGHTS)
    weights = [ANALYSIS_WEIGHTS[a] for a in analyses]
    change = cfg.change_at()
    down_at = set(range(cfg.scale_every, cfg.runs + 1, cfg.scale_every)) if cfg.scale_every else set()
    up_at = {r + max(1, cfg.scaled_down_runs) for r in down_at}
    kills = set(range(cfg.kill_every, cfg.runs + 1, cfg.kill_every)) if cfg.kill_every else set()
    news = set(range(cfg.new_process_every, cfg.runs + 1, cfg.new_process_every)) if cfg.new_process_every else set()
    largest = max(names, key=lambda n: cfg.datasets[n][0])
    tour = [(a, d) for a in analyses for d in names]
    rng.shuffle(tour)
    tours = {r: pair for r, pair in enumerate(tour, start=1)}
    tours.update({change + i: (None, d) for i, d in enumerate(names)})
    steps: list[Step] = []
    r = 1
    while r <= cfg.runs:
        def spec(run: int, user: str) -> RunSpec:
            analysis, dataset = tours.get(run, (None, None))
            return RunSpec(
                run=run, user=user, analysis=analysis or rng.choices(analyses, weights)[0],
                dataset=dataset or rng.choice(names), chunksize=cfg.chunksize if run < change else cfg.chunksize_after,
                process="new" if run in news else "same",
            )  # fmt: skip

        events = []
        if r in down_at:
            events.append("scale-down")
        if r in up_at:
            events.append("scale-up")
        if r == change:
            events.append("chunksize")
        # two runs at once: neither a kill, a new process or an event before the second
        nxt = r + 1
        pair = (
            nxt <= cfg.runs and rng.random() < cfg.concurrent_share
            and not ({r, nxt} & (kills | news)) and nxt not in down_at | up_at and nxt != change
        )  # fmt: skip
        if pair:
            runs = [spec(r, "alice"), spec(nxt, "bob")]
        else:
            runs = [spec(r, rng.choices(USERS, (0.6, 0.4))[0])]
        kill = None
        if r in kills:  # the victim dies when it starts its 1st or 2nd task of the run
            kill = (rng.randrange(cfg.processes()), rng.randint(1, 2))
            if r not in tours:
                runs[0].dataset = largest
        steps.append(Step(step=len(steps) + 1, runs=runs, events=events, kill=kill))
        r += len(runs)
    return steps


# ----------------------------------------------------------------------------- probes
# They run in the scheduler and in the workers (sent by value, standard library only).


def _containers(obj: Any, prefix: str, out: dict, seen: set, roots: tuple = ("cacheaffinity",), depth: int = 0,
                types: dict | None = None) -> None:
    """``out[dotted name] = len(container)`` for every container attribute (a dict, list,
    set or deque, or a subclass: Counter, defaultdict, OrderedDict ...) of ``obj`` and,
    recursively, of the attributes that are objects of a module under ``roots``; a dict
    whose values are containers also gives ``name[*]`` (the sum of their lengths); a deque
    with a ``maxlen`` gives ``name.maxlen`` (its cap); ``types[name]``: the container's
    type name (of the values for ``name[*]``).  Other mappings (a ``ColumnCache``) are never
    iterated or sized (that would read the cache): their attributes are walked."""
    from collections import deque as _deque

    if types is None:
        types = {}
    builtin = (dict, list, set, frozenset, _deque)
    if id(obj) in seen or depth > 6:
        return
    seen.add(id(obj))
    attrs: dict = {}
    try:
        attrs = dict(vars(obj))
    except TypeError:
        pass
    for cls in type(obj).__mro__:
        for slot in getattr(cls, "__slots__", ()) or ():
            if isinstance(slot, str) and slot not in attrs and hasattr(obj, slot):
                attrs[slot] = getattr(obj, slot, None)
    for name, v in attrs.items():
        path = f"{prefix}.{name}"
        if isinstance(v, builtin):
            try:
                out[path] = len(v)
                types[path] = type(v).__name__
                maxlen = getattr(v, "maxlen", None)
                if maxlen is not None:
                    out[path + ".maxlen"] = maxlen
                if isinstance(v, dict):
                    values = [x for x in list(v.values()) if isinstance(x, builtin)]
                    if values:
                        out[path + "[*]"] = sum(len(x) for x in values)
                        types[path + "[*]"] = type(values[0]).__name__
            except RuntimeError:  # changed size during iteration (another thread)
                pass
            continue
        mod = type(v).__module__ or ""
        if any(mod == r or mod.startswith(r + ".") for r in roots):
            _containers(v, path, out, seen, roots, depth + 1, types)


#: Python thread names (digits dropped) of pools that start threads on demand, up to
#: their size: asyncio's default executor (the peer serving), ``concurrent.futures``
#: pools, Dask's offload and task executors
POOL_THREADS = ("asyncio_", "ThreadPoolExecutor-", "Dask-Offload", "Dask-Default-Threads", "Dask-Actor-Threads")


def _pools(server: Any) -> dict:
    """Of a scheduler or worker (in its process): its pooled connections (open sockets
    kept for reuse, ``rpc``: up to one or a few per peer) and the threads of on-demand
    thread pools (:data:`POOL_THREADS`), by name."""
    import re as _re
    import threading as _threading

    rpc = getattr(server, "rpc", None)
    pooled = []
    if rpc is not None:
        for table in (getattr(rpc, "available", {}), getattr(rpc, "occupied", {})):
            pooled += [c for v in list(table.values()) for c in list(v)]
    comms = len(pooled)
    names: dict = {}
    for t in _threading.enumerate():
        name = _re.sub(r"\d+", "N", t.name)
        names[name] = names.get(name, 0) + 1
    pool = sum(n for name, n in names.items() if name.startswith(POOL_THREADS))
    # the local ends of the pooled connections: the other end is a socket of the peer
    local = [getattr(c, "local_address", None) for c in pooled]
    return {"pooled_comms": comms, "pool_threads": pool, "threads_by_name": names,
            "pooled_local": sorted(a for a in local if isinstance(a, str))}  # fmt: skip


def _module_containers(out: dict, types: dict | None = None, roots: tuple = ("cacheaffinity",)) -> None:
    """``out["module.<module>.<name>"]``: the length of every module-level container (as
    :func:`_containers`, and weak sets and dicts) of the loaded modules under ``roots``,
    and the entries of every ``functools`` cache there (``<name>()``)."""
    import sys as _sys
    import weakref as _weakref
    from collections import deque as _deque

    builtin = (dict, list, set, _deque, _weakref.WeakSet, _weakref.WeakValueDictionary, _weakref.WeakKeyDictionary)
    for mod_name, mod in list(_sys.modules.items()):
        if mod is None or not any(mod_name == r or mod_name.startswith(r + ".") for r in roots):
            continue
        for name, v in list(vars(mod).items()):
            if name.startswith("__"):
                continue
            path = f"module.{mod_name}.{name}"
            if isinstance(v, builtin):
                try:
                    out[path] = len(v)
                except Exception:  # noqa: BLE001
                    continue
                if types is not None:
                    types[path] = type(v).__name__
                if getattr(v, "maxlen", None) is not None:
                    out[path + ".maxlen"] = v.maxlen
            elif callable(v) and hasattr(v, "cache_info") and getattr(v, "__module__", None) == mod_name:
                try:
                    info = v.cache_info()
                    out[path + "()"] = info.currsize
                    if info.maxsize is not None:
                        out[path + "().maxlen"] = info.maxsize
                except Exception:  # noqa: BLE001
                    pass


async def _scheduler_probe(dask_scheduler=None, wait: float = 10.0) -> dict:
    """In the scheduler: wait (up to ``wait`` s) until it holds no task, then its pid, the
    plugin's containers, some of Dask's, and the log records counted since the handler was
    installed."""
    import asyncio as _asyncio
    import os as _os
    import time as _time

    s = dask_scheduler
    deadline = _time.monotonic() + wait
    while s.tasks and _time.monotonic() < deadline:
        await _asyncio.sleep(0.05)
    plugin = s.plugins.get("cacheaffinity")
    state: dict = {}
    types: dict = {}
    if plugin is not None:
        _containers(plugin, "plugin", state, set(), types=types)
    _module_containers(state, types)
    dask_state: dict = {
        "dask.tasks": len(s.tasks),
        "dask.task_groups": len(s.task_groups),
        "dask.task_prefixes": len(s.task_prefixes),
        "dask.clients": len(s.clients),
        "dask.workers": len(s.workers),
        "dask.host_info": len(s.host_info),
        "dask.clients[*].wants_what": sum(len(c.wants_what) for c in s.clients.values()),
        "dask.plugins": len(s.plugins),
        "dask.worker_plugins": len(getattr(s, "worker_plugins", ())),
        "dask.periodic_callbacks": len(s.periodic_callbacks),
        "dask.handlers": len(s.handlers),
        "dask.stream_handlers": len(s.stream_handlers),
        "dask.replies": len(getattr(s, "replies", ()) or ()),
    }
    for name in ("transition_log", "_transition_log", "log"):
        v = getattr(s, name, None)
        if v is not None and hasattr(v, "maxlen"):
            dask_state[f"dask.{name}"] = len(v)
            if v.maxlen is not None:
                dask_state[f"dask.{name}.maxlen"] = v.maxlen
    # every other container attribute of the scheduler object (Dask's own, generically)
    generic: dict = {}
    _containers(s, "dask.scheduler", generic, set(), roots=())
    dask_state.update({k: v for k, v in generic.items() if k not in dask_state})
    rpc = getattr(s, "rpc", None)  # the scheduler's connection pool (to workers): open sockets
    if rpc is not None:
        dask_state["dask.rpc.available"] = len(getattr(rpc, "available", ()))
        dask_state["dask.rpc.available[*]"] = sum(len(v) for v in getattr(rpc, "available", {}).values())
        dask_state["dask.rpc.occupied[*]"] = sum(len(v) for v in getattr(rpc, "occupied", {}).values())
    stealing = s.extensions.get("stealing")
    if stealing is not None:
        _containers(stealing, "dask.stealing", dask_state, set(), roots=("distributed.stealing",))
    broker = getattr(s, "_broker", None)  # the event topics (one per worker address, client ...)
    if broker is not None:
        topics = getattr(broker, "_topics", {})
        dask_state["dask.event_topics"] = len(topics)
        dask_state["dask.event_topics[*].events"] = sum(len(getattr(t, "events", ())) for t in topics.values())
        dask_state["dask.event_topics[*].subscribers"] = sum(len(getattr(t, "subscribers", ())) for t in topics.values())
        for name, t in list(topics.items()):  # named topics (not a worker's or client's address)
            if "://" not in name and not name.startswith("Client-"):
                dask_state[f"dask.event_topics[{name}].events"] = len(t.events)
                if t.events.maxlen is not None:
                    dask_state[f"dask.event_topics[{name}].events.maxlen"] = t.events.maxlen
    counter = getattr(s, "_soak_log_counter", None)
    return {
        "pid": _os.getpid(),
        "tasks_left": len(s.tasks),
        "plugin": state,
        "plugin_types": types,
        "dask": dask_state,
        "log_records": dict(counter.counts) if counter is not None else None,
        "pools": _pools(s),
    }


def _worker_probe(dask_worker=None) -> dict:
    """In a worker: its name and pid, queued cache writes stored first, the plugin's
    containers and cache figures, log records counted in this process."""
    import os as _os

    plugin = dask_worker.plugins.get("cacheaffinity")
    state: dict = {}
    stats: dict = {}
    directory = None
    if plugin is not None:
        if hasattr(plugin, "flush"):
            plugin.flush(timeout=60.0)
        _containers(plugin, "worker_plugin", state, set())
        try:
            m = plugin.metric()
            stats = {k: v for k, v in (m.get("stats") or {}).items() if isinstance(v, (int, float))}
            directory = m.get("directory")
        except Exception:  # noqa: BLE001 - a figure, not worth failing the soak
            pass
    _module_containers(state)
    rpc = getattr(dask_worker, "rpc", None)  # connections to peers and the scheduler
    if rpc is not None:
        state["dask.rpc.available"] = len(getattr(rpc, "available", ()))
        state["dask.rpc.available[*]"] = sum(len(v) for v in getattr(rpc, "available", {}).values())
    for obj, prefix in ((dask_worker, "dask.worker"), (getattr(dask_worker, "state", None), "dask.worker.state")):
        if obj is not None:  # Dask's own worker structures, generically
            _containers(obj, prefix, state, set(), roots=())
    state["dask.data"] = len(getattr(dask_worker, "data", ()))
    state["dask.state.tasks"] = len(dask_worker.state.tasks)
    # Dask's statistical profiler: a profile per 1 s cycle, distributed.admin.low-level-log-length of them
    for name in ("profile_history", "profile_keys_history", "profile_keys"):
        v = getattr(dask_worker, name, None)
        if v is not None:
            state[f"dask.{name}"] = len(v)
            if getattr(v, "maxlen", None) is not None:
                state[f"dask.{name}.maxlen"] = v.maxlen
    counter = getattr(dask_worker, "_soak_log_counter", None)
    return {
        "name": str(dask_worker.name),
        "pid": _os.getpid(),
        "plugin": state,
        "stats": stats,
        "directory": directory,
        "log_records": dict(counter.counts) if counter is not None else None,
        "pools": _pools(dask_worker),
    }


def _install_log_counter(server: Any, loggers: tuple = LOGGERS) -> None:
    """Count the records the ``loggers`` emit in this process (by logger root and level),
    on ``server._soak_log_counter`` (idempotent)."""
    import logging as _logging

    if getattr(server, "_soak_log_counter", None) is not None:
        return

    class _Counter(_logging.Handler):
        def __init__(self):
            super().__init__(level=_logging.NOTSET)
            self.counts: dict = {}

        def emit(self, record):
            root = record.name.split(".", 1)[0]
            key = f"{root}:{'warning+' if record.levelno >= _logging.WARNING else 'info-'}"
            self.counts[key] = self.counts.get(key, 0) + 1

    h = _Counter()
    for name in loggers:
        _logging.getLogger(name).addHandler(h)
    server._soak_log_counter = h


def _install_on_scheduler(dask_scheduler=None) -> None:
    _install_log_counter(dask_scheduler)


class SoakWorkerPlugin(WorkerPlugin):
    """Worker plugin of the soak: counts the records the ``distributed`` and
    ``cacheaffinity`` loggers emit in the worker process (:func:`_install_log_counter`),
    and kills the process (``SIGKILL``) when it starts executing its n-th task after
    :func:`_arm_kill` (a crash in the middle of a run).  Registered once: every new
    worker process (restarted, scaled up) gets it, unarmed."""

    name = "soak"
    idempotent = True

    def setup(self, worker) -> None:
        self.worker = worker
        _install_log_counter(worker)

    def transition(self, key, start, finish, **kwargs) -> None:
        n = getattr(self.worker, "_soak_kill_after", None)
        if n and finish == "executing":
            self.worker._soak_kill_after = n - 1
            if n == 1:
                import os as _os
                import signal as _signal

                _os.kill(_os.getpid(), _signal.SIGKILL)


def _arm_kill(dask_worker=None, after: int = 1) -> int:
    """In a worker: die when starting the ``after``-th task from now (0: disarm); its pid."""
    import os as _os

    dask_worker._soak_kill_after = after
    return _os.getpid()


# ----------------------------------------------------------------------------- cluster


class SchedulerProcess(ProcessInterface):
    """A scheduler in a process of its own (``python -m dask spec``), its output in a log
    file, with this process's Dask config (``DASK_INTERNAL_INHERIT_CONFIG``)."""

    def __init__(self, log_path: str, scheduler_file: str, timeout: float = 120.0):
        self.log_path, self.scheduler_file, self.timeout = log_path, scheduler_file, timeout
        self.process: asyncio.subprocess.Process | None = None
        self._log = None
        super().__init__()

    async def start(self) -> None:
        opts = {"host": "127.0.0.1", "port": 0, "dashboard_address": "127.0.0.1:0",
                "scheduler_file": self.scheduler_file}  # fmt: skip
        cmd = [sys.executable, "-m", "dask", "spec", "--spec",
               json.dumps({"cls": "distributed.Scheduler", "opts": opts})]  # fmt: skip
        conf = dask.config.serialize(dask.config.global_config)
        env = {**os.environ, "DASK_INTERNAL_INHERIT_CONFIG": conf}
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - open while the scheduler runs
        self.process = await asyncio.create_subprocess_exec(
            *cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log, env=env,
        )  # fmt: skip
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self.address = json.loads(Path(self.scheduler_file).read_text())["address"]
                break
            except (OSError, ValueError, KeyError):
                if self.process.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"scheduler did not start (exit {self.process.returncode}); see {self.log_path}"
                    ) from None
                await asyncio.sleep(0.1)
        await super().start()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    async def close(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 20)
            except asyncio.TimeoutError:
                self.process.kill()
                await self.process.wait()
        if self._log is not None:
            self._log.close()
        await super().close()


def _slot_order(name: str) -> tuple[int, ...]:
    """Worker names in node order: ``"3"`` -> ``(3,)``, ``"1-0"`` -> ``(1, 0)``."""
    return tuple(int(x) for x in str(name).split("-"))


def make_cluster(workdir: Path, workers: int, per_node: int = 1) -> SpecCluster:
    """The soak's cluster: :class:`SchedulerProcess` and ``workers`` nannies named 0..W-1,
    as ``LocalCluster(n_workers=W, threads_per_worker=1, processes=True)`` makes them (the
    Dask config in force, cacheaffinity's preload and cache directory among it, is what
    the scheduler and every worker, later ones included, start with).  With ``per_node``
    P > 1, the facility node shape (:mod:`benchmarks._nodes`): ``workers`` x P nannies named
    ``"<node>-<process>"``, node ``n``'s P processes sharing the directory ``node-<n>``."""
    from distributed.worker_memory import parse_memory_limit

    worker = {
        "cls": Nanny,
        "options": {
            "nthreads": 1, "host": "127.0.0.1", "dashboard": False, "dashboard_address": None,
            "memory_limit": parse_memory_limit("auto", 1, workers, logger=logging.getLogger(__name__)), "silence_logs": logging.WARNING,
        },
    }  # fmt: skip
    scheduler = {
        "cls": SchedulerProcess,
        "options": {"log_path": str(workdir / "scheduler.log"),
                    "scheduler_file": str(workdir / "scheduler.json")},  # fmt: skip
    }
    if per_node > 1:
        specs = {}
        for name in node_names(workers, per_node):
            node = name.split("-")[0]
            directory = dask.config.get("cacheaffinity.worker.directory").replace("{name}", node)
            options = {**worker["options"], "memory_limit": parse_memory_limit(
                "auto", 1, workers * per_node, logger=logging.getLogger(__name__)),
                "config": {"cacheaffinity.worker.directory": directory}}  # fmt: skip
            specs[name] = {"cls": Nanny, "options": options}
        return SpecCluster(scheduler=scheduler, workers=specs, silence_logs=logging.WARNING, name="soak")
    return SpecCluster(
        scheduler=scheduler, workers={i: worker for i in range(workers)}, worker=worker,
        silence_logs=logging.WARNING, name="soak",
    )  # fmt: skip


# ----------------------------------------------------------------------------- runs


def client_run(executor, analysis: str, fileset: dict, chunksize: int, metadata_cache: dict | None) -> dict:
    """One run (a ``Runner`` call) of ``analysis``: ``{"wall_s", "summary", "stats"}``."""
    proc_cls, summary = ANALYSES[analysis]
    runner = processor.Runner(
        executor=executor, schema=NanoAODSchema, chunksize=chunksize, savemetrics=True,
        metadata_cache=metadata_cache,
    )  # fmt: skip
    t0 = time.perf_counter()
    out, _ = runner(fileset, processor_instance=proc_cls(), treename="Events")
    wall = time.perf_counter() - t0
    stats = getattr(executor, "last_run_stats", None)
    return {"wall_s": wall, "summary": normalized(summary(out)), "stats": dict(stats) if stats else None}


def reference(analysis: str, fileset: dict, chunksize: int) -> Any:
    """coffea's ``IterativeExecutor`` result of ``analysis`` (the comparison's truth)."""
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # its progress bars (status=False shows them)
        return client_run(processor.IterativeExecutor(status=False), analysis, fileset, chunksize, {})["summary"]


class User:
    """A user's session: a client and executor of its own, coffea's metadata cache kept."""

    def __init__(self, name: str, address: str):
        self.name, self.address = name, address
        self.generation = 0
        self._connect()

    def _connect(self) -> None:
        self.client = Client(self.address, timeout="60s", name=f"soak-{self.name}")
        self.executor = cacheaffinity.CacheAffinityExecutor(client=self.client, status=False)
        self.metadata_cache: dict = {}
        self.generation += 1

    def abandon(self) -> None:
        """After a hung run: leave the old client (closed in the background), start afresh."""
        old = self.client
        threading.Thread(target=lambda: _quietly(old.close, timeout=10), daemon=True).start()
        self._connect()

    def close(self) -> None:
        _quietly(self.client.close, timeout=20)


def _quietly(fn, *args, **kwargs) -> None:
    with contextlib.suppress(Exception):
        fn(*args, **kwargs)


def new_process_run(address: str, spec: RunSpec, fileset: dict, timeout: float, workdir: Path) -> dict:
    """``spec`` run by a new ``sys.executable`` process (this script, ``--child``);
    ``{"wall_s", "summary", "stats", "process_s"}``; raises ``subprocess.TimeoutExpired``."""
    d = Path(tempfile.mkdtemp(prefix="child-", dir=workdir))
    try:
        spec_path, out_path, err_path = d / "spec.json", d / "out.json", d / "output"
        spec_path.write_text(json.dumps({
            "scheduler": address, "analysis": spec.analysis, "fileset": fileset, "chunksize": spec.chunksize,
            "dask_config": {"cacheaffinity.client": dask.config.get("cacheaffinity.client", {})},
        }))  # fmt: skip
        t0 = time.perf_counter()
        with open(err_path, "w") as err:
            proc = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--child", str(spec_path), str(out_path)],
                stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT, timeout=timeout,
                env=dict(os.environ), cwd=str(ROOT),
            )  # fmt: skip
        if proc.returncode != 0 or not out_path.exists():
            raise RuntimeError(f"new-process run failed (exit {proc.returncode}):\n{err_path.read_text()[-3000:]}")
        out = json.loads(out_path.read_text())
        out["process_s"] = time.perf_counter() - t0
        return out
    finally:
        shutil.rmtree(d, ignore_errors=True)


def child_main(spec_path: str, out_path: str) -> int:
    """``--child SPEC OUT``: one run as a user's new script does it."""
    spec = json.loads(Path(spec_path).read_text())
    with dask.config.set(spec["dask_config"]):
        with Client(spec["scheduler"], timeout="60s", name="soak-new-process") as client:
            executor = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
            out = client_run(executor, spec["analysis"], spec["fileset"], spec["chunksize"], None)
    out["pid"] = os.getpid()
    Path(out_path).write_text(json.dumps(out, default=str))
    return 0


class _Counting(logging.Handler):
    """Counts the records of this process's ``distributed`` and ``cacheaffinity`` loggers."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def emit(self, record) -> None:
        self.n += 1


# ----------------------------------------------------------------------------- the soak


class Soak:
    """The cluster, the users and the measurements of one soak (:func:`run_soak`)."""

    def __init__(self, cfg: Config, files: dict[str, list[str]], workdir: Path, log=print):
        self.cfg, self.files, self.workdir, self.log = cfg, files, workdir, log
        self.capacity = dask.utils.parse_bytes(cfg.capacity)
        #: seconds a worker may take to (re)start and join (a loaded machine starts slowly)
        self.wait_s = max(300.0, cfg.timeout)
        self.cache_root = workdir / "caches"
        self.settings = {
            "distributed.scheduler.preload": ["cacheaffinity"],
            "distributed.worker.preload": ["cacheaffinity"],
            "cacheaffinity.worker.directory": str(self.cache_root / "node-{name}"),
            "cacheaffinity.worker.capacity": cfg.capacity,
            "distributed.worker.profile.enabled": bool(cfg.profiler),
            **({"distributed.admin.low-level-log-length": cfg.profile_history} if cfg.profile_history else {}),
            # the scheduler process logs as `dask scheduler` does, cacheaffinity at INFO too
            "distributed.logging": {**dask.config.get("distributed.logging", {}), "cacheaffinity": "info"},
        }
        self.references: dict[tuple, Any] = {}
        self.runs: list[dict] = []
        self.samples: list[dict] = []
        self.events: list[dict] = []
        self.n_workers = cfg.processes()
        self._log_lines = 0
        self._worker_logs: dict[str, tuple[int, int]] = {}  # slot -> (pid, records)
        self._client_records = _Counting()
        #: scheduler plugin structure -> its type name (of its values for ``name[*]``)
        self.plugin_types: dict[str, str] = {}

    # ------------------------------------------------------------------ set-up
    def fileset(self, dataset: str) -> dict:
        return {dataset: list(self.files[dataset])}

    def compute_references(self, steps: list[Step]) -> float:
        need = sorted({(r.analysis, r.dataset, r.chunksize) for s in steps for r in s.runs})
        t0 = time.perf_counter()
        for key in need:
            if key not in self.references:
                a, d, c = key
                self.references[key] = reference(a, self.fileset(d), c)
        return time.perf_counter() - t0

    def start(self, stack: contextlib.ExitStack) -> None:
        stack.enter_context(dask.config.set(self.settings))
        self.cluster = stack.enter_context(make_cluster(self.workdir, self.cfg.workers, self.cfg.per_node))
        self.admin = stack.enter_context(Client(self.cluster, name="soak-admin"))
        self.admin.wait_for_workers(self.n_workers, timeout=self.wait_s)
        self.admin.run_on_scheduler(_install_on_scheduler)
        self.admin.register_plugin(SoakWorkerPlugin())
        self.wait_nodes(self.n_workers)
        self.users = {u: User(u, self.cluster.scheduler_address) for u in USERS}
        stack.callback(lambda: [u.close() for u in self.users.values()])
        for name in LOGGERS:
            logging.getLogger(name).addHandler(self._client_records)
            stack.callback(logging.getLogger(name).removeHandler, self._client_records)

    def wait_nodes(self, n: int, timeout: float | None = None) -> None:
        """Wait until ``n`` worker processes and their cache nodes (``n / per_node``) are in."""
        want_nodes = n // self.cfg.per_node
        deadline = time.monotonic() + (self.wait_s if timeout is None else timeout)
        while True:
            workers = len(self.admin.scheduler_info(n_workers=-1)["workers"])
            nodes = len(cacheaffinity.check(self.admin, warn=False)["nodes"])
            if workers == n and nodes == want_nodes:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"cluster has {workers} workers / {nodes} cache nodes, "
                                   f"waited for {n} / {want_nodes}")
            time.sleep(0.2)

    def worker_pids(self) -> dict[str, int]:
        """slot (worker name) -> pid of its worker process now."""
        info = self.admin.scheduler_info(n_workers=-1)["workers"]
        pids = self.admin.run(os.getpid)
        return {str(info[a]["name"]): pid for a, pid in pids.items() if a in info}

    # ------------------------------------------------------------------ events
    def apply_events(self, step: Step) -> None:
        for ev in step.events:
            t0 = time.perf_counter()
            if ev == "scale-down":
                self.n_workers = self.cfg.workers - 1
                self.cluster.scale(self.n_workers)
                self.wait_nodes(self.n_workers)
            elif ev == "scale-up":
                self.n_workers = self.cfg.workers
                self.cluster.scale(self.n_workers)
                self.admin.wait_for_workers(self.n_workers, timeout=self.wait_s)
                self.wait_nodes(self.n_workers)
            self.events.append({"run": step.runs[0].run, "step": step.step, "event": ev,
                                "seconds": round(time.perf_counter() - t0, 2)})  # fmt: skip

    def worker_addresses(self) -> dict[str, str]:
        """slot (worker name) -> address of its worker now."""
        return {str(w["name"]): a for a, w in self.admin.scheduler_info(n_workers=-1)["workers"].items()}

    def arm_kill(self, step: Step) -> dict:
        """Arm the step's kill: the chosen worker dies when it starts its n-th task."""
        slot_i, after = step.kill
        addrs = self.worker_addresses()
        slot = sorted(addrs, key=_slot_order)[slot_i % len(addrs)]
        pid = self.admin.run(_arm_kill, after=after, workers=[addrs[slot]])[addrs[slot]]
        rec = {"run": step.runs[0].run, "step": step.step, "event": "kill", "worker": slot, "pid": pid,
               "at_task": after}  # fmt: skip
        self.events.append(rec)
        return rec

    def finish_kill(self, rec: dict) -> None:
        """The armed worker died in the run, or is killed now (it ran too few tasks); wait
        until its nanny's new process has joined as a cache node."""
        t0 = time.perf_counter()
        rec["during_run"] = not _alive(rec["pid"])
        if not rec["during_run"]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rec["pid"], signal.SIGKILL)
        deadline = time.monotonic() + self.wait_s
        while True:
            with contextlib.suppress(Exception):
                pids = self.worker_pids()
                if len(pids) == self.n_workers and pids.get(rec["worker"]) not in (None, rec["pid"]):
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {rec['worker']} did not come back after the kill")
            time.sleep(0.2)
        self.wait_nodes(self.n_workers)
        rec["restart_s"] = round(time.perf_counter() - t0, 2)

    # ------------------------------------------------------------------ a step
    def _run_one(self, spec: RunSpec, holder: dict) -> None:
        try:
            if spec.process == "new":
                holder["result"] = new_process_run(
                    self.cluster.scheduler_address, spec, self.fileset(spec.dataset), self.cfg.timeout, self.workdir
                )
            else:
                user = self.users[spec.user]
                holder["result"] = client_run(user.executor, spec.analysis, self.fileset(spec.dataset),
                                              spec.chunksize, user.metadata_cache)  # fmt: skip
        except subprocess.TimeoutExpired:
            holder["hung"] = True
        except BaseException as e:  # noqa: BLE001 - counted, the soak goes on
            holder["error"] = f"{type(e).__name__}: {e}"[:2000]

    def run_step(self, step: Step) -> list[dict]:
        self.apply_events(step)
        kill = self.arm_kill(step) if step.kill else None
        holders = [{} for _ in step.runs]
        threads = [threading.Thread(target=self._run_one, args=(s, h), daemon=True, name=f"run-{s.run}")
                   for s, h in zip(step.runs, holders)]  # fmt: skip
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        deadline = time.monotonic() + self.cfg.timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        step_wall = time.perf_counter() - t0
        if kill is not None:
            self.finish_kill(kill)
        rows = []
        for spec, holder, t in zip(step.runs, holders, threads):
            res = holder.get("result")
            hung = holder.get("hung", False) or t.is_alive()
            if t.is_alive() and spec.process == "same":
                self.users[spec.user].abandon()  # its client may be stuck: a new session
            row: dict[str, Any] = {**dataclasses.asdict(spec), "step": step.step, "event": step.describe() or None,
                                   "concurrent": len(step.runs) > 1, "hung": hung,
                                   "error": holder.get("error"), "wall_s": None, "correct": None}  # fmt: skip
            if res is not None and not hung:
                ref = self.references[(spec.analysis, spec.dataset, spec.chunksize)]
                row["wall_s"] = round(res["wall_s"], 3)
                row["correct"] = res["summary"] == ref
                row["run_id"] = (res.get("stats") or {}).get("run")
                if "process_s" in res:
                    row["process_s"] = round(res["process_s"], 3)
            rows.append(row)
        self._figures(rows)
        for row in rows:
            row["step_wall_s"] = round(step_wall, 3)
        return rows

    def _figures(self, rows: list[dict]) -> None:
        """Each run's own figures as the scheduler added them up (its tasks' reports)."""
        for row in rows:
            rid = row.get("run_id")
            stats = None
            if rid:
                with contextlib.suppress(Exception):
                    found = cacheaffinity.run_stats(self.admin, run=rid)
                    stats = found[0] if found else None
            row["figures"] = {k: v for k, v in (stats or {}).items() if isinstance(v, int)} if stats else None
            f = row["figures"] or {}
            lookups = f.get("hits", 0) + f.get("misses", 0)
            row["hit_rate"] = round(f["hits"] / lookups, 4) if lookups else None
            row["peer_hits"] = f.get("peer_hits")

    # ------------------------------------------------------------------ sampling
    def sample(self, step: Step, runs_done: int) -> dict:
        sched = _retry(lambda: self.admin.run_on_scheduler(_scheduler_probe))
        workers = _retry(lambda: self.admin.run(_worker_probe))
        s: dict[str, Any] = {"step": step.step, "run": runs_done, "event": step.describe() or None,
                             "time": round(time.time(), 1), "tasks_left": sched["tasks_left"]}  # fmt: skip
        s.update(_proc_figures(self.cluster.scheduler.pid, "scheduler"))
        _net(s, sched["pools"], "scheduler_")
        # connections from this process (the nannies, the cluster object, the clients of the
        # same-process runs: their Dask pools open another one under concurrency and keep
        # it) are the harness's, not the scheduler's doing
        s["scheduler_harness_comms"] = _connections_from_here(self.cluster.scheduler.pid)
        if s["scheduler_fds_net"] is not None and s["scheduler_harness_comms"] is not None:
            s["scheduler_fds_net"] -= s["scheduler_harness_comms"]
        s["plugin"] = sched["plugin"]
        self.plugin_types.update(sched["plugin_types"])
        s["dask"] = sched["dask"]
        # scheduler log: lines its process wrote since the last sample
        lines = _count_lines(self.workdir / "scheduler.log")
        s["scheduler_log_lines"] = lines - self._log_lines
        self._log_lines = lines
        s["scheduler_log_records"] = sched["log_records"]
        s["workers"] = {}
        s["caches"] = {}
        records = warnings_ = 0
        # a worker's end of the connections the scheduler and its peers keep in their pools
        # (their doing, bounded by their pools) is not counted in its fds_net either
        pooled_ends = set(sched["pools"].get("pooled_local", ()))
        for w in workers.values():
            pooled_ends.update(w["pools"].get("pooled_local", ()))
        for _addr, w in sorted(workers.items(), key=lambda kv: kv[1]["name"]):
            slot, pid = w["name"], w["pid"]
            data = os.path.join(w["directory"], DATA_DIR) + os.sep if w.get("directory") else None
            fig = _proc_figures(pid, "", data)
            _net(fig, w["pools"], "")
            fig["pooled_by_others"] = _connections_to(pid, pooled_ends)
            if fig["fds_net"] is not None and fig["pooled_by_others"] is not None:
                fig["fds_net"] -= fig["pooled_by_others"]
            if fig["fds_net"] is not None and fig.get("mapped_fds") is not None:
                fig["fds_net"] -= fig["mapped_fds"]  # mapped reads: freed with their arrays
            counts = w["log_records"] or {}
            total = sum(counts.values())
            warn = sum(v for k, v in counts.items() if k.endswith("warning+"))
            old_pid, old_total, old_warn = self._worker_logs.get(slot, (None, 0, 0))
            if old_pid != pid:
                old_total = old_warn = 0
            records += total - old_total
            warnings_ += warn - old_warn
            self._worker_logs[slot] = (pid, total, warn)
            s["workers"][slot] = {"pid": pid, **fig, "plugin": w["plugin"],
                                  "cache_bytes": w["stats"].get("bytes"), "cache_entries": w["stats"].get("entries"),
                                  "capacity": w["stats"].get("capacity"), "evictions": w["stats"].get("evictions")}  # fmt: skip
            if w.get("directory"):  # by node: the directory ``node-<n>`` a node's processes share
                node = Path(w["directory"]).name.split("-", 1)[1]
                if node not in s["caches"]:
                    s["caches"][node] = _cache_dir_figures(Path(w["directory"]))
        s["worker_log_records"] = records
        s["worker_log_warnings"] = warnings_
        n = self._client_records.n
        s["client_log_records"] = n - getattr(self, "_client_n", 0)
        self._client_n = n
        # cache directories of slots without a live worker (scaled down) are measured too
        for d in sorted(self.cache_root.glob("node-*")):
            slot = d.name.split("-", 1)[1]
            if slot not in s["caches"]:
                s["caches"][slot] = _cache_dir_figures(d)
        return s


def _connections_from_here(pid: int | None) -> int | None:
    """TCP connections process ``pid`` has with this process."""
    if pid is None:
        return None
    try:
        here = {c.laddr for c in psutil.Process().net_connections(kind="tcp") if c.laddr}
        return sum(1 for c in psutil.Process(pid).net_connections(kind="tcp") if c.raddr and c.raddr in here)
    except (psutil.Error, OSError):
        return None


def _connections_to(pid: int | None, ends: set[str]) -> int | None:
    """TCP connections of process ``pid`` whose other end is one of ``ends``
    (``tcp://host:port``)."""
    if pid is None:
        return None
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    return sum(1 for c in conns if c.raddr and f"tcp://{c.raddr.ip}:{c.raddr.port}" in ends)


def _net(fig: dict, pools: dict, p: str) -> None:
    """Descriptors and threads net of the pools (:func:`_pools`): ``fds_net`` (open
    descriptors less pooled connections) and ``threads_net`` (OS threads less the
    threads of on-demand pools), in ``fig`` (keys prefixed ``p``)."""
    fig[f"{p}pooled_comms"] = pools["pooled_comms"]
    fig[f"{p}pool_threads"] = pools["pool_threads"]
    fig[f"{p}threads_by_name"] = pools["threads_by_name"]
    fds, threads = fig.get(f"{p}fds"), fig.get(f"{p}threads")
    fig[f"{p}fds_net"] = None if fds is None else fds - pools["pooled_comms"]
    fig[f"{p}threads_net"] = None if threads is None else threads - pools["pool_threads"]


def _retry(fn, tries: int = 10, pause: float = 1.0):
    """``fn()``, tried again (``tries`` times in all) while it raises: a worker that died
    a moment ago is still listed until the scheduler notices."""
    for i in range(tries):
        try:
            return fn()
        except Exception:
            if i == tries - 1:
                raise
            time.sleep(pause)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _fd_target(fd_dir: str, name: str) -> str:
    try:
        return os.readlink(os.path.join(fd_dir, name))
    except OSError:
        return "gone"  # closed while listed


def _fd_kind(fd_dir: str, name: str, target: str | None = None) -> str:
    """What descriptor ``name`` of ``fd_dir`` is: socket, pipe, anon:<kind>, or a file's
    path with its digits as ``#`` (a cache data file: a path under ``<cache>/columns/``)."""
    if target is None:
        target = _fd_target(fd_dir, name)
    if target == "gone":
        return target
    head, sep, _ = target.partition(":[")
    if sep and head in ("socket", "pipe"):
        return head
    if target.startswith("anon_inode:"):
        return "anon:" + target[len("anon_inode:"):].strip("[]")
    return re.sub(r"[0-9]+", "#", target)


def late_fd_kinds(samples: list[dict], warmup: int, restart_warmup: int) -> list[str]:
    """Per worker slot whose descriptors (net of the pools) grew late
    (:func:`_late_growth`): the kinds of descriptor its last sample has more of than the
    sample before the last third that had the most (``slot: kind +n``), to name a late
    growth."""
    out = []
    segs = worker_segments(samples, lambda x: x.get("fds_net"), warmup, restart_warmup)
    by_run = {(slot, s["run"]): w for s in samples for slot, w in s.get("workers", {}).items()}
    for slot, v in sorted(segs.items()):
        points = [p for seg in v for p in seg]
        if (_late_growth(points) or 0) <= 0:
            continue
        cut = points[0][0] + (points[-1][0] - points[0][0]) * 2 / 3
        top = max((p for p in points if p[0] <= cut), key=lambda p: (p[1], p[0]))  # the latest of the most
        then = by_run[(slot, top[0])].get("fd_kinds") or {}
        now = by_run[(slot, points[-1][0])].get("fd_kinds") or {}
        diff = {k: now.get(k, 0) - then.get(k, 0) for k in set(now) | set(then)}
        more = ", ".join(f"{k} {d:+d}" for k, d in sorted(diff.items()) if d)
        out.append(f"worker {slot}: run {top[0]:g} -> {points[-1][0]:g}: {more or 'no kind changed'}")
    return out


def _proc_figures(pid: int | None, prefix: str, mapped_under: str | None = None) -> dict:
    """RSS (MB; of it anonymous and file-backed), open file descriptors (by kind:
    :func:`_fd_kind`) and threads of process ``pid``; ``mapped_fds``: its descriptors of
    files under ``mapped_under`` (a cache's data files: each mapped read holds one until
    its array is freed)."""
    p = f"{prefix}_" if prefix else ""
    out = {f"{p}rss_mb": None, f"{p}anon_mb": None, f"{p}file_mb": None, f"{p}fds": None, f"{p}threads": None}
    if pid is None:
        return out
    with contextlib.suppress(psutil.Error, OSError):
        proc = psutil.Process(pid)
        out[f"{p}rss_mb"] = round(proc.memory_info().rss / 2**20, 2)
        fd_dir = f"/proc/{pid}/fd"
        targets = {n: _fd_target(fd_dir, n) for n in os.listdir(fd_dir)}
        kinds = Counter(_fd_kind(fd_dir, n, t) for n, t in targets.items())
        if mapped_under:
            out[f"{p}mapped_fds"] = sum(t.startswith(mapped_under) for t in targets.values())
        out[f"{p}fds"] = sum(kinds.values())
        out[f"{p}fd_kinds"] = dict(sorted(kinds.items()))
        out[f"{p}threads"] = proc.num_threads()
        # RSS = anonymous memory (the heap: what a leak grows) + file pages mapped (the
        # mmap-ed cache packs and libraries: page cache, bounded by what is mapped)
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("RssAnon", "RssFile"):
                    out[f"{p}{key[3:].lower()}_mb"] = round(int(value.split()[0]) / 1024, 2)
    return out


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except OSError:
        return 0


def _cache_dir_figures(d: Path) -> dict:
    """Index file bytes, data file bytes (whole blocks, as the cache accounts them) and
    every byte of cache directory ``d``."""
    index = data = total = files = wal = db = 0
    for name in INDEX_FILES:
        with contextlib.suppress(OSError):
            size = (d / name).stat().st_size
            index += size
            if name.endswith("-wal"):
                wal = size
            elif name.endswith(".sqlite3"):
                db = size
    for root, _dirs, names in os.walk(d):
        in_data = Path(root).name in ("columns", "columns-tmp") or Path(root).parent.name == "columns"
        for n in names:
            try:
                st = os.stat(os.path.join(root, n))
            except OSError:
                continue
            total += st.st_blocks * 512
            if in_data:
                data += -(-st.st_size // BLOCK) * BLOCK
                files += 1
    forms, forms_bytes = FormStore(str(d)).usage()
    return {"index_bytes": index, "db_bytes": db, "wal_bytes": wal, "data_bytes": data, "dir_bytes": total,
            "data_files": files, "forms": forms, "forms_bytes": forms_bytes, **_index_pages(d / INDEX_FILES[0])}


def _index_pages(path: Path) -> dict:
    """The index database as SQLite sees it (its WAL's pages included): ``db_pages_bytes``
    (pages in use and free), ``db_free_bytes`` (free pages) and ``entries`` (rows of the
    entries table); empty when it cannot be read now (a figure, never a failure)."""
    import sqlite3

    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
        try:
            size = con.execute("PRAGMA page_size").fetchone()[0]
            pages = con.execute("PRAGMA page_count").fetchone()[0]
            free = con.execute("PRAGMA freelist_count").fetchone()[0]
            entries = con.execute("SELECT count(*) FROM entries").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return {}
    return {"db_pages_bytes": pages * size, "db_free_bytes": free * size, "entries": entries}


def run_soak(cfg: Config, log=print) -> dict:
    """Run the soak of ``cfg``; returns the document :func:`analyse` reads (the JSON's
    ``results``, ``series`` and the configuration)."""
    cfg.check()
    t_start = time.perf_counter()
    files = prepare_datasets(cfg)
    steps = make_schedule(cfg)
    tmp = None
    if cfg.workdir:
        workdir = Path(cfg.workdir)
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="cacheaffinity-soak-")
        workdir = Path(tmp.name)
    try:
        soak = Soak(cfg, files, workdir, log)
        ref_s = soak.compute_references(steps)
        log(f"soak: {cfg.runs} runs in {len(steps)} steps, {len(soak.references)} references ({ref_s:.0f} s)")
        with contextlib.ExitStack() as stack:
            t0 = time.perf_counter()
            soak.start(stack)
            start_s = time.perf_counter() - t0
            done = 0
            first = soak.sample(Step(step=0, runs=[]), 0)
            soak.samples.append(first)
            for step in steps:
                rows = soak.run_step(step)
                done += len(rows)
                soak.runs.extend(rows)
                s = soak.sample(step, done)
                s["hit_rate"] = _mean([r["hit_rate"] for r in rows])
                s["wall_s"] = _mean([r["wall_s"] for r in rows])
                soak.samples.append(s)
                if cfg.progress:
                    log(_progress_line(rows, s))
        return {
            "steps": len(steps),
            "runs": soak.runs,
            "samples": soak.samples,
            "events": soak.events,
            "capacity_bytes": soak.capacity,
            "references_s": round(ref_s, 1),
            "cluster_start_s": round(start_s, 1),
            "soak_s": round(time.perf_counter() - t_start, 1),
            "datasets": {k: {"files": len(v), "bytes": sum(Path(f).stat().st_size for f in v)}
                         for k, v in files.items()},
            "chunk_ids": chunk_ids(files),
            "plugin_types": soak.plugin_types,
        }
    finally:
        if tmp is not None:
            tmp.cleanup()


def _per_entry(c: dict) -> float | None:
    """Index database bytes per entry the cache holds: its pages as SQLite counts them
    (those still in the WAL included, free ones included)."""
    return round(c["db_pages_bytes"] / c["entries"], 1) if c.get("entries") and c.get("db_pages_bytes") else None


def _mean(values) -> float | None:
    v = [x for x in values if x is not None]
    return round(sum(v) / len(v), 4) if v else None


def _progress_line(rows: list[dict], s: dict) -> str:
    runs = "; ".join(
        f"run {r['run']} {r['user']} {r['analysis']}/{r['dataset']}/{r['chunksize']}"
        + (" new-process" if r["process"] == "new" else "")
        + (" HUNG" if r["hung"] else " FAILED" if r["error"] else "" if r["correct"] else " WRONG")
        + (f" {r['wall_s']:.1f}s hit {r['hit_rate']}" if r["wall_s"] is not None else "")
        for r in rows
    )
    ev = f" [{s['event']}]" if s.get("event") else ""
    rss = " ".join(f"{w['rss_mb']:.0f}" for _, w in sorted(s["workers"].items()) if w.get("rss_mb"))
    return f"step {s['step']}{ev}: {runs} | scheduler {s['scheduler_rss_mb']} MB, workers {rss} MB"


# ----------------------------------------------------------------------------- analysis


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ``ys`` over ``xs`` (None with fewer than 2 distinct xs)."""
    pts = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in pts) / sxx


def pooled_slope(segments: list[list[tuple[float, float]]]) -> float | None:
    """One slope through several segments, each with its own intercept (within-segment
    least squares): a restart's drop is neither shrinking nor growth."""
    sxy = sxx = 0.0
    for seg in segments:
        if len(seg) < 2:
            continue
        mx = sum(x for x, _ in seg) / len(seg)
        my = sum(y for _, y in seg) / len(seg)
        sxx += sum((x - mx) ** 2 for x, _ in seg)
        sxy += sum((x - mx) * (y - my) for x, y in seg)
    return sxy / sxx if sxx else None


def worker_segments(samples: list[dict], key, warmup: int, restart_warmup: int) -> dict[str, list[list[tuple[float, float]]]]:
    """Per worker slot (name), ``(run, key(worker sample))`` of its samples after the
    ``warmup`` runs, cut into segments at every new worker process (a kill, a scale-down
    and up); a process that started after the first sample counts only once it has lived
    ``restart_warmup`` runs (its first sample's run + ``restart_warmup``)."""
    out: dict[str, list[list[tuple[float, float]]]] = {}
    first_pid: dict[str, Any] = {}
    born: dict[str, tuple[Any, int]] = {}  # slot -> (pid, run of its first sample)
    for s in samples:
        for slot, w in s.get("workers", {}).items():
            pid = w.get("pid")
            first_pid.setdefault(slot, pid)
            segs = out.setdefault(slot, [])
            if born.get(slot, (None,))[0] != pid:
                born[slot] = (pid, s["run"])
                segs.append([])
            y = key(w)
            if y is None or s["run"] <= warmup:
                continue
            if pid != first_pid[slot] and s["run"] - born[slot][1] < restart_warmup:
                continue
            segs[-1].append((s["run"], y))
        for slot in list(born):  # scaled down: its next process is a new one
            if slot not in s.get("workers", {}):
                born[slot] = (None, s["run"])
    return {k: [seg for seg in v if seg] for k, v in out.items()}


def _per_100(x: float | None) -> float | None:
    return None if x is None else round(100 * x, 2)


def _max_growth(segs: dict) -> float | None:
    """The largest :func:`_growth_of_segments` over the slots of :func:`worker_segments`."""
    got = [g for g in (_growth_of_segments(v) for v in segs.values()) if g is not None]
    return max(got) if got else None


def _max_slope(segs: dict) -> float | None:
    """The largest pooled slope per 100 runs over the slots of :func:`worker_segments`."""
    got = [x for x in (pooled_slope(v) for v in segs.values()) if x is not None]
    return _per_100(max(got)) if got else None


def _growth_of_segments(segs: list[list[tuple[float, float]]]) -> float | None:
    return sum(seg[-1][1] - seg[0][1] for seg in segs) if segs else None


def _late_growth(points: list[tuple[float, float]]) -> float | None:
    """How much the last value exceeds every value before the last third of ``points``
    (``(run, value)``, after the warm-up): > 0 while a structure still grows at the end."""
    if len(points) < 3:
        return None
    cut = points[0][0] + (points[-1][0] - points[0][0]) * 2 / 3
    before = [y for x, y in points if x <= cut]
    return points[-1][1] - max(before) if before else None


def structure_growth(samples: list[dict], field: str, warmup: int) -> dict[str, dict]:
    """Per structure of ``samples[i][field]`` (scheduler side), after the warm-up: first,
    last, max, growth (last - first), slope per 100 runs, late growth
    (:func:`_late_growth`), cap (a deque's maxlen)."""
    after = [s for s in samples if s["run"] > warmup and s.get(field)]
    if not after:
        after = [s for s in samples if s.get(field)][-1:]
    names = sorted({k for s in after for k in s[field] if not k.endswith(".maxlen")})
    out = {}
    for name in names:
        pts = [(s["run"], s[field][name]) for s in after if name in s[field]]
        if not pts:
            continue
        ys = [y for _, y in pts]
        sl = slope([x for x, _ in pts], ys)
        out[name] = {"first": ys[0], "last": ys[-1], "max": max(ys), "growth": ys[-1] - ys[0],
                     "per_100_runs": None if sl is None else round(100 * sl, 3),
                     "late_growth": _late_growth(pts), "cap": after[-1][field].get(name + ".maxlen")}  # fmt: skip
        if name.endswith("[*]"):  # the contents of a dict's containers: per entry
            parent = name[:-3]
            cut = pts[0][0] + (pts[-1][0] - pts[0][0]) * 2 / 3
            ratios = [s[field][name] / s[field][parent] for s in after
                      if s["run"] <= cut and s[field].get(parent) and name in s[field]]  # fmt: skip
            out[name]["per_entry_max_before"] = round(max(ratios), 3) if ratios else None
            out[name]["parent_last"] = after[-1][field].get(parent)
    return out


def worker_structure_growth(samples: list[dict], warmup: int, restart_warmup: int) -> dict[str, dict]:
    """Per structure of the worker plugins: growth summed over each slot's segments (as
    the fds), maximum over slots; pooled slope per 100 runs and the last value, maximum
    over slots; late growth of each slot's last segment, maximum over slots."""
    names = sorted({k for s in samples for w in s.get("workers", {}).values() for k in (w.get("plugin") or {})
                    if not k.endswith(".maxlen")})  # fmt: skip
    out = {}
    for name in names:
        segs = worker_segments(samples, lambda w, n=name: (w.get("plugin") or {}).get(n), warmup, restart_warmup)
        growth = [g for g in (_growth_of_segments(v) for v in segs.values()) if g is not None]
        slopes = [x for x in (pooled_slope(v) for v in segs.values()) if x is not None]
        late = [g for g in (_late_growth(v[-1]) for v in segs.values() if v) if g is not None]
        last = [v[-1][-1][1] for v in segs.values() if v]
        caps = [w["plugin"][name + ".maxlen"] for smp in samples[-1:] for w in smp.get("workers", {}).values()
                if name + ".maxlen" in (w.get("plugin") or {})]  # fmt: skip
        out[name] = {"cap": max(caps) if caps else None, "growth": max(growth) if growth else None,
                     "per_100_runs": round(100 * max(slopes), 3) if slopes else None,
                     "late_growth": max(late) if late else None,
                     "last": max(last) if last else None}  # fmt: skip
    return out


def phases(runs: list[dict], events: list[dict]) -> list[dict]:
    """Hit rates between events: a phase starts at the run of each event (a kill, a
    scaling, the chunksize change) and ends before the next."""
    starts = sorted({e["run"] for e in events} | {1})
    out = []
    for i, a in enumerate(starts):
        b = starts[i + 1] if i + 1 < len(starts) else math.inf
        rs = [r for r in runs if a <= r["run"] < b]
        if not rs:
            continue
        f = [r["figures"] or {} for r in rs]
        hits = sum(x.get("hits", 0) for x in f)
        peer = sum(x.get("peer_hits", 0) for x in f)
        lookups = hits + sum(x.get("misses", 0) for x in f)
        walls = sorted(r["wall_s"] for r in rs if r["wall_s"] is not None)
        evs = [e["event"] + (f" worker {e['worker']}" if e.get("worker") else "") for e in events if e["run"] == a]
        out.append({
            "from_run": a, "to_run": max(r["run"] for r in rs), "after": ", ".join(evs) or "start",
            "runs": len(rs), "hit_rate": round(hits / lookups, 4) if lookups else None,
            "peer_hits": peer,
            "first_run_hit_rate": rs[0].get("hit_rate"),
            "median_wall_s": walls[len(walls) // 2] if walls else None,
        })  # fmt: skip
    return out


def analyse(doc: dict, cfg: Config) -> dict:
    """The soak's figures (the JSON's top level): counts, slopes, growths, phases."""
    samples, runs = doc["samples"], doc["runs"]
    w, skip = cfg.warmup, cfg.restart_warmup
    after = [s for s in samples if s["run"] > w]
    sched_slope = slope([s["run"] for s in after], [s["scheduler_rss_mb"] for s in after])
    rss = worker_segments(samples, lambda x: x.get("rss_mb"), w, skip)
    fds = worker_segments(samples, lambda x: x.get("fds"), w, skip)
    thr = worker_segments(samples, lambda x: x.get("threads"), w, skip)
    fds_net = worker_segments(samples, lambda x: x.get("fds_net"), w, skip)
    thr_net = worker_segments(samples, lambda x: x.get("threads_net"), w, skip)
    by_slot = {k: (None if pooled_slope(v) is None else round(100 * pooled_slope(v), 2)) for k, v in rss.items()}
    fd_by_slot = {k: _growth_of_segments(v) for k, v in fds.items()}
    thr_by_slot = {k: _growth_of_segments(v) for k, v in thr.items()}

    def late(segs: dict) -> int | None:  # per slot, its processes one after the other
        got = [g for g in (_late_growth([p for seg in v for p in seg]) for v in segs.values()) if g is not None]
        return max(got) if got else None

    def sched_late(key):
        return _late_growth([(s["run"], s[key]) for s in after if s.get(key) is not None])
    plugin = structure_growth(samples, "plugin", w)
    dask_state = structure_growth(samples, "dask", w)
    workers_state = worker_structure_growth(samples, w, skip)
    over = [(s["step"], slot) for s in samples for slot, c in s.get("caches", {}).items()
            if c["data_bytes"] > doc["capacity_bytes"]]  # fmt: skip
    valid = [v for v in by_slot.values() if v is not None]

    def first_last(key):
        xs = [s[key] for s in after if s.get(key) is not None]
        return (xs[-1] - xs[0]) if len(xs) >= 2 else None

    index_growth = {}
    for slot in sorted({k for s in after for k in s.get("caches", {})}):
        cs = [s["caches"][slot] for s in after if slot in s.get("caches", {})]
        xs = [c["index_bytes"] for c in cs]
        index_growth[slot] = {"first": xs[0], "last": xs[-1], "max": max(xs)} if xs else None
        if xs and cs[0].get("db_bytes") is not None:  # the database and its WAL apart
            index_growth[slot].update(
                db_first=cs[0]["db_bytes"], db_last=cs[-1]["db_bytes"], db_max=max(c["db_bytes"] for c in cs),
                wal_max=max(c.get("wal_bytes") or 0 for c in cs),
                free_max=max(c.get("db_free_bytes") or 0 for c in cs),
                entries_first=cs[0].get("entries"), entries_last=cs[-1].get("entries"),
                per_entry_first=_per_entry(cs[0]), per_entry_last=_per_entry(cs[-1]),
                forms_max=max(c.get("forms") or 0 for c in cs),
                forms_bytes_max=max(c.get("forms_bytes") or 0 for c in cs),
            )  # fmt: skip
    ratios = [g["per_entry_last"] / g["per_entry_first"] for g in index_growth.values()
              if g and g.get("per_entry_first") and g.get("per_entry_last")]  # fmt: skip
    forms_max = max((g.get("forms_max") or 0 for g in index_growth.values() if g), default=None)
    forms_bytes_max = max((g.get("forms_bytes_max") or 0 for g in index_growth.values() if g), default=None)
    half = [s for s in samples if s["run"] > max(w, len(runs) // 2)]
    half_rss = worker_segments(samples, lambda x: x.get("rss_mb"), max(w, len(runs) // 2), skip)
    walls = [r["wall_s"] for r in runs if r["wall_s"] is not None]
    evictions: dict[tuple, int] = {}  # (slot, pid) -> its process's evictions (a counter per process)
    for smp in samples:
        for slot, wk in smp.get("workers", {}).items():
            if wk.get("evictions") is not None:
                evictions[(slot, wk["pid"])] = max(evictions.get((slot, wk["pid"]), 0), wk["evictions"])
    per_analysis = {}
    for a in sorted({r["analysis"] for r in runs}):
        ws = sorted(r["wall_s"] for r in runs if r["analysis"] == a and r["wall_s"] is not None)
        per_analysis[a] = {"runs": len(ws), "median": ws[len(ws) // 2] if ws else None,
                           "max": ws[-1] if ws else None}  # fmt: skip
    log_per_run = {k: round(sum(s.get(k) or 0 for s in after) / max(1, len(after)), 2)
                   for k in ("scheduler_log_lines", "worker_log_records", "worker_log_warnings", "client_log_records")}
    return {
        "runs": len(runs),
        "wrong_results": sum(1 for r in runs if r["correct"] is False),
        "hung_runs": sum(1 for r in runs if r["hung"]),
        "failed_runs": sum(1 for r in runs if r["error"] and not r["hung"]),
        "warmup_runs": w,
        "scheduler_rss_mb_per_100_runs": None if sched_slope is None else round(100 * sched_slope, 2),
        "worker_rss_mb_per_100_runs": max(valid) if valid else None,
        "worker_rss_mb_per_100_runs_by_slot": by_slot,
        "fd_growth": max((v for v in fd_by_slot.values() if v is not None), default=None),
        "fd_growth_by_slot": fd_by_slot,
        "thread_growth": max((v for v in thr_by_slot.values() if v is not None), default=None),
        "thread_growth_by_slot": thr_by_slot,
        "scheduler_fd_growth": first_last("scheduler_fds"),
        "scheduler_thread_growth": first_last("scheduler_threads"),
        # the same net of the pools (pooled connections, threads of on-demand pools)
        "fd_net_growth": _max_growth(fds_net),
        "thread_net_growth": _max_growth(thr_net),
        # still growing at the end: the last sample above every one before the last third
        "fd_late_growth": late(fds),
        "thread_late_growth": late(thr),
        "fd_net_late_growth": late(fds_net),
        "fd_net_late_kinds": late_fd_kinds(samples, w, skip),
        "thread_net_late_growth": late(thr_net),
        "scheduler_fd_late_growth": sched_late("scheduler_fds"),
        "scheduler_thread_late_growth": sched_late("scheduler_threads"),
        "scheduler_fd_net_late_growth": sched_late("scheduler_fds_net"),
        "scheduler_thread_net_late_growth": sched_late("scheduler_threads_net"),
        "pool_threads_max": max((w.get("pool_threads") or 0 for s in samples for w in s.get("workers", {}).values()), default=None),
        "mapped_fds_max": max((w.get("mapped_fds") or 0 for s in samples for w in s.get("workers", {}).values()), default=None),
        "pooled_comms_max": max((w.get("pooled_comms") or 0 for s in samples for w in s.get("workers", {}).values()), default=None),
        "worker_anon_mb_per_100_runs": _max_slope(worker_segments(samples, lambda x: x.get("anon_mb"), w, skip)),
        "worker_file_mb_per_100_runs": _max_slope(worker_segments(samples, lambda x: x.get("file_mb"), w, skip)),
        "scheduler_anon_mb_per_100_runs": _per_100(slope([s["run"] for s in after], [s.get("scheduler_anon_mb") for s in after])),
        "plugin_state_growth": max((v["growth"] for v in plugin.values()), default=None),
        "plugin_state_growth_by_structure": plugin,
        "worker_plugin_state_growth": max((v["growth"] for v in workers_state.values() if v["growth"] is not None), default=None),
        "worker_plugin_state_growth_by_structure": workers_state,
        "dask_state_growth_by_structure": dask_state,
        "cache_over_capacity": len(over),
        "cache_over_capacity_samples": over[:50],
        "index_bytes": index_growth,
        # index database bytes per entry held, at the end over the start (the worst node)
        "index_bytes_per_entry_ratio": round(max(ratios), 3) if ratios else None,
        "forms_max": forms_max,
        "forms_bytes_max": forms_bytes_max,
        # the same slopes over the second half of the runs alone
        "worker_rss_mb_per_100_runs_second_half": _max_slope(half_rss),
        "scheduler_rss_mb_per_100_runs_second_half": _per_100(
            slope([s["run"] for s in half], [s["scheduler_rss_mb"] for s in half])),
        "log_per_step": log_per_run,
        "hit_rate": _mean([r["hit_rate"] for r in runs]),
        "wall_s_median": sorted(walls)[len(walls) // 2] if walls else None,
        "wall_s_mean": _mean(walls),
        "wall_s_by_analysis": per_analysis,
        "evictions": sum(evictions.values()),
        "phases": phases(runs, doc["events"]),
        "events": doc["events"],
    }


def check_bounds(figures: dict, cfg: Config, chunk_ids: int | None = None, types: dict | None = None) -> list[str]:
    """What is wrong with a soak's figures (empty: every bound held):

    * a wrong, hung or failed run;
    * descriptors or threads still growing at the end, net of the pools: a worker slot's
      last sample above every one of its samples (any of its processes) before the last
      third of the runs after the warm-up (``fd_net_late_growth``, ``thread_net_late_growth``),
      or the scheduler's (``scheduler_fd_net_late_growth``,
      ``scheduler_thread_net_late_growth``; its descriptors also net of its connections
      with this process: the nannies' and clients' pools).  Net of the pools
      (:func:`_pools`), at both ends: a worker
      keeps a pooled connection or two per peer, opened when it first fetches from it
      (here: after the chunksize change) and again after a peer restarts; the peer's end
      of it is an open socket too (``pooled_by_others``); a mapped read of a cache data
      file holds a descriptor until its array is freed (``mapped_fds``, at most
      ``mapped_fds_max``); and asyncio's
      executor starts its threads (up to its size) as peer requests come in at once, which
      move the raw counts by a few either way (``fd_growth``, ``fd_late_growth`` ... report
      them; ``pooled_comms_max``, ``pool_threads_max`` what the pools held at most);
    * a cache directory over its capacity (``cache_over_capacity``);
    * a scheduler plugin structure beyond its bound: a capped deque beyond its ``maxlen``;
      ``plugin.locator.holder`` beyond ``chunk_ids`` (the chunk ids the datasets have,
      :func:`chunk_ids`); any other structure still growing at the end: its last value
      above every value it had before the last third of the runs after the warm-up
      (``late_growth`` > 0), unless it holds at most as many entries as there are
      workers (per node or per worker: a node's first steal may come late) or it is a
      ``Counter`` (keys: counter names; ``types``: the structures' type names, see
      :func:`_containers`); the contents of a dict's containers (``name[*]``) while
      they hold at most as many per entry of the dict as there are workers, or as they
      held at most before (a run's record per node).  The structures are sampled with no task in the scheduler:
      one per task must be empty; the schedule places every chunk of the workload in its
      first runs and right after the chunksize change (:func:`make_schedule`), so one per
      chunk is full by then; one per run is full at its cap (20 runs) by run 20.
    """
    bad = []
    types = types or {}
    for k in ("wrong_results", "hung_runs", "failed_runs", "cache_over_capacity"):
        if figures.get(k):
            bad.append(f"{k} = {figures[k]}")
    for k in ("fd_net_late_growth", "thread_net_late_growth", "scheduler_fd_net_late_growth",
              "scheduler_thread_net_late_growth"):  # fmt: skip
        v = figures.get(k)
        if v is not None and v > 0:
            bad.append(f"{k} = {v}")
    for name, g in (figures.get("plugin_state_growth_by_structure") or {}).items():
        if g.get("cap") is not None:
            if g["last"] > g["cap"]:
                bad.append(f"{name}: {g['last']} > its cap {g['cap']}")
        elif name == "plugin.locator.holder" and chunk_ids is not None:
            if g["last"] > chunk_ids:
                bad.append(f"{name}: {g['last']} > {chunk_ids} chunk ids")
        elif name.endswith("[*]") and g.get("parent_last") is not None:
            # the containers of a dict's entries: at most as long as the workers (per node,
            # per worker) or as the longest before, each
            per_entry = max(cfg.processes(), g.get("per_entry_max_before") or 0)
            if (g.get("late_growth") or 0) > 0 and g["last"] > g["parent_last"] * per_entry and types.get(name) != "Counter":
                bad.append(f"{name}: still growing, {g['last']} at the end for {g['parent_last']} entries "
                           f"(> {per_entry} each)")  # fmt: skip
        elif (g.get("late_growth") or 0) > 0 and g["last"] > cfg.processes() and types.get(name) != "Counter":
            bad.append(f"{name}: still growing, {g['last']} at the end, {g['last'] - g['late_growth']} at most "
                       f"before the last third ({g['first']} after the warm-up)")  # fmt: skip
    return bad


# ----------------------------------------------------------------------------- output


def columnar(samples: list[dict]) -> dict:
    """The samples as the JSON keeps them (``series``): one list per figure, an entry per
    sample (None where a sample lacks it: a slot scaled away): ``{"run": [...], "step":
    [...], "scheduler_rss_mb": [...], ..., "plugin": {structure: [...]}, "dask":
    {structure: [...]}, "workers": {slot: {"rss_mb": [...], ..., "plugin": {structure:
    [...]}}}, "caches": {slot: {"index_bytes": [...], ...}}}``; per-name thread counts
    and log records by logger of the last sample only (``last``)."""
    n = len(samples)
    out: dict[str, Any] = {"plugin": {}, "dask": {}, "workers": {}, "caches": {}, "last": {}}

    def col(d: dict, key: str, i: int, value: Any) -> None:
        d.setdefault(key, [None] * n)[i] = value

    for i, smp in enumerate(samples):
        for k, v in smp.items():
            if k in ("plugin", "dask"):
                for name, x in v.items():
                    col(out[k], name, i, x)
            elif k in ("workers", "caches"):
                for slot, fields in v.items():
                    d = out[k].setdefault(slot, {})
                    for f, x in fields.items():
                        if f == "plugin":
                            for name, y in x.items():
                                col(d.setdefault("plugin", {}), name, i, y)
                        elif not isinstance(x, dict):
                            col(d, f, i, x)
            elif isinstance(v, dict):
                out["last"][k] = v
            else:
                col(out, k, i, v)
    if samples:
        out["last"]["threads_by_name"] = {slot: w.get("threads_by_name") for slot, w in samples[-1].get("workers", {}).items()}
        out["last"]["fd_kinds"] = {slot: w.get("fd_kinds") for slot, w in samples[-1].get("workers", {}).items()}
    return out



def summary_rows(fig: dict) -> list[dict]:
    """The summary table: one row per figure."""
    rows = [
        ("runs", fig["runs"]), ("wrong results", fig["wrong_results"]), ("hung runs", fig["hung_runs"]),
        ("failed runs", fig["failed_runs"]),
        ("scheduler RSS MB / 100 runs", fig["scheduler_rss_mb_per_100_runs"]),
        ("worker RSS MB / 100 runs (max over slots)", fig["worker_rss_mb_per_100_runs"]),
        ("worker fd growth (max)", fig["fd_growth"]), ("worker thread growth (max)", fig["thread_growth"]),
        ("worker fd / thread late growth (max)", f"{fig['fd_late_growth']} / {fig['thread_late_growth']}"),
        ("worker anon / file MB / 100 runs (max)", f"{fig['worker_anon_mb_per_100_runs']} / {fig['worker_file_mb_per_100_runs']}"),
        ("scheduler fd growth", fig["scheduler_fd_growth"]),
        ("scheduler thread growth", fig["scheduler_thread_growth"]),
        ("plugin state growth (max)", fig["plugin_state_growth"]),
        ("worker plugin state growth (max)", fig["worker_plugin_state_growth"]),
        ("cache over capacity (samples)", fig["cache_over_capacity"]),
        ("cache evictions", fig["evictions"]),
        ("hit rate (mean of runs)", fig["hit_rate"]), ("wall s (median run)", fig["wall_s_median"]),
        ("bounds violated", len(fig["bounds"])),
    ]  # fmt: skip
    return [{"figure": k, "value": v} for k, v in rows]


def growing_rows(fig: dict, top: int = 12) -> list[dict]:
    """Structures that grew after the warm-up, largest growth first."""
    rows = []
    for side, key in (("scheduler", "plugin_state_growth_by_structure"),
                      ("worker", "worker_plugin_state_growth_by_structure"),
                      ("dask", "dask_state_growth_by_structure")):  # fmt: skip
        for name, g in (fig.get(key) or {}).items():
            if g.get("growth"):
                rows.append({"structure": name, "side": side, "growth": g["growth"],
                             "per_100_runs": g.get("per_100_runs"), "last": g.get("last", g.get("last_max")),
                             "cap": g.get("cap")})  # fmt: skip
    rows.sort(key=lambda r: -abs(r["growth"]))
    return rows[:top]


def plot(doc: dict, fig_data: dict, title: str = ""):
    """Every series by run (one subplot each), events as vertical lines."""
    plt = pyplot()
    samples = doc["samples"]
    x = [s["run"] for s in samples]
    slots = sorted({k for s in samples for k in s.get("workers", {})}, key=lambda k: int(k) if k.isdigit() else k)
    fig, axes = plt.subplots(5, 2, figsize=(13, 17))
    ax = axes.ravel()

    def per_slot(a, key, label):
        for slot in slots:
            ys = [s["workers"].get(slot, {}).get(key) for s in samples]
            a.plot(x, [math.nan if y is None else y for y in ys], lw=1, label=f"worker {slot}")
        a.set_ylabel(label)

    ax[0].plot(x, [s["scheduler_rss_mb"] for s in samples], color="k")
    ax[0].set_ylabel("scheduler RSS [MB]")
    per_slot(ax[1], "rss_mb", "worker RSS [MB]")
    ax[1].legend(fontsize=7)
    per_slot(ax[2], "fds", "worker open fds")
    ax[2].plot(x, [s["scheduler_fds"] for s in samples], color="k", lw=1, ls="--", label="scheduler")
    per_slot(ax[3], "threads", "worker threads")
    ax[3].plot(x, [s["scheduler_threads"] for s in samples], color="k", lw=1, ls="--", label="scheduler")
    # plugin structures that change after the warm-up (else the largest few)
    grown = [n for n, g in fig_data["plugin_state_growth_by_structure"].items() if g["max"] != g["first"]]
    names = sorted(grown or fig_data["plugin_state_growth_by_structure"],
                   key=lambda n: -fig_data["plugin_state_growth_by_structure"][n]["max"])[:8]  # fmt: skip
    for n in names:
        ax[4].plot(x, [s.get("plugin", {}).get(n) for s in samples], lw=1, label=n.removeprefix("plugin."))
    ax[4].set_ylabel("plugin structure length")
    ax[4].set_yscale("symlog")
    ax[4].legend(fontsize=6)
    caches = sorted({k for s in samples for k in s.get("caches", {})})
    for slot in caches:
        ax[5].plot(x, [s["caches"].get(slot, {}).get("index_bytes", math.nan) / 2**10 for s in samples],
                   lw=1, label=f"node {slot}")  # fmt: skip
        ax[6].plot(x, [s["caches"].get(slot, {}).get("data_bytes", math.nan) / 2**20 for s in samples],
                   lw=1, label=f"node {slot}")  # fmt: skip
    ax[5].set_ylabel("index files [KiB]")
    ax[6].axhline(doc["capacity_bytes"] / 2**20, color="r", ls="--", lw=1, label="capacity")
    ax[6].set_ylabel("cache data [MiB]")
    ax[6].legend(fontsize=7)
    ax[7].plot(x, [s.get("scheduler_log_lines") for s in samples], lw=1, label="scheduler lines")
    ax[7].plot(x, [s.get("worker_log_records") for s in samples], lw=1, label="worker records")
    ax[7].plot(x, [s.get("client_log_records") for s in samples], lw=1, label="client records")
    ax[7].set_ylabel("log lines per step")
    ax[7].legend(fontsize=7)
    runs = doc["runs"]
    colors = {"light": "tab:blue", "realistic": "tab:orange", "other": "tab:green"}
    for a in sorted(colors):
        rs = [r for r in runs if r["analysis"] == a and r["hit_rate"] is not None]
        ax[8].scatter([r["run"] for r in rs], [r["hit_rate"] for r in rs], s=6, color=colors[a], label=a)
        rs = [r for r in runs if r["analysis"] == a and r["wall_s"] is not None]
        ax[9].scatter([r["run"] for r in rs], [r["wall_s"] for r in rs], s=6, color=colors[a], label=a)
    ax[8].set_ylabel("hit rate")
    ax[8].legend(fontsize=7)
    ax[9].set_ylabel("wall time [s]")
    ax[9].legend(fontsize=7)
    for a in ax:
        for e in doc["events"]:
            a.axvline(e["run"], color={"kill": "r", "chunksize": "m"}.get(e["event"], "grey"), lw=0.6, alpha=0.5)
        a.axvline(fig_data["warmup_runs"], color="k", lw=0.6, ls=":")
        a.set_xlabel("run")
    for a in (ax[2], ax[3]):
        a.legend(fontsize=7)
    fig.suptitle(title or "soak", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    return fig


def parse_args(argv=None) -> tuple[Config, str, str]:
    import argparse

    from benchmarks._common import parser

    d = Config()
    p = parser((__doc__ or "").split("\n\n")[0])
    p.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    p.add_argument("--runs", type=int, default=d.runs)
    p.add_argument("--workers", type=int, default=d.workers,
                   help="cache nodes (with --per-node 1, the default: worker processes)")
    p.add_argument("--per-node", type=int, default=d.per_node,
                   help="worker processes per cache node, sharing its directory (e.g. 2: the facility node shape)")
    p.add_argument("--seed", type=int, default=d.seed, help="of the schedule")
    p.add_argument("--chunksize", type=int, default=d.chunksize)
    p.add_argument("--chunksize-after", type=int, default=d.chunksize_after)
    p.add_argument("--chunksize-change-at", type=int, default=None, help="run (default: half way)")
    p.add_argument("--capacity", default=d.capacity, help="of each node cache")
    p.add_argument("--kill-every", type=int, default=d.kill_every, help="runs (0: never)")
    p.add_argument("--scale-every", type=int, default=d.scale_every, help="runs (0: never)")
    p.add_argument("--scaled-down-runs", type=int, default=d.scaled_down_runs)
    p.add_argument("--new-process-every", type=int, default=d.new_process_every, help="runs (0: never)")
    p.add_argument("--concurrent-share", type=float, default=d.concurrent_share)
    p.add_argument("--timeout", type=float, default=d.timeout, help="seconds a run may take")
    p.add_argument("--warmup", type=int, default=d.warmup, help="runs before the growth figures")
    p.add_argument("--restart-warmup", type=int, default=d.restart_warmup,
                   help="runs a new worker process lives before its samples count")  # fmt: skip
    p.add_argument("--no-profiler", action="store_true",
                   help="switch off Dask's statistical profiler in the workers (its history grows "
                   "until --profile-history profiles)")  # fmt: skip
    p.add_argument("--profile-history", type=int, default=d.profile_history,
                   help="profiles a worker keeps (distributed.admin.low-level-log-length; 0: Dask's "
                   "default, 1000)")  # fmt: skip
    p.add_argument("--events", type=int, nargs=2, metavar=("DY", "TT"), default=None,
                   help="events of the two datasets (default 6000 4000)")  # fmt: skip
    p.add_argument("--data", default=str(DEFAULT_DATA), help="where the generated datasets are kept")
    p.add_argument("--workdir", default=None, help="cluster directory (default: temporary, removed)")
    p.add_argument("--name", default="soak", help="results file name")
    p.add_argument("--child", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        return None, a.child, None  # type: ignore[return-value]
    cfg = Config(
        runs=a.runs, workers=a.workers, per_node=a.per_node, seed=a.seed, chunksize=a.chunksize, chunksize_after=a.chunksize_after,
        chunksize_change_at=a.chunksize_change_at, capacity=a.capacity, kill_every=a.kill_every,
        scale_every=a.scale_every, scaled_down_runs=a.scaled_down_runs, new_process_every=a.new_process_every,
        concurrent_share=a.concurrent_share, timeout=a.timeout, warmup=a.warmup, restart_warmup=a.restart_warmup,
        data=a.data, workdir=a.workdir, profiler=not a.no_profiler,
        profile_history=a.profile_history or None,
    )  # fmt: skip
    if a.events:
        cfg.datasets = {"dy": [a.events[0], 3, 101], "tt": [a.events[1], 2, 202]}
    if a.quick:
        cfg.runs, cfg.warmup = min(cfg.runs, 12), min(cfg.warmup, 4)
        # the quick size's own event rates; an event given as 0 (never) stays off
        cfg.kill_every = 5 if cfg.kill_every else 0
        cfg.scale_every = 8 if cfg.scale_every else 0
        cfg.scaled_down_runs = 2
        cfg.new_process_every = 6 if cfg.new_process_every else 0
        cfg.datasets = {"dy": [2000, 2, 101], "tt": [1000, 1, 202]}
    return cfg, a.out, a.name


def _shape(cfg: Config) -> str:
    if cfg.per_node == 1:
        return f"{cfg.workers} workers"
    return f"{cfg.workers} nodes x {cfg.per_node} worker processes"


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


#: The issue's bounds, as (figure, its bound, how it is read): rendered beside the figures.
TARGETS = (
    ("scheduler_rss_mb_per_100_runs", 5.0, "under"),
    ("worker_rss_mb_per_100_runs", 5.0, "under"),
    ("fd_growth", 0, "at most"),
    ("thread_growth", 0, "at most"),
)


def _max_rss_by_half(doc: dict) -> tuple[float | None, float | None]:
    """The largest worker RSS (MB) in the first and in the second half of the runs after
    the warm-up: a worker that grows without bound has a larger one in the second half."""
    s, warmup = doc["series"], doc["config"]["warmup"]
    runs = s["run"]
    half = warmup + (max(runs) - warmup) // 2
    first, second = [], []
    for w in s["workers"].values():
        for run, rss in zip(runs, w["rss_mb"]):
            if rss is not None and run > warmup:
                (first if run <= half else second).append(rss)
    return (max(first) if first else None, max(second) if second else None)


def render(results: str, name: str = "soak", other: str = "soak_noprofiler") -> str:
    """Markdown for docs/benchmarks.md from ``<results>/<name>.json`` (Dask's profiler on)
    and ``<other>.json`` (off) side by side: every figure of the issue with its bound, the
    hit rate per kind of phase, the command and commit.  Hook: ``"soak": render`` in
    tools/render_readme.py."""
    docs = {label: read_results(results, n) for label, n in (("profiler on", name), ("profiler off", other))}
    docs = {label: d for label, d in docs.items() if d is not None}
    if not docs:
        return not_measured("soak.py", name)
    labels = list(docs)
    rows = ["| figure | bound | " + " | ".join(labels) + " |", "|" + " --- |" * (2 + len(labels))]

    def row(what: str, bound: str, cells: list) -> None:
        rows.append(f"| {what} | {bound} | " + " | ".join(str(c) for c in cells) + " |")

    def fig(key: str) -> list:
        return [d.get(key) for d in docs.values()]

    def verdict(key: str, limit: float, how: str) -> list:
        out = []
        for v in fig(key):
            ok = v is not None and (v < limit if how == "under" else v <= limit)
            out.append(f"{v} ({'met' if ok else '**missed**'})")
        return out

    row("runs", "≥ 300", fig("runs"))
    row("wrong / hung / failed runs", "0 / 0 / 0",
        [f"{d['wrong_results']} / {d['hung_runs']} / {d['failed_runs']}" for d in docs.values()])
    names = {"scheduler_rss_mb_per_100_runs": "scheduler RSS slope [MB / 100 runs]",
             "worker_rss_mb_per_100_runs": "worker RSS slope [MB / 100 runs], max over workers",
             "fd_growth": "worker fd growth (last - first), max", "thread_growth": "worker thread growth, max"}
    for key, limit, how in TARGETS:
        row(names[key], f"{how} {limit:g}", verdict(key, limit, how))
    row("worker fd / thread growth net of pools (connections, pool threads)", "-",
        [f"{d['fd_net_growth']} / {d['thread_net_growth']}" for d in docs.values()])
    row("still growing at the end (fd / thread, net of pools)", "≤ 0",
        [f"{d['fd_net_late_growth']} / {d['thread_net_late_growth']}" for d in docs.values()])
    row("largest worker RSS [MB], 1st / 2nd half of the runs", "2nd ≈ 1st",
        [" / ".join("-" if v is None else f"{v:.0f}" for v in _max_rss_by_half(d)) for d in docs.values()])
    row("scheduler fd / thread growth", "-",
        [f"{d['scheduler_fd_growth']} / {d['scheduler_thread_growth']}" for d in docs.values()])
    row("plugin structures beyond their bound", "0", [len(d["bounds"]) for d in docs.values()])
    row("cache over capacity (samples)", "0", fig("cache_over_capacity"))
    row("cache evictions", "> 0", fig("evictions"))
    row("log lines per step (scheduler / workers)", "-",
        [f"{d['log_per_step']['scheduler_log_lines']} / {d['log_per_step']['worker_log_records']}"
         for d in docs.values()])  # fmt: skip
    row("hit rate (mean of runs) / median wall [s]", "-",
        [f"{d['hit_rate']} / {d['wall_s_median']}" for d in docs.values()])
    rows.append("")
    # hit rate per kind of phase (the event that began it), of the first soak
    d = docs[labels[0]]
    kinds: dict[str, list] = {}
    for ph in d["phases"]:
        kind = ph["after"].split(",")[0].strip()
        kind = "kill a worker" if kind.startswith("kill") else kind
        kinds.setdefault(kind, []).append(ph)
    rows += [f"Hit rate per phase ({labels[0]}; the runs after each kind of event):", "",
             "| after | phases | runs | hit rate | its first run's hit rate | peer hits per run |",
             "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for kind, phs in kinds.items():
        n = sum(p["runs"] for p in phs)
        hit = sum(p["hit_rate"] * p["runs"] for p in phs) / n
        first = [p["first_run_hit_rate"] for p in phs if p["first_run_hit_rate"] is not None]
        peer = sum(p["peer_hits"] for p in phs) / n
        rows.append(f"| {kind} | {len(phs)} | {n} | {hit:.2f} | "
                    f"{(sum(first) / len(first)) if first else float('nan'):.2f} | {peer:.0f} |")  # fmt: skip
    rows.append("")
    for label, d in docs.items():
        rows.append(f"{label}: `{d['config']['command']}`, commit `{str(d.get('commit'))[:7]}`, "
                    f"{d['machine']['cpu_count']} cores, {d['results']['soak_s'] / 60:.0f} min.")  # fmt: skip
        rows.append("")
    return "\n".join(rows)


def main(argv=None) -> int:
    cfg, out, name = parse_args(argv)
    if cfg is None:
        return child_main(*out)
    signal.signal(signal.SIGTERM, _interrupt)  # close the cluster as on Ctrl-C
    doc = run_soak(cfg)
    fig = analyse(doc, cfg)
    fig["bounds"] = check_bounds(fig, cfg, doc["chunk_ids"], doc["plugin_types"])
    config = {**dataclasses.asdict(cfg), "schedule": [
        {"step": s.step, "runs": [dataclasses.asdict(r) for r in s.runs], "events": s.events, "kill": s.kill}
        for s in make_schedule(cfg)]}  # fmt: skip
    config["command"] = "python benchmarks/soak.py " + " ".join(sys.argv[1:] if argv is None else argv)
    results = {"runs": doc["runs"], "datasets": doc["datasets"], "chunk_ids": doc["chunk_ids"],
               "references_s": doc["references_s"], "cluster_start_s": doc["cluster_start_s"],
               "soak_s": doc["soak_s"], "steps": doc["steps"], "plugin_types": doc["plugin_types"]}  # fmt: skip
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, f"{name}.json"), config, results, **fig, series=columnar(doc["samples"]))
    print_table(summary_rows(fig), title=f"soak: {fig['runs']} runs, {_shape(cfg)}, capacity {cfg.capacity}")
    grown = growing_rows(fig)
    if grown:
        print_table(grown, title="structures that grew after the warm-up")
    print_table(fig["phases"], columns=["from_run", "to_run", "after", "runs", "hit_rate", "peer_hits",
                                        "first_run_hit_rate", "median_wall_s"], title="hit rates per phase")  # fmt: skip
    for b in fig["bounds"]:
        print(f"BOUND VIOLATED: {b}")
    title = (f"{fig['runs']} runs, {_shape(cfg)}, capacity {cfg.capacity}; "
             f"scheduler {fig['scheduler_rss_mb_per_100_runs']} MB/100 runs, "
             f"workers {fig['worker_rss_mb_per_100_runs']} MB/100 runs")  # fmt: skip
    save_png(plot(doc, fig, title), os.path.join(out, f"{name}.png"))
    return 1 if fig["bounds"] else 0


if __name__ == "__main__":
    sys.exit(main())
