"""The modes of the files a cache directory holds, stat-ed on the real files
(docs/deployment.md: a private cache's files are 0600, a shared-group cache's index
0660 and its write-once files 0640, whatever the umask), and the capacity the store
fits to its file system (``ColumnCache(fit_disk=True)``, what workers open)."""

from __future__ import annotations

import logging
import os
import stat

import numpy as np
import pytest

from cacheaffinity.worker._directory import read_or_create_node_id
from cacheaffinity.worker._store import DATA_DIR, INDEX_NAME, ColumnCache
from cacheaffinity.worker._store import capacity

INDEX_FILES = (INDEX_NAME, INDEX_NAME + "-wal", INDEX_NAME + "-shm")


def modes(directory) -> dict[str, int]:
    """``{name: mode}`` of the node id, the index files and every data file."""
    out = {}
    for name in ("node-id", *INDEX_FILES):
        out[name] = stat.S_IMODE(os.lstat(os.path.join(directory, name)).st_mode)
    for sub in os.listdir(os.path.join(directory, DATA_DIR)):
        for name in os.listdir(os.path.join(directory, DATA_DIR, sub)):
            out["data"] = stat.S_IMODE(os.lstat(os.path.join(directory, DATA_DIR, sub, name)).st_mode)
    return out


@pytest.fixture(params=[0o022, 0o000, 0o077], ids=["umask-022", "umask-000", "umask-077"])
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def test_private_cache_files_are_0600_whatever_the_umask(tmp_path, umask):
    d = tmp_path / "cache"
    read_or_create_node_id(str(d))  # what a worker does first
    with ColumnCache(d, capacity="1 MiB") as cache:
        cache["k"] = np.arange(10)
        cache.put_pack("g", 0, 10, {"b/d/data": np.arange(10.0)})
        found = modes(d)  # while open: the -wal and -shm files exist
    assert found == {"node-id": 0o600, **dict.fromkeys(INDEX_FILES, 0o600), "data": 0o600}
    assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700


def test_shared_group_cache_files_are_group_readable_or_writable(tmp_path, umask):
    gid = os.getgid()  # a group this user is in: its primary one
    d = tmp_path / "shared"
    with ColumnCache(d, capacity="1 MiB", shared_group=gid) as cache:
        assert cache.disabled is None, cache.disabled
        read_or_create_node_id(str(d), gid)
        cache["k"] = np.arange(10)
        found = modes(d)
    # the index is written by every member; the node id and data files are
    # written once by their writer and only read (or deleted) by the others
    assert found == {"node-id": 0o640, **dict.fromkeys(INDEX_FILES, 0o660), "data": 0o640}
    st = os.lstat(d)
    assert stat.S_IMODE(st.st_mode) == 0o2770 and st.st_gid == gid


def test_an_existing_node_id_keeps_its_mode(tmp_path):
    d = tmp_path / "cache"
    node = read_or_create_node_id(str(d))
    os.chmod(d / "node-id", 0o400)  # set by an operator: nothing here changes it
    assert read_or_create_node_id(str(d)) == node
    assert stat.S_IMODE(os.lstat(d / "node-id").st_mode) == 0o400


class _Disk:
    """``os.statvfs`` of a 100 GiB file system with 10 GiB free (4 KiB blocks)."""

    f_frsize = 4096
    f_blocks = 100 * 2**30 // 4096
    f_bavail = 10 * 2**30 // 4096


@pytest.fixture
def disk(monkeypatch):
    monkeypatch.setattr(capacity.os, "statvfs", lambda path: _Disk)


def test_effective_capacity_keeps_a_reserve_and_counts_what_is_held(tmp_path, disk):
    free, reserve = 10 * 2**30, 2**30  # the reserve: 5% of 100 GiB, at most 1 GiB
    assert capacity.effective_capacity(str(tmp_path), 2**20) == (2**20, free)
    assert capacity.effective_capacity(str(tmp_path), 2**50) == (free - reserve, free)
    assert capacity.effective_capacity(str(tmp_path), 2**50, held=2**20) == (free - reserve + 2**20, free)
    _Disk.f_blocks = 2**30 // 4096  # a 1 GiB disk keeps 5% of it
    try:
        assert capacity.effective_capacity(str(tmp_path), 2**50)[0] == free - 2**30 // 20
    finally:
        _Disk.f_blocks = 100 * 2**30 // 4096


def test_the_store_fits_its_capacity_to_the_file_system(tmp_path, caplog, disk):
    d = tmp_path / "cache"
    caplog.set_level(logging.WARNING, "cacheaffinity.worker")
    with ColumnCache(d, capacity="1 MiB", fit_disk=True) as cache:  # fits: unchanged
        assert cache.capacity == cache.configured_capacity == 2**20
        assert cache.free_at_open == 10 * 2**30
    assert not caplog.records
    with ColumnCache(d, capacity="1 PiB", set_capacity=True, fit_disk=True) as cache:
        assert cache.configured_capacity == 2**50
        assert cache.capacity == 9 * 2**30  # 10 GiB free less the 1 GiB reserve
        cache["k"] = np.arange(10)
        assert np.array_equal(cache["k"], np.arange(10))
    (record,) = caplog.records
    assert "more than the file system" in record.getMessage() and str(d) in record.getMessage()
    with ColumnCache(d, capacity="1 PiB", fit_disk=True) as cache:  # what it holds counts
        assert cache.capacity == 9 * 2**30 + 4096
    # the clamp is this process's: the directory keeps the setting, and a store
    # opened without fit_disk (the CLI) uses it as it is
    with ColumnCache(d, capacity="1 MiB") as cache:
        assert cache.capacity == cache.configured_capacity == 2**50
        assert cache.capacity_source == "directory" and cache.free_at_open is None


@pytest.mark.skipif(
    os.geteuid() != 0, reason="mounts a read-only tmpfs (mount -t tmpfs -o ro): needs root"
)
def test_a_read_only_file_system_is_named_as_such(tmp_path):
    """A cache directory on a read-only mount is diagnosed as read-only, not by the mode
    its mount point shows (a read-only tmpfs is 1777: "run chmod go-w" would not help);
    a directory of the same mode on a writable file system still gets the mode message."""
    import subprocess

    from cacheaffinity.worker._directory import (
        ReadOnlyDirectory,
        UntrustedDirectory,
        trusted_directory,
    )

    writable = tmp_path / "writable"
    writable.mkdir()
    os.chmod(writable, 0o1777)
    with pytest.raises(UntrustedDirectory, match=r"mode 1777.*chmod go-w"):
        trusted_directory(writable)
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=True,
                   timeout=30)  # fmt: skip
    try:
        assert stat.S_IMODE(os.lstat(ro).st_mode) == 0o1777  # what the mode check saw
        for path, create in ((ro, True), (ro, False), (ro / "cache", True)):
            with pytest.raises(ReadOnlyDirectory) as e:
                trusted_directory(path, create=create)
            message = str(e.value)
            assert message == (
                f"cache directory {path} is on a read-only file system; give a writable "
                "node-local directory with --cache-directory (or set "
                "cacheaffinity.worker.directory)"
            )
            assert "chmod" not in message and e.value.errno == 30  # EROFS
        with ColumnCache(ro / "cache", capacity="1 MiB") as cache:  # what a worker opens
            assert "read-only file system" in cache.disabled
    finally:
        subprocess.run(["umount", str(ro)], check=True, timeout=30)
