"""Cache writes behind the task: ColumnCache's background writer and get_many.

Real directories, real SQLite, real worker processes; the writer is blocked by
holding the index's real write lock from another connection.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from distributed import get_worker
from distributed.utils_test import gen_cluster

from cacheaffinity import CacheWorkerPlugin
from cacheaffinity.worker._store import INDEX_NAME, ColumnCache, MemoryFront


def values(n, size=1000):
    return {f"k{i}": np.arange(size, dtype=np.int64) * 3 + i for i in range(n)}


def test_queued_values_are_served_then_stored_identically(tmp_path):
    data = values(50)
    with ColumnCache(tmp_path / "c", capacity="1 GiB", write_queue="64 MiB") as cache:
        for k, v in data.items():
            cache[k] = v
        # served at once, whether still queued or already written
        for k, v in data.items():
            assert np.array_equal(cache.get(k), v)
        assert cache.flush(timeout=120)
        assert cache.pending() == 0
        assert len(cache) == 50 and cache.stats()["writes"] == 50
        assert cache.stats()["dropped"] == 0
    # another process's view: everything is in the index, checksums verify
    with ColumnCache(tmp_path / "c") as other:
        for k, v in data.items():
            got = other.get(k)
            assert got.dtype == v.dtype and np.array_equal(got, v)
        assert other.verify()["corrupt"] == 0


def test_values_queued_one_by_one_are_committed_in_batches(tmp_path, monkeypatch):
    """A task queues column after column with work in between: the writer, woken by
    the first, gathers the next ones (WRITE_COALESCE) and commits them together, not
    one index transaction per value; a flush does not wait out the gathering."""
    from cacheaffinity.worker._store import writer as store_module
    from cacheaffinity.worker._store import writes

    transactions = []
    store_many = writes.WritePath.store_many

    def counted(path, batch):
        transactions.append(len(batch))
        return store_many(path, batch)

    monkeypatch.setattr(writes.WritePath, "store_many", counted)
    data = values(60)
    with ColumnCache(tmp_path / "c", capacity="1 GiB", write_queue="64 MiB") as cache:
        t0 = time.monotonic()
        for k, v in data.items():
            cache[k] = v
            time.sleep(0.002)  # the task's own work between two columns
        queued = time.monotonic() - t0
        t0 = time.monotonic()
        assert cache.flush(timeout=60)
        assert time.monotonic() - t0 < store_module.WRITE_COALESCE + 1.0
        assert sum(transactions) == 60 and len(cache) == 60
        assert store_module.WRITE_COALESCE >= 0.01
        assert len(transactions) <= min(queued / store_module.WRITE_COALESCE + 2, 20), (queued, transactions)
        assert all(np.array_equal(cache[k], v) for k, v in data.items())
        cache["late"] = np.zeros(4)  # flushed at once, not after the gathering delay
        t0 = time.monotonic()
        assert cache.flush(timeout=60)
        assert time.monotonic() - t0 < 0.04  # the gathering (50 ms) was cut short
        assert "late" in cache


def test_entries_appear_in_the_index_only_after_the_write(tmp_path):
    with ColumnCache(tmp_path / "c", capacity="1 GiB", write_queue="64 MiB") as cache:
        blocker = sqlite3.connect(os.path.join(cache.directory, INDEX_NAME), timeout=60)
        blocker.execute("BEGIN IMMEDIATE")  # the writer thread waits for this lock
        try:
            cache["a"] = np.arange(10)
            assert cache.pending() == 1
            assert cache.totals()["entries"] == 0  # not yet committed
            assert not cache.flush(timeout=0.5)
            assert np.array_equal(cache.get("a"), np.arange(10))  # served from the queue
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert cache.flush(timeout=120)
        assert cache.totals()["entries"] == 1 and "a" in cache


def test_full_queue_drops_without_blocking(tmp_path, caplog):
    one = np.zeros(2**17, dtype=np.float64)  # 1 MiB
    with ColumnCache(tmp_path / "c", capacity="1 GiB", write_queue="3 MiB") as cache:
        blocker = sqlite3.connect(os.path.join(cache.directory, INDEX_NAME), timeout=60)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            t0 = time.perf_counter()
            for i in range(10):
                cache[f"v{i}"] = one + i
            elapsed = time.perf_counter() - t0
            stats = cache.stats()
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        # the writer was stuck on the index lock, yet no store waited for it
        assert elapsed < 5.0, elapsed
        assert stats["dropped"] == 7 and stats["skipped"] == 7
        assert "write queue" in caplog.text and "write-queue" in caplog.text
        assert caplog.text.count("write queue of cache") == 1  # one warning
        assert cache.flush(timeout=120)
        assert sorted(cache) == ["v0", "v1", "v2"]
        assert cache.get("v9") is None  # dropped: a miss
        assert np.array_equal(cache.get("v2"), one + 2)


def test_dropped_value_removes_an_older_value_of_its_key(tmp_path):
    big = np.zeros(2**17)
    with ColumnCache(tmp_path / "c", capacity="1 GiB", write_queue="1 MiB") as cache:
        cache["k"] = np.arange(5)
        assert cache.flush(timeout=120) and "k" in cache
        blocker = sqlite3.connect(os.path.join(cache.directory, INDEX_NAME), timeout=60)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            cache["filler"] = big
            cache["k"] = np.arange(6)  # does not fit: dropped
            assert cache.get("k") is None  # never the stale older value
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert cache.flush(timeout=120)
        assert "k" not in cache and cache.get("k") is None


def test_close_writes_what_is_queued(tmp_path):
    data = values(30)
    cache = ColumnCache(tmp_path / "c", capacity="1 GiB", write_queue="64 MiB")
    for k, v in data.items():
        cache[k] = v
    cache.close()
    with ColumnCache(tmp_path / "c") as other:
        assert len(other) == 30
        assert all(np.array_equal(other[k], v) for k, v in data.items())


def test_killed_writer_leaves_no_visible_partial_entry(tmp_path):
    """A process killed with writes queued leaves complete entries or none."""
    script = textwrap.dedent(
        f"""
        import os, signal, numpy as np
        from cacheaffinity.worker._store import ColumnCache
        c = ColumnCache({str(tmp_path / "c")!r}, capacity="1 GiB", write_queue="512 MiB")
        for i in range(200):
            c[f"k{{i}}"] = np.full(50_000, i, dtype=np.int64)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", script], env=env, timeout=300)
    assert proc.returncode == -9
    with ColumnCache(tmp_path / "c", stale_after=0, orphan_after=0) as cache:
        keys = list(cache)
        assert len(keys) < 200  # killed before it wrote everything
        for k in keys:
            assert np.array_equal(cache[k], np.full(50_000, int(k[1:]), dtype=np.int64))
        assert cache.verify()["corrupt"] == 0


def test_get_many_is_get_for_each_key(tmp_path):
    data = values(700, size=10)  # more keys than one index query takes
    with ColumnCache(tmp_path / "c", capacity="1 GiB") as cache:
        for k, v in data.items():
            cache[k] = v
        # damage one file: that key is a miss and its entry is removed
        row = cache.index.query("SELECT file FROM entries WHERE key = 'k3'")[0][0]
        with open(cache.files.path(row), "r+b") as f:
            f.write(b"\xff\xff")
        before = cache.stats()
        got = cache.get_many(list(data) + ["absent"])
        after = cache.stats()
        assert set(got) == set(data) - {"k3"}
        assert all(np.array_equal(got[k], data[k]) for k in got)
        assert after["hits"] - before["hits"] == 699
        assert after["misses"] - before["misses"] == 2 and after["corrupt"] == 1
        assert "k3" not in cache
        front = MemoryFront(cache, capacity="1 MiB")
        front["k3"] = data["k3"]
        assert set(front.get_many(["k3", "k4", "nope"])) == {"k3", "k4"}
        assert front.stats()["memory_hits"] == 1 and front.stats()["misses"] == 1


def test_write_queue_setting_is_checked(tmp_path):
    with pytest.raises(ValueError, match="write-queue=.*'256 MiB'"):
        ColumnCache(tmp_path / "c", write_queue="lots")
    with pytest.raises(ValueError, match="write-queue=-1 must be >= 0"):
        ColumnCache(tmp_path / "c", write_queue=-1)


def queue_columns(n):
    plugin = get_worker().plugins["cacheaffinity"]
    for i in range(n):
        plugin.cache[f"col{i}"] = np.full(1000, i, dtype=np.float32)
    return plugin.write_queue, plugin.cache.write_queue


@gen_cluster(
    client=True,
    nthreads=[("127.0.0.1", 1)],
    config={"cacheaffinity.worker.write-queue": "16 MiB"},
)
async def test_worker_writes_behind_and_stores_on_close(c, s, a, tmp_path):
    await c.register_plugin(CacheWorkerPlugin(directory=str(tmp_path / "node")))
    queue = await c.submit(queue_columns, 40, workers=[a.address])
    assert queue == (16 * 2**20, 16 * 2**20)
    await a.close()  # teardown writes what is still queued
    with ColumnCache(tmp_path / "node") as cache:
        assert len(cache) == 40
        assert all(np.array_equal(cache[f"col{i}"], np.full(1000, i, np.float32)) for i in range(40))
