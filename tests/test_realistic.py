"""The realistic analysis (examples/realistic.py) on real NanoAOD files and generated data:
identical outputs with coffea's IterativeExecutor, DaskExecutor and CacheAffinityExecutor,
and the number of branches it reads."""

from __future__ import annotations

import pytest
from coffea import processor

import cacheaffinity
from benchmarks._common import make_dataset
from helpers import cache_client, run_coffea
from examples.realistic import TTbarLikeProcessor, branches_read, read_share, summary

REAL = ["nano_dy.root", "nano_dimuon.root", "nanoAOD_2015_CMS_Open_Data_ttbar.root"]

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


def run(executor, fileset, chunksize=50, **kwargs):
    return run_coffea(executor, fileset, TTbarLikeProcessor(), chunksize, **kwargs)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with cache_client(tmp_path_factory.mktemp("caches"), 2) as c:
        yield c


@pytest.mark.timeout(240)
def test_real_files_iterative_dask_cacheaffinity_identical(client, nanoaod_dir):
    fileset = {name.split(".")[0]: [str(nanoaod_dir / name)] for name in REAL}
    iterative = summary(run(processor.IterativeExecutor(), fileset))
    dask_out = summary(run(processor.DaskExecutor(client=client, status=False), fileset))
    assert iterative == dask_out
    ca = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
    assert summary(run(ca, fileset)) == iterative  # run 1 (cold cache)
    assert summary(run(ca, fileset)) == iterative  # run 2 (from the node caches)
    # the analysis selects something and fills its histograms in the simulated samples
    dy = iterative["nano_dy"]
    assert dy["entries"] == 40
    cuts = [sum(row[:-1]) for row in dy["cutflow"][:-1]]  # per cut, over channels (no flow)
    assert cuts[0] == 40 and cuts[4] > 0, cuts  # events pass up to the lepton selection
    assert all(a >= b for a, b in zip(cuts, cuts[1:])), cuts  # a cut flow only decreases
    assert sum(iterative[n.split(".")[0]]["selected"] for n in REAL) > 0


def test_reads_at_least_80_branches_on_every_real_file(nanoaod_dir):
    for name in REAL:
        branches = branches_read(TTbarLikeProcessor(), str(nanoaod_dir / name))
        assert len(branches) >= 80, (name, len(branches))
        # several collections, their IDs/isolation/corrections inputs, triggers, MET
        for b in ("Muon_tightId", "Muon_pfRelIso04_all", "Electron_mvaFall17V2Iso_WP90",
                  "Jet_rawFactor", "Jet_area", "fixedGridRhoFastjetAll", "Jet_btagDeepFlavB",
                  "MET_pt", "PuppiMET_pt", "PV_npvsGood", "FatJet_deepTagMD_HbbvsQCD"):  # fmt: skip
            assert b in branches, (name, b)
        assert sum(b.startswith("HLT_") for b in branches) >= 5, name
    share = read_share(TTbarLikeProcessor(), [str(nanoaod_dir / "nano_dy.root")])
    assert share["n_branches"] >= 150
    assert share["share"] > 0.2  # a sizeable share of the file's uncompressed bytes


@pytest.mark.timeout(240)
def test_generated_lzma_data(tmp_path, client):
    files = make_dataset(tmp_path / "d", events=600, files=2, seed=3, codec="lzma")
    share = read_share(TTbarLikeProcessor(), files)
    assert share["n_branches"] >= 150 and share["share"] > 0.2, share
    fileset = {"synthetic": [str(f) for f in files]}
    iterative = summary(run(processor.IterativeExecutor(), fileset, chunksize=200))
    ca = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
    assert summary(run(ca, fileset, chunksize=200)) == iterative
    assert iterative["synthetic"]["entries"] == 600
    assert iterative["synthetic"]["selected"] > 0
