"""Settings every process of a cache directory agrees on: the layout version and
the capacity in the index's ``settings`` table; an older layout's directory is
detected and its entries dropped (never read), a newer or unreadable index
version is refused and set aside by ``clear``/``repair``, keeping the node id.
Real directories, real SQLite files."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cacheaffinity.worker._directory import read_or_create_node_id
from cacheaffinity.worker._store import INDEX_NAME, LAYOUT_VERSION, SCHEMA_VERSION, ColumnCache
from cacheaffinity.worker._store.layout import LEGACY_SETTINGS_NAME
from helpers import fill

LOGGER = "cacheaffinity.worker"


def settings(directory):
    con = sqlite3.connect(os.path.join(directory, INDEX_NAME))
    try:
        return dict(con.execute("SELECT name, value FROM settings"))
    finally:
        con.close()


def data_files(directory):
    return [f for sub in os.listdir(directory / "columns") for f in os.listdir(directory / "columns" / sub)]


def drops(caplog):
    return [r for r in caplog.records if r.name == LOGGER and "dropped" in r.getMessage()]


def old_layout(directory, version: int) -> None:
    """A directory as layouts 1-3 left it: an index of schema ``version`` with
    rows, their data files, and (layout 3) ``settings.json``."""
    os.makedirs(directory / "columns" / "ab", mode=0o700)
    os.makedirs(directory / "columns-tmp", mode=0o700)
    con = sqlite3.connect(os.path.join(directory, INDEX_NAME))
    con.executescript(
        "CREATE TABLE entries (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT UNIQUE, file TEXT,"
        " dtype TEXT, shape TEXT, nbytes INTEGER, size INTEGER, checksum BLOB, stored REAL);"
        "CREATE TABLE meta (name TEXT PRIMARY KEY, value INTEGER);"
        f"PRAGMA user_version={version};"
    )
    for i in range(3):
        name = f"ab{i:030x}"
        (directory / "columns" / "ab" / name).write_bytes(b"\0" * 400)
        con.execute("INSERT INTO entries (key, file, dtype, shape, nbytes, size, checksum, stored) "
                    "VALUES (?, ?, '<f4', '[100]', 400, 4096, ?, 0)", (f"c3/k{i}", name, b"\0" * 8))
    con.commit()
    con.close()
    if version == 2:
        (directory / LEGACY_SETTINGS_NAME).write_text('{"layout": 3, "capacity": 1048576}')


def test_new_directory_records_layout_and_capacity(tmp_path):
    fill(tmp_path)
    assert settings(tmp_path) == {"layout": LAYOUT_VERSION, "capacity": 2**20}
    con = sqlite3.connect(os.path.join(tmp_path, INDEX_NAME))
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    con.close()
    for name in (INDEX_NAME, INDEX_NAME + "-wal", INDEX_NAME + "-shm"):
        path = os.path.join(tmp_path, name)
        if os.path.exists(path):
            assert oct(os.stat(path).st_mode & 0o777) == oct(0o600), name


@pytest.mark.parametrize("version", [pytest.param(1, id="layout-1-2"), pytest.param(2, id="layout-3")])
def test_older_layout_is_detected_and_dropped_with_one_line(tmp_path, caplog, version):
    node = read_or_create_node_id(str(tmp_path))
    old_layout(tmp_path, version)
    caplog.set_level(logging.INFO, LOGGER)
    with ColumnCache(tmp_path, capacity="1 MiB") as cache:
        assert len(cache) == 0
        assert cache.get("c3/k0") is None
        assert data_files(tmp_path) == []
    (record,) = drops(caplog)
    assert "older cacheaffinity" in record.getMessage() and "dropped its 3 data files" in record.getMessage()
    assert not os.path.exists(tmp_path / LEGACY_SETTINGS_NAME)
    assert settings(tmp_path)["layout"] == LAYOUT_VERSION
    assert read_or_create_node_id(str(tmp_path)) == node
    # the next process finds the current layout: nothing dropped again
    fill(tmp_path, n=2)
    with ColumnCache(tmp_path, capacity="1 MiB") as cache:
        assert len(cache) == 2
    assert len(drops(caplog)) == 1


@pytest.mark.parametrize(
    "version", [pytest.param(SCHEMA_VERSION + 1, id="newer"), pytest.param(2**30 + SCHEMA_VERSION, id="flipped-bit")]
)
@pytest.mark.parametrize("recover", ["clear", "repair"])
def test_unknown_index_version_is_refused_then_set_aside_keeping_the_node_id(tmp_path, caplog, version, recover):
    node = read_or_create_node_id(str(tmp_path))
    fill(tmp_path)
    con = sqlite3.connect(os.path.join(tmp_path, INDEX_NAME))
    con.execute(f"PRAGMA user_version={version}")
    con.commit()
    con.close()
    caplog.set_level(logging.INFO, LOGGER)
    with ColumnCache(tmp_path, capacity="1 MiB") as cache:
        assert cache.disabled and f"schema version {version}" in cache.disabled
        assert f"reads version {SCHEMA_VERSION}" in cache.disabled and "cache clear" in cache.disabled
        assert cache.get("uuid/Events/0-10/data/col0") is None
        cache["x"] = np.arange(3)  # refused: the newer index is not touched
    con = sqlite3.connect(os.path.join(tmp_path, INDEX_NAME))
    assert con.execute("PRAGMA user_version").fetchone()[0] == version
    con.close()
    with ColumnCache(tmp_path, capacity="1 MiB") as cache:
        if recover == "clear":
            cache.clear()
        else:
            assert cache.repair() is True
        assert cache.disabled is None
        cache["x"] = np.arange(3)
        assert np.array_equal(cache["x"], np.arange(3))
    assert os.path.exists(os.path.join(tmp_path, INDEX_NAME + ".corrupt"))
    assert read_or_create_node_id(str(tmp_path)) == node
    with ColumnCache(tmp_path, capacity="1 MiB") as cache:
        assert list(cache) == ["x"]


def test_read_only_open_changes_nothing(tmp_path):
    old_layout(tmp_path, 2)
    before = sorted(os.listdir(tmp_path))
    with ColumnCache(tmp_path, capacity="1 MiB", heal=False) as cache:
        assert cache.disabled and "older cacheaffinity" in cache.disabled
    assert sorted(os.listdir(tmp_path)) == before
    assert len(data_files(tmp_path)) == 3


def test_processes_agree_on_the_directory_capacity(tmp_path, caplog):
    fill(tmp_path, capacity="1 MiB")
    caplog.set_level(logging.INFO, LOGGER)
    with ColumnCache(tmp_path, capacity="64 KiB") as small:
        assert small.capacity == 2**20 and small.capacity_source == "directory"
        assert len(small) == 3
    assert any("records capacity 1.00 MiB" in r.getMessage() for r in caplog.records)
    with ColumnCache(tmp_path, capacity="2 MiB", set_capacity=True) as cache:
        assert cache.capacity == 2 * 2**20 and cache.capacity_source == "argument"
        assert len(cache) == 3  # changing the capacity keeps the entries
    assert settings(tmp_path)["capacity"] == 2 * 2**20
    with ColumnCache(tmp_path, capacity="1 MiB") as cache:
        assert cache.capacity == 2 * 2**20


# ------------------------------------------- a capacity given explicitly
BLOCK = 4096


def test_a_given_capacity_is_recorded_and_the_oldest_entries_go(tmp_path, caplog):
    values = fill(tmp_path, n=10, capacity="1 MiB")  # one 4 KiB block each
    keys = list(values)
    caplog.set_level(logging.INFO, LOGGER)
    # shrink: recorded, the 6 oldest entries evicted at open, stats and info show it
    with ColumnCache(tmp_path, capacity=4 * BLOCK, set_capacity=True) as cache:
        assert settings(tmp_path)["capacity"] == 4 * BLOCK
        assert cache.capacity == cache.configured_capacity == 4 * BLOCK
        assert cache.volume() <= 4 * BLOCK
        assert list(cache) == keys[-4:]
        assert cache.stats()["evictions"] == 6 and cache.stats()["bytes_evicted"] == 6 * BLOCK
        assert cache.info()["capacity"] == 4 * BLOCK
        assert np.array_equal(cache[keys[-1]], values[keys[-1]])
    lines = [r.getMessage() for r in caplog.records if "->" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "capacity 1.00 MiB -> 16.00 kiB (--cache-capacity / cacheaffinity.worker.capacity)" in lines[0]
    assert "evicted the 6 oldest entries" in lines[0]
    assert len(data_files(tmp_path)) == 4  # the evicted entries' files are gone
    # not given (the default 10 GiB): the recorded capacity stays, nothing evicted
    caplog.clear()
    with ColumnCache(tmp_path) as cache:
        assert cache.capacity == 4 * BLOCK and cache.capacity_source == "directory"
        assert list(cache) == keys[-4:]
    assert settings(tmp_path)["capacity"] == 4 * BLOCK
    assert not [r for r in caplog.records if "->" in r.getMessage()]
    # grow: recorded, nothing evicted, and it fills up to the new size
    with ColumnCache(tmp_path, capacity=8 * BLOCK, set_capacity=True) as cache:
        assert settings(tmp_path)["capacity"] == 8 * BLOCK
        assert list(cache) == keys[-4:] and cache.stats()["evictions"] == 0
        for i in range(4):
            cache[f"uuid/Events/0-10/data/new{i}"] = np.arange(300, dtype=np.int64)
        assert len(cache) == 8 and cache.stats()["evictions"] == 0
        cache["uuid/Events/0-10/data/one-more"] = np.arange(300, dtype=np.int64)
        assert len(cache) == 8 and cache.volume() <= 8 * BLOCK


def test_a_given_capacity_needs_a_writable_open(tmp_path):
    with pytest.raises(ValueError, match="set_capacity=True, heal=False"):
        ColumnCache(tmp_path, capacity="1 MiB", set_capacity=True, heal=False)


_FOLLOWER = """
import json, logging, sys
import numpy as np
from cacheaffinity.worker._store import ColumnCache
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
cache = ColumnCache(sys.argv[1], capacity="1 MiB", set_capacity=True)
for i in range(10):
    cache[f"uuid/Events/0-10/data/old{i}"] = np.arange(300, dtype=np.int64)
print("ready", flush=True)
sys.stdin.readline()  # another process records a new capacity meanwhile
cache["uuid/Events/0-10/data/after"] = np.arange(300, dtype=np.int64)
print(json.dumps({"capacity": cache.capacity, "configured": cache.configured_capacity,
                  "volume": cache.volume(), "entries": len(cache),
                  "evictions": cache.stats()["evictions"]}), flush=True)
cache.close()
"""


def _follower(directory):
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen(
        [sys.executable, "-c", _FOLLOWER, str(directory)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    return proc


def _after_change(proc):
    out, err = proc.communicate("go\n", timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1]), err


@pytest.mark.timeout(240)
def test_live_processes_follow_a_capacity_given_to_another(tmp_path):
    # a process that keeps the directory open at 1 MiB, and a second open cache here
    proc = _follower(tmp_path)
    try:
        other = ColumnCache(tmp_path)
        assert other.capacity == 2**20
        with ColumnCache(tmp_path, capacity=4 * BLOCK, set_capacity=True) as cache:
            assert len(cache) == 4  # evicted at open
        got, err = _after_change(proc)
    finally:
        proc.kill()
        proc.wait()
    # its next insert used the new capacity: it did not fill up to the old 1 MiB
    assert got["capacity"] == got["configured"] == 4 * BLOCK
    assert got["volume"] <= 4 * BLOCK and got["entries"] == 4
    followed = [line for line in err.splitlines() if "recorded by another process" in line]
    assert len(followed) == 1 and "INFO" in followed[0], err
    assert "capacity 1.00 MiB -> 16.00 kiB" in followed[0]
    # an open cache that did not insert follows when asked (workers: every heartbeat)
    assert other.follow_capacity() == 4 * BLOCK
    assert other.configured_capacity == 4 * BLOCK and other.capacity_source == "directory"
    other.close()


@pytest.mark.timeout(240)
def test_live_processes_follow_a_larger_capacity_without_evicting(tmp_path):
    proc = _follower(tmp_path)
    try:
        with ColumnCache(tmp_path, capacity="2 MiB", set_capacity=True) as cache:
            assert len(cache) == 10
        got, _ = _after_change(proc)
    finally:
        proc.kill()
        proc.wait()
    assert got["configured"] == 2 * 2**20 and got["entries"] == 11 and got["evictions"] == 0


def test_the_last_given_capacity_wins_and_fit_disk_refits(tmp_path):
    fill(tmp_path, n=6, capacity="1 MiB")
    first = ColumnCache(tmp_path, capacity=5 * BLOCK, set_capacity=True, fit_disk=True)
    second = ColumnCache(tmp_path, capacity=3 * BLOCK, set_capacity=True, fit_disk=True)
    try:
        assert settings(tmp_path)["capacity"] == 3 * BLOCK and len(second) == 3
        first["uuid/Events/0-10/data/x"] = np.arange(300, dtype=np.int64)
        assert first.configured_capacity == first.capacity == 3 * BLOCK
        assert first.volume() <= 3 * BLOCK and "uuid/Events/0-10/data/x" in first
    finally:
        first.close()
        second.close()
