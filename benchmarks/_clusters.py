"""Starting the benchmarks' clusters: the node shape, every mode's cluster, a scheduler
in a process of its own.

- :func:`node_cluster` (with :func:`parse_shape`, :func:`node_names`, :func:`slot_order`): the
  facility node shape, N cache nodes x P worker processes.  On an analysis facility several
  worker processes of one node (``dask worker --nworkers P``, dask-jobqueue's
  ``processes=``) share the node's cache directory; :func:`node_cluster` builds that on this
  machine: a ``SpecCluster`` of a scheduler and N x P nannies named ``"<node>-<process>"``,
  each started with its node's directory (``cacheaffinity.worker.directory``, as
  ``--cache-directory`` gives it); everything else is the Dask config in force, as
  ``LocalCluster`` gives it.
- :class:`ModeCluster`: one mode's cluster (:data:`benchmarks._runs.MODES`), its
  consecutive runs and the floors measured on it (consecutive_runs, beyond_capacity,
  warm_run_profile); :func:`wait_nodes` waits for its workers and cache nodes.
- :class:`SchedulerProcess` and :func:`scheduler_process_cluster`: a cluster whose
  scheduler runs in a process of its own (the soak measures that process).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dask
import psutil
from coffea import processor
from coffea.nanoevents import NanoAODSchema
from distributed import Client, LocalCluster, Nanny, Scheduler, SpecCluster
from distributed.deploy.spec import ProcessInterface

import cacheaffinity
from benchmarks import _floor, _gctimer, _native, _new_process_run
from benchmarks._memory import memory_buffers
from benchmarks._runs import ANALYSES, CACHED, COUNTERS, NATIVE, Config, chunks, client_run, delta, make_executor
from benchmarks._storage import Storage

__all__ = [
    "ModeCluster",
    "SchedulerProcess",
    "node_cluster",
    "node_names",
    "parse_shape",
    "scheduler_process_cluster",
    "slot_order",
    "wait_nodes",
]

# ----------------------------------------------------------------------------- node shape


def parse_shape(text: str) -> tuple[int, int]:
    """``"2x2"`` -> ``(2, 2)``: cache nodes x worker processes per node."""
    try:
        nodes, per_node = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"node shape {text!r}: give NODESxPROCESSES, e.g. 2x2 or 4x1") from None
    if nodes < 1 or per_node < 1:
        raise ValueError(f"node shape {text!r}: both numbers must be >= 1")
    return nodes, per_node


def node_names(nodes: int, per_node: int) -> list[str]:
    """The workers' names, node by node."""
    return [f"{n}-{p}" for n in range(nodes) for p in range(per_node)]


def slot_order(name: str) -> tuple[int, ...]:
    """Worker names in node order: ``"3"`` -> ``(3,)``, ``"1-0"`` -> ``(1, 0)``."""
    return tuple(int(x) for x in str(name).split("-"))


def node_cluster(nodes: int, per_node: int, directory: Callable[[int], Path], *,
                 local_directory: str | None = None, name: str = "nodes") -> SpecCluster:  # fmt: skip
    """A started cluster of ``nodes`` x ``per_node`` single-threaded worker processes on
    127.0.0.1; node ``n``'s processes share ``directory(n)``."""
    from distributed.worker_memory import parse_memory_limit

    total = nodes * per_node
    memory = parse_memory_limit("auto", 1, total, logger=logging.getLogger(__name__))
    workers = {}
    for n in range(nodes):
        for p in range(per_node):
            options = {
                "nthreads": 1, "host": "127.0.0.1", "memory_limit": memory, "silence_logs": logging.WARNING,
                "config": {"cacheaffinity.worker.directory": str(directory(n))},
            }  # fmt: skip
            if local_directory is not None:
                options["local_directory"] = local_directory
            workers[f"{n}-{p}"] = {"cls": Nanny, "options": options}
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"}}
    return SpecCluster(scheduler=scheduler, workers=workers, silence_logs=logging.WARNING, name=name)


# ----------------------------------------------------------------------------- mode clusters


def stock_steals(client, since: float) -> int:
    return sum(
        1
        for t, m in client.get_events("stealing")
        if t >= since and isinstance(m, (tuple, list)) and m and m[0] == "confirm"
    )


def wait_nodes(client, n: int, plugin: bool, timeout: float = 60.0, processes: int | None = None, *,
               warn: bool = True, poll: float = 0.1) -> None:  # fmt: skip
    """Wait until the cluster has ``processes`` (default ``n``) workers in ``n`` cache nodes
    (``plugin``: as the scheduler plugin counts them, :func:`cacheaffinity.check` with ``warn``);
    every ``poll`` seconds, up to ``timeout``."""
    deadline = time.monotonic() + timeout
    want = n if processes is None else processes
    while True:
        workers = len(client.scheduler_info(n_workers=-1)["workers"])
        nodes = len(cacheaffinity.check(client, warn=warn)["nodes"]) if plugin else n
        if workers == want and nodes == n:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"cluster has {workers} workers / {nodes} cache nodes, waited for {want} / {n}")
        time.sleep(poll)


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
        if cfg.admission is not None:
            self.settings["cacheaffinity.worker.admission"] = cfg.admission
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
        if cfg.other_packs and self.cached:
            self.fill_other_packs()
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
            wait_nodes(self.client, cfg.workers, True, processes=cfg.worker_processes)
        # new process: each run's child builds its own (this process only measures)
        self.executor = make_executor(self.mode, self.client) if self.process == "same" else None
        return self

    def fill_other_packs(self) -> None:
        """Each node's cache directory (``node-<n>``, before its workers start) holding
        ``cfg.other_packs`` packs of other data, as after earlier work (the store's own
        format, one data file per pack: :func:`benchmarks.store_scale.build`), with the
        mode's configured capacity recorded (a worker adopts the directory's: recorded at
        the packs' size, the node would be full before run 1)."""
        from dask.utils import parse_bytes

        from benchmarks.store_scale import build

        capacity = parse_bytes(self.settings["cacheaffinity.worker.capacity"])
        for n in range(self.cfg.workers):
            directory = self.cache_root / f"node-{n}"
            directory.mkdir(parents=True, exist_ok=True)
            build(str(directory), self.cfg.other_packs, capacity=capacity)

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

    def _membership_event(self) -> tuple[str | None, dict[str, float]]:
        """Before run 3, the last worker (its cache node) leaves; before run 4 a new one
        joins. The event and, before run 3, the removed node's shares: of the chunk tasks
        that ran (``removed_node_share``) and of the bytes the node caches held
        (``removed_node_bytes_share``: what a perfect cache loses)."""
        client, cfg = self.client, self.cfg
        if self.run_no == 3:
            names = {str(w["name"]): a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}
            leaving = names[str(max(int(n) for n in names))]
            shares: dict[str, float] = {}
            if self.plugin:
                nodes = cacheaffinity.check(client)["nodes"]
                node = next(n for n, d in nodes.items() if leaving in d["workers"])
                done = sum(d["counters"].get("on-target", 0) + d["counters"].get("off-target", 0) for d in nodes.values())
                mine = nodes[node]["counters"].get("on-target", 0) + nodes[node]["counters"].get("off-target", 0)
                if done:
                    shares["removed_node_share"] = mine / done
                held = {n: st.get("bytes") or 0 for n, st in cacheaffinity.cache_stats(client).items()}
                if sum(held.values()):
                    shares["removed_node_bytes_share"] = held.get(node, 0) / sum(held.values())
            self.cluster.scale(cfg.workers - 1)
            self.n_nodes = cfg.workers - 1
            wait_nodes(client, self.n_nodes, self.plugin)
            return f"removed worker {leaving}", shares
        if self.run_no == 4:
            # a new cache node: a new, empty directory (LocalCluster reuses the freed
            # worker name, so node-{name} would be the removed node coming back)
            added = {**self.settings, "cacheaffinity.worker.directory": str(self.cache_root / "added-{name}")}
            with dask.config.set(added):  # the new worker reads it when it starts
                self.cluster.scale(cfg.workers)
                client.wait_for_workers(cfg.workers)
            self.n_nodes = cfg.workers
            wait_nodes(client, self.n_nodes, self.plugin)
            return "added a worker with a new cache directory", {}
        return None, {}

    def _runner(self, **kw) -> processor.Runner:
        return processor.Runner(
            executor=self.executor, schema=NanoAODSchema, chunksize=self.cfg.chunksize,
            savemetrics=True, **kw,
        )  # fmt: skip

    def run(self) -> dict:
        """The next consecutive run: its row (wall, bytes, hit rate, ...)."""
        client, mode, storage = self.client, self.mode, self.storage
        self.run_no += 1
        event, shares = self._membership_event() if self.membership else (None, {})
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
            # the node's own cache: hits include the lookups packs fetched from peers answered
            "hit_rate": (d["hits"] - d.get("peer_hits", 0)) / lookups if cached and lookups else None,
            "hits": d.get("hits"),
            "misses": d.get("misses"),
            "peer_hits": d.get("peer_hits") if self.cached else None,  # cacheaffinity's peer fetch
            "cache_rate": d["hits"] / lookups if cached and lookups else None,  # served by caches
            "files_opened": d.get("storage_opens") if plugin else None,
            # uproot files the workers opened (coffea's preprocessing and chunk tasks,
            # cacheaffinity's misses): the same counter for every mode
            "file_opens": None if opens0 is None or opens1 is None
            else sum(n - opens0.get(w, 0) for w, n in opens1.items()),
            # the executor's figures of the run (cacheaffinity), as the run's client got them
            "last_run_stats": res["last_run_stats"],
            # what the workers read from block storage (not the page cache): cache entries
            # on the node's disk, and local dataset files (storage local)
            "disk_read_bytes": delta(disk0, disk1),
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
        row.update(shares)
        if plugin:
            c1 = cacheaffinity.check(client)["counters"]
            on = c1.get("on-target", 0) - c0.get("on-target", 0)
            off = c1.get("off-target", 0) - c0.get("off-target", 0)
            row["steals"] = c1.get("steals", 0) - c0.get("steals", 0)
            row["on_preferred"] = on / (on + off) if on + off else None
        elif mode not in ("coffea-affinity+cache", NATIVE):  # strict restrictions: no steals
            row["steals"] = stock_steals(client, since)
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
                "disk_read_bytes": delta(disk0, disk1), "gc_full_s": gc_run.get("full_s"),
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
        for i, (f, start, stop) in enumerate(chunks(files, self.cfg.chunksize)):
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


# ----------------------------------------------------------------------------- a scheduler process


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


def scheduler_process_cluster(workdir: Path, workers: int, per_node: int = 1, name: str = "soak") -> SpecCluster:
    """The soak's cluster (``name``): :class:`SchedulerProcess` and ``workers`` nannies named 0..W-1,
    as ``LocalCluster(n_workers=W, threads_per_worker=1, processes=True)`` makes them (the
    Dask config in force, cacheaffinity's preload and cache directory among it, is what
    the scheduler and every worker, later ones included, start with).  With ``per_node``
    P > 1, the facility node shape (:func:`benchmarks._clusters.node_cluster`): ``workers`` x P nannies named
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
        return SpecCluster(scheduler=scheduler, workers=specs, silence_logs=logging.WARNING, name=name)
    return SpecCluster(
        scheduler=scheduler, workers={i: worker for i in range(workers)}, worker=worker,
        silence_logs=logging.WARNING, name=name,
    )  # fmt: skip
