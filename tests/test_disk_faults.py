"""A cache on a small, full file system (a real tmpfs mounted for the test): the
store fills the disk itself (a capacity far above what the disk holds), keeps
caching new data by evicting on ENOSPC, and ``clear`` empties it, with files
removed before the index is touched.  Needs root (mount): skipped outside CI, a failure under CI."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess

import numpy as np
import pytest

from cacheaffinity.worker._directory import read_or_create_node_id
from cacheaffinity.worker._store import ColumnCache

from testbed import skip_or_fail  # noqa: E402

SIZE = 20 * 2**20


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0 or not shutil.which("mount"):
        skip_or_fail("mounting a tmpfs needs root and mount(8) (CI runs as root)")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE},mode=0700", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            subprocess.run(["umount", "-l", str(mount)], check=True)


def pack(i: int) -> dict:
    rng = np.random.default_rng(i)
    return {f"b{j}/d/data": rng.random(64 * 1024) for j in range(4)}  # 2 MiB a pack


def test_full_disk_recovers_by_eviction_and_by_clear(small_disk, caplog):
    d = small_disk / "cache"
    node = read_or_create_node_id(str(d))
    with ColumnCache(d, capacity="1 GiB") as cache:  # far more than the 20 MiB disk
        for i in range(30):  # 60 MiB of packs into 20 MiB
            cache.put_pack("g", 100 * i, 100 * (i + 1), pack(i))
        # the newest packs are there and read back exactly (the disk filled, writes
        # evicted the oldest on ENOSPC and retried)
        newest = cache.get_packs("g", 2900, 3000)
        assert newest and all(np.array_equal(v, pack(29)[k]) for k, v in newest[0].members.items())
        assert cache.stats()["evictions"] > 0
        assert cache.volume() <= SIZE
        # a plain entry still fits, and reads back
        cache["late"] = np.arange(1000)
        assert np.array_equal(cache["late"], np.arange(1000))
        # clear works on the (nearly) full disk: files first, then rows
        cache.clear()
        assert len(cache) == 0 and cache.volume() == 0
        files = [f for _, _, fs in os.walk(d / "columns") for f in fs]
        assert files == []
        cache.put_pack("g", 0, 100, pack(0))
        assert cache.get_packs("g", 0, 100)
    assert read_or_create_node_id(str(d)) == node
