"""The default placement stripe size (``cacheaffinity.client.stripe-entries: null``)."""

from __future__ import annotations

import dask
import pytest
from distributed import Client, LocalCluster

from cacheaffinity.coffea import adapter
from cacheaffinity.coffea.executor import _ChunkClient
from cacheaffinity.coffea.identity import (
    MAX_STRIPE_ENTRIES,
    STRIPES_PER_NODE,
    chunk_identity,
    default_stripe_entries,
)


def test_default_stripe_rule():
    # the benchmark's small dataset: 80,000 entries, 4 nodes -> 5,000
    assert default_stripe_entries(80_000, 2_500, 4) == 5_000
    # unchanged by a chunksize change below the balance target (run 3-5 of issue 13),
    # and a multiple of the round chunksizes (stripe boundaries are chunk boundaries)
    assert {default_stripe_entries(80_000, c, 4) for c in (1250, 1000, 2500, 3750)} == {5_000}
    assert default_stripe_entries(4 * 10**6, 100_000, 4) == 200_000  # capped
    assert default_stripe_entries(4 * 10**6, 100_000, 50) == 100_000  # 20,000 < a chunk
    # at least STRIPES_PER_NODE stripes per node when chunks allow it
    for total, nodes in [(10**6, 3), (123_457, 7), (80_000, 4)]:
        s = default_stripe_entries(total, 100, nodes)
        assert total / s >= nodes * STRIPES_PER_NODE
        assert str(s).strip("0") in ("1", "2", "5")  # a 1-2-5 round number
        assert total / (2.5 * s) < nodes * STRIPES_PER_NODE  # and the largest such
    # never smaller than a chunk, never above the cap
    assert default_stripe_entries(80_000, 20_000, 4) == 20_000
    assert default_stripe_entries(80_000, 15_000, 4) == 20_000
    assert default_stripe_entries(10**9, 1000, 2) == MAX_STRIPE_ENTRIES
    assert default_stripe_entries(0, 0, 0) == 1


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


def test_executor_picks_the_default_from_the_run(client):
    work = items()
    with dask.config.set({"cacheaffinity.client.stripe-entries": None}):
        stripe = _ChunkClient(client)._stripe_entries(work)
    assert stripe == 5_000  # 40,000 / 16 = 2,500 -> 2,000, below the chunk: 5,000
    ids = {chunk_identity(x, {x.filename: None for x in work}, stripe) for x in work}
    assert all(f"/s{stripe}:" in i for i in ids)
    assert len(ids) >= 4 * 2  # several placement units per worker on this small dataset
    with dask.config.set({"cacheaffinity.client.stripe-entries": 10_000}):
        assert _ChunkClient(client)._stripe_entries(work) == 10_000  # a set value wins


def test_chunk_identity_without_executor_uses_the_cap():
    (x,) = items(n_files=1, entries=2_500)
    with dask.config.set({"cacheaffinity.client.stripe-entries": None}):
        assert chunk_identity(x, {x.filename: None}).endswith(f"/s{MAX_STRIPE_ENTRIES}:0")
