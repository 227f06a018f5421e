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


def _aged(store: FormStore, name: str, t: int) -> None:
    """Give document ``name`` the modification time ``t`` (the order written, distinct)."""
    os.utime(os.path.join(store.directory, name), (t, t))


def test_byte_bound_holds_and_the_kept_documents_are_intact(tmp_path, caplog):
    """More documents than the byte bound holds (each about 3 kB, as a tiny form; real
    NanoAOD forms are 0.2-1 MB): after every put the store is within the bound, the first
    written are gone, and every document still there reads back as written."""
    probe = FormStore(str(tmp_path / "probe"), max_bytes=0)
    docs = [dict(DOC, num_entries=i, base_form={"fields": [f"b{i}_{j}" for j in range(300)]}) for i in range(60)]
    assert probe.put("x.json", docs[0], identity={"i": 0})
    one = os.path.getsize(os.path.join(probe.directory, "x.json"))
    assert 2000 < one < 5000, one
    store = FormStore(str(tmp_path), max_documents=1000, max_bytes=10 * one)
    names = [FormStore.key(f"file-{i}", "Events") for i in range(len(docs))]
    with caplog.at_level(logging.DEBUG, logger="cacheaffinity.worker"):
        for i, (name, doc) in enumerate(zip(names, docs)):
            assert store.put(name, doc, identity={"i": i})
            _aged(store, name, 1_000_000 + i)
            count, size = store.usage()
            assert size <= store.max_bytes and count <= 10, (i, count, size)
    assert store.evicted >= len(docs) - 10
    bound = [r for r in caplog.records if "beyond its bound" in r.getMessage()]
    assert bound and bound[0].levelno == logging.INFO
    assert sum(r.levelno == logging.INFO for r in bound) == 1  # once, then debug
    kept = [i for i, n in enumerate(names) if os.path.exists(os.path.join(store.directory, n))]
    assert kept == list(range(len(docs) - len(kept), len(docs))) and len(kept) >= 8  # the newest
    for i in kept:
        assert store.get(names[i], identity={"i": i}) == docs[i]
    # an evicted document is a miss, not an error; the next put writes it again
    assert store.get(names[0], identity={"i": 0}) is None
    assert store.put(names[0], docs[0], identity={"i": 0})
    assert store.get(names[0], identity={"i": 0}) == docs[0]


def test_bound_never_removes_the_document_just_written(tmp_path):
    """One document larger than the whole byte bound: kept (the file's chunks need it);
    everything older goes."""
    store = FormStore(str(tmp_path), max_bytes=2000)
    small = FormStore.key("small", "Events")
    assert store.put(small, DOC)
    _aged(store, small, 1_000_000)
    big = FormStore.key("big", "Events")
    doc = dict(DOC, base_form={"fields": ["x" * 50] * 100})
    assert store.put(big, doc)
    assert store.get(big) == doc and store.get(small) is None
    assert store.usage()[0] == 1


def test_orphaned_temporaries_are_collected_and_not_counted(tmp_path):
    """A writer killed mid-write leaves ``<name>.<pid>.<random>.tmp``: not a document
    (``len``, ``usage``), and removed by a later put once older than ORPHAN_SECONDS."""
    from cacheaffinity.worker import _forms

    store = FormStore(str(tmp_path))
    assert store.put(FormStore.key("a", "Events"), DOC)
    old = os.path.join(store.directory, "0123.json.99.abcdef01.tmp")
    young = os.path.join(store.directory, "4567.json.99.abcdef02.tmp")
    for path in (old, young):
        with open(path, "w") as f:
            f.write('{"layout": 2, "chec')
    t = 1_000_000
    os.utime(old, (t, t))
    assert len(store) == 1 and store.usage()[0] == 1
    assert store.put(FormStore.key("b", "Events"), DOC)
    assert not os.path.exists(old)  # older than _forms.ORPHAN_SECONDS
    assert os.path.exists(young)  # may be a write in progress
    assert _forms.ORPHAN_SECONDS >= 600


def test_a_missing_or_corrupt_document_among_many_is_a_miss(tmp_path, caplog):
    """Documents removed or damaged behind the store's back (another process's bound, a
    disk fault) are misses with a log line, never errors; the bound still holds after."""
    store = FormStore(str(tmp_path), max_documents=8)
    names = [FormStore.key(f"f{i}", "Events") for i in range(8)]
    for i, name in enumerate(names):
        assert store.put(name, dict(DOC, num_entries=i))
        _aged(store, name, 1_000_000 + i)
    os.remove(os.path.join(store.directory, names[6]))
    with open(os.path.join(store.directory, names[7]), "r+b") as f:
        f.seek(40)
        f.write(b"\x00\xff")
    with caplog.at_level(logging.DEBUG, logger="cacheaffinity.worker"):
        assert store.get(names[6]) is None and store.get(names[7]) is None
    messages = [r.getMessage() for r in caplog.records]
    assert any("no form" in m and names[6] in m for m in messages), messages
    assert any(names[7] in m and r.levelno >= logging.WARNING for m, r in zip(messages, caplog.records)), messages
    for i in range(8, 20):
        assert store.put(FormStore.key(f"f{i}", "Events"), dict(DOC, num_entries=i))
        assert len(store) <= 8
    assert store.get(FormStore.key("f19", "Events")) == dict(DOC, num_entries=19)
