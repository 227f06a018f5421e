"""FormStore (per-file metadata documents) and file identities: real directories, real files."""

from __future__ import annotations

import json
import logging
import os
import shutil

import fsspec
import pytest

from cacheaffinity.coffea._identity import (
    FileIdentity,
    IdentityUnavailable,
    file_identity,
    parquet_footer_digest,
)
from cacheaffinity.worker._forms import FormStore

DOC = {"kind": "TTree", "base_form": {"class": "RecordArray"}, "object_path": "Events", "num_entries": 40}


def test_round_trip_needs_the_same_identity(tmp_path):
    store = FormStore(str(tmp_path))
    ident = {"size": 10, "stamp": "mtime:1", "content": "u"}
    name = FormStore.key("token-a", "Events")
    assert store.put(name, DOC, identity=ident)
    assert store.get(name, identity=ident) == DOC
    assert store.get(name) == DOC  # no expectation: any identity
    changed = dict(ident, stamp="mtime:2")
    assert store.get(name, identity=changed) is None  # replaced file: a miss ...
    assert len(store) == 0  # ... and the stale document is gone
    assert (store.hits, store.misses) == (2, 1)
    assert FormStore.key("token-a", "Events") != FormStore.key("token-b", "Events")



def test_every_get_returns_its_own_document(tmp_path):
    """The chunk task hands ``get``'s base form to coffea, which changes it in place, without
    copying it (cacheaffinity/coffea/_work.py): a change must not reach the next ``get``."""
    store = FormStore(str(tmp_path))
    name = FormStore.key("token-a", "Events")
    assert store.put(name, DOC)
    first = store.get(name)
    first["base_form"]["contents"] = ["changed in place"]
    first["num_entries"] = -1
    second = store.get(name)
    assert second == DOC and second is not first
    assert second["base_form"] is not first["base_form"]

@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda d: d.replace(':40', ':41'), id="edited-body"),
        pytest.param(lambda d: d[: len(d) // 2], id="truncated"),
        pytest.param(lambda d: json.dumps({"base_form": {}, "object_path": "E"}), id="old-layout"),
    ],
)
def test_damaged_document_is_a_miss_logged_once(tmp_path, caplog, damage):
    store = FormStore(str(tmp_path))
    names = [FormStore.key(f"t{i}", "Events") for i in range(3)]
    for name in names:
        assert store.put(name, DOC, identity="x")
        path = os.path.join(store.directory, name)
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(damage(text))
    with caplog.at_level(logging.DEBUG, logger="cacheaffinity.worker"):
        assert all(store.get(name, identity="x") is None for name in names)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert len(store) == 0 and store.misses == 3


def test_unwritable_store_logs_once_per_condition(tmp_path, caplog):
    (tmp_path / "forms").write_text("a file where the forms directory should be")
    store = FormStore(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="cacheaffinity.worker"):
        results = [store.put(FormStore.key(f"t{i}", "Events"), DOC) for i in range(5)]
    assert results == [False] * 5
    assert len(caplog.records) == 1 and "cannot store file metadata" in caplog.records[0].getMessage()
    assert store.get(FormStore.key("t0", "Events")) is None


def test_file_identity_changes_with_the_bytes(tmp_path, nanoaod_dir):
    path = tmp_path / "f.root"
    shutil.copy(nanoaod_dir / "nano_dy.root", path)
    a = file_identity(str(path))
    assert a == file_identity(f"file://{path}")
    assert a.size == path.stat().st_size and a.stamp.startswith("mtime:")
    shutil.copy(nanoaod_dir / "nano_dimuon.root", path)
    b = file_identity(str(path))
    assert a != b and a.token != b.token
    assert FileIdentity(1, "mtime:1", "x").token != FileIdentity(1, "mtime:1", "y").token
    # the placement's stamp leaves the content out (the client does not open the file),
    # and is what chunk identities always used: the token of an identity without content
    x = FileIdentity(1, "mtime:1", "x")
    assert x.stamp_token == FileIdentity(1, "mtime:1", "y").stamp_token == FileIdentity(1, "mtime:1").token
    assert x.stamp_token != FileIdentity(2, "mtime:1", "x").stamp_token != x.token
    with pytest.raises(FileNotFoundError):
        file_identity(str(tmp_path / "missing.root"))
    with pytest.raises(IdentityUnavailable):
        file_identity(str(tmp_path))  # a directory


def test_storage_without_time_or_checksum_is_unprovable():
    with fsspec.open("memory://ca-test/f.bin", "wb") as f:
        f.write(b"abc")
    with pytest.raises(IdentityUnavailable, match="neither a checksum nor a modification time"):
        file_identity("memory://ca-test/f.bin")


def test_parquet_footer_digest(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name, values in (("a", [1, 2, 3]), ("b", [1, 2, 4]), ("c", [1, 2, 3])):
        pq.write_table(pa.table({"x": values}), tmp_path / f"{name}.parquet")
    a, b, c = (parquet_footer_digest(str(tmp_path / f"{n}.parquet")) for n in "abc")
    assert a != b, "different data, different footer (statistics, sizes)"
    assert a == c, "same bytes, same digest, wherever the file lives"
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(IdentityUnavailable):
        parquet_footer_digest(str(tmp_path / "bad.parquet"))
