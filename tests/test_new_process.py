"""A re-run in a new Python process (a batch script, a restarted kernel).

The workers persist, the client side does not: each run here is a fresh
``python`` process that connects to the same cluster and runs the analysis once.
coffea's ``Runner`` remembers preprocessing only in its process; the node caches
keep it, so a fully cached re-run opens no data file, preprocessing included.
Opens are watched independently of cacheaffinity's own counters, with Linux
inotify on the data directory (any process's ``open`` of a file there).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import shutil
import struct
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from coffea import processor

import cacheaffinity
from examples.analysis import DimuonJetProcessor, summary
from helpers import preload_config, run_coffea

REPO = Path(__file__).resolve().parents[1]
FILES = ["nano_dy.root", "nano_dimuon.root", "nanoAOD_2015_CMS_Open_Data_ttbar.root"]

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")

#: One analysis run as a new process: connect, run, print summary and figures.
CLIENT = """
import json, sys, warnings
warnings.simplefilter("ignore")
from distributed import Client
import cacheaffinity
from examples.analysis import DimuonJetProcessor, summary
from coffea import processor
from coffea.nanoevents import NanoAODSchema

address, fileset, user_cache = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
with Client(address) as client:
    executor = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
    kwargs = {}
    if user_cache:  # a user's own metadata cache, filled beforehand (here: by another Runner)
        kwargs["metadata_cache"] = {}
        other = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
        list(processor.Runner(executor=other, schema=NanoAODSchema, chunksize=50,
                              **kwargs).preprocess(fileset, treename="Events"))
    runner = processor.Runner(executor=executor, schema=NanoAODSchema, chunksize=50, **kwargs)
    out = runner(fileset, processor_instance=DimuonJetProcessor(), treename="Events")
    print(json.dumps({"summary": summary(out), "stats": executor.last_run_stats}))
"""


def run_in_new_process(address: str, fileset: dict, user_cache: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-c", CLIENT, address, json.dumps(fileset), "1" if user_cache else "0"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# Linux inotify, through libc (no package needed): IN_OPEN events of a directory.
IN_OPEN = 0x20
IN_NONBLOCK = 0o4000


@contextmanager
def opened_files(directory: Path):
    """Yields a list that holds, once the block ends, the names of the files in
    ``directory`` that any process opened meanwhile."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fd = libc.inotify_init1(IN_NONBLOCK)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    try:
        assert libc.inotify_add_watch(fd, str(directory).encode(), IN_OPEN) >= 0
        names: list[str] = []
        yield names
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                break
            i = 0
            while i < len(data):
                _, _, _, length = struct.unpack_from("iIII", data, i)
                name = data[i + 16 : i + 16 + length].rstrip(b"\0").decode()
                names.append(name)
                i += 16 + length
    finally:
        os.close(fd)


@contextmanager
def cluster_client(cache_root: Path, n_workers: int, **extra):
    """A ``LocalCluster`` (workers in this process, TCP on 127.0.0.1 so that other
    processes can connect) with cacheaffinity's preloads, and its client."""
    import dask
    from distributed import Client, LocalCluster

    with dask.config.set(preload_config(cache_root, **extra)):
        with LocalCluster(
            n_workers=n_workers, threads_per_worker=1, processes=False, protocol="tcp://",
            host="127.0.0.1", dashboard_address=None,
        ) as cluster, Client(cluster) as c:
            yield c


@pytest.fixture
def data(tmp_path, nanoaod_dir):
    d = tmp_path / "data"
    d.mkdir()
    for name in FILES:
        shutil.copy(nanoaod_dir / name, d / name)
    return d


def test_rerun_in_a_new_process_opens_no_file_and_counts_its_preprocessing(
    tmp_path, data, nanoaod_dir
):
    fileset = {name.split(".")[0]: [str(data / name)] for name in FILES}
    reference = summary(run_coffea(processor.IterativeExecutor(), fileset, DimuonJetProcessor(), 50))
    no_stealing = {"cacheaffinity.scheduler.stealing.enabled": False}
    with cluster_client(tmp_path / "caches", 2, **no_stealing) as client:
        address = client.scheduler.address
        with opened_files(data) as opened1:
            cold = run_in_new_process(address, fileset)
        with opened_files(data) as opened2:
            warm = run_in_new_process(address, fileset)
        assert cold["summary"] == reference and warm["summary"] == reference

        # run 1: every file preprocessed by opening it, counted in run 1 itself
        s1, s2 = cold["stats"], warm["stats"]
        assert sorted(set(opened1)) == sorted(FILES)
        assert s1["files_preprocessed"] == len(FILES) and s1["metadata_hits"] == 0
        assert s1["storage_opens"] >= len(FILES) and s1["preprocess_ms"] > 0
        # run 2, a new process: preprocessing answered by the node caches, no file opened
        assert opened2 == [], opened2
        assert s2["files_preprocessed"] == len(FILES) and s2["metadata_hits"] == len(FILES)
        assert s2["storage_opens"] == 0 and s2["storage_bytes"] == 0 and s2["misses"] == 0
        assert s2["hits"] > 0

        # one row per run: no separate pseudo-run for the preprocessing
        rows = cacheaffinity.run_stats(client, last=20)
        assert [r["run"] for r in rows] == [s1["run"], s2["run"]]
        assert rows[-1]["files_preprocessed"] == len(FILES) and rows[-1]["tasks"] == s2["tasks"]
        cli = subprocess.run(
            [sys.executable, "-m", "cacheaffinity.cli", "stats", address, "--last", "5"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert cli.returncode == 0, cli.stderr
        lines = cli.stdout.strip().splitlines()
        assert "preprocessed" in lines[0] and len(lines) == 3, cli.stdout

        # a file replaced in place (same path, other content): a new process sees it
        replaced = data / "nano_dy.root"
        shutil.copy(nanoaod_dir / "nano_tree.root", replaced)
        expected = summary(run_coffea(processor.IterativeExecutor(), fileset, DimuonJetProcessor(), 50))
        assert expected != reference
        with opened_files(data) as opened3:
            third = run_in_new_process(address, fileset)
        assert third["summary"] == expected
        assert "nano_dy.root" in opened3
        assert third["stats"]["metadata_hits"] == len(FILES) - 1


def test_a_users_own_metadata_cache_keeps_working(tmp_path, data):
    fileset = {name.split(".")[0]: [str(data / name)] for name in FILES[:2]}
    reference = summary(run_coffea(processor.IterativeExecutor(), fileset, DimuonJetProcessor(), 50))
    with cluster_client(tmp_path / "caches", 1) as client:
        out = run_in_new_process(client.scheduler.address, fileset, user_cache=True)
    assert out["summary"] == reference
    # the user's cache was filled by runner.preprocess: the analysis run preprocessed nothing
    assert out["stats"]["files_preprocessed"] == 0
