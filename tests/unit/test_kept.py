"""A write transaction's table kept for the next one (cacheaffinity/worker/_store/read_ahead.py,
``Kept``; ``Admitter._sync``): a lone writer continues its table and decides exactly as a
process that reads everything anew; any other write in between, a rollback or another
thread's commit makes the next transaction read anew.  Real directories, real SQLite."""

from __future__ import annotations

import os
import shutil
import sqlite3
import threading

import numpy as np

import cacheaffinity.config  # noqa: F401  (registers the config defaults)
from cacheaffinity.worker._store import BLOCK, INDEX_NAME, ColumnCache
from cacheaffinity.worker._store import admitter, read_ahead
from cacheaffinity.worker._store.admitter import IndexEntries

CAPACITY = 40 * BLOCK  # 20 values of 2 blocks


def value(i: int) -> np.ndarray:
    return np.full(2 * BLOCK // 8, i, np.int64)


def work(cache: ColumnCache, runs: int = 4) -> None:
    """Runs over 60 keys, 20 fit: hits where held, a miss stores (stale, fresh and rank
    victims all taken; lookups saved in the inserts' transactions)."""
    for run in range(runs):
        for i in range(60):
            k = f"k{(i * 7 + run) % 60:03d}"  # each run in another order
            if cache.get(k) is None:
                cache[k] = value(i)


def rows(directory) -> tuple[list, dict]:
    con = sqlite3.connect(os.path.join(directory, INDEX_NAME))
    try:
        entries = con.execute(
            "SELECT id, key, size, rank, last_used, stale_from, reuse_dist FROM entries ORDER BY id"
        ).fetchall()
        return entries, dict(con.execute("SELECT name, value FROM admission_state WHERE name != 'writers'"))
    finally:
        con.close()


def test_a_lone_writer_continues_its_table_and_decides_as_if_read_anew(tmp_path, monkeypatch):
    monkeypatch.setattr(admitter, "SAVE_AFTER", 3600.0)  # saves by count only: the same transactions
    out = {}
    for mode in ("kept", "anew"):
        monkeypatch.setattr(read_ahead, "KEPT_MOST", 4096 if mode == "kept" else -1)
        with ColumnCache(tmp_path / mode, capacity=CAPACITY, admission="rank") as cache:
            work(cache)
            stats = cache.stats()
            out[mode] = (stats["evictions"], stats["not_admitted"], cache.admission.continued)
        out[mode] += rows(tmp_path / mode)
    kept, anew = out["kept"], out["anew"]
    assert kept[2] > 50 and anew[2] == 0  # (67 of 68 transactions here) or none
    assert kept[0] > 0 and kept[1] > 0  # victims taken, keys refused
    assert kept[:2] == anew[:2]
    assert kept[3] == anew[3]  # the same rows with the same policy columns
    assert kept[4] == anew[4]  # the same node-wide state (clock, demand, window, watermark)


def test_another_connections_write_makes_the_next_transaction_read_anew(tmp_path, monkeypatch):
    monkeypatch.setattr(admitter, "SAVE_AFTER", 3600.0)
    monkeypatch.setattr(admitter, "PRECHECK_REFUSED", 2.0)  # every insert decided in a transaction
    with ColumnCache(tmp_path / "a", capacity=CAPACITY, admission="rank") as a:
        work(a, 2)
        table = a.admission._kept._table
        assert table is not None
        named = {row[1] for o in (table._due_ahead, table._fresh_ahead, table._rank_ahead) if o for row in o.rows}
        assert named  # the rows a's next plan walks first
        with ColumnCache(tmp_path / "a", capacity=CAPACITY, admission="fifo") as b:  # another process's
            with b.index.transaction() as con:
                con.executemany("DELETE FROM entries WHERE key = ?", [(k,) for k in named])
            for i in range(len(named)):
                b[f"y{i}"] = value(100 + i)  # the node full again
        shutil.copytree(tmp_path / "a", tmp_path / "copy")
        n = a.admission.continued
        a["z0"] = value(0)
        assert a.admission.continued == n  # read anew
        a["z1"] = value(1)
        assert a.admission.continued == n + 1  # nothing else wrote since: continued
        work(a, 2)
    # a process that reads everything anew, from the same index (the same processes listed: none)
    con = sqlite3.connect(os.path.join(tmp_path / "copy", INDEX_NAME))
    con.execute("DELETE FROM admission_state WHERE name = 'writers'")
    con.commit()
    con.close()
    with ColumnCache(tmp_path / "copy", capacity=CAPACITY, admission="rank") as fresh:
        fresh["z0"] = value(0)
        fresh["z1"] = value(1)
        work(fresh, 2)
        assert fresh.stats()["evictions"] > 0
    assert rows(tmp_path / "a") == rows(tmp_path / "copy")


def test_a_change_on_the_same_connection_outside_the_policy_makes_it_read_anew(tmp_path):
    with ColumnCache(tmp_path, capacity=CAPACITY, admission="rank") as cache:
        work(cache, 2)
        cache["x0"] = value(0)
        n = cache.admission.continued
        with cache.index.transaction() as con:  # this process's connection, not the policy's table
            con.execute("DELETE FROM entries WHERE id = (SELECT min(id) FROM entries)")
        cache["x1"] = value(1)
        assert cache.admission.continued == n
        cache["x2"] = value(2)
        assert cache.admission.continued == n + 1


def _index(tmp_path) -> sqlite3.Connection:
    with ColumnCache(tmp_path, capacity=CAPACITY, admission="rank") as cache:
        work(cache, 1)
    return sqlite3.connect(os.path.join(tmp_path, INDEX_NAME), isolation_level=None)


def _transaction(kept: read_ahead.Kept, con: sqlite3.Connection, change: bool = True):
    con.execute("BEGIN IMMEDIATE")
    got = kept.take(con)
    table = IndexEntries(con, writing=True)
    if change:
        con.execute("UPDATE admission_state SET value = value WHERE name = 'version'")
    kept.keep(con, table)
    return got, table


def test_only_a_committed_transaction_of_the_calling_thread_is_kept(tmp_path):
    con = _index(tmp_path)
    kept = read_ahead.Kept()
    got, table = _transaction(kept, con)
    assert got is None  # nothing kept yet
    con.execute("COMMIT")
    kept.committed()
    got, table = _transaction(kept, con)
    assert got is not None  # continued
    con.execute("COMMIT")
    other = threading.Thread(target=kept.committed)  # another thread's commit is not this one's
    other.start()
    other.join()
    assert _transaction(kept, con)[0] is None
    con.execute("ROLLBACK")  # rolled back (no committed()): nothing kept
    assert _transaction(kept, con)[0] is None
    con.execute("COMMIT")
    kept.committed()
    kept.drop()  # a fork, a rolled-back transaction
    assert _transaction(kept, con)[0] is None
    con.execute("COMMIT")
    kept.committed()
    other_con = sqlite3.connect(os.path.join(tmp_path, INDEX_NAME), isolation_level=None)
    other_con.execute("INSERT OR REPLACE INTO admission_state VALUES ('other', 'x')")  # commits a change
    assert _transaction(kept, con)[0] is None  # another connection wrote
    con.execute("COMMIT")
    kept.committed()
    other_con.execute("SELECT count(*) FROM entries").fetchone()  # reading changes nothing
    assert _transaction(kept, con)[0] is not None
    con.execute("COMMIT")
    other_con.close()
    con.close()


def test_a_table_that_remembers_too_much_is_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(admitter, "SAVE_AFTER", 3600.0)  # the same transactions both times
    continued = {}
    for most in (4096, 8):
        monkeypatch.setattr(read_ahead, "KEPT_MOST", most)
        with ColumnCache(tmp_path / str(most), capacity=CAPACITY, admission="rank") as cache:
            work(cache, 3)
            table = cache.admission._kept._table
            assert table is None or table.remembered() <= most
            continued[most] = cache.admission.continued
    assert 0 < continued[8] < continued[4096]  # some continued, some started anew
    con = _index(tmp_path / "x")
    kept = read_ahead.Kept()
    con.execute("BEGIN IMMEDIATE")
    kept.take(con)
    table = IndexEntries(con, writing=True)
    table._absent.update(f"gone{i}" for i in range(9))
    kept.keep(con, table)
    con.execute("COMMIT")
    kept.committed()
    con.execute("BEGIN IMMEDIATE")
    assert kept.take(con) is None
    con.execute("COMMIT")
    con.close()


def test_a_forked_child_reads_anew(tmp_path):
    with ColumnCache(tmp_path, capacity=CAPACITY, admission="rank") as cache:
        work(cache, 2)
        held = sorted(cache)
        cache.get(held[0])
        cache.save_admission(force=True)  # the parent's last transaction: kept
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its first transaction reads anew, its second continues
            code = 1
            try:
                counts = []
                for key in held[1:3]:
                    n = cache.admission.continued
                    cache.get(key)
                    cache.save_admission(force=True)
                    counts.append(cache.admission.continued - n)
                os.write(w, repr(counts).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        _, status = os.waitpid(pid, 0)
        got = os.read(r, 100).decode()
        os.close(r)
        assert os.waitstatus_to_exitcode(status) == 0
        assert got == "[0, 1]"
