"""Dask stays Dask: with cacheaffinity loaded, plain tasks are scheduled and stolen
as in stock Dask, and no move of the plugin breaks a restriction.

Real clusters (``gen_cluster``), real workers, tasks blocked on ``distributed.Event``.
``tools/run_distributed_tests.py`` runs distributed's own test_steal.py and
test_scheduler.py with the preload; these are the project's own checks of the
behaviours that run exposed.
"""

from __future__ import annotations

import inspect

import pytest
from distributed import Event, Worker, get_worker
from distributed.scheduler import Scheduler, WorkerState
from distributed.stealing import WorkStealing
from distributed.utils_test import async_poll_for, gen_cluster

import cacheaffinity
from cacheaffinity import CacheAffinityPlugin, CacheWorkerPlugin
from cacheaffinity.protocol import HOST_NODE_PREFIX
from cacheaffinity.scheduler import _distributed
from cacheaffinity.scheduler._stealing import CALLBACK_NAME

PRELOAD = {"distributed.scheduler.preload": ["cacheaffinity"]}
#: the chunk-task policy as eager as it gets: any idle worker steals at once
EAGER = {
    "cacheaffinity.scheduler.stealing.idle-time": 0,
    "cacheaffinity.scheduler.stealing.backlog": 0,
    "cacheaffinity.scheduler.stealing.warm-backlog": 0,
    "cacheaffinity.scheduler.stealing.interval": "20ms",
}
CHUNKS = [f"uuid-{f:02d}/Events/{i * 1000}-{(i + 1) * 1000}" for f in range(8) for i in range(16)]


def blocked(_x, event_name):
    Event(event_name).wait(timeout=60)
    return get_worker().address


async def cache_nodes(c, s, tmp_path):
    """The plugin (from the preload) with one cache node per worker."""
    await c.register_plugin(CacheWorkerPlugin(directory=str(tmp_path / "{name}")))
    plugin = s.plugins["cacheaffinity"]
    await async_poll_for(
        lambda: len(plugin.membership.node_workers) == len(s.workers)
        and not any(n.startswith(HOST_NODE_PREFIX) for n in plugin.membership.node_workers),
        timeout=20,
    )
    return plugin


def chunks_of_node(plugin, worker, n):
    node = plugin.membership.worker_node[worker.address]
    mine = [ch for ch, h in plugin.where(CHUNKS).items() if h["node"] == node][:n]
    assert len(mine) == n
    return mine


def stock_confirms(s) -> list:
    """Keys Dask's stealing moved (confirmed steal-responses)."""
    return [
        msg[1]
        for _, msg in s.get_events("stealing")
        if isinstance(msg, tuple) and msg and msg[0] == "confirm"
    ]


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2, config=PRELOAD)
async def test_plain_tasks_are_balanced_by_dasks_own_stealing(c, s, a, b):
    plugin = s.plugins["cacheaffinity"]
    ext = s.extensions["stealing"]
    assert type(ext) is _distributed.ChunkAwareWorkStealing and isinstance(ext, WorkStealing)
    ev = Event("plain-balanced")
    # all on a to begin with; allowed elsewhere: stock stealing moves them to idle b
    futs = c.map(blocked, range(20), event_name=ev.name, workers=[a.address],
                 allow_other_workers=True, pure=False)  # fmt: skip
    await async_poll_for(lambda: len(b.state.tasks) >= 2, timeout=20)
    await ev.set()
    results = await c.gather(futs)
    assert results.count(b.address) >= 2
    assert len(stock_confirms(s)) >= 2  # Dask's stealing did it ...
    assert plugin.stealing.steals == 0  # ... not the chunk-task policy
    assert not plugin.locator.chunk_of


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2, config=PRELOAD)
async def test_fast_tasks_are_not_stolen(c, s, a, b):
    """Dask's blocklist (task prefixes expected to take <= 1 ms) still applies."""
    from distributed.stealing import fast_tasks

    assert "rechunk-split" in fast_tasks
    ev = Event("fast-blocklist")
    kw = dict(event_name=ev.name, workers=[a.address], allow_other_workers=True, pure=False)
    fast = [c.submit(blocked, i, key=f"rechunk-split-{i}", **kw) for i in range(10)]
    plain = c.map(blocked, range(10), key=[f"plain-{i}" for i in range(10)], **kw)
    # stealing has run: plain tasks moved to b; fast ones never did
    await async_poll_for(lambda: len(b.state.tasks) >= 2, timeout=20)
    await ev.set()
    assert b.address not in await c.gather(fast)
    assert b.address in await c.gather(plain)
    assert not any(k.startswith("rechunk-split") for k in stock_confirms(s))


@gen_cluster(
    client=True,
    nthreads=[("127.0.0.1", 1)] * 2,
    config={**PRELOAD, "distributed.scheduler.work-stealing-interval": "37ms"},
)
async def test_dasks_stealing_interval_setting_still_applies(c, s, a, b):
    assert s.periodic_callbacks["stealing"].callback_time == 37


@pytest.mark.parametrize("chunk", [pytest.param(False, id="plain"), pytest.param(True, id="chunk")])
@pytest.mark.parametrize(
    "restriction",
    [
        pytest.param({"workers": "a", "allow_other_workers": False}, id="workers-strict"),
        pytest.param({"resources": {"A": 1}}, id="resources"),
    ],
)
def test_restrictions_are_never_broken(restriction, chunk, tmp_path):
    """60 tasks that may run only on a (named, or the only worker with resource A),
    b idle: neither Dask's stealing, nor the chunk-task policy, nor a cache node
    joining moves one of them to b (the issue: 31 of 60 ran on b; a task needing
    resource A sent to b made b's state machine fail)."""

    @gen_cluster(
        client=True,
        nthreads=[("127.0.0.1", 1, {"resources": {"A": 1}}), ("127.0.0.1", 1)],
        config={**PRELOAD, **EAGER},
    )
    async def run(c, s, a, b):
        plugin = await cache_nodes(c, s, tmp_path)
        kwargs = {k: ([a.address] if v == "a" else v) for k, v in restriction.items()}
        ev = Event("restricted")
        n = 60
        if chunk:  # chunk tasks of b's node: placement alone would send them to b
            ids = chunks_of_node(plugin, b, 16) * 4
            futs = cacheaffinity.map_chunks(
                c, blocked, range(n), [ev.name] * n, chunk_ids=ids[:n], pure=False, **kwargs
            )
        else:
            futs = c.map(blocked, range(n), event_name=ev.name, pure=False, **kwargs)
        await async_poll_for(lambda: len(a.state.tasks) == n, timeout=20)
        # the chunk-task policy's rounds, and a cache node joining (re-targeting)
        for _ in range(5):
            plugin.stealing.balance()
        async with Worker(s.address, nthreads=1, host="127.0.0.1", name="late") as w:
            await async_poll_for(lambda: w.address in plugin.membership.worker_node, timeout=20)
            for _ in range(5):
                plugin.stealing.balance()
            await ev.set()
            results = await c.gather(futs)
        assert set(results) == {a.address}
        assert len(s.workers) == 2 and b.address in s.workers  # b was never removed
        assert plugin.stealing.steals == plugin.stealing.membership_moves == 0
        # a chunk task a user restricted is Dask's: the plugin left it alone
        assert not plugin.locator.chunk_of
        assert plugin.counters["user-restricted"] == (n if chunk else 0)

    run()


@pytest.mark.parametrize(
    "restrict",
    [
        pytest.param(lambda ts, a: setattr(ts, "host_restrictions", {"198.51.100.7"}), id="hosts"),
        pytest.param(lambda ts, a: setattr(ts, "worker_restrictions", {a}), id="workers"),
        pytest.param(lambda ts, a: setattr(ts, "resource_restrictions", {"A": 1}), id="resources"),
    ],
)
def test_a_plugin_move_that_would_break_a_restriction_is_refused(restrict, tmp_path):
    """The guard every move of the chunk-task policy goes through, on real task
    states: a restriction set on a queued task (as ``Client.set_restrictions``
    can) makes the move request fail without a message to any worker."""

    @gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2, config={**PRELOAD, **EAGER})
    async def run(c, s, a, b):
        plugin = await cache_nodes(c, s, tmp_path)
        plugin.stealing.stop()
        ev = Event("guard")
        ids = chunks_of_node(plugin, a, 4)
        futs = cacheaffinity.map_chunks(c, blocked, ids, [ev.name] * 4, chunk_ids=ids, pure=False)
        await async_poll_for(lambda: len(a.state.tasks) == 4, timeout=20)
        ts = s.tasks[futs[-1].key]
        assert ts.processing_on is s.workers[a.address]
        thief = s.workers[b.address]
        restrict(ts, a.address)
        ts.loose_restrictions = False
        assert not plugin.stealing.move(ts, thief, reason="steal")
        assert plugin.stealing.refused == 1 and not plugin.stealing.in_flight
        ts.host_restrictions = ts.resource_restrictions = None
        ts.worker_restrictions = {a.address}
        await ev.set()
        assert set(await c.gather(futs)) == {a.address}

    run()


def test_dask_stealing_off_means_no_stealing_extension_and_no_moves(tmp_path):
    @gen_cluster(
        client=True,
        nthreads=[("127.0.0.1", 1)] * 2,
        config={**PRELOAD, **EAGER, "distributed.scheduler.work-stealing": False},
    )
    async def run(c, s, a, b):
        plugin = await cache_nodes(c, s, tmp_path)
        assert "stealing" not in s.extensions
        assert "stealing" not in s.periodic_callbacks
        assert CALLBACK_NAME not in s.periodic_callbacks
        assert not plugin.stealing.enabled
        ev = Event("dask-off")
        plain = c.map(blocked, range(8), event_name=ev.name, workers=[a.address],
                      allow_other_workers=True, pure=False)  # fmt: skip
        ids = chunks_of_node(plugin, a, 8)
        chunked = cacheaffinity.map_chunks(c, blocked, ids, [ev.name] * 8, chunk_ids=ids,
                                           pure=False)  # fmt: skip
        await async_poll_for(lambda: len(a.state.tasks) == 16, timeout=20)
        plugin.stealing.balance()
        async with Worker(s.address, nthreads=1, host="127.0.0.1", name="late") as w:
            await async_poll_for(lambda: w.address in plugin.membership.worker_node, timeout=20)
            await ev.set()
            results = await c.gather(plain + chunked)
        assert set(results) == {a.address}
        assert plugin.stealing.steals == plugin.stealing.membership_moves == 0
        assert not s.get_events("stealing")

    run()


def test_chunk_stealing_off_keeps_dasks_stealing_for_plain_tasks(tmp_path):
    @gen_cluster(
        client=True,
        nthreads=[("127.0.0.1", 1)] * 2,
        config={**PRELOAD, **EAGER, "cacheaffinity.scheduler.stealing.enabled": False},
    )
    async def run(c, s, a, b):
        plugin = await cache_nodes(c, s, tmp_path)
        assert isinstance(s.extensions["stealing"], _distributed.ChunkAwareWorkStealing)
        assert CALLBACK_NAME not in s.periodic_callbacks
        ev = Event("chunk-off")
        ids = chunks_of_node(plugin, a, 10)
        chunked = cacheaffinity.map_chunks(c, blocked, ids, [ev.name] * 10, chunk_ids=ids,
                                           pure=False)  # fmt: skip
        plain = c.map(blocked, range(10), event_name=ev.name, workers=[a.address],
                      allow_other_workers=True, pure=False)  # fmt: skip
        await async_poll_for(lambda: len(b.state.tasks) >= 2, timeout=20)  # plain ones
        # chunk tasks never enter Dask's stealable sets; queued plain tasks do
        stealable = {ts.key for ts in s.extensions["stealing"].key_stealable}
        assert not stealable & {f.key for f in chunked}
        assert stealable & {f.key for f in plain}
        plugin.stealing.balance()
        await ev.set()
        assert set(await c.gather(chunked)) == {a.address}
        assert b.address in await c.gather(plain)
        chunk_keys = {f.key for f in chunked}
        assert not chunk_keys & set(stock_confirms(s))

    run()


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2)
async def test_registering_and_removing_the_plugin_keeps_dasks_stealing_object(c, s, a, b):
    ext = s.extensions["stealing"]
    assert type(ext) is WorkStealing
    await c.register_plugin(CacheAffinityPlugin())
    plugin = s.plugins["cacheaffinity"]
    assert s.extensions["stealing"] is ext and ext.chunk_tasks is plugin.locator.chunk_of
    assert s.stream_handlers["steal-response"].__self__ is ext
    assert CALLBACK_NAME in s.periodic_callbacks
    await c.unregister_scheduler_plugin("cacheaffinity")
    # (Scheduler.remove_plugin does not close plugins: noticed within a second)
    await async_poll_for(lambda: CALLBACK_NAME not in s.periodic_callbacks, timeout=10)
    assert ext.chunk_tasks == frozenset()  # chunk tasks are Dask's again


def test_distributed_internals_used_by_the_adapter_exist():
    """Fails when distributed renames or reshapes what _distributed.py relies on
    (the list at the top of that module)."""

    def params(f):
        return list(inspect.signature(f).parameters)

    assert _distributed.check() == []  # every name of _distributed.NAMES
    assert params(WorkStealing.put_key_in_stealable) == ["self", "ts"]
    assert params(WorkStealing.remove_key_from_stealable) == ["self", "ts"]
    assert params(WorkStealing.move_task_request) == ["self", "ts", "victim", "thief"]
    assert callable(WorkStealing.log) and callable(WorkStealing.move_task_confirm)
    for name in ("coerce_hostname", "bulk_schedule_unrunnable_after_adding_worker",
                 "transitions", "valid_workers"):  # fmt: skip
        assert callable(getattr(Scheduler, name)), name
    assert params(Scheduler.transitions)[1:] == ["recommendations", "stimulus_id"]
    for name in ("processing", "executing", "long_running", "resources", "status", "host"):
        assert name in WorkerState.__slots__ or hasattr(WorkerState, name), name
    # the instance attributes, on a real (unstarted) scheduler's extension
    import asyncio

    async def attrs():
        async with Scheduler(host="127.0.0.1", port=0, dashboard=False,
                             dashboard_address="127.0.0.1:0") as s:
            ext = s.extensions["stealing"]
            assert type(ext) is WorkStealing
            for name in ("key_stealable", "in_flight", "in_flight_tasks", "metrics", "count"):
                assert hasattr(ext, name), name
            assert 0 in ext.metrics["request_count_total"] or True
            ext.metrics["request_count_total"][0] += 0  # a defaultdict of levels
            assert isinstance(s.idle, dict) and "stealing" in s.periodic_callbacks
            pc = s.periodic_callbacks["stealing"]
            assert pc.callback == ext.balance  # PeriodicCallback.callback: who registered it
            assert _distributed.adopt_stealing(s, {"k"}) is ext
            assert type(ext) is _distributed.ChunkAwareWorkStealing
            # the dashboard's: the HTTP application that takes our Bokeh page and route
            app = s.http_application
            assert isinstance(app.applications, list) and callable(app.add_application)
            assert callable(app.add_handlers)

    asyncio.run(attrs())


def test_the_internals_check_names_what_is_gone(monkeypatch):
    monkeypatch.setattr(_distributed, "NAMES", (
        ("distributed.stealing", "WorkStealing.no_such_method"),
        ("distributed.no_such_module", "x"),
        ("distributed.scheduler", "Scheduler.transitions"),
    ))  # fmt: skip
    problems = _distributed.check()
    assert len(problems) == 2, problems
    assert problems[0] == "distributed.stealing.WorkStealing.no_such_method is gone"
    assert problems[1].startswith("distributed.no_such_module:")


#: What scheduler modules other than _distributed.py may import from distributed:
#: documented plugin API and the state classes its hooks pass.
PUBLIC_DISTRIBUTED = {
    ("distributed.core", "Status"),
    ("distributed.diagnostics.plugin", "SchedulerPlugin"),
    ("distributed.scheduler", "Scheduler"),
    ("distributed.scheduler", "TaskState"),
    ("distributed.scheduler", "WorkerState"),
    ("distributed.stealing", "WorkStealing"),  # a type annotation
}


def test_distributed_internals_are_used_in_one_module_only():
    """Every other scheduler module imports only :data:`PUBLIC_DISTRIBUTED` from
    distributed (at any level, TYPE_CHECKING included): the rest goes through
    _distributed.py, whose names the test above checks."""
    import ast
    from pathlib import Path

    found = []
    for path in sorted(Path(_distributed.__file__).parent.glob("*.py")):
        if path.name == "_distributed.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "distributed":
                found += [f"{path.name}: from {node.module} import {a.name}" for a in node.names
                          if (node.module, a.name) not in PUBLIC_DISTRIBUTED]  # fmt: skip
            elif isinstance(node, ast.Import):
                found += [f"{path.name}: import {a.name}" for a in node.names
                          if a.name.split(".")[0] == "distributed"]  # fmt: skip
    assert not found, found


def test_run_distributed_tests_reads_junit_outcomes_and_checks_its_input(tmp_path):
    """tools/run_distributed_tests.py: outcomes of a real pytest run, and a clear
    error for a directory that is no distributed checkout."""
    import subprocess
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    try:
        import run_distributed_tests as tool
    finally:
        sys.path.pop(0)
    (tmp_path / "test_mini.py").write_text(
        "import pytest\n"
        "def test_ok(): pass\n"
        "def test_bad(): assert False\n"
        "@pytest.mark.skip(reason='sample of a skipped outcome for the JUnit reader')\n"
        "def test_skip(): pass\n"
        "@pytest.mark.xfail\ndef test_xf(): assert False\n"
        "@pytest.mark.parametrize('x', [1, 2])\ndef test_p(x): assert x == 1\n"
    )
    junit = tmp_path / "out.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "-p", "no:randomly", f"--junitxml={junit}", "test_mini.py"],
                   cwd=tmp_path, capture_output=True)  # fmt: skip
    assert tool.outcomes(junit) == {
        "test_mini.py::test_ok": "passed",
        "test_mini.py::test_bad": "failed",
        "test_mini.py::test_skip": "skipped",
        "test_mini.py::test_xf": "xfail",
        "test_mini.py::test_p[1]": "passed",
        "test_mini.py::test_p[2]": "failed",
    }
    with pytest.raises(SystemExit, match="--distributed-src=.*no test_steal.py"):
        tool.prepare(tmp_path, tmp_path / "work", ["test_steal.py"])


def test_the_private_worker_name_the_preload_uses_exists(tmp_path):
    """``Worker._pending_plugins`` (``_distributed.fail_worker_start``): a tuple on a real
    worker before it starts, and a plugin added there fails the start with its error."""
    import asyncio

    from distributed import Scheduler, Worker
    from distributed.diagnostics.plugin import WorkerPlugin

    from cacheaffinity.scheduler._distributed import fail_worker_start

    class Refuse(WorkerPlugin):
        def setup(self, worker):
            raise ValueError("refused by the test")

    async def main():
        async with Scheduler(dashboard_address=":0", port=0) as s:
            w = Worker(s.address, dashboard_address=":0", local_directory=str(tmp_path))
            assert isinstance(w._pending_plugins, tuple)
            assert fail_worker_start(w, Refuse())
            with pytest.raises(Exception) as info:
                await w
            assert "refused by the test" in repr(info.value) + repr(info.value.__cause__)
            await w.close()

    asyncio.run(main())
    assert fail_worker_start(object(), Refuse()) is False
