"""What a worker says at start, with real ``dask scheduler``/``dask worker`` processes and a
real small file system: one INFO line (node id, directory, file system, capacity, free
space, sharing mode), and a capacity larger than the disk warned about and clamped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from distributed import Client

import cacheaffinity
from helpers import Processes
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
        deadline = time.monotonic() + 60
        while True:
            try:
                address = json.loads(scheduler_file.read_text())["address"]
                break
            except (FileNotFoundError, ValueError, KeyError):
                assert time.monotonic() < deadline, logs["scheduler"].read_text()
                time.sleep(0.1)
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
