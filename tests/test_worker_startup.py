"""What a worker says at start, with real ``dask scheduler``/``dask worker`` processes and a
real small file system: one INFO line (node id, directory, file system, capacity, free
space, sharing mode), and a capacity larger than the disk warned about and clamped."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from distributed import Client

import cacheaffinity
from helpers import Processes, scheduler_address
from testbed import skip_or_fail

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0755", "tmpfs", str(mnt)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if r.returncode:
        skip_or_fail(f"mounting a tmpfs needs root and mount(8): {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=60)


@pytest.mark.timeout(240)
def test_one_startup_line_and_a_capacity_larger_than_the_disk(tmp_path, small_disk):
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    procs = Processes(tmp_path)
    logs = {name: tmp_path / f"{name}.log" for name in ("scheduler", "worker")}
    try:
        scheduler_file = tmp_path / "scheduler.json"
        procs.start(
            "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address",
            "127.0.0.1:0", "--scheduler-file", str(scheduler_file), "--preload", "cacheaffinity",
            log="scheduler.log", env=env,
        )  # fmt: skip
        address = scheduler_address(scheduler_file, logs["scheduler"])
        directory = small_disk / "cache"
        procs.start(
            "worker", address, "--name", "w1", "--nthreads", "1", "--no-nanny", "--host",
            "127.0.0.1", "--dashboard-address", "127.0.0.1:0", "--preload", "cacheaffinity",
            "--cache-directory", str(directory), "--cache-capacity", "1GiB",
            log="worker.log", env=env,
        )  # fmt: skip
        with Client(address, timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
            node = (directory / "node-id").read_text().strip()
            deadline = time.monotonic() + 30
            while node not in cacheaffinity.cache_stats(client):
                assert time.monotonic() < deadline, logs["worker"].read_text()
                time.sleep(0.2)
            stats = cacheaffinity.cache_stats(client)[node]
    finally:
        procs.close()
    log = logs["worker"].read_text()
    starts = [line for line in log.splitlines() if "cacheaffinity worker cache:" in line]
    assert len(starts) == 1, log
    (line,) = starts
    assert "INFO" in line and f"node {node}" in line and f"directory {directory}" in line
    assert "tmpfs" in line and "free " in line and "private" in line
    # the 1 GiB setting is clamped to what the 16 MiB file system holds, and said so
    assert stats["configured_capacity"] == 2**30
    assert 0 < stats["capacity"] < 16 * 2**20
    assert stats["uncached"] is None
    warned = [x for x in log.splitlines() if "WARNING" in x and "cacheaffinity" in x]
    assert len(warned) == 1 and "capacity" in warned[0], warned


@pytest.mark.timeout(300)
def test_a_given_capacity_applies_to_an_existing_directory(tmp_path):
    from helpers import fill

    def _worker_capacities(dask_worker):  # nested: sent by value to the workers
        stats = dask_worker.plugins["cacheaffinity"].stats(flush=False)
        return stats["capacity"], stats["configured_capacity"]

    directory = tmp_path / "cache"
    fill(directory, n=10, capacity="1 MiB")  # recorded: 1 MiB, 10 entries of one 4 KiB block
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    worker_args = (
        "--nthreads", "1", "--no-nanny", "--host", "127.0.0.1", "--dashboard-address",
        "127.0.0.1:0", "--preload", "cacheaffinity", "--cache-directory", str(directory),
    )  # fmt: skip
    procs = Processes(tmp_path)
    try:
        scheduler_file = procs.scheduler("scheduler", "--preload", "cacheaffinity")
        address = scheduler_address(scheduler_file, tmp_path / "scheduler.log")
        with Client(address, timeout=60) as client:
            # --cache-capacity: recorded, the 6 oldest entries evicted at start
            procs.start("worker", address, "--name", "w1", *worker_args, "--cache-capacity", "16 KiB",
                        log="w1.log", env=env)  # fmt: skip
            client.wait_for_workers(1, timeout=60)
            node = (directory / "node-id").read_text().strip()
            stats = cacheaffinity.cache_stats(client)[node]
            assert stats["capacity"] == stats["configured_capacity"] == 16 * 2**10
            assert stats["bytes"] <= 16 * 2**10 and stats["entries"] == 4
            (w1,) = client.scheduler_info()["workers"]
            # the setting (any Dask config source), given to a second process: the last one wins,
            # and the first follows it
            procs.start("worker", address, "--name", "w2", *worker_args, log="w2.log",
                        env={**env, "DASK_CACHEAFFINITY__WORKER__CAPACITY": "32 KiB"})  # fmt: skip
            client.wait_for_workers(2, timeout=60)
            capacities = client.run(_worker_capacities)
            assert set(capacities.values()) == {(32 * 2**10, 32 * 2**10)}, capacities
            # no size given: the recorded one is used, not the 10 GiB default
            procs.start("worker", address, "--name", "w3", *worker_args, log="w3.log", env=env)
            client.wait_for_workers(3, timeout=60)
            capacities = client.run(_worker_capacities)
            assert set(capacities.values()) == {(32 * 2**10, 32 * 2**10)}, capacities
            stats = cacheaffinity.cache_stats(client)[node]
            assert stats["capacity"] == 32 * 2**10 and len(stats["workers"]) == 3
            assert w1 in stats["workers"]
    finally:
        procs.close()
    logs = {name: (tmp_path / f"{name}.log").read_text() for name in ("w1", "w2", "w3")}
    changed = [line for line in logs["w1"].splitlines() if "->" in line and "cacheaffinity" in line]
    assert len(changed) == 2, logs["w1"]
    assert "INFO" in changed[0] and f"cache directory {directory}: capacity 1.00 MiB -> 16.00 kiB" in changed[0]
    assert "(--cache-capacity / cacheaffinity.worker.capacity); evicted the 6 oldest entries" in changed[0]
    assert "16.00 kiB -> 32.00 kiB, recorded by another process" in changed[1]
    assert "capacity 16.00 kiB -> 32.00 kiB (--cache-capacity" in logs["w2"]
    assert "->" not in "".join(line for line in logs["w3"].splitlines() if "cacheaffinity" in line)
    assert "records capacity 32.00 kiB" in logs["w3"]
