"""Every input coffea's Runner accepts, through CacheAffinityExecutor, compared with
coffea's IterativeExecutor: parquet without uuid metadata, RNTuple, preload, user
metadata, processors using the file handle, files replaced in place within one
session, savemetrics on cached runs, use_dataframes.  Real files, real cluster."""

from __future__ import annotations

import os
import shutil
import warnings

import awkward as ak
import pyarrow.parquet as pq
import pytest
import uproot
from coffea import processor
from coffea.nanoevents import NanoAODSchema

import cacheaffinity
from cacheaffinity.coffea import _adapter as adapter
from examples.analysis import DimuonJetProcessor, summary
from helpers import cache_client, counted, run_coffea

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")

#: stealing may move a chunk of run 2 to a node without its columns: a miss by design
NO_STEALING = {"cacheaffinity.scheduler.stealing.enabled": False}
BRANCHES = ["Muon_*", "nMuon", "Jet_*", "nJet", "run", "luminosityBlock", "event"]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with cache_client(tmp_path_factory.mktemp("caches"), 2, **NO_STEALING) as c:
        yield c


def ours(client, **kwargs):
    return cacheaffinity.CacheAffinityExecutor(client=client, status=False, **kwargs)


def run(executor, fileset, processor_instance=None, chunksize=15, **kwargs):
    kwargs.setdefault("metadata_cache", {})
    return run_coffea(executor, fileset, processor_instance or DimuonJetProcessor(), chunksize, **kwargs)


def write_parquet(src, dst):
    arrays = uproot.open(src)["Events"].arrays(filter_name=BRANCHES, how=dict)
    ak.to_parquet(ak.zip(arrays, depth_limit=1), dst)
    meta = pq.ParquetFile(dst).schema_arrow.metadata or {}
    assert b"uuid" not in meta, "the point of this file is that it has no uuid metadata"


def write_rntuple(src, dst):
    arrays = uproot.open(src)["Events"].arrays(filter_name=BRANCHES, how=dict)
    with uproot.recreate(dst) as f:
        f["Events"] = arrays
    assert "RNTuple" in type(uproot.open(dst)["Events"]).__name__


def test_parquet_without_uuid_two_datasets(client, tmp_path, nanoaod_dir):
    fileset = {}
    for name in ("nano_dy", "nano_dimuon"):
        write_parquet(nanoaod_dir / f"{name}.root", tmp_path / f"{name}.parquet")
        fileset[name] = [str(tmp_path / f"{name}.parquet")]
    reference = summary(run(processor.IterativeExecutor(), fileset, format="parquet"))
    assert reference["nano_dy"] != reference["nano_dimuon"]
    out1, d1 = counted(client, lambda: run(ours(client), fileset, format="parquet"))
    out2, d2 = counted(client, lambda: run(ours(client), fileset, format="parquet"))
    assert summary(out1) == reference
    assert summary(out2) == reference
    assert d1["misses"] > 0 and d2["hits"] > 0 and d2["misses"] == 0
    # each dataset alone, after the other was cached: no cross-talk through "None" keys
    for name in fileset:
        alone = summary(run(ours(client), {name: fileset[name]}, format="parquet"))
        assert alone == {name: reference[name]}


def test_rntuple(client, tmp_path, nanoaod_dir):
    fileset = {}
    for name in ("nano_dy", "nano_dimuon"):
        write_rntuple(nanoaod_dir / f"{name}.root", tmp_path / f"{name}_rntuple.root")
        fileset[name] = [str(tmp_path / f"{name}_rntuple.root")]
    reference = summary(run(processor.IterativeExecutor(), fileset))
    assert sum(d["muons"] for d in reference.values()) > 0
    out1, d1 = counted(client, lambda: run(ours(client), fileset))
    out2, d2 = counted(client, lambda: run(ours(client), fileset))
    assert summary(out1) == reference == summary(out2)
    assert d1["misses"] > 0 and d2["hits"] > 0 and d2["misses"] == 0


class OtherTreeProcessor(DimuonJetProcessor):
    """Reads the ``Runs`` tree through the factory's file handle."""

    def process(self, events):
        out = super().process(events)
        handle = events.attrs["@events_factory"].file_handle
        assert handle is not None
        runs = handle["Runs"]
        out[events.metadata["dataset"]]["runs"] = int(runs.num_entries)
        out[events.metadata["dataset"]]["run_sum"] = int(ak.sum(runs["run"].array()))
        out[events.metadata["dataset"]]["uuid_ok"] = int(
            str(handle.file.uuid) == events.metadata["fileuuid"]
        )
        return out


def test_processor_opens_another_tree_through_file_handle(client, nanoaod_dir):
    fileset = {"dy": [str(nanoaod_dir / "nano_dy.root")], "dimuon": [str(nanoaod_dir / "nano_dimuon.root")]}
    reference = run(processor.IterativeExecutor(), fileset, OtherTreeProcessor())
    first = run(ours(client), fileset, OtherTreeProcessor())
    cached, d = counted(client, lambda: run(ours(client), fileset, OtherTreeProcessor()))
    for out in (first, cached):
        assert summary(out) == summary(reference)
        for ds in fileset:
            assert out[ds]["runs"] == reference[ds]["runs"] > 0
            assert out[ds]["run_sum"] == reference[ds]["run_sum"]
            assert out[ds]["uuid_ok"] == reference[ds]["uuid_ok"] > 0
    # columns came from the cache; the file was opened lazily, for the handle only
    assert d["misses"] == 0 and d["hits"] > 0 and d["storage_opens"] > 0


@pytest.mark.parametrize("fresh_metadata", [False, True], ids=["same-session-metadata", "fresh-metadata"])
def test_file_replaced_in_place_between_runs(client, tmp_path, nanoaod_dir, fresh_metadata):
    path = tmp_path / "data.root"
    shutil.copy(nanoaod_dir / "nano_dy.root", path)
    fileset = {"sample": [str(path)]}
    caches = {"iterative": {}, "ours": {}}  # one client session per executor

    def both():
        return (
            summary(run(processor.IterativeExecutor(), fileset, metadata_cache=caches["iterative"])),
            summary(run(ours(client), fileset, metadata_cache=caches["ours"])),
        )

    ref1, out1 = both()
    assert out1 == ref1
    summary(run(ours(client), fileset, metadata_cache=caches["ours"]))  # cached now
    # replace the bytes at the same path (new UUID, size and time)
    tmp = tmp_path / "data.root.new"
    shutil.copy(nanoaod_dir / "nano_dimuon.root", tmp)
    os.replace(tmp, path)
    if fresh_metadata:
        caches = {"iterative": {}, "ours": {}}
    ref2, out2 = both()
    assert ref2 != ref1, "the replacement must change coffea's result"
    assert out2 == ref2
    assert summary(run(ours(client), fileset, metadata_cache=caches["ours"])) == ref2


def test_savemetrics_columns_on_cached_runs(client, nanoaod_dir):
    fileset = {"dy": [str(nanoaod_dir / "nano_dy.root")]}
    out_ref, m_ref = run(processor.IterativeExecutor(), fileset, savemetrics=True)
    (out1, m1), d1 = counted(client, lambda: run(ours(client), fileset, savemetrics=True))
    (out2, m2), d2 = counted(client, lambda: run(ours(client), fileset, savemetrics=True))
    assert d2["misses"] == 0 and d2["hits"] > 0
    expected = set(m_ref["columns"])
    assert "Muon_pt-data" in expected and "Jet_pt-data" in expected
    assert set(m1["columns"]) == expected
    assert set(m2["columns"]) == expected
    assert m2["entries"] == m_ref["entries"] and m2["chunks"] == m_ref["chunks"]
    assert summary(out2) == summary(out_ref)


def test_preload_and_user_metadata(client, nanoaod_dir):
    class MetaProcessor(DimuonJetProcessor):
        def process(self, events):
            out = super().process(events)
            out[events.metadata["dataset"]]["tag"] = {events.metadata["tag"]}
            return out

    fileset = {
        "dy": {
            "files": [str(nanoaod_dir / "nano_dy.root")],
            "preload": ["Muon_pt", "Muon_eta", "nMuon"],
            "metadata": {"tag": "drell-yan"},
        }
    }
    reference = run(processor.IterativeExecutor(), fileset, MetaProcessor())
    for _ in range(2):
        out = run(ours(client), fileset, MetaProcessor())
        assert summary(out) == summary(reference)
        assert out["dy"]["tag"] == {"drell-yan"}


class FrameProcessor(processor.ProcessorABC):
    def process(self, events):
        import pandas as pd

        return pd.DataFrame({"nmuon": ak.to_numpy(ak.num(events.Muon)), "event": ak.to_numpy(events.event)})

    def postprocess(self, accumulator):
        return accumulator


def test_use_dataframes(client, nanoaod_dir):
    fileset = {"dy": [str(nanoaod_dir / "nano_dy.root")]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = run(processor.DaskExecutor(client=client, status=False, use_dataframes=True), fileset, FrameProcessor())
        mine = [run(ours(client, use_dataframes=True), fileset, FrameProcessor()) for _ in range(2)]
    expect = plain.compute().sort_values("event").reset_index(drop=True)
    assert len(expect) == 40 and expect["nmuon"].sum() > 0
    for frame in mine:
        assert frame.compute().sort_values("event").reset_index(drop=True).equals(expect)


def test_adapter_matches_installed_coffea():
    """Fails when coffea changes a private name or signature the adapter uses."""
    assert adapter.check() == []

    seen = []

    class Recording(processor.IterativeExecutor):
        def __call__(self, items, function, accumulator):
            seen.append((self.function_name, function))
            return super().__call__(items, function, accumulator)

    import os.path

    path = os.path.join(os.environ.get("CACHEAFFINITY_NANOAOD_DIR", ""), "nano_dy.root")
    if not os.path.exists(path):
        from tests.conftest import NANOAOD

        path = str(NANOAOD / "nano_dy.root")
    processor.Runner(executor=Recording(), schema=NanoAODSchema, savemetrics=True, metadata_cache={})(
        {"dy": [path]}, processor_instance=DimuonJetProcessor(), treename="Events"
    )
    chunk_fns = [f for name, f in seen if name != "get_metadata"]
    assert chunk_fns, "the Runner called its executor for chunks"
    call = adapter.unwrap(chunk_fns[0])
    assert call is not None, "Runner's chunk function no longer has the shape the adapter reads"
    assert call.work["format"] == "root" and call.work["savemetrics"] is True
    assert adapter.is_base_schema(call.work["schema"])


def test_cachestrategy_with_coffea_executor_never_shares_unidentified_parquet(
    client, tmp_path, nanoaod_dir
):
    """``Runner(cachestrategy=cacheaffinity.cachestrategy)`` with coffea's own DaskExecutor:
    parquet files without uuid give coffea buffer keys starting with ``None``; they must not
    reach the node cache (two datasets would share keys), while the numbers stay right."""
    fileset = {}
    for name in ("nano_dy", "nano_dimuon"):
        write_parquet(nanoaod_dir / f"{name}.root", tmp_path / f"{name}.parquet")
        fileset[name] = [str(tmp_path / f"{name}.parquet")]
    reference = summary(run(processor.IterativeExecutor(), fileset, format="parquet"))
    stock = processor.DaskExecutor(client=client, status=False)
    for _ in range(2):
        out, delta = counted(
            client,
            lambda: run(stock, fileset, format="parquet", cachestrategy=cacheaffinity.cachestrategy),
        )
        assert summary(out) == reference
        assert delta["hits"] == 0, "an unidentified parquet buffer was served from the node cache"
    for name in fileset:
        alone = run(stock, {name: fileset[name]}, format="parquet",
                    cachestrategy=cacheaffinity.cachestrategy)
        assert summary(alone) == {name: reference[name]}


def test_cachestrategy_with_coffea_executor_caches_root_files(client, nanoaod_dir):
    """The same hook caches ROOT input (keys carry the file UUID): run 2 hits."""
    fileset = {"dy": [str(nanoaod_dir / "nano_dy.root")]}
    reference = summary(run(processor.IterativeExecutor(), fileset))
    stock = processor.DaskExecutor(client=client, status=False)
    out1, d1 = counted(client, lambda: run(stock, fileset, cachestrategy=cacheaffinity.cachestrategy))
    out2, d2 = counted(client, lambda: run(stock, fileset, cachestrategy=cacheaffinity.cachestrategy))
    assert summary(out1) == summary(out2) == reference
    assert d1["misses"] > 0 and d2["hits"] > 0
