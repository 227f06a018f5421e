"""What operators see, with real ``dask scheduler``/``dask worker`` processes: uncached
nodes marked everywhere and given no placement, per-run figures counted by the run's own
tasks (also across a worker SIGKILLed and restarted), CLI commands that never hang."""

from __future__ import annotations

import http.server
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import dask
import pytest
from coffea import processor
from coffea.nanoevents import NanoAODSchema
from distributed import Client, get_task_stream

import cacheaffinity
from cacheaffinity.protocol import RUN_FIGURES
from examples.analysis import DimuonJetProcessor, summary
from helpers import stop

BIN = Path(sys.executable).parent
CLI = BIN / "cacheaffinity"
HOST_NODE = "host:127.0.0.1"
FILE = "nanoAOD_2015_CMS_Open_Data_ttbar.root"
#: Figures a run's tasks count that node totals count too (compared on a run without restarts).
NODE_TOTALS = ("hits", "misses", "bytes_served", "storage_bytes", "storage_opens", "peer_hits")

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


class SlowProcessor(DimuonJetProcessor):
    def process(self, events):
        time.sleep(0.2)
        return super().process(events)


def _wait_for(predicate, timeout=60, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


class Cluster:
    """A preloaded scheduler, two cached workers, one worker without the worker
    preload and one whose cache directory is unusable (both: node host:127.0.0.1)."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen] = {}
        path = os.pathsep.join(filter(None, [str(Path(__file__).parent), str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH")]))
        self.env = dict(
            os.environ, PYTHONPATH=path, DASK_CACHEAFFINITY__SCHEDULER__STEALING__ENABLED="False"
        )
        self.scheduler_file = tmp / "scheduler.json"
        self.start(
            "scheduler", "scheduler", "--host", "127.0.0.1", "--port", "0",
            "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(self.scheduler_file),
            "--preload", "cacheaffinity",
        )  # fmt: skip
        _wait_for(self.scheduler_file.exists, what="scheduler file")
        time.sleep(0.2)  # the file is written at once, but let it be complete
        self.address = json.loads(self.scheduler_file.read_text())["address"]
        blocker = tmp / "a-file"
        blocker.write_text("not a directory")
        self.dirs = {"n1": tmp / "cache-n1", "n2": tmp / "cache-n2"}
        for name, d in self.dirs.items():
            self.worker(name, "--preload", "cacheaffinity", "--cache-directory", str(d))
        self.worker("plain")  # no worker preload
        self.worker("bad", "--preload", "cacheaffinity", "--cache-directory", str(blocker / "c"))

    def start(self, name, *args):
        log = open(self.tmp / f"{name}-{time.monotonic_ns()}.log", "w")
        self.procs[name] = subprocess.Popen(
            [str(BIN / "dask"), *args], stdout=log, stderr=subprocess.STDOUT, env=self.env
        )

    def worker(self, name, *extra):
        self.start(
            name, "worker", self.address, "--name", name, "--nthreads", "1", "--no-nanny",
            "--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0", *extra,
        )  # fmt: skip

    def close(self):
        stop(list(self.procs.values()))  # the scheduler was started first


def _page(dask_scheduler=None):
    """The dashboard page's header and table, built in the scheduler process."""
    from cacheaffinity.scheduler._dashboard import TorusView

    view = TorusView(dask_scheduler)
    return view.header.text, dict(view.stats.data)


def _info(dask_scheduler=None):
    return dask_scheduler.plugins["cacheaffinity"].info()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("operators"))
    try:
        with Client(c.address, timeout=60) as client:
            client.wait_for_workers(4, timeout=60)
            cached = {(d / "node-id").read_text().strip() for d in c.dirs.values()}

            def ready():
                nodes = client.run_on_scheduler(_info)["nodes"]
                return set(nodes) == cached | {HOST_NODE} and len(nodes[HOST_NODE]["workers"]) == 2

            _wait_for(ready, 60, "nodes")
            c.cached = cached
            c.client = client
            yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def fileset(nanoaod_dir):
    return {"tt": [str(nanoaod_dir / FILE)]}


@pytest.fixture(scope="module")
def reference(fileset):
    runner = processor.Runner(
        executor=processor.IterativeExecutor(), schema=NanoAODSchema, chunksize=10
    )
    return summary(runner(fileset, processor_instance=DimuonJetProcessor(), treename="Events"))


def run(client, fileset, processor_instance=None, **kwargs):
    executor = cacheaffinity.CacheAffinityExecutor(client=client, status=False, retries=5)
    runner = processor.Runner(
        executor=executor, schema=NanoAODSchema, chunksize=10, savemetrics=True, **kwargs
    )
    with dask.config.set({"cacheaffinity.client.stripe-entries": 10}):
        out, metrics = runner(
            fileset, processor_instance=processor_instance or DimuonJetProcessor(),
            treename="Events",
        )  # fmt: skip
    return out, metrics, executor


def test_uncached_node_is_marked_everywhere(cluster, caplog):
    client = cluster.client
    stats = cacheaffinity.cache_stats(client)
    assert set(stats) == cluster.cached | {HOST_NODE}
    reason = stats[HOST_NODE]["uncached"]
    assert "no cacheaffinity worker plugin" in reason and "unusable" in reason, reason
    assert all(stats[n]["uncached"] is None for n in cluster.cached)
    # the capacity in force is reported beside the setting
    assert all(0 < stats[n]["capacity"] <= stats[n]["configured_capacity"] for n in cluster.cached)

    with caplog.at_level(logging.WARNING, logger="cacheaffinity.client"):
        info = cacheaffinity.check(client)
    assert info["nodes"][HOST_NODE]["uncached"] == reason
    assert not info["nodes"][HOST_NODE]["placing"]
    warned = [r.getMessage() for r in caplog.records if r.name == "cacheaffinity.client"]
    assert len(warned) == 1 and HOST_NODE in warned[0] and "no cacheaffinity worker plugin" in warned[0]

    port = client.scheduler_info()["services"]["dashboard"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    assert f'dask_cacheaffinity_uncached{{node="{HOST_NODE}"}} 1.0' in text
    for n in cluster.cached:
        assert f'dask_cacheaffinity_uncached{{node="{n}"}} 0.0' in text

    header, table = client.run_on_scheduler(_page)
    assert "1 node(s) cache nothing" in header and HOST_NODE in header
    row = table["node"].index(HOST_NODE)
    assert table["cache"][row].startswith("UNCACHED: ") and "unusable" in table["cache"][row]
    assert [table["cache"][table["node"].index(n)] for n in cluster.cached] == ["cached"] * 2
    assert table["hosts"][row] == "127.0.0.1"
    # each cached node's row names its cache directory
    for d in cluster.dirs.values():
        node = (d / "node-id").read_text().strip()
        assert table["directory"][table["node"].index(node)] == str(d)

    # no chunk id maps to it while cached nodes exist
    homes = cacheaffinity.where(client, [f"chunk-{i}" for i in range(200)])
    assert {h["node"] for h in homes.values()} == cluster.cached


@pytest.mark.timeout(600)
def test_per_run_figures_and_no_placement_on_the_uncached_node(cluster, fileset, reference, caplog):
    client = cluster.client
    before = cacheaffinity.cache_totals(client)
    with caplog.at_level(logging.WARNING, logger="cacheaffinity.client"):
        out1, metrics1, executor = run(client, fileset)
    after = cacheaffinity.cache_totals(client)
    assert summary(out1) == reference
    warned = [r.getMessage() for r in caplog.records if r.name == "cacheaffinity.client"]
    assert len(warned) == 1 and HOST_NODE in warned[0], warned  # once per run
    stats1 = executor.last_run_stats
    n_chunks = metrics1["chunks"]
    assert metrics1["cacheaffinity"] == stats1
    assert stats1["chunks"] == stats1["tasks"] == n_chunks
    assert stats1["uncached_chunks"] == 0 and stats1["steals"] == 0
    assert stats1["misses"] > 0 and stats1["storage_opens"] > 0
    # no restart: the run's own figures equal the node totals' difference
    assert {k: stats1[k] for k in NODE_TOTALS} == {
        k: after.get(k, 0) - before.get(k, 0) for k in NODE_TOTALS
    }
    info = client.run_on_scheduler(_info)
    assert info["nodes"][HOST_NODE]["counters"].get("placements", 0) == 0
    assert info["nodes"][HOST_NODE]["counters"].get("on-target", 0) == 0
    assert info["nodes"][HOST_NODE]["counters"].get("off-target", 0) == 0

    out2, metrics2, executor2 = run(client, fileset)
    assert summary(out2) == reference
    stats2 = executor2.last_run_stats
    assert stats2["run"] != stats1["run"]
    assert stats2["hits"] > 0 and stats2["misses"] == 0 and stats2["storage_opens"] == 0
    assert stats2["chunks"] == n_chunks

    # the scheduler keeps them for `cacheaffinity stats`
    table, machine = (
        subprocess.run([str(CLI), *a], capture_output=True, text=True, timeout=120)
        for a in (["stats", cluster.address, "--last", "2"],
                  ["stats", "--json", str(cluster.scheduler_file), "--last", "2"])
    )  # fmt: skip
    assert machine.returncode == 0, machine.stderr
    kept = json.loads(machine.stdout)
    assert [r["run"] for r in kept] == [stats1["run"], stats2["run"]]
    assert {k: kept[1][k] for k in RUN_FIGURES} == {k: stats2[k] for k in RUN_FIGURES}
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split()[:5] == ["run", "started", "status", "tasks", "chunks"] and len(rows) == 2
    assert [r.split()[3] for r in rows] == ["ok", "ok"]  # after the date and time of "started"

    # a run during which a cached worker is SIGKILLed and restarted
    result = {}

    def analysis():
        result["run"] = run(client, fileset, SlowProcessor())

    uncached_workers = set(client.run_on_scheduler(_info)["nodes"][HOST_NODE]["workers"])
    stream = get_task_stream(client=client)
    stream.__enter__()
    t = threading.Thread(target=analysis)
    t.start()
    n1 = cluster.procs["n1"]
    _wait_for(
        lambda: any(client.processing().values()), 120, "chunk tasks running"
    )
    time.sleep(0.5)
    n1.send_signal(signal.SIGKILL)
    n1.wait(30)
    cluster.worker("n1", "--preload", "cacheaffinity", "--cache-directory", str(cluster.dirs["n1"]))
    t.join(400)
    stream.__exit__(None, None, None)
    assert not t.is_alive()
    out3, metrics3, executor3 = result["run"]
    assert summary(out3) == reference
    stats3 = executor3.last_run_stats
    assert all(stats3[k] >= 0 for k in RUN_FIGURES), stats3
    assert stats3["chunks"] >= n_chunks
    assert stats3["hits"] + stats3["misses"] > 0
    # While n1 is dead, a chunk of n1's may start on a worker of the uncached node
    # before it is re-targeted; such a run's result may then be dropped for the
    # copy on a cached node. Every uncached execution is counted: those whose
    # result was kept plus at most the executions beyond one per task.
    ran_uncached = [
        t["key"] for t in stream.data
        if t.get("worker") in uncached_workers and str(t["key"]).startswith("SlowProcessor-")
    ]  # fmt: skip
    extra = stats3["chunks"] - stats3["tasks"]
    assert len(ran_uncached) <= stats3["uncached_chunks"] <= len(ran_uncached) + extra, (
        stats3, uncached_workers, [(t.get("worker"), str(t["key"])[:40]) for t in stream.data]
    )
    assert stats3["uncached_chunks"] < n_chunks
    assert metrics3["cacheaffinity"] == stats3


# ====================================================================== never hang
def _http_port():
    srv = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    srv.RequestHandlerClass.log_message = lambda *a: None
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, srv.server_address[1]


def _silent_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    held = []

    def accept():
        while True:
            try:
                held.append(s.accept()[0])  # accepts and never answers
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return s, s.getsockname()[1]


def _closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.timeout(300)
def test_scheduler_commands_never_hang():
    srv, http_port = _http_port()
    sock, silent_port = _silent_port()
    addresses = {
        "closed": f"tcp://127.0.0.1:{_closed_port()}",
        "http": f"tcp://127.0.0.1:{http_port}",
        "silent": f"tcp://127.0.0.1:{silent_port}",
    }
    commands = {
        "where": ["where", "--timeout", "3s", "{a}", "uuid/Events/s10:0"],
        "check": ["check", "--timeout", "3s", "{a}"],
        "stats": ["stats", "--timeout", "3s", "{a}"],
    }
    try:
        for cmd, args in commands.items():
            for kind, address in addresses.items():
                started, cpu0 = time.monotonic(), _children_cpu()
                p = subprocess.run(
                    [str(CLI), *(a.format(a=address) for a in args)],
                    capture_output=True, text=True, timeout=60,
                )  # fmt: skip
                took, cpu = time.monotonic() - started, _children_cpu() - cpu0
                assert p.returncode == 2, (cmd, kind, p.stderr)
                assert not p.stdout
                lines = p.stderr.strip().splitlines()
                assert len(lines) == 1 and lines[0].startswith("Error: "), (cmd, kind, p.stderr)
                assert addresses[kind] in lines[0]
                # --timeout + 2 s, past the command's own CPU (its imports: seconds here),
                # which a loaded machine stretches: a hang waits, it does not compute
                assert took - 2 * cpu < 3 + 2, (cmd, kind, took, cpu)
    finally:
        srv.shutdown()
        sock.close()


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's waited-for children so far."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(["where", "nonsense", "x"], "neither a scheduler file nor an address", id="address"),
        pytest.param(["where", "tcp://127.0.0.1:1", ""], "empty string", id="empty-chunk"),
        pytest.param(["where", "tcp://127.0.0.1:1"], "give CHUNK ids", id="no-chunk"),
        pytest.param(["where", "tcp://127.0.0.1:1", "--file", "f.root"], "--chunksize", id="file-without-chunksize"),
        pytest.param(["stats", "tcp://127.0.0.1:1", "--timeout", "0s"], "more than 0", id="zero-timeout"),
    ],
)  # fmt: skip
def test_scheduler_commands_validate_their_arguments(args, message):
    r = subprocess.run([str(CLI), *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and not r.stdout
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# ====================================================================== the page, in a browser
from test_dashboard import browser, check_png, wait_js  # noqa: E402,F401  (fixture and helpers)

READ_HEADER = """
if (!window.Bokeh || !Bokeh.documents || !Bokeh.documents.length) return null;
const doc = Bokeh.documents[0];
const header = doc.get_model_by_name('cacheaffinity-header');
const stats = doc.get_model_by_name('cacheaffinity-node-stats');
if (!header || !stats) return null;
const root = Object.values(Bokeh.index)[0];
const view = root ? root.owner.find_one(header) : null;
return {header: header.text, shown: view ? view.shadow_el.textContent : null, node: Array.from(stats.get_column('node') || []),
        cache: Array.from(stats.get_column('cache') || [])};
"""


@pytest.mark.timeout(300)
def test_page_with_an_uncached_node_in_headless_chromium(cluster, browser, tmp_path):
    port = cluster.client.scheduler_info()["services"]["dashboard"]
    browser.get(f"http://127.0.0.1:{port}/cacheaffinity")
    page = wait_js(
        browser, READ_HEADER,
        lambda p: p is not None and HOST_NODE in p["node"] and "cache nothing" in (p["shown"] or ""),
        what="the uncached node on the page",
    )  # fmt: skip
    assert page["cache"][page["node"].index(HOST_NODE)].startswith("UNCACHED: ")
    assert HOST_NODE in page["shown"] and "no cacheaffinity worker plugin" in page["shown"]
    shot = tmp_path / "uncached.png"
    assert browser.save_screenshot(str(shot))
    check_png(shot)
