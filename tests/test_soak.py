"""The soak of benchmarks/soak.py at CI size: ~30 runs on one long-lived cluster,
and nothing grows.

``test_soak_nothing_grows`` (marker ``soak``, excluded from the default tier: ``pytest -m
soak``, a few minutes) runs the soak's own code (:func:`benchmarks.soak.run_soak`) with
every ingredient of the full one, at a small size: three analyses over two generated
datasets, two users with their own clients (now and then at once), a chunksize change, a
worker killed in the middle of a run (twice), the cluster scaled down and up, new-process
clients, node caches small enough to evict.  It asserts the bounds of
:func:`benchmarks._soak_analysis.check_bounds`: no wrong, hung or failed run, no descriptor or
thread gained by a worker process after its warm-up (nor by the scheduler), no cache over
its capacity, no scheduler plugin structure still growing at the end.  Timings are not
asserted (the machine may be loaded).

The other tests (default tier, seconds) check the soak's schedule and arithmetic on
made-up samples: that a growing series is found and a restart is not read as growth.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import _soak_analysis, _soak_measure, _soak_workload, soak  # noqa: E402

#: The CI size: ~30 runs, every event at least once (two kills), eviction.
CI = dict(
    runs=30, workers=4, seed=36,
    datasets={"dy": [2000, 2, 101], "tt": [1200, 1, 202]}, basket_events=250,
    chunksize=250, chunksize_after=150, chunksize_change_at=15, capacity="3 MiB",
    kill_every=12, scale_every=17, scaled_down_runs=3, new_process_every=7,
    concurrent_share=0.2, timeout=240.0, warmup=10, restart_warmup=6, progress=False,
)  # fmt: skip


def test_schedule_is_deterministic_and_has_every_ingredient():
    cfg = soak.Config(**CI)
    steps = _soak_workload.make_schedule(cfg)
    assert steps == _soak_workload.make_schedule(soak.Config(**CI))  # seeded
    assert steps != _soak_workload.make_schedule(soak.Config(**{**CI, "seed": 37}))
    runs = [r for s in steps for r in s.runs]
    assert [r.run for r in runs] == list(range(1, cfg.runs + 1))
    # the tour: every (analysis, dataset) pair in the first runs, every dataset after the change
    assert {(r.analysis, r.dataset) for r in runs[:6]} == {(a, d) for a in _soak_workload.ANALYSES for d in cfg.datasets}
    assert {r.dataset for r in runs[14:16]} == set(cfg.datasets)
    assert {r.chunksize for r in runs[:14]} == {250} and {r.chunksize for r in runs[14:]} == {150}
    assert {r.user for r in runs} == set(_soak_workload.USERS)
    assert any(len(s.runs) == 2 for s in steps)  # both users at once
    assert [r.run for r in runs if r.process == "new"] == [7, 14, 21, 28]
    assert [s.runs[0].run for s in steps if s.kill] == [12, 24]
    events = [(s.runs[0].run, e) for s in steps for e in s.events]
    assert events == [(15, "chunksize"), (17, "scale-down"), (20, "scale-up")]


def test_restarts_are_not_growth_and_growth_is_found():
    # slot 0 leaks 2 MB and 1 fd per run; slot 1 is flat but restarts at run 10 (its new
    # process starts low and climbs for a few runs: its warm-up)
    samples = []
    for run in range(0, 31):
        w1 = {"pid": 1 if run < 10 else 2, "rss_mb": 300.0 if run < 10 else 200.0 + min(run - 10, 4) * 25,
              "fds": 30 if run < 10 else 20 + min(run - 10, 4) * 2.5, "threads": 10}  # fmt: skip
        samples.append({"run": run, "step": run, "workers": {
            "0": {"pid": 9, "rss_mb": 300.0 + 2 * run, "fds": 30 + run, "threads": 10}, "1": w1}})  # fmt: skip
    rss = _soak_analysis.worker_segments(samples, lambda w: w["rss_mb"], warmup=5, restart_warmup=4)
    assert [len(s) for s in rss["1"]] == [4, 17]  # runs 6-9, then 14-30 (the new process after its warm-up)
    assert _soak_analysis.pooled_slope(rss["0"]) == pytest.approx(2.0)
    assert _soak_analysis.pooled_slope(rss["1"]) == pytest.approx(0.0)
    fds = _soak_analysis.worker_segments(samples, lambda w: w["fds"], warmup=5, restart_warmup=4)
    assert _soak_analysis._growth_of_segments(fds["0"]) == 30 - 6
    assert _soak_analysis._growth_of_segments(fds["1"]) == 0
    # a scaled-down slot comes back as a new process: a new segment
    gone = [{"run": r, "step": r, "workers": {} if 12 <= r < 15 else {"0": {"pid": 5, "rss_mb": 1.0}}}
            for r in range(20)]  # fmt: skip
    segs = _soak_analysis.worker_segments(gone, lambda w: w["rss_mb"], warmup=0, restart_warmup=0)
    assert [len(s) for s in segs["0"]] == [11, 5]


def test_check_bounds_finds_what_grows():
    cfg = soak.Config(**CI)
    samples = [{"run": r, "step": r, "plugin": {
        "plugin.runs.runs": min(r, 20), "plugin.leaky": 3 * r, "plugin.stealing.idle_since": 4,
        "plugin.locator.holder": 40 + r, "plugin.recent_placements": 10 * r, "plugin.recent_placements.maxlen": 250,
        "plugin.counters": 3 + r // 10, "plugin.per_node": 2 if r < 28 else 3,
        # runs kept at most 20, a record per node each (fewer nodes in some runs)
        "plugin.per_run": min(r, 20), "plugin.per_run[*]": 3 * min(r, 20) + (r >= 28),
        # ten entries whose lists grow every run
        "plugin.bag": 10, "plugin.bag[*]": 10 * r}} for r in range(0, 31)]  # fmt: skip
    got = _soak_analysis.structure_growth(samples, "plugin", warmup=10)
    assert got["plugin.leaky"]["growth"] == 3 * (30 - 11) and got["plugin.leaky"]["per_100_runs"] == pytest.approx(300)
    assert got["plugin.runs.runs"]["late_growth"] == 0 and got["plugin.recent_placements"]["cap"] == 250
    figures = {"plugin_state_growth_by_structure": got, "wrong_results": 0, "hung_runs": 0, "failed_runs": 0,
               "cache_over_capacity": 2, "fd_net_late_growth": 0, "thread_net_late_growth": 1, "scheduler_fd_net_late_growth": -3}  # fmt: skip
    bad = _soak_analysis.check_bounds(figures, cfg, chunk_ids=60, types={"plugin.counters": "Counter"})
    assert sorted(b.split(":")[0].split(" =")[0] for b in bad) == [
        "cache_over_capacity", "plugin.bag[*]", "plugin.leaky", "plugin.locator.holder", "plugin.recent_placements",
        "thread_net_late_growth"]
    assert not _soak_analysis.check_bounds({"plugin_state_growth_by_structure": {}}, cfg)


@pytest.mark.soak
@pytest.mark.timeout(1500)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the schema warnings of the references
def test_soak_nothing_grows(tmp_path):
    cfg = soak.Config(**CI, data=str(tmp_path / "data"))
    lines: list[str] = []
    doc = soak.run_soak(cfg, log=lines.append)
    fig = _soak_analysis.analyse(doc, cfg)
    bad = _soak_analysis.check_bounds(fig, cfg, doc["chunk_ids"], doc["plugin_types"])
    runs = doc["runs"]
    detail = "\n".join(lines + [f"{r['run']} {r['analysis']}/{r['dataset']}: {r['error']}" for r in runs if r["error"]])
    # the soak did what it says
    assert len(runs) == cfg.runs, detail
    kills = [e for e in doc["events"] if e["event"] == "kill"]
    assert len(kills) == 2 and any(k["during_run"] for k in kills), kills
    assert {e["event"] for e in doc["events"]} == {"kill", "chunksize", "scale-down", "scale-up"}
    assert sum(r["process"] == "new" for r in runs) == 4 and sum(r["concurrent"] for r in runs) >= 2
    # the caches evicted (smaller than the data) and still served most of the later runs
    assert max(c["data_bytes"] for s in doc["samples"] for c in s["caches"].values()) > 0.6 * doc["capacity_bytes"]
    assert fig["hit_rate"] is not None and fig["hit_rate"] > 0.3, fig["phases"]
    # and nothing grew
    assert fig["wrong_results"] == 0 and fig["hung_runs"] == 0 and fig["failed_runs"] == 0, detail
    assert not bad, "\n".join(bad + fig["fd_net_late_kinds"])


def test_the_json_keeps_the_samples_as_columns():
    samples = [
        {"run": 0, "step": 0, "scheduler_rss_mb": 1.0, "plugin": {"plugin.a": 1}, "scheduler_threads_by_name": {"x": 1},
         "workers": {"0": {"pid": 5, "rss_mb": 2.0, "plugin": {"w.b": 3}, "threads_by_name": {"y": 2}},
                     "1": {"pid": 6, "rss_mb": 3.0, "plugin": {}}}, "caches": {"0": {"index_bytes": 7}}},
        {"run": 1, "step": 1, "scheduler_rss_mb": 1.5, "plugin": {"plugin.a": 2}, "scheduler_threads_by_name": {"x": 2},
         "workers": {"0": {"pid": 5, "rss_mb": 2.5, "plugin": {"w.b": 4}, "threads_by_name": {"y": 3}}},
         "caches": {"0": {"index_bytes": 8}}},
    ]  # fmt: skip
    c = _soak_analysis.columnar(samples)
    assert c["run"] == [0, 1] and c["scheduler_rss_mb"] == [1.0, 1.5] and c["plugin"] == {"plugin.a": [1, 2]}
    assert c["workers"]["0"]["rss_mb"] == [2.0, 2.5] and c["workers"]["0"]["plugin"] == {"w.b": [3, 4]}
    assert c["workers"]["1"]["rss_mb"] == [3.0, None]  # scaled away in the second sample
    assert c["caches"]["0"]["index_bytes"] == [7, 8]
    assert c["last"]["scheduler_threads_by_name"] == {"x": 2} and c["last"]["threads_by_name"]["0"] == {"y": 3}


def test_a_late_descriptor_growth_is_named_by_kind():
    def sample(run, fds, kinds):
        return {"run": run, "workers": {"0": {"pid": 5, "fds_net": fds, "fd_kinds": kinds},
                                        "1": {"pid": 6, "fds_net": 9, "fd_kinds": {"socket": 9}}}}  # fmt: skip

    samples = [sample(r, 10, {"socket": 8, "pipe": 2}) for r in range(1, 10)]
    samples.append(sample(10, 11, {"socket": 8, "pipe": 2, "/cache/packs/#.pack": 1}))
    assert _soak_analysis.late_fd_kinds(samples, warmup=0, restart_warmup=0) == [
        "worker 0: run 7 -> 10: /cache/packs/#.pack +1"
    ]
    assert _soak_analysis.late_fd_kinds(samples[:-1], warmup=0, restart_warmup=0) == []
    fd = os.open(__file__, os.O_RDONLY)
    try:
        assert _soak_measure._fd_kind("/proc/self/fd", str(fd)) == re.sub(r"[0-9]+", "#", os.path.realpath(__file__))
    finally:
        os.close(fd)
    r, w = os.pipe()
    try:
        assert _soak_measure._fd_kind("/proc/self/fd", str(r)) == "pipe"
    finally:
        os.close(r)
        os.close(w)


def test_the_schedulers_late_descriptor_is_named_with_the_terms_of_its_net_figure():
    def sample(run, fds, net, kinds, by_workers):
        return {"run": run, "scheduler_fds": fds, "scheduler_fds_net": net, "scheduler_fd_kinds": kinds,
                "scheduler_pooled_comms": 4, "scheduler_harness_comms": 8, "scheduler_pooled_by_workers": by_workers}  # fmt: skip

    flat = [sample(r, 30, 17, {"socket": 26, "pipe": 4}, 1) for r in range(1, 10)]
    assert _soak_analysis.late_scheduler_fd_kinds(flat) == []
    grown = [*flat, sample(10, 31, 18, {"socket": 27, "pipe": 4}, 1)]
    assert _soak_analysis.late_scheduler_fd_kinds(grown) == [
        "scheduler: run 7 -> 10: socket +1 (fds 30 -> 31; pooled_comms 4 -> 4; harness_comms 8 -> 8; "
        "pooled_by_workers 1 -> 1)"
    ]


def test_connections_pooled_by_others_are_counted_at_the_accepting_end():
    # the scheduler's end of a connection a worker keeps in its pool: its remote address is
    # the worker's local end (what the probe reports as ``pooled_local``)
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    try:
        host, port = client.getsockname()
        assert _soak_measure._connections_to(os.getpid(), {f"tcp://{host}:{port}"}) == 1
        # (port 1: no connection of this process has it at the other end, whatever ports
        # the kernel chose above)
        assert _soak_measure._connections_to(os.getpid(), {f"tcp://{host}:1"}) == 0
    finally:
        for s in (accepted, client, server):
            s.close()


@pytest.mark.soak
@pytest.mark.timeout(1500)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_long_lived_soak_of_node_shaped_workers(tmp_path):
    """The long-lived configuration at CI size: 2 nodes x 2 worker processes sharing each
    node's directory, never killed nor scaled, sampled every 3rd step: the index is
    measured per node (database and WAL apart, bytes per entry), the form store within its
    bound, and nothing is wrong."""
    from cacheaffinity.worker._forms import MAX_BYTES, MAX_DOCUMENTS

    cfg = soak.Config(**{**CI, "runs": 24, "warmup": 8, "workers": 2, "per_node": 2, "kill_every": 0,
                         "scale_every": 0, "new_process_every": 0, "sample_every": 3},
                      data=str(tmp_path / "data"))  # fmt: skip
    doc = soak.run_soak(cfg)
    fig = _soak_analysis.analyse(doc, cfg)
    runs, samples = doc["runs"], doc["samples"]
    assert len(runs) == cfg.runs
    assert {e["event"] for e in doc["events"]} <= {"chunksize"}  # no kill, no scaling
    detail = [(r["run"], r["step"], r["hung"], r["error"]) for r in runs if r["error"] or r["hung"]]
    assert fig["wrong_results"] == 0 and fig["hung_runs"] == 0 and fig["failed_runs"] == 0, detail
    # four processes, named node by node, on two cache directories
    assert sorted(samples[-1]["workers"]) == ["0-0", "0-1", "1-0", "1-1"]
    assert sorted(samples[-1]["caches"]) == ["0", "1"]
    # sampled every 3rd step (and the first and last, and the chunksize change's)
    assert len(samples) < len(runs) / 2 and samples[-1]["run"] == len(runs)
    for node, g in fig["index_bytes"].items():
        assert g["db_last"] > 0 and g["entries_last"] > 0 and g["per_entry_last"] > 0, (node, g)
        assert g["wal_max"] <= 2 * 2**20, g  # checkpointed, truncated to 1 MiB
    assert fig["index_bytes_per_entry_ratio"] is not None
    assert 0 < fig["forms_max"] <= MAX_DOCUMENTS and fig["forms_bytes_max"] <= MAX_BYTES
    assert fig["worker_rss_mb_per_100_runs_second_half"] is not None
