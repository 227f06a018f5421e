"""cacheaffinity on a real dask-gateway: click-free preload, cache keyed by host.

Starts ``dask-gateway-server`` (local backend: schedulers and workers are
subprocesses of the gateway, TLS between them, the gateway's own proxy) on
127.0.0.1 with a ``dask_gateway_config.py`` that calls
:func:`cacheaffinity.gateway.configure`, creates a cluster through
``dask_gateway.Gateway``, scales it to 2 workers and runs the same coffea
analysis twice with :class:`cacheaffinity.CacheAffinityExecutor`.
"""

from __future__ import annotations

import gc
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import dask
import pytest

import cacheaffinity
import cacheaffinity.gateway

from dask_gateway import Gateway  # a test dependency (pyproject's test extra): never skipped

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def gateway_server(tmp_path):
    """A running dask-gateway-server on 127.0.0.1; yields (address, caches root, log)."""
    api, http, tcp = _free_ports(3)
    caches = tmp_path / "node-disk"
    config = tmp_path / "dask_gateway_config.py"
    config.write_text(
        "import cacheaffinity.gateway\n"
        f"c.DaskGateway.address = '127.0.0.1:{api}'\n"
        f"c.Proxy.address = '127.0.0.1:{http}'\n"
        f"c.Proxy.tcp_address = '127.0.0.1:{tcp}'\n"
        "c.DaskGateway.backend_class = 'dask_gateway_server.backends.local.UnsafeLocalBackend'\n"
        f"c.LocalBackend.clusters_directory = {str(tmp_path / 'clusters')!r}\n"
        "c.ClusterConfig.worker_threads = 1\n"
        "c.ClusterConfig.worker_cores = 1\n"
        "c.ClusterConfig.worker_memory = '1 G'\n"
        "c.ClusterConfig.idle_timeout = 0\n"
        "c.ClusterConfig.environment = {'DASK_CACHEAFFINITY__SCHEDULER__STEALING__ENABLED': 'False'}\n"
        "cacheaffinity.gateway.configure(\n"
        f"    c, dask_command=[{str(BIN / 'dask')!r}], worker_options=['--host', '127.0.0.1'],\n"
        f"    directory={str(caches / 'cacheaffinity-{host}')!r}, capacity='2 GiB',\n"
        ")\n"
    )
    log = tmp_path / "gateway.log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "dask-gateway-server"), "-f", str(config)],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def healthy():
        assert proc.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/api/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        _wait_for(healthy, 60, "dask-gateway-server to answer /api/health")
        yield f"http://127.0.0.1:{http}", f"tls://127.0.0.1:{tcp}", caches, log
    finally:
        proc.terminate()  # SIGTERM: the gateway stops its clusters and its proxy
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            raise
    assert proc.returncode in (0, -15), log.read_text()[-3000:]




def _counts(client):
    t = cacheaffinity.cache_totals(client)
    return t.get("hits", 0), t.get("misses", 0)


@pytest.mark.timeout(300)
def test_gateway_cluster_runs_cacheaffinity_and_hits_on_rerun(gateway_server, nanoaod_dir):
    _gateway_cluster_runs_cacheaffinity(gateway_server, nanoaod_dir)
    # The clients, executors and clusters above are in reference cycles: collect them now,
    # so that dask_gateway's Gateway.__del__ (made harmless by
    # cacheaffinity.gateway.quiet_double_close) runs here and not inside another test.
    gc.collect()


def _gateway_cluster_runs_cacheaffinity(gateway_server, nanoaod_dir):
    from coffea import processor
    from coffea.nanoevents import NanoAODSchema

    from examples.analysis import DimuonJetProcessor, summary

    address, proxy, caches, log = gateway_server
    # Another test of the suite may have replaced the Dask config wholesale after
    # dask_gateway registered its defaults (KeyError: 'gateway' in Gateway()).
    cacheaffinity.gateway.ensure_gateway_defaults()
    assert dask.config.get("gateway.public-address", "missing") != "missing"
    with Gateway(address=address, proxy_address=proxy, auth="basic") as gateway:
        cluster = cacheaffinity.gateway.new_cluster(workers=2, gateway=gateway)
        try:
            client = cluster.get_client(set_as_default=False)
            info = cacheaffinity.check(client)  # the plugin runs next to the gateway's preload
            assert info["placement"]["dimensions"] >= 1

            # the scheduler's preloads: the gateway's click one and ours
            preloads = client.run_on_scheduler(
                lambda dask_scheduler: [p.name for p in dask_scheduler.preloads]
            )
            assert "dask_gateway.scheduler_preload" in preloads, preloads
            assert cacheaffinity.gateway.PRELOAD in preloads, preloads

            # everything the gateway started listens on 127.0.0.1 only
            # (dashboards: the gateway passes --dashboard-address 127.0.0.1:0 itself)
            def listening(dask_worker=None, dask_scheduler=None):
                return [lst.listen_address for lst in (dask_worker or dask_scheduler).listeners]

            addresses = [
                *client.run_on_scheduler(listening),
                *(a for v in client.run(listening).values() for a in v),
            ]
            assert addresses and all("//127.0.0.1:" in a for a in addresses), addresses

            # random worker names, one cache directory keyed by host
            names = [w["name"] for w in client.scheduler_info()["workers"].values()]
            assert len(names) == 2 and all(re.fullmatch("[0-9a-f]{32}", str(n)) for n in names), names
            dirs = client.run(lambda dask_worker: dask_worker.plugins["cacheaffinity"].directory)
            assert set(dirs.values()) == {
                str(caches / f"cacheaffinity-{socket.gethostname()}")
            }, dirs

            # the dashboard page is listed for JupyterLab's Dask panel, through the proxy
            link = cluster.dashboard_link.rsplit("/status", 1)[0]
            with urllib.request.urlopen(f"{link}/individual-plots.json", timeout=30) as r:
                plots = json.loads(r.read())
            assert plots.get("Individual Cache Affinity") == "/individual-cache-affinity", plots
            with urllib.request.urlopen(f"{link}/individual-cache-affinity", timeout=60) as r:
                page = r.read().decode()
            assert "embed_document" in page and "Dask: Cache Affinity" in page

            fileset = {
                "dy": [str(nanoaod_dir / "nano_dy.root")],
                "dimuon": [str(nanoaod_dir / "nano_dimuon.root")],
            }
            results, counts = [], []
            for _ in range(2):
                executor = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
                runner = processor.Runner(
                    executor=executor, schema=NanoAODSchema, chunksize=10,
                    metadata_cache={},
                )
                before = _counts(client)
                out = runner(fileset, processor_instance=DimuonJetProcessor(), treename="Events")
                after = _counts(client)
                results.append(summary(out))
                counts.append((after[0] - before[0], after[1] - before[1]))
            (h1, m1), (h2, m2) = counts
            assert m1 > 0, counts  # run 1 read and stored the columns
            assert h2 >= 0.99 * (h2 + m2) and h2 > 0, counts
            assert results[0] == results[1]
            assert results[0]["dy"]["entries"] > 0
            client.close()
        finally:
            cluster.shutdown()
        assert not gateway.list_clusters()


@pytest.mark.timeout(900)
def test_portal_notebook_on_the_gateway(gateway_server, monkeypatch):
    """examples/portal.ipynb with a gateway configured (as a portal sets it) takes the
    gateway path: a gateway cluster, run 2 from the caches, results identical."""
    from test_notebooks import outputs, run_notebook

    address, proxy, caches, log = gateway_server
    monkeypatch.setenv("DASK_GATEWAY__ADDRESS", address)
    monkeypatch.setenv("DASK_GATEWAY__PROXY_ADDRESS", proxy)
    monkeypatch.setenv("DASK_GATEWAY__AUTH__TYPE", "basic")
    nb = run_notebook(
        REPO / "examples" / "portal.ipynb",
        timeout=600,
        parameters={"SCHEDULER": "", "EVENTS": 2000, "WORKERS": 2},
    )
    text = "".join(o.get("text", "") for o in outputs(nb, "stream") if o.get("name") == "stdout")
    assert "results of run 1 and run 2 identical: True" in text, text[-2000:]
    assert "ok" in text.splitlines(), text[-2000:]
    assert f"cache {caches / ('cacheaffinity-' + socket.gethostname())}" in text, text[-2000:]
    # the notebook's scheduler was the gateway's (behind the gateway's proxy)
    assert "on gateway://127.0.0.1:" in text, text[-2000:]
    stderr = "".join(o.get("text", "") for o in outputs(nb, "stream") if o.get("name") == "stderr")
    assert "Missing cross-reference" not in stderr


def _python(code: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.mark.timeout(300)
def test_a_process_using_the_gateway_prints_no_traceback(gateway_server):
    """dask-gateway's Gateway.__del__ closes a closed gateway again: with distributed 2026.8
    that printed "Exception ignored in: <function Gateway.__del__>" and a traceback on
    stderr of every process that used a gateway cluster."""
    address, proxy, caches, log = gateway_server
    code = (
        "import gc\n"
        "import cacheaffinity.gateway\n"
        "from dask_gateway import Gateway\n"
        f"gateway = Gateway(address={address!r}, proxy_address={proxy!r}, auth='basic')\n"
        "cluster = cacheaffinity.gateway.new_cluster(workers=1, gateway=gateway)\n"
        "client = cluster.get_client(set_as_default=False)\n"
        "print('workers', len(client.scheduler_info()['workers']))\n"
        "client.close()\n"
        "cluster.shutdown()\n"
        "cluster.close()  # a second close, as __del__ does\n"
        "gateway.close()\n"
        "gateway.close()\n"
        "del client, cluster, gateway\n"
        "gc.collect()\n"
        "print('done')\n"
    )
    r = _python(code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["workers", "1", "done"], r.stdout
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr[-3000:]


def test_a_closed_gateway_closes_again_quietly():
    """The same without a gateway server: a Gateway closed, then collected."""
    code = (
        "import gc\n"
        "import cacheaffinity.gateway\n"
        "cacheaffinity.gateway.ensure_gateway_defaults()\n"
        "from dask_gateway import Gateway\n"
        "with Gateway(address='http://127.0.0.1:1') as g:\n"
        "    pass\n"
        "g.close()\n"
        "del g\n"
        "gc.collect()\n"
        "print('done')\n"
    )
    r = _python(code, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "done", r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr[-3000:]


# ------------------------------------------------------------- the configuration alone
def test_configure_sets_commands_and_environment():
    from traitlets.config import Config

    c = Config()
    c.ClusterConfig.environment = {"SITE": "1"}
    cacheaffinity.gateway.configure(
        c, directory="/scratch/cacheaffinity-{host}", capacity="200 GiB", balance=1.25,
        dask_command=["/env/bin/dask"], worker_options=["--host", "127.0.0.1"],
    )
    assert c.ClusterConfig.scheduler_cmd == [
        "/env/bin/dask", "scheduler", "--preload", "cacheaffinity.preload"
    ]
    assert c.ClusterConfig.worker_cmd == [
        "/env/bin/dask", "worker", "--host", "127.0.0.1", "--preload", "cacheaffinity.preload"
    ]
    assert c.ClusterConfig.environment == {
        "SITE": "1",
        "DASK_CACHEAFFINITY__WORKER__DIRECTORY": "/scratch/cacheaffinity-{host}",
        "DASK_CACHEAFFINITY__WORKER__CAPACITY": "200 GiB",
        "DASK_CACHEAFFINITY__SCHEDULER__BALANCE": "1.25",
    }


def test_environment_values_reach_the_dask_config():
    """The variables parse back to the same settings, as the cluster's processes read them."""
    import dask.config

    env = cacheaffinity.gateway.environment(
        directory="/d/{host}", capacity="2 GiB", memory="64 MiB", weight=2.5,
        shared_group="physics", balance=1.1,
    )
    parsed = dask.config.collect_env(env)
    expected = {
        "worker.directory": "/d/{host}", "worker.capacity": "2 GiB", "worker.memory": "64 MiB",
        "worker.weight": 2.5, "worker.shared-group": "physics", "scheduler.balance": 1.1,
    }
    for key, value in expected.items():
        assert dask.config.get(f"cacheaffinity.{key}", config=parsed) == value, key
    assert len(env) == len(expected)


@pytest.mark.parametrize(
    "settings, match",
    [
        pytest.param({"capacity": "lots"}, r"capacity", id="bad-capacity"),
        pytest.param({"weight": -1}, r"weight", id="bad-weight"),
        pytest.param({"directory": "/scratch/{name}"}, r"random.*\{host\}", id="name-in-directory"),
        pytest.param({"capacty": "1 GiB"}, r"unknown setting capacty.*capacity", id="typo"),
        pytest.param({"directory": "relative/dir"}, r"'relative/dir' is relative.*/scratch",
                     id="relative-directory"),
        pytest.param({"directory": "./cache-{host}"}, r"is relative", id="dot-relative"),
        pytest.param({"directory": "{host}/cache"}, r"is relative", id="host-relative"),
    ],
)
def test_bad_settings_are_refused_with_a_fix(settings, match):
    from traitlets.config import Config

    with pytest.raises(ValueError, match=match) as e:
        cacheaffinity.gateway.configure(Config(), **settings)
    assert "\n" not in str(e.value)  # one line


def test_absolute_home_and_variable_directories_are_accepted():
    for directory in ("/scratch/cacheaffinity-{host}", "~/.cache/cacheaffinity", "$TMP/ca"):
        env = cacheaffinity.gateway.environment(directory=directory)
        assert env == {"DASK_CACHEAFFINITY__WORKER__DIRECTORY": directory}


def test_gateway_defaults_come_back_after_the_config_was_replaced():
    import copy

    saved = copy.deepcopy(dask.config.config)
    try:
        dask.config.config.pop("gateway", None)  # what a wholesale replacement leaves
        with pytest.raises(KeyError):
            dask.config.get("gateway.public-address")
        dask.config.config["gateway"] = {"address": "http://127.0.0.1:1"}  # a user's value
        cacheaffinity.gateway.ensure_gateway_defaults()
        assert dask.config.get("gateway.address") == "http://127.0.0.1:1"  # kept
        assert dask.config.get("gateway.public-address", "missing") != "missing"
        assert dask.config.get("gateway.auth.type")  # the rest of the defaults are back
    finally:
        dask.config.config.clear()
        dask.config.config.update(saved)
