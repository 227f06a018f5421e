"""cacheaffinity on a cluster in a box (testbed/hosts.py): hosts as network namespaces with
their own addresses, host names, links and disks, as root.

Every analysis result is compared with coffea's ``IterativeExecutor`` on the same files.
The steady-state and partition tests run in the default suite; the others are marked
``hosts`` (``make test-hosts``).  Without root or ``ip netns`` they skip with the reason (under
CI, where we are root, they fail instead: :func:`testbed.skip_or_fail`).

Dask timeouts of every box here (:data:`TIMEOUTS`), which bound how long a partition can
hold a run: the scheduler removes a worker it has not heard from for
``distributed.scheduler.worker-ttl`` (5 s, checked every 5 s: 5 to 10 s, then it tries to
restart the worker through its nanny, which a partition makes wait for
``distributed.comm.timeouts.connect``, 5 s); a TCP connection whose data go unacknowledged
breaks after ``distributed.comm.timeouts.tcp`` (15 s; distributed refuses less than 11 s),
which is what makes the cut-off worker close; a peer fetch gives up after
``cacheaffinity.worker.peer-timeout`` (3 s).  Figures measured are printed (``-s``) as
``FIGURES <json>`` lines.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed import skip_or_fail
from testbed import hosts as hb

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")

EVENTS, FILES, CHUNKSIZE = 4000, 2, 250  # 16 chunks of the realistic analysis
TIMEOUTS = {
    "distributed.scheduler.worker-ttl": "5s",
    "distributed.comm.timeouts.connect": "5s",
    "distributed.comm.timeouts.tcp": "15s",
    "cacheaffinity.worker.peer-timeout": "3 s",
}
#: one placement stripe per chunk: two files still spread over four nodes
CONFIG = {**TIMEOUTS, "cacheaffinity.client.stripe-entries": CHUNKSIZE}


@pytest.fixture(scope="module")
def box_ok():
    reason = hb.unavailable_reason()
    if reason:
        skip_or_fail(f"cluster box: {reason}")
    hb.cleanup_stale()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, box_ok):
    """Two generated LZMA NanoAOD-like files (the realistic analysis' branches) and
    ``IterativeExecutor``'s summary of them."""
    from coffea import processor
    from coffea.nanoevents import NanoAODSchema

    sys.path.insert(0, str(hb.REPO))
    from benchmarks._common import make_dataset
    from benchmarks.consecutive_runs import analysis_branches
    from examples.realistic import TTbarLikeProcessor, summary

    d = tmp_path_factory.mktemp("boxdata")
    files = [str(f) for f in make_dataset(d, events=EVENTS, files=FILES, seed=27,
                                          branches=analysis_branches("realistic"), progress=False)]  # fmt: skip
    runner = processor.Runner(executor=processor.IterativeExecutor(), schema=NanoAODSchema, chunksize=CHUNKSIZE)
    out = runner({"synthetic": files}, processor_instance=TTbarLikeProcessor(), treename="Events")
    return files, summary(out)


def figures(name: str, **values) -> None:
    print(f"FIGURES {json.dumps({'test': name, **values})}", flush=True)


def run(box: hb.ClusterBox, files, **kw) -> dict:
    return box.python("--timeout", 150, "run", *files, "--chunksize", CHUNKSIZE, timeout=180, **kw)


def brief(r: dict) -> dict:
    keys = ("wall_s", "chunks", "hit_rate", "hits", "misses", "peer_hits", "peer_failed", "storage_opens")
    return {k: r[k] for k in keys} | {"placed": {n: p.get("placements", 0) for n, p in r["placed"].items()}}


def node_of(nodes: dict, host: str) -> str:
    """The node id of ``host`` (h1 ...) among ``wait``'s or ``run``'s nodes."""
    return next(n for n in nodes if n.startswith(f"{host}-"))


# --------------------------------------------------------------------------- default suite


@pytest.mark.timeout(240)
def test_steady_state_four_hosts(dataset):
    files, reference = dataset
    with hb.ClusterBox(4, dask_config=CONFIG) as box:
        up = box.python("wait", "--workers", 4, timeout=90)
        # each host: its own address, host name and {host} cache directory on its own disk
        assert sorted(w["hostname"] for w in up["workers"].values()) == ["h1", "h2", "h3", "h4"]
        for w in up["workers"].values():
            assert w["host"] == box.addresses[w["hostname"]] and w["name"] == w["hostname"]
        assert len(up["nodes"]) == 4
        for node, d in up["nodes"].items():
            host = node.split("-")[0]  # node ids start with the host name
            assert d["hosts"] == [box.addresses[host]]
            assert d["directory"] == str(box.cache_directory(host))
        # listening only on the box's addresses (dashboards on their namespace's loopback)
        listening = box.listening()
        assert listening["sched"] == [f"{box.addresses['sched']}:8786", "127.0.0.1:8787"]
        for h in box.hosts:
            assert all(a.split(":")[0] in (box.addresses[h], "127.0.0.1") for a in listening[h]), listening
        r1 = run(box, files)
        r2 = run(box, files)
        used = {h: box.disk_usage(h) for h in box.hosts}
    figures("steady_state", run1=brief(r1), run2=brief(r2), disk_used={h: u["size"] - u["free"] for h, u in used.items()})
    assert r1["summary"] == reference and r2["summary"] == reference
    assert r1["chunks"] == r2["chunks"] == 16
    assert r1["misses"] > 0 and r1["storage_opens"] > 0
    assert r2["hit_rate"] >= 0.99, brief(r2)
    assert r2["storage_opens"] == 0, brief(r2)
    assert r2["counters"].get("off-target", 0) == 0
    # every node holds columns on its own disk
    assert all(u["size"] - u["free"] > 0 for u in used.values())


def _read_until(proc: subprocess.Popen, deadline: float, predicate) -> list[str]:
    """Read the portal's stdout lines until ``predicate(line)`` or the deadline."""
    lines = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if predicate(line):
            return lines
    raise AssertionError(f"portal ended or timed out before the condition; output: {lines[-5:]}")


@pytest.mark.timeout(300)
def test_partition_one_host_cut_mid_run(dataset):
    """h2's switch port stops forwarding while run 2 has chunks on h2: its chunks fail over
    and the result is identical, within Dask's timeouts; after the cut is healed, h2's
    worker (restarted by its supervisor after Dask closed it) rejoins with the same node id
    and run 3 reads h2's cache."""
    files, reference = dataset
    with hb.ClusterBox(4, dask_config=CONFIG) as box:
        before = box.python("wait", "--workers", 4, timeout=90)["nodes"]
        r1 = run(box, files)
        h2 = box.addresses["h2"]
        proc = box.python("--timeout", 150, "run", *files, "--chunksize", CHUNKSIZE, "--progress", popen=True)
        try:
            deadline = time.monotonic() + 160

            def h2_busy(line: str) -> bool:
                if not line.startswith("PROGRESS "):
                    return False
                p = json.loads(line[len("PROGRESS "):])
                return p.get("processing", {}).get(h2, 0) > 0 and p.get("memory", 0) > 0

            _read_until(proc, deadline, h2_busy)
            t_cut = box.cut("h2")
            port = box.port_state("h2")
            out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        r2 = hb.parse_result(out, err, proc.returncode, ["run --progress"])
        t_restore = box.restore("h2")
        back = box.python("wait", "--workers", 4, timeout=120)
        t_back = time.time()
        r3 = run(box, files)
        svc = box.services["worker-h2"]
        exits, starts = list(svc.exits), list(svc.starts)
    removed = [m for m in r2["membership"] if m["action"] == "remove-worker" and h2 in (m["worker"] or "")]
    fig = {
        "run1": brief(r1), "run2": brief(r2), "run3": brief(r3),
        "cut_after_run2_start_s": t_cut - r2["start"],
        "h2_removed_after_cut_s": removed[0]["t"] - t_cut if removed else None,
        "run2_end_after_cut_s": r2["end"] - t_cut,
        "h2_worker_exits_after_cut_s": [t - t_cut for t, _ in exits if t > t_cut],
        "h2_rejoined_after_restore_s": t_back - t_restore,
        "h2_worker_starts": len(starts),
        "run3_h2_node": r3["per_node"][node_of(r3["per_node"], "h2")],
    }
    figures("partition", **fig)
    assert "disabled" in port
    assert r1["summary"] == reference and r2["summary"] == reference and r3["summary"] == reference
    assert removed, r2["membership"]  # the scheduler noticed within its timeouts
    assert fig["h2_removed_after_cut_s"] < 30
    assert fig["run2_end_after_cut_s"] < 60  # no hang: bounded by worker-ttl + the redone chunks
    # the same node ids after the cut is healed (h2's from the node-id file on its disk)
    assert set(back["nodes"]) == set(before), (back["nodes"], before)
    # run 3: chunks back on h2, served from h2's cache
    n2 = node_of(r3["per_node"], "h2")
    assert r3["per_node"][n2]["hits"] > 0 and r3["per_node"][n2]["misses"] == 0, r3["per_node"][n2]
    assert r3["hit_rate"] >= 0.99 and r3["storage_opens"] == 0, brief(r3)


@pytest.mark.timeout(120)
def test_teardown_leaves_nothing_even_after_a_failure(box_ok):
    ids = []
    with pytest.raises(RuntimeError, match="on purpose"):
        with hb.ClusterBox(2, dask_config=CONFIG) as box:
            ids.append(box.id)
            box.python("wait", "--workers", 2, timeout=90)
            assert hb.leftovers(box.id)["netns"] and hb.leftovers(box.id)["mounts"]
            pids = [s.pid for s in box.services.values()]
            raise RuntimeError("failing on purpose inside the box")
    assert hb.leftovers(ids[0]) == {"netns": [], "mounts": [], "dirs": []}
    assert not any(hb._pid_alive(p) for p in pids)
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{hb.PREFIX}{ids[0]}" not in netns
    assert f"{hb.PREFIX}{ids[0]}" not in Path("/proc/self/mounts").read_text()


@pytest.mark.timeout(120)
def test_stale_objects_of_a_crashed_run_are_removed(box_ok):
    """A box whose owner died (SIGKILL: no teardown) is removed by the next box's cleanup."""
    code = (
        "import os, signal; from testbed import hosts as hb\n"
        "box = hb.ClusterBox(2, start=False).__enter__()\n"
        "print(box.id, flush=True); os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=hb.REPO, env=hb.ClusterBox(1).env())  # fmt: skip
    box_id = proc.stdout.strip()
    assert box_id and proc.returncode == -9, proc.stderr
    assert hb.leftovers(box_id)["netns"] and hb.leftovers(box_id)["mounts"]
    assert box_id in hb.cleanup_stale()
    assert hb.leftovers(box_id) == {"netns": [], "mounts": [], "dirs": []}
