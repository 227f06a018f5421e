"""Locality-preserving stealing of chunk tasks, driven deterministically.

The policy's periodic callback is stopped and :meth:`LocalityStealing.balance`
is called by the tests themselves; tasks block on ``distributed.Event``s.
Dask's own stealing of plain tasks: tests/test_dask_faithful.py.
"""

from __future__ import annotations

from time import monotonic, sleep

import pytest
from distributed import Event, get_worker
from distributed.utils_test import async_poll_for, gen_cluster

import cacheaffinity
from cacheaffinity import CacheAffinityPlugin, CacheWorkerPlugin, LocalityStealing
from cacheaffinity.protocol import HOST_NODE_PREFIX
from cacheaffinity.scheduler._distributed import ChunkAwareWorkStealing

CHUNKS = [f"uuid-{f:02d}/Events/{i * 1000}-{(i + 1) * 1000}" for f in range(8) for i in range(16)]


def sleepy(_chunk):
    """A chunk task long enough (0.1 s) for the node's speed to be learned."""
    sleep(0.1)
    return get_worker().address


def blocked(_chunk, event_name):
    Event(event_name).wait(timeout=60)
    return get_worker().address


def slow_on(_chunk, event_name, slow_worker):
    """Blocked until the event; then 1 s on ``slow_worker`` (a thief whose
    columns come over a slow link), at once elsewhere."""
    Event(event_name).wait(timeout=60)
    if get_worker().address == slow_worker:
        sleep(1.0)
    return get_worker().address


async def setup(c, s, tmp_path, **stealing_kwargs):
    await c.register_plugin(CacheAffinityPlugin())
    await c.register_plugin(CacheWorkerPlugin(directory=str(tmp_path / "{name}")))
    plugin = s.plugins["cacheaffinity"]
    await async_poll_for(
        lambda: len(plugin.membership.node_workers) == len(s.workers)
        and not any(n.startswith(HOST_NODE_PREFIX) for n in plugin.membership.node_workers),
        timeout=10,
    )
    ext = plugin.stealing
    assert isinstance(ext, LocalityStealing)
    # Dask's extension stays, unless Dask's stealing is off
    assert isinstance(s.extensions.get("stealing"), ChunkAwareWorkStealing) == ext.dask_stealing
    ext.stop()  # the tests call balance() themselves
    for k, v in stealing_kwargs.items():
        setattr(ext, k, v)
    return plugin, ext


async def first_run(c, worker, chunks, event_name):
    """Run ``chunks`` (all of ``worker``'s node) once, unblocked; wait until it is idle."""
    await Event(event_name).set()
    n = len(chunks)
    futs = cacheaffinity.map_chunks(c, blocked, chunks, [event_name] * n, chunk_ids=chunks, pure=False)
    assert set(await c.gather(futs)) == {worker.address}
    del futs
    await async_poll_for(lambda: not worker.state.tasks, timeout=10)


async def fill_node(c, plugin, worker, n, event):
    """Submit n chunk tasks that all belong to ``worker``'s node; wait until queued."""
    node = plugin.membership.worker_node[worker.address]
    mine = [ch for ch, h in plugin.where(CHUNKS).items() if h["node"] == node][:n]
    assert len(mine) == n
    futs = cacheaffinity.map_chunks(c, blocked, mine, [event.name] * n, chunk_ids=mine, pure=False)
    await async_poll_for(lambda: len(worker.state.tasks) == n, timeout=10)
    return mine, futs


def make_idle_long_ago(ext, s, seconds):
    for addr in s.idle:
        ext.idle_since[addr] = monotonic() - seconds


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2)
async def test_backlog_at_or_below_threshold_is_never_stolen(c, s, a, b, tmp_path):
    plugin, ext = await setup(c, s, tmp_path, idle_time=0.0, backlog=3)
    ev = Event("hold-a")
    # 1 running + 3 queued on a single-thread worker: backlog 3, not above 3
    _, futs = await fill_node(c, plugin, a, 4, ev)
    make_idle_long_ago(ext, s, 10)
    for _ in range(5):
        ext.balance()
    assert ext.steals == 0 and not ext.in_flight
    await ev.set()
    assert set(await c.gather(futs)) == {a.address}


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2)
async def test_idle_thief_gets_work_only_after_idle_time(c, s, a, b, tmp_path):
    plugin, ext = await setup(c, s, tmp_path, idle_time=30.0, backlog=1)
    ev = Event("hold-a2")
    mine, futs = await fill_node(c, plugin, a, 6, ev)
    ext.balance()  # b idle for less than idle_time: nothing moves
    assert ext.steals == 0
    make_idle_long_ago(ext, s, 31)
    ext.balance()
    # a one-thread thief takes one task to run and one to queue, no more
    assert ext.steals == 2 and len(ext.in_flight) == 2
    ext.balance()
    assert ext.steals == 2
    await async_poll_for(lambda: len(b.state.tasks) == 2, timeout=10)
    await ev.set()
    results = await c.gather(futs)
    assert results.count(b.address) == 2 and results.count(a.address) == 4
    assert plugin.counters["steals"] == 2
    # the stolen chunks are remembered where they were processed
    stolen = [ch for ch, addr in zip(mine, results) if addr == b.address]
    assert {plugin.locator.where_located(ch)[0] for ch in stolen} == {
        plugin.membership.worker_node[b.address]
    }


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2)
async def test_thief_takes_the_chunk_its_node_holds(c, s, a, b, tmp_path):
    plugin, ext = await setup(c, s, tmp_path, idle_time=0.0, backlog=0)
    ev = Event("hold-a3")
    mine, futs = await fill_node(c, plugin, a, 8, ev)
    b_node = plugin.membership.worker_node[b.address]
    cached = mine[5]  # neither the first nor the last in a's queue
    plugin.locator.set_located(cached, b_node)
    make_idle_long_ago(ext, s, 10)
    ext.max_moves = 1  # one move: it must be the cached chunk
    ext.balance()
    (ts,) = list(ext.in_flight)
    assert plugin.locator.chunk_of[ts.key] == cached
    await ev.set()
    results = dict(zip(mine, await c.gather(futs)))
    assert results[cached] == b.address


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2)
async def test_chunks_the_victims_node_holds_stay_unless_its_queue_is_long(
    c, s, a, b, tmp_path
):
    plugin, ext = await setup(c, s, tmp_path, idle_time=0.0, backlog=1, warm_backlog=8)
    a_node = plugin.membership.worker_node[a.address]
    mine = [ch for ch, h in plugin.where(CHUNKS).items() if h["node"] == a_node][:7]
    await first_run(c, a, mine, "warm-run-1")
    assert all(plugin.locator.holder_of(ch) == a_node for ch in mine)
    cold = mine[3]
    plugin.locator.forget_holder(cold)  # as if a's cache had never seen it
    # run 2: 1 running + 6 queued on a; b idle
    run2 = Event("warm-run-2")
    futs = cacheaffinity.map_chunks(c, blocked, mine, [run2.name] * 7, chunk_ids=mine, pure=False)
    await async_poll_for(lambda: len(s.workers[a.address].processing) == 7, timeout=10)
    await async_poll_for(lambda: len(a.state.tasks) == 7, timeout=10)
    make_idle_long_ago(ext, s, 10)
    ext.balance()
    # b wants 2 tasks, but only the chunk a does not hold may go: 5 queued <= 8 per thread
    (ts,) = list(ext.in_flight)
    assert plugin.locator.chunk_of[ts.key] == cold and ext.steals == 1
    ext.balance()
    assert ext.steals == 1
    ext.warm_backlog = 2  # a long queue: now a chunk a holds may go too
    ext.balance()
    assert ext.steals == 2
    await run2.set()
    results = dict(zip(mine, await c.gather(futs)))
    assert results[cold] == b.address
    assert list(results.values()).count(b.address) == 2


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2)
async def test_a_thief_learns_what_a_warm_chunk_costs_it_and_stops_taking_them(
    c, s, a, b, tmp_path
):
    plugin, ext = await setup(c, s, tmp_path, idle_time=0.0, backlog=1, warm_backlog=2)
    where = plugin.where(CHUNKS)
    a_node = plugin.membership.worker_node[a.address]
    b_node = plugin.membership.worker_node[b.address]
    # b's typical task: 0.1 s
    theirs = [ch for ch, h in where.items() if h["node"] == b_node][:4]
    assert set(await c.gather(cacheaffinity.map_chunks(c, sleepy, theirs, chunk_ids=theirs))) == {
        b.address
    }
    typical = plugin.locator.speed.smoothed[b_node]
    assert 0.1 <= typical < 0.3
    # run 1: a holds its 9 chunks
    mine = [ch for ch, h in where.items() if h["node"] == a_node][:9]
    await first_run(c, a, mine, "learn-run-1")
    # run 2: 1 running + 8 queued on a (> warm-backlog 2 per thread): b takes two
    # chunks a holds, and each takes it 1 s (10x its typical task)
    run2 = Event("learn-run-2")
    futs = cacheaffinity.map_chunks(
        c, slow_on, mine, [run2.name] * 9, [b.address] * 9, chunk_ids=mine, pure=False
    )
    await async_poll_for(lambda: len(a.state.tasks) == 9, timeout=10)
    make_idle_long_ago(ext, s, 10)
    assert ext.warm_cost.cost(b_node, monotonic()) == 2  # the prior: nothing learned yet
    ext.balance()
    assert ext.steals == 2 and len(ext.warm_stolen) == 2
    await run2.set()
    results = dict(zip(mine, await c.gather(futs)))
    stolen = [ch for ch, w in results.items() if w == b.address]
    assert len(stolen) == 2
    del futs
    await async_poll_for(lambda: not a.state.tasks and not b.state.tasks, timeout=10)
    assert ext.warm_cost.observed == 2 and not ext.warm_stolen
    learned = ext.warm_cost.cost(b_node, monotonic())
    assert 1.0 / 0.3 < learned < 1.5 / typical  # ~10 of b's tasks, not the prior 2
    info = plugin.info()["stealing"]
    assert set(info["warm-steal-cost"]) == {b_node} and info["warm-steal-cost"][b_node] > 3
    assert info["warm-backlog"] == 2
    from cacheaffinity.scheduler._dashboard import TorusView
    from cacheaffinity.scheduler._metrics import CacheAffinityMetricCollector

    (gauge,) = [f for f in CacheAffinityMetricCollector(s).collect() if f.name.endswith("warm_steal_cost")]
    assert [(x.labels, x.value) for x in gauge.samples] == [
        ({"node": b_node}, info["warm-steal-cost"][b_node])
    ]

    assert f"costs its thief up to {info['warm-steal-cost'][b_node]:.0f} of its tasks" in (
        TorusView(s).header.text
    )
    # the stolen chunks' seconds are b's link, not b's speed
    assert plugin.locator.speed.smoothed[b_node] == typical
    # a node that has stolen nothing uses the median of those that have
    assert ext.warm_cost.cost(a_node, monotonic()) == pytest.approx(learned, rel=1e-3)
    # run 3, a's 7 chunks: 1 running + 6 queued (> the prior 2, < the learned ~10): b takes none
    rest = [ch for ch in mine if ch not in stolen]
    run3 = Event("learn-run-3")
    futs = cacheaffinity.map_chunks(c, blocked, rest, [run3.name] * 7, chunk_ids=rest, pure=False)
    await async_poll_for(lambda: len(a.state.tasks) == 7, timeout=10)
    make_idle_long_ago(ext, s, 10)
    ext.balance()
    assert ext.steals == 2
    ext.warm_cost.learned.clear()  # control: with the prior alone, one goes
    ext.balance()
    assert ext.steals > 2
    await run3.set()
    await c.gather(futs)


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2)
async def test_a_located_chunk_goes_to_its_holder_next_run(c, s, a, b, tmp_path):
    plugin, ext = await setup(c, s, tmp_path)
    a_node, b_node = plugin.membership.worker_node[a.address], plugin.membership.worker_node[b.address]
    chunk = next(ch for ch, h in plugin.where(CHUNKS).items() if h["node"] == a_node)
    plugin.locator.set_located(chunk, b_node)  # stolen by b last run
    fut = cacheaffinity.map_chunks(c, blocked, [chunk], ["unused"], chunk_ids=[chunk], pure=False)
    await Event("unused").set()
    assert await c.gather(fut) == [b.address]
    assert plugin.counters["located"] == 1


@pytest.mark.parametrize(
    "config",
    [
        pytest.param({"cacheaffinity.scheduler.stealing.enabled": False}, id="cacheaffinity-off"),
        pytest.param({"distributed.scheduler.work-stealing": False}, id="dask-off"),
    ],
)
def test_stealing_disabled_in_config_moves_nothing(config, tmp_path):
    @gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2, config=config)
    async def run(c, s, a, b):
        plugin, ext = await setup(c, s, tmp_path, idle_time=0.0, backlog=0)
        assert not ext.enabled
        if "work-stealing" in str(config):  # Dask's switch: no stealing of any kind
            assert "stealing" not in s.extensions
            assert "cacheaffinity-stealing" not in s.periodic_callbacks
        ev = Event("hold-off")
        _, futs = await fill_node(c, plugin, a, 6, ev)
        make_idle_long_ago(ext, s, 10)
        ext.balance()
        assert ext.steals == 0 and not ext.in_flight
        await ev.set()
        assert set(await c.gather(futs)) == {a.address}

    run()


@gen_cluster(
    client=True,
    nthreads=[("127.0.0.1", 1)] * 2,
    scheduler_kwargs={"dashboard": True, "dashboard_address": "127.0.0.1:0"},
)
async def test_stock_stealing_metrics_and_page_still_answer(c, s, a, b, tmp_path):
    from tornado.httpclient import AsyncHTTPClient

    plugin, ext = await setup(c, s, tmp_path, idle_time=0.0, backlog=0)
    ev = Event("hold-metrics")
    _, futs = await fill_node(c, plugin, a, 6, ev)
    make_idle_long_ago(ext, s, 10)
    ext.balance()
    port = s.http_server.port
    http = AsyncHTTPClient()
    metrics = (await http.fetch(f"http://127.0.0.1:{port}/metrics")).body.decode()
    line = [ln for ln in metrics.splitlines() if ln.startswith("dask_stealing_request_count_total")]
    assert line and sum(float(ln.split()[-1]) for ln in line) == ext.steals == 2
    page = await http.fetch(f"http://127.0.0.1:{port}/stealing")
    assert page.code == 200 and b"bokeh" in page.body.lower()
    await ev.set()
    await c.gather(futs)


@gen_cluster(
    client=True,
    nthreads=[("127.0.0.1", 1)] * 2,
    config={
        "cacheaffinity.scheduler.locator-slack": 1.0,
        "cacheaffinity.scheduler.stealing.enabled": False,  # placement only
    },
)
async def test_held_chunks_follow_their_holder_up_to_the_slack_bound(c, s, a, b, tmp_path):
    plugin, ext = await setup(c, s, tmp_path)
    assert plugin.locator.slack == 1.0
    a_node, b_node = plugin.membership.worker_node[a.address], plugin.membership.worker_node[b.address]
    # run 1: chunk tasks on a's node; the node's speed is learned from their startstops
    first = [ch for ch, h in plugin.where(CHUNKS).items() if h["node"] == a_node][:8]
    futs = cacheaffinity.map_chunks(c, sleepy, first[:2], chunk_ids=first[:2], pure=False)
    assert await c.gather(futs) == [a.address] * 2
    assert set(plugin.info()["node-speed"]) == {a_node}
    del futs
    # b processed 6 more of a's chunks last time: b's bound is 1.0 x 6 x 1/2 + 1 = 4
    for ch in first[2:]:
        plugin.locator.set_located(ch, b_node)
    await Event("go").set()
    futs = cacheaffinity.map_chunks(c, blocked, first[2:], ["go"] * 6, chunk_ids=first[2:], pure=False)
    where = await c.gather(futs)
    # 4 follow their holder, the rest stay with the placement's node
    assert where.count(b.address) == 4 and where.count(a.address) == 2, where
    assert plugin.counters["located"] == 4


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2)
async def test_choices_within_a_round_equal_fresh_choices(c, s, a, b, tmp_path):
    """Within a round the policy reuses the victim's stealable tasks (minus its own
    steal requests): every choice equals the one made from scratch."""
    plugin, ext = await setup(c, s, tmp_path, idle_time=0.0, backlog=0)
    ev = Event("hold-round")
    mine, futs = await fill_node(c, plugin, a, 10, ev)
    plugin.locator.set_located(mine[6], plugin.membership.worker_node[b.address])  # one held by b
    victim, thief = s.workers[a.address], s.workers[b.address]
    ext._round.clear()
    taken = []
    for _ in range(4):
        cached = ext._choose(victim, thief)
        kept = dict(ext._round)
        ext._round.clear()
        fresh = ext._choose(victim, thief)
        ext._round.clear()
        ext._round.update(kept)
        assert cached is fresh and cached is not None
        assert ext.move(cached, thief, reason="steal")
        taken.append(plugin.locator.chunk_of[cached.key])
    ext._round.clear()
    assert taken[0] == mine[6] and len(set(taken)) == 4  # held first, never twice
    await ev.set()
    await c.gather(futs)


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2)
async def test_a_round_that_looked_at_enough_leaves_its_moves_to_the_next(c, s, a, b, tmp_path, monkeypatch):
    """A round stops choosing once it looked at ``ROUND_SCAN`` queued tasks; the next
    round makes the moves it left, and the thief ends with what one round gives it."""
    from cacheaffinity.scheduler import _stealing

    monkeypatch.setattr(_stealing, "ROUND_SCAN", 1)  # every choice looks at more
    plugin, ext = await setup(c, s, tmp_path, idle_time=0.0, backlog=1)
    ev = Event("hold-scan")
    mine, futs = await fill_node(c, plugin, a, 6, ev)
    make_idle_long_ago(ext, s, 10)
    ext.balance()
    assert ext.steals == 1  # one choice, then the round ends
    ext.balance()
    assert ext.steals == 2 and len(ext.in_flight) == 2  # as one unbounded round: run one, queue one
    ext.balance()
    assert ext.steals == 2
    await ev.set()
    results = await c.gather(futs)
    assert results.count(b.address) == 2 and results.count(a.address) == 4


def test_warm_steal_cost_learns_fades_and_never_goes_below_the_prior():
    from cacheaffinity.scheduler._stealing import WarmStealCost

    cost = WarmStealCost(2.0, alpha=0.5, half_life=100.0)
    assert cost.cost("n1", 0.0) == 2.0 and cost.cost(None, 0.0) == 2.0
    assert cost.observe("n1", 3.0, None, 0.0) is None  # no typical task: nothing learned
    assert cost.observe("n1", 3.0, 0.1, 0.0) == pytest.approx(30.0)
    assert cost.cost("n1", 0.0) == pytest.approx(30.0)
    # the next observation weighs alpha; the excess over the prior halves per half-life
    cost.observe("n1", 1.0, 0.1, 0.0)
    assert cost.cost("n1", 0.0) == pytest.approx(20.0)
    assert cost.cost("n1", 100.0) == pytest.approx(2.0 + 18.0 / 2)
    assert cost.cost("n1", 1e6) == pytest.approx(2.0)
    # a fast steal never lowers the cost below the prior
    cost.observe("n2", 0.1, 0.1, 0.0)
    assert cost.cost("n2", 0.0) == 2.0
    # a node without observations: the median of those with
    cost.observe("n3", 5.0, 0.1, 0.0)
    assert cost.cost("n4", 0.0) == pytest.approx(20.0)  # median of 1 (n2), 20, 50
    assert cost.to_dict(0.0) == {"n1": 20.0, "n2": 2.0, "n3": 50.0}
    with pytest.raises(ValueError, match="prior"):
        WarmStealCost(-1)
    with pytest.raises(ValueError, match="half_life"):
        WarmStealCost(2, half_life=0)
