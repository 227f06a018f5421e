"""benchmarks/scheduler_scale.py's core at a small size: a real Scheduler with the real
plugin, fake WorkerStates, chunk tasks placed, one node leaving and one joining."""

from __future__ import annotations

import asyncio

from benchmarks import scheduler_scale


def test_measure_places_and_retargets_on_a_real_scheduler():
    r = asyncio.run(scheduler_scale.measure(20, 1000, threads=2, memory=False))
    assert r["nodes"] == 20 and r["tasks"] == 1000
    assert r["place_s"] > 0 and r["retarget_leave_s"] > 0 and r["retarget_join_s"] > 0
    # a node of 20 holds ~1/20 of the tasks; the joining node takes about as many
    assert 0 < r["retarget_leave_tasks_of_node"] < 1000 / 4
    assert 0 < r["retarget_join_moved"] < 1000 / 4


def test_measure_memory_pass_traces_allocations():
    r = asyncio.run(scheduler_scale.measure(20, 1000, threads=2, memory=True))
    assert r["place_tracemalloc_peak_bytes"] > 1000 * 50  # dict entries per task at least
    assert "retarget_leave_s" not in r  # the memory pass only places


def test_bursts_with_and_without_the_plugin():
    r = asyncio.run(scheduler_scale.measure(20, 2000, threads=2, burst=5))
    assert len(r["join_one_cpu_s"]) == 5 and len(r["leave_cpu_s"]) == 5
    assert r["join_burst_cpu_s"] > 0 and r["join_one_max_block_s"] >= 0
    assert r["rss_per_task_bytes"] is not None
    stock = asyncio.run(scheduler_scale.measure_stock(20, 2000, threads=2, burst=5))
    assert len(stock["join_one_cpu_s"]) == 5
    s = scheduler_scale.summarise(r, stock)
    assert s["join_one_median_cpu_s"] > 0 and "stock_leave_median_cpu_s" in s
