"""The scheduler plugin on real Dask clusters (gen_cluster: in-process scheduler and workers).

Every worker gets its own cache directory (``{name}``), so each worker is its own
cache node, as on a cluster of single-worker nodes.
"""

from __future__ import annotations

import asyncio
import random

import dask
import pytest
from distributed import Event, Worker, get_worker
from distributed.utils_test import async_poll_for, gen_cluster

import cacheaffinity
from cacheaffinity import CacheAffinityPlugin, CacheWorkerPlugin
from cacheaffinity.protocol import HOST_NODE_PREFIX

NO_STEALING = {"cacheaffinity.scheduler.stealing.enabled": False}
CHUNKS = [f"uuid-{f:02d}/Events/{i * 1000}-{(i + 1) * 1000}" for f in range(5) for i in range(12)]


def where_am_i(_chunk):
    return get_worker().address


def blocked(_chunk, event_name):
    Event(event_name).wait(timeout=60)
    return get_worker().address


async def setup_cache_nodes(c, s, tmp_path, n=None, **plugin_kwargs):
    """Register both plugins and wait until the scheduler knows every node."""
    await c.register_plugin(CacheAffinityPlugin(**plugin_kwargs))
    await c.register_plugin(CacheWorkerPlugin(directory=str(tmp_path / "{name}")))
    plugin = s.plugins["cacheaffinity"]
    n = len(s.workers) if n is None else n
    await async_poll_for(
        lambda: len(plugin.membership.node_workers) == n
        and not any(k.startswith(HOST_NODE_PREFIX) for k in plugin.membership.node_workers),
        timeout=10,
    )
    return plugin


def node_of(plugin, address):
    return plugin.membership.worker_node[address]


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 3, config=NO_STEALING)
async def test_same_placement_across_runs_and_submission_order(c, s, a, b, w3, tmp_path):
    plugin = await setup_cache_nodes(c, s, tmp_path)
    homes = plugin.where(CHUNKS)
    assert {h["node"] for h in homes.values()} == set(plugin.membership.node_workers), "all nodes used"

    futs = cacheaffinity.map_chunks(c, where_am_i, CHUNKS, chunk_ids=CHUNKS)
    run1 = dict(zip(CHUNKS, await c.gather(futs)))
    del futs
    shuffled = CHUNKS[:]
    random.Random(1).shuffle(shuffled)
    futs = cacheaffinity.map_chunks(c, where_am_i, shuffled, chunk_ids=shuffled, pure=False)
    run2 = dict(zip(shuffled, await c.gather(futs)))

    for ch in CHUNKS:
        assert node_of(plugin, run1[ch]) == homes[ch]["node"]
        assert run2[ch] == run1[ch]
    events = [e for _, e in await c.get_events("cacheaffinity") if e.get("action") == "place"]
    assert events and "nearest cache node" in events[-1]["reason"]


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 3, config=NO_STEALING)
async def test_tasks_wait_for_their_node_while_others_idle(c, s, a, b, w3, tmp_path):
    plugin = await setup_cache_nodes(c, s, tmp_path)
    busy_node = node_of(plugin, a.address)
    mine = [ch for ch, h in plugin.where(CHUNKS).items() if h["node"] == busy_node]
    assert len(mine) >= 5
    ev = Event("release-a")
    futs = cacheaffinity.map_chunks(
        c, blocked, mine, [ev.name] * len(mine), chunk_ids=mine, pure=False
    )
    # Everything is queued on a's node while b and w3 idle; nothing moves.
    await async_poll_for(lambda: len(a.state.tasks) == len(mine), timeout=10)
    assert not b.state.tasks and not w3.state.tasks
    for ts in s.tasks.values():
        if ts.key in {f.key for f in futs}:
            assert ts.worker_restrictions == {a.address} and ts.loose_restrictions
    await ev.set()
    assert set(await c.gather(futs)) == {a.address}


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 3, config=NO_STEALING)
async def test_untagged_tasks_are_left_to_dask(c, s, a, b, w3, tmp_path):
    await setup_cache_nodes(c, s, tmp_path)
    fut = c.submit(sum, [1, 2, 3])
    assert await fut == 6
    ts = s.tasks[fut.key]
    assert not ts.worker_restrictions and not ts.annotations.get("cacheaffinity")


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 3, config=NO_STEALING)
async def test_hooks_bookkeeping_over_a_task_lifetime(c, s, a, b, w3, tmp_path):
    """What the fast paths of update_graph and transition must keep: every chunk task
    is tracked and targeted, restricted loosely to its node; each carries its own chunk
    id as annotation (not the batch's map); finishing records on-target runs and
    holders; plain tasks in the same graph are never tracked; forgetting frees all."""
    plugin = await setup_cache_nodes(c, s, tmp_path)
    loc = plugin.locator
    keys = [f"hooks-{i}" for i in range(len(CHUNKS))]
    ids = cacheaffinity.ChunkIds(zip(keys, CHUNKS))
    assert ids(keys[3]) == CHUNKS[3] and ids("no-such-key") is None
    ev = Event("hooks-hold")
    with cacheaffinity.chunks(dict(zip(keys, CHUNKS))):
        futs = c.map(blocked, CHUNKS, event_name="hooks-hold", key=keys)
        plain = c.submit(blocked, "plain", event_name="hooks-hold", key="hooks-plain")
    await async_poll_for(lambda: all(k in s.tasks for k in keys + ["hooks-plain"]), timeout=10)
    homes = plugin.where(CHUNKS)
    for k, chunk in zip(keys, CHUNKS):
        ts = s.tasks[k]
        assert ts.annotations["cacheaffinity"] == chunk
        assert loc.chunk_of[k] == chunk and loc.target[k] == homes[chunk]["node"]
        assert k in loc.node_tasks[homes[chunk]["node"]]
        assert ts.worker_restrictions == set(homes[chunk]["workers"]) and ts.loose_restrictions
    assert "hooks-plain" not in loc.chunk_of and not s.tasks["hooks-plain"].worker_restrictions
    before = plugin.counters["on-target"]
    await ev.set()
    ran = await c.gather(futs)
    await plain
    assert plugin.counters["on-target"] - before == len(keys)
    for chunk, addr in zip(CHUNKS, ran):
        assert addr in homes[chunk]["workers"]
        assert loc.holder_of(chunk) == plugin.membership.worker_node[addr]
    del futs, plain
    await async_poll_for(lambda: not any(k in s.tasks for k in keys), timeout=10)
    assert not any(k in loc.chunk_of or k in loc.target for k in keys)
    assert not any(k in tasks for tasks in loc.node_tasks.values() for k in keys)


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 3, config=NO_STEALING)
async def test_submit_and_delayed_carry_chunk_identity(c, s, a, b, w3, tmp_path):
    plugin = await setup_cache_nodes(c, s, tmp_path)
    home = plugin.where(["one-chunk"])["one-chunk"]
    with cacheaffinity.chunk("one-chunk"):
        fut = c.submit(where_am_i, "x", pure=False)
        lazy = dask.delayed(where_am_i)("y", dask_key_name="delayed-one-chunk")
    assert await fut in home["workers"]
    assert s.tasks[fut.key].worker_restrictions == set(home["workers"])
    (addr,) = await c.gather(c.compute([lazy]))
    assert addr in home["workers"]
    assert plugin.locator.chunk_of.get("delayed-one-chunk") == "one-chunk"


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 3, config=NO_STEALING)
async def test_where_answers_from_the_client(c, s, a, b, w3, tmp_path):
    plugin = await setup_cache_nodes(c, s, tmp_path)
    out = await cacheaffinity.where(c, CHUNKS[:4])
    assert out == plugin.where(CHUNKS[:4])
    assert all(set(v["workers"]) <= set(s.workers) for v in out.values())
    info = await cacheaffinity.check(c)
    assert set(info["nodes"]) == set(plugin.membership.node_workers)


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 3, config=NO_STEALING)
async def test_killing_a_node_mid_run_finishes_on_next_nearest(c, s, a, b, w3, tmp_path):
    plugin = await setup_cache_nodes(c, s, tmp_path)
    doomed = node_of(plugin, a.address)
    ranking = {ch: plugin.placement.ranking(ch, 2) for ch in CHUNKS}
    ev = Event("release-kill")
    futs = cacheaffinity.map_chunks(
        c, blocked, CHUNKS, [ev.name] * len(CHUNKS), chunk_ids=CHUNKS, pure=False
    )
    await async_poll_for(lambda: len(a.state.tasks) > 0, timeout=10)
    # The worker's thread is blocked in a task: do not wait for it.
    await a.close(executor_wait=False)
    await async_poll_for(lambda: doomed not in plugin.membership.node_workers, timeout=10)
    await ev.set()
    results = dict(zip(CHUNKS, await asyncio.wait_for(c.gather(futs), 60)))
    assert len(results) == len(CHUNKS)
    for ch, addr in results.items():
        expected = ranking[ch][1] if ranking[ch][0] == doomed else ranking[ch][0]
        assert node_of(plugin, addr) == expected, ch
    assert plugin.counters["failovers"] > 0
    assert any(e.get("action") == "retarget" for _, e in await c.get_events("cacheaffinity"))


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2, config=NO_STEALING)
async def test_new_worker_gets_work_at_once(c, s, a, b, tmp_path):
    plugin = await setup_cache_nodes(c, s, tmp_path)
    ev = Event("release-join")
    futs = cacheaffinity.map_chunks(
        c, blocked, CHUNKS, [ev.name] * len(CHUNKS), chunk_ids=CHUNKS, pure=False
    )
    await async_poll_for(lambda: len(a.state.tasks) + len(b.state.tasks) >= len(CHUNKS), 10)
    async with Worker(s.address, nthreads=1, name="late") as w:
        # the worker plugin reaches the new worker after it registered; the
        # scheduler waits for its node report before it places anything there
        await async_poll_for(lambda: w.address in plugin.membership.worker_node, timeout=10)
        new_node = plugin.membership.worker_node[w.address]
        assert not new_node.startswith(HOST_NODE_PREFIX)
        # tasks that now map to the new node are handed over
        await async_poll_for(lambda: len(w.state.tasks) > 0, timeout=10)
        await ev.set()
        results = dict(zip(CHUNKS, await c.gather(futs)))
        homes_now = dict(zip(CHUNKS, plugin.placement.assign(CHUNKS)))
    moved = {ch for ch, addr in results.items() if addr == w.address}
    expected = {ch for ch, h in homes_now.items() if h == new_node}
    # exactly the chunks whose home is now the new node moved, except those that a
    # and b had already started when it joined (one each: a started task never moves)
    assert moved and moved <= expected
    assert len(expected - moved) <= 2


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2, config=NO_STEALING)
async def test_restart_on_new_port_keeps_placement(c, s, a, b, tmp_path):
    plugin = await setup_cache_nodes(c, s, tmp_path)
    node_a = node_of(plugin, a.address)
    before = plugin.where(CHUNKS)
    await a.close()
    await async_poll_for(lambda: node_a not in plugin.membership.node_workers, timeout=10)
    async with Worker(s.address, nthreads=1, name=a.name) as a2:
        await async_poll_for(lambda: plugin.membership.worker_node.get(a2.address) == node_a, 10)
        assert a2.address != a.address
        after = plugin.where(CHUNKS)
        assert {k: v["node"] for k, v in after.items()} == {
            k: v["node"] for k, v in before.items()
        }
        futs = cacheaffinity.map_chunks(c, where_am_i, CHUNKS, chunk_ids=CHUNKS)
        got = dict(zip(CHUNKS, await c.gather(futs)))
        for ch, addr in got.items():
            assert node_of(plugin, addr) == before[ch]["node"]


@gen_cluster(client=True, nthreads=[])
async def test_tasks_submitted_before_any_worker_wait_for_their_node(c, s, tmp_path):
    await c.register_plugin(CacheAffinityPlugin())
    await c.register_plugin(CacheWorkerPlugin(directory=str(tmp_path / "{name}")))
    futs = cacheaffinity.map_chunks(c, where_am_i, CHUNKS[:10], chunk_ids=CHUNKS[:10])
    plugin = s.plugins["cacheaffinity"]
    await async_poll_for(
        lambda: all(f.key in s.tasks and s.tasks[f.key].state == "no-worker" for f in futs), 10
    )
    async with Worker(s.address, nthreads=1, name="first") as w:
        assert set(await c.gather(futs)) == {w.address}
    assert plugin.counters["placements"] == 10


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_check_raises_without_plugin(c, s, a):
    with pytest.raises(RuntimeError, match="--preload cacheaffinity"):
        await cacheaffinity.check(c)
    with pytest.raises(RuntimeError, match="no cacheaffinity plugin"):
        await cacheaffinity.where(c, ["x"])


@gen_cluster(
    client=True,
    nthreads=[("127.0.0.1", 1)] * 2,
    config={"distributed.scheduler.preload": ["cacheaffinity"], **NO_STEALING},
)
async def test_config_preload_installs_plugin_and_stealing(c, s, a, b):
    from distributed.stealing import WorkStealing

    plugin = s.plugins["cacheaffinity"]
    assert isinstance(plugin, CacheAffinityPlugin)
    # Dask's own stealing extension stays, the chunk-task policy is the plugin's
    ext = s.extensions["stealing"]
    assert isinstance(ext, WorkStealing) and ext.chunk_tasks is plugin.locator.chunk_of
    assert isinstance(plugin.stealing, cacheaffinity.LocalityStealing)
    stealers = [p for p in s.plugins.values() if isinstance(p, WorkStealing)]
    assert stealers == [ext]
    assert s.stream_handlers["steal-response"].__self__ is ext
    info = await cacheaffinity.check(c)
    # workers without a worker plugin fall back to their host: one node here
    assert list(info["nodes"]) == [HOST_NODE_PREFIX + "127.0.0.1"]


def test_holder_records_keep_entry_ranges_processed_elsewhere():
    from cacheaffinity.scheduler._locator import (
        MAX_RANGES, holder_for, record_range, stripe_parts,
    )  # fmt: skip

    r = record_range(None, "X", 0, 2500)
    assert r == "X"  # one node so far: a plain string, as cheap as an unranged holder
    r = record_range(r, "X", 2500, 5000)
    r = record_range(r, "Y", 7500, 10000)  # stolen by Y
    assert r == ("X", 7500, 10000, "Y")
    assert holder_for(r, 0, 2500) == "X" and holder_for(r, 7500, 10000) == "Y"
    assert holder_for(r, 7000, 9000) == "Y"  # 1500 of 2000 entries on Y
    assert holder_for(r, 6500, 8500) == "X"  # a tie: the id's node
    assert holder_for(r) == "X" and holder_for(r, 8000, 8000) == "Y"
    r = record_range(r, "Z", 8000, 9000)  # cut out of Y's range
    assert holder_for(r, 8000, 9000) == "Z" and holder_for(r, 7500, 8000) == "Y"
    r = record_range(r, "Y", 9000, 9500)  # touches Y's [9000, 10000): merged
    assert r == ("X", 7500, 8000, "Y", 8000, 9000, "Z", 9000, 10000, "Y")
    assert record_range(r, "X", 7000, 10000) == "X"  # the id's node took all back
    assert record_range(r, "W") == "W"  # a task without a range: the whole id
    # a node that takes over a stripe range by range becomes its node
    r = "X"
    for i in range(MAX_RANGES + 1):
        r = record_range(r, "Y", 2 * i * 100, (2 * i + 1) * 100)
    assert holder_for(r, 0, 100) == "Y" and len(r) <= 1 + 3 * MAX_RANGES
    # stripe parts: a task crossing a stripe boundary, its own stripe first
    assert stripe_parts("u.t/Events/s1500:1", 900, 1800) == [
        ("u.t/Events/s1500:1", 1500, 1800), ("u.t/Events/s1500:0", 900, 1500)]
    assert stripe_parts("u.t/Events/s1500:1", 1500, 3000) == [("u.t/Events/s1500:1", 1500, 3000)]
    assert stripe_parts("chunk-7", 0, 10**6) == [("chunk-7", 0, 10**6)]
    assert stripe_parts("u/Events/s10:9", 0, 30) == [("u/Events/s10:9", 0, 30)]  # not its stripe


def test_stripe_parts_parse_what_chunk_identity_makes():
    from coffea.processor.executor import WorkItem

    from cacheaffinity.coffea._identity import chunk_identity
    from cacheaffinity.scheduler._locator import stripe_parts

    item = WorkItem("d", "f.root", "Events", 900, 1800, b"\1" * 16)
    cid = chunk_identity(item, {"f.root": None}, 1500)
    parts = stripe_parts(cid, 900, 1800)
    assert parts[0] == (cid, 900, 1500)  # 600 of its 900 entries: stripe 0 places it
    neighbour = WorkItem("d", "f.root", "Events", 1500, 3000, b"\1" * 16)
    assert parts[1] == (chunk_identity(neighbour, {"f.root": None}, 1500), 1500, 1800)


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2, config=NO_STEALING)
async def test_map_chunks_entries_reach_the_locator(c, s, a, b, tmp_path):
    plugin = await setup_cache_nodes(c, s, tmp_path)
    ids = ["u/Events/s100:0", "u/Events/s100:0", "u/Events/s100:1"]
    entries = [(0, 50), (50, 120), None]
    futs = cacheaffinity.map_chunks(c, where_am_i, ids, chunk_ids=ids, entries=entries, pure=False)
    ran = await c.gather(futs)
    loc = plugin.locator
    n0, n1 = node_of(plugin, ran[0]), node_of(plugin, ran[1])
    # [50, 120) was remembered in both stripes it falls in
    assert loc.holder_of(ids[0], 0, 50) == n0 and loc.holder_of(ids[0], 50, 100) == n1
    assert loc.holder_of(ids[2], 100, 120) in (n1, node_of(plugin, ran[2]))
    with pytest.raises(ValueError, match=r"entries\[1\]=\(5, 2\).*start <= stop"):
        cacheaffinity.map_chunks(c, where_am_i, ids, chunk_ids=ids, entries=[None, (5, 2), None])
    with pytest.raises(ValueError, match="2 entries for 3 chunk_ids"):
        cacheaffinity.map_chunks(c, where_am_i, ids, chunk_ids=ids, entries=[None, None])


def test_locator_memory_is_bounded_by_locator_size():
    from cacheaffinity.placement import TorusPlacement
    from cacheaffinity.scheduler._locator import Locator
    from cacheaffinity.scheduler._membership import Membership

    loc = Locator(Membership(), TorusPlacement(), size=10)
    for i in range(100):
        key, chunk = f"t-{i}", f"chunk-{i}"
        loc.track(key, chunk)
        loc.set_target(key, "n1")
        loc.note_steal(key)  # processed away from its target
        assert loc.finished(key, "n2") is False
        loc.forget_task(key)
    assert len(loc.holder) == 10
    assert not loc.chunk_of and not loc.target and not loc.node_tasks and not loc.stolen
    assert not loc.hashed
    # the newest are kept, the oldest forgotten
    assert loc.holder_of("chunk-99") == "n2" and loc.holder_of("chunk-89") is None
    assert loc.where_located("chunk-90") is None  # no cache node: no placement to differ from
    # a bigger map drops its oldest sixteenth at once, never exceeding the bound
    big = Locator(Membership(), TorusPlacement(), size=1600)
    for i in range(5000):
        big.set_located(f"chunk-{i}", "n1")
        assert len(big.holder) <= 1600
    assert len(big.holder) >= 1500 and big.holder_of("chunk-4999") == "n1"
    assert big.holder_of("chunk-0") is None


@pytest.mark.parametrize(
    "key, value",
    [
        pytest.param("locator-size", -1, id="locator-size-negative"),
        pytest.param("recent-placements", 2.5, id="recent-placements-float"),
    ],
)
def test_bounds_are_checked_at_construction(key, value):
    import dask

    with dask.config.set({f"cacheaffinity.scheduler.{key}": value}):
        with pytest.raises(ValueError, match=rf"cacheaffinity\.scheduler\.{key}=\S+ must be"):
            CacheAffinityPlugin()


def test_recent_placements_bound_comes_from_config():
    import dask

    with dask.config.set({"cacheaffinity.scheduler.recent-placements": 7}):
        assert CacheAffinityPlugin().recent_placements.maxlen == 7
    assert CacheAffinityPlugin(locator_size=3).locator.size == 3
