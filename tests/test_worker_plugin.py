"""The worker plugin: node identity, configuration on the worker, reporting, coffea hook."""

from __future__ import annotations

import logging
import os
import subprocess

import dask.config
import numpy as np
import pytest
from distributed import get_worker
from distributed.utils_test import async_poll_for, gen_cluster

import cacheaffinity
from cacheaffinity import CacheAffinityPlugin, CacheWorkerPlugin
from cacheaffinity.protocol import HOST_NODE_PREFIX
from cacheaffinity.worker._plugin import job_scratch_of
from cacheaffinity.worker._directory import read_or_create_node_id


def store_columns(n):
    front = cacheaffinity.cachestrategy()
    for i in range(n):
        front[f"uuid/Events/0-10/data/col{i}"] = np.arange(1000, dtype=np.float32) + i
    return get_worker().plugins["cacheaffinity"].node_id


def read_columns(n):
    front = cacheaffinity.cachestrategy()
    return [front.get(f"uuid/Events/0-10/data/col{i}") for i in range(n)]


def node_id_of_worker():
    return get_worker().plugins["cacheaffinity"].node_id


def test_node_id_is_created_once_and_shared(tmp_path):
    ids = {read_or_create_node_id(str(tmp_path / "cache")) for _ in range(3)}
    assert len(ids) == 1
    assert (tmp_path / "cache" / "node-id").read_text().strip() in ids


def test_corrupt_node_id_names_the_file(tmp_path):
    (tmp_path / "node-id").write_text("not a valid id !!\n")
    with pytest.raises(ValueError, match="remove the file"):
        read_or_create_node_id(str(tmp_path))


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)] * 2)
async def test_workers_sharing_a_directory_are_one_node(c, s, a, b, tmp_path):
    await c.register_plugin(CacheAffinityPlugin())
    await c.register_plugin(CacheWorkerPlugin(directory=str(tmp_path / "shared")))
    plugin = s.plugins["cacheaffinity"]
    await async_poll_for(lambda: len(plugin.membership.worker_node) == 2, timeout=10)
    (node,) = set(plugin.membership.worker_node.values())
    assert node == (tmp_path / "shared" / "node-id").read_text().strip()
    assert plugin.membership.node_workers[node] == {a.address, b.address}
    assert plugin.membership.weight(node) == 2  # total threads of the node


@gen_cluster(
    client=True,
    nthreads=[("127.0.0.1", 1)] * 2,
    config={"cacheaffinity.worker.capacity": "3 MiB", "cacheaffinity.worker.weight": 5},
)
async def test_config_resolves_on_worker_and_stats_reach_scheduler(c, s, a, b, tmp_path):
    await c.register_plugin(CacheAffinityPlugin())
    await c.register_plugin(CacheWorkerPlugin(directory=str(tmp_path / "{name}")))
    plugin = s.plugins["cacheaffinity"]
    await async_poll_for(lambda: len(plugin.membership.node_workers) == 2, timeout=10)
    assert a.plugins["cacheaffinity"].capacity == 3 * 2**20
    assert {plugin.membership.weight(n) for n in plugin.membership.node_workers} == {5.0}

    node = await c.submit(store_columns, 8, workers=[a.address])
    values = await c.submit(read_columns, 8, workers=[a.address])
    assert all(np.array_equal(v, np.arange(1000, dtype=np.float32) + i) for i, v in enumerate(values))
    stats = await c.run(lambda dask_worker: dask_worker.plugins["cacheaffinity"].stats())
    assert stats[a.address]["entries"] == 8 and stats[a.address]["hits"] >= 8
    # the heartbeat carries them to the scheduler
    await async_poll_for(
        lambda: (plugin.info()["nodes"][node]["stats"].get("entries") or 0) == 8, timeout=10
    )


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_cachestrategy_without_plugin_is_a_clear_error(c, s, a):
    with pytest.raises(RuntimeError, match="no cacheaffinity plugin.*--preload cacheaffinity"):
        await c.submit(cacheaffinity.cachestrategy)


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_unusable_directory_runs_uncached_with_one_warning(c, s, a, tmp_path, caplog):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    await c.register_plugin(CacheAffinityPlugin())
    with caplog.at_level(logging.WARNING, logger="cacheaffinity.worker"):
        await c.register_plugin(CacheWorkerPlugin(directory=str(not_a_dir / "cache")))
    warnings = [r for r in caplog.records if "unusable" in r.getMessage()]
    assert len(warnings) == 1 and "cacheaffinity.worker.directory" in warnings[0].getMessage()
    assert await c.submit(store_columns, 2) is None  # tasks still run
    assert await c.submit(read_columns, 2) == [None, None]  # a miss, not an error
    plugin = s.plugins["cacheaffinity"]
    await async_poll_for(lambda: a.address in plugin.membership.worker_node, timeout=10)
    assert plugin.membership.worker_node[a.address] == HOST_NODE_PREFIX + "127.0.0.1"


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_capacity_from_config_applies_and_the_default_keeps_the_recorded_one(c, s, a, tmp_path):
    from helpers import fill

    directory = tmp_path / "cache"
    fill(directory, n=10, capacity="1 MiB")  # recorded: 1 MiB, ten 4 KiB entries
    # the packaged default is not a given size: the directory's 1 MiB stays
    await c.register_plugin(CacheWorkerPlugin(directory=str(directory)))
    plugin = a.plugins["cacheaffinity"]
    assert plugin.capacity_given is None
    assert plugin.stats()["configured_capacity"] == 2**20 and plugin.stats()["entries"] == 10
    await c.unregister_worker_plugin("cacheaffinity")
    # a setting other than the default (here dask.config.set on the worker) is given
    with dask.config.set({"cacheaffinity.worker.capacity": "12 KiB"}):
        await c.register_plugin(CacheWorkerPlugin(directory=str(directory)))
    plugin = a.plugins["cacheaffinity"]
    assert plugin.capacity_given == 12 * 2**10
    stats = plugin.stats()
    assert stats["configured_capacity"] == stats["capacity"] == 12 * 2**10
    assert stats["entries"] == 3 and stats["bytes"] <= 12 * 2**10 and stats["evictions"] == 7


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_plugin_teardown_removes_metric(c, s, a, tmp_path):
    await c.register_plugin(CacheWorkerPlugin(directory=str(tmp_path / "n")))
    assert "cacheaffinity" in a.metrics
    await c.unregister_worker_plugin("cacheaffinity")
    assert "cacheaffinity" not in a.metrics


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_directory_in_job_scratch_warns_and_still_caches(
    c, s, a, tmp_path, caplog, monkeypatch
):
    # HTCondor sets $_CONDOR_SCRATCH_DIR (and $TMPDIR) to a per-job directory it deletes
    # when the job ends: a cache there loses its node identity with every job.
    scratch = tmp_path / "execute" / "dir_1234"
    scratch.mkdir(parents=True)
    monkeypatch.setenv("_CONDOR_SCRATCH_DIR", str(scratch))
    with caplog.at_level(logging.WARNING, logger="cacheaffinity.worker"):
        await c.register_plugin(CacheWorkerPlugin(directory=str(scratch / "cache")))
    warnings = [r.getMessage() for r in caplog.records if "job's scratch" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert str(scratch / "cache") in warnings[0] and "outlives jobs" in warnings[0]
    assert (scratch / "cache" / "node-id").exists()  # still a working cache
    assert job_scratch_of(str(scratch)) == str(scratch)
    assert job_scratch_of(str(tmp_path / "execute" / "dir_12345")) is None  # prefix only
    assert job_scratch_of(str(tmp_path / "local")) is None


@pytest.mark.parametrize(
    "kwargs, config, words",
    [
        pytest.param({"capacity": "lots"}, {}, "capacity='lots' (cacheaffinity.worker.capacity) is not a size", id="arg"),
        pytest.param({}, {"cacheaffinity.worker.memory": "-1 GiB"}, "cacheaffinity.worker.memory='-1 GiB' must be >= 0", id="config"),
        pytest.param({}, {"cacheaffinity.worker.weight": "heavy"}, "cacheaffinity.worker.weight='heavy'", id="weight"),
        pytest.param({"shared_group": "no-such-group-xyz"}, {}, "is not a Unix group", id="group"),
    ],
)  # fmt: skip
def test_invalid_settings_fail_setup_instead_of_running_uncached(tmp_path, kwargs, config, words):
    @gen_cluster(client=True, nthreads=[("127.0.0.1", 1)], config=config)
    async def check(c, s, a):
        plugin = CacheWorkerPlugin(directory=str(tmp_path / "cache"), **kwargs)
        with pytest.raises(ValueError) as info:
            await c.register_plugin(plugin)
        assert words in str(info.value)
        assert not (tmp_path / "cache").exists()
        # Dask keeps the plugin; a task that asks for the cache gets the error, it
        # does not run uncached
        with pytest.raises(RuntimeError, match="refused its settings") as task_error:
            await c.submit(cacheaffinity.cachestrategy)
        assert words in str(task_error.value)

    check()


def test_default_directory_is_private_per_user(tmp_path, monkeypatch):
    from cacheaffinity.worker._directory import default_directory

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_directory() == str(tmp_path / "xdg" / "cacheaffinity")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # not usable: the XDG spec says ignore
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_directory() == str(tmp_path / "home" / ".cache" / "cacheaffinity")


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_untrusted_directory_is_one_warning_naming_owner_and_fix(c, s, a, tmp_path, caplog):
    shared = tmp_path / "cache"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    await c.register_plugin(CacheAffinityPlugin())
    with caplog.at_level(logging.WARNING, logger="cacheaffinity.worker"):
        await c.register_plugin(CacheWorkerPlugin(directory=str(shared)))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert str(shared) in warnings[0] and "mode 0777" in warnings[0]
    assert f"chmod go-w {shared}" in warnings[0]
    assert a.plugins["cacheaffinity"].cache is None
    assert not (shared / "node-id").exists()  # no identity taken from (or put in) it
    assert await c.submit(read_columns, 2) == [None, None]


def test_cachestrategy_mapping_reads_many_keys_with_one_lookup_each(tmp_path):
    """A chunk task's store (PeerStore over ``cachestrategy()``'s IdentifiedKeys) answers
    ``get_many`` through the node cache's batched ``get_many``: every stored key read
    from disk exactly once and counted as one hit (IdentifiedKeys had no ``get_many``,
    so PeerStore fell back to ``k in m`` then ``m[k]``: two reads and two hits per key),
    keys of unidentified files from the chunk's memory, a missing key one miss."""
    from cacheaffinity.coffea._buffer_cache import IdentifiedKeys
    from cacheaffinity.worker._peers import PeerStore
    from cacheaffinity.worker._store import ColumnCache, MemoryFront

    keys = [f"c3/tok/Events/col{i}/d/0-10/data" for i in range(5)]
    with ColumnCache(str(tmp_path / "cache"), capacity="10 MiB") as store:
        writer = IdentifiedKeys(MemoryFront(store, capacity="1 MiB"))
        for i, k in enumerate(keys):
            writer[k] = np.full(100, i, dtype=np.int32)
        writer["None/Events/0-10/data"] = np.zeros(3)
        store.flush()
        before = store.stats()
        reader = IdentifiedKeys(MemoryFront(store, capacity="1 MiB"))  # empty memory
        reader.local = writer.local  # the same chunk
        chunk_store = PeerStore(reader, None, None, {})  # no annotations: no peer is asked
        got = chunk_store.get_many([*keys, "c3/tok/Events/absent/d/0-10/data", "None/Events/0-10/data"])
        after = store.stats()
    assert sorted(got) == sorted([*keys, "None/Events/0-10/data"])
    assert [int(got[k][0]) for k in keys] == list(range(5))
    assert after["hits"] - before["hits"] == 5, (before, after)
    assert after["misses"] - before["misses"] == 1
    assert reader.front.stats()["hits"] == 5
    assert reader.front.stats()["memory_hits"] == 0


@pytest.mark.skipif(
    os.geteuid() != 0, reason="mounts a read-only tmpfs (mount -t tmpfs -o ro): needs root"
)
@pytest.mark.parametrize(
    "mode, sub",
    [("1777", ""), ("0700", ""), ("1777", "cache")],
    ids=["refused-by-the-mode-check", "first-write-fails", "cannot-create"],
)
@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_a_read_only_directory_warns_once_naming_its_fix_once(c, s, a, tmp_path, caplog, mode, sub):
    """A worker whose cache directory is on a read-only file system gives one warning that
    names the directory and the fix once each (the trust check's refusal, the first write's
    EROFS and a directory it cannot create say the same), and runs uncached."""
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"ro,size=1m,mode={mode}", "tmpfs", str(ro)],
                   check=True, timeout=30)  # fmt: skip
    try:
        directory = ro / sub if sub else ro
        with caplog.at_level(logging.WARNING, logger="cacheaffinity.worker"):
            await c.register_plugin(CacheWorkerPlugin(directory=str(directory)))
        warnings = [r.getMessage() for r in caplog.records if r.name.startswith("cacheaffinity")]
        assert warnings == [
            f"cacheaffinity: cache directory {directory} is on a read-only file system; give a "
            "writable node-local directory with --cache-directory (or set "
            "cacheaffinity.worker.directory). This worker caches nothing."
        ]
        assert warnings[0].count("--cache-directory") == 1 and warnings[0].count(str(directory)) == 1
        plugin = a.plugins["cacheaffinity"]
        assert plugin.cache is None and "read-only file system" in plugin.uncached
    finally:
        subprocess.run(["umount", str(ro)], check=True, timeout=30)


def test_task_tallies_are_per_thread_nested_and_held_in_no_thread_local(tmp_path):
    """A chunk task's tally counts its own thread's figures (several task threads per worker),
    an inner tally shadows the outer one until it ends, and nothing is left once all ended.
    The plugin holds no ``threading.local``: on Python 3.11 the collector freeing one inside
    ``sys._current_frames()`` (distributed's profiler thread) deadlocks the whole process
    (CPython gh-106883; a default-tier run hung in test_peers with it)."""
    import threading

    plugin = CacheWorkerPlugin(directory=str(tmp_path / "cache"))
    assert not [k for k, v in vars(plugin).items() if isinstance(v, threading.local)]
    seen: dict[str, dict] = {}
    started = threading.Barrier(2)

    def task(name: str, n: int) -> None:
        with plugin.task_tally() as tally:
            started.wait(10)  # both tallies open at once
            for _ in range(n):
                plugin.count_task(hits=1)
            with plugin.task_tally() as inner:
                plugin.count_task(misses=1)
            plugin.count_task(bytes_served=n)
        seen[name] = {"outer": dict(tally), "inner": dict(inner)}

    threads = [threading.Thread(target=task, args=(f"t{n}", n)) for n in (3, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == {f"t{n}": {"outer": {"hits": n, "bytes_served": n}, "inner": {"misses": 1}} for n in (3, 5)}
    plugin.count_task(hits=1)  # no tally open in this thread: counted nowhere
    assert plugin._tallies == {}


def test_frame_snapshots_run_without_the_collector_and_leave_its_state_as_it_was():
    """``guard_frame_snapshots`` (Python < 3.12, CPython gh-106883): the wrapped
    ``_current_frames`` and ``_current_exceptions`` run with the collector disabled, enable
    it again after (also when they raise), leave a collector the user disabled disabled,
    and wrap only once."""
    import gc
    import types

    from cacheaffinity.worker._collector import guard_frame_snapshots

    seen = []

    def frames():
        seen.append(("frames", gc.isenabled()))
        return {1: "frame"}

    def exceptions():
        seen.append(("exceptions", gc.isenabled()))
        raise RuntimeError("boom")

    module = types.SimpleNamespace(_current_frames=frames, _current_exceptions=exceptions)
    assert guard_frame_snapshots(module) is True
    assert guard_frame_snapshots(module) is False  # idempotent
    assert module._current_frames.__wrapped__ is frames
    was = gc.isenabled()
    try:
        gc.enable()
        assert module._current_frames() == {1: "frame"} and gc.isenabled()
        with pytest.raises(RuntimeError, match="boom"):
            module._current_exceptions()
        assert gc.isenabled()
        gc.disable()
        assert module._current_frames() == {1: "frame"} and not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    assert seen == [("frames", False), ("exceptions", False), ("frames", False)]


def test_distributed_samples_task_threads_through_sys_current_frames():
    """The guard wraps ``sys._current_frames``; it covers distributed's profiler only while
    the worker calls it through the ``sys`` module (fails when upstream changes that)."""
    import inspect

    from distributed import Worker

    assert "sys._current_frames()" in inspect.getsource(Worker.trigger_profile)
