"""Benchmark plumbing: the ``make bench`` step list, the results stamp and statistics of
benchmarks/_common.py, and scheduler_overhead.py at a tiny size (real dask schedulers and
workers in subprocesses).  Timings are not asserted, only what must hold at any load."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import uproot

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import _common, run_all  # noqa: E402


def test_bench_steps_in_order_with_repeats():
    names = [n for n, _ in run_all.commands(False, "OUT", "DATA")]
    assert names[0] == "consecutive_runs" and names[-1] == "render_readme"
    assert set(names) >= {"consecutive_runs_light", "scheduler_overhead", "executor_runs",
                          "stealing_slow_node", "cache_read", "placement", "scheduler_scale",
                          "simulate"}  # fmt: skip
    cmd = dict(run_all.commands(False, "OUT", "DATA"))
    head = cmd["consecutive_runs"]
    for flag, value in (("--analysis", "realistic"), ("--repeats", "3"), ("--workers", "4"),
                        ("--events", "160000"), ("--chunksize", "10000"), ("--out", "OUT")):  # fmt: skip
        assert head[head.index(flag) + 1] == value
    # XRootD origin (the default) and the default modes: all six, coffea-native included
    assert "--storage" not in head and "--modes" not in head
    from benchmarks._runs import MODES

    assert "coffea-native" in MODES
    so = cmd["scheduler_overhead"]
    assert so[so.index("--tasks") + 1] == "10000"
    # quick: every script, into the given directory, no README rendering
    quick = dict(run_all.commands(True, "Q", "D"))
    assert "render_readme" not in quick and len(quick) == len(cmd) - 1
    assert all("Q" in argv for argv in quick.values())
    assert "coffea-native" in quick["consecutive_runs"]  # the native peer in the quick headline too


def test_git_stamp_and_spread(tmp_path):
    g = _common.git_info()
    assert len(g["commit"]) == 40 and isinstance(g["dirty"], bool)
    _common.write_json(str(tmp_path / "x.json"), config={"a": 1}, results={"b": 2})
    doc = json.loads((tmp_path / "x.json").read_text())
    assert doc["commit"] == g["commit"] and doc["dirty"] == g["dirty"]
    s = _common.spread([3.0, None, 1.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.0, 1.0, 3.0, 3)
    assert _common.spread([None])["median"] is None


def test_branch_bytes_match_uproot(nanoaod_dir):
    f = str(nanoaod_dir / "nano_dy.root")
    b = _common.branch_bytes([f, f], ["Muon_pt", "nMuon", "no_such_branch"])
    with uproot.open(f) as rf:
        t = rf["Events"]
        one = t["Muon_pt"].uncompressed_bytes + t["nMuon"].uncompressed_bytes
        total = sum(x.uncompressed_bytes for x in t.values(recursive=False))
    assert b["uncompressed"] == 2 * one
    assert b["total_uncompressed"] == 2 * total
    assert (b["branches"], b["branches_found"]) == (3, 2)


@pytest.mark.timeout(300)
def test_scheduler_overhead_tiny(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "scheduler_overhead.py"), "--tasks", "200",
         "--rounds", "1", "--workers", "2", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=280, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "HEADLINE chunk vs plain restricted" in proc.stdout
    doc = json.loads((tmp_path / "scheduler_overhead.json").read_text())
    assert len(doc["commit"]) == 40
    h = doc["results"]["headline"]
    assert h["tasks"] == 200 and h["overhead"]["n"] == 1
    assert h["chunk_us_per_task"]["median"] > 0 and h["plain_us_per_task"]["median"] > 0
    # the plugin placed every chunk task where cacheaffinity.where said: a task that ran
    # elsewhere was moved by the throttled stealing (a worker fell idle, e.g. under load)
    off_placed = round((1 - h["chunk_tasks_on_placed_worker"]["median"]) * h["tasks"])
    assert off_placed <= h["chunk_steal_requests"]["median"], h
    assert h["chunk_tasks_on_placed_worker"]["median"] >= 0.8, h
    assert (tmp_path / "scheduler_overhead.png").read_bytes()[:4] == b"\x89PNG"


def test_warm_run_profile_counts_read_path_samples_inside_chunk_tasks(tmp_path):
    """benchmarks/warm_run_profile.py: inclusive samples of the read path, counted only under
    a chunk task, from py-spy's raw format (frame;frame;... count)."""
    from benchmarks import warm_run_profile as wrp

    task = "ChunkTask.__call__ (cacheaffinity/coffea/_work.py:250)"
    ex = "PackSourceMapping.extract_column (cacheaffinity/coffea/_packs.py:166)"
    gp = "ColumnCache.get_packs (cacheaffinity/worker/_store/cache.py:557)"
    q = "Index.query (cacheaffinity/worker/_store/index.py:343)"
    rd = "DataFiles.read (cacheaffinity/worker/_store/files.py:350)"
    (tmp_path / "a.txt").write_text(
        f"_bootstrap (threading.py:1);{task};process (realistic.py:9) 50\n"
        f"_bootstrap (threading.py:1);{task};{ex};{gp};{q} 7\n"
        f"_bootstrap (threading.py:1);{task};{ex};{gp};ColumnCache._read (cache.py:1);{rd} 5\n"
        f"_bootstrap (threading.py:1);{task};{ex};_as_array (packs.py:356) 4\n"
        f"_bootstrap (threading.py:1);heartbeat (worker.py:3) 30\n"
    )
    # pack reads outside any chunk task (a peer request being served) are not the task's
    (tmp_path / "b.txt").write_text(f"serve_packs (peers.py:1);{gp};{rd} 9\n{task} 8\n")
    s = wrp.stack_samples([str(tmp_path / "a.txt"), str(tmp_path / "b.txt")])
    assert s["all"] == 50 + 7 + 5 + 4 + 30 + 9 + 8
    assert s["tasks"] == 50 + 7 + 5 + 4 + 8
    assert (s["read_path"], s["get_packs"], s["index_query"], s["file_reads"]) == (16, 12, 7, 5)
    assert s["read_path_share"] == pytest.approx(16 / 74)
    assert s["processor"] == 50 and s["processor_share"] == pytest.approx(50 / 74)
    assert s["nanoevents"] == 0
    ev = "NanoEventsFactory.events (coffea/nanoevents/factory.py:1)"
    (tmp_path / "c.txt").write_text(f"{task};{ev};from_buffers (ak.py:2) 6\n{ev} 3\n")
    c = wrp.stack_samples([str(tmp_path / "c.txt")])
    assert (c["tasks"], c["nanoevents"], c["nanoevents_share"]) == (6, 6, 1.0)  # outside a task: not counted
    assert wrp.find_py_spy(str(tmp_path / "no-such-py-spy")) is None


def test_warm_run_profile_timeline_from_a_task_stream():
    """benchmarks/warm_run_profile.py: where a run's wall went, from task-stream records
    (only the compute spans count; a transfer is not a task computing)."""
    from benchmarks import warm_run_profile as wrp

    def rec(worker, start, stop, transfer=None):
        ss = [{"action": "compute", "start": start, "stop": stop}]
        if transfer:
            ss.insert(0, {"action": "transfer", "start": transfer[0], "stop": transfer[1]})
        return {"worker": worker, "startstops": ss}

    records = [rec("a", 100.2, 101.0), rec("a", 101.0, 102.5), rec("b", 100.3, 101.1, transfer=(100.1, 100.3))]
    t = wrp.timeline(records, 100.0, 103.0)
    assert t["first_task_s"] == pytest.approx(0.2)
    assert t["tail_s"] == pytest.approx(0.5)
    assert t["busiest_worker_s"] == pytest.approx(2.3)
    assert t["tasks_per_worker"] == [1, 2]
    assert wrp.timeline([], 0.0, 1.0)["busiest_worker_s"] is None


def test_gc_timer_counts_full_collections():
    """The worker-side collector timer of the benchmarks (benchmarks/_gctimer.py; here in
    this process)."""
    import gc

    from benchmarks import _gctimer

    before = list(gc.callbacks)
    state = getattr(gc, "_benchmark_gc_timer", None)
    try:
        gc._benchmark_gc_timer = None
        assert _gctimer.install() is True and _gctimer.install() is False  # once per process
        _gctimer.read()  # reset
        gc.collect()
        gc.collect(0)
        got = _gctimer.read()
        assert got["full_n"] == 1 and got["young_n"] >= 1
        assert got["full_s"] > 0
        assert _gctimer.read()["full_n"] == 0  # read resets
        summary = _gctimer.summary({"a": got, "b": dict(got, full_s=3.0), "c": dict(got, full_s=1.0)})
        assert summary["full_s"] == 1.0 and summary["full_n"] == 1
    finally:
        gc.callbacks[:] = before
        gc._benchmark_gc_timer = state


def test_before_after_refuses_an_after_env_without_a_value(capsys):
    from benchmarks import before_after

    with pytest.raises(SystemExit) as e:
        before_after.main(["--before", "HEAD", "--after-env", "NO_VALUE"])
    assert e.value.code == 2
    assert "--after-env takes KEY=VALUE pairs, got NO_VALUE" in capsys.readouterr().err


def test_results_renderers_say_what_is_not_measured_yet(tmp_path):
    from benchmarks import _beyond_capacity_figures, _soak_figures, before_after

    for module, script in ((before_after, "before_after.py"), (_beyond_capacity_figures, "beyond_capacity.py"),
                           (_soak_figures, "soak.py")):  # fmt: skip
        assert module.render(str(tmp_path)).startswith(f"Not measured yet (`python benchmarks/{script}`")
    (tmp_path / "x.json").write_text('{"commit": "abc"}')
    assert _common.read_results(str(tmp_path), "x") == {"commit": "abc"}
    assert _common.read_results(str(tmp_path), "y") is None


def test_store_scale_builds_a_node_cache_as_earlier_work_left_it(tmp_path, monkeypatch):
    """benchmarks/store_scale.py's cache: every pack a row with the rank policy's columns, and
    the policy's bottom-k sample of the hashes its lookups saw (the k smallest key hashes);
    its data files share a few inodes (at most ``LINKS_PER_FILE`` names each: ext4 refuses
    more than 65,000 links), and every one reads back verified."""
    import os
    import sqlite3

    from benchmarks import store_scale
    from cacheaffinity.worker._directory import INDEX_NAME
    from cacheaffinity.worker._store import ColumnCache
    from cacheaffinity.worker._store.admission import StableRank, key_hash

    monkeypatch.setattr(store_scale, "LINKS_PER_FILE", 400)
    n = 1500
    info = store_scale.build(str(tmp_path / "node"), n)
    inodes = {}
    for root, _, names in os.walk(tmp_path / "node" / "columns"):
        for name in names:
            st = os.stat(os.path.join(root, name))
            inodes[st.st_ino] = st.st_nlink
    assert sorted(inodes.values()) == [300, 400, 400, 400]  # 1500 names, no template left
    with ColumnCache(str(tmp_path / "node"), capacity=1 << 40) as cache:
        grp, start, stop = store_scale._where(n - 1)
        assert len(cache.get_packs(grp, start, stop)) == 1
    assert info["packs"] == n and info["capacity"] == n * info["pack_bytes"]
    con = sqlite3.connect(tmp_path / "node" / INDEX_NAME)
    keys = [k for (k,) in con.execute("SELECT key FROM entries")]
    sample = sorted(h + 2**63 for (h,) in con.execute("SELECT h FROM admission_sample"))
    con.close()
    assert len(keys) == n
    k = StableRank(1).sample_size
    assert sample == sorted(key_hash(key) for key in keys)[:k]


def test_store_scale_builds_a_node_cache_looked_up_as_a_warm_run_left_it(tmp_path):
    """``--looked-up``: every row as the rank policy's lookup in a warm run leaves it (a
    reuse distance, stale from 1.25 of it later: the policy's own factor), none fresh; a
    lookup of the measured phases is a re-lookup that moves its row's clocks on."""
    import sqlite3

    from benchmarks import store_scale
    from cacheaffinity.worker._directory import INDEX_NAME
    from cacheaffinity.worker._store import ColumnCache
    from cacheaffinity.worker._store.admission import StableRank
    from cacheaffinity.worker._store.schema import read

    assert StableRank(1).live_factor == store_scale.LIVE
    n = 1500
    node = tmp_path / "node"
    info = store_scale.build(str(node), n, looked_up=True)
    con = sqlite3.connect(node / INDEX_NAME)
    rows = con.execute("SELECT id, last_used, stale_from, reuse_dist FROM entries ORDER BY id").fetchall()
    fresh_from = int(con.execute("SELECT value FROM admission_state WHERE name = 'fresh_from'").fetchone()[0])
    con.close()
    size = info["pack_bytes"]
    assert fresh_from > max(r[0] for r in rows)
    for i, (_, used, due, dist) in enumerate(rows):
        assert read(dist) == (n + 1) * size and read(used) == (n + i + 1) * size
        assert read(due) == pytest.approx(read(used) + store_scale.LIVE * read(dist))
    grp, start, stop = store_scale._where(7)
    with ColumnCache(node, capacity=info["capacity"], admission="rank", write_queue=0) as cache:
        assert cache.get_packs(grp, start, stop)
        cache.save_admission(force=True)
        assert cache.stats()["evictions"] == 0
    con = sqlite3.connect(node / INDEX_NAME)
    used, due, dist = con.execute("SELECT last_used, stale_from, reuse_dist FROM entries WHERE id = ?", (rows[7][0],)).fetchone()
    con.close()
    assert read(used) > read(rows[7][1]) and read(due) > read(rows[7][2])
    assert read(dist) == read(used) - read(rows[7][1])  # its reuse distance since the warm run's lookup
    # when each row goes stale: one record each from the build in the log, the lookup's new one in the inbox
    con = sqlite3.connect(node / INDEX_NAME)
    records = [con.execute(f"SELECT stale_from, id FROM {t} WHERE id = ?", (rows[7][0],)).fetchall()
               for t in ("admission_due", "admission_inbox")]  # fmt: skip
    assert con.execute("SELECT count(*) FROM admission_due").fetchone()[0] == n
    assert con.execute("SELECT count(*) FROM admission_inbox").fetchone()[0] == 1
    con.close()
    assert records == [[(rows[7][2], rows[7][0])], [(due, rows[7][0])]]


@pytest.mark.timeout(600)
def test_store_scale_tiny(tmp_path):
    """benchmarks/store_scale.py end to end at a tiny size: both policies, real processes."""
    from benchmarks import store_scale

    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "store_scale.py"), "--sizes", "1000,2000", "--procs", "1,2",
         "--ops", "40", "--repeats", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=580, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "store_scale.json").read_text())
    rows = doc["results"]
    assert {(r["packs"], r["policy"], r["procs"]) for r in rows} == {
        (n, pol, p) for n in (1000, 2000) for pol in ("rank", "fifo") for p in (1, 2)
    }
    for r in rows:
        # every looked-up pack is held (hits), none of the misses is, every phase cost CPU
        assert r["hit_done"] == 1.0 and r["hit_random_done"] == 1.0 and r["miss_done"] == 0.0, r
        assert min(r[f"{ph}_cpu_us"] for ph in store_scale.PHASES) > 0, r
        # the part spent saving lookups: none without a policy, some of the phase with rank
        for ph in ("hit", "hit_random"):
            if r["policy"] == "fifo":
                assert r[f"{ph}_save_cpu_us"] == 0, r
            else:
                assert 0 < r[f"{ph}_save_cpu_us"] < r[f"{ph}_cpu_us"], r
    assert {"hit_vs_fifo_p1", "hit_vs_own_1000_p2", "rss_growth_mb_p1", "open_s_p2"} <= set(doc["checks"])
    assert [s["packs"] for s in doc["sizes"]] == [1000, 2000] and all(s["due_rebuild_s"] > 0 for s in doc["sizes"])
    assert (tmp_path / "store_scale.png").read_bytes()[:4] == b"\x89PNG"


def test_store_scale_pack_mb_records_facility_packs_and_an_insert_evicts_one(tmp_path):
    """``--pack-mb``: every row records the size a stored pack of that many bytes takes (its
    data file stays small), the capacity is those sizes, and an insert of such a pack into
    the full cache stores it in place of one row with either policy, the cache at capacity."""
    import sqlite3

    from benchmarks import store_scale
    from cacheaffinity.worker._directory import INDEX_NAME
    from cacheaffinity.worker._store import ColumnCache

    pack = 1 << 20
    for policy in ("rank", "fifo"):
        node = tmp_path / policy
        info = store_scale.build(str(node), 300, pack_bytes=pack)
        small = store_scale.build(str(tmp_path / f"{policy}-small"), 300)
        assert info["pack_bytes"] >= pack > small["pack_bytes"] and info["capacity"] == 300 * info["pack_bytes"]
        with ColumnCache(str(node), capacity=info["capacity"], admission=policy, write_queue=0) as cache:
            grp, start, stop = store_scale._where(10**7, "n")
            assert cache.put_pack(grp, start, stop, store_scale._arrays(0, pack))[1]
            assert cache.stats()["evictions"] == 1
            assert len(cache.get_packs(grp, start, stop)) == 1
        # between cases the inserted packs' files are emptied, their rows kept: the cache stays full
        assert store_scale.empty_inserted(str(node)) == 1
        assert sum(f.stat().st_size for f in (node / "columns").rglob("*") if f.is_file()) < pack
        con = sqlite3.connect(node / INDEX_NAME)
        sizes = {size for (size,) in con.execute("SELECT size FROM entries")}
        held = con.execute("SELECT count(*), sum(size) FROM entries").fetchone()
        con.close()
        assert sizes == {info["pack_bytes"]} and held == (300, info["capacity"])


@pytest.mark.timeout(600)
def test_store_scale_pack_mb_tiny(tmp_path):
    """``--pack-mb`` end to end: the insert phase alone, both policies, its own results file."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "store_scale.py"), "--sizes", "1000,2000", "--procs", "1",
         "--pack-mb", "1", "--insert-ops", "20", "--repeats", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=580, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "store_scale_pack1mb.json").read_text())
    assert doc["config"]["pack_mb"] == 1 and doc["config"]["insert_ops"] == 20
    for r in doc["results"]:
        assert r["insert_done"] == 1.0 and r["evictions"] == 20 and "hit_cpu_us" not in r, r
    assert set(doc["checks"]) == {"insert_vs_own_1000_p1", "insert_vs_fifo_p1", "rss_growth_mb_p1", "open_s_p1"}
    from benchmarks.store_scale import render

    table = render(str(tmp_path), "store_scale_pack1mb")
    assert "--pack-mb 1 --insert-ops 20" in table and "1 MiB pack" in table
    assert (tmp_path / "store_scale_pack1mb.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.timeout(600)
def test_precheck_scale_tiny(tmp_path):
    """benchmarks/precheck_scale.py end to end, this checkout against the same commit's
    worktree (in a git checkout): caches as a warm run leaves them, real processes, every
    insert stored, the worktree removed."""
    from benchmarks import precheck_scale

    git = (REPO / ".git").exists()  # an unpacked sdist has no commits to compare
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "precheck_scale.py"), "--packs", "500,4000", "--prechecks", "5",
         "--puts", "10", "--repeats", "1", *(["--before", "HEAD"] if git else []), "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=580, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "precheck_scale.json").read_text())
    summary = doc["results"]["summary"]
    sides = ("after", "before") if git else ("after",)
    assert {(r["side"], r["packs"]) for r in summary} == {(s, n) for s in sides for n in (500, 4000)}
    for r in summary:
        assert r["stored"] == 10 and all(r[m] > 0 for m in precheck_scale.MEASURES), r
    assert set(doc["results"]["checks"]) == {"precheck_ms_4000_vs_500", "put_ms_4000_vs_500"}
    table = precheck_scale.render(str(tmp_path))
    assert "| 4,000 |" in table and (f"--before {doc['config']['before']}" in table) == git
    assert (tmp_path / "precheck_scale.png").read_bytes()[:4] == b"\x89PNG"
    if git:
        trees = subprocess.check_output(["git", "-C", str(REPO), "worktree", "list"], text=True)
        assert "precheck-scale-" not in trees  # the worktree removed


def test_store_scale_compares_an_insert_with_its_cost_where_it_was_stored_alike():
    """An insert's own-cost bound skips a small cache where rank refused most inserts (a
    refusal writes no file: cheaper, not the same operation), and names the size it used."""
    from benchmarks import store_scale

    def row(packs, policy, insert_us, done):
        return {"packs": packs, "policy": policy, "procs": 8, "insert_cpu_us": insert_us, "insert_done": done,
                "hit_cpu_us": 50.0, "hit_random_cpu_us": 60.0, "miss_cpu_us": 7.0, "rss_end_mb": 50.0, "open_s": 0.1}

    rows = [row(1000, "rank", 320.0, 0.34), row(1000, "fifo", 816.0, 1.0), row(10000, "rank", 671.0, 0.955),
            row(10000, "fifo", 881.0, 1.0), row(10**6, "rank", 698.0, 1.0), row(10**6, "fifo", 613.0, 1.0)]
    checks = store_scale.checks(rows)
    assert "insert_vs_own_1000_p8" not in checks
    assert checks["insert_vs_own_10000_p8"] == {"ratio": round(698 / 671, 3), "bound": 1.5, "met": True}
    assert checks["hit_vs_own_1000_p8"]["ratio"] == 1.0  # the other phases keep the smallest cache
    rows[0]["insert_done"] = 0.99  # stored alike at 1e3: compared there, and that misses
    assert store_scale.checks(rows)["insert_vs_own_1000_p8"] == {"ratio": round(698 / 320, 3), "bound": 1.5,
                                                                 "met": False}


def test_facility_node_pairs_policies_and_sizes_within_rounds(tmp_path):
    """benchmarks/facility_node.py: run 2 rank / fifo paired within a round, each size's run 2
    over the smallest size's (same policy, same round), the checks, the harness command, the
    rendered table."""
    from benchmarks import facility_node as fn
    from benchmarks._common import write_json

    def row(k, n, p, run2, hits=1.0):
        return {"round": k, "packs": n, "policy": p, "run1_s": 20.0, "run2_s": run2, "run3_s": run2,
                "run2_hit_rate": hits, "identical_results": True}  # fmt: skip

    rows = [
        row(1, 0, "rank", 3.0), row(1, 0, "fifo", 3.0), row(1, 10**6, "rank", 3.3), row(1, 10**6, "fifo", 3.0),
        row(2, 0, "rank", 2.0), row(2, 0, "fifo", 2.5), row(2, 10**6, "rank", 2.0), row(2, 10**6, "fifo", 2.0),
        row(3, 0, "rank", 4.0), row(3, 0, "fifo", 4.0), row(3, 10**6, "rank", 4.8), row(3, 10**6, "fifo", 4.0),
    ]  # fmt: skip
    s = fn.summarize(rows, [0, 10**6])
    big = s["per_size"][1]
    assert big["rank_vs_fifo"]["values"] == pytest.approx([1.1, 1.0, 1.2])  # paired per round, not medians
    assert big["rank_vs_smallest"]["values"] == pytest.approx([1.1, 1.0, 1.2])
    assert s["per_size"][0]["rank_vs_fifo"]["median"] == pytest.approx(1.0)
    assert s["checks"]["rank_vs_fifo_run2_1000000"] == {"ratio": pytest.approx(1.1), "bound": 1.1, "met": True}
    assert s["checks"]["rank_run2_1000000_vs_0"]["met"] is True
    assert s["checks"]["run2_all_hits"]["met"] is True
    rows[2]["run2_hit_rate"] = 0.9
    rows[8]["run2_s"] = 5.0  # round 3: rank at 10^6 / at 0 = 1.25, rank / fifo at 0 = 1.25
    s = fn.summarize(rows, [0, 10**6])
    assert s["checks"]["run2_all_hits"] == {"value": 0.9, "bound": 1.0, "met": False}
    assert s["per_size"][0]["rank_vs_fifo"]["max"] == pytest.approx(1.25)
    cmd = fn.harness_command(40_000, "fifo", argparse.Namespace(events=160_000, files=8, chunksize=10_000, runs=3,
                                                                data="d"), "o", "x")  # fmt: skip
    assert cmd[cmd.index("--other-packs") + 1] == "40000" and cmd[cmd.index("--admission") + 1] == "fifo"
    assert cmd[cmd.index("--per-node") + 1] == "2" and "--no-floors" in cmd
    config = {"sizes": [0, 10**6], "rounds": 3, "runs": 3, "events": 160_000, "files": 8, "chunksize": 10_000}
    write_json(str(tmp_path / "facility_node.json"), config, rows, summary=s)
    text = fn.render(str(tmp_path))
    assert "| 1,000,000 |" in text and "--sizes 0,1e6 --rounds 3" in text
    assert "Missed: " in text and "run2_all_hits = 0.900" in text
    assert "Not measured yet" in fn.render(str(tmp_path / "none"))


def test_eviction_scale_tiny(tmp_path):
    """benchmarks/eviction_scale.py end to end at a tiny size: inserts of ~1 to 300 packs'
    size into a full cache of 1,000, both policies, each in a new process running this
    checkout's code; every insert stored, evicting what it needed, the cache within its
    capacity; the rendered table."""
    from benchmarks import eviction_scale

    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "eviction_scale.py"), "--packs", "1000", "--victims", "1,10,100,300",
         "--repeats", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "eviction_scale.json").read_text())
    summary = doc["results"]["summary"]
    assert {(r["side"], r["policy"], r["victims"]) for r in summary} == {
        ("after", p, k) for p in ("rank", "fifo") for k in (1, 10, 100, 300)
    }
    for r in summary:
        assert r["stored"] and r["over_capacity_bytes"] == 0 and r["cpu_s"] > 0, r
        assert r["victims"] - 1 <= r["evicted"] <= r["victims"], r  # k packs' bytes less a little
    assert all(case["code"] == "after" for case in doc["results"]["cases"])  # no path of this machine
    checks = doc["results"]["checks"]
    assert checks["within capacity after every insert (this checkout)"]["met"]
    assert "rank, 1,000 packs: per victim at 300 / at 100" in checks
    text = eviction_scale.render(str(tmp_path))
    assert "| 1,000 | 299 |" in text and "--repeats 1" in text and " at " not in text.splitlines()[0]
    assert (tmp_path / "eviction_scale.png").read_bytes()[:4] == b"\x89PNG"


def test_eviction_scale_checks_and_table_name_what_is_over_capacity():
    """The checks fail on an insert left above the capacity or a cost per pack that grows
    with the packs evicted."""
    from benchmarks import eviction_scale as ev

    def row(side, policy, k, cpu, over=0, n=10_000):
        return {"side": side, "packs": n, "policy": policy, "victims": k, "runs": 3, "cpu_s": cpu, "wall_s": cpu,
                "evicted": k, "cpu_per_victim_us": 1e6 * cpu / k, "stored": True, "over_capacity_bytes": over}

    summary = [row("after", "rank", 100, 0.003), row("after", "rank", 3000, 0.09),
               row("after", "fifo", 100, 0.001), row("after", "fifo", 3000, 0.1, over=4 << 20),
               row("before", "rank", 100, 0.03), row("before", "fifo", 100, 0.002)]  # fmt: skip
    checks = ev.checks(summary)
    assert checks["rank, 10,000 packs: per victim at 3,000 / at 100"] == {"ratio": 1.0, "bound": 2.0, "met": True}
    assert checks["fifo, 10,000 packs: per victim at 3,000 / at 100"]["met"] is False  # 3.33x per victim
    assert checks["within capacity after every insert (this checkout)"] == {"value": 4 << 20, "bound": 0, "met": False}


def test_frame_snapshots_tiny(tmp_path):
    """benchmarks/frame_snapshots.py end to end: the plain and guarded snapshot timed with
    real waiting threads (the plain one returns every thread's frame), a bound per thread
    count, the table and the plot."""
    from benchmarks import frame_snapshots

    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "frame_snapshots.py"), "--threads", "1,8", "--calls", "200",
         "--repeats", "3", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "frame_snapshots.json").read_text())
    rows = doc["results"]["rows"]
    assert [r["threads"] for r in rows] == [1, 8]
    for r in rows:
        assert r["plain_us"] > 0 and r["guarded_us"] > 0 and len(r["rounds"]["plain"]) == 3, r
        assert r["extra_us_per_s"] == pytest.approx((r["guarded_us"] - r["plain_us"]) * 100, abs=0.2)
    assert set(doc["results"]["checks"]) == {"guard_cpu_per_s_1_threads", "guard_cpu_per_s_8_threads"}
    table = frame_snapshots.render(str(tmp_path))
    assert "| 8 |" in table and "--threads 1,8" in table and "Bounds met:" in table
    assert (tmp_path / "frame_snapshots.png").read_bytes()[:4] == b"\x89PNG"


def test_kept_table_tiny(tmp_path):
    """benchmarks/kept_table.py end to end: one real cache per size, the three ways side by
    side, kept's transactions continued and anew's not, every insert evicting, two bounds,
    the table and the plot."""
    from benchmarks import kept_table

    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "kept_table.py"), "--sizes", "300,1000", "--calls", "20",
         "--repeats", "3", "--work", str(tmp_path), "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "kept_table.json").read_text())
    rows = doc["results"]["rows"]
    assert [r["packs"] for r in rows] == [300, 1000]
    for r in rows:
        assert r["continued_share"] >= 0.9, r  # all but a round's first (after an anew round)
        assert r["stored"]["fifo"] == 60 and min(r["stored"]["kept"], r["stored"]["anew"]) >= 50, r  # rank refuses a few
        assert r["evictions"]["kept"] >= r["stored"]["kept"] and r["evictions"]["fifo"] >= 60, r  # a full cache
        assert r["kept_us"] > 0 and r["anew_us"] > 0 and len(r["rounds"]["kept"]) == 3, r
        assert r["kept_vs_fifo"] == pytest.approx(r["kept_us"] / r["fifo_us"], abs=0.01)
    assert list(doc["results"]["checks"]) == ["kept: 1,000 packs / 300", "kept / fifo at 1,000 packs"]
    table = kept_table.render(str(tmp_path))
    assert "| 1,000 |" in table and "--sizes 3e2,1e3" in table and "Bounds met:" in table
    assert (tmp_path / "kept_table.png").read_bytes()[:4] == b"\x89PNG"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("kept-table-")]  # the caches removed
    with pytest.raises(SystemExit):
        kept_table.main(["--sizes", "1000", "--out", str(tmp_path)])


def test_forecast_scale_tiny(tmp_path):
    """benchmarks/forecast_scale.py end to end: a new process per side and repeat (both sides
    this checkout here), the costs per task and report, the bounds, the table and the plot."""
    from benchmarks import forecast_scale

    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "forecast_scale.py"), "--tasks", "2000,20000", "--rounds", "2",
         "--reports", "3000", "--repeats", "2", "--nodes", "8", "--before", "HEAD", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "forecast_scale.json").read_text())
    rows = doc["results"]["summary"]
    assert sorted((r["side"], r["tasks"]) for r in rows) == [("after", 2000), ("after", 20000),
                                                             ("before", 2000), ("before", 20000)]  # fmt: skip
    assert all(r["submit_ns"] > 0 and r["report_ns"] > 0 for r in rows), rows
    assert len(doc["results"]["cases"]) == 2 * 2 * 2
    assert set(doc["results"]["checks"]) == {"submit_ns_flat", "submit_ns_vs_before", "report_ns_flat",
                                             "report_ns_vs_before"}  # fmt: skip
    table = forecast_scale.render(str(tmp_path))
    assert "| 20,000 |" in table and "--before" in table and "Bounds met:" in table
    assert (tmp_path / "forecast_scale.png").read_bytes()[:4] == b"\x89PNG"
    assert not subprocess.run(["git", "-C", str(REPO), "worktree", "list"], capture_output=True,
                              text=True).stdout.count("forecast-scale-")  # the worktree removed


def test_state_rows_tiny(tmp_path):
    """benchmarks/state_rows.py end to end: two real caches on one directory taking turns,
    both ways side by side, the processes it listed (the two measured among them), a bound,
    the table and the plot."""
    from benchmarks import state_rows

    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "state_rows.py"), "--writers", "2,8", "--windows", "0,63",
         "--calls", "20", "--repeats", "3", "--work", str(tmp_path), "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "state_rows.json").read_text())
    rows = doc["results"]["rows"]
    assert [(r["writers"], r["window"]) for r in rows] == [(2, 0), (2, 63), (8, 0), (8, 63)]
    for r in rows:
        assert r["listed"] == r["writers"], r  # the seeded processes and the two measured
        assert (r["window_after"], r["demand_after"]) == (r["window"], state_rows.DEMAND), r  # as seeded
        assert r["reloads"] >= 3 * 20 // 2, r  # each transaction read what the other wrote
        assert r["kept_us"] > 0 and r["every_time_us"] > 0 and len(r["rounds"]["kept"]) == 3, r
    (name, check), = doc["results"]["checks"].items()
    assert name.startswith("kept: 8 processes listed, window 63 / 2, 0")
    assert check["ratio"] == pytest.approx(rows[-1]["kept_us"] / rows[0]["kept_us"], abs=0.01)
    table = state_rows.render(str(tmp_path))
    assert "| 8 | 63 |" in table and "--writers 2,8" in table and "Bounds met:" in table
    assert (tmp_path / "state_rows.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SystemExit):
        state_rows.main(["--writers", "1", "--out", str(tmp_path)])
