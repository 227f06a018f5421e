"""dask-jobqueue's SLURMCluster on a real single-node Slurm started by the test.

Two Slurm jobs run one worker each (two cache nodes on one machine: each job's cache
directory is keyed by its Dask worker name); the coffea analysis runs twice with
CacheAffinityExecutor, and between the runs one job is cancelled with ``scancel`` and
resubmitted by the cluster: the job whose node cached the most in run 1, never one chosen
by name (4 files of 1000 entries are 4 placement stripes; with random node ids one of the
two nodes gets none in 12% of cases, and a given one in 6%). The new job (new Slurm job id,
new worker process and address) gets its old worker name, hence its old cache directory and ``node-id``: run 2 must be all hits.

Needs Debian ``slurmctld slurmd slurm-client munge`` and root (skipped otherwise, with the reason).
"""

from __future__ import annotations

import time
from pathlib import Path

import dask
import pytest

from testbed import skip_or_fail
from coffea import processor
from distributed import Client

import cacheaffinity
from cacheaffinity.jobqueue import cache_filesystems, slurm_cluster
from testbed.synthetic import make_dataset
from testbed.slurm import LocalSlurm, missing_requirements
from examples.analysis import DimuonJetProcessor, summary
from helpers import counted, run_coffea

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


@pytest.fixture(scope="module")
def slurm(request):
    reason = missing_requirements()
    if reason:
        skip_or_fail(reason)
    s = LocalSlurm(cpus=2)
    request.addfinalizer(s.stop)
    s.start()
    return s


def wait_for(predicate, what, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


def run(executor, fileset):
    return run_coffea(executor, fileset, DimuonJetProcessor(), 250)


def run_counted(client, fileset):
    ours = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
    return counted(client, lambda: run(ours, fileset))


def _counter(nodes, node, name):
    """Scheduler counter ``name`` of ``node`` in a ``check()["nodes"]`` answer."""
    return ((nodes.get(node) or {}).get("counters") or {}).get(name, 0)


def _brief(per_node, run1, victim, before, after):
    """Each node's lookup counters in run 1 and after run 2, and the scheduler's view of it
    before and after run 2 (an assertion's message: the whole story of a failure)."""
    keys = ("hits", "misses", "peer_hits", "peer_served", "peer_failed")
    seen = ("placing", "uncached", "workers", "counters")
    return {
        "victim": victim,
        **{n: {"dir": Path(s.get("directory") or "").name, "workers": s["workers"],
               "run1": {k: run1.get(n, {}).get(k) for k in keys},
               "now": {k: s.get(k) for k in keys},
               "scheduler before run 2": {k: (before.get(n) or {}).get(k) for k in seen},
               "scheduler after run 2": {k: (after.get(n) or {}).get(k) for k in seen}}
           for n, s in per_node.items()},
    }  # fmt: skip


def workers_by_name(client):
    return {w["name"]: a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}


@pytest.mark.timeout(600)
def test_slurm_cluster_rerun_after_job_restart_is_all_hits(slurm, tmp_path, monkeypatch):
    # sbatch/squeue/scancel (called by dask-jobqueue from this process) use our Slurm
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    # expanded by the job's shell on the node: the cache path is resolved where the job runs
    monkeypatch.setenv("CA_TEST_NODE_DISK", str(tmp_path / "node-disk"))
    files = make_dataset(
        tmp_path / "data", events=4000, files=4, codec="zlib", seed=11,
        branches=["Muon_*", "Jet_*", "nMuon", "nJet"],
    )  # fmt: skip
    fileset = {"gen": [str(f) for f in files]}  # 16 chunks of 250 events
    reference = summary(run(processor.IterativeExecutor(), fileset))

    config = {
        # run 2 must be all hits: no stealing moves a chunk off its node (tested elsewhere)
        "cacheaffinity.scheduler.stealing.enabled": False,
        # notice the cancelled job quickly (default 15 s) so that scale() resubmits it
        "distributed.deploy.lost-worker-timeout": "1s",
    }
    with dask.config.set(config):
        cluster = slurm_cluster(
            cores=1, processes=1, memory="1 GiB", walltime="00:15:00", queue=slurm.partition,
            cache_directory="$CA_TEST_NODE_DISK/{name}", cache_capacity="1 GiB",
            interface="lo",  # scheduler, workers and nannies on 127.0.0.1
            scheduler_options={"dashboard_address": "127.0.0.1:0"},
            # (a worker's HTTP server binds every interface unless told, even with --no-dashboard)
            worker_extra_args=["--dashboard-address", "127.0.0.1:0"],
            job_script_prologue=[f"export PYTHONPATH={REPO}", f"cd {tmp_path}"],
            local_directory=str(tmp_path / "worker-space"),
            log_directory=str(tmp_path / "slurm-logs"),
        )  # fmt: skip
        with cluster, Client(cluster) as client:
            assert "cacheaffinity" in cluster.scheduler.plugins
            cluster.scale(jobs=2)
            client.wait_for_workers(2, timeout=180)
            wait_for(lambda: len(cacheaffinity.check(client)["nodes"]) == 2, "2 cache nodes", 60)
            names = workers_by_name(client)
            assert len(names) == 2
            # every worker runs in a Slurm job and caches on "node-local" disk
            job_ids = {n: j.job_id for n, j in cluster.workers.items()}
            assert all(job_ids.values()) and {s["id"] for s in slurm.jobs()} == set(job_ids.values())
            fs = cache_filesystems(client)
            assert not any(f["shared"] for f in fs.values()), fs
            node_of_name = {
                n: (tmp_path / "node-disk" / n / "node-id").read_text().strip() for n in names
            }
            assert {f["node"] for f in fs.values()} == set(node_of_name.values())

            out1, d1 = run_counted(client, fileset)
            run1 = cacheaffinity.cache_stats(client)

            # the batch system ends one job; the cluster resubmits it under its old name.
            # The victim is the node that stored the most in run 1: node ids are random, and
            # the 4 stripes can all go to one node (a restart of the other proves nothing;
            # CI once cancelled such a job, chosen by name)
            victim = max(names, key=lambda n: (run1[node_of_name[n]].get("misses", 0), n))
            old_address, old_job = names[victim], job_ids[victim]
            slurm.run("scancel", old_job)
            wait_for(lambda: victim not in workers_by_name(client), "the worker to leave", 120)
            wait_for(lambda: victim not in cluster.workers, "the cluster to drop the job", 60)
            cluster.scale(jobs=2)
            client.wait_for_workers(2, timeout=180)
            new_names = wait_for(
                lambda: (w := workers_by_name(client)).keys() == names.keys() and w, "restart", 60
            )
            new_job = cluster.workers[victim].job_id
            wait_for(lambda: len(cacheaffinity.check(client)["nodes"]) == 2, "2 cache nodes", 60)
            nodes = cacheaffinity.check(client)["nodes"]

            out2, d2 = run_counted(client, fileset)
            per_node = cacheaffinity.cache_stats(client)
            after = cacheaffinity.check(client)["nodes"]

    assert summary(out1) == reference
    assert summary(out2) == reference
    assert d1["misses"] > 0 and d1["storage_bytes"] > 0
    assert run1[node_of_name[victim]]["misses"] > 0, run1  # the victim cached chunks in run 1
    # a new job, a new worker process, the same cache node
    assert new_job != old_job
    assert new_names[victim] != old_address
    assert set(nodes) == set(node_of_name.values())
    assert nodes[node_of_name[victim]]["workers"] == [new_names[victim]]
    # run 2: 100% hits, nothing from storage, and the restarted node served its chunks
    assert d2["hits"] > 0 and d2["hits"] / (d2["hits"] + d2["misses"]) == 1.0, d2
    assert d2["storage_opens"] == 0 and d2["storage_bytes"] == 0, d2
    restarted = per_node[node_of_name[victim]]
    why = _brief(per_node, run1, victim, nodes, after)
    # the scheduler placed chunks on the restarted node, they ran there, and hit its cache
    placed = {n: _counter(after, n, "placements") - _counter(nodes, n, "placements") for n in after}
    assert placed[node_of_name[victim]] > 0, why
    assert restarted["hits"] > 0 and restarted["misses"] == 0, why
