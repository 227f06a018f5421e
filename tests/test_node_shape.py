"""The facility node shape of the benchmarks (benchmarks/_clusters.py) on a real cluster: the
worker processes of one node share its cache directory, hence one cache node."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import dask
import pytest
from distributed import Client

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import cacheaffinity  # noqa: E402
from benchmarks import _clusters  # noqa: E402


def test_parse_shape_reads_nodes_by_processes_and_names_the_fix():
    assert _clusters.parse_shape("2x2") == (2, 2) and _clusters.parse_shape("4X1") == (4, 1)
    for bad in ("2", "2x", "0x2", "axb"):
        with pytest.raises(ValueError, match="NODESxPROCESSES|>= 1"):
            _clusters.parse_shape(bad)
    assert _clusters.node_names(2, 2) == ["0-0", "0-1", "1-0", "1-1"]


def test_two_nodes_of_two_processes_are_two_cache_nodes(tmp_path):
    settings = {"distributed.scheduler.preload": ["cacheaffinity"], "distributed.worker.preload": ["cacheaffinity"],
                "cacheaffinity.worker.capacity": "1 GiB"}  # fmt: skip
    with dask.config.set(settings):
        with _clusters.node_cluster(2, 2, lambda n: tmp_path / f"node-{n}") as cluster, Client(cluster) as client:
            client.wait_for_workers(4)
            deadline = time.monotonic() + 120
            nodes = cacheaffinity.check(client, warn=False)["nodes"]
            while len(nodes) != 2 or sum(len(d["workers"]) for d in nodes.values()) != 4:
                assert time.monotonic() < deadline, nodes  # waits for the workers' first reports
                time.sleep(0.1)
                nodes = cacheaffinity.check(client, warn=False)["nodes"]
            dirs = client.run(lambda dask_worker: dask.config.get("cacheaffinity.worker.directory"))
    assert sorted(len(d["workers"]) for d in nodes.values()) == [2, 2]
    by_dir = {}
    for address, directory in dirs.items():
        by_dir.setdefault(directory, set()).add(address)
    assert sorted(by_dir) == [str(tmp_path / "node-0"), str(tmp_path / "node-1")]
    # the processes of one directory are the workers of one cache node
    assert sorted(sorted(d["workers"]) for d in nodes.values()) == sorted(sorted(a) for a in by_dir.values())
    assert all((tmp_path / f"node-{n}" / "node-id").exists() for n in range(2))
