"""The soak's measurements from this process (:mod:`benchmarks.soak`): :func:`sample` (one
sample of every figure, through the probes of :mod:`benchmarks._soak_probes`), and the
figures of a process (RSS, descriptors by kind, threads, connections) and of a cache
directory (index and data bytes, SQLite pages, entries, forms)."""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from benchmarks._soak_probes import _scheduler_probe, _worker_probe
from cacheaffinity.worker._directory import DATA_DIR
from cacheaffinity.worker._forms import FormStore

#: cache directory files of the SQLite index (``cacheaffinity.worker._store.layout``)
INDEX_FILES = ("columns.sqlite3", "columns.sqlite3-wal", "columns.sqlite3-shm")
BLOCK = 4096


def sample(soak, step, runs_done: int) -> dict:
    """One sample of the soak's figures after ``runs_done`` runs (the scheduler's and every
    worker's process, the plugins' structures, the cache directories, the logs), taken
    through ``soak`` (:class:`benchmarks.soak.Soak`: its admin client, cluster, work
    directory and the counts since the last sample)."""
    sched = _retry(lambda: soak.admin.run_on_scheduler(_scheduler_probe))
    workers = _retry(lambda: soak.admin.run(_worker_probe))
    s: dict[str, Any] = {"step": step.step, "run": runs_done, "event": step.describe() or None,
                         "time": round(time.time(), 1), "tasks_left": sched["tasks_left"]}  # fmt: skip
    s.update(_proc_figures(soak.cluster.scheduler.pid, "scheduler"))
    _net(s, sched["pools"], "scheduler_")
    # connections from this process (the nannies, the cluster object, the clients of the
    # same-process runs: their Dask pools open another one under concurrency and keep
    # it) are the harness's, not the scheduler's doing
    s["scheduler_harness_comms"] = _connections_from_here(soak.cluster.scheduler.pid)
    if s["scheduler_fds_net"] is not None and s["scheduler_harness_comms"] is not None:
        s["scheduler_fds_net"] -= s["scheduler_harness_comms"]
    # so are the connections the workers keep in their pools to the scheduler (heartbeats,
    # the peers' holder queries: a worker's pool opens another one when two of its
    # threads ask at once, and keeps it), as a worker's fds_net leaves out the others'
    workers_pooled = {a for w in workers.values() for a in w["pools"].get("pooled_local", ())}
    s["scheduler_pooled_by_workers"] = _connections_to(soak.cluster.scheduler.pid, workers_pooled)
    if s["scheduler_fds_net"] is not None and s["scheduler_pooled_by_workers"] is not None:
        s["scheduler_fds_net"] -= s["scheduler_pooled_by_workers"]
    s["plugin"] = sched["plugin"]
    soak.plugin_types.update(sched["plugin_types"])
    s["dask"] = sched["dask"]
    # scheduler log: lines its process wrote since the last sample
    lines = _count_lines(soak.workdir / "scheduler.log")
    s["scheduler_log_lines"] = lines - soak._log_lines
    soak._log_lines = lines
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
        old_pid, old_total, old_warn = soak._worker_logs.get(slot, (None, 0, 0))
        if old_pid != pid:
            old_total = old_warn = 0
        records += total - old_total
        warnings_ += warn - old_warn
        soak._worker_logs[slot] = (pid, total, warn)
        s["workers"][slot] = {"pid": pid, **fig, "plugin": w["plugin"],
                              "cache_bytes": w["stats"].get("bytes"), "cache_entries": w["stats"].get("entries"),
                              "capacity": w["stats"].get("capacity"), "evictions": w["stats"].get("evictions")}  # fmt: skip
        if w.get("directory"):  # by node: the directory ``node-<n>`` a node's processes share
            node = Path(w["directory"]).name.split("-", 1)[1]
            if node not in s["caches"]:
                s["caches"][node] = _cache_dir_figures(Path(w["directory"]))
    s["worker_log_records"] = records
    s["worker_log_warnings"] = warnings_
    n = soak._client_records.n
    s["client_log_records"] = n - getattr(soak, "_client_n", 0)
    soak._client_n = n
    # cache directories of slots without a live worker (scaled down) are measured too
    for d in sorted(soak.cache_root.glob("node-*")):
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
