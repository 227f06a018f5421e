"""The admission policy's bookkeeping in the index (cacheaffinity/worker/_store/admitter.py):
the same decisions as the simulator's in-memory policy, an in-place upgrade of schema 3,
several processes of one node, and memory that does not grow with the entries held.
Real directories, real SQLite, real processes."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
import sqlite3
import tracemalloc

import numpy as np
import pytest

import cacheaffinity.config  # noqa: F401  (registers the config defaults)
from cacheaffinity.worker._store import BLOCK, INDEX_NAME, SCHEMA_VERSION, ColumnCache
from cacheaffinity.worker._store.admission import StableRank, rank
from cacheaffinity.worker._store import admitter
from cacheaffinity.worker._store.admitter import IndexEntries, IndexSample, Unplanned
from test_admitter import CAPACITY, KEYS, scan, value  # the same keys, values and runs (tests/unit)


def _empty_index(directory) -> sqlite3.Connection:
    with ColumnCache(directory, capacity=1 << 30, admission="fifo"):
        pass
    return sqlite3.connect(os.path.join(directory, INDEX_NAME), isolation_level=None)


class IndexPolicy:
    """A StableRank whose entries and sample live in a real index, driven as the store does."""

    def __init__(self, directory, capacity: float, **params):
        self.con = _empty_index(directory)
        self.p = StableRank(capacity, **params)
        self.p.table = IndexEntries(self.con, writing=True)  # drops superseded records, as the store does
        self.p.sample = IndexSample(self.con)

    def lookup(self, key: str, size: int) -> bool:
        hit = self.p.lookup(key, size)
        self.p.table.flush()
        self.p.sample.flush()
        return hit

    def offer(self, key: str, size: int) -> list[str] | None:
        victims = self.p.offer(key, size)
        if victims is not None:
            r, used, due, dist = self.p.table.fields.pop(key)
            self.con.execute(
                "INSERT INTO entries (key, file, toc, nbytes, size, checksum, stored, rank, last_used, "
                "stale_from, reuse_dist) VALUES (?, ?, '[]', ?, ?, x'00', 0, ?, ?, ?, ?)",
                (key, os.urandom(16).hex(), size, size, r, used, due, dist),  # stored values
            )
        return victims

    def held(self) -> set[str]:
        return {k for (k,) in self.con.execute("SELECT key FROM entries")}


def trace(seed: int, n_keys: int = 300, runs: int = 8) -> list[tuple[str, int]]:
    """Scans of overlapping key sets (a working set larger than the cache, a change of
    workload, keys of varied sizes): what an analysis' runs look like to a node."""
    rng = random.Random(seed)
    sizes = {f"k{seed}-{i}": BLOCK * rng.choice((1, 1, 2, 3)) for i in range(n_keys)}
    keys = list(sizes)
    out = []
    for run in range(runs):
        part = keys[: n_keys * 2 // 3] if run < runs // 2 else keys[n_keys // 3 :]
        order = part[:]
        if run % 3 == 2:
            rng.shuffle(order)
        out += [(k, sizes[k]) for k in order]
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_index_decides_as_the_simulators_policy_does(tmp_path, seed):
    """Every lookup's answer, every offer's victims, the held set and the learnt scalars
    agree step by step between the in-memory entries and the index's."""
    capacity = 100 * BLOCK * (1 + seed % 3)
    mem = StableRank(capacity, sample=64)
    idx = IndexPolicy(tmp_path, capacity, sample=64)
    for step, (key, size) in enumerate(trace(seed)):
        hit = mem.lookup(key, size)
        assert idx.lookup(key, size) == hit, step
        if not hit:
            # read only (an insert's pre-check): the inbox searched, not moved; then written
            first = mem.table.first_due()
            reader = IndexEntries(idx.con)
            assert reader.first_due() == first, step
            if first is not None:
                assert reader.first_due({first[1]}) == mem.table.first_due({first[1]}), step
            assert idx.offer(key, size) == mem.offer(key, size), step
        if step % 97 == 0:
            assert idx.held() == set(mem.table._e), step
    assert idx.held() == set(mem.table._e)
    assert idx.p.scalars() == mem.scalars()
    assert idx.p.sample.items() == mem.sample.items()
    assert idx.p.used == mem.used and len(idx.p) == len(mem)
    assert mem.demand is not None  # the trace exercised the demand and staleness


# --- schema 3 -> 4 -------------------------------------------------------------------------

#: Schema 3 as cacheaffinity 0.x (up to 5ec0418) created it, with the admission tables its
#: ``Admitter`` added.
SCHEMA_3 = """
CREATE TABLE entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL UNIQUE, grp TEXT, start INTEGER,
    stop INTEGER, file TEXT NOT NULL, toc TEXT NOT NULL, nbytes INTEGER NOT NULL,
    size INTEGER NOT NULL, checksum BLOB NOT NULL, stored REAL NOT NULL, writer INTEGER);
CREATE INDEX entries_file ON entries(file);
CREATE INDEX entries_grp ON entries(grp, start);
CREATE TABLE meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT INTO meta VALUES ('size', 0), ('count', 0);
CREATE TABLE settings (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TRIGGER entries_insert AFTER INSERT ON entries BEGIN
    UPDATE meta SET value = value + NEW.size WHERE name = 'size';
    UPDATE meta SET value = value + 1 WHERE name = 'count'; END;
CREATE TRIGGER entries_delete AFTER DELETE ON entries BEGIN
    UPDATE meta SET value = value - OLD.size WHERE name = 'size';
    UPDATE meta SET value = value - 1 WHERE name = 'count'; END;
CREATE TABLE admission (key TEXT PRIMARY KEY, meta TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE admission_state (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TRIGGER entries_delete_admission AFTER DELETE ON entries BEGIN
    DELETE FROM admission WHERE key = OLD.key; END;
INSERT INTO settings VALUES ('layout', 4);
PRAGMA user_version=3;
"""

def test_a_schema_3_index_is_upgraded_in_place_keeping_entries_and_policy_state(tmp_path, caplog):
    # a schema-4 cache made by today's code, then turned into what schema 3 held
    with ColumnCache(tmp_path / "new", capacity=40 * BLOCK) as cache:
        for _ in range(3):
            for k in KEYS:
                if cache.get(k) is None:
                    cache[k] = value(k)
    new = sqlite3.connect(tmp_path / "new" / INDEX_NAME)
    rows = new.execute(
        "SELECT key, grp, start, stop, file, toc, nbytes, size, checksum, stored, writer, last_used, "
        "stale_from, reuse_dist FROM entries ORDER BY id"
    ).fetchall()
    state = json.loads(new.execute("SELECT value FROM admission_state WHERE name = 'state'").fetchone()[0])
    sample = new.execute("SELECT h, t FROM admission_sample").fetchall()
    capacity = new.execute("SELECT value FROM settings WHERE name = 'capacity'").fetchone()[0]
    new.close()
    assert len(rows) == 20 and state["demand"]
    old = tmp_path / "old"
    os.rename(tmp_path / "new", old)
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(f"{old / INDEX_NAME}{suffix}"):
            os.unlink(f"{old / INDEX_NAME}{suffix}")
    con = sqlite3.connect(old / INDEX_NAME, isolation_level=None)
    con.executescript(SCHEMA_3)
    con.executemany("INSERT INTO entries (key, grp, start, stop, file, toc, nbytes, size, checksum, stored, "
                    "writer) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [r[:11] for r in rows])  # fmt: skip
    con.executemany("INSERT INTO admission VALUES (?, ?)", [(r[0], json.dumps(list(r[11:]))) for r in rows])
    state["sample"] = [[h + 2**63, (h + 2**63) / 2**64, t] for h, t in sample]
    con.execute("INSERT INTO admission_state VALUES ('state', ?)", (json.dumps(state),))
    con.execute("INSERT INTO admission_state VALUES ('version', '7')")
    con.execute("INSERT INTO settings VALUES ('capacity', ?)", (capacity,))
    con.close()

    with caplog.at_level("INFO", "cacheaffinity.worker"):
        cache = ColumnCache(old, capacity=40 * BLOCK)
    with cache:
        assert f"upgraded from schema 3 to {SCHEMA_VERSION}" in caplog.text
        assert len(cache) == 20  # nothing dropped
        held = {r[0] for r in rows}
        got = {k: cache.get(k) for k in KEYS}  # one lookup each, as a run does
        hits = sum(v is not None and np.array_equal(v, value(k)) for k, v in got.items())
        assert hits == 20
        assert cache.stats()["writes"] == 0
        cache.save_admission(force=True)
        assert cache.admission.describe()["demand"] == pytest.approx(state["demand"], rel=0.2)
    con = sqlite3.connect(old / INDEX_NAME)
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    # every looked-up row has its record of when it goes stale, valid
    looked = set(con.execute("SELECT stale_from, id FROM entries WHERE stale_from >= 0").fetchall())
    assert looked and looked <= set(con.execute(f"SELECT stale_from, id FROM {_DUE}").fetchall())
    tables = {n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "admission" not in tables
    got = dict(con.execute("SELECT key, rank FROM entries"))
    assert set(got) == held and all(got[k] == rank(k) for k in got)
    assert con.execute("SELECT count(*) FROM admission_sample").fetchone()[0] == len(sample)
    con.close()


# --- several processes of one node ----------------------------------------------------------


def _scanner(directory: str, me: int, procs: int, runs: int, capacity: int, barrier, queue) -> None:
    cache = ColumnCache(directory, capacity=capacity, admission="rank")
    hits = []
    for run in range(runs):
        barrier.wait(120)
        hits.append(scan(cache, [k for i, k in enumerate(KEYS) if (i + run) % procs == me]))
        cache.save_admission(force=True)
    cache.close()
    queue.put((me, hits))


def test_eight_processes_of_one_node_share_the_policy_in_the_index(tmp_path):
    capacity = 40 * BLOCK  # 20 of the 80 values
    ctx = multiprocessing.get_context("spawn")
    procs, runs = 8, 5
    barrier, queue = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_scanner, args=(str(tmp_path), me, procs, runs, capacity, barrier, queue))
               for me in range(procs)]  # fmt: skip
    for w in workers:
        w.start()
    results = dict(queue.get(timeout=300) for _ in workers)
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    per_run = [sum(results[me][run] for me in results) for run in range(runs)]
    with ColumnCache(tmp_path, capacity=capacity, admission="rank") as cache:
        assert cache.volume() <= capacity and len(cache) == 20
        con = sqlite3.connect(tmp_path / INDEX_NAME)
        count, size = (v for (v,) in con.execute("SELECT value FROM meta WHERE name IN ('count', 'size') ORDER BY name"))
        assert (count, size) == con.execute("SELECT count(*), sum(size) FROM entries").fetchone()
        # every looked-up row has exactly one valid record of when it goes stale
        records, valid, looked = _due_records(con)
        assert valid == looked > 0 and records >= valid
        con.close()
        held = set(cache)
    lowest = set(sorted(KEYS, key=rank)[:20])
    # 8 processes' lookups interleave; together they keep (nearly) the lowest ranks
    assert len(held & lowest) >= 16, sorted(held)
    assert min(per_run[2:]) >= 14, per_run


# --- memory ----------------------------------------------------------------------------------


def _fill(directory, n: int) -> None:
    with ColumnCache(directory, capacity=n * BLOCK, admission="rank", write_queue=0) as cache:
        for i in range(n):
            cache[f"e{i:06d}"] = np.full(4, i, np.int64)
        assert len(cache) == n


def test_a_process_holds_no_per_entry_state(tmp_path):
    """Opening a cache and looking up entries allocates the same whether it holds 200 or
    4,000 entries (the old policy held ~1 KB per entry in every process)."""
    peaks = {}
    for n in (200, 4000):
        d = tmp_path / str(n)
        _fill(d, n)
        tracemalloc.start()
        with ColumnCache(d, capacity=n * BLOCK, admission="rank") as cache:
            for i in range(0, n, max(1, n // 150)):
                assert cache.get(f"e{i:06d}") is not None
            cache.save_admission(force=True)
            adm = cache.admission
            assert len(adm._policy.sample) <= adm._policy.sample_size
            _, peaks[n] = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peaks[4000] < peaks[200] + 256 * 1024, peaks  # 3,800 more entries: < 70 bytes each


def _steps(con: sqlite3.Connection, fn):
    """(fn's result, SQLite VM steps it took, in hundreds)."""
    steps = [0]

    def tick():
        steps[0] += 1
        return 0

    con.set_progress_handler(tick, 100)
    try:
        return fn(), steps[0]
    finally:
        con.set_progress_handler(None, 0)


def test_the_oldest_fresh_entry_is_found_from_a_watermark_that_passes_each_row_once(tmp_path):
    """Entries not looked up since stored are found by row id from a watermark (no index
    that every first lookup would change): each row is passed over once, not per call."""
    idx = IndexPolicy(tmp_path, 1e12)
    keys = [f"w{i:05d}" for i in range(3000)]
    for k in keys:
        idx.lookup(k, BLOCK)
        idx.offer(k, BLOCK)
    table = idx.p.table
    assert table.first_fresh() == (BLOCK * 1.0, keys[0]) and table.fresh_from == 1
    for k in keys[:2990]:  # looked up again: no longer fresh
        idx.lookup(k, BLOCK)
    first, walk = _steps(idx.con, table.first_fresh)
    assert first[1] == keys[2990] and table.fresh_from == 2991
    again, once = _steps(idx.con, table.first_fresh)
    assert again == first and once * 20 < walk, (once, walk)  # the rows passed are not passed again
    assert table.first_fresh(exclude={keys[2990]})[1] == keys[2991] and table.fresh_from == 2991
    for k in keys[2990:]:
        idx.lookup(k, BLOCK)
    assert table.first_fresh() is None and table.fresh_from == 3001  # none: past the last row
    idx.lookup("w-new", BLOCK)
    idx.offer("w-new", BLOCK)
    assert table.first_fresh()[1] == "w-new"


def _as_schema_4(path: str, old_indexes: bool = False) -> None:
    """Turn today's index into what schema 4 held: ``entries_stale`` (``old_indexes``: the
    earlier ``entries_fresh`` and ``entries_due``, and NULL in rows not looked up) instead
    of ``admission_due`` and its triggers."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("DROP TRIGGER entries_due_insert")
    con.execute("DROP TRIGGER entries_due_update")
    con.execute("DROP TABLE admission_due")
    con.execute("DROP TABLE admission_inbox")
    if old_indexes:
        con.execute("DROP INDEX entries_unclocked")
        con.execute("CREATE INDEX entries_fresh ON entries(last_used) WHERE stale_from IS NULL")
        con.execute("CREATE INDEX entries_due ON entries(stale_from) WHERE stale_from IS NOT NULL")
        con.execute("UPDATE entries SET stale_from = NULL, reuse_dist = NULL WHERE stale_from < 0")
    else:
        con.execute("CREATE INDEX entries_stale ON entries(stale_from) WHERE stale_from >= 0")
    con.execute("PRAGMA user_version=4")
    con.close()


def test_a_schema_4_index_with_the_old_fresh_index_is_upgraded_on_open_and_the_watermark_is_shared(tmp_path):
    """An index made before the watermark (``entries_fresh``, changed by every first
    lookup) and before ``UNSET`` (``entries_due``, NULL in rows not looked up) loses those
    indexes on its first open; its NULLs read as not set; the watermark is saved for the
    node's other processes, and a replaced policy state starts it again from the first row."""
    n = 200
    _fill(tmp_path, n)
    _as_schema_4(os.path.join(tmp_path, INDEX_NAME), old_indexes=True)
    with ColumnCache(tmp_path, capacity=n * BLOCK, admission="rank", write_queue=0) as cache:
        names = {n for (n,) in cache.index.query("SELECT name FROM sqlite_master WHERE type IN ('index', 'table')")}
        assert not {"entries_fresh", "entries_due", "entries_stale"} & names
        assert {"entries_unclocked", "admission_due"} <= names
        # a NULL is read as not set: no entry is stale, the oldest not looked up is the first
        table = IndexEntries(sqlite3.connect(os.path.join(tmp_path, INDEX_NAME)))
        assert table.first_due() is None and table.first_fresh()[1] == "e000000"
        assert table.get("e000007")[3:] == (None, None)
        table.con.close()
        assert len(cache) == n
        for i in range(n):  # a re-run: every entry looked up, none fresh
            assert cache.get(f"e{i:06d}") is not None
        cache.save_admission(force=True)
        cache["e-new"] = np.full(4, -1, np.int64)  # a miss into the full cache: looks for a fresh entry
        cache.save_admission(force=True)
    con = sqlite3.connect(os.path.join(tmp_path, INDEX_NAME), isolation_level=None)
    saved = int(con.execute("SELECT value FROM admission_state WHERE name = 'fresh_from'").fetchone()[0])
    top = con.execute("SELECT max(id) FROM entries WHERE key != 'e-new'").fetchone()[0]
    assert saved > top  # every row stored before the re-run was passed
    con.execute("UPDATE admission_state SET value = 'not json' WHERE name = 'state'")
    con.close()
    with ColumnCache(tmp_path, capacity=n * BLOCK, admission="rank", write_queue=0) as cache:
        assert cache.get("e000000") is not None
        cache.save_admission(force=True)  # the state is replaced: every entry fresh again
        assert cache.admission._fresh_from == 0
        assert cache.index.query(f"SELECT count(*) FROM {_DUE}")[0][0] == 0


def test_a_schema_4_index_is_upgraded_in_place_and_evicts_the_stalest_entry_as_before(tmp_path):
    """Schema 4's rows and ``entries_stale`` become schema 5's ``admission_due``, one record
    per looked-up row: the next eviction takes the entry that ``entries_stale`` ordered first."""
    n = 100
    _fill(tmp_path, n)
    with ColumnCache(tmp_path, capacity=n * BLOCK, admission="rank", write_queue=0) as cache:
        for i in range(0, n, 2):  # half the entries looked up: those are "due" entries
            assert cache.get(f"e{i:06d}") is not None
        cache.save_admission(force=True)
    path = os.path.join(tmp_path, INDEX_NAME)
    _as_schema_4(path)
    con = sqlite3.connect(path)
    first = con.execute("SELECT key FROM entries WHERE stale_from >= 0 ORDER BY stale_from, id LIMIT 1").fetchone()[0]
    looked = con.execute("SELECT count(*) FROM entries WHERE stale_from >= 0").fetchone()[0]
    con.close()
    assert looked == n // 2
    with ColumnCache(tmp_path, capacity=n * BLOCK, admission="rank", write_queue=0) as cache:
        assert cache.index.query("PRAGMA user_version")[0][0] == SCHEMA_VERSION
        assert cache.index.query("SELECT count(*) FROM admission_due")[0][0] == looked
        table = IndexEntries(sqlite3.connect(path))
        assert table.first_due()[1] == first
        table.con.close()


#: The records of when entries go stale: ``admission_due`` and its inbox.
_DUE = "(SELECT stale_from, id FROM admission_due UNION ALL SELECT stale_from, id FROM admission_inbox)"


def _due_records(con) -> tuple[int, int, int]:
    """(records of ``admission_due`` and its inbox, valid ones, rows looked up since stored)."""
    return (
        con.execute(f"SELECT count(*) FROM {_DUE}").fetchone()[0],
        con.execute(
            f"SELECT count(*) FROM {_DUE} d JOIN entries e ON e.id = d.id AND e.stale_from = d.stale_from"
        ).fetchone()[0],
        con.execute("SELECT count(*) FROM entries WHERE stale_from >= 0").fetchone()[0],
    )


def test_superseded_records_of_when_entries_go_stale_are_bounded_and_dropped_by_evictions(tmp_path, monkeypatch):
    """Each re-lookup adds a record and leaves the row's old one: with nothing evicted, the
    records are made again from the rows once they pass 4 per row; an eviction drops the
    superseded records it passes.  Every looked-up row keeps exactly one valid record."""
    from cacheaffinity.worker._store import admitter

    monkeypatch.setattr(admitter, "DUE_SLACK", 0)
    n = 100
    _fill(tmp_path, n)
    con = sqlite3.connect(os.path.join(tmp_path, INDEX_NAME), isolation_level=None)
    seen = []
    with ColumnCache(tmp_path, capacity=n * BLOCK, admission="rank", write_queue=0) as cache:
        for run in range(7):  # re-runs, nothing evicted
            for i in range(n):
                assert cache.get(f"e{i:06d}") is not None
            cache.save_admission(force=True)
            records, valid, looked = _due_records(con)
            assert valid == looked == n, run
            assert records <= admitter.DUE_PER_ROW * n + n, run  # at most one save's past the bound
            if run == 0:  # the lookups' records wait in the inbox (nothing evicted: not moved)
                assert con.execute("SELECT count(*) FROM admission_inbox").fetchone()[0] == n
                assert con.execute("SELECT count(*) FROM admission_due").fetchone()[0] == 0
            seen.append(records)
        assert max(seen) > 2 * n and min(seen[3:]) < max(seen)  # it grew, and was made again
        assert cache.stats()["evictions"] == 0
        records, _, _ = _due_records(con)
        superseded = records - n
        assert superseded > 0
        for i in range(n // 4):  # misses into the full cache: each evicts the stalest entry
            cache[f"new{i:03d}"] = np.full(4, -i, np.int64)
        cache.save_admission(force=True)
        assert cache.stats()["evictions"] > 0
        records, valid, looked = _due_records(con)
        assert valid == looked and records - valid < superseded
        # the first eviction moved the inbox's valid records into the log, in its order
        assert con.execute("SELECT count(*) FROM admission_inbox").fetchone()[0] == 0
        # before the first valid record, no record of a row looked up again since: the
        # evictions dropped them (the last victims' records go at the next eviction)
        first = con.execute(
            "SELECT min(d.stale_from) FROM admission_due d JOIN entries e ON e.id = d.id AND e.stale_from = d.stale_from"
        ).fetchone()[0]
        assert con.execute(
            "SELECT count(*) FROM admission_due d JOIN entries e ON e.id = d.id "
            "WHERE e.stale_from != d.stale_from AND d.stale_from < ?", (first,)
        ).fetchone()[0] == 0
    con.close()


@pytest.mark.parametrize("slack", [1024, 0], ids=["moved", "made-again"])
def test_the_inbox_is_moved_into_the_log_or_the_log_made_again_by_the_first_eviction(tmp_path, monkeypatch, slack):
    """A warm run's records wait in ``admission_inbox``; the first victim search of a write
    transaction moves the valid ones into ``admission_due`` (or, past 1/INBOX_SHARE of the
    rows, makes the log again from the rows), and evicts the entry stale first, which a
    read-only search (an insert's pre-check) over log and inbox found before it."""
    from cacheaffinity.worker._store import admitter

    monkeypatch.setattr(admitter, "DUE_SLACK", slack)  # 0: 3 x 60 records > 60 / INBOX_SHARE
    n = 60
    _fill(tmp_path, n)
    path = os.path.join(tmp_path, INDEX_NAME)
    con = sqlite3.connect(path, isolation_level=None)
    with ColumnCache(tmp_path, capacity=n * BLOCK, admission="rank", write_queue=0) as cache:
        for _run in range(3):  # warm runs, one save each: records in the inbox, a row's older ones superseded
            for i in range(n):
                assert cache.get(f"e{i:06d}") is not None
            cache.save_admission(force=True)
        waiting = con.execute("SELECT count(*) FROM admission_inbox").fetchone()[0]
        assert waiting == 3 * n and con.execute("SELECT count(*) FROM admission_due").fetchone()[0] == 0
        # the stalest entry, by the rows' own clocks
        stalest = con.execute("SELECT key FROM entries ORDER BY stale_from, id LIMIT 1").fetchone()[0]
        assert IndexEntries(con).first_due()[1] == stalest  # read only: found in the inbox
        assert con.execute("SELECT count(*) FROM admission_inbox").fetchone()[0] == waiting  # not moved
        con.execute("BEGIN IMMEDIATE")
        table = IndexEntries(con, writing=True)
        assert table.first_due()[1] == stalest
        assert con.execute("SELECT count(*) FROM admission_inbox").fetchone()[0] == 0
        # one record per row, in the log: the superseded ones dropped (moved) or never made (made again)
        assert _due_records(con) == (n, n, n)
        assert (table.due_rebuilt is None) == (slack > 0)
        con.execute("ROLLBACK")
    con.close()


def _as_schema_5(path: str) -> None:
    """Turn today's index into schema 5's: no inbox, the triggers add to ``admission_due``."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("BEGIN")
    for name in ("entries_due_insert", "entries_due_update"):
        con.execute(f"DROP TRIGGER {name}")
    con.execute(
        "INSERT OR IGNORE INTO admission_due SELECT stale_from, id FROM admission_inbox"
    )
    con.execute("DROP TABLE admission_inbox")
    con.execute("""CREATE TRIGGER entries_due_insert AFTER INSERT ON entries
    WHEN NEW.stale_from >= 0 BEGIN
        INSERT OR IGNORE INTO admission_due VALUES (NEW.stale_from, NEW.id);
    END""")
    con.execute("""CREATE TRIGGER entries_due_update AFTER UPDATE OF stale_from ON entries
    WHEN NEW.stale_from >= 0 AND NEW.stale_from IS NOT OLD.stale_from BEGIN
        INSERT OR IGNORE INTO admission_due VALUES (NEW.stale_from, NEW.id);
    END""")
    con.execute("PRAGMA user_version=5")
    con.execute("COMMIT")
    con.close()


def test_a_schema_5_index_is_upgraded_in_place_and_its_lookups_then_wait_in_the_inbox(tmp_path):
    """Schema 5's log is kept as it is; the upgrade adds the inbox and points the triggers
    at it: the next lookups append there, and the victim search finds the stalest entry."""
    n = 50
    _fill(tmp_path, n)
    path = os.path.join(tmp_path, INDEX_NAME)
    with ColumnCache(tmp_path, capacity=n * BLOCK, admission="rank", write_queue=0) as cache:
        for i in range(0, n, 2):
            assert cache.get(f"e{i:06d}") is not None
        cache.save_admission(force=True)
    _as_schema_5(path)
    con = sqlite3.connect(path, isolation_level=None)
    log = con.execute("SELECT stale_from, id FROM admission_due ORDER BY 1, 2").fetchall()
    assert len(log) == n // 2 and con.execute("PRAGMA user_version").fetchone()[0] == 5
    with ColumnCache(tmp_path, capacity=n * BLOCK, admission="rank", write_queue=0) as cache:
        assert cache.index.query("PRAGMA user_version")[0][0] == SCHEMA_VERSION == 6
        assert con.execute("SELECT stale_from, id FROM admission_due ORDER BY 1, 2").fetchall() == log
        for i in range(1, n, 2):  # the other half looked up: records in the inbox
            assert cache.get(f"e{i:06d}") is not None
        cache.save_admission(force=True)
        assert con.execute("SELECT count(*) FROM admission_inbox").fetchone()[0] == n // 2
        assert con.execute("SELECT count(*) FROM admission_due").fetchone()[0] == n // 2
    stalest = con.execute("SELECT key FROM entries WHERE stale_from >= 0 ORDER BY stale_from, id LIMIT 1").fetchone()[0]
    assert IndexEntries(con).first_due()[1] == stalest  # read only: over the log and the inbox
    con.execute("BEGIN IMMEDIATE")
    assert IndexEntries(con, writing=True).first_due()[1] == stalest  # the inbox moved first
    assert con.execute("SELECT count(*) FROM admission_inbox").fetchone()[0] == 0
    con.execute("COMMIT")
    assert _due_records(con) == (n, n, n)
    con.close()


def _first_lookup_frames(directory, as_before: bool, monkeypatch) -> tuple[int, int]:
    """(WAL frames written by saving a pack row's first lookup, the row's pages) for a pack
    of 1,500 members (a ~85 KB table of contents: a leaf cell and overflow pages)."""
    from cacheaffinity.worker._store import admitter

    if as_before:  # what earlier versions stored: NULL until the first lookup, whole clocks
        monkeypatch.setattr(admitter, "UNSET", None)
        monkeypatch.setattr(admitter, "stored", lambda value: value)
    path = os.path.join(directory, INDEX_NAME)
    with ColumnCache(directory, capacity=64 * 2**20, admission="rank", write_queue=0) as cache:
        members = {f"Branch_{i:04d}_with_a_long_name/f0/data": np.full(2, i, np.int64) for i in range(1500)}
        assert cache.put_pack("small/Events", 0, 100, {"x/f0/data": np.zeros(4, np.int64)})[1]
        assert cache.put_pack("big/Events", 0, 100, members)[1]
        assert cache.get_packs("small/Events", 0, 100)
        cache.save_admission(force=True)
        con = sqlite3.connect(path, isolation_level=None)
        row = con.execute(
            "SELECT length(toc), typeof(stale_from), typeof(reuse_dist) FROM entries WHERE grp = 'big/Events'"
        ).fetchone()
        assert row[1:] == (("null", "null") if as_before else ("real", "real")), row
        assert con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
        assert os.path.getsize(path + "-wal") == 0
        assert cache.get_packs("big/Events", 0, 100)
        cache.save_admission(force=True)
        frames = os.path.getsize(path + "-wal") // (4096 + 24)
        due, dist = con.execute("SELECT stale_from, reuse_dist FROM entries WHERE grp = 'big/Events'").fetchone()
        con.close()
    assert due > 0 and dist > 0  # the lookup was saved
    return frames, row[0] // 4096 + 1


def test_a_rows_first_lookup_rewrites_in_place_only_the_page_it_changes(tmp_path, monkeypatch):
    """A row is stored with its size for good (``UNSET``, not NULL; every clock an 8-byte
    REAL): the save of its first lookup writes the page that changes, not the row's ~21
    pages again (a row that changed size was deleted and inserted again, its overflow
    pages rewritten)."""
    with monkeypatch.context() as m:
        before, pages = _first_lookup_frames(tmp_path / "before", True, m)
    now, _ = _first_lookup_frames(tmp_path / "now", False, monkeypatch)
    assert pages >= 15 and before >= pages, (before, pages)  # the old rows: all rewritten
    assert now <= 6, (now, before, pages)  # the row's last page, its stale index entry, the state


def test_a_policy_clock_is_stored_as_an_eight_byte_real_and_read_back_as_computed():
    """Whole clocks (block multiples, the usual case) would be stored by SQLite as integers
    of 0-6 bytes, so a row would change size as its clocks grow; stored as the next float up
    they are REALs of 8 bytes, and read back exactly."""
    from cacheaffinity.worker._store.schema import UNSET, read, stored

    con = sqlite3.connect(":memory:")
    con.execute("CREATE TABLE t (v REAL)")
    values = [0.0, 1.0, 4096.0, 2.0**31, 2.0**47 + 4096, 2.0**52 - 1, 2.0**52, 2.0**60, 1.5, 1e13 + 0.25]
    for v in values:
        assert read(stored(v)) == v, v
        con.execute("INSERT INTO t VALUES (?)", (stored(v),))
        if v < 2**52:  # SQLite keeps a REAL that is not whole as a REAL: 8 bytes
            assert stored(v) != int(stored(v)), v
    assert [read(v) for (v,) in con.execute("SELECT v FROM t")] == values
    assert read(UNSET) is None and read(None) is None


# --- a plan of many victims ------------------------------------------------------------------


def _counted(table, pulled: dict) -> None:
    """Count what a victim plan reads of each of ``table``'s orders."""
    for name in ("due_order", "fresh_order", "rank_order"):
        orig = getattr(table, name)

        def counted(orig=orig, name=name):
            inner = orig()
            try:
                for it in inner:
                    pulled[name] = pulled.get(name, 0) + 1
                    yield it
            finally:
                inner.close()

        setattr(table, name, counted)


def test_a_plan_of_many_victims_reads_each_order_once_and_decides_as_the_simulator(tmp_path, monkeypatch):
    """A pack as large as 1,200 small ones: stale entries go first (never looked up since
    stored, or not since their due), then the highest ranks (the entries looked up last), the same victims in memory, in the index's log and (read only, an insert's
    pre-check) over its log and inbox; each order is read up to the plan's last victim,
    once (it was read again from its start for every victim: 3,000 victims took 10 s)."""
    n, capacity = 2000, 2000 * BLOCK
    mem = StableRank(capacity, sample=64)
    idx = IndexPolicy(tmp_path, capacity, sample=64)
    keys = [f"s{i:05d}" for i in range(n)]
    for policy in (mem, idx):
        for key in keys:  # stored: fresh
            assert policy.offer(key, BLOCK) == []
        assert not policy.lookup("absent", BLOCK)  # the clock moves past the stores
        for _ in range(3):  # looked up, 1,600 of them, in three passes (a demand and staleness)
            for key in keys[:1600]:
                assert policy.lookup(key, BLOCK)
        for key in keys[:800]:  # then again, half of them: the other half goes stale first
            assert policy.lookup(key, BLOCK)
    big = next(f"big{i}" for i in range(10**6) if rank(f"big{i}") < 0.02)  # admitted in place of higher ranks
    size = 1200 * BLOCK
    expected = mem._room(big, size)
    assert expected is not None and len(expected) == 1200
    taken = [int(k[1:]) for k in expected]  # each order gave victims: never looked up since
    assert min(sum(i >= 1600 for i in taken), sum(800 <= i < 1600 for i in taken), sum(i < 800 for i in taken)) > 100
    # read only, over the log and the inbox the lookups left (what an insert's pre-check runs)
    assert idx.con.execute("SELECT count(*) FROM admission_inbox").fetchone()[0] > 0
    writer = idx.p.table
    try:
        with monkeypatch.context() as m:  # a pre-check that may read every record: the same victims
            m.setattr(admitter, "PRECHECK_MOST", 10**6)
            idx.p.table = IndexEntries(idx.con)
            assert idx.p._room(big, size) == expected
        # the pre-check as it is: more than PRECHECK_MOST lookups wait in the inbox, the insert decides
        assert idx.con.execute("SELECT count(*) FROM admission_inbox").fetchone()[0] > admitter.PRECHECK_MOST
        idx.p.table = IndexEntries(idx.con)
        with pytest.raises(Unplanned):
            idx.p._room(big, size)
    finally:
        idx.p.table = writer
    for policy in (mem.table, writer):
        pulled: dict = {}
        _counted(policy, pulled)
        owner = mem if policy is mem.table else idx
        assert owner.offer(big, size) == expected
        assert pulled and all(v <= len(expected) + 1 for v in pulled.values()), pulled
    assert idx.held() == set(mem.table._e)
    assert len(mem.table._e) == n - 1200 + 1 and mem.used <= capacity


@pytest.mark.parametrize("admission", ["rank", "fifo"])
def test_an_insert_in_place_of_thousands_of_small_packs_leaves_the_cache_within_capacity(tmp_path, admission):
    """A node cache at its capacity with 3,000 small packs (as earlier work leaves it, the
    store's own format) takes a pack the size of ~2,000 of them: it evicts what that needs, the cache
    holds no more than its capacity and the evicted packs' files are gone.  (An insert
    evicted at most 1,024 entries: ``fifo`` then stayed above its capacity.)"""
    from benchmarks.store_scale import build

    d = str(tmp_path / "node")
    os.makedirs(d)
    built = build(d, 3000)
    with ColumnCache(d, admission=admission, write_queue=0) as cache:
        assert cache.capacity == built["capacity"] == 3000 * built["pack_bytes"]
        arrays = {"x": np.arange(2000 * built["pack_bytes"] // 8 - 512, dtype=np.int64)}
        nbytes, stored = cache.put_pack("big", 0, 10, arrays)
        assert stored
        info = cache.info()
        assert info["size"] <= info["capacity"]
        evicted, pack = 3000 + 1 - info["entries"], built["pack_bytes"]
        big = info["size"] - (info["entries"] - 1) * pack
        assert evicted > 1024 and (evicted - 1) * pack < big <= evicted * pack  # what it needed, no more
        assert len(cache.get_packs("big", 0, 10)) == 1
        files = sum(len(fs) for _, _, fs in os.walk(d) if fs) - sum(
            1 for f in os.listdir(d) if os.path.isfile(os.path.join(d, f))
        )
        assert files == info["entries"]


@pytest.mark.parametrize("pack_bytes", [0, admitter.PRECHECK_BYTES])
def test_an_insert_plans_its_victims_at_most_twice_and_reads_no_row_of_them_again(tmp_path, pack_bytes):
    """An insert into a full node cache (inline writes): a pack of at least PRECHECK_BYTES
    gets one victim plan before its data file is written (the pre-check), every pack one in
    the transaction (the decision), each order's query once per plan; the victim's size and
    delete come from the row its order read (no lookup of its row by key), and the inserted
    key is looked up by key once in each.  (It planned three times, and read each victim's
    row twice more: ~350 against ~260 µs an insert at 10^5 packs; a small pack's pre-check
    cost about what writing and deleting it does.)"""
    from benchmarks.store_scale import build

    d = str(tmp_path / "node")
    os.makedirs(d)
    built = build(d, 500, pack_bytes=pack_bytes)
    with ColumnCache(d, admission="rank", write_queue=0) as cache:
        arrays = {"x": np.arange(built["pack_bytes"] // 8 - 64, dtype=np.int64)}
        assert cache.put_pack("warm", 0, 1, arrays)[1]  # the first transaction reads what it then keeps
        statements: list[str] = []
        with cache.index.lock:
            con = cache.index.connection()
            con.set_trace_callback(statements.append)
        try:
            nbytes, stored = cache.put_pack("new", 0, 1, arrays)
        finally:
            con.set_trace_callback(None)
        assert stored and cache.stats()["evictions"] >= 2
    checked = nbytes >= admitter.PRECHECK_BYTES
    assert checked == bool(pack_bytes)
    plans = [s for s in statements if s.startswith("SELECT rank, key")]
    assert len(plans) == 1 + checked, statements
    by_key = [s for s in statements if s.startswith("SELECT") and "WHERE key = " in s]
    assert not [s for s in by_key if "'new@" not in s], by_key  # no victim's row read by key
    assert len(by_key) <= 2 + checked, by_key  # the pre-check's, the lookup's and the old value's


def test_a_batch_of_inserts_moves_the_inbox_once_and_reads_each_order_on(tmp_path):
    """The background writer's batch is one transaction: its lookups are applied first, so
    the inbox is moved into the log by the first victim plan and nothing appends to it after
    (it read the inbox's bounds once per pack); each order is read ahead, each plan reading on
    from where the last left it (each plan opened its three cursors anew).  The batch evicts
    what the same inserts one transaction each evict."""
    from benchmarks.store_scale import build
    from cacheaffinity.worker._store.writes import pack_item

    d, alone = str(tmp_path / "node"), str(tmp_path / "alone")
    os.makedirs(d)
    built = build(d, 500, looked_up=True, moved=False)  # a warm run's records wait in the inbox
    shutil.copytree(d, alone)
    arrays = {"x": np.arange(built["pack_bytes"] // 8 - 64, dtype=np.int64)}
    held = []
    for where, batch in ((d, True), (alone, False)):
        with ColumnCache(where, admission="rank", write_queue=0) as cache:
            items = [pack_item(f"new{i}", 0, 1, arrays) for i in range(12)]
            for it in items:
                cache.looked_up(it.key, it.size)
            statements: list[str] = []
            with cache.index.lock:
                con = cache.index.connection()
                con.set_trace_callback(statements.append)
            try:
                for part in [items] if batch else [[it] for it in items]:
                    cache.write_path.store_many(part)
            finally:
                con.set_trace_callback(None)
            assert cache.stats()["evictions"] >= 12
            assert con.execute("SELECT count(*) FROM admission_inbox").fetchone()[0] == 0
            held.append({k for (k,) in con.execute("SELECT key FROM entries")})
        if batch:
            bounds = [s for s in statements if "max(rowid) FROM admission_inbox" in s]
            by_rank = [s for s in statements if s.startswith("SELECT rank, key")]
            due = [s for s in statements if "FROM admission_due d" in s]
            assert len(bounds) == 1, statements
            # 12 plans: rows read 1, 2, 4, 8 at a time (1 + 2 + 4 + 8 >= 12 victims by rank)
            assert 1 <= len(by_rank) <= 4 and len(due) <= 4, statements
    assert held[0] == held[1]
    assert {it.key for it in items} & held[0]  # some were stored


def test_a_row_an_order_passed_and_deleted_since_is_not_freed_twice(tmp_path):
    """A victim's delete goes by the row id its order read; a row deleted since (another
    eviction in the same transaction: the store's FIFO safety net) frees nothing, and a
    row of that key stored since (a new id) is found by key and freed as itself."""
    con = sqlite3.connect(os.path.join(_fresh_node(tmp_path), INDEX_NAME), isolation_level=None)
    con.execute("BEGIN IMMEDIATE")
    table = IndexEntries(con, writing=True)
    first = table.highest()
    key, size = first[1], table.size(first[1])
    con.execute("DELETE FROM entries WHERE key = ?", (key,))
    table.remove(key)
    assert (table.removed, table.freed) == ([], 0) and key not in table
    top = table.highest()
    con.execute("DELETE FROM entries WHERE key = ?", (top[1],))
    con.execute(
        "INSERT INTO entries (key, grp, start, stop, file, toc, nbytes, size, checksum, stored, writer, rank) "
        "VALUES (?, 'g', 0, 1, 'ab/replaced', '[]', 8, ?, x'00', 0, 0, 0.0)",
        (top[1], 3 * size),
    )
    table.remove(top[1])
    assert (table.removed, table.freed) == (["ab/replaced"], 3 * size)
    assert con.execute("SELECT count(*) FROM entries WHERE key = ?", (top[1],)).fetchone()[0] == 0
    con.execute("ROLLBACK")
    con.close()


def _fresh_node(tmp_path) -> str:
    from benchmarks.store_scale import build

    d = str(tmp_path / "node")
    os.makedirs(d)
    build(d, 50)
    return d


def test_a_process_follows_the_sample_another_process_changed(tmp_path):
    """Each process keeps the sample's size and largest hash from its own last save, and
    reads them again once another process of the node saved: the bottom-k sample (3 here)
    never holds more than k keys, whoever added them."""
    a = ColumnCache(tmp_path, capacity=CAPACITY, admission="rank", write_queue=0)
    b = ColumnCache(tmp_path, capacity=CAPACITY, admission="rank", write_queue=0)
    try:
        for cache in (a, b):
            cache.admission._policy.sample_size = 3
        for cache, keys in ((a, KEYS[:2]), (b, KEYS[2:4]), (a, KEYS[4:6])):
            for k in keys:
                cache[k] = value(k)
            cache.save_admission(force=True)
        con = sqlite3.connect(os.path.join(tmp_path, INDEX_NAME))
        assert con.execute("SELECT count(*) FROM admission_sample").fetchone()[0] == 3
        con.close()
    finally:
        a.close()
        b.close()


def test_a_pre_check_after_a_warm_run_of_the_whole_cache_reads_a_bounded_part_of_it(tmp_path, monkeypatch):
    """After a warm run of every entry, each entry's record of when it goes stale waits in the
    inbox, the log's are superseded and no row past the fresh watermark is fresh; only a write
    transaction moves, drops and saves them.  An insert's pre-check (read only) read them all
    (0.12 s per pre-check at 10^5 packs, every one until the first eviction: with the
    background writer, every chunk task's until its first batch committed).  It now gives up
    past PRECHECK_MOST of them and lets the insert decide, which decides as before; after that
    insert the pre-check is exact again."""
    monkeypatch.setattr(admitter, "PRECHECK_MOST", 64)
    n = 600
    _fill(tmp_path, n)  # stored: fresh rows
    files = lambda: sum(len(f) for _, _, f in os.walk(os.path.join(tmp_path, "columns")))  # noqa: E731
    with ColumnCache(tmp_path, capacity=n * BLOCK, admission="rank", write_queue=0) as cache:
        for i in range(n):  # a warm run of the whole cache
            assert cache.get(f"e{i:06d}") is not None
        cache.save_admission(force=True)
        adm = cache.admission
        con = adm._index.connection()
        top = max(rank(f"e{i:06d}") for i in range(n))
        key = next(k for k in (f"x{i}" for i in range(10**6)) if rank(k) > top)  # every entry is live and ranks lower
        bounded, steps = _steps(con, lambda: adm.admits(key, BLOCK))
        monkeypatch.setattr(admitter, "PRECHECK_MOST", 10**6)
        exact, walk = _steps(con, lambda: adm.admits(key, BLOCK))
        assert bounded is True and exact is False and steps * 4 < walk, (steps, walk)
        # the watermark: no fresh row in the ids a pre-check reads, rows beyond them
        monkeypatch.setattr(admitter, "PRECHECK_MOST", 64)
        table = IndexEntries(con, fresh_from=0)
        with pytest.raises(Unplanned):
            next(table.fresh_order())
        writing = IndexEntries(con, fresh_from=0, writing=True)
        assert next(writing.fresh_order(), None) is None and writing.fresh_from > n  # moved past the last row
        # the insert decides: refused, nothing stored, its data file gone
        before = files()
        cache[key] = np.full(4, 1, np.int64)
        assert key not in cache and files() == before and len(cache) == n
        assert cache.stats()["not_admitted"] == 1
        # its transaction moved the inbox and saved the watermark: exact again, within the bound
        assert con.execute("SELECT count(*) FROM admission_inbox").fetchone()[0] == 0
        assert adm.admits(key, BLOCK) is False


def test_a_new_process_pre_checks_in_the_capacity_the_directory_records(tmp_path, monkeypatch):
    """A process opening a node cache adopts the capacity the directory records (here below
    the configured one): its inserts' pre-checks plan in it from the first insert.  The
    Admitter kept the configured capacity until its first insert transaction: a pack the
    policy refuses passed the pre-check, was written, and was deleted by the transaction.
    (Every pack pre-checked here, as one of at least PRECHECK_BYTES is.)"""
    from cacheaffinity.worker._store.layout import pack_key

    monkeypatch.setattr(admitter, "PRECHECK_BYTES", 0)

    n = 100
    with ColumnCache(tmp_path, capacity=n * BLOCK, admission="rank", write_queue=0) as cache:
        for i in range(n):
            cache[f"e{i:03d}"] = np.full(4, i, np.int64)
        assert len(cache) == n
    top = max(rank(f"e{i:03d}") for i in range(n))
    grp = next(g for i in range(10**6) if rank(pack_key(g := f"late{i}", 0, 10, ["x"])) > top)
    with ColumnCache(tmp_path, capacity="1 GiB", admission="rank", write_queue=0) as cache:
        assert cache.capacity == n * BLOCK and cache.capacity_source == "directory"
        # ranked above every held entry, none stale: refused, by the pre-check (nothing written)
        assert cache.put_pack(grp, 0, 10, {"x": np.arange(4)})[1] is False
        assert len(cache) == n and cache.stats()["not_admitted"] == 1


def test_a_pre_check_counts_the_lookups_this_process_has_not_saved(tmp_path):
    """The insert's transaction applies this process's unsaved lookups before it decides (the
    miss a value answers among them: its bytes move the clock on, and entries go stale); the
    pre-check plans on the same clock, so that it does not refuse what the insert admits.  A
    pack the size of 2,000 of the 3,000 held: admitted only once its own miss counts."""
    from benchmarks.store_scale import build
    from cacheaffinity.worker._store.layout import pack_key

    d = str(tmp_path / "node")
    os.makedirs(d)
    built = build(d, 3000)
    size = 2000 * built["pack_bytes"]
    key = pack_key("big", 0, 10, ["x"])
    with ColumnCache(d, admission="rank", write_queue=0) as cache:
        adm = cache.admission
        assert adm.admits(key, size, cache.capacity) is False  # on the saved clock: nothing stale
        cache.looked_up(key, size)
        assert adm.admits(key, size, cache.capacity) is True
        assert adm._policy.clock == 3000 * built["pack_bytes"]  # the pre-check changed nothing
