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
