"""The ``cacheaffinity`` command, run as a real process on real cache directories
and against real ``dask scheduler``/``dask worker`` processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from dask.utils import format_bytes
import pytest
from distributed import Client

import cacheaffinity
from cacheaffinity.worker import _forms as forms
from cacheaffinity.worker._forms import FormStore
from cacheaffinity.worker._directory import read_or_create_node_id
from cacheaffinity.worker._store import ColumnCache
from helpers import Processes

BIN = Path(sys.executable).parent
CLI = BIN / "cacheaffinity"
COLUMNS = 6
CHUNKS = [f"uuid-{f}/Events/s500:{i}" for f in range(2) for i in range(3)]


def run(*args, input=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(CLI), *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        input=input,
        timeout=120,
    )


def run_all(*commands) -> list[subprocess.CompletedProcess]:
    """Run several commands at once (each one imports dask: seconds of CPU)."""
    procs = [
        subprocess.Popen(
            [str(CLI), *map(str, args)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in commands
    ]
    out = []
    for args, p in zip(commands, procs):
        stdout, stderr = p.communicate(timeout=120)
        out.append(subprocess.CompletedProcess(args, p.returncode, stdout, stderr))
    return out


@pytest.fixture
def cache_dir(tmp_path) -> tuple[Path, str]:
    """A node's cache directory as a worker leaves it: node id, columns, one form."""
    directory = tmp_path / "node"
    node = read_or_create_node_id(str(directory))
    with ColumnCache(directory, capacity="1 MiB") as cache:
        for i in range(COLUMNS):
            cache[f"uuid/Events/0-10/data/col{i}"] = np.arange(1000, dtype=np.float32) + i
    doc = {"base_form": {}, "object_path": "Events", "num_entries": 10, "file_uuid": "uuid"}
    assert FormStore(str(directory)).put(FormStore.key("uuid", "Events"), doc)
    return directory, node


def test_version():
    result = run("--version")
    assert result.returncode == 0 and cacheaffinity.__version__ in result.stdout


def test_info_on_a_populated_cache(cache_dir):
    directory, node = cache_dir
    machine, human = run_all(
        ("cache", "info", directory, "--json", "--capacity", "1 MiB"), ("cache", "info", directory)
    )
    assert machine.returncode == 0, machine.stderr
    info = json.loads(machine.stdout)
    assert info["node"] == node and info["directory"] == str(directory)
    assert info["entries"] == COLUMNS and info["size"] == COLUMNS * 4096  # whole blocks
    assert info["capacity"] == 2**20 and info["capacity_source"] == "--capacity"
    assert info["forms"] == 1
    forms_dir = directory / "forms"
    assert info["forms_size"] == sum(f.stat().st_size for f in forms_dir.iterdir()) > 0
    assert info["forms_max"] == {"documents": forms.MAX_DOCUMENTS, "bytes": forms.MAX_BYTES}
    assert time.time() - 600 < info["oldest"] <= info["newest"] <= time.time()

    assert human.returncode == 0, human.stderr
    lines = {line[:13].strip(): line[14:] for line in human.stdout.splitlines()}
    assert lines["node id"] == node
    assert lines["entries"] == str(COLUMNS)
    assert lines["forms"] == (
        f"1, {format_bytes(info['forms_size'])} (at most {forms.MAX_DOCUMENTS:,} and "
        f"{format_bytes(forms.MAX_BYTES)}, outside the capacity)"
    )
    assert lines["size"].startswith("24.00 kiB")
    assert time.strftime("%Y-") in lines["oldest entry"] and "ago)" in lines["newest entry"]


def test_info_counts_the_form_store(cache_dir):
    """``cache info`` gives the form store's documents and bytes as the directory holds
    them (documents of several sizes; a temporary file left by a killed writer is not a
    document), and follows a removal."""
    directory, _ = cache_dir
    store = FormStore(str(directory))
    for i in range(1, 6):
        doc = {"kind": "TTree", "base_form": {"fields": [f"branch{j}" for j in range(200 * i)]}}
        assert store.put(FormStore.key(f"file-{i}", "Events"), doc, identity={"i": i})
    (directory / "forms" / "x.json.1.deadbeef.tmp").write_text("{")
    docs = sorted((directory / "forms").glob("*.json"))
    assert len(docs) == 6
    info = json.loads(run("cache", "info", directory, "--json").stdout)
    assert info["forms"] == 6
    assert info["forms_size"] == sum(f.stat().st_size for f in docs) > 5 * 200 * 8
    docs[0].unlink()
    after = json.loads(run("cache", "info", directory, "--json").stdout)
    assert after["forms"] == 5 and after["forms_size"] == sum(f.stat().st_size for f in docs[1:])
    human = run("cache", "info", directory)
    line = next(x for x in human.stdout.splitlines() if x.startswith("forms"))
    assert line[14:].startswith(f"5, {format_bytes(after['forms_size'])} (at most ")


def test_verify_detects_a_flipped_byte(cache_dir):
    directory, _ = cache_dir
    clean = run("cache", "verify", directory)
    assert clean.returncode == 0, clean.stderr
    assert f"checked {COLUMNS} entries: {COLUMNS} good, 0 corrupt" in clean.stdout

    data = sorted((directory / "columns").rglob("*"))
    victim = next(p for p in data if p.is_file())
    raw = bytearray(victim.read_bytes())
    raw[100] ^= 0x01
    victim.write_bytes(bytes(raw))

    found = run("cache", "verify", directory, "--json")
    assert found.returncode == 1
    result = json.loads(found.stdout)
    assert (result["checked"], result["ok"], result["corrupt"]) == (COLUMNS, COLUMNS - 1, 1)
    assert "corrupt cache entry" in found.stderr and "checksum" in found.stderr
    assert not victim.exists()  # removed with its entry

    again = run("cache", "verify", directory)
    assert again.returncode == 0 and f"{COLUMNS - 1} good, 0 corrupt" in again.stdout


def run_on_terminal(*args, answer: str) -> subprocess.CompletedProcess:
    """Run the command with a pseudo-terminal as stdin, typing ``answer`` into it."""
    import pty

    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([str(CLI), *map(str, args)], stdin=slave,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        os.close(slave)
        slave = None
        os.write(master, answer.encode())
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


def test_clear_keeps_the_node_id(cache_dir):
    directory, node = cache_dir
    declined = run_on_terminal("cache", "clear", directory, answer="n\n")
    assert declined.returncode == 1
    assert f"Remove {COLUMNS} entries" in declined.stderr and node in declined.stderr
    with ColumnCache(directory) as cache:
        assert len(cache) == COLUMNS  # nothing removed

    cleared = run("cache", "clear", directory, "--yes")
    assert cleared.returncode == 0, cleared.stderr
    assert f"removed {COLUMNS} entries" in cleared.stdout and "1 forms" in cleared.stdout
    assert (directory / "node-id").read_text().strip() == node
    assert read_or_create_node_id(str(directory)) == node
    with ColumnCache(directory) as cache:
        assert len(cache) == 0 and cache.volume() == 0
    assert len(FormStore(str(directory))) == 0
    assert not [p for p in (directory / "columns").rglob("*") if p.is_file()]


def _missing(tmp_path):
    return tmp_path / "nope" / "cache", "does not exist"


def _file(tmp_path):
    path = tmp_path / "node-id"
    path.write_text("somehost-0123456789ab\n")
    return path, "is not a directory"


def _empty(tmp_path):
    path = tmp_path / "scratch"
    path.mkdir()
    (path / "results.json").write_text("{}")
    return path, "is not a cacheaffinity cache directory"


def _parent_of_caches(tmp_path):
    read_or_create_node_id(str(tmp_path / "caches" / "worker-0"))
    return tmp_path / "caches", "give one of them: " + str(tmp_path / "caches" / "worker-0")


ALL_COMMANDS = (("info",), ("verify",), ("clear", "--yes"))


@pytest.mark.parametrize(
    "make_path, commands",
    [
        pytest.param(_missing, ALL_COMMANDS, id="does-not-exist"),
        pytest.param(_file, [("info",)], id="a-file"),
        pytest.param(_empty, ALL_COMMANDS, id="not-a-cache"),
        pytest.param(_parent_of_caches, [("verify",)], id="parent-of-caches"),
    ],
)
def test_wrong_path_is_a_clear_error_and_creates_nothing(tmp_path, make_path, commands):
    path, message = make_path(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    results = run_all(*[("cache", *command, path) for command in commands])
    for result in results:
        assert result.returncode == 2, (result.args, result.stdout, result.stderr)
        assert str(path) in result.stderr and message in result.stderr
        assert "give" in result.stderr  # ... and what to give instead
        assert not result.stdout
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


# ============================================================== where, on real processes
def _address(scheduler_file: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return json.loads(scheduler_file.read_text())["address"]
        except (FileNotFoundError, ValueError, KeyError):  # not (completely) written yet
            time.sleep(0.1)
    raise TimeoutError(f"no scheduler wrote {scheduler_file}")


@pytest.fixture(scope="module")
def schedulers(tmp_path_factory):
    """A scheduler with the plugin and one cache node, and one without the plugin."""
    tmp = tmp_path_factory.mktemp("where")
    procs = Processes(tmp)
    try:
        with_plugin = procs.scheduler("with-plugin", "--preload", "cacheaffinity")
        without_plugin = procs.scheduler("without-plugin")
        address = _address(with_plugin)
        cache = tmp / "cache-n1"
        procs.start(
            "worker", address, "--name", "n1", "--nthreads", "1", "--no-nanny",
            "--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0",
            "--preload", "cacheaffinity", "--cache-directory", str(cache),
            log="worker-n1.log",
        )  # fmt: skip
        with Client(address, timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
            (worker,) = client.scheduler_info()["workers"]
            node = (cache / "node-id").read_text().strip()
            deadline = time.monotonic() + 30
            while set(cacheaffinity.check(client)["nodes"]) != {node}:
                assert time.monotonic() < deadline, "the worker's cache node never registered"
                time.sleep(0.1)
        _address(without_plugin)
        yield {
            "address": address,
            "node": node,
            "worker": worker,
            "without_plugin": without_plugin,
        }
    finally:
        procs.close()


def test_where_names_node_and_workers(schedulers):
    text, machine, mistyped, own = run_all(
        ("where", schedulers["address"], *CHUNKS),
        ("where", "--json", schedulers["address"], CHUNKS[0]),
        ("where", schedulers["address"], CHUNKS[0], "foo"),
        ("where", "--any-id", "--json", schedulers["address"], "foo"),
    )
    # an id outside the chunk-id grammar is refused in one line, unless --any-id says it is
    # an identity of the user's own
    assert mistyped.returncode == 2 and not mistyped.stdout, mistyped
    assert mistyped.stderr.count("\n") == 1 and "'foo' is not a coffea chunk id" in mistyped.stderr
    assert "--any-id" in mistyped.stderr and "Traceback" not in mistyped.stderr
    assert own.returncode == 0, own.stderr
    assert json.loads(own.stdout) == {"foo": {"node": schedulers["node"], "workers": [schedulers["worker"]]}}
    assert text.returncode == 0, text.stderr
    header, *rows = text.stdout.splitlines()
    assert header.split() == ["chunk", "node", "workers"]
    assert [row.split() for row in rows] == [
        [chunk, schedulers["node"], schedulers["worker"]] for chunk in CHUNKS
    ]
    assert machine.returncode == 0, machine.stderr
    assert json.loads(machine.stdout) == {
        CHUNKS[0]: {"node": schedulers["node"], "workers": [schedulers["worker"]]}
    }


def test_where_without_plugin_or_scheduler_is_a_clear_error(schedulers):
    no_plugin, unreachable = run_all(
        ("where", schedulers["without_plugin"], CHUNKS[0]),  # a scheduler file works too
        ("where", "--timeout", "1s", "tcp://127.0.0.1:1", CHUNKS[0]),
    )
    assert no_plugin.returncode == 2 and not no_plugin.stdout
    assert "has no cacheaffinity plugin" in no_plugin.stderr
    assert "dask scheduler --preload cacheaffinity" in no_plugin.stderr
    assert unreachable.returncode == 2 and not unreachable.stdout
    assert "cannot connect to a Dask scheduler at tcp://127.0.0.1:1" in unreachable.stderr


def test_verify_repair_on_a_sound_index_changes_nothing(cache_dir):
    directory, node = cache_dir
    result = run("cache", "verify", "--repair", "--json", directory)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["index_rebuilt"] is False and out["ok"] == COLUMNS
    assert (directory / "node-id").read_text().strip() == node


def test_group_writable_directory_is_refused_unless_shared(cache_dir, tmp_path):
    import grp
    import os

    directory, _ = cache_dir
    os.chmod(directory, 0o2770)
    refused = run("cache", "info", directory)
    assert refused.returncode == 2 and not refused.stdout
    assert "writable by group" in refused.stderr and "shared-group" in refused.stderr
    assert "Traceback" not in refused.stderr
    group = grp.getgrgid(os.stat(directory).st_gid).gr_name
    shared = subprocess.run(
        [str(CLI), "cache", "info", "--json", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, DASK_CACHEAFFINITY__WORKER__SHARED_GROUP=group),
    )
    assert shared.returncode == 0, shared.stderr
    assert json.loads(shared.stdout)["entries"] == COLUMNS


def test_clear_without_a_terminal_names_yes(cache_dir):
    """No terminal on stdin (a script, cron): one line naming --yes, exit 1, nothing
    removed; with --yes it clears."""
    directory, node = cache_dir
    for stdin in (subprocess.DEVNULL, None):  # /dev/null; a pipe with an answer in it
        proc = subprocess.run(
            [str(CLI), "cache", "clear", str(directory)], stdin=stdin,
            input="y\n" if stdin is None else None, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr == (
            f"cacheaffinity cache clear: no terminal to confirm on; add --yes to clear {directory}\n"
        )
        assert "Aborted" not in proc.stderr and proc.stdout == ""
        with ColumnCache(directory) as cache:
            assert len(cache) == COLUMNS  # nothing removed
    cleared = run("cache", "clear", directory, "--yes")
    assert cleared.returncode == 0 and f"removed {COLUMNS} entries" in cleared.stdout
    helped = run("cache", "clear", "--help")
    assert "--yes" in helped.stdout and "without a terminal" in helped.stdout


# ============================================================== read-only, configured, corrupt
def _mount(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def read_only_view(tmp_path):
    """``bind(src, dst)``: ``src`` mounted read-only at ``dst`` (a real read-only file
    system: root ignores permission bits, not a read-only mount)."""
    from testbed import skip_or_fail

    mounts = []

    def bind(src: Path, dst: Path) -> Path:
        dst.mkdir(parents=True, exist_ok=True)
        r = _mount("--bind", str(src), str(dst))
        if r.returncode:
            skip_or_fail(f"bind mounts need root (CAP_SYS_ADMIN): {r.stderr.strip()}")
        mounts.append(dst)
        r = _mount("-o", "remount,bind,ro", str(dst))
        assert r.returncode == 0, r.stderr
        return dst

    yield bind
    for dst in reversed(mounts):
        subprocess.run(["umount", "-l", str(dst)], capture_output=True, timeout=60)


def _tree(directory: Path) -> dict[str, tuple[int, float]]:
    return {
        str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime)
        for p in sorted(directory.rglob("*"))
    }


@pytest.mark.parametrize("open_by_a_worker", [False, True], ids=["closed", "in-use-wal"])
def test_info_on_a_read_only_file_system(cache_dir, tmp_path, read_only_view, open_by_a_worker):
    directory, node = cache_dir
    # in use: a process holds the index open, so its -wal and -shm files exist
    holder = ColumnCache(directory, capacity="1 MiB") if open_by_a_worker else None
    try:
        if holder is not None:
            holder.get("uuid/Events/0-10/data/col0")
            assert (directory / "columns.sqlite3-shm").exists()
        view = read_only_view(directory, tmp_path / "ro")
        before = _tree(directory)
        machine, human, verify, clear = run_all(
            ("cache", "info", "--json", view), ("cache", "info", view),
            ("cache", "verify", view), ("cache", "clear", "--yes", view),
        )  # fmt: skip
        assert _tree(directory) == before  # nothing written, through the view or beside it
    finally:
        if holder is not None:
            holder.close()
    assert machine.returncode == 0, machine.stderr
    info = json.loads(machine.stdout)
    assert info["node"] == node and info["entries"] == COLUMNS and info["forms"] == 1
    assert info["size"] == COLUMNS * 4096 and info["read_only"] == "read-only file system"
    assert info["capacity"] == 2**20 and info["capacity_source"] == "the cache directory's settings"
    assert not machine.stderr
    assert human.returncode == 0, human.stderr
    assert "read-only (read-only file system)" in human.stdout and not human.stderr
    for result, verb in ((verify, "verify"), (clear, "clear")):
        assert result.returncode == 2 and not result.stdout, (verb, result.stderr)
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"Error: cannot {verb} {view}: it is on a read-only file system")
        assert "mounted read-write" in line
        assert "workers run as" not in line and "write access" not in line  # not a user problem


def test_info_without_dir_uses_the_configured_directory(cache_dir, tmp_path):
    directory, node = cache_dir
    env = dict(os.environ, DASK_CACHEAFFINITY__WORKER__DIRECTORY=str(directory))
    r = subprocess.run(
        [str(CLI), "cache", "info", "--json"], capture_output=True, text=True, timeout=120, env=env
    )
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["directory"] == str(directory) and info["node"] == node
    assert info["entries"] == COLUMNS
    per_worker = dict(env, DASK_CACHEAFFINITY__WORKER__DIRECTORY=str(tmp_path / "c-{name}"))
    r = subprocess.run(
        [str(CLI), "cache", "info"], capture_output=True, text=True, timeout=120, env=per_worker
    )
    assert r.returncode == 2 and not r.stdout
    assert "{name}" in r.stderr and "give DIR" in r.stderr and len(r.stderr.splitlines()) == 1
    helped = run("cache", "info", "--help")
    assert "Without DIR" in helped.stdout and "cacheaffinity.worker.directory" in helped.stdout


def test_many_corrupt_entries_give_one_warning(tmp_path):
    """The store warns once per kind of damage and cache, not once per entry."""
    directory = tmp_path / "node"
    read_or_create_node_id(str(directory))
    n = 40
    with ColumnCache(directory, capacity="10 MiB") as cache:
        for i in range(n):
            cache[f"uuid/Events/{i}-{i + 1}/data/c"] = np.arange(500, dtype=np.int64) + i
    for path in (p for p in (directory / "columns").rglob("*") if p.is_file()):
        raw = bytearray(path.read_bytes())
        raw[8] ^= 0xFF
        path.write_bytes(bytes(raw))
    r = run("cache", "verify", "--json", directory)
    assert r.returncode == 1
    assert json.loads(r.stdout)["corrupt"] == n
    warned = [line for line in r.stderr.splitlines() if "corrupt cache entry" in line]
    assert len(warned) == 1, r.stderr
    assert "counted as 'corrupt'" in warned[0]  # ... and says where the others went


# ============================================================== where --file
@pytest.mark.timeout(300)
def test_where_file_lists_the_chunk_ids_the_executor_gives(tmp_path, nanoaod_dir):
    """``where --file F --chunksize N`` names the chunks a coffea run with
    CacheAffinityExecutor submits (recorded by a scheduler plugin) and their nodes."""
    import dask
    from coffea import processor
    from coffea.nanoevents import NanoAODSchema
    from distributed import LocalCluster
    from distributed.diagnostics.plugin import SchedulerPlugin

    from cacheaffinity.protocol import ANNOTATION
    from examples.analysis import DimuonJetProcessor

    submitted: set[str] = set()

    class Recorder(SchedulerPlugin):
        name = "test-recorder"

        def update_graph(self, scheduler, *, annotations=None, **kwargs):
            ids = (annotations or {}).get(ANNOTATION) or {}
            submitted.update(str(c) for c in ids.values() if not str(c).startswith("file:"))

    path = str(nanoaod_dir / "nano_dy.root")
    config = {
        "distributed.scheduler.preload": ["cacheaffinity"],
        "distributed.worker.preload": ["cacheaffinity"],
        "cacheaffinity.worker.directory": str(tmp_path / "node-{name}"),
    }
    with dask.config.set(config), LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, protocol="tcp://", host="127.0.0.1",
        dashboard_address="127.0.0.1:0",
    ) as cluster, Client(cluster) as client:  # fmt: skip
        cluster.scheduler.add_plugin(Recorder())
        runner = processor.Runner(
            executor=cacheaffinity.CacheAffinityExecutor(client=client, status=False),
            schema=NanoAODSchema, chunksize=7,
        )  # fmt: skip
        runner({"dy": [path]}, processor_instance=DimuonJetProcessor(), treename="Events")
        assert submitted
        address = cluster.scheduler_address
        machine, text, bad = run_all(
            ("where", "--json", address, "--file", path, "--chunksize", 7),
            ("where", address, "--file", path, "--chunksize", 7),
            ("where", address, "--file", tmp_path / "nope.root", "--chunksize", 7),
        )
        homes = cacheaffinity.where(client, sorted(submitted))
    assert machine.returncode == 0, machine.stderr
    listed = json.loads(machine.stdout)
    assert set(listed) == submitted
    assert {c: h["node"] for c, h in listed.items()} == {c: h["node"] for c, h in homes.items()}
    import uproot

    with uproot.open(path) as f:
        entries = f["Events"].num_entries
    spans = sorted(tuple(map(int, s.split("-"))) for h in listed.values() for s in h["entries"])
    assert spans[0][0] == 0 and spans[-1][1] == entries and len(spans) == -(-entries // 7)
    assert text.returncode == 0 and text.stdout.splitlines()[0].split() == [
        "chunk", "node", "entries", "workers",
    ]  # fmt: skip
    assert bad.returncode == 2 and not bad.stdout and "no such file" in bad.stderr


def test_preload_options_lists_what_dask_worker_help_cannot():
    """``dask worker --preload cacheaffinity --help`` prints Dask's own help (it runs before
    distributed imports the preload), so ``cacheaffinity preload-options`` lists the preload's
    options with their config keys, ``cacheaffinity --help`` names that command, and so does
    a usage error of the preload."""
    from cacheaffinity.preload import _VALUED_OPTIONS

    procs = [
        subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for cmd in (
            [str(BIN / "dask"), "worker", "--preload", "cacheaffinity", "--help"],
            [str(CLI), "preload-options"],
            [str(CLI), "--help"],
            [str(BIN / "dask"), "worker", "tcp://127.0.0.1:1", "--no-nanny", "--preload",
             "cacheaffinity", "--cache-capasity", "1"],
        )
    ]  # fmt: skip
    (dask_help, _), (listed, listed_err), (top, _), (_, usage_error) = (
        p.communicate(timeout=120) for p in procs
    )
    assert [p.returncode for p in procs] == [0, 0, 0, 2], (listed_err, usage_error)
    # what the docs say: Dask's help does not show them (if it ever does, say so in the docs)
    assert "Usage: dask worker" in dask_help
    assert not [o for o in _VALUED_OPTIONS if o in dask_help]
    lines = listed.splitlines()
    assert lines[0] == "Usage: dask scheduler|worker --preload cacheaffinity [OPTIONS]"
    body = " ".join(listed.split())  # the help wraps its columns
    table = lines[lines.index("Options:") + 1:]
    assert sorted(line.split()[0] for line in table if line.startswith("  --")) == sorted(_VALUED_OPTIONS)
    for _, key in _VALUED_OPTIONS.values():
        assert f"[configcacheaffinity.{key}" in "".join(body.split()), key  # wrapped at "-" too
    assert "[config cacheaffinity.worker.capacity; default 10 GiB]" in body
    assert any(line.split()[:1] == ["preload-options"] for line in top.splitlines()), top
    assert "Described by: cacheaffinity preload-options" in usage_error.splitlines(), usage_error
