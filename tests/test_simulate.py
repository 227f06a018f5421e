"""The cluster simulator (benchmarks/simulate.py) at tiny sizes, the pure stealing
policy functions it shares with the scheduler's LocalityStealing, and the cache policies
it shares with the store (cacheaffinity.worker._store.admission) against the offline optimum."""

from __future__ import annotations

import copy

import pytest

from benchmarks import _sim_model, _simulation, simulate
from cacheaffinity.placement import TorusPlacement
from cacheaffinity.scheduler import _stealing as stealing

CLUSTER = {"groups": [["node", 10, 4]], "storage_MBps": 400.0, "ssd_MBps": 1000.0}
HETERO = {"groups": [["small", 6, 4], ["big", 2, 16]], "storage_MBps": 300.0, "ssd_MBps": 1000.0}


def config(runs=3):
    cfg = copy.deepcopy(simulate.QUICK)
    cfg["rates"] = dict(simulate.RATES)
    cfg["runs"] = runs
    return cfg


def hit_rates(sim, runs):
    return [sim.run()["hit_rate"] for _ in range(runs)]


def test_simulator_uses_the_real_placement_and_stealing_code():
    assert _sim_model.TorusPlacement is TorusPlacement
    assert _simulation.plan_steals is stealing.plan_steals
    assert _simulation.choose_steal is stealing.choose_steal
    assert _simulation.track_idle is stealing.track_idle
    cfg = config()
    sim = _simulation.Simulation(cfg, CLUSTER, 300, "cacheaffinity-nosteal")
    sim.run()
    assert isinstance(sim.placement.p, TorusPlacement)
    ref = TorusPlacement(**cfg["torus"])
    ref.set_nodes({f"node-{i:04d}": 4.0 for i in range(10)})
    assert [sim.target[c] for c in range(300)] == ref.assign(sim.chunk_ids)


def test_stable_cacheaffinity_fills_in_run_one_stock_dask_does_not():
    cfg = config(runs=2)
    res = {
        pol: hit_rates(_simulation.Simulation(cfg, HETERO, 600, pol), 2)
        for pol in ("dask", "cacheaffinity-nosteal", "cacheaffinity")
    }
    assert all(r[0] == 0 for r in res.values()), res  # run 1 starts cold
    assert res["cacheaffinity-nosteal"][1] == 1.0, res
    assert res["cacheaffinity"][1] > res["dask"][1] + 0.3, res


def test_a_node_leaving_reshuffles_hash_mod_n_but_costs_the_torus_about_one_nth():
    cfg = config()
    out = {}
    for pol in ("hash%n", "cacheaffinity-nosteal"):
        sim = _simulation.Simulation(cfg, CLUSTER, 1000, pol)
        sim.run()
        sim.nodes["node-0003"].alive = False  # one of 10 nodes leaves between runs
        out[pol] = sim.run()["hit_rate"]
    assert out["hash%n"] < 0.3, out  # ~1/n of chunks keep their node
    assert 1 - out["cacheaffinity-nosteal"] < 2 / 10, out  # lost: the departed node's share
    assert out["cacheaffinity-nosteal"] < 1.0, out


def test_slow_node_locality_stealing_shortens_runs_and_keeps_hits():
    cfg = config(runs=3)
    runs = {}
    for pol in ("cacheaffinity-nosteal", "cacheaffinity"):
        sim = _simulation.Simulation(cfg, CLUSTER, 600, pol, slow=("node-0000", 3.0))
        runs[pol] = [sim.run() for _ in range(3)]
    ca, ns = runs["cacheaffinity"], runs["cacheaffinity-nosteal"]
    assert sum(r["steals"] for r in ca) > 0
    assert ca[2]["makespan_s"] < ns[2]["makespan_s"], (ca, ns)
    assert ca[2]["hit_rate"] > 0.8, ca


def test_adaptive_churn_keeps_torus_hits_and_runs_to_completion():
    cfg = config(runs=3)
    sim = _simulation.Simulation(cfg, CLUSTER, 600, "cacheaffinity", churn=cfg["adaptive"])
    runs = [sim.run() for _ in range(3)]
    assert all(r["nodes"] == 10 for r in runs)
    assert runs[2]["hit_rate"] > 0.6, runs
    mod = _simulation.Simulation(cfg, CLUSTER, 600, "hash%n", churn=cfg["adaptive"])
    mruns = [mod.run() for _ in range(3)]
    assert mruns[2]["hit_rate"] < runs[2]["hit_rate"], (mruns, runs)


def test_peer_fetch_serves_what_a_live_holder_caches():
    """Churn moves chunks to joining nodes while their holders are still alive:
    with peer fetch those local misses are served by the holder (no storage
    read); without it (``cacheaffinity-nopeers``) they are read from storage.
    The local hit rate itself is the same counter in both."""
    cfg = config(runs=3)
    runs = {}
    for pol in ("cacheaffinity", "cacheaffinity-nopeers"):
        sim = _simulation.Simulation(cfg, CLUSTER, 600, pol, churn=cfg["adaptive"])
        runs[pol] = [sim.run() for _ in range(3)]
    ca, nop = runs["cacheaffinity"], runs["cacheaffinity-nopeers"]
    assert all(r["peer_hits"] == 0 for r in nop) and all(r["served_rate"] == r["hit_rate"] for r in nop)
    assert ca[0]["peer_hits"] == 0  # nothing held anywhere in run 1
    later = ca[1:]
    assert sum(r["peer_hits"] for r in later) > 0, ca
    assert all(r["served_rate"] >= r["hit_rate"] for r in ca)
    assert sum(r["storage_GB"] for r in later) < sum(r["storage_GB"] for r in nop[1:]), (ca, nop)


def test_a_holder_serves_at_most_the_serve_limit_at_once():
    """worker.peer-serve-limit in the model: with 2 fetches in flight a holder declines
    (the asker reads storage); once one has ended it serves again; with no limit
    (``peer_serve_limit`` None, as ``--peer-serve-limit 0``) it always serves, and the
    same churn run then serves more misses by peer fetch."""
    cfg = config(runs=3)
    sim = _simulation.Simulation(cfg, CLUSTER, 60, "cacheaffinity")
    assert sim.peer_serve_limit == cfg["peer_serve_limit"] == 2
    node = _sim_model.Node("n", 4)
    sim.t = 10.0
    node.serves = [11.0, 12.0]
    assert not sim._may_serve(node)
    sim.t = 11.5  # the first transfer has ended
    assert sim._may_serve(node) and node.serves == [12.0]
    unlimited = copy.deepcopy(cfg)
    unlimited["peer_serve_limit"] = None
    node.serves = [20.0, 21.0, 22.0]
    assert _simulation.Simulation(unlimited, CLUSTER, 60, "cacheaffinity")._may_serve(node)
    peer = {}
    for name, c in (("limited", cfg), ("unlimited", unlimited)):
        s = _simulation.Simulation(c, CLUSTER, 600, "cacheaffinity", churn=c["adaptive"])
        peer[name] = sum(s.run()["peer_hits"] for _ in range(3))
    assert 0 < peer["limited"] <= peer["unlimited"], peer


def test_fifo_cache_smaller_than_share_thrashes_keep_does_not():
    cfg = config(runs=2)
    rates = {}
    for policy in ("fifo", "keep"):
        sim = _simulation.Simulation(cfg, CLUSTER, 400, "cacheaffinity-nosteal", cache_policy=policy)
        chunk_bytes = cfg["events_per_chunk"] * cfg["rates"]["bytes_per_event"]
        for c in sim.caches.values():
            c.capacity = 0.5 * 40 * chunk_bytes  # half of a node's ~40 chunks
        rates[policy] = hit_rates(sim, 2)[1]
    assert rates["fifo"] < 0.1, rates  # cyclic reads in the same order: FIFO evicts next
    assert rates["keep"] > 0.3, rates


def test_choose_steal_prefers_held_then_runner_up_then_last():
    prio = {"a": (1,), "b": (2,), "c": (3,), "x": (4,)}
    chunk = {"a": "A", "b": "B", "c": "C", "x": None}.get
    where = lambda holds: lambda t: (  # noqa: E731
        stealing.NO_CHUNK if chunk(t) is None
        else stealing.THIEF_HOLDS if chunk(t) in holds else stealing.COLD
    )  # fmt: skip
    pick = lambda holds, runner: stealing.choose_steal(  # noqa: E731
        list(prio), priority=prio.get, where=where(holds),
        runner_up_is_thief=(lambda ts: [chunk(t) in runner for t in ts])
        if runner is not None else None,
    )  # fmt: skip
    assert pick({"A"}, {"B"}) == "a"  # held by the thief first
    assert pick(set(), {"B"}) == "b"  # then a chunk whose runner-up is the thief
    assert pick(set(), None) == "c"  # then the chunk task the victim runs last
    assert pick(set(), set()) == "c"


def test_plan_steals_respects_backlog_budget_and_wanted():
    queues = {"v1": 10, "v2": 3}
    threads = {"v1": 2, "v2": 2, "t1": 2, "t2": 2}
    have = {"t1": 0, "t2": 0}

    def move(task, victim, thief):
        queues[victim] -= 1
        have[thief] += 1
        return True

    log = stealing.plan_steals(
        ["t1", "t2"], ["v1", "v2"], nthreads=threads.get,
        queued=lambda w: queues[w] - threads[w], wanted=lambda w: threads[w] + 1 - have[w],
        choose=lambda v, t: f"{v}-task", move=move, backlog=1, max_moves=4,
    )  # fmt: skip
    assert len(log) == 4  # budget
    assert [t for _, _, t in log] == ["t1", "t1", "t1", "t2"]  # t1 first wants 3
    assert all(v == "v1" for _, v, _ in log)  # v2 has 1 queued per thread: not > backlog
    idle_since: dict = {}
    assert stealing.track_idle(idle_since, ["a", "b"], 0.0, 0.25) == []
    assert stealing.track_idle(idle_since, ["b"], 0.3, 0.25) == ["b"]
    assert "a" not in idle_since


def test_simulator_caches_use_the_real_admission_policies():
    from cacheaffinity.worker._store import admission

    assert _sim_model.make_policy is admission.make_policy
    cache = _sim_model.NodeCache(100.0, "rank")
    assert isinstance(cache._p, admission.StableRank)
    cache.capacity = 50.0  # a new capacity: a new, empty policy
    assert cache._p.capacity == 50.0 and not cache.items


def test_beyond_capacity_the_default_policy_keeps_near_the_optimum_where_fifo_gets_nothing():
    """VISPA's shape, each node's share of the dataset twice its cache, 5 runs: FIFO gets no
    hit after run 1; the default policy (``rank``) gets at least 0.9 x the offline optimum
    over the same lookups in runs 3-5 and writes at most 20% of FIFO's bytes there."""
    cfg = config(runs=5)
    default = cfg["capacity_default"]
    res = simulate.capacity_case(cfg, "vispa", 1500, [(None, None, 1.0)] * 5, 1.0, 2.0, ["fifo", default])
    mine, fifo = res[f"cacheaffinity ({default})"]["runs"], res["cacheaffinity (fifo)"]["runs"]
    best = res[f"cacheaffinity ({default})+optimal"]["runs"]
    assert max(r["hit_rate"] for r in fifo) < 0.01, fifo
    assert 0.45 < best[2]["hit_rate"] < 0.55, best  # about cache / share
    for r in (2, 3, 4):
        assert mine[r]["hit_rate"] >= 0.9 * best[r]["hit_rate"], (mine, best)
        assert mine[r]["written_GB"] <= 0.2 * fifo[r]["written_GB"], (mine, fifo)
    assert mine[0]["hit_rate"] == 0 and best[0]["hit_rate"] == 0  # run 1 starts cold


def test_the_offline_optimum_on_a_cyclic_scan_keeps_what_fits():
    seq = [(f"k{i}", 1.0) for i in range(10)] * 3
    for aware in (False, True):
        hits = _sim_model.optimal_hits(seq, 4.0, aware)
        assert not any(hits[:10]) and sum(hits[10:20]) >= 4 and sum(hits[20:]) >= 4
    # variable sizes: Belady-Size prefers many small entries to few large ones
    seq = ([("big", 4.0)] + [(f"s{i}", 1.0) for i in range(4)]) * 3
    assert sum(_sim_model.optimal_hits(seq, 4.0, True)) >= sum(_sim_model.optimal_hits(seq, 4.0, False))


def test_rerunning_one_scenario_keeps_the_other_sections(tmp_path, monkeypatch):
    import json

    monkeypatch.setitem(simulate.QUICK, "scenarios", {"small_cache": [["vispa", 300]], "hetero": [["vispa", 300]]})
    monkeypatch.setitem(simulate.QUICK, "runs", 2)
    monkeypatch.setitem(simulate.QUICK, "hetero_policies", ["cacheaffinity"])
    for name in ("small_cache", "hetero"):
        assert simulate.main(["--quick", "--scenario", name, "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "simulate.json").read_text())
    assert set(saved["results"]) == {"small_cache", "hetero"}
    assert set(saved["scenario_stamps"]) == {"small_cache", "hetero"}
    assert saved["config"]["scenarios_run"] == ["hetero"]


@pytest.mark.parametrize("scenario", ["stable", "small_cache", "hetero", "slowdown", "workload_change"])
def test_benchmark_main_quick_writes_json_and_png(tmp_path, scenario, monkeypatch):
    import json

    tiny = {"stable": [["vispa", 300]], "small_cache": [["vispa", 300]],
            "hetero": [["vispa", 300]], "slowdown": [["vispa", 300, "large-0000"]],
            "workload_change": [["vispa", 300]]}  # fmt: skip
    monkeypatch.setitem(simulate.QUICK, "scenarios", tiny)
    monkeypatch.setitem(simulate.QUICK, "runs", 3)
    assert simulate.main(["--quick", "--scenario", scenario, "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "simulate.json").read_text())
    assert len(saved["commit"]) == 40 and isinstance(saved["dirty"], bool)
    assert (tmp_path / f"simulate_{scenario}.png").stat().st_size > 0
    if scenario == "slowdown":
        res = saved["results"]["slowdown"]["vispa/300/large-0000"]
        assert res["_slow_node"] == "large-0000" and res["_slowdown_before_run"] == 3
        assert any(k.startswith("slowdown (vispa/300/large-0000)") for k in saved["summary"])
    if scenario == "hetero":
        assert set(saved["results"]["hetero"]["vispa/300"]) == set(simulate.FULL["hetero_policies"])
    if scenario == "workload_change":
        res = saved["results"]["workload_change"]["vispa/300/AAABBBAA"]
        assert len(res["cacheaffinity (rank)"]["runs"]) == len(simulate.FULL["workload_sequence"])
        assert {f"cacheaffinity ({p})+optimal" for p in simulate.FULL["capacity_policies"]} <= set(res)
        assert any(k.startswith("workload change (vispa/300/AAABBBAA)") for k in saved["summary"])


def test_simulator_uses_the_real_locator_functions():
    from cacheaffinity.scheduler import _locator as locator

    assert _simulation.follow_holders is locator.follow_holders
    assert _simulation.NodeSpeed is locator.NodeSpeed
    assert _simulation.warm_threshold is stealing.warm_threshold


def test_follow_holders_follows_within_slack_and_spills_to_runner_up():
    from cacheaffinity.scheduler._locator import follow_holders

    # 4 chunks hashed to a, their holders b: b may take 1.5 x 4 x 1/2 + 1 = 4
    nodes = ["a", "a", "a", "a"]
    assert follow_holders(nodes, ["b"] * 4, {"a": 1.0, "b": 1.0}, 1.5) == 4
    assert nodes == ["b"] * 4
    # a dead holder (not in capacity) is ignored
    nodes = ["a", "a"]
    assert follow_holders(nodes, ["gone", None], {"a": 1.0, "b": 1.0}, 1.5) == 0
    # slow node s (learned speed 0.25): its bound is 1.1 x 8 x 1/5 + 1 = 2.76 and
    # 1.1 x 0.25 x its 8 placed chunks + 1 = 3.2, so it keeps its first 4 chunks;
    # the rest go to the runner-up
    nodes = ["s"] * 8
    moved = follow_holders(nodes, [None] * 8, {"s": 0.25, "f": 1.0}, 1.1,
                           runner_up=lambda i: "f", speed={"s": 0.25, "f": 1.0})
    assert nodes == ["s"] * 4 + ["f"] * 4 and moved == 4
    # a node of typical speed keeps every chunk placement gave it (held there or
    # by nobody), however unevenly the hash spread them: no miss the hash would avoid
    for holders in ([None] * 8, ["a"] * 8):
        nodes = ["a"] * 8
        assert follow_holders(nodes, holders, {"a": 1.0, "b": 1.0, "c": 1.0}, 1.5,
                              runner_up=lambda i: "b", speed={"a": 0.9}) == 0
        assert nodes == ["a"] * 8
    # no bound: everything follows its holder
    nodes = ["a"] * 10
    assert follow_holders(nodes, ["b"] * 10, {"a": 1.0, "b": 1.0}, float("inf")) == 10


def test_node_speed_smooths_and_has_hysteresis():
    from cacheaffinity.scheduler._locator import NodeSpeed

    sp = NodeSpeed(alpha=0.5, hysteresis=0.25, min_samples=10)
    for _ in range(9):
        sp.observe("a", 1.0)
        sp.observe("b", 1.0)
        sp.observe("c", 3.0)
    assert sp.speed("c") == 1.0  # fewer than min_samples tasks: typical
    sp.observe("a", 1.0)
    sp.observe("b", 1.0)
    sp.observe("c", 1.0)
    sp.observe("c", 1.0)
    sp.observe("c", 1.0)
    assert sp.published["c"] < 1.6
    sp.observe("c", 1.2)  # noise within 25%: not published
    assert sp.speed("unknown") == 1.0
    before = sp.speed("c")
    sp.observe("c", sp.smoothed["c"] * 1.1)
    assert sp.speed("c") == before
    for _ in range(10):
        sp.observe("c", 2.0)  # really 2x slower
    assert 0.4 < sp.speed("c") < 0.7  # ~0.5, within the hysteresis
    with pytest.raises(ValueError, match="alpha"):
        NodeSpeed(alpha=0)
    # a slow victim gives up warm chunks at a smaller backlog
    assert stealing.warm_threshold(8, 0.5, 1.0) == 4
    assert stealing.warm_threshold(8, 1.0, 1.0) == 8


def test_heterogeneous_cluster_converges_and_a_slowed_node_is_relieved():
    """Run-1 steals become run-2 placement; a node 2x slower is relieved by steals
    then keeps fewer chunks, with few misses."""
    cfg = config(runs=4)
    cl = {"groups": [["small", 6, 4], ["big", 2, 16]], "storage_MBps": 300.0, "ssd_MBps": 1000.0,
          "speed_sigma": 0.4}  # fmt: skip
    sim = _simulation.Simulation(cfg, cl, 800, "cacheaffinity")
    runs = [sim.run() for _ in range(2)]
    assert runs[0]["steals"] > 0
    assert runs[1]["hit_rate"] >= 0.97, runs
    before = sim.speed.published["big-0000"]
    sim.nodes["big-0000"].slow *= 2
    runs += [sim.run() for _ in range(2)]
    assert runs[2]["hit_rate"] >= 0.9 and runs[3]["hit_rate"] >= 0.97, runs
    assert sim.speed.published["big-0000"] > 1.4 * before  # learned: seconds per task


def test_open_bytes_cost_cold_chunks_their_link_and_leave_warm_runs_alone():
    """``open_bytes`` (the file metadata a chunk task reads when it opens its file) moves
    over the link of every chunk read from storage: run 1 and ``direct`` take longer and
    read more from storage; cacheaffinity's warm run reads nothing and is unchanged."""
    cluster = {"groups": [["s", 2, 1, {"link_MBps": 1.0}], ["b", 1, 2, {"link_MBps": 4.0}]],
               "storage_MBps": 5.0, "ssd_MBps": 500.0, "cpu_cores": 2}  # fmt: skip
    rates = {"bytes_per_event": 2400.0, "compression_ratio": 4.6}
    runs = {
        ob: simulate.simulate_shape(cluster, 16, runs=2, events_per_chunk=1000,
                                    rates=dict(rates, open_bytes=ob), seed=3)  # fmt: skip
        for ob in (0.0, 170e3)
    }
    plain, opened = runs[0.0], runs[170e3]
    for pol in ("cacheaffinity", "direct"):
        assert opened[pol][0]["makespan_s"] > plain[pol][0]["makespan_s"] * 1.1, pol
    assert opened["direct"][1]["makespan_s"] > plain["direct"][1]["makespan_s"] * 1.1
    assert opened["direct"][0]["storage_GB"] == pytest.approx(plain["direct"][0]["storage_GB"] + 16 * 170e3 / 1e9)
    assert opened["cacheaffinity"][1]["hit_rate"] == plain["cacheaffinity"][1]["hit_rate"] == 1.0
    assert opened["cacheaffinity"][1]["makespan_s"] == pytest.approx(plain["cacheaffinity"][1]["makespan_s"])


def test_a_peer_fetch_slower_than_the_peer_timeout_falls_back_to_storage():
    """The cluster box's shape (benchmarks/cluster_box.py): in run 2 a chunk is stolen onto a
    host whose link takes ~3.8 s for its decompressed columns.  Without a timeout the model
    fetches them from the holder; with ``peer_timeout_s`` below that it gives up then and
    reads storage (as the worker does): a storage read, not a peer hit, and a longer run."""
    cluster = {"groups": [["s1", 1, 1, {"link_MBps": 0.625}], ["s2", 1, 1, {"link_MBps": 0.625}],
                          ["b1", 1, 2, {"link_MBps": 2.5}]],
               "storage_MBps": 5.0, "ssd_MBps": 2000.0, "cpu_cores": 2}  # fmt: skip
    rates = {"bytes_per_event": 2401.6, "compression_ratio": 4.58, "compute_events_per_s_per_core": 4187.8,
             "decompress_MBps_per_core": 23.8, "open_bytes": 106e3}  # fmt: skip
    out = {}
    for timeout in (None, 3.0):
        runs = simulate.simulate_shape(cluster, 24, runs=3, events_per_chunk=1000, rates=rates, seed=1,
                                       peer_timeout_s=timeout, policies=("cacheaffinity",))  # fmt: skip
        out[timeout] = runs["cacheaffinity"][1]  # run 2
    fetched, gave_up = out[None], out[3.0]
    assert fetched["steals"] >= 1 and fetched["peer_hits"] >= 1 and fetched["peer_timeouts"] == 0, fetched
    assert gave_up["peer_timeouts"] >= 1 and gave_up["peer_hits"] == 0, gave_up
    assert gave_up["storage_GB"] > fetched["storage_GB"]
    assert gave_up["makespan_s"] > fetched["makespan_s"]


def test_a_thief_that_learned_a_warm_chunk_costs_it_a_slow_link_takes_fewer(monkeypatch):
    """The cluster box's shape with tasks whose durations vary (sigma 0.3): warm chunks
    stolen over a 0.625 MB/s link take their thief tens of its tasks.  WarmStealCost learns
    that in the first warm runs, so in runs 3-5 fewer warm chunks leave their holders and the
    runs are shorter than with the prior (warm-backlog 2) alone."""
    cluster = {"groups": [["s1", 1, 1, {"link_MBps": 0.625}], ["s2", 1, 1, {"link_MBps": 0.625}],
                          ["b1", 1, 2, {"link_MBps": 2.5}]],
               "storage_MBps": 5.0, "ssd_MBps": 2000.0, "cpu_cores": 2}  # fmt: skip
    rates = {"bytes_per_event": 2401.6, "compression_ratio": 4.58, "compute_events_per_s_per_core": 4187.8,
             "decompress_MBps_per_core": 23.8, "open_bytes": 106e3}  # fmt: skip

    def later_runs():
        steals = seconds = 0.0
        for seed in range(1, 7):
            runs = simulate.simulate_shape(cluster, 48, runs=5, events_per_chunk=1000, rates=rates, seed=seed,
                                           peer_timeout_s=5.0, duration_jitter_sigma=0.3,
                                           policies=("cacheaffinity",))["cacheaffinity"]  # fmt: skip
            steals += sum(r["warm_steals"] for r in runs[2:])
            seconds += sum(r["makespan_s"] for r in runs[2:])
        return steals, seconds

    learned = later_runs()
    monkeypatch.setattr(_simulation.WarmStealCost, "observe", lambda self, *a: None)  # the prior alone
    prior = later_runs()
    assert prior[0] >= 4, prior  # the shape does steal warm chunks
    assert learned[0] <= prior[0] / 2, (learned, prior)
    assert learned[1] < prior[1], (learned, prior)
