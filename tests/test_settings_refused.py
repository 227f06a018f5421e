"""One rule for bad settings, and every documented spelling of the worker options,
with real ``dask scheduler``/``dask worker`` processes on 127.0.0.1.

A process given an invalid ``cacheaffinity`` setting (environment, yaml or
command line) exits non-zero before doing any work, with one line naming the
key, and no traceback; an in-process cluster raises in the caller within seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import dask
import pytest
from distributed import Client, LocalCluster

BIN = Path(sys.executable).parent
WORKER = ("--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0", "--nthreads", "1")
SCHEDULER = ("--host", "127.0.0.1", "--port", "0", "--dashboard-address", "127.0.0.1:0")


def _run(args, env=None, timeout=60):
    """Run ``dask ARGS`` to its end (killed after ``timeout`` s: a test failure)."""
    start = time.monotonic()
    r = subprocess.run(
        [str(BIN / "dask"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, **(env or {})),
    )
    return r, time.monotonic() - start


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sched")
    sched_file = tmp / "scheduler.json"
    log = open(tmp / "scheduler.log", "w")
    p = subprocess.Popen(
        [str(BIN / "dask"), "scheduler", *SCHEDULER, "--scheduler-file", str(sched_file),
         "--preload", "cacheaffinity"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        try:
            address = json.loads(sched_file.read_text())["address"]
            break
        except (FileNotFoundError, ValueError, KeyError):
            assert p.poll() is None and time.monotonic() < deadline, "no scheduler"
            time.sleep(0.1)
    yield {"file": str(sched_file), "address": address}
    p.terminate()
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    log.close()


# ====================================================================== bad settings
@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "env, options, words",
    [
        pytest.param({"DASK_CACHEAFFINITY__SCHEDULER__DIMENSIONS": "0"}, (),
                     "cacheaffinity.scheduler.dimensions=0 must be >= 1", id="dimensions-env"),
        pytest.param({"DASK_CACHEAFFINITY__SCHEDULER__BALANCE": "0.5"}, (),
                     "cacheaffinity.scheduler.balance=0.5 must be > 1", id="balance-env"),
        pytest.param({"DASK_CACHEAFFINITY__SCHEDULER__STEALING__ENABLED": "sometimes"}, (),
                     "cacheaffinity.scheduler.stealing.enabled='sometimes' must be true or false",
                     id="stealing-env"),
        pytest.param({}, ("--balance", "0.5"),
                     "Invalid value for '--balance': cacheaffinity.scheduler.balance=0.5 must be > 1",
                     id="balance-option"),
        pytest.param({"DASK_CACHEAFFINITY__SCHEDULER__LOCATOR_SIZE": "-1"}, (),
                     "cacheaffinity.scheduler.locator-size=-1 must be >= 0", id="locator-size-env"),
    ],
)  # fmt: skip
def test_bad_scheduler_setting_exits_with_one_line(env, options, words):
    r, seconds = _run(["scheduler", *SCHEDULER, "--preload", "cacheaffinity", *options], env)
    assert r.returncode != 0, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert (r.stderr + r.stdout).count(words) == 1, r.stderr
    assert seconds < 30


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "env, options, words",
    [
        pytest.param({"DASK_CACHEAFFINITY__WORKER__MEMORY": "-1 GiB"}, ("--nanny",),
                     "cacheaffinity.worker.memory='-1 GiB' must be >= 0", id="memory-env-nanny"),
        pytest.param({"DASK_CACHEAFFINITY__WORKER__CAPACITY": "lots"}, ("--no-nanny",),
                     "cacheaffinity.worker.capacity='lots' is not a size", id="capacity-env"),
        pytest.param({"DASK_CACHEAFFINITY__WORKER__CAPACTY": "1 GiB"}, ("--no-nanny",),
                     "cacheaffinity.worker.capacty='1 GiB' is not a setting", id="typo-env"),
        pytest.param({}, ("--no-nanny", "--node-weight", "0"),
                     "Invalid value for '--node-weight': cacheaffinity.worker.weight=0.0 must be > 0",
                     id="weight-option"),
        pytest.param({"DASK_CACHEAFFINITY__WORKER__SHARED_GROUP": "no-such-group-25"},
                     ("--no-nanny",), "shared-group='no-such-group-25' is not a Unix group",
                     id="group-env"),  # checked on the worker itself, not at parse time
        pytest.param({"CONFIG": "worker:\n  peer-timeout: never\n"}, ("--nanny",),
                     "cacheaffinity.worker.peer-timeout='never' is not a duration", id="yaml"),
        pytest.param({"DASK_CACHEAFFINITY__WORKER__CAPACITY": "lots",
                      "PRELOAD": "cacheaffinity.preload"}, ("--no-nanny",),
                     "cacheaffinity.worker.capacity='lots' is not a size", id="click-free-preload"),
    ],
)  # fmt: skip
def test_bad_worker_setting_exits_with_one_line(scheduler, tmp_path, env, options, words):
    env = dict(env)
    if "CONFIG" in env:
        (tmp_path / "conf").mkdir()
        (tmp_path / "conf" / "ca.yaml").write_text(
            "cacheaffinity:\n" + "".join("  " + line + "\n" for line in env.pop("CONFIG").splitlines())
        )
        env["DASK_CONFIG"] = str(tmp_path / "conf")
    preload = env.pop("PRELOAD", "cacheaffinity")
    directory = tmp_path / "cache"
    if preload == "cacheaffinity":
        where = ("--preload", preload, f"--cache-directory={directory}")
    else:
        where = ("--preload", preload)
        env["DASK_CACHEAFFINITY__WORKER__DIRECTORY"] = str(directory)
    r, seconds = _run(["worker", "--scheduler-file", scheduler["file"], *WORKER, *where, *options], env)
    out = r.stderr + r.stdout
    assert r.returncode != 0, out
    assert "Traceback" not in out, out
    assert out.count(words) == 1, out
    assert seconds < 30
    assert not directory.exists()  # it did not start uncached either


# ====================================================================== six spellings
def _spelling(scheduler, directory, case):
    file = ("--scheduler-file", scheduler["file"])
    address = (scheduler["address"],)
    d = str(directory)
    return {
        "file-space-no-nanny": (*file, "--no-nanny", "--preload", "cacheaffinity", "--cache-directory", d),
        "file-equals-no-nanny": (*file, "--no-nanny", "--preload", "cacheaffinity", f"--cache-directory={d}"),
        "file-equals-nanny-capacity": (*file, "--nanny", "--preload", "cacheaffinity",
                                       f"--cache-directory={d}", "--cache-capacity=96MiB"),
        "file-space-nanny-capacity": (*file, "--nanny", "--preload", "cacheaffinity",
                                      "--cache-directory", d, "--cache-capacity", "96MiB"),
        "address-space-nanny": (*address, "--nanny", "--preload", "cacheaffinity", "--cache-directory", d,
                                "--cache-capacity", "96MiB"),
        "address-equals-no-nanny": (*address, "--no-nanny", "--preload", "cacheaffinity",
                                    f"--cache-directory={d}", "--cache-capacity=96MiB"),
    }[case]  # fmt: skip


def _env_with_tests():
    # the worker imports this module to run _plugin_settings
    path = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path)


def _plugin_settings(dask_worker):
    p = dask_worker.plugins["cacheaffinity"]
    return {"directory": p.directory, "capacity": p.capacity, "node": p.node_id}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "case",
    [
        "file-space-no-nanny",
        "file-equals-no-nanny",
        "file-equals-nanny-capacity",
        "file-space-nanny-capacity",
        "address-space-nanny",
        "address-equals-no-nanny",
    ],
)
def test_every_documented_spelling_uses_its_directory(scheduler, tmp_path, case):
    directory = tmp_path / "node"
    name = f"spelling-{case}"
    log = open(tmp_path / "worker.log", "w")
    p = subprocess.Popen(
        [str(BIN / "dask"), "worker", *_spelling(scheduler, directory, case), *WORKER, "--name", name],
        stdout=log, stderr=subprocess.STDOUT, env=_env_with_tests(),
    )  # fmt: skip
    try:
        with Client(scheduler["address"], timeout=30) as client:
            deadline = time.monotonic() + 30
            while not any(w["name"] == name for w in client.scheduler_info()["workers"].values()):
                assert p.poll() is None, (tmp_path / "worker.log").read_text()
                assert time.monotonic() < deadline, "the worker never joined"
                time.sleep(0.1)
            addr = next(a for a, w in client.scheduler_info()["workers"].items() if w["name"] == name)
            got = client.run(_plugin_settings, workers=[addr])[addr]
        assert got["directory"] == str(directory)
        assert (directory / "node-id").read_text().strip() == got["node"]
        if "capacity" in case or case == "address-space-nanny":
            assert got["capacity"] == 96 * 2**20
        text = (tmp_path / "worker.log").read_text()
        assert "Traceback" not in text
        assert text.count(f"cacheaffinity worker cache: node {got['node']}, directory {directory}") == 1
    finally:
        p.terminate()
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()


@pytest.mark.timeout(60)
def test_a_stray_argument_is_a_usage_error(scheduler, tmp_path):
    """An address after ``--preload`` (the docs say: before) is refused in one line."""
    r, seconds = _run(
        ["worker", *WORKER, "--no-nanny", "--preload", "cacheaffinity",
         "--cache-directory", str(tmp_path / "x"), scheduler["address"]]
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.count("unexpected argument") == 1
    assert seconds < 30


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "role, args, error",
    [
        ("scheduler", (*SCHEDULER, "--preload", "cacheaffinity", "--cache-capasity", "1"),
         "Error: No such option '--cache-capasity'"),
        ("worker", ("tcp://127.0.0.1:1", *WORKER, "--no-nanny", "--preload", "cacheaffinity",
                    "--cache-capacity", "lots"),
         "Error: Invalid value for '--cache-capacity'"),
        # no positional address: Dask's parser takes the mistyped option as the address
        ("worker", ("--scheduler-file", "/nonexistent/scheduler.json", *WORKER, "--preload",
                    "cacheaffinity", "--cache-capasity", "1"),
         "Error: No such option '--cache-capasity'"),
        ("worker", (*WORKER, "--no-nanny", "--preload", "cacheaffinity", "--bogus=1"),
         "Error: No such option '--bogus'"),
    ],
)  # fmt: skip
def test_a_usage_error_names_the_program(role, args, error):
    """A click error of the preload's options names the command line it belongs to and
    lists the preload's options (distributed parses them in an unnamed click context)."""
    r, seconds = _run([role, *args])
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    usage = [line for line in lines if line.startswith("Usage:")]
    assert usage == [f"Usage: dask {role} --preload cacheaffinity [OPTIONS]"], r.stderr
    options = lines[lines.index(usage[0]) + 1]
    assert options.startswith("Options: --cache-directory --cache-capacity"), r.stderr
    assert "--balance" in options
    assert lines[lines.index(usage[0]) + 2] == "Described by: cacheaffinity preload-options", r.stderr
    assert "Try '" not in r.stderr and "Usage:  " not in r.stderr
    assert sum(line.startswith(error) for line in lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert seconds < 30


# ====================================================================== in-process
@pytest.mark.timeout(60)
def test_in_process_cluster_raises_in_the_caller(tmp_path):
    start = time.monotonic()
    settings = {
        "distributed.worker.preload": ["cacheaffinity"],
        "cacheaffinity.worker.memory": "-1 GiB",
        "cacheaffinity.worker.directory": str(tmp_path / "cache"),
    }
    with dask.config.set(settings), pytest.raises(RuntimeError) as info:
        with LocalCluster(n_workers=1, processes=False, dashboard_address=":0"):
            pass
    assert "cacheaffinity.worker.memory='-1 GiB' must be >= 0" in str(info.value.__cause__)
    assert time.monotonic() - start < 20
    assert not (tmp_path / "cache").exists()
    # the caller's process and its event loops still work
    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster:
        with Client(cluster) as client:
            assert client.submit(lambda: 1).result(timeout=10) == 1
