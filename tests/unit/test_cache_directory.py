"""CacheDirectory owns a cache directory's path, trust, entry names and node id: the store,
the form documents and the worker plugin use it, and everything they create in the
directory is an entry the trust rules check."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest

from cacheaffinity.exceptions import UntrustedDirectory
from cacheaffinity.worker._directory import ENTRIES, NODE_ID_FILE, CacheDirectory
from cacheaffinity.worker._forms import FormStore
from cacheaffinity.worker._store.cache import ColumnCache


def test_a_worker_template_names_one_directory_per_worker(tmp_path, monkeypatch):
    monkeypatch.setenv("CA_TEST_ROOT", str(tmp_path))
    place = CacheDirectory.for_worker("$CA_TEST_ROOT/{host}/node-{name}", "w1")
    assert place.path == str(tmp_path / socket.gethostname() / "node-w1")
    assert os.fspath(place) == place.path and place.gid is None
    # no template: the per-user default, never the current directory
    assert os.path.isabs(CacheDirectory.for_worker(None, "w1").path)
    # outside a worker (the cacheaffinity command) a per-worker template is refused, with the fix
    with pytest.raises(ValueError, match=r"names one directory per worker .*give DIR, e.g. .*node-<worker name>"):
        CacheDirectory.for_worker("$CA_TEST_ROOT/node-{name}", None)
    assert CacheDirectory.for_worker("$CA_TEST_ROOT/{host}", None).path == str(tmp_path / socket.gethostname())


def test_entries_are_named_by_the_directory_and_unknown_names_refused(tmp_path):
    place = CacheDirectory(tmp_path / "c")
    assert place.entry(NODE_ID_FILE) == str(tmp_path / "c" / "node-id")
    with pytest.raises(ValueError, match="not an entry of a cache directory"):
        place.entry("columns.sqlite")


def test_the_node_id_is_created_once_and_read_back(tmp_path):
    place = CacheDirectory(tmp_path / "c")
    with pytest.raises(FileNotFoundError):
        place.node_id(create=False)
    place.trust()
    first = place.node_id()
    assert first == CacheDirectory(tmp_path / "c").node_id(create=False) == place.node_id()
    assert oct(os.stat(place.entry(NODE_ID_FILE)).st_mode & 0o777) == oct(0o600)


def test_trust_is_checked_once_per_object_and_refuses_a_link(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    os.symlink(real, tmp_path / "link")
    with pytest.raises(UntrustedDirectory, match="symbolic link"):
        CacheDirectory(tmp_path / "link").trust()
    place = CacheDirectory(real)
    assert place.trust() == str(real)
    cache = ColumnCache(place, capacity="1 MiB")
    try:
        # the store uses the object it was given: its path, its group, no second owner
        assert cache.place is place and cache.directory == place.path
        assert cache.shared_gid == place.gid and not cache.disabled
    finally:
        cache.close()


def test_everything_the_cache_creates_is_an_entry_the_trust_rules_check(tmp_path):
    place = CacheDirectory(tmp_path / "c")
    place.trust()
    place.node_id()
    cache = ColumnCache(place, capacity="1 MiB")
    try:
        cache["k"] = np.arange(100)
        assert cache.put_pack("g", 0, 10, {"a": np.arange(10)})[1]
        assert FormStore(place).put("f.json", {"fields": []}, identity="x")
        assert cache.get_packs("g", 0, 10)
    finally:
        cache.close()
    created = set(os.listdir(place.path))
    assert NODE_ID_FILE in created and "forms" in created
    assert created <= set(ENTRIES), created - set(ENTRIES)
