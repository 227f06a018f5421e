"""Prometheus metrics of the scheduler plugin, scraped from a real scheduler's ``/metrics``."""

from __future__ import annotations

import numpy as np
import prometheus_client
import pytest
from distributed.utils_test import async_poll_for, gen_cluster
from prometheus_client.parser import text_string_to_metric_families
from tornado.httpclient import AsyncHTTPClient

import cacheaffinity
from cacheaffinity import CacheAffinityPlugin, CacheWorkerPlugin
from cacheaffinity.protocol import HOST_NODE_PREFIX
from cacheaffinity.scheduler._metrics import CacheAffinityMetricCollector, register_collector

# 24 chunks: random node ids left one of the 2 nodes without a chunk in 0.07% of draws with 12,
# in none of 20,000 with 24 (python tools/placement_odds.py --files 2 --stripes-per-file 12)
CHUNKS = [f"uuid-{f}/Events/{i * 10}-{(i + 1) * 10}" for f in range(2) for i in range(12)]
COLUMNS = 3
HTTP = {"dashboard": True, "dashboard_address": "127.0.0.1:0"}


def cache_chunk(chunk):
    """A chunk task: its columns from the node cache, else "from storage" and cached."""
    plugin = cacheaffinity.worker_cache()
    front = cacheaffinity.cachestrategy()
    missed = 0
    for i in range(COLUMNS):
        key = f"{chunk}/col{i}"
        if front.get(key) is None:
            missed += 1
            front[key] = np.arange(1000, dtype=np.float32) + i
    if missed:
        plugin.count_storage(opens=1, nbytes=missed * 4000)
    return plugin.node_id


async def scrape(s) -> tuple[str, dict[tuple[str, str | None], float]]:
    """The scheduler's /metrics page, and its cacheaffinity samples by (name, node)."""
    response = await AsyncHTTPClient().fetch(f"http://127.0.0.1:{s.http_server.port}/metrics")
    text = response.body.decode()
    samples = {
        (sample.name, sample.labels.get("node")): sample.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("dask_cacheaffinity_")
        for sample in family.samples
    }
    return text, samples


def total(samples, name):
    return sum(v for (n, _), v in samples.items() if n == name)


async def start_nodes(c, s, tmp_path):
    await c.register_plugin(CacheAffinityPlugin())
    await c.register_plugin(CacheWorkerPlugin(directory=str(tmp_path / "{name}")))
    plugin = s.plugins["cacheaffinity"]

    def ready():
        nodes = plugin.info()["nodes"]
        return (
            len(nodes) == len(s.workers)
            and not any(n.startswith(HOST_NODE_PREFIX) for n in nodes)
            and all("entries" in v["stats"] for v in nodes.values())  # a heartbeat came
        )

    await async_poll_for(ready, timeout=10)
    return plugin


@gen_cluster(
    client=True,
    nthreads=[("127.0.0.1", 1)] * 2,
    scheduler_kwargs=HTTP,
    config={"cacheaffinity.scheduler.stealing.enabled": False},  # every task on target
)
async def test_metrics_follow_placements_and_cache_use(c, s, a, b, tmp_path):
    plugin = await start_nodes(c, s, tmp_path)
    nodes = set(plugin.membership.node_workers)

    _, before = await scrape(s)
    for name in ("placements_total", "hits_total", "misses_total", "entries", "cached_bytes"):
        assert {
            node: before[f"dask_cacheaffinity_{name}", node] for node in nodes
        } == dict.fromkeys(nodes, 0), name

    run1 = await c.gather(cacheaffinity.map_chunks(c, cache_chunk, CHUNKS, chunk_ids=CHUNKS))
    run2 = await c.gather(
        cacheaffinity.map_chunks(c, cache_chunk, CHUNKS, chunk_ids=CHUNKS, pure=False)
    )
    assert run1 == run2 and set(run1) == nodes  # both nodes got chunks, the same ones twice
    cached = len(CHUNKS) * COLUMNS

    def heartbeats_arrived():
        stats = [v["stats"] for v in plugin.info()["nodes"].values()]
        return (
            sum(x.get("entries", 0) for x in stats) == cached
            and sum(x.get("hits", 0) for x in stats) == cached
        )

    await async_poll_for(heartbeats_arrived, timeout=10)
    text, after = await scrape(s)

    per_node = {n: run1.count(n) for n in nodes}
    for node, n in per_node.items():
        assert after["dask_cacheaffinity_placements_total", node] == 2 * n
        assert after["dask_cacheaffinity_tasks_on_target_total", node] == 2 * n
        assert after["dask_cacheaffinity_tasks_off_target_total", node] == 0
        assert after["dask_cacheaffinity_hits_total", node] == n * COLUMNS  # run 2
        assert after["dask_cacheaffinity_misses_total", node] == n * COLUMNS  # run 1
        assert after["dask_cacheaffinity_entries", node] == n * COLUMNS
        assert after["dask_cacheaffinity_cached_bytes", node] == n * COLUMNS * 4096  # blocks
        assert after["dask_cacheaffinity_served_bytes_total", node] == n * COLUMNS * 4000
        assert after["dask_cacheaffinity_storage_opens_total", node] == n  # run 1 only
        assert after["dask_cacheaffinity_storage_read_bytes_total", node] == n * COLUMNS * 4000
        assert after["dask_cacheaffinity_evictions_total", node] == 0
        assert (
            after["dask_cacheaffinity_capacity_bytes", node] == a.plugins["cacheaffinity"].capacity
        )
    for name in ("failovers_total", "steals_total"):
        assert {after[f"dask_cacheaffinity_{name}", n] for n in nodes} == {0}
    assert "# TYPE dask_cacheaffinity_hits_total counter" in text
    assert "# TYPE dask_cacheaffinity_entries gauge" in text
    assert "dask_scheduler_workers" in text  # distributed's own metrics are still there


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)], scheduler_kwargs=HTTP)
async def test_collector_registered_once_and_follows_the_current_scheduler(
    c, s, a, tmp_path, caplog
):
    plugin = await start_nodes(c, s, tmp_path)
    # A second plugin start (registration that replaces the plugin) registers nothing new.
    with pytest.warns(UserWarning, match="overwriting"):
        await s.register_scheduler_plugin(CacheAffinityPlugin(), idempotent=False)
    plugin = s.plugins["cacheaffinity"]
    assert register_collector(s) is register_collector(s)
    ours = [
        x
        for x in prometheus_client.REGISTRY._collector_to_names  # no public listing
        if isinstance(x, CacheAffinityMetricCollector)
    ]
    assert len(ours) == 1 and ours[0].server is s

    text, samples = await scrape(s)
    assert text.count("# TYPE dask_cacheaffinity_placements_total counter") == 1
    # only this scheduler's node, although other tests' schedulers ran in this process
    assert {node for _, node in samples} == set(plugin.info()["nodes"])

    # A failing collection is logged and leaves the rest of the page alone.
    def broken():
        raise RuntimeError("boom")

    s.plugins["cacheaffinity"].info = broken
    text, samples = await scrape(s)
    assert not samples and "dask_scheduler_workers" in text
    assert "could not be collected" in caplog.text

    # Without the plugin: nothing from cacheaffinity, no error.
    await c.unregister_scheduler_plugin("cacheaffinity")
    text, samples = await scrape(s)
    assert not samples and "dask_scheduler_workers" in text
