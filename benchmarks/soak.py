"""A soak: hundreds of runs on one long-lived cluster, and nothing grows.

One cluster lives for the whole soak: a scheduler with the cacheaffinity plugin in a
process of its own (so that its RSS is the scheduler's alone, not this client's), and W
worker processes under nannies in this process, as ``LocalCluster`` makes them (1 thread
each, worker names 0..W-1, each its own cache directory ``node-{name}`` with a capacity
small enough that the caches evict).  A deterministic schedule (``--seed``) of N runs
(``--runs``) mixes:

* three analyses: ``light`` (:class:`examples.analysis.DimuonJetProcessor`, ~10 branches),
  ``realistic`` (:class:`examples.realistic.TTbarLikeProcessor`, ~180 branches) and
  ``other`` (:class:`~benchmarks._soak_workload.OtherColumnsProcessor`: collections neither of the others reads:
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
  from a peer's included) and ``peer_hits`` (of the hits, lookups answered by packs fetched from peers).

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

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# the harness first: it sets the environment the workers inherit before coffea is imported
import benchmarks._runs  # noqa: E402, F401

import dask  # noqa: E402
from distributed import Client  # noqa: E402

import cacheaffinity  # noqa: E402
from benchmarks._clusters import scheduler_process_cluster, slot_order, wait_nodes  # noqa: E402
from benchmarks._common import portable_path, print_table, save_png, write_json  # noqa: E402
from benchmarks._soak_analysis import analyse, check_bounds, columnar, growing_rows, summary_rows  # noqa: E402
from benchmarks._soak_analysis import mean, progress_line, shape  # noqa: E402
from benchmarks._soak_figures import plot  # noqa: E402
from benchmarks._soak_measure import _alive, sample  # noqa: E402
from benchmarks._soak_probes import LOGGERS, SoakWorkerPlugin, _arm_kill, _install_on_scheduler  # noqa: E402
from benchmarks._soak_workload import (  # noqa: E402
    USERS,
    RunSpec,
    Step,
    User,
    chunk_ids,
    child_main,
    client_run,
    make_schedule,
    new_process_run,
    prepare_datasets,
    reference,
)

__all__ = ["Config", "Soak", "run_soak"]

from benchmarks._soak_config import DEFAULT_DATA, Config  # noqa: E402


# ----------------------------------------------------------------------------- probes
# They run in the scheduler and in the workers (sent by value, standard library only).


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
        self.cluster = stack.enter_context(scheduler_process_cluster(self.workdir, self.cfg.workers, self.cfg.per_node))
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
        wait_nodes(self.admin, n // self.cfg.per_node, True, self.wait_s if timeout is None else timeout,
                   processes=n, warn=False, poll=0.2)  # fmt: skip

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
        slot = sorted(addrs, key=slot_order)[slot_i % len(addrs)]
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
        return sample(self, step, runs_done)


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
            since: list[dict] = []  # runs since the last sample
            for i, step in enumerate(steps):
                rows = soak.run_step(step)
                done += len(rows)
                soak.runs.extend(rows)
                since += rows
                if (step.step % cfg.sample_every and i != len(steps) - 1 and not step.events
                        and step.kill is None):  # fmt: skip
                    continue
                s = soak.sample(step, done)
                s["hit_rate"] = mean([r["hit_rate"] for r in since])
                s["wall_s"] = mean([r["wall_s"] for r in since])
                soak.samples.append(s)
                if cfg.progress:
                    log(progress_line(since, s))
                since = []
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


# ----------------------------------------------------------------------------- output


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
    p.add_argument("--sample-every", type=int, default=d.sample_every,
                   help="steps between two samples (1: every step; a long soak: 10)")
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
        data=a.data, workdir=a.workdir, profiler=not a.no_profiler, sample_every=a.sample_every,
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


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


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
    # as results record paths (portable_path): no folder of this machine in the command
    config["command"] = "python benchmarks/soak.py " + " ".join(
        portable_path(a) if a.startswith("/") else a for a in (sys.argv[1:] if argv is None else argv))
    results = {"runs": doc["runs"], "datasets": doc["datasets"], "chunk_ids": doc["chunk_ids"],
               "references_s": doc["references_s"], "cluster_start_s": doc["cluster_start_s"],
               "soak_s": doc["soak_s"], "steps": doc["steps"], "plugin_types": doc["plugin_types"]}  # fmt: skip
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, f"{name}.json"), config, results, **fig, series=columnar(doc["samples"]))
    print_table(summary_rows(fig), title=f"soak: {fig['runs']} runs, {shape(cfg)}, capacity {cfg.capacity}")
    grown = growing_rows(fig)
    if grown:
        print_table(grown, title="structures that grew after the warm-up")
    print_table(fig["phases"], columns=["from_run", "to_run", "after", "runs", "hit_rate", "peer_hits",
                                        "first_run_hit_rate", "median_wall_s"], title="hit rates per phase")  # fmt: skip
    for b in fig["bounds"]:
        print(f"BOUND VIOLATED: {b}")
    title = (f"{fig['runs']} runs, {shape(cfg)}, capacity {cfg.capacity}; "
             f"scheduler {fig['scheduler_rss_mb_per_100_runs']} MB/100 runs, "
             f"workers {fig['worker_rss_mb_per_100_runs']} MB/100 runs")  # fmt: skip
    save_png(plot(doc, fig, title), os.path.join(out, f"{name}.png"))
    return 1 if fig["bounds"] else 0


if __name__ == "__main__":
    sys.exit(main())
