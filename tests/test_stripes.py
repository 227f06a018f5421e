"""The default placement stripe size (``cacheaffinity.client.stripe-entries: null``)."""

from __future__ import annotations

import dask
import pytest
from distributed import Client, LocalCluster

from cacheaffinity.coffea import _adapter as adapter
from cacheaffinity.coffea._executor import _ChunkClient
from cacheaffinity.coffea._identity import (
    MAX_STRIPE_ENTRIES,
    MIN_STRIPE_ENTRIES,
    STRIPES_PER_FILE,
    chunk_identity,
    default_stripe_entries,
)


def test_default_stripe_rule():
    # the benchmarks' small files: 20,000 entries -> 5,000 (4 stripes per file)
    assert default_stripe_entries(20_000) == 5_000
    assert default_stripe_entries(800_000) == MAX_STRIPE_ENTRIES  # large files: the cap
    assert default_stripe_entries(10**9) == MAX_STRIPE_ENTRIES
    assert default_stripe_entries(0) == MIN_STRIPE_ENTRIES  # never below the floor
    assert default_stripe_entries(3_000) == MIN_STRIPE_ENTRIES
    for n in (4_000, 10_000, 123_457, 399_999):
        s = default_stripe_entries(n)
        assert n / s >= STRIPES_PER_FILE  # at least STRIPES_PER_FILE stripes per file
        assert str(s).strip("0") in ("1", "2", "5")  # a 1-2-5 round number
        assert n / (2.5 * s) < STRIPES_PER_FILE  # and the largest such


def items(n_files=2, entries=20_000, chunk=2_500):
    return [
        adapter.WorkItem("ds", f"/data/f{f}.root", "Events", a, min(a + chunk, entries), f"{f:032x}", {})
        for f in range(n_files)
        for a in range(0, entries, chunk)
    ]


@pytest.fixture(scope="module")
def client():
    with LocalCluster(
        n_workers=4, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster, Client(cluster) as c:
        c.wait_for_workers(4)
        yield c


def test_executor_picks_the_default_per_file(client):
    work = items()
    with dask.config.set({"cacheaffinity.client.stripe-entries": None}):
        stripes = _ChunkClient(client)._stripe_entries(work)
        # the file alone decides: another chunksize, a subset of files or another
        # worker count give the same stripes (placement does not move)
        assert _ChunkClient(client)._stripe_entries(items(chunk=1_250)) == stripes
        assert _ChunkClient(client)._stripe_entries(items(chunk=3_750)) == stripes
        assert _ChunkClient(client)._stripe_entries(items(n_files=1)) == {
            "/data/f0.root": stripes["/data/f0.root"]
        }
        client.cluster.scale(2)
        client.wait_for_workers(2)
        assert _ChunkClient(client)._stripe_entries(work) == stripes
    assert stripes == {"/data/f0.root": 5_000, "/data/f1.root": 5_000}
    ids = {chunk_identity(x, {x.filename: None for x in work}, stripes) for x in work}
    assert all("/s5000:" in i for i in ids)
    assert len(ids) == 2 * 4  # four placement units per file
    with dask.config.set({"cacheaffinity.client.stripe-entries": 10_000}):
        assert _ChunkClient(client)._stripe_entries(work) == 10_000  # a set value wins


def test_chunk_identity_without_executor_uses_the_cap():
    (x,) = items(n_files=1, entries=2_500)
    with dask.config.set({"cacheaffinity.client.stripe-entries": None}):
        assert chunk_identity(x, {x.filename: None}).endswith(f"/s{MAX_STRIPE_ENTRIES}:0")
