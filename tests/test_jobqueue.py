"""The dask-jobqueue recipes without a batch system: generated job scripts, run for real.

The SLURM job script is run with bash and the HTCondor job's command with ``/bin/sh -c``
(what condor_starter runs for ``Executable = /bin/sh``, after decoding the submit file's
``Arguments``): each starts a real dask worker that joins the recipe's scheduler as a cache node
in the directory the job's shell expanded. The Slurm daemons themselves are in test_slurm.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from distributed import Client

import cacheaffinity
from cacheaffinity.filesystems import NETWORK_FILESYSTEMS, filesystem_of
from cacheaffinity.jobqueue import (
    cluster_kwargs,
    htcondor_cluster,
    scheduler_options,
    slurm_cluster,
    worker_extra_args,
)

import dask_jobqueue  # noqa: E402,F401  (test extra: pip install -e ".[test]")

LOCAL = {
    "interface": "lo",
    "scheduler_options": {"dashboard_address": "127.0.0.1:0"},
    "worker_extra_args": ["--dashboard-address", "127.0.0.1:0"],
}


def condor_argv(arguments: str) -> list[str]:
    """Decode an HTCondor submit-file ``Arguments = "..."`` value ("new" syntax: whitespace
    separates, '...' groups, '' is a literal ', "" a literal ")."""
    assert arguments.startswith('"') and arguments.endswith('"'), arguments
    s = arguments[1:-1].replace('""', '"')
    out, cur, quoted, i, have = [], "", False, 0, False
    while i < len(s):
        c = s[i]
        if c == "'":
            if quoted and s[i + 1 : i + 2] == "'":
                cur += "'"
                i += 2
                continue
            quoted, have = not quoted, True
        elif c.isspace() and not quoted:
            if cur or have:
                out.append(cur)
            cur, have = "", False
        else:
            cur += c
        i += 1
    if cur or have:
        out.append(cur)
    return out


def job_command(kind: str, script: str) -> list[str]:
    """The command the batch system runs for this job script."""
    if kind == "slurm":
        assert script.startswith("#!/usr/bin/env bash\n")
        return ["bash", "-c", script]
    args = re.search(r"^Arguments = (.*)$", script, re.MULTILINE).group(1)
    assert re.search(r"^Executable = /bin/sh$", script, re.MULTILINE)
    return ["/bin/sh", *condor_argv(args)]


def make_cluster(kind: str, **kwargs):
    kwargs = {**LOCAL, "cores": 1, "processes": 1, "memory": "1 GiB", **kwargs}
    if kind == "htcondor":
        return htcondor_cluster(disk="1 GiB", **kwargs)
    return slurm_cluster(**kwargs)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("kind", ["slurm", "htcondor"])
def test_job_script_starts_a_cache_node_where_the_job_runs(kind, tmp_path):
    env = dict(os.environ, CA_NODE_SCRATCH=str(tmp_path / "scratch"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent.parent), env.get("PYTHONPATH")]))
    with make_cluster(
        kind, cache_directory="$CA_NODE_SCRATCH/cache dir", cache_capacity="1 GiB",
        job_script_prologue=[f"cd {tmp_path}"],
    ) as cluster:  # fmt: skip
        # the scheduler (in this process) runs the placement plugin: no preload to miss
        assert isinstance(cluster.scheduler.plugins["cacheaffinity"], cacheaffinity.CacheAffinityPlugin)
        script = cluster.job_script()
        # the variable is left for the node's shell, the path stays one argument
        assert '--preload cacheaffinity --cache-directory "$CA_NODE_SCRATCH/cache dir" ' in (
            script.replace('""', '"')
        )
        assert "--cache-capacity 1073741824" in script
        if kind == "slurm":
            assert "#SBATCH --mem=1G" in script and "#SBATCH --cpus-per-task=1" in script
        else:
            assert "RequestCpus = MY.DaskWorkerCores" in script
            assert f"cd {tmp_path}; " in script  # the prologue runs in the same shell
        # no batch system needed for the script, and none was called
        assert not cluster.workers

        p = subprocess.Popen(
            job_command(kind, script), env=env, cwd=tmp_path, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "worker.log", "w"),
        )  # fmt: skip
        try:
            with Client(cluster) as client:
                client.wait_for_workers(1, timeout=240)
                deadline = time.monotonic() + 60
                while not cacheaffinity.check(client)["nodes"] and time.monotonic() < deadline:
                    time.sleep(0.2)
                nodes = cacheaffinity.check(client)["nodes"]
                fs = cacheaffinity.jobqueue.cache_filesystems(client)
        finally:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    directory = tmp_path / "scratch" / "cache dir"
    node_id = (directory / "node-id").read_text().strip()
    assert list(nodes) == [node_id], (tmp_path / "worker.log").read_text()[-3000:]
    (info,) = fs.values()
    assert info["path"] == str(directory) and info["node"] == node_id and not info["shared"]


def test_scheduler_options_keep_other_preloads_and_pass_balance():
    opts = scheduler_options(
        {"preload": "mymodule", "preload_argv": ["--x", "1"], "port": 0}, balance=1.1
    )
    assert opts["preload"] == ["mymodule", "cacheaffinity"]
    assert opts["preload_argv"] == [["--x", "1"], ["--balance", "1.1"]]
    assert opts["port"] == 0
    # idempotent: cacheaffinity once
    again = scheduler_options(opts)
    assert again["preload"].count("cacheaffinity") == 1


def test_balance_reaches_the_scheduler_plugin():
    with make_cluster("slurm", balance=1.25) as cluster:
        plugin = cluster.scheduler.plugins["cacheaffinity"]
        assert plugin.info()["placement"]["balance"] == 1.25


def test_dask_jobqueue_config_still_applies():
    import dask

    with dask.config.set(
        {
            "jobqueue.slurm.worker-extra-args": ["--lifetime", "55m"],
            "jobqueue.slurm.scheduler-options": {"dashboard_address": "127.0.0.1:0"},
        }
    ):
        kw = {k: v for k, v in LOCAL.items() if k == "interface"}
        with slurm_cluster(cores=1, memory="1 GiB", **kw) as cluster:
            script = cluster.job_script()
            assert "--lifetime 55m --preload cacheaffinity --cache-directory" in script
            assert "cacheaffinity" in cluster.scheduler.plugins
            # the config's dashboard address (the default, ":8787", binds every interface)
            bound = {s.getsockname()[0] for s in cluster.scheduler.http_server._sockets.values()}
            assert bound == {"127.0.0.1"}


def test_user_worker_args_come_first_and_defaults_are_node_local():
    kw = cluster_kwargs(cores=4, memory="8 GiB", worker_extra_args=["--lifetime", "55m"])
    args = kw["worker_extra_args"]
    assert args[:2] == ["--lifetime", "55m"]
    assert args[2:4] == ["--preload", "cacheaffinity"]  # the preload takes the rest
    d = args[args.index("--cache-directory") + 1]
    assert re.fullmatch(r'"/tmp/cacheaffinity-[^/"]+"', d)
    assert kw["cores"] == 4 and kw["scheduler_options"]["preload"] == ["cacheaffinity"]
    assert worker_extra_args("/scratch/x", node_weight=2, cache_memory="64 MiB")[-4:] == [
        "--cache-memory", str(64 * 2**20), "--node-weight", "2.0",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "directory, match",
    [
        ("cache", "is relative"),
        ("./cache", "is relative"),
        ("~/cache", "home directory"),
        ("", "is empty"),
        ('/scratch/"x"', "cannot be passed safely"),
        ("/scratch/$(whoami)", "cannot be passed safely"),
        ("/scratch/`whoami`", "cannot be passed safely"),
        (42, "must be a path string"),
        ("/scratch/$SLURM_JOB_ID/ca", "contains $SLURM_JOB_ID, which changes with every job"),
        ("/scratch/${SLURM_JOBID}/ca", "contains $SLURM_JOBID, which changes with every job"),
        ("$SLURM_TMPDIR/ca", "contains $SLURM_TMPDIR, which changes with every job"),
        ("/tmp/ca-$PBS_JOBID", "contains $PBS_JOBID, which changes with every job"),
    ],
)
def test_bad_cache_directory_is_refused_with_the_fix(directory, match):
    with pytest.raises((ValueError, TypeError), match=re.escape(match)) as e:
        cluster_kwargs(cores=1, memory="1 GiB", cache_directory=directory)
    if isinstance(e.value, ValueError) and directory != "":
        assert "/scratch" in str(e.value) or "plain path" in str(e.value)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"cache_capacity": "lots"}, "cache_capacity='lots' is not a size"),
        ({"cache_capacity": 0}, "must be > 0"),
        ({"node_weight": 0}, "node_weight=0 must be a finite number > 0"),
        ({"balance": 0.9}, "balance=0.9 must be a number > 1"),
        ({"worker_extra_args": ["--cache-directory=/x"]}, "pass cache_directory="),
        ({"worker_extra_args": ["--preload", "other"]}, "adds the preload"),
    ],
)
def test_bad_options_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        cluster_kwargs(cores=1, memory="1 GiB", **kwargs)


def test_slurm_cluster_refuses_a_per_job_directory_in_one_line():
    """The documented mistake, through the public recipe (no job is submitted)."""
    with pytest.raises(ValueError) as e:
        slurm_cluster(cores=1, memory="1 GiB", cache_directory="/scratch/$SLURM_JOB_ID/ca")
    message = str(e.value)
    assert "\n" not in message and "$SLURM_JOB_ID" in message
    assert "new cache node" in message and '"/scratch/$USER/cacheaffinity"' in message
    # a variable that does not change per job stays allowed
    cluster_kwargs(cores=1, memory="1 GiB", cache_directory="$LOCAL_SCRATCH/$USER/ca")


def test_htcondor_refuses_the_job_scratch_directory():
    for d in ("$TMPDIR/cache", "${_CONDOR_SCRATCH_DIR}/cache"):
        with pytest.raises(ValueError, match="deletes when the job ends"):
            htcondor_cluster(cores=1, memory="1 GiB", disk="1 GiB", cache_directory=d)


def test_shared_filesystem_detection(tmp_path):
    mounts = [("/", "ext4"), ("/home", "nfs4"), ("/scratch", "xfs"), ("/home/lab", "lustre")]
    assert filesystem_of("/home/alice/cache", mounts)["fstype"] == "nfs4"
    assert filesystem_of("/home/lab/c", mounts) | {"path": ""} == {
        "path": "", "mount": "/home/lab", "fstype": "lustre", "shared": True,
    }  # fmt: skip
    assert filesystem_of("/homework/c", mounts)["shared"] is False  # prefix of a name, not a dir
    assert filesystem_of("/scratch/alice", mounts)["shared"] is False
    here = filesystem_of(tmp_path / "not" / "yet")  # this machine's real mount table
    assert here["fstype"] != "unknown" and not here["shared"]


def test_shared_filesystem_here_is_refused_unless_allowed(tmp_path):
    # /proc is no network file system, but we can check the refusal path with a real shared
    # mount only where one exists; otherwise check that allow_shared_filesystem is honoured
    shared = next(
        (m for m, t in _mounts() if t in NETWORK_FILESYSTEMS), None
    )
    if shared is not None:
        with pytest.raises(ValueError, match="shared between machines"):
            cluster_kwargs(cores=1, memory="1 GiB", cache_directory=f"{shared}/cache")
        cluster_kwargs(
            cores=1, memory="1 GiB", cache_directory=f"{shared}/cache", allow_shared_filesystem=True
        )
    # a local path passes, and a variable path cannot be judged here (the node decides)
    cluster_kwargs(cores=1, memory="1 GiB", cache_directory=str(tmp_path / "c"))
    cluster_kwargs(cores=1, memory="1 GiB", cache_directory="$LOCAL_SCRATCH/c")


def _mounts():
    from cacheaffinity.filesystems import _mounts

    return _mounts()


def test_missing_dask_jobqueue_names_the_extra():
    code = (
        "import sys; sys.modules['dask_jobqueue'] = None\n"
        "from cacheaffinity.jobqueue import slurm_cluster\n"
        "try:\n    slurm_cluster(cores=1, memory='1 GiB')\n"
        "except ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300)
    assert "pip install dask-jobqueue" in out.stdout, out.stderr
