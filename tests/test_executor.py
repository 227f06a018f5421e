"""The coffea executor end to end: real NanoAOD files, real clusters, real caches."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
import warnings

import dask
import pytest
from coffea import processor
from coffea.nanoevents import NanoAODSchema
from distributed import Client, LocalCluster

import cacheaffinity
from testbed.synthetic import make_dataset
from examples.analysis import DimuonJetProcessor, summary
from helpers import cache_client, counted, preload_config, run_coffea

REAL = ["nano_dy.root", "nano_dimuon.root", "nanoAOD_2015_CMS_Open_Data_ttbar.root"]

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


# stealing may move a chunk of run 2 to a node without its columns (a miss by
# design, tested in test_stealing.py); here run 2 must be all hits
NO_STEALING = {"cacheaffinity.scheduler.stealing.enabled": False}
# in-process workers' learned speeds are noise on a loaded machine, and a node learned
# slower than 1/locator-slack sheds chunks it holds (a miss in run 2 by design: see
# test_packs.NO_DAMPING); these tests are about the executor, so the damping is off
NO_DAMPING = {"cacheaffinity.scheduler.locator-slack": 1e9}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with cache_client(tmp_path_factory.mktemp("caches"), 3, **NO_STEALING, **NO_DAMPING) as c:
        yield c


@pytest.fixture(scope="module")
def real_fileset(nanoaod_dir):
    return {name.split(".")[0]: [str(nanoaod_dir / name)] for name in REAL}


def run(executor, fileset, chunksize=50, **kwargs):
    return run_coffea(executor, fileset, DimuonJetProcessor(), chunksize, **kwargs)




def run_counted(client, fileset, **kwargs):
    ours = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
    return counted(client, lambda: run(ours, fileset, **kwargs))


def test_identical_to_coffea_executors_and_rerun_reads_nothing(client, real_fileset):
    iterative = summary(run(processor.IterativeExecutor(), real_fileset))
    plain = summary(run(processor.DaskExecutor(client=client, status=False), real_fileset))
    assert iterative == plain
    assert sum(d["muons"] for d in iterative.values()) > 0, "the analysis selects something"

    out1, d1 = run_counted(client, real_fileset)
    out2, d2 = run_counted(client, real_fileset)
    assert summary(out1) == iterative
    assert summary(out2) == iterative
    assert d1["misses"] > 0 and d1["storage_bytes"] > 0
    # run 2: every column from the node caches, nothing from storage
    assert d2["misses"] == 0 and d2["hits"] > 0
    assert d2["storage_bytes"] == 0 and d2["storage_opens"] == 0


@pytest.mark.parametrize("codec", ["zlib", "lzma"])
def test_generated_data(client, tmp_path, codec):
    files = make_dataset(
        tmp_path / codec, events=3000, files=2, codec=codec, seed=3,
        branches=["Muon_*", "Jet_*", "nMuon", "nJet"],
    )  # fmt: skip
    fileset = {"gen": [str(f) for f in files]}
    reference = summary(run(processor.IterativeExecutor(), fileset, chunksize=500))
    out1, d1 = run_counted(client, fileset, chunksize=500)
    # run 2 reads nothing from the files (it only checks their size and time)
    out2, d2 = run_counted(client, fileset, chunksize=500)
    assert summary(out1) == reference == summary(out2)
    assert d1["storage_opens"] > 0
    assert d2["misses"] == 0 and d2["storage_opens"] == 0 and d2["storage_bytes"] == 0
    # the data files go away: the cache must not stand in for them (coffea fails too)
    shutil.move(tmp_path / codec, tmp_path / f"{codec}-moved")
    with pytest.raises(Exception) as info:
        run_counted(client, fileset, chunksize=500)
    chain = [info.value]
    while chain[-1].__cause__ or chain[-1].__context__:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    assert any(isinstance(e, FileNotFoundError) for e in chain), chain


def test_missing_column_falls_back_to_storage(client, tmp_path, nanoaod_dir):
    src = tmp_path / "dy.root"
    shutil.copy(nanoaod_dir / "nano_dy.root", src)
    fileset = {"dy": [str(src)]}
    reference = summary(run(processor.IterativeExecutor(), fileset))
    run_counted(client, fileset)
    # wipe every node's column cache but keep the forms: columns must come back
    for node in cacheaffinity.cache_stats(client).values():
        with cacheaffinity.ColumnCache(node["directory"]) as cache:
            cache.clear()
    out, d = run_counted(client, fileset)
    assert summary(out) == reference
    assert d["misses"] > 0 and d["storage_bytes"] > 0


@pytest.mark.parametrize("skipbadfiles", [True, False], ids=["skipbadfiles", "strict"])
def test_missing_and_corrupt_files_behave_as_in_coffea(client, tmp_path, nanoaod_dir, skipbadfiles):
    corrupt = tmp_path / "corrupt.root"
    data = (nanoaod_dir / "nano_dy.root").read_bytes()
    corrupt.write_bytes(data[: len(data) // 3])
    good = str(nanoaod_dir / "nano_dimuon.root")
    fileset = {"mixed": [good, str(tmp_path / "missing.root"), str(corrupt)]}

    def outcome(executor):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # own metadata cache: coffea's shared default would let the second
                # executor skip the good file's preprocessing (and then fail to
                # reduce the bad files' empty results, a coffea quirk)
                return summary(
                    run(executor, fileset, skipbadfiles=skipbadfiles, metadata_cache={})
                )
        except Exception as e:
            # which bad file fails first varies; both are OSErrors in the chain
            chain = []
            while e is not None:
                chain.append(type(e))
                e = e.__cause__ or e.__context__
            return "error with OSError" if any(issubclass(t, OSError) for t in chain) else chain

    coffea = outcome(processor.DaskExecutor(client=client, status=False))
    ours = outcome(cacheaffinity.CacheAffinityExecutor(client=client, status=False))
    assert ours == coffea
    if skipbadfiles:
        assert ours == summary(run(processor.IterativeExecutor(), {"mixed": [good]}))
    else:
        assert ours == "error with OSError"


def test_refuses_a_scheduler_without_plugin():
    with dask.config.set({"distributed.scheduler.preload": []}), LocalCluster(
        n_workers=1, processes=False, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as c:
            # refused when the executor is made, before any Runner call, in one line
            with pytest.raises(RuntimeError, match="no cacheaffinity plugin") as refused:
                cacheaffinity.CacheAffinityExecutor(client=c, status=False)
            assert "\n" not in str(refused.value)
            assert refused.value.__cause__ is None and refused.value.__suppress_context__
            assert "dask scheduler --preload cacheaffinity" in str(refused.value)


def test_refuses_a_misspelled_setting_when_made(client):
    """The setting that stops a worker (DASK_CACHEAFFINITY__WORKER__CAPACTIY: the dask key
    below) is refused on the client too, when the executor is made."""
    with dask.config.set({"cacheaffinity.worker.capactiy": "1GiB"}):
        with pytest.raises(ValueError, match=r"cacheaffinity\.worker\.capactiy='1GiB' is not a setting"):
            cacheaffinity.CacheAffinityExecutor(client=client, status=False)
    assert cacheaffinity.CacheAffinityExecutor(client=client, status=False).client is client


def test_refuses_worker_affinity(client):
    executor = cacheaffinity.CacheAffinityExecutor(client=client, worker_affinity=True)
    with pytest.raises(ValueError, match="drop worker_affinity"):
        executor([object()], lambda x: x, None)


def test_copy_keeps_fields(client):
    ex = cacheaffinity.CacheAffinityExecutor(client=client, node_cache=False, retries=5)
    copied = ex.copy(unit="chunk")
    assert isinstance(copied, processor.DaskExecutor)
    assert (copied.node_cache, copied.retries, copied.unit) == (False, 5, "chunk")


class SlowProcessor(DimuonJetProcessor):
    def process(self, events):
        time.sleep(0.3)
        return super().process(events)


@pytest.mark.timeout(240)
def test_worker_killed_mid_run_still_gives_correct_result(tmp_path, nanoaod_dir):
    fileset = {"tt": [str(nanoaod_dir / "nanoAOD_2015_CMS_Open_Data_ttbar.root")]}
    reference = summary(run(processor.IterativeExecutor(), fileset, chunksize=10))
    # stripes of 10 entries: the one file's chunks spread over all three workers
    with dask.config.set(preload_config(tmp_path, **NO_STEALING, **{"cacheaffinity.client.stripe-entries": 10})):
        with LocalCluster(
            n_workers=3, threads_per_worker=1, processes=True, host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        ) as cluster, Client(cluster) as c:  # fmt: skip
            c.wait_for_workers(3)
            result = {}

            def analysis():
                runner = processor.Runner(
                    executor=cacheaffinity.CacheAffinityExecutor(client=c, status=False, retries=5),
                    schema=NanoAODSchema,
                    chunksize=10,
                )
                result["out"] = runner(fileset, processor_instance=SlowProcessor(), treename="Events")

            t = threading.Thread(target=analysis)
            t.start()
            # wait until chunks are running, then kill one worker process hard: once all
            # three are busy, or 1 s after the first is (random node ids leave a worker
            # without a stripe in ~0.1% of runs); the last workers seen busy
            deadline, busy = time.monotonic() + 60, []
            while time.monotonic() < deadline:
                now_busy = [w for w, n in c.processing().items() if n]
                if now_busy:
                    busy = now_busy
                    if len(busy) == 3:
                        break
                    deadline = min(deadline, time.monotonic() + 1)
                time.sleep(0.05)
            assert busy, "no worker started a chunk within 60 s"
            pid = c.run(os.getpid, workers=[busy[0]])[busy[0]]
            os.kill(pid, signal.SIGKILL)
            t.join(180)
            assert not t.is_alive()
    assert summary(result["out"]) == reference


def test_cached_rerun_of_every_shared_nanoaod_file_opens_no_file(client, nanoaod_dir):
    """Every file of the shared NanoAOD set, the empty one (0 entries) included:
    run 2 opens no file and reads nothing from storage, results as coffea's."""
    names = sorted(p.name for p in nanoaod_dir.glob("*.root"))
    assert "nano_dy_empty.root" in names and len(names) >= 8
    fileset = {name.split(".")[0]: [str(nanoaod_dir / name)] for name in names}
    try:
        iterative = summary(run(processor.IterativeExecutor(), fileset))
    except Exception as e:  # pragma: no cover - the analysis must read them all
        pytest.fail(f"coffea cannot run the analysis on the shared files: {e!r}")
    out1, d1 = run_counted(client, fileset)
    out2, d2 = run_counted(client, fileset)
    assert summary(out1) == iterative and summary(out2) == iterative
    assert d1["storage_opens"] > 0
    assert d2["storage_opens"] == 0 and d2["storage_bytes"] == 0 and d2["misses"] == 0, d2


def _frame_snapshots_guarded() -> bool:
    import sys

    return bool(getattr(sys._current_frames, "_cacheaffinity_guarded", False))


def test_gc_setting_freezes_once_after_the_first_chunk(tmp_path, nanoaod_dir):
    """``cacheaffinity.worker.gc``: with ``auto`` (the default) and ``freeze`` a worker
    process (a nanny's child) has frozen its objects after its first chunk task
    (gc.get_freeze_count() > 10k); with ``python`` nothing is frozen; ``auto`` in an
    in-process cluster leaves the user's process alone.  Results are unchanged."""
    import gc

    from cacheaffinity.worker._collector import FRAME_SNAPSHOT_DEADLOCK, resolve

    assert resolve("auto") == "python"  # this test process is nobody's worker
    fileset = {"dy": [str(nanoaod_dir / "nano_dy.root")]}
    expected = summary(run(processor.IterativeExecutor(), fileset))
    counts = {}
    for mode in ("python", "freeze", None):
        settings = preload_config(tmp_path / str(mode))
        if mode is not None:
            settings["cacheaffinity.worker.gc"] = mode
        with dask.config.set(settings), LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0", host="127.0.0.1"
        ) as cluster, Client(cluster) as c:
            assert set(c.run(gc.get_freeze_count).values()) == {0}
            out = run(cacheaffinity.CacheAffinityExecutor(client=c, status=False), fileset)
            assert summary(out) == expected
            (counts[mode],) = c.run(gc.get_freeze_count).values()
            # whatever the mode, before Python 3.12 the profiler's frame snapshots run
            # without the collector (CPython gh-106883)
            assert set(c.run(_frame_snapshots_guarded).values()) == {FRAME_SNAPSHOT_DEADLOCK}
    assert counts["python"] == 0 and counts["freeze"] > 10_000 and counts[None] > 10_000, counts

    before = gc.get_freeze_count()
    with dask.config.set(preload_config(tmp_path / "inproc")), LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster, Client(cluster) as c:
        out = run(cacheaffinity.CacheAffinityExecutor(client=c, status=False), fileset)
        assert summary(out) == expected
    assert gc.get_freeze_count() == before == 0
