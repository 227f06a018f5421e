"""``dask scheduler --preload cacheaffinity`` and ``dask worker --preload cacheaffinity``
as real processes: the deployment path of an analysis facility."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from distributed import Client, get_worker

import cacheaffinity

BIN = Path(sys.executable).parent
CHUNKS = [f"uuid-{f}/Events/{i * 500}-{(i + 1) * 500}" for f in range(4) for i in range(8)]


def where_am_i(_chunk):
    return get_worker().address


def _wait_for(predicate, timeout=60, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


class Procs:
    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.procs: list[subprocess.Popen] = []
        # the workers import this test module to run its task functions
        path = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
        # placement alone: no stealing moves chunk tasks here (stealing has its tests)
        self.env = dict(
            os.environ, PYTHONPATH=path, DASK_CACHEAFFINITY__SCHEDULER__STEALING__ENABLED="False"
        )

    def start(self, *args, log):
        f = open(self.tmp / log, "w")
        p = subprocess.Popen(
            [str(BIN / "dask"), *args], stdout=f, stderr=subprocess.STDOUT, env=self.env
        )
        self.procs.append(p)
        return p

    def stop(self, p):
        p.send_signal(signal.SIGINT)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                self.stop(p)


@pytest.fixture
def procs(tmp_path):
    p = Procs(tmp_path)
    yield p
    p.close()


def start_worker(procs, address, name, directory):
    return procs.start(
        "worker", address, "--name", name, "--nthreads", "1", "--no-nanny",
        "--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0",
        "--preload", "cacheaffinity", "--cache-directory", str(directory),
        "--cache-capacity", "1 GiB",
        log=f"worker-{name}-{time.monotonic_ns()}.log",
    )  # fmt: skip


def _scheduler_task_count(dask_scheduler):
    return len(dask_scheduler.tasks)


@pytest.mark.timeout(180)
def test_preloaded_scheduler_and_workers_place_chunks_stably(procs, tmp_path):
    sched_file = tmp_path / "scheduler.json"
    procs.start(
        "scheduler", "--host", "127.0.0.1", "--port", "0",
        "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sched_file),
        "--preload", "cacheaffinity",
        log="scheduler.log",
    )  # fmt: skip
    _wait_for(sched_file.exists, what="scheduler file")
    address = json.loads(sched_file.read_text())["address"]
    dirs = {n: tmp_path / f"cache-{n}" for n in ("n1", "n2", "n3")}
    workers = {n: start_worker(procs, address, n, d) for n, d in dirs.items()}

    with Client(address, timeout=60) as client:
        client.wait_for_workers(3, timeout=60)
        info = cacheaffinity.check(client)
        node_ids = {(d / "node-id").read_text().strip() for d in dirs.values()}
        _wait_for(lambda: set(cacheaffinity.check(client)["nodes"]) == node_ids, 30, "nodes")
        homes = cacheaffinity.where(client, CHUNKS)
        assert {h["node"] for h in homes.values()} == node_ids

        futures = cacheaffinity.map_chunks(client, where_am_i, CHUNKS, chunk_ids=CHUNKS)
        run1 = client.gather(futures)
        # Let the scheduler forget run 1 before the workers stop: a result still in a
        # leaving worker's memory would be recomputed elsewhere, and the locator would
        # (rightly) send that chunk to the node that computed it last.
        del futures
        _wait_for(
            lambda: not client.run_on_scheduler(_scheduler_task_count), 30, "run 1 forgotten"
        )
        for ch, addr in zip(CHUNKS, run1):
            assert addr in homes[ch]["workers"]
        node_of_addr = {
            a: n for n, v in cacheaffinity.check(client)["nodes"].items() for a in v["workers"]
        }
        run1_nodes = [node_of_addr[a] for a in run1]

        # Restart every worker: new processes, new ports, same cache directories.
        old_addresses = set(client.scheduler_info()["workers"])
        for p in workers.values():
            procs.stop(p)
        _wait_for(lambda: not client.scheduler_info()["workers"], 60, "workers to leave")
        for n, d in dirs.items():
            start_worker(procs, address, n, d)
        client.wait_for_workers(3, timeout=60)
        _wait_for(lambda: set(cacheaffinity.check(client)["nodes"]) == node_ids, 30, "nodes")
        new_info = cacheaffinity.check(client)
        new_addresses = {a for v in new_info["nodes"].values() for a in v["workers"]}
        assert not (new_addresses & old_addresses), "workers came back on new ports"
        node_of_addr = {a: n for n, v in new_info["nodes"].items() for a in v["workers"]}

        run2 = client.gather(
            cacheaffinity.map_chunks(client, where_am_i, CHUNKS, chunk_ids=CHUNKS, pure=False)
        )
        events = client.get_events("cacheaffinity")
        assert run1_nodes == [homes[ch]["node"] for ch in CHUNKS], events
        assert [node_of_addr[a] for a in run2] == run1_nodes, "\n".join(map(str, events))
        assert info["placement"]["dimensions"] == 3
