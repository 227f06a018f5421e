"""Re-targeting through the pending index gives exactly what today's full scan gives,
on real schedulers (``distributed.Scheduler`` with the real plugin; workers are
``WorkerState`` rows inserted as ``Scheduler.add_worker`` does, as in
``benchmarks/scheduler_scale.py``), and a gathered, sliced join gives what one piece
gives. Random clusters and chunk lists from fixed seeds."""

from __future__ import annotations

import asyncio
import random

import dask
import pytest
from distributed import Scheduler

from benchmarks.scheduler_scale import add_fake_worker, chunk_ids
from cacheaffinity import CacheAffinityPlugin
from cacheaffinity.protocol import ANNOTATION
from cacheaffinity.scheduler import _pending, _retargeting

SETTINGS = {
    "distributed.scheduler.work-stealing": True,
    "distributed.scheduler.active-memory-manager.start": False,
}


async def _scheduler(nodes: list[int], threads: dict[int, int], **plugin_kw):
    s = Scheduler(host="127.0.0.1", port=0, dashboard=False, dashboard_address="127.0.0.1:0", validate=False)
    await s
    for i in nodes:
        add_fake_worker(s, i, threads[i])
    plugin = CacheAffinityPlugin(**plugin_kw)
    s.add_plugin(plugin)
    await plugin.start(s)
    return s, plugin


async def _settle(plugin) -> None:
    while not plugin.settled:  # the gathered join runs in slices on this loop
        await asyncio.sleep(0)


def _place(s, plugin, keys, chunks, tag):
    for k in keys:
        s.new_task(k, None, "released")
    plugin.update_graph(s, keys=set(), tasks=keys, annotations={ANNOTATION: dict(zip(keys, chunks))},
                        stimulus_id=f"place-{tag}")  # fmt: skip


async def _close(s):
    for a in list(s.stream_comms):
        s.stream_comms.pop(a, None)
    await s.close()


async def _compare(seed: int, sliced: bool) -> None:
    rng = random.Random(seed)
    n0 = rng.randint(2, 8)
    threads = {i: rng.choice([1, 2, 4]) for i in range(200)}
    kw = dict(dimensions=rng.choice([2, 3, 4]), replicas=rng.choice([4, 16, 32]), seed=seed % 5)
    with dask.config.set(SETTINGS):
        a, pa = await _scheduler(list(range(n0)), threads, **kw)
        b, pb = await _scheduler(list(range(n0)), threads, **kw)
        pb.retargeting.full_scan = True
        pb.sliced_from = 10**9
        pa.sliced_from = 0 if sliced else 10**9
        try:
            live = list(range(n0))
            nxt = n0
            chunks = chunk_ids(rng.randint(50, 600))
            keys = [f"t-{i}" for i in range(len(chunks))]
            for s, p in ((a, pa), (b, pb)):
                _place(s, p, keys, chunks, 0)
            for step in range(12):
                op = rng.random()
                before = pa.placement.nearest(chunks)
                if op < 0.5 or len(live) < 2:
                    joining = list(range(nxt, nxt + rng.choice([1, 1, 3])))
                    nxt += len(joining)
                    targets = dict(pa.locator.target)
                    for s, p in ((a, pa), (b, pb)):
                        for i in joining:
                            p.add_worker(s, add_fake_worker(s, i, threads[i]))
                        await _settle(p)
                    live += joining
                    # ~1/n moves: exactly the tasks whose home is now a joined node
                    after = pa.placement.nearest(chunks)
                    new = {f"node-{i:05d}" for i in joining}
                    want = {k for k, x, y in zip(keys, before, after) if x != y and y in new}
                    assert {k for k in keys if pa.locator.target[k] != targets[k]} == want
                elif op < 0.8:
                    gone = rng.choice(live)
                    live.remove(gone)
                    for s, p in ((a, pa), (b, pb)):
                        addr = next(iter(p.membership.node_workers[f"node-{gone:05d}"]))
                        await s.remove_worker(addr, stimulus_id=f"leave-{step}", close=False)
                else:
                    more = [f"more-{step}-{i}" for i in range(rng.randint(1, 80))]
                    extra = [f"x{seed}-{step}/{i}" for i in range(len(more))]
                    for s, p in ((a, pa), (b, pb)):
                        _place(s, p, more, extra, step + 1)
                    keys += more
                    chunks += extra
                await _settle(pa)
                assert pa.locator.target == pb.locator.target, (seed, step)
                # one piece counts a task moved by two joins of a burst twice
                for c in ("placements", "failovers") if sliced else ("placements", "retargets", "failovers"):
                    assert pa.counters[c] == pb.counters[c], (seed, step, c)
                for k in keys:
                    ra, rb = a.tasks[k].worker_restrictions, b.tasks[k].worker_restrictions
                    assert ra == rb
                assert pa.pending.check() == []
        finally:
            await _close(a)
            await _close(b)


@pytest.mark.parametrize("seed", range(8))
def test_indexed_retargeting_equals_the_full_scan(seed):
    asyncio.run(_compare(seed, sliced=False))


@pytest.mark.parametrize("seed", range(4))
def test_gathered_sliced_joins_equal_one_piece(seed, monkeypatch):
    monkeypatch.setattr(_pending, "SLICE", 3)
    monkeypatch.setattr(_retargeting, "SLICE", 7)
    asyncio.run(_compare(100 + seed, sliced=True))
