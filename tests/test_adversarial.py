"""Hardening, tried for real as an adversarial user and as an operator would.

Every scenario uses the real thing: a second Unix user (created with ``useradd`` when the
tests run as root, as they do here and in CI), real symbolic links and planted files, an
index with garbage pages, writers killed with SIGKILL, ``fork()`` with a lock held,
``dask scheduler``/``dask worker`` processes with bad settings, and coffea analyses of real
NanoAOD files whose results are compared with coffea's ``IterativeExecutor``.
"""

from __future__ import annotations

import glob
import json
import logging
import multiprocessing
import os
import pwd
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import dask
import numpy as np
import pytest
import xxhash
from coffea import processor
from coffea.nanoevents import NanoAODSchema
from distributed import Client, LocalCluster
from distributed.utils_test import gen_cluster

import cacheaffinity
from testbed import skip_or_fail
from cacheaffinity.worker._store import maintenance as store_maintenance
from cacheaffinity.worker._directory import UntrustedDirectory, trusted_directory
from cacheaffinity.worker._directory import read_or_create_node_id
from cacheaffinity.worker._store import DATA_DIR, INDEX_NAME, ColumnCache, MemoryFront
from helpers import Processes, fill
from examples.analysis import DimuonJetProcessor, summary

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")

BIN = Path(sys.executable).parent
CLI = BIN / "cacheaffinity"
LOGGER = "cacheaffinity.worker"
ADVERSARY = "ca-adversary"
#: The second user's processes run the system Python (the test venv lives under /root).
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"


# ====================================================================== helpers
@pytest.fixture(scope="module")
def adversary() -> pwd.struct_passwd:
    """A second, unprivileged Unix user (created if absent)."""
    if os.geteuid() != 0:
        skip_or_fail("acting as a second Unix user needs root (useradd, setuid)")
    try:
        return pwd.getpwnam(ADVERSARY)
    except KeyError:
        pass
    r = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", ADVERSARY],
        capture_output=True,
        text=True,
    )
    if r.returncode:
        try:
            return pwd.getpwnam("nobody")
        except KeyError:
            skip_or_fail(f"cannot create a second user: {r.stderr.strip()}")
    return pwd.getpwnam(ADVERSARY)


def as_user(user: pwd.struct_passwd, code: str) -> subprocess.CompletedProcess:
    """Run Python ``code`` as ``user`` (its own uid and group, no others)."""
    result = subprocess.run(
        [SYSTEM_PYTHON, "-c", textwrap.dedent(code)],
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=[],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture
def shared_tmp():
    """A world-writable sticky directory, like /tmp, that the second user can reach."""
    d = tempfile.mkdtemp(prefix="ca-shared-tmp-", dir="/tmp")
    os.chmod(d, 0o1777)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def warnings_of(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("cacheaffinity") and r.levelno >= logging.WARNING
    ]


def tree(path: Path) -> dict[str, tuple]:
    """Every entry below ``path`` with its owner, mode, size and mtime."""
    out = {}
    for p in sorted(path.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(path))] = (st.st_uid, st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def run_cli(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(CLI), *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


def assert_one_line_error(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


# ====================================================================== analyses
def run_analysis(executor, fileset) -> dict:
    runner = processor.Runner(executor=executor, schema=NanoAODSchema, chunksize=400)
    return summary(runner(fileset, processor_instance=DimuonJetProcessor(), treename="Events"))


@pytest.fixture(scope="module")
def fileset(nanoaod_dir):
    return {"dy": [str(nanoaod_dir / "nano_dy.root")]}


@pytest.fixture(scope="module")
def iterative(fileset):
    out = run_analysis(processor.IterativeExecutor(), fileset)
    assert out["dy"]["muons"] > 0, "the analysis selects something"
    return out


def run_cached(directory: Path, fileset) -> tuple[dict, dict, dict]:
    """One analysis on a one-worker cluster whose cache directory is ``directory``:
    (summary, cache counters of the run, the scheduler's cache nodes)."""
    config = {
        "distributed.scheduler.preload": ["cacheaffinity"],
        "distributed.worker.preload": ["cacheaffinity"],
        "cacheaffinity.worker.directory": str(directory),
    }
    with dask.config.set(config):
        with LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster, Client(cluster) as client:
            before = cacheaffinity.cache_totals(client)
            out = run_analysis(cacheaffinity.CacheAffinityExecutor(client=client, status=False), fileset)
            after = cacheaffinity.cache_totals(client)
            nodes = cacheaffinity.check(client)["nodes"]
    counts = {k: after.get(k, 0) - before.get(k, 0) for k in ("hits", "misses", "writes")}
    return out, counts, nodes


def poison(directory: Path) -> int:
    """Rewrite every floating-point column cached in ``directory`` (valid checksums:
    the store computes them), as someone who could write the directory could."""
    n = 0
    with ColumnCache(directory) as cache:
        packs = cache.index.query("SELECT grp, start, stop FROM entries WHERE grp IS NOT NULL")
        for key in [k for (k,) in cache.index.query("SELECT key FROM entries WHERE grp IS NULL")]:
            value = cache[key]
            if value.dtype.kind == "f":
                cache[key] = value * 2 + 1
                n += 1
        for grp, start, stop in packs:  # chunk packs: every float member rewritten
            for pack in cache.get_packs(grp, start, stop):
                if (pack.start, pack.stop) != (start, stop):
                    continue
                members = {k: v * 2 + 1 if v.dtype.kind == "f" else v for k, v in pack.members.items()}
                n += sum(v.dtype.kind == "f" for v in pack.members.values())
                cache.put_pack(grp, start, stop, members)
    (directory / "node-id").write_text("attacker-node-0123\n")
    return n


@pytest.mark.timeout(600)
def test_directory_squatted_by_another_user_runs_uncached_and_identical(
    adversary, shared_tmp, tmp_path, fileset, iterative, caplog
):
    # The poison works: planted in a directory the victim trusts, it changes the result.
    planted = tmp_path / "planted"
    first, counts, _ = run_cached(planted, fileset)
    assert first == iterative and counts["writes"] > 0
    assert poison(planted) > 0
    poisoned, counts, nodes = run_cached(planted, fileset)
    assert counts["hits"] > 0 and poisoned != iterative, "the planted columns were read"
    assert "attacker-node-0123" in nodes

    # The adversary creates the victim's predictable cache directory first, with the
    # planted columns and node id in it (all files theirs, as they would be).
    squatted = shared_tmp / f"cacheaffinity-{pwd.getpwuid(os.geteuid()).pw_name}"
    shutil.copytree(planted, squatted)
    for p in [squatted, *squatted.rglob("*")]:
        os.lchown(p, adversary.pw_uid, adversary.pw_gid)
    os.chmod(squatted, 0o755)
    before = tree(squatted)

    caplog.set_level(logging.WARNING, LOGGER)
    out, counts, nodes = run_cached(squatted, fileset)
    assert out == iterative  # uncached, and right
    assert counts["hits"] == 0 and counts["writes"] == 0
    assert "attacker-node-0123" not in nodes  # the planted identity is not used either
    assert tree(squatted) == before  # nothing read into the analysis, nothing written
    mentions = [w for w in warnings_of(caplog) if str(squatted) in w]
    # the worker refuses the directory once; the executor's run warnings name the
    # uncached node with that reason (degradation is visible)
    refusals = [w for w in mentions if "This worker caches nothing" in w]
    assert len(refusals) == 1, mentions
    assert f"owned by {adversary.pw_name} (uid {adversary.pw_uid})" in refusals[0]
    assert "cacheaffinity.worker.directory" in refusals[0]  # ... and the fix
    assert all("caches nothing" in w or "uncached" in w or "no usable cache" in w for w in mentions), mentions


def test_symbolic_link_is_never_followed(adversary, shared_tmp, tmp_path, caplog):
    precious = tmp_path / "precious"
    precious.mkdir(mode=0o700)
    (precious / "results.json").write_text('{"keep": true}')
    link = shared_tmp / "cacheaffinity-victim"
    as_user(adversary, f"import os; os.symlink({str(precious)!r}, {str(link)!r})")
    before = tree(precious)
    caplog.set_level(logging.WARNING, LOGGER)
    with ColumnCache(link, capacity="1 MiB") as cache:
        assert cache.untrusted and "symbolic link" in cache.untrusted
        cache["k"] = np.arange(10)  # no error, not stored
        assert cache.get("k") is None and len(cache) == 0
    assert tree(precious) == before  # no index, no data, no deletion where the link points
    (warning,) = warnings_of(caplog)
    assert str(link) in warning and str(precious) in warning
    # the worker's node id is not read or created through it either
    with pytest.raises(UntrustedDirectory, match="symbolic link"):
        trusted_directory(link)


@pytest.mark.parametrize(
    "mode, words",
    [
        pytest.param(0o777, "writable by group and others", id="0777"),
        pytest.param(0o770, "writable by group", id="0770"),
        pytest.param(0o703, "writable by others", id="0703"),
    ],
)
def test_directory_writable_by_others_is_refused(tmp_path, mode, words, caplog):
    d = tmp_path / "cache"
    d.mkdir()
    os.chmod(d, mode)
    caplog.set_level(logging.WARNING, LOGGER)
    with ColumnCache(d, capacity="1 MiB") as cache:
        assert cache.disabled and words in cache.disabled
        cache["k"] = np.arange(3)
        assert cache.get("k") is None
    (warning,) = warnings_of(caplog)
    assert f"mode {mode:04o}" in warning and f"chmod go-w {d}" in warning
    assert not (d / INDEX_NAME).exists()


def test_parent_without_sticky_bit_is_refused(tmp_path):
    parent = tmp_path / "open"
    parent.mkdir()
    os.chmod(parent, 0o777)  # anyone could rename the cache directory away
    with pytest.raises(UntrustedDirectory, match=r"without the sticky bit.*chmod \+t"):
        trusted_directory(parent / "cache")
    os.chmod(parent, 0o1777)  # like /tmp: fine
    assert trusted_directory(parent / "cache") == str(parent / "cache")
    assert stat.S_IMODE(os.stat(parent / "cache").st_mode) == 0o700


def test_new_directories_and_files_are_private(tmp_path):
    d = tmp_path / "a" / "cache"
    node = read_or_create_node_id(str(d))
    with ColumnCache(d, capacity="1 MiB") as cache:
        cache["k"] = np.arange(100)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    for sub in ("columns", "columns-tmp"):
        assert stat.S_IMODE(os.stat(d / sub).st_mode) == 0o700
    (data,) = glob.glob(str(d / DATA_DIR / "*" / "*"))
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o600
    assert read_or_create_node_id(str(d)) == node


def test_planted_entries_are_misses(adversary, tmp_path, caplog):
    d = tmp_path / "cache"
    with ColumnCache(d, capacity="1 MiB") as cache:
        cache["kept"] = np.arange(50, dtype=np.float64)
        cache["swapped"] = np.arange(50, dtype=np.float64)
        cache["linked"] = np.arange(50, dtype=np.float64)
    con = sqlite3.connect(d / INDEX_NAME)
    files = dict(con.execute("SELECT key, file FROM entries"))
    # Another user's file under an entry's name, with the index's checksum made to
    # match (as if the index had been writable too): not the entry's writer -> a miss.
    evil = (np.arange(50, dtype=np.float64) * 100).tobytes()
    victim = d / DATA_DIR / files["swapped"][:2] / files["swapped"]
    victim.unlink()
    victim.write_bytes(evil)
    os.chown(victim, adversary.pw_uid, adversary.pw_gid)
    con.execute(
        "UPDATE entries SET checksum = ? WHERE key = 'swapped'", (xxhash.xxh3_64_digest(evil),)
    )
    # A symbolic link in place of a data file: never followed.
    target = tmp_path / "elsewhere"
    target.write_bytes(evil)
    linked = d / DATA_DIR / files["linked"][:2] / files["linked"]
    linked.unlink()
    linked.symlink_to(target)
    con.execute("UPDATE entries SET checksum = ? WHERE key = 'linked'", (xxhash.xxh3_64_digest(evil),))
    con.commit()
    con.close()
    caplog.set_level(logging.WARNING, LOGGER)
    with ColumnCache(d, capacity="1 MiB") as cache:
        assert np.array_equal(cache["kept"], np.arange(50, dtype=np.float64))
        assert cache.get("swapped") is None
        assert cache.get("linked") is None
        assert "swapped" not in cache and "linked" not in cache  # entries removed
    messages = warnings_of(caplog)
    assert any(f"uid {adversary.pw_uid}" in m for m in messages), messages
    assert any("symbolic link" in m for m in messages), messages
    assert target.read_bytes() == evil  # the link's target was not deleted


def test_planted_index_link_is_refused(tmp_path):
    d = tmp_path / "cache"
    with ColumnCache(d, capacity="1 MiB") as cache:
        cache["k"] = np.arange(3)
    other = tmp_path / "other.sqlite3"
    (d / INDEX_NAME).rename(other)
    (d / INDEX_NAME).symlink_to(other)
    with ColumnCache(d, capacity="1 MiB") as cache:
        assert cache.disabled and "symbolic link" in cache.disabled
        assert cache.get("k") is None


# ====================================================================== shared group
SHARED_GROUP = "ca-share"


@pytest.fixture(scope="module")
def shared_group(adversary):
    """A Unix group with the second user as a member (created if absent)."""
    import grp

    try:
        grp.getgrnam(SHARED_GROUP)
    except KeyError:
        r = subprocess.run(["groupadd", "--system", SHARED_GROUP], capture_output=True, text=True)
        if r.returncode:
            skip_or_fail(f"cannot create a group: {r.stderr.strip()}")
    r = subprocess.run(
        ["usermod", "-a", "-G", SHARED_GROUP, adversary.pw_name], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    return grp.getgrnam(SHARED_GROUP)


def test_shared_group_cache_between_two_users(adversary, shared_group, shared_tmp, caplog):
    d = shared_tmp / "facility-cache"
    gid = shared_group.gr_gid
    with ColumnCache(d, capacity="1 MiB", shared_group=SHARED_GROUP) as cache:
        assert not cache.disabled, cache.disabled
        cache["mine"] = np.arange(20, dtype=np.int32)
    st = os.stat(d)
    assert st.st_gid == gid and stat.S_IMODE(st.st_mode) == 0o2770
    (data,) = glob.glob(str(d / DATA_DIR / "*" / "*"))
    # data files: group-readable, changed by nobody (written once; members may delete them)
    assert os.stat(data).st_gid == gid and stat.S_IMODE(os.stat(data).st_mode) == 0o640
    assert stat.S_IMODE(os.stat(d / INDEX_NAME).st_mode) == 0o660
    # The other member writes an entry of their own (a file they own, recorded as theirs)
    # and one that claims to be root's: the first is shared, the second is a miss.
    value = np.arange(30, dtype=np.int64)
    digest = xxhash.xxh3_64_digest(value.tobytes())
    toc = json.dumps([["", "<i8", [30], 0]])  # a plain entry's table of contents
    as_user_in_group = subprocess.run(
        [SYSTEM_PYTHON, "-c", textwrap.dedent(f"""
            import os, sqlite3, time
            d = {str(d)!r}
            con = sqlite3.connect(os.path.join(d, "columns.sqlite3"), timeout=30)
            for key, name, writer in (("theirs", "ab" + "1" * 30, os.getuid()),
                                      ("forged", "ab" + "2" * 30, 0)):
                os.makedirs(os.path.join(d, "columns", "ab"), exist_ok=True)
                path = os.path.join(d, "columns", "ab", name)
                with open(path, "wb") as f:
                    f.write(bytes.fromhex({value.tobytes().hex()!r}))
                con.execute(
                    "INSERT INTO entries (key, file, toc, nbytes, size, checksum,"
                    " stored, writer) VALUES (?, ?, ?, 240, 4096, ?, ?, ?)",
                    (key, name, {toc!r}, bytes.fromhex({digest.hex()!r}), time.time(), writer))
            con.commit()
        """)],
        user=adversary.pw_uid, group=adversary.pw_gid, extra_groups=[gid],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert as_user_in_group.returncode == 0, as_user_in_group.stderr
    caplog.set_level(logging.WARNING, LOGGER)
    with ColumnCache(d, capacity="1 MiB", shared_group=SHARED_GROUP) as cache:
        assert np.array_equal(cache["mine"], np.arange(20, dtype=np.int32))
        assert np.array_equal(cache["theirs"], value)  # members trust each other
        assert cache.get("forged") is None  # but nobody writes in another's name
    assert any("written by uid 0" in m for m in warnings_of(caplog))
    # The same directory is not a private cache (group-writable), nor shared with
    # another group; a shared directory without setgid is refused too.
    with ColumnCache(d, capacity="1 MiB") as cache:
        assert cache.untrusted and "writable by group" in cache.untrusted
    with pytest.raises(UntrustedDirectory, match="not to the shared group"):
        trusted_directory(d, shared_group=0)
    os.chmod(d, 0o0770)
    with pytest.raises(UntrustedDirectory, match="setgid"):
        trusted_directory(d, shared_group=SHARED_GROUP)
    os.chmod(d, 0o2777)
    with pytest.raises(UntrustedDirectory, match="writable by others"):
        trusted_directory(d, shared_group=SHARED_GROUP)


def test_unknown_shared_group_is_a_config_error(tmp_path):
    with pytest.raises(ValueError, match="shared-group='no-such-group-xyz' is not a Unix group"):
        ColumnCache(tmp_path / "c", shared_group="no-such-group-xyz")


# ====================================================================== damaged index
def damage(index: Path, offset_pages: int, pages: int) -> None:
    """Garbage over ``pages`` pages of the index file from page ``offset_pages`` on."""
    rng = np.random.default_rng(offset_pages)
    with open(index, "r+b") as f:
        f.seek(4096 * offset_pages)
        f.write(rng.integers(0, 256, 4096 * pages, dtype=np.uint8).tobytes())


def damage_rows(index: Path, pages: int) -> None:
    """Garbage over ``pages`` leaf pages of the index's ``entries`` table (from the middle of
    the table): rows there are lost, the others still read."""
    con = sqlite3.connect(index)
    try:
        leaves = [p for (p,) in con.execute(
            "SELECT pageno FROM dbstat WHERE name = 'entries' AND pagetype = 'leaf' ORDER BY pageno")]  # fmt: skip
    finally:
        con.close()
    assert len(leaves) > pages
    middle = len(leaves) // 2 - pages // 2
    for page in leaves[middle : middle + pages]:
        damage(index, page - 1, 1)  # SQLite numbers pages from 1


@pytest.mark.parametrize(
    "offset, pages, some_kept",
    [
        pytest.param(None, 8, True, id="garbage-pages"),
        pytest.param(0, 2, False, id="garbage-header"),
    ],
)
def test_damaged_index_is_rebuilt_on_open_keeping_node_id(tmp_path, caplog, offset, pages, some_kept):
    d = tmp_path / "cache"
    node = read_or_create_node_id(str(d))
    values = fill(d, 3000, capacity="100 MiB")
    size = os.path.getsize(d / INDEX_NAME)
    if offset is None:  # the middle of the file
        offset = size // 4096 // 2
    assert size > 4096 * (offset + pages)
    damage(d / INDEX_NAME, offset, pages)
    caplog.set_level(logging.WARNING, LOGGER)
    with ColumnCache(d, capacity="100 MiB", orphan_after=0) as cache:
        assert not cache.disabled
        assert cache.stats()["index_rebuilt"] == 1
        kept = [k for k in values if cache.get(k) is not None]
        for k in kept:
            assert np.array_equal(cache[k], values[k])
        assert (len(kept) > 0) == some_kept
        cache["new"] = np.arange(7)  # writes work again
        assert np.array_equal(cache["new"], np.arange(7))
        # files of lost entries are orphans, collected in bounded passes (one ran on
        # open); a pass over everything leaves only referenced files
        cache.collect_orphans(max_files=10**6)
        referenced = {r[0] for r in sqlite3.connect(d / INDEX_NAME).execute("SELECT file FROM entries")}
        on_disk = {os.path.basename(p) for p in glob.glob(str(d / DATA_DIR / "*" / "*"))}
        assert on_disk == referenced
    assert (d / "node-id").read_text().strip() == node
    assert (d / (INDEX_NAME + ".corrupt")).exists()
    rebuilt = [m for m in warnings_of(caplog) if "rebuilt" in m]
    assert len(rebuilt) == 1 and "node id kept" in rebuilt[0]
    assert sqlite3.connect(d / INDEX_NAME).execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def test_index_damaged_while_open_heals_and_writes_resume(tmp_path, caplog):
    d = tmp_path / "cache"
    values = fill(d, 2000, capacity="100 MiB")
    caplog.set_level(logging.WARNING, LOGGER)
    with ColumnCache(d, capacity="100 MiB") as cache:
        assert cache.get("uuid/Events/0-10/data/col5") is not None
        with sqlite3.connect(d / INDEX_NAME) as con:
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        damage(d / INDEX_NAME, 2, 20)
        results = [cache.get(k) for k in values]  # misses or right values, never errors
        for k, v in zip(values, results):
            assert v is None or np.array_equal(v, values[k])
        stored = []
        for i in range(20):
            cache[f"after/{i}"] = np.full(100, i)
            stored.append(cache.get(f"after/{i}"))
        assert all(v is not None and v[0] == i for i, v in enumerate(stored[1:], 1))
        assert cache.stats()["index_rebuilt"] == 1


def test_cli_on_a_damaged_index_then_repair(tmp_path):
    d = tmp_path / "cache"
    node = read_or_create_node_id(str(d))
    fill(d, 2000, capacity="100 MiB")
    damage_rows(d / INDEX_NAME, 10)
    before = (d / INDEX_NAME).read_bytes()
    for command in (("info",), ("verify",)):
        assert_one_line_error(run_cli("cache", *command, d), "damaged", "verify --repair")
    assert (d / INDEX_NAME).read_bytes() == before  # left as it was
    repaired = run_cli("cache", "verify", "--repair", "--json", d)
    assert repaired.returncode == 0, repaired.stderr
    result = json.loads(repaired.stdout)
    assert result["index_rebuilt"] and 0 < result["ok"] < 2000
    info = run_cli("cache", "info", "--json", d)
    assert info.returncode == 0 and json.loads(info.stdout)["node"] == node
    assert (d / "node-id").read_text().strip() == node
    # clear also recovers a damaged index
    damage(d / INDEX_NAME, 0, 2)
    cleared = run_cli("cache", "clear", "--yes", d)
    assert cleared.returncode == 0, cleared.stderr
    assert f"node id {node} kept" in cleared.stdout
    with ColumnCache(d) as cache:
        assert len(cache) == 0 and not cache.disabled


def test_cli_refuses_untrusted_and_missing_directories(adversary, tmp_path):
    d = tmp_path / "theirs"
    fill(d, 3, capacity="100 MiB")
    for p in [d, *d.rglob("*")]:
        os.lchown(p, adversary.pw_uid, adversary.pw_gid)
    assert_one_line_error(run_cli("cache", "info", d), str(d), f"owned by {adversary.pw_name}")
    assert_one_line_error(run_cli("cache", "verify", tmp_path / "missing"), "does not exist")


def test_where_with_a_bad_address_returns_promptly():
    start = time.monotonic()
    results = [
        run_cli("where", "--timeout", "1s", "--any-id", address, "chunk-1", timeout=60)
        for address in ("not-an-address", "tcp://127.0.0.1:1")
    ]
    assert time.monotonic() - start < 45
    assert_one_line_error(results[0], "neither a scheduler file nor an address")
    assert_one_line_error(results[1], "cannot connect to a Dask scheduler")


# ====================================================================== orphans
WRITER = """
import sys, numpy as np
from cacheaffinity.worker._store import ColumnCache
cache = ColumnCache(sys.argv[1], capacity=sys.argv[2])
print("ready", flush=True)
i = int(sys.argv[3])
while True:
    cache[f"k{i}"] = np.full(60_000, i, np.float64)  # ~470 KiB
    i += 1
"""


@pytest.mark.timeout(600)
def test_orphans_of_killed_writers_are_collected(tmp_path):
    d = tmp_path / "cache"
    capacity = 8 * 2**20
    rng = np.random.default_rng(0)
    start = 0
    for _round in range(3):
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", WRITER, str(d), str(capacity), str(start + 10_000 * j)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for j in range(6)
        ]
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        for p in procs:
            time.sleep(float(rng.uniform(0.05, 0.4)))
            p.send_signal(signal.SIGKILL)
            p.wait()
        start += 100_000
    with ColumnCache(d, capacity=capacity, orphan_after=0, stale_after=0) as cache:
        referenced = {r[0] for r in cache.index.query("SELECT file FROM entries")}
        files = glob.glob(str(d / DATA_DIR / "*" / "*"))
        assert {os.path.basename(f) for f in files} == referenced
        on_disk = sum(os.path.getsize(f) for f in files)
        assert on_disk <= capacity
        for key in cache:
            v = cache.get(key)
            assert v is None or (v == v[0]).all()


def test_orphans_are_collected_in_bounded_passes_and_by_writers(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    with ColumnCache(d, capacity="10 MiB") as cache:
        cache["k"] = np.arange(10)
    # files as a writer killed between rename and commit leaves them
    planted = []
    for i in range(40):
        name = f"{i:02x}" + "0" * 30
        path = d / DATA_DIR / name[:2] / name
        path.parent.mkdir(mode=0o700, exist_ok=True)
        path.write_bytes(b"x" * 100)
        planted.append(path)
    old = time.time() - 3600
    for p in planted:
        os.utime(p, (old, old))
    fresh = planted.pop()
    os.utime(fresh, None)  # young: may still be committed by a live writer
    monkeypatch.setattr(store_maintenance, "ORPHAN_BATCH", 8)
    with ColumnCache(d, capacity="10 MiB") as cache:  # one bounded pass on open
        left = [p for p in planted if p.exists()]
        assert 0 < len(left) < len(planted)
        while left:
            assert cache.collect_orphans(max_files=8) <= 8
            left = [p for p in planted if p.exists()]
        assert fresh.exists() and np.array_equal(cache["k"], np.arange(10))
    # writers run a pass every ORPHAN_INTERVAL seconds
    monkeypatch.setattr(store_maintenance, "ORPHAN_INTERVAL", 0.0)
    with ColumnCache(d, capacity="10 MiB", orphan_after=0) as cache:
        late = d / DATA_DIR / "ff" / ("ff" + "1" * 30)
        late.parent.mkdir(mode=0o700, exist_ok=True)
        late.write_bytes(b"y")
        for i in range(300):  # at most 256 passes visit every subdirectory
            cache[f"w{i}"] = np.arange(3)
            if not late.exists():
                break
        assert not late.exists() and cache.stats()["orphans_removed"] >= 1


# ====================================================================== fork
def _use_in_child(cache, front, conn):
    try:
        cache["child"] = np.arange(5)
        ok = np.array_equal(cache["child"], np.arange(5))
        front["f"] = np.arange(2)
        ok = ok and np.array_equal(front.get("f"), np.arange(2))
        conn.send(ok)
    finally:
        conn.close()


@pytest.mark.timeout(120)
def test_fork_while_another_thread_holds_the_locks(tmp_path):
    """Locks another thread holds at fork() are fresh in the child; the index's
    locks are never held across a fork: the fork waits for them."""
    cache = ColumnCache(tmp_path / "cache", capacity="1 MiB")
    front = MemoryFront(cache, capacity="1 MiB")
    cache["parent"] = np.arange(3)
    held, release, index_held = threading.Event(), threading.Event(), threading.Event()

    def hold():
        with cache.health._lock, cache.limit._lock, front._lock:
            held.set()
            release.wait(60)

    def hold_index():  # a thread inside SQLite for a second
        with cache.index.lock:
            index_held.set()
            time.sleep(1.0)

    threads = [threading.Thread(target=hold), threading.Thread(target=hold_index)]
    for t in threads:
        t.start()
    try:
        assert held.wait(10) and index_held.wait(10)
        ctx = multiprocessing.get_context("fork")
        parent_end, child_end = ctx.Pipe()
        child = ctx.Process(target=_use_in_child, args=(cache, front, child_end))
        t0 = time.monotonic()
        child.start()
        assert time.monotonic() - t0 > 0.5, "forked while a thread held the index lock"
        child.join(60)
        if child.is_alive():
            child.kill()
        assert child.exitcode == 0, "the child deadlocked on a lock held at fork()"
        assert parent_end.recv() is True
    finally:
        release.set()
        for t in threads:
            t.join()
    assert np.array_equal(cache["child"], np.arange(5))
    cache.close()


# ====================================================================== real processes
@pytest.fixture(scope="module")
def scheduler(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sched")
    procs = Processes(tmp)
    sched_file = tmp / "scheduler.json"
    procs.start(
        "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", "127.0.0.1:0",
        "--scheduler-file", str(sched_file), "--preload", "cacheaffinity", log="scheduler.log",
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        try:
            address = json.loads(sched_file.read_text())["address"]
            break
        except (FileNotFoundError, ValueError, KeyError):
            assert time.monotonic() < deadline, "no scheduler"
            time.sleep(0.1)
    yield {"file": sched_file, "address": address, "procs": procs, "tmp": tmp}
    procs.close()


WORKER = ("--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0", "--nthreads", "1")


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "env, nanny, words",
    [
        pytest.param(
            {"DASK_CACHEAFFINITY__WORKER__CAPACITY": "lots"}, False,
            "cacheaffinity.worker.capacity='lots' is not a size", id="capacity-lots",
        ),
        pytest.param(
            {"DASK_CACHEAFFINITY__WORKER__MEMORY": "-1 GiB"}, True,
            "cacheaffinity.worker.memory='-1 GiB' must be >= 0", id="memory-negative-nanny",
        ),
        pytest.param(
            {"DASK_CACHEAFFINITY__WORKER__CAPACTY": "1 GiB"}, False,
            "cacheaffinity.worker.capacty='1 GiB' is not a setting", id="typo",
        ),
        pytest.param(  # the click-free preload (dask-gateway's workers) stops the same way
            {"DASK_CACHEAFFINITY__WORKER__CAPACITY": "lots"}, True,
            "cacheaffinity.worker.capacity='lots' is not a size", id="click-free-preload",
        ),
    ],
)  # fmt: skip
def test_bad_worker_config_stops_a_real_worker(scheduler, tmp_path, env, nanny, words, request):
    start = time.monotonic()
    log = f"worker-{tmp_path.name}.log"
    if request.node.callspec.id == "click-free-preload":
        env = {**env, "DASK_CACHEAFFINITY__WORKER__DIRECTORY": str(tmp_path / "cache")}
        preload = ("--preload", "cacheaffinity.preload")
    else:
        preload = ("--preload", "cacheaffinity", f"--cache-directory={tmp_path / 'cache'}")
    p = scheduler["procs"].start(
        "worker", "--scheduler-file", str(scheduler["file"]), *WORKER,
        *(() if nanny else ("--no-nanny",)), *preload,
        log=log, env=env,
    )  # fmt: skip
    assert p.wait(120) != 0
    text = (scheduler["procs"].directory / log).read_text()
    assert "cacheaffinity: worker not started: invalid cacheaffinity setting" in text
    assert words in text
    # ... and what to write instead: an example, or the keys that exist
    assert "e.g." in text or "the keys of cacheaffinity.worker are admission, capacity" in text
    assert time.monotonic() - start < 120
    assert not (tmp_path / "cache").exists()  # it did not start uncached either


def test_bad_option_value_is_a_usage_error(scheduler):
    r = subprocess.run(
        [str(BIN / "dask"), "worker", "--scheduler-file", str(scheduler["file"]), *WORKER,
         "--preload", "cacheaffinity", "--cache-capacity", "lots"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "Invalid value for '--cache-capacity'" in r.stderr and "'lots' is not a size" in r.stderr


@pytest.mark.timeout(300)
def test_cache_directory_as_separate_argument_with_a_scheduler_file(scheduler, tmp_path):
    """``--cache-directory DIR`` (not only ``--cache-directory=DIR``) after a scheduler file."""
    directory = tmp_path / "node-a"
    p = scheduler["procs"].start(
        "worker", "--scheduler-file", str(scheduler["file"]), *WORKER, "--name", "split-a",
        "--preload", "cacheaffinity", "--cache-directory", str(directory),
        "--cache-capacity", "1 GiB", log="worker-split.log",
    )  # fmt: skip
    with Client(scheduler["address"], timeout=60) as client:
        deadline = time.monotonic() + 90
        while not (directory / "node-id").exists() or not any(
            v.get("name") == "split-a" for v in client.scheduler_info()["workers"].values()
        ):
            assert p.poll() is None, (scheduler["tmp"] / "worker-split.log").read_text()
            assert time.monotonic() < deadline, "the worker never joined"
            time.sleep(0.2)
        node = (directory / "node-id").read_text().strip()
        while node not in cacheaffinity.check(client)["nodes"]:
            assert time.monotonic() < deadline, "its cache node never registered"
            time.sleep(0.2)
        capacities = client.run(lambda dask_worker: dask_worker.plugins["cacheaffinity"].capacity)
        assert 2**30 in capacities.values()
    p.send_signal(signal.SIGINT)
    p.wait(30)


# ====================================================================== chunk ids
def square(x):
    return x * x


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_chunk_ids_are_refused_before_submission(c, s, a):
    items = list(range(5))
    with pytest.raises(TypeError, match=r"chunk_ids\[0\] must be a non-empty string, got NoneType"):
        cacheaffinity.map_chunks(c, square, items, chunk_ids=[None] * 5)
    with pytest.raises(TypeError, match=r"chunk_ids\[2\].*got int 7"):
        cacheaffinity.map_chunks(c, square, items, chunk_ids=["a", "b", 7, "d", "e"])
    too_long = ["x" * 1025] * 5
    with pytest.raises(ValueError, match=r"1,025 bytes.*max-chunk-id-length=1,024"):
        cacheaffinity.map_chunks(c, square, items, chunk_ids=too_long)
    with pytest.raises(ValueError, match="bytes long"):  # 300 characters, 1200 bytes
        cacheaffinity.chunk("\U0001f600" * 300)
    with pytest.raises(TypeError):
        cacheaffinity.chunk(None)
    with pytest.raises(TypeError, match="task 'k2'"):
        cacheaffinity.chunks({"k1": "a", "k2": None})
    assert not s.tasks  # nothing reached the scheduler
    at_limit = [f"{i}" + "y" * 1023 for i in range(5)]
    assert await c.gather(cacheaffinity.map_chunks(c, square, items, chunk_ids=at_limit)) == [
        x * x for x in items
    ]
    with dask.config.set({"cacheaffinity.client.max-chunk-id-length": "2 KiB"}):
        futures = cacheaffinity.map_chunks(c, square, items, chunk_ids=too_long, pure=False)
        assert await c.gather(futures) == [x * x for x in items]
    with dask.config.set({"cacheaffinity.client.max-chunk-id-length": "huge"}):
        with pytest.raises(ValueError, match="max-chunk-id-length='huge' is not a size"):
            cacheaffinity.chunk("a")
