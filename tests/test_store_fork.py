"""A ColumnCache forked while threads use it: every child uses the inherited
instance and finishes (the fork waits until no thread is inside SQLite).

Real directory, real SQLite, real ``os.fork()``: eight threads read and write one
cache while the main thread forks three children that each store and read a few
keys through the instance they inherited, then exit.  A child that does not exit
within :data:`CHILD_SECONDS` is killed and the test fails.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback

import numpy as np
import pytest

from cacheaffinity.worker._store import ColumnCache

THREADS = 8
CHILDREN = 3
CHILD_SECONDS = 30.0
KEYS = 5


def _expected(child: int, j: int) -> np.ndarray:
    return np.arange(200, dtype=np.int64) * (child + 1) + j


def _child(cache: ColumnCache, child: int) -> int:
    """What a forked child does with the inherited cache; its exit code."""
    for j in range(KEYS):
        cache[f"child{child}-{j}"] = _expected(child, j)
    for j in range(KEYS):
        got = cache.get(f"child{child}-{j}")
        if got is None or not np.array_equal(got, _expected(child, j)):
            return 2
    cache.get_many([f"t{t}-0" for t in range(THREADS)])
    cache.put_pack(f"child{child}", 0, 10, {"x": np.arange(10)})
    if not cache.get_packs(f"child{child}", 0, 10):
        return 3
    if not cache.flush(timeout=CHILD_SECONDS / 2):
        return 4
    cache.close()
    return 0


def _fork_child(cache: ColumnCache, child: int) -> int:
    pid = os.fork()
    if pid == 0:  # never returns into pytest
        code = 1
        try:
            code = _child(cache, child)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def _wait(pid: int, deadline: float) -> int | None:
    """The exit code of ``pid``, or None if it was still running at ``deadline`` (killed)."""
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


@pytest.mark.timeout(300)
@pytest.mark.parametrize("write_queue", [0, "64 MiB"], ids=["inline", "behind"])
def test_children_forked_from_a_busy_cache_use_it_and_exit(tmp_path, write_queue):
    cache = ColumnCache(tmp_path / "cache", capacity="256 MiB", write_queue=write_queue)
    stop = threading.Event()
    errors: list[BaseException] = []
    busy = threading.Barrier(THREADS + 1)

    def work(t: int) -> None:
        rng = np.random.default_rng(t)
        n = 0
        try:
            busy.wait(10)
            while not stop.is_set():
                cache[f"t{t}-{n % 20}"] = np.full(512, n, dtype=np.int64)
                cache.get(f"t{t}-{int(rng.integers(20))}")
                cache.get_many([f"t{(t + 1) % THREADS}-{i}" for i in range(5)])
                if n % 7 == 0:
                    cache.put_pack(f"g{t}", n, n + 10, {"a": np.arange(10)})
                    cache.get_packs(f"g{t}", 0, n + 10)
                n += 1
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(THREADS)]
    for th in threads:
        th.start()
    try:
        busy.wait(10)
        time.sleep(0.2)  # the threads are inside the index now and then
        pids = []
        for child in range(CHILDREN):
            pids.append((_fork_child(cache, child), time.monotonic() + CHILD_SECONDS))
            time.sleep(0.05)
        codes = [_wait(pid, deadline) for pid, deadline in pids]
    finally:
        stop.set()
        for th in threads:
            th.join(30)
    assert codes == [0] * CHILDREN, f"exit codes (None: hung, killed after {CHILD_SECONDS} s): {codes}"
    assert not errors, errors
    cache.flush(timeout=60)
    for child in range(CHILDREN):  # the children's writes reached the shared directory
        for j in range(KEYS):
            assert np.array_equal(cache[f"child{child}-{j}"], _expected(child, j))
    assert cache.verify()["corrupt"] == 0
    cache.close()
