"""Helpers shared by several test modules (``from helpers import ...``; tests/conftest.py
puts this directory on ``sys.path`` for tests/ and tests/unit/ alike).

- :func:`cache_client`: an in-process ``LocalCluster`` with the cacheaffinity
  preloads and one cache directory per worker, and its client;
- :func:`run_coffea`: one coffea ``Runner`` call over a fileset;
- :func:`counted`: the change of the cluster's cache totals across a call;
- :func:`fill`: a cache directory with ``n`` small plain entries;
- :class:`Processes`: ``dask`` command-line processes a test starts and stops.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

BIN = Path(sys.executable).parent


def preload_config(cache_root: Path, **extra: Any) -> dict[str, Any]:
    """dask config of a cluster with cacheaffinity's preloads, a cache directory
    per worker under ``cache_root``, and ``extra`` keys."""
    return {
        "distributed.scheduler.preload": ["cacheaffinity"],
        "distributed.worker.preload": ["cacheaffinity"],
        "cacheaffinity.worker.directory": str(cache_root / "node-{name}"),
        **extra,
    }


@contextlib.contextmanager
def cache_client(cache_root: Path, n_workers: int, **extra: Any) -> Iterator[Any]:
    """A client of an in-process ``LocalCluster`` (one thread per worker) with
    :func:`preload_config` set while it runs."""
    import dask
    from distributed import Client, LocalCluster

    with dask.config.set(preload_config(cache_root, **extra)):
        with LocalCluster(
            n_workers=n_workers, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster, Client(cluster) as c:
            yield c


def run_coffea(executor, fileset, processor_instance, chunksize: int, **kwargs):
    """``processor.Runner(executor, NanoAODSchema, chunksize, **kwargs)`` over the
    ``Events`` trees of ``fileset`` (coffea's own metadata cache unless
    ``metadata_cache=`` is given)."""
    from coffea import processor
    from coffea.nanoevents import NanoAODSchema

    runner = processor.Runner(executor=executor, schema=NanoAODSchema, chunksize=chunksize, **kwargs)
    return runner(fileset, processor_instance=processor_instance, treename="Events")


#: The figures :func:`counted` compares (0 when a cluster does not report one).
COUNTERS = (
    "hits", "misses", "storage_bytes", "storage_opens",
    "peer_hits", "peer_bytes", "peer_failed", "peer_served",
)  # fmt: skip


def counted(client, fn: Callable[[], Any], counters=COUNTERS) -> tuple[Any, dict[str, int]]:
    """``(fn(), delta)``: how much ``fn`` changed each of ``counters`` in
    ``cacheaffinity.cache_totals(client)``."""
    import cacheaffinity

    before = cacheaffinity.cache_totals(client)
    out = fn()
    after = cacheaffinity.cache_totals(client)
    return out, {k: after.get(k, 0) - before.get(k, 0) for k in counters}


def fill(directory, n: int = 3, capacity: str = "1 MiB", admission: str = "fifo") -> dict[str, np.ndarray]:
    """Store ``n`` plain entries (one 4 KiB block each) in a cache in ``directory``;
    returns them.  ``admission="fifo"`` (the default here) leaves the index as the
    entries alone make it (no admission state: tests that damage its pages)."""
    from cacheaffinity.worker._store import ColumnCache

    values = {f"uuid/Events/0-10/data/col{i}": np.arange(i, i + 300, dtype=np.int64) for i in range(n)}
    with ColumnCache(directory, capacity=capacity, admission=admission) as cache:
        for k, v in values.items():
            cache[k] = v
        assert len(cache) == n
    return values


class Processes:
    """``dask`` processes started by a test, stopped (SIGINT, then SIGKILL) at the end."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.procs: list[subprocess.Popen] = []

    def start(self, *args: str, log: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.Popen:
        with open(self.directory / log, "w") as f:
            p = subprocess.Popen(
                [str(BIN / "dask"), *args],
                stdout=f,
                stderr=subprocess.STDOUT,
                env=None if env is None else dict(os.environ, **env),
                cwd=cwd,
            )
        self.procs.append(p)
        return p

    def scheduler(self, name: str, *extra: str) -> Path:
        """Start ``dask scheduler`` on 127.0.0.1; returns its scheduler file."""
        scheduler_file = self.directory / f"{name}.json"
        self.start(
            "scheduler", "--host", "127.0.0.1", "--port", "0",
            "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(scheduler_file),
            *extra, log=f"{name}.log",
        )  # fmt: skip
        return scheduler_file

    def close(self) -> None:
        stop(self.procs)


def scheduler_address(scheduler_file: Path, log: Path, timeout: float = 60.0) -> str:
    """The address a ``dask scheduler`` wrote to ``scheduler_file``, once it has (the
    test fails with the scheduler's ``log`` after ``timeout`` seconds)."""
    import json
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            return json.loads(scheduler_file.read_text())["address"]
        except (FileNotFoundError, ValueError, KeyError):
            assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
            time.sleep(0.1)


def stop(procs: list[subprocess.Popen]) -> None:
    """Stop ``dask`` processes, newest first: the workers (SIGINT, each given 20 s, then
    SIGKILL) before the scheduler they talk to.  Interrupted together, a worker that
    hears the scheduler close while it handles its own SIGINT may hang in its close
    (seen: three workers killed after 20 s each)."""
    for group in (procs[1:][::-1], procs[:1]):
        for p in group:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in group:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
