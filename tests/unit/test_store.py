"""Tests of the worker's column store (:mod:`cacheaffinity.worker._store`).

Real directories, real processes (killed with SIGKILL too), real mounts (a 2 MiB
tmpfs for a full disk, read-only bind mounts): nothing of the file system is
mocked.  The mount tests need root (CAP_SYS_ADMIN) and say so when skipped.
"""

from __future__ import annotations

import errno
import glob
import json
import logging
import multiprocessing
import os
from pathlib import Path
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest

from testbed import skip_or_fail
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cacheaffinity.config  # noqa: F401  (registers the config defaults)
from cacheaffinity.worker._store import (
    BLOCK,
    DATA_DIR,
    INDEX_NAME,
    TMP_DIR,
    ColumnCache,
    MemoryFront,
)

LOGGER = "cacheaffinity.worker"
UUID = "a9e1c3f2-5b7d-11ee-8c99-0242ac120002"


# ---------------------------------------------------------------- helpers
def chunk_key(i: int, branch: str = "Muon_pt") -> str:
    """A coffea buffer key of chunk ``i``."""
    return f"{UUID}/%2FEvents%3B1/{1000 * i}-{1000 * (i + 1)}/data/{branch}%2C%21load%2C%21content"


_DTYPES = [np.float32, np.int32, np.int64, np.uint8, np.bool_, np.float64]


def content(key: str, max_bytes: int = 64 * 1024) -> np.ndarray:
    """A deterministic array derived from ``key``: dtype, length and values."""
    h = xxhash.xxh64_intdigest(key.encode())
    dtype = np.dtype(_DTYPES[h % len(_DTYPES)])
    n = (h >> 8) % (max_bytes // dtype.itemsize + 1)
    rng = np.random.default_rng(h)
    return rng.integers(0, 200, n).astype(dtype)


def assert_same(got, expected) -> None:
    assert isinstance(got, np.ndarray)
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    assert np.array_equal(got, expected, equal_nan=expected.dtype.kind in "fc")


def data_files(directory) -> list[str]:
    return sorted(glob.glob(os.path.join(directory, DATA_DIR, "*", "*")))


def temporaries(directory) -> list[str]:
    return sorted(glob.glob(os.path.join(directory, TMP_DIR, "*")))


def warnings_of(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


def _sample_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    floats = rng.normal(size=1000).astype(np.float64)
    floats[3] = np.nan
    matrix = np.arange(24, dtype=np.int16).reshape(4, 6)
    return {
        chunk_key(0, "Muon_pt"): rng.normal(size=1000).astype(np.float32),
        chunk_key(0, "Jet_eta"): floats,
        chunk_key(0, "nMuon"): rng.integers(0, 5, 1000).astype(np.int32),
        chunk_key(0, "Muon_offsets"): np.cumsum(rng.integers(0, 5, 1001)).astype(np.int64),
        chunk_key(0, "Muon_isTight"): rng.random(777) > 0.5,
        chunk_key(0, "Jet_jetId"): rng.integers(0, 255, 333).astype(np.uint8),
        chunk_key(0, "matrix"): matrix,
        chunk_key(0, "fortran"): np.asfortranarray(matrix.astype(np.float32)),
        chunk_key(0, "strided"): np.arange(100, dtype=np.int64)[::3],
        chunk_key(0, "empty"): np.zeros(0, np.float32),
        chunk_key(0, "empty2d"): np.zeros((0, 3), np.int64),
        chunk_key(0, "scalar"): np.array(7.5),
        chunk_key(0, "complex"): (rng.normal(size=10) + 1j).astype(np.complex64),
        chunk_key(0, "time"): np.array(["2024-01-01", "2025-06-30"], dtype="M8[s]"),
        chunk_key(0, "bytes"): np.array([b"ab", b"xyz"]),
        chunk_key(0, "big"): rng.normal(size=3 * 2**20 // 8),  # 3 MiB
    }


def check_mapping(m) -> None:
    """The MutableMapping contract, with arrays of many dtypes and shapes."""
    samples = _sample_arrays()
    missing = chunk_key(99, "missing")
    assert len(m) == 0
    assert list(m) == []
    assert missing not in m
    with pytest.raises(KeyError):
        m[missing]
    assert m.get(missing) is None
    assert m.get(missing, "default") == "default"

    for key, value in samples.items():
        m[key] = value
    assert len(m) == len(samples)
    assert sorted(m) == sorted(samples)
    for key, value in samples.items():
        assert key in m
        assert_same(m[key], value)
        assert_same(m.get(key), value)
        assert_same(m.get(key, "default"), value)

    key = chunk_key(0, "Muon_pt")
    m[key] = np.arange(5, dtype=np.int16)  # replace, with another dtype
    assert_same(m[key], np.arange(5, dtype=np.int16))
    assert len(m) == len(samples)
    del m[key]
    assert key not in m
    assert len(m) == len(samples) - 1
    with pytest.raises(KeyError):
        del m[key]
    with pytest.raises(KeyError):
        m[key]

    m.update({"u1": np.ones(3, np.float32), "u2": np.zeros(2, np.bool_)})
    assert_same(m["u2"], np.zeros(2, np.bool_))
    assert_same(m.pop("u1"), np.ones(3, np.float32))
    assert "u1" not in m
    with pytest.raises(KeyError):
        m.pop("u1")
    assert m.pop("u1", None) is None
    assert_same(m.setdefault("u2", np.ones(1)), np.zeros(2, np.bool_))

    m.clear()
    assert len(m) == 0
    assert list(m) == []
    assert m.get(chunk_key(0, "big")) is None


# ------------------------------------------------------------- contract
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda d: ColumnCache(d, capacity="100 MiB"), id="ColumnCache"),
        pytest.param(
            lambda d: MemoryFront(ColumnCache(d, capacity="100 MiB"), capacity="64 MiB"),
            id="MemoryFront",
        ),
        pytest.param(
            lambda d: MemoryFront(ColumnCache(d, capacity="100 MiB"), capacity=1024),
            id="MemoryFront-tiny-memory",
        ),
        pytest.param(lambda d: MemoryFront(None, capacity="64 MiB"), id="MemoryFront-no-store"),
    ],
)
def test_mapping_contract(tmp_path, make):
    check_mapping(make(tmp_path / "cache"))


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    with ColumnCache(tmp_path_factory.mktemp("roundtrip"), capacity="64 MiB") as cache:
        yield cache


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    value=hnp.arrays(
        dtype=st.one_of(
            hnp.boolean_dtypes(),
            hnp.integer_dtypes(),
            hnp.unsigned_integer_dtypes(),
            hnp.floating_dtypes(),
            hnp.complex_number_dtypes(),
            hnp.datetime64_dtypes(),
            hnp.byte_string_dtypes(),
            hnp.unicode_string_dtypes(),
        ),
        shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=20),
    )
)
def test_any_plain_array_reads_back_identical(shared_cache, value):
    shared_cache["value"] = value
    got = shared_cache["value"]
    assert got.dtype == value.dtype and got.shape == value.shape
    assert got.tobytes() == np.ascontiguousarray(value).tobytes()


def _forked_child(cache, queue):
    with cache:  # the parent's instance, inherited by fork
        cache["child"] = np.arange(5)
        queue.put((cache["parent"].tolist(), cache.stats()["hits"]))


def test_cache_used_across_fork(tmp_path):
    with ColumnCache(tmp_path, capacity="1 MiB") as cache:
        cache["parent"] = np.arange(3)
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_forked_child, args=(cache, queue))
        child.start()
        assert queue.get(timeout=60) == ([0, 1, 2], 1)
        child.join(timeout=60)
        assert child.exitcode == 0
        assert_same(cache["child"], np.arange(5))  # the parent's connection still works
        cache["after"] = np.arange(2)
        assert sorted(cache) == ["after", "child", "parent"]


def test_every_store_says_what_it_offers(tmp_path):
    """Stores implement ColumnStore by subclassing it; a plain mapping is a store
    of plain entries and no packs (MappingStore), never a silent attribute miss."""
    from cacheaffinity.worker._peers import PeerStore
    from cacheaffinity.worker._store.protocol import (
        ColumnStore, MappingStore, column_store, fetch_packs, get_many, get_packs, put_pack,
    )  # fmt: skip

    assert issubclass(PeerStore, ColumnStore)
    with ColumnCache(tmp_path, capacity="1 MiB") as cache:
        front = MemoryFront(cache, capacity="1 MiB")
        for store in (cache, front):
            assert isinstance(store, ColumnStore) and column_store(store) is store
        put_pack(front, "g", 0, 2, {"x": np.arange(2)})
        assert [p.start for p in get_packs(front, "g", 0, 2)] == [0]
        assert fetch_packs(front, "g", 0, 2) == [] and fetch_packs(cache, "g", 0, 2) == []
    plain = {"a": np.arange(2)}
    assert not isinstance(plain, ColumnStore) and isinstance(column_store(plain), MappingStore)
    put_pack(plain, "g", 0, 2, {"x": np.arange(2)})
    assert list(plain) == ["a"] and get_packs(plain, "g", 0, 2) == []
    assert list(get_many(plain, ["a", "b"])) == ["a"]

    class Forgetful(ColumnStore):  # no put_pack: cannot be made at all
        def get(self, key, default=None):
            return default

        def get_many(self, keys):
            return {}

        def get_packs(self, grp, start, stop):
            return []

        def count_served(self, hits=0, misses=0, nbytes=0):
            pass

    with pytest.raises(TypeError, match="put_pack"):
        Forgetful()


def test_memory_front_reads_a_store_filled_by_another_front(tmp_path):
    samples = _sample_arrays()
    with ColumnCache(tmp_path, capacity="100 MiB") as store:
        front = MemoryFront(store, capacity="64 MiB")
        front.update(samples)
    with ColumnCache(tmp_path, capacity="100 MiB") as store:
        front = MemoryFront(store, capacity="64 MiB")
        for key, value in samples.items():
            assert_same(front.get(key), value)  # from disk
            assert_same(front.get(key), value)  # from memory
        assert front.get("nothing") is None
        stats = front.stats()
        assert stats["hits"] == 2 * len(samples)
        assert stats["memory_hits"] == len(samples)
        assert stats["misses"] == 1
        assert store.stats()["hits"] == len(samples)


# ----------------------------------------------------------- validation
@pytest.mark.parametrize(
    "key, value, words",
    [
        pytest.param("k/objects", np.array([1, None]), ["'k/objects'", "object"], id="object"),
        pytest.param("k/mixed", [1, "a", None], ["'k/mixed'", "object"], id="mixed-list"),
        pytest.param(
            "k/struct",
            np.zeros(3, dtype=[("a", "i4"), ("b", "f8")]),
            ["'k/struct'", "structured"],
            id="structured",
        ),
        pytest.param(b"bytes-key", np.zeros(3), ["str", "bytes"], id="bytes-key"),
        pytest.param(7, np.zeros(3), ["str", "int"], id="int-key"),
    ],
)
def test_unstorable_values_raise_type_error(tmp_path, key, value, words):
    with ColumnCache(tmp_path, capacity="1 MiB") as cache:
        with pytest.raises(TypeError) as info:
            cache[key] = value
        for word in words:
            assert word in str(info.value)
        with pytest.raises(TypeError):
            MemoryFront(cache, capacity="1 MiB")[key] = value
        assert len(cache) == 0
        assert data_files(tmp_path) == []


def test_nothing_but_raw_bytes_and_plain_values_on_disk(tmp_path):
    samples = _sample_arrays()
    with ColumnCache(tmp_path, capacity="100 MiB") as cache:
        cache.update(samples)
    con = sqlite3.connect(tmp_path / INDEX_NAME)
    rows = con.execute(
        "SELECT key, file, toc, typeof(key), typeof(file), typeof(toc), "
        "typeof(nbytes), typeof(checksum), length(checksum) FROM entries"
    ).fetchall()
    con.close()
    assert len(rows) == len(samples)
    for key, name, toc, *types in rows:
        assert types == ["text", "text", "text", "integer", "blob", 8]
        # the table of contents is JSON of plain values: member, dtype string, shape, offset
        ((member, dtype, shape, offset),) = json.loads(toc)
        arr = np.asarray(samples[key])
        assert (member, dtype, shape, offset) == ("", arr.dtype.str, list(arr.shape), 0)
        (path,) = glob.glob(os.path.join(tmp_path, DATA_DIR, "*", name))
        with open(path, "rb") as f:
            # the data file is the array's raw bytes, nothing else (no pickle)
            assert f.read() == np.ascontiguousarray(samples[key]).tobytes()


# -------------------------------------------------------------- eviction
def test_fifo_eviction_oldest_first_and_reads_do_not_refresh(tmp_path):
    def item(i):
        return np.full(BLOCK // 4, i, np.float32)  # exactly one block

    with ColumnCache(tmp_path, capacity=10 * BLOCK, admission="fifo") as cache:
        for i in range(10):
            cache[f"k{i}"] = item(i)
        assert len(cache) == 10
        assert cache.volume() == 10 * BLOCK
        assert_same(cache["k0"], item(0))  # reading the oldest ...
        cache["k10"] = item(10)  # ... does not save it
        assert list(cache) == [f"k{i}" for i in range(1, 11)]
        cache["big"] = np.zeros(3 * BLOCK, np.uint8)  # three blocks: three go
        assert list(cache) == [f"k{i}" for i in range(4, 11)] + ["big"]
        cache["k4"] = item(4)  # storing again makes it the newest
        assert list(cache) == [f"k{i}" for i in range(5, 11)] + ["big", "k4"]
        assert cache.volume() == 10 * BLOCK
        assert len(data_files(tmp_path)) == 8
        stats = cache.stats()
        assert stats["evictions"] == 4
        assert stats["bytes_evicted"] == 4 * BLOCK
        assert stats["writes"] == 13
        for i in range(5, 11):
            assert_same(cache[f"k{i}"], item(i))


def test_value_larger_than_capacity_is_not_stored_and_warned_once(tmp_path, caplog):
    with ColumnCache(tmp_path, capacity=4 * BLOCK) as cache:
        cache["k"] = np.zeros(10)
        caplog.set_level(logging.DEBUG, LOGGER)
        cache["k"] = np.zeros(5 * BLOCK, np.uint8)  # replaces k: the old value goes
        cache["k2"] = np.zeros(9 * BLOCK, np.uint8)
        assert cache.get("k") is None and "k" not in cache
        assert cache.get("k2") is None
        (record,) = warnings_of(caplog)
        assert "'k'" in record.getMessage()
        assert "cacheaffinity.worker.capacity" in record.getMessage()
        assert cache.stats()["skipped"] == 2
        assert data_files(tmp_path) == []


# ------------------------------------------------- threads and processes
def test_threads_share_one_cache(tmp_path):
    keys = [chunk_key(i) for i in range(40)]
    wrong, reads = [], []
    start = threading.Barrier(4)
    with ColumnCache(tmp_path, capacity=256 * 1024) as cache:

        def work(seed):
            rng = random.Random(seed)
            start.wait()
            for _ in range(300):
                key = rng.choice(keys)
                if rng.random() < 0.5:
                    cache[key] = content(key)
                else:
                    value = cache.get(key)
                    reads.append(value is not None)
                    if value is not None and not np.array_equal(value, content(key)):
                        wrong.append(key)

        threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = cache.stats()
        assert wrong == []
        assert stats["hits"] == sum(reads)
        assert stats["hits"] + stats["misses"] == len(reads)
        assert stats["evictions"] > 0
        assert stats["errors"] == 0
        assert cache.volume() <= cache.capacity


_WORKER = textwrap.dedent(
    """
    import importlib.util, json, random, sys, threading
    import numpy as np
    spec = importlib.util.spec_from_file_location("store_tests", sys.argv[1])
    tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tests)
    from cacheaffinity.worker._store import ColumnCache

    directory, (seed, ops, capacity) = sys.argv[2], map(int, sys.argv[3:6])
    keys = [tests.chunk_key(i, b) for i in range(30) for b in ("Muon_pt", "Jet_pt")]
    out = dict(reads=0, hits=0, wrong=0)
    lock = threading.Lock()
    cache = ColumnCache(directory, capacity=capacity)
    print("ready", flush=True)
    sys.stdin.readline()  # the parent starts all processes at once

    def work(seed):
        rng = random.Random(seed)
        for _ in range(ops):
            key = rng.choice(keys)
            if rng.random() < 0.5:
                cache[key] = tests.content(key, 200_000)
            else:
                value = cache.get(key)
                ok = value is None or (
                    value.dtype == tests.content(key, 200_000).dtype
                    and np.array_equal(value, tests.content(key, 200_000))
                )
                with lock:
                    out["reads"] += 1
                    out["hits"] += value is not None
                    out["wrong"] += not ok

    threads = [threading.Thread(target=work, args=(seed * 10 + t,)) for t in range(2)]
    for t in threads: t.start()
    for t in threads: t.join()
    out["stats"] = cache.stats()
    cache.close()
    print(json.dumps(out), flush=True)
    """
)


def _start(script: str, *args) -> subprocess.Popen:
    # the child imports this file, which imports testbed/ of the repository: give it the
    # repository root whatever directory pytest runs from
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=path),
    )
    line = proc.stdout.readline()
    assert line.strip() == "ready", proc.stderr.read()
    return proc


@pytest.mark.parametrize("n_processes", [pytest.param(2, id="2"), pytest.param(4, id="4")])
def test_processes_share_one_directory_under_eviction(tmp_path, n_processes):
    capacity = 1_000_000  # ~10 values: constant eviction
    procs = [
        _start(_WORKER, __file__, tmp_path, seed, 250, capacity) for seed in range(n_processes)
    ]
    for proc in procs:  # go
        proc.stdin.write("\n")
        proc.stdin.flush()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "Traceback" not in err, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(r["wrong"] for r in results) == 0
    assert sum(r["hits"] for r in results) > 0
    assert sum(r["stats"]["evictions"] for r in results) > 0
    assert sum(r["stats"]["errors"] for r in results) == 0
    with ColumnCache(tmp_path, capacity=capacity, stale_after=0) as cache:
        assert cache.volume() <= capacity
        assert cache.verify()["corrupt"] == 0
        assert len(data_files(tmp_path)) == len(cache)
        for key in cache:
            assert_same(cache[key], content(key, 200_000))
    assert temporaries(tmp_path) == []


_KILLED_WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from cacheaffinity.worker._store import ColumnCache
    directory, capacity, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    values = {f"k{i}": np.full(2**21, i + seed, np.float64) for i in range(6)}  # 16 MiB each
    cache = ColumnCache(directory, capacity=capacity)
    print("ready", flush=True)
    while True:
        for key, value in values.items():
            cache[key] = value
    """
)


def test_writer_killed_mid_write_leaves_nothing_wrong(tmp_path):
    rng = random.Random(1)
    capacity = 64 * 2**20
    for seed in range(6):
        proc = _start(_KILLED_WRITER, tmp_path, capacity, seed)
        time.sleep(rng.uniform(0.05, 0.6))  # the random moment of the crash
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()
        proc.stdin.close()
        assert proc.returncode == -signal.SIGKILL
        # Between crashes: every entry reads back right (from any writer
        # generation) or is a miss.
        with ColumnCache(tmp_path, capacity=capacity) as cache:
            for i in range(6):
                value = cache.get(f"k{i}")
                if value is not None:
                    assert value.shape == (2**21,) and value.dtype == np.float64
                    assert value[0] - i in range(seed + 1) and (value == value[0]).all()
    left = temporaries(tmp_path)
    with ColumnCache(tmp_path, capacity=capacity, stale_after=0) as cache:
        assert temporaries(tmp_path) == []  # stale temporaries removed on open
        assert cache.stats()["temporaries_removed"] == len(left)
        report = cache.verify()
        assert report["corrupt"] == 0
        # orphans (killed between rename and commit) are gone too
        assert len(data_files(tmp_path)) == len(cache) == report["ok"]
        assert cache.volume() <= capacity


def test_stale_temporaries_removed_on_open_fresh_ones_kept(tmp_path):
    ColumnCache(tmp_path, capacity="1 MiB").close()
    stale = os.path.join(tmp_path, TMP_DIR, "0" * 32 + ".tmp")
    fresh = os.path.join(tmp_path, TMP_DIR, "1" * 32 + ".tmp")
    for path in (stale, fresh):
        with open(path, "wb") as f:
            f.write(b"half a value")
    an_hour_ago = time.time() - 3600
    os.utime(stale, (an_hour_ago, an_hour_ago))
    with ColumnCache(tmp_path, capacity="1 MiB", stale_after=600) as cache:
        assert not os.path.exists(stale)
        assert os.path.exists(fresh)
        assert cache.stats()["temporaries_removed"] == 1


# ------------------------------------------------------------ integrity
def _flip_byte(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))


def _truncate_one(path):
    os.truncate(path, os.path.getsize(path) - 1)


def _truncate_all(path):
    os.truncate(path, 0)


def _append_byte(path):
    with open(path, "ab") as f:
        f.write(b"\0")


@pytest.mark.parametrize(
    "damage, reason",
    [
        pytest.param(_flip_byte, "checksum", id="flipped-byte"),
        pytest.param(_truncate_one, "holds", id="truncated-by-one"),
        pytest.param(_truncate_all, "holds 0 bytes", id="truncated-to-zero"),
        pytest.param(_append_byte, "longer", id="extra-byte"),
    ],
)
@pytest.mark.parametrize("read", ["map", "copy"])
def test_corrupt_data_is_a_miss_removed_and_logged(tmp_path, caplog, damage, reason, read):
    good = np.arange(2**18, dtype=np.float64)  # 2 MiB and 1 MiB files: mapped with "map"
    with ColumnCache(tmp_path, capacity="10 MiB", read=read) as cache:
        cache["bad"] = good
        cache["good"] = good[::2].copy()
        bad_file = next(
            p for p in data_files(tmp_path) if os.path.getsize(p) == good.nbytes
        )
        damage(bad_file)
        caplog.set_level(logging.WARNING, LOGGER)
        assert cache.get("bad") is None
        assert "bad" not in cache
        assert not os.path.exists(bad_file)
        (record,) = warnings_of(caplog)
        assert "'bad'" in record.getMessage() and reason in record.getMessage()
        assert_same(cache["good"], good[::2])
        stats = cache.stats()
        assert stats["corrupt"] == 1 and stats["misses"] == 1 and stats["hits"] == 1
        cache["bad"] = good  # and it can be cached again
        assert_same(cache["bad"], good)


@pytest.mark.parametrize("read", ["map", "copy", "auto"])
def test_read_modes_serve_the_stored_bytes_as_private_writable_arrays(tmp_path, read):
    """Mapped or copied, a pack's members are the stored bytes, writable, and
    writing into one changes neither the file nor the next read; a mapped pack
    stays readable after its file is evicted (unlinked) by another process;
    ``bytes_mapped`` / ``bytes_read`` count every read's file bytes."""
    from cacheaffinity.worker._store.files import MAP_AT_LEAST

    big = np.arange(MAP_AT_LEAST // 4, dtype=np.float64)  # a 2 MiB file
    small = np.arange(100, dtype=np.int32)  # copied in every mode
    with ColumnCache(tmp_path, capacity="64 MiB", read=read) as cache:
        assert cache.read_mode == ("map" if read == "auto" else read)  # a private cache
        cache.put_pack("g", 0, 10, {"big": big, "small": small})
        (name,) = data_files(tmp_path)
        size = os.path.getsize(name)
        before = open(name, "rb").read()
        (pack,) = cache.get_packs("g", 0, 10)
        assert_same(pack.members["big"], big)
        assert_same(pack.members["small"], small)
        counter = "bytes_mapped" if cache.read_mode == "map" else "bytes_read"
        assert cache.stats()[counter] == size
        for arr in pack.members.values():
            assert arr.flags.writeable
            arr[0] = 42
        assert open(name, "rb").read() == before  # copy-on-write: the file is unchanged
        (again,) = cache.get_packs("g", 0, 10)
        assert again.members["big"][0] == 0 and again.members["small"][0] == 0
        assert cache.stats()[counter] == 2 * size
        assert cache.stats()["bytes_read" if counter == "bytes_mapped" else "bytes_mapped"] == 0
        os.unlink(name)  # evicted by another process while the chunk uses the pack
        assert float(again.members["big"].sum()) == float(big.sum())
        assert cache.get_packs("g", 0, 10) == []  # and a miss from then on


def test_a_file_system_that_cannot_map_falls_back_to_copies(tmp_path, caplog):
    """Where ``mmap`` fails (here: a pipe, which cannot be mapped: ENODEV), the cache logs
    one warning and copies from then on; reads keep working."""
    from cacheaffinity.worker._store.files import MAP_AT_LEAST

    with ColumnCache(tmp_path, capacity="64 MiB", read="map") as cache:
        r, w = os.pipe()
        try:
            caplog.set_level(logging.WARNING, LOGGER)
            assert cache.files._map(r, MAP_AT_LEAST) is None
        finally:
            os.close(r)
            os.close(w)
        assert not cache.files.mapped and len(warnings_of(caplog)) == 1
        assert "cannot mmap" in warnings_of(caplog)[0].getMessage()
        big = np.arange(MAP_AT_LEAST // 4, dtype=np.float64)
        cache.put_pack("g", 0, 1, {"big": big})
        (pack,) = cache.get_packs("g", 0, 1)
        assert_same(pack.members["big"], big)
        assert cache.stats()["bytes_read"] > 0 and cache.stats()["bytes_mapped"] == 0


def test_shared_group_cache_copies_by_default(tmp_path):
    group = os.getgid()
    os.chmod(tmp_path, 0o2770)
    with ColumnCache(tmp_path / "c", capacity="1 MiB", shared_group=group) as cache:
        assert cache.read_mode == "copy" and not cache.files.mapped
    with ColumnCache(tmp_path / "c", capacity="1 MiB", shared_group=group, read="map") as cache:
        assert cache.read_mode == "map" and cache.files.mapped
    with pytest.raises(ValueError, match=r"worker\.read.*copy"):
        ColumnCache(tmp_path / "d", read="mmap")


def test_verify_finds_corruption_and_a_lost_file(tmp_path, caplog):
    with ColumnCache(tmp_path, capacity="10 MiB", stale_after=0) as cache:
        for i in range(5):
            cache[f"k{i}"] = np.full(1000 + i, i, np.int32)
        files = {os.path.getsize(p): p for p in data_files(tmp_path)}
        _flip_byte(files[4 * 1001])
        os.unlink(files[4 * 1002])
        orphan = os.path.join(tmp_path, DATA_DIR, "ab", "ab" + "0" * 30)
        os.makedirs(os.path.dirname(orphan), exist_ok=True)
        with open(orphan, "wb") as f:
            f.write(b"left by a writer killed before its commit")
        caplog.set_level(logging.WARNING, LOGGER)
        progress = []
        report = cache.verify(on_entry=lambda: progress.append(1))
        assert report == dict(checked=5, ok=3, corrupt=1, missing=1, orphans=1, temporaries=0)
        assert len(progress) == 5
        assert len(warnings_of(caplog)) == 1
        assert sorted(cache) == ["k0", "k3", "k4"]
        assert cache.verify() == dict(
            checked=3, ok=3, corrupt=0, missing=0, orphans=0, temporaries=0
        )


def test_corrupt_entry_removal_spares_a_newer_value(tmp_path):
    with ColumnCache(tmp_path, capacity="10 MiB") as cache:
        cache["k"] = np.zeros(100)
        (old_file,) = data_files(tmp_path)
        cache["k"] = np.ones(100)  # another process replaced it meanwhile
        cache.reader.remove_entry("k", os.path.basename(old_file))
        assert_same(cache["k"], np.ones(100))


# ------------------------------------------------------- disk problems
def _run(*cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 2 MiB tmpfs: a disk that fills up."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    r = _run("mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt))
    if r.returncode:
        skip_or_fail(f"mounting a tmpfs needs root (CAP_SYS_ADMIN): {r.stderr.strip()}")
    yield mnt
    _run("umount", "-l", str(mnt))


@pytest.fixture
def read_only_view(tmp_path):
    """``bind(src, dst)`` mounts ``src`` read-only at ``dst`` (root ignores chmod)."""
    mounts = []

    def bind(src, dst):
        os.makedirs(dst, exist_ok=True)
        r = _run("mount", "--bind", str(src), str(dst))
        if r.returncode:
            skip_or_fail(f"bind mounts need root (CAP_SYS_ADMIN): {r.stderr.strip()}")
        mounts.append(dst)
        r = _run("mount", "-o", "remount,bind,ro", str(dst))
        assert r.returncode == 0, r.stderr
        return dst

    yield bind
    for dst in reversed(mounts):
        _run("umount", "-l", str(dst))


def test_full_disk_evicts_and_never_raises(tiny_tmpfs, caplog):
    caplog.set_level(logging.DEBUG, LOGGER)
    keys = [chunk_key(i) for i in range(40)]
    with ColumnCache(tiny_tmpfs / "cache") as cache:  # capacity 10 GiB >> 2 MiB
        for key in keys:
            cache[key] = content(key, 400_000)
        results = [cache.get(key) for key in keys]
        stats = cache.stats()
    for key, value in zip(keys, results):
        assert value is None or np.array_equal(value, content(key, 400_000))
    assert stats["errors"] > 0  # the disk did fill up ...
    assert stats["evictions"] > 0  # ... and old entries made room
    assert sum(v is not None for v in results[-3:]) >= 1
    assert len(warnings_of(caplog)) <= 1


def test_disk_full_of_other_data_skips_with_one_warning(tiny_tmpfs, caplog):
    caplog.set_level(logging.DEBUG, LOGGER)
    with ColumnCache(tiny_tmpfs / "cache", capacity="1 GiB") as cache:
        cache["first"] = np.arange(100, dtype=np.int64)
        with open(tiny_tmpfs / "filler", "wb", buffering=0) as f:  # another program
            try:  # fills the disk
                while True:
                    f.write(b"\0" * 4096)
            except OSError as e:
                assert e.errno == errno.ENOSPC
        for i in range(10):
            cache[f"k{i}"] = np.full(50_000, i, np.float64)  # never raises
        for i in range(10):
            value = cache.get(f"k{i}")
            assert value is None or np.array_equal(value, np.full(50_000, i, np.float64))
        first = cache.get("first")
        assert first is None or np.array_equal(first, np.arange(100))
        assert cache.stats()["skipped"] >= 1
    warnings = warnings_of(caplog)
    assert len(warnings) == 1
    assert "full" in warnings[0].getMessage()


def test_read_only_directory_is_one_warning_and_misses(tmp_path, read_only_view, caplog):
    with ColumnCache(tmp_path / "src", capacity="1 MiB") as cache:
        cache["k"] = np.arange(10)
    view = read_only_view(tmp_path / "src", tmp_path / "view")
    caplog.set_level(logging.DEBUG, LOGGER)
    with ColumnCache(view, capacity="1 MiB") as cache:
        assert cache.disabled and "Read-only" in cache.disabled
        assert cache.get("k") is None
        assert cache.get("k", 5) == 5
        cache["k2"] = np.arange(3)  # no exception
        cache["k3"] = np.arange(3)
        assert cache.get("k2") is None
        assert len(cache) == 0 and list(cache) == [] and "k" not in cache
    (warning,) = warnings_of(caplog)
    assert str(view) in warning.getMessage()
    # a directory that cannot be created
    caplog.clear()
    with ColumnCache(view / "new" / "cache", capacity="1 MiB") as cache:
        cache["k"] = np.arange(3)
        assert cache.get("k") is None
    assert len(warnings_of(caplog)) == 1


def test_directory_turning_read_only_while_open(tmp_path, read_only_view, caplog):
    with ColumnCache(tmp_path, capacity="1 MiB") as cache:
        cache["kept"] = np.arange(10)
        cache["replaced"] = np.arange(10)
        tmp = tmp_path / TMP_DIR
        read_only_view(tmp, tmp)  # new values cannot be written any more
        caplog.set_level(logging.DEBUG, LOGGER)
        for i in range(5):
            cache[f"new{i}"] = np.arange(i + 1)  # no exception
        cache["replaced"] = np.arange(20)  # not written: the old value must go
        assert all(cache.get(f"new{i}") is None for i in range(5))
        assert cache.get("replaced") is None
        assert_same(cache["kept"], np.arange(10))
        (warning,) = warnings_of(caplog)
        assert "not writable" in warning.getMessage()
        assert cache.stats()["skipped"] == 6


# ----------------------------------------------------------- lifecycle
def test_info_stats_and_close(tmp_path):
    before = time.time()
    with ColumnCache(tmp_path, capacity="1 MiB") as cache:
        assert cache.info()["oldest"] is None
        cache["a"] = np.zeros(10)
        cache["b"] = np.zeros(2000)
        info = cache.info()
        assert info["entries"] == 2 == len(cache)
        assert info["size"] == BLOCK + 4 * BLOCK == cache.volume()
        assert before <= info["oldest"] <= info["newest"] <= time.time()
        assert set(cache.stats()) >= {
            "hits",
            "misses",
            "bytes_served",
            "bytes_written",
            "writes",
            "evictions",
            "errors",
        }
        assert cache.stats()["bytes_written"] == 80 + 16000
    cache.close()  # idempotent
    # A task still running while its worker shuts down: misses, no errors.
    assert cache.get("a") is None
    cache["c"] = np.zeros(3)
    with pytest.raises(ValueError, match="closed"):
        len(cache)


def test_memory_front_is_bounded_and_writes_through(tmp_path):
    with ColumnCache(tmp_path, capacity="1 MiB") as store:
        front = MemoryFront(store, capacity=3000)
        for i in range(4):
            front[f"k{i}"] = np.full(125, i, np.float64)  # 1000 bytes each
        assert front.stats()["memory_entries"] == 3  # k0 dropped from memory ...
        assert front.memory_bytes <= 3000
        assert_same(front["k1"], np.full(125, 1.0))  # ... k1 used: k2 goes next
        front["k4"] = np.full(125, 4, np.float64)
        front["huge"] = np.zeros(1000)  # larger than memory: disk only
        stats = front.stats()
        assert stats["memory_entries"] == 3 and stats["memory_hits"] == 1
        assert sorted(store) == ["huge", "k0", "k1", "k2", "k3", "k4"]  # all written through
        assert_same(front["k0"], np.full(125, 0.0))  # from disk
        assert front.stats()["memory_hits"] == 1
        front.drop_memory()
        assert front.memory_bytes == 0 and len(store) == 6


# ------------------------------------------------------- layout upgrade
def test_repair_of_a_sound_index_changes_nothing(tmp_path):
    d = tmp_path / "cache"
    with ColumnCache(d, capacity="1 MiB") as cache:
        cache["k"] = np.arange(10)
        assert cache.repair() is False
        assert_same(cache["k"], np.arange(10))
        assert cache.stats()["index_rebuilt"] == 0
