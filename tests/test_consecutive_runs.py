"""The consecutive-run benchmark's core at a tiny size (benchmarks/consecutive_runs.py).

Real local clusters, real generated LZMA files, real column caches; with ``--storage
xrootd`` a real XRootD origin and XCache in a private network namespace (skipped with the
reason when the machine lacks them).  Timings are not asserted: only what the counters
must show whatever the machine's load.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import dask
import pytest

import cacheaffinity

from testbed import skip_or_fail

from testbed import xrootd as xrd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import _clusters, _consecutive_figures, _runs, _storage  # noqa: E402
from benchmarks import consecutive_runs as cr  # noqa: E402

TINY = dict(events=1200, files=1, chunksize=200, branches=("Muon_*", "Jet_*"), progress=False,
            analysis="light", floors=False, processes=("same",))


def test_bad_configuration_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown mode 'nope'"):
        _runs.Config(modes=("nope",)).check()
    with pytest.raises(ValueError, match="analysis='nope'"):
        _runs.Config(analysis="nope").check()
    with pytest.raises(ValueError, match="native_variant='nope': choose from file, blosc-zstd"):
        _runs.Config(native_variant="nope").check()
    with pytest.raises(ValueError, match="repeats=0"):
        _runs.Config(repeats=0).check()
    with pytest.raises(ValueError, match="--runs 4"):
        _runs.Config(runs=3, scenarios=("stable", "membership")).check()
    with pytest.raises(ValueError, match="processes=\\('nope',\\)"):
        _runs.Config(processes=("nope",)).check()
    assert _runs.Config().processes == ("same", "new")  # the headline measures both
    assert cr.parse_args(["--processes", "new"])[0].processes == ("new",)
    assert cr.parse_args(["--processes", "new,same"])[0].processes == ("new", "same")
    with pytest.raises(SystemExit):
        cr.parse_args(["--processes", "other"])
    cfg = _runs.Config(storage="local")
    cfg.check()
    assert "xcache" not in cfg.modes  # no XCache without XRootD



@pytest.mark.timeout(240)
def test_idle_cluster_workers_are_frozen_between_their_runs(tmp_path):
    """``freeze_idle``: a mode's worker processes are stopped (SIGSTOP) while other modes
    run and continued for their own run; a frozen cluster still closes."""
    import psutil

    cfg = _runs.Config(workers=2, storage="local", data=str(tmp_path / "data"), modes=("direct",), **TINY)
    c = _clusters.ModeCluster("direct", cfg, None, tmp_path).start()
    try:
        pids = sorted(set(c.client.run(os.getpid).values()))
        assert len(pids) == 2
        c.freeze()
        assert {psutil.Process(p).status() for p in pids} == {psutil.STATUS_STOPPED}
        with c.running():
            assert {psutil.Process(p).status() for p in pids} != {psutil.STATUS_STOPPED}
            assert sorted(set(c.client.run(os.getpid).values())) == pids  # they answer
        assert {psutil.Process(p).status() for p in pids} == {psutil.STATUS_STOPPED}
    finally:
        c.close()  # thaws first: a stopped worker would never answer its nanny
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


@pytest.mark.timeout(420)
def test_local_storage_stable_and_membership(tmp_path):
    w = 2
    # 12 chunks of 100 events, one placement stripe each: the removed node holds some but
    # not all of them (random node ids gave one node all 6 stripes in 3.35% of draws, all 12
    # in 0.07%: python tools/placement_odds.py --files 1 --stripes-per-file 12)
    tiny = {**TINY, "chunksize": 100}
    cfg = _runs.Config(
        workers=w, runs=4, storage="local", data=str(tmp_path / "data"),
        modes=("dask-default+cache", "cacheaffinity"), scenarios=("stable", "membership"),
        membership_modes=("cacheaffinity",), **tiny,
    )  # fmt: skip
    with dask.config.set({"cacheaffinity.client.stripe-entries": tiny["chunksize"]}):
        doc = cr.run_benchmark(cfg, log=lambda line: None)
    assert doc["identical_results"]
    stable = doc["sequences"]["stable"]
    ca, dd = stable["cacheaffinity"], stable["dask-default+cache"]
    assert [r["run"] for r in ca] == [1, 2, 3, 4]
    for rows in (ca, dd):  # cold first run: decompressed, read from storage
        assert rows[0]["decompressed_bytes"] > 0
        assert rows[0]["storage_bytes"] > 0
    # per-chunk keys (coffea's cachestrategy) miss everything in run 1; cluster entries can hit
    # within run 1 (a missing cluster is read whole, later chunks of the node hit on it)
    assert dd[0]["hit_rate"] == 0
    assert ca[0]["hit_rate"] < 1 and ca[0]["misses"] > 0
    # served by caches (a chunk stolen in run 2 is answered by its holder's pack: a peer hit,
    # not the own node's); the own node's hits and the peers' answers add up to it
    assert ca[1]["cache_rate"] >= 0.9, ca[1]
    own = ca[1]["hit_rate"] * (ca[1]["hits"] + ca[1]["misses"])
    assert own + ca[1]["peer_hits"] == pytest.approx(ca[1]["hits"]), ca[1]
    assert ca[1]["decompressed_bytes"] < ca[0]["decompressed_bytes"]
    assert ca[1]["on_preferred"] is not None and ca[0]["steals"] is not None
    assert ca[1]["storage_bytes"] < ca[0]["storage_bytes"]
    assert dd[0]["on_preferred"] is None  # no preferred node without the plugin
    # membership: a node removed before run 3, one added before run 4
    m = doc["sequences"]["membership"]["cacheaffinity"]
    assert [r["nodes"] for r in m] == [w, w, w - 1, w]
    assert m[2]["event"].startswith("removed") and m[3]["event"].startswith("added")
    assert 0 < m[2]["removed_node_share"] < 1 and 0 < m[2]["removed_node_bytes_share"] < 1
    # the survivors' chunks still hit (the removed node's may too: a survivor that read a
    # shared ROOT cluster holds it whole); the new node starts empty but every chunk is served
    assert m[2]["cache_rate"] >= 1 - m[2]["removed_node_share"] - 0.02
    # one node left: the forecast counts the chunks the removed node held last as new on the
    # survivor, not as hits (the survivor may still serve some from a cluster it read whole)
    fc = m[2]["last_run_stats"]["forecast"]
    assert fc["new_chunks"] > 0 and fc["hit_rate"] < 1, fc
    assert m[1]["last_run_stats"]["forecast"]["new_chunks"] == 0
    assert m[3]["hit_rate"] > 0
    names = set(doc["targets"])
    assert "cacheaffinity run-2 hit rate (stable)" in names
    assert any("removed" in n for n in names) and any("added" in n for n in names)
    assert all(t["pass"] in (True, False, None) for t in doc["targets"].values())
    # JSON and PNG
    j, png = cr.write_results(doc, cfg, tmp_path / "out")
    saved = json.loads(Path(j).read_text())
    assert saved["config"]["workers"] == w
    assert saved["results"]["sequences"]["stable"]["cacheaffinity"][1]["run"] == 2
    assert Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = _consecutive_figures.table_rows(doc)
    assert len(rows) == 4 + 4 + 4


@pytest.mark.timeout(300)
def test_new_process_runs(tmp_path):
    """``--processes same,new``: each new-process run's client side in its own Python
    process (another pid) against a cluster that persists; results equal the same-process
    runs'; the JSON has the new-process rows, figures, ratios and targets; the README
    renderer shows both tables."""
    cfg = _runs.Config(
        workers=2, runs=2, storage="local", data=str(tmp_path / "data"),
        modes=("coffea-native", "cacheaffinity"), scenarios=("stable",),
        **{**TINY, "processes": ("same", "new")},
    )  # fmt: skip
    lines: list[str] = []
    doc = cr.run_benchmark(cfg, log=lines.append)
    assert any(line.startswith("[repeat 1, new process per run] 2 clusters") for line in lines)
    assert doc["identical_results"] and doc["identical_across_processes"] is True
    assert doc["identical_results_per_process"] == {"same": True, "new": True}
    new = doc["new_process"]
    assert set(new) == {"coffea-native", "cacheaffinity"}
    pids = set()
    for mode, rows in new.items():
        assert [r["run"] for r in rows] == [1, 2] and {r["process"] for r in rows} == {"new"}
        for r in rows:  # the same results as every same-process run, from another process
            assert r["result_digest"] == doc["result_digest"]
            assert r["child"]["pid_differs"] and r["child"]["process_s"] >= r["wall_s"] > 0
            pids.add(r["child"]["pid"])
        # the cluster (its workers and their caches) persists across the client processes
        # (served by caches: a chunk stolen on 2 busy cores is answered by its holder's pack)
        assert rows[0]["misses"] > 0 and rows[1]["cache_rate"] == 1, (mode, rows[1])
        assert rows[0]["file_opens"] > 0  # run 1: preprocessing and chunks opened files
    assert len(pids) == 4 and os.getpid() not in pids  # one new process per run
    same = doc["sequences"]["stable"]
    assert {r["process"] for rows in same.values() for r in rows} == {"same"}
    # coffea opens every file for every chunk, and preprocesses again in a new process
    nat = new["coffea-native"]
    assert nat[1]["file_opens"] >= nat[0]["file_opens"] > 0 and nat[1]["last_run_stats"] is None
    ca = new["cacheaffinity"][1]
    stats = ca["last_run_stats"]
    assert stats["storage_opens"] == 0 and stats["misses"] == 0  # the executor's own figures
    if "files_preprocessed" in stats:  # the executor counts preprocessing's opens: none left
        assert ca["file_opens"] == 0, ca
    # the same-process run 2 found coffea's metadata in its Runner's cache: nothing opened
    assert same["cacheaffinity"][1]["file_opens"] == 0
    h = doc["headline"]["new_process"]
    assert h["modes"]["cacheaffinity"]["run2_wall_s"]["n"] == 1
    assert h["modes"]["coffea-native"]["run2_file_opens"]["median"] > 0
    for name in ("cacheaffinity new-process run 2 / same-process run 2",
                 "coffea-native new-process run 2 / same-process run 2",
                 "coffea-native new-process run 2 / cacheaffinity new-process run 2"):  # fmt: skip
        assert h["ratios"][name]["n"] == 1, name
        if name in _consecutive_figures.NEW_PROCESS_TARGETS:
            assert doc["targets"][name]["pass"] in (True, False), name
    assert "cacheaffinity new-process run 2 / same-process run 2" in _consecutive_figures.NEW_PROCESS_TARGETS
    t = doc["targets"]["cacheaffinity new-process run 2: files opened (preprocessing included)"]
    assert t["limit"] == "== 0" and t["pass"] == (t["value"] == 0)
    assert doc["targets"]["results identical in same-process and new-process runs"]["pass"] is True
    rows = _consecutive_figures.table_rows(doc)
    assert len(rows) == 2 * 2 * 2 and sum(r["scenario"] == "stable, new process" for r in rows) == 4
    assert [r["mode"] for r in _consecutive_figures.new_process_rows(doc)] == ["coffea-native", "cacheaffinity"]
    j, _ = cr.write_results(doc, cfg, tmp_path / "out")
    saved = json.loads(Path(j).read_text())
    assert saved["config"]["processes"] == ["same", "new"]
    assert saved["results"]["new_process"]["cacheaffinity"][1]["file_opens"] == ca["file_opens"]
    from tools.readme.consecutive import render_consecutive_processes, render_consecutive_runs

    text = render_consecutive_runs(str(tmp_path / "out"), "consecutive_runs_light")
    assert "| mode | run 1 s |" in text and "| mode (new process per run) |" in text
    assert "- coffea-native new-process run 2 / ours: " in text
    assert "- cacheaffinity new-process run 2 / same-process run 2: " in text
    assert "across all modes, runs and processes (same-process and new-process): yes" in text
    assert "--processes" not in text  # both: the default
    details = render_consecutive_processes(str(tmp_path / "out"), "consecutive_runs_light")
    assert "same-process = new-process yes" in details


def test_renderer_without_new_process_runs_keeps_the_old_table(tmp_path):
    """A results file without new-process runs (measured before ``--processes``) renders
    the same-process table alone, and the details say none were measured."""
    from tools.readme.consecutive import render_consecutive_processes, render_consecutive_runs
    from tools.render_readme import RESULTS

    doc = json.loads((Path(RESULTS) / "consecutive_runs.json").read_text())
    doc["results"].get("headline", {}).pop("new_process", None)
    (tmp_path / "consecutive_runs.json").write_text(json.dumps(doc))
    text = render_consecutive_runs(str(tmp_path))
    assert "new process" not in text and "| mode |" in text
    assert "No new-process runs" in render_consecutive_processes(str(tmp_path))


@pytest.mark.timeout(300)
def test_coffea_native_mode_runs_from_its_buffer_cache(tmp_path):
    """``coffea-native`` (coffea's BufferCache over zict.File, worker_affinity=True) in the
    same invocation as the others: the same result, run 2 served from its cache (no miss,
    nothing decompressed, less read from storage), the issue-28 target and ratios, the
    README renderer's row."""
    cfg = _runs.Config(
        workers=2, runs=3, storage="local", data=str(tmp_path / "data"),
        modes=("direct", "coffea-native", "cacheaffinity"), scenarios=("stable",), **TINY,
    )  # fmt: skip
    with dask.config.set({"cacheaffinity.client.stripe-entries": TINY["chunksize"]}):
        doc = cr.run_benchmark(cfg, log=lambda line: None)
    assert doc["identical_results"]  # coffea-native's histograms equal every other mode's
    nat = doc["sequences"]["stable"]["coffea-native"]
    assert [r["run"] for r in nat] == [1, 2, 3]
    assert nat[0]["misses"] > 0 and nat[0]["decompressed_bytes"] > 0
    for r in nat[1:]:  # warm: every lookup found in the worker's BufferCache
        assert r["misses"] == 0 and r["hits"] > 0 and r["hit_rate"] == 1, r
        assert r["decompressed_bytes"] == 0
        assert r["storage_bytes"] < nat[0]["storage_bytes"]  # no branch data read again
        assert r["steals"] == 0 and r["peer_hits"] is None
    direct = doc["sequences"]["stable"]["direct"]
    assert direct[1]["storage_bytes"] == direct[0]["storage_bytes"]  # uncached: all again
    ratios = doc["headline"]["ratios"]
    assert ratios["coffea-native run 2 / cacheaffinity run 2"]["n"] == 1
    assert ratios["coffea-native run 3 / cacheaffinity run 3"]["n"] == 1
    t = doc["targets"]["coffea-native run 2 / cacheaffinity run 2"]
    assert t["limit"] == ">= 2" and t["pass"] == (t["value"] >= 2)
    assert doc["targets"]["direct run 2 / cacheaffinity run 2"]["limit"] == "> 1"
    cr.write_results(doc, cfg, tmp_path / "out")
    from tools.readme.consecutive import render_consecutive_runs

    text = render_consecutive_runs(str(tmp_path / "out"), "consecutive_runs_light")
    row = next(line for line in text.splitlines() if line.startswith("| `coffea-native`"))
    assert "BufferCache" in row and "100.0%" in row
    assert "--modes direct coffea-native cacheaffinity" in text
    assert "- coffea-native run 3 / cacheaffinity run 3: " in text


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode, kept", [
    pytest.param("coffea-native", False, id="coffea-native-keeps-nothing"),
    pytest.param("cacheaffinity", True, id="cacheaffinity-keeps-its-node-cache"),
])  # fmt: skip
def test_what_a_worker_restart_keeps(tmp_path, mode, kept):
    """What README says each mode keeps across a worker restart (``client.restart()``: new
    worker processes).  coffea-native: nothing readable; one BufferCache per worker process,
    its files in the worker's local directory, which the worker removes; the run after the
    restart is as cold as run 1.  cacheaffinity: the node's cache directory (node id, index,
    entries) outlives the process; the run after the restart is all hits."""
    cfg = _runs.Config(workers=2, storage="local", data=str(tmp_path / "data"), modes=(mode,), **TINY)
    files = _runs.prepare_data(cfg)
    storage = _storage.Storage(cfg, files, tmp_path)
    with dask.config.set({"cacheaffinity.client.stripe-entries": TINY["chunksize"]}):
        c = _clusters.ModeCluster(mode, cfg, storage, tmp_path).start()
        try:
            cold = c.run()
            assert cold["misses"] > 0
            assert c.run()["cache_rate"] == 1
            before = c.native_stats()
            if mode == "coffea-native":  # one cache per worker, in its local directory
                local = c.client.run(lambda dask_worker: dask_worker.local_directory)
                used = {a: st for a, st in before.items() if st["directory"] is not None}
                assert used, before  # (hash % n may give every chunk to one worker)
                for addr, st in used.items():
                    assert st["directory"].startswith(local[addr]) and st["files"] == st["entries"] > 0
            else:
                c.client.run(lambda dask_worker: cacheaffinity.worker_cache(dask_worker).flush())
            pids = set(c.client.run(os.getpid).values())
            with dask.config.set(c.settings):  # the new processes read the mode's settings
                c.client.restart()
            assert not pids & set(c.client.run(os.getpid).values())  # new processes
            if mode == "cacheaffinity":  # the same node directories, new processes
                _clusters.wait_nodes(c.client, 2, True)
                dirs = c.client.run(lambda dask_worker: str(cacheaffinity.worker_cache(dask_worker).directory))
                assert sorted(Path(d).name for d in dirs.values()) == ["node-0", "node-1"]
            else:
                assert all(st["directory"] is None for st in c.native_stats().values())
                assert not any(Path(st["directory"]).exists() for st in used.values())
            after = c.run()
        finally:
            c.close()
    if kept:
        assert after["misses"] == 0 and after["cache_rate"] == 1, after
    else:  # as cold as run 1: every buffer decompressed and stored again
        assert after["misses"] == cold["misses"], after
        assert after["decompressed_bytes"] == cold["decompressed_bytes"] > 0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("admission", ["rank", "fifo"])
def test_node_caches_holding_other_packs_keep_them_and_serve_run_2(tmp_path, admission):
    """``other_packs``: each node's cache holds that many packs of other data before run 1
    (the facility node after earlier work), here 2 nodes x 2 processes sharing each node's
    directory; the run stores its own packs beside them (none evicted: the caches are ample),
    run 2 is all hits, with either admission policy (``admission``, set in the workers)."""
    from dask.utils import parse_bytes

    from cacheaffinity.worker._store import ColumnCache

    other = 300
    cfg = _runs.Config(workers=2, per_node=2, storage="local", data=str(tmp_path / "data"),
                       modes=("cacheaffinity",), scenarios=("stable",), other_packs=other,
                       admission=admission, **TINY)  # fmt: skip
    cfg.check()
    files = _runs.prepare_data(cfg)
    storage = _storage.Storage(cfg, files, tmp_path)
    with dask.config.set({"cacheaffinity.client.stripe-entries": TINY["chunksize"]}):
        c = _clusters.ModeCluster("cacheaffinity", cfg, storage, tmp_path).start()
        try:
            policies = c.client.run(lambda: dask.config.get("cacheaffinity.worker.admission"))
            assert set(policies.values()) == {admission}, policies
            capacities = c.client.run(lambda dask_worker: cacheaffinity.worker_cache(dask_worker).cache.capacity)
            cold = c.run()
            warm = c.run()
            c.client.run(lambda dask_worker: cacheaffinity.worker_cache(dask_worker).flush())
        finally:
            c.close()
    assert cold["misses"] > 0
    assert warm["misses"] == 0 and warm["cache_rate"] == 1, warm
    held = []
    for n in range(2):
        with ColumnCache(str(c.cache_root / f"node-{n}"), capacity=1 << 40, admission=admission) as cache:
            keys = list(cache)
        held.append(len(keys))
    # every other pack is still there, and the run's packs beside them; the node's capacity
    # is the configured one (the directory records it; adopted by every worker)
    assert min(held) >= other and sum(held) > 2 * other, held
    assert set(capacities.values()) == {parse_bytes(c.settings["cacheaffinity.worker.capacity"])}, capacities
    with pytest.raises(ValueError, match="other_packs=-1"):
        _runs.Config(other_packs=-1).check()
    with pytest.raises(ValueError, match="admission='lru': choose from rank, fifo"):
        _runs.Config(admission="lru").check()


def test_a_second_buffer_cache_cannot_read_the_first_ones_files(tmp_path):
    """coffea's BufferCache keeps dtype and shape in memory: a new instance over the same
    zict.File directory sees the file but decodes nothing (why _native keeps one per
    process, and why coffea-native's files are useless after a restart)."""
    import numpy as np
    import zict
    from coffea.nanoevents import BufferCache
    from coffea.nanoevents.mapping.buffer_cache import NoCompressionCodec

    first = BufferCache(zict.File(tmp_path), NoCompressionCodec())
    first["k"] = np.arange(5)
    assert np.array_equal(first.get("k"), np.arange(5))
    second = BufferCache(zict.File(tmp_path), NoCompressionCodec())
    assert "k" in second.cache and second.get("k") is None


@pytest.mark.timeout(600)
def test_xrootd_storage(tmp_path):
    """The script over a real XRootD origin + XCache (it re-executes itself under unshare -n)."""
    missing = xrd.missing_requirements()
    if missing:
        skip_or_fail("XRootD benchmark needs " + "; ".join(missing))
    # the unprivileged xrootd user must reach the files: not under pytest's 0700 tmp_path
    data = Path(tempfile.mkdtemp(prefix="cacheaffinity-test-consecutive-"))
    os.chmod(data, 0o755)
    try:
        _run_xrootd(data, tmp_path)
    finally:
        shutil.rmtree(data, ignore_errors=True)


def _run_xrootd(data: Path, tmp_path: Path) -> None:
    argv = [
        sys.executable, str(REPO / "benchmarks" / "consecutive_runs.py"),
        "--storage", "xrootd", "--rate", "1gbit", "--workers", "2", "--runs", "2",
        "--events", str(TINY["events"]), "--files", "1", "--chunksize", str(TINY["chunksize"]),
        "--branches", *TINY["branches"], "--analysis", "light", "--no-floors", "--repeats", "2",
        "--modes", "direct", "xcache", "cacheaffinity",
        "--scenarios", "stable", "--data", str(data), "--out", str(tmp_path / "out"),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=540, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    doc = json.loads((tmp_path / "out" / "consecutive_runs_light.json").read_text())["results"]
    assert doc["storage"]["kind"] == "xrootd"
    assert "htb" in doc["storage"]["qdisc"]
    assert doc["identical_results"]
    s = doc["sequences"]["stable"]
    for mode in ("direct", "xcache", "cacheaffinity"):
        assert s[mode][0]["origin_bytes"] > 0, mode  # run 1 reads from the origin
    # run 2: the origin sends about as much again for direct, next to nothing for the caches
    assert s["direct"][1]["origin_bytes"] > 0.5 * s["direct"][0]["origin_bytes"]
    assert s["xcache"][1]["origin_bytes"] < 0.1 * s["xcache"][0]["origin_bytes"]
    assert s["cacheaffinity"][1]["origin_bytes"] < 0.1 * s["cacheaffinity"][0]["origin_bytes"]
    assert s["xcache"][1]["storage_bytes"] > 0  # XCache still serves the compressed bytes
    assert s["cacheaffinity"][1]["cache_rate"] >= 0.9
    # every repeat starts cold, XCache included (a new cache directory per repeat)
    assert len(doc["repeats"]) == 2
    for rp in doc["repeats"]:
        for mode in ("direct", "xcache", "cacheaffinity"):
            assert rp["sequences"]["stable"][mode][0]["origin_bytes"] > 0, mode


@pytest.mark.timeout(300)
def test_realistic_repeats_and_floors(tmp_path):
    """The realistic analysis, 2 repeats, both floors, on the files it reads (generated with
    only the branches the analysis reads, so that the test stays small)."""
    from benchmarks._common import template_path
    from examples.realistic import TTbarLikeProcessor, branches_read

    read = branches_read(TTbarLikeProcessor(), template_path())
    assert len(read) >= 150
    branches = _runs.analysis_branches("realistic")
    assert set(read) < set(branches)  # plus the kinematics NanoEvents' behaviours need
    cfg = _runs.Config(
        workers=2, runs=3, storage="local", data=str(tmp_path / "data"), events=800, files=1,
        chunksize=400, branches=branches, progress=False, modes=("direct", "cacheaffinity"),
        scenarios=("stable",), analysis="realistic", repeats=2, floors=True,
    )  # fmt: skip
    lines: list[str] = []
    with dask.config.set({"cacheaffinity.client.stripe-entries": 400}):  # a stripe per chunk
        doc = cr.run_benchmark(cfg, log=lines.append)
    assert doc["identical_results"]  # every run, mode, repeat and floor: the same histograms
    assert len(doc["repeats"]) == 2
    # all clusters of a repeat are up before round 1; the mode order rotates
    assert [rp["mode_order"] for rp in doc["repeats"]] == [["direct", "cacheaffinity"],
                                                         ["cacheaffinity", "direct"]]
    assert lines[1].startswith("[repeat 1] 2 clusters started")
    for rp in doc["repeats"]:
        f = rp["floors"]
        assert f["fill"]["storage_bytes"] > 0  # the in-memory fill read the files
        assert f["load"]["chunks"] == 2 and f["load"]["bytes_in_memory"] > 0
        # one of each floor per warm round: after round 2's runs, before round 3's
        for name in ("coffea-in-memory", "processor-only"):
            assert [(x["round"], x["when"]) for x in f[name]] == [(2, "after"), (3, "before")]
        assert all(x["storage_bytes"] == 0 for x in f["coffea-in-memory"])  # worker memory
        assert f["processor-only"][0]["process_s_sum"] > 0
        ca = rp["sequences"]["stable"]["cacheaffinity"]
        # run 1 cold (two chunks of one node may share a ROOT cluster), then all hits
        assert ca[0]["hit_rate"] < 1 and ca[1]["cache_rate"] == ca[2]["cache_rate"] == 1
        for r in ca:  # the own node's hits and the peers' answers add up to what caches served
            assert r["hit_rate"] + r["peer_hits"] / (r["hits"] + r["misses"]) == pytest.approx(r["cache_rate"]), r
        direct = rp["sequences"]["stable"]["direct"]
        # uncached: every run decompresses what the cold cached run 1 inserted
        assert direct[1]["decompressed_bytes"] == ca[0]["decompressed_bytes"] > 0
        assert ca[1]["decompressed_bytes"] == 0
    h = doc["headline"]
    for name in ("cacheaffinity run 1 / run 2", "direct run 2 / cacheaffinity run 2",
                 "cacheaffinity run 1 / direct run 1",
                 "cacheaffinity run 2 / floor (b) coffea-in-memory",
                 "cacheaffinity run 2 / floor (a) processor-only"):  # fmt: skip
        r = h["ratios"][name]
        assert r["n"] == 2 and r["min"] <= r["median"] <= r["max"], (name, r)
        assert name in doc["targets"]
    assert h["modes"]["direct"]["run2_decompressed_MB"]["median"] > 0
    # block-storage reads of the workers, per run and per floor (Linux: /proc/<pid>/io)
    for rp in doc["repeats"]:
        for rows in rp["sequences"]["stable"].values():
            assert all(isinstance(r["disk_read_bytes"], int) and r["disk_read_bytes"] >= 0 for r in rows)
        assert all(x["disk_read_bytes"] >= 0 for x in rp["floors"]["coffea-in-memory"])
    assert h["modes"]["cacheaffinity"]["run2_disk_read_MB"]["n"] == 2
    assert h["floor_b_disk_read_MB"]["n"] == 2
    vol = doc["decompressed_per_uncached_run"]
    assert vol["branches_found"] == len(read)
    rows = _consecutive_figures.headline_rows(doc)
    assert [r["mode"] for r in rows][-2:] == ["floor: coffea-in-memory", "floor: processor-only"]
    j, _ = cr.write_results(doc, cfg, tmp_path / "out")
    saved = json.loads(Path(j).read_text())
    assert len(saved["commit"]) == 40 and saved["dirty"] in (True, False)
    from tools.readme.consecutive import render_consecutive_runs

    text = render_consecutive_runs(str(tmp_path / "out"))
    assert "- Run 2 read from the workers' disks" in text and "floor (b) " in text


def test_disk_read_bytes_counts_what_the_page_cache_did_not_hold():
    """The per-run disk figure (``benchmarks._floor.io_read_bytes``): a file pushed out of
    the page cache and read again shows up in full; read again at once, it does not."""
    from benchmarks._floor import io_read_bytes

    # on block storage: a tmpfs /tmp (usual on CI machines) has no page cache to leave
    work = Path(tempfile.mkdtemp(dir=Path(__file__).resolve().parents[1]))
    try:
        path = work / "blob"
        data = os.urandom(8 << 20)
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        before = io_read_bytes()
        assert path.read_bytes() == data
        cold = io_read_bytes() - before
        assert cold >= len(data) * 0.9, cold
        before = io_read_bytes()
        assert path.read_bytes() == data
        assert io_read_bytes() - before < len(data) * 0.1
    finally:
        shutil.rmtree(work)
