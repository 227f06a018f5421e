"""The admission policy inside the store (cacheaffinity/worker/_store/admitter.py):
real directories, real SQLite, real processes."""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import sys
import textwrap
import subprocess

import numpy as np
import pytest

import cacheaffinity.config  # noqa: F401  (registers the config defaults)
from cacheaffinity.worker._store import BLOCK, INDEX_NAME, ColumnCache
from cacheaffinity.worker._store.admission import rank

KEYS = [f"chunk{i:03d}" for i in range(80)]
CAPACITY = 40 * BLOCK  # each value is 2 blocks: 20 of the 80 fit


def value(key: str) -> np.ndarray:
    return np.full(2 * BLOCK // 8, int(key[5:]), np.int64)  # exactly 2 blocks


def scan(cache: ColumnCache, keys: list[str] = KEYS) -> int:
    """One run over ``keys``: hits; a miss stores the value (as a chunk task does)."""
    hits = 0
    for k in keys:
        got = cache.get(k)
        if got is not None:
            assert np.array_equal(got, value(k))
            hits += 1
        else:
            cache[k] = value(k)
    return hits


def state_of(directory) -> tuple[int, dict, int]:
    con = sqlite3.connect(os.path.join(directory, INDEX_NAME))
    try:
        rows = dict(con.execute("SELECT name, value FROM admission_state"))
        n_meta = con.execute(
            "SELECT count(*) FROM entries WHERE rank IS NOT NULL AND stale_from IS NOT NULL"
        ).fetchone()[0]
        return int(rows["version"]), json.loads(rows["state"]), n_meta
    finally:
        con.close()


def lowest(n: int) -> set[str]:
    return set(sorted(KEYS, key=rank)[:n])


def test_rank_keeps_the_same_lowest_ranked_part_where_fifo_gets_nothing(tmp_path):
    out = {}
    for policy in ("fifo", "rank"):
        d = tmp_path / policy
        with ColumnCache(d, capacity=CAPACITY, admission=policy) as cache:
            hits = [scan(cache) for _ in range(5)]
            out[policy] = hits, cache.stats(), set(cache)
            assert cache.volume() <= CAPACITY
    fifo_hits, fifo_stats, _ = out["fifo"]
    rank_hits, rank_stats, held = out["rank"]
    assert fifo_hits[1:] == [0, 0, 0, 0]  # each run evicts what the next needs first
    assert rank_hits[1:] == [20, 20, 20, 20]  # capacity / working set, every run
    assert held == lowest(20)  # the stable part: the keys of lowest rank
    # writes: FIFO writes every value every run; rank only in run 1
    assert fifo_stats["writes"] == 5 * 80
    assert rank_stats["writes"] < 80 and rank_stats["not_admitted"] > 0
    assert rank_stats["writes"] <= 0.2 * fifo_stats["writes"]


def test_state_survives_a_restart(tmp_path):
    with ColumnCache(tmp_path, capacity=CAPACITY, admission="rank") as cache:
        for _ in range(3):
            scan(cache)
        demand = cache.admission.describe()["demand"]
    version, state, n_meta = state_of(tmp_path)
    assert state["policy"] == "rank" and state["demand"] == pytest.approx(demand, rel=0.01)
    assert state["demand"] == pytest.approx(80 * 2 * BLOCK, rel=0.05)  # a run's bytes
    assert n_meta == 20  # every entry's policy columns filled (each was looked up)
    with ColumnCache(tmp_path, capacity=CAPACITY, admission="rank") as cache:
        assert scan(cache) == 20  # the same part, no rewrite
        assert cache.stats()["writes"] == 0
        d = cache.admission.describe()
        assert d["reloads"] == 1 and d["demand"] == pytest.approx(demand, rel=0.1)
    assert state_of(tmp_path)[0] > version


def test_the_policy_counts_the_lookups_it_saved_and_the_cpu_they_took(tmp_path, monkeypatch):
    """``describe()`` says how many lookups the policy saved and the saving thread's CPU:
    what keeping the policy costs beyond the lookups (benchmarks/store_scale.py splits its
    phases with it).  (Every value pre-checked, as one of at least PRECHECK_BYTES is: run 2's
    misses are refused before any transaction, so its lookups are saved by saves alone.)"""
    from cacheaffinity.worker._store import admitter

    monkeypatch.setattr(admitter, "PRECHECK_BYTES", 0)
    with ColumnCache(tmp_path, capacity=CAPACITY, admission="rank") as cache:
        scan(cache)  # run 1: misses and inserts (the inserts' transactions save as they go)
        cache.save_admission(force=True)
        before = cache.admission.describe()
        assert scan(cache) == 20
        cache.save_admission(force=True)
        after = cache.admission.describe()
        assert after["lookups_saved"] - before["lookups_saved"] == 80  # every lookup, hit or miss
        assert after["save_cpu_s"] > before["save_cpu_s"] >= 0
        cache.save_admission(force=True)  # nothing left to save: no transaction, no time
        assert cache.admission.describe()["save_cpu_s"] == after["save_cpu_s"]


def test_a_state_that_does_not_parse_is_replaced_and_entries_kept(tmp_path, caplog):
    with ColumnCache(tmp_path, capacity=CAPACITY, admission="rank") as cache:
        scan(cache)
    con = sqlite3.connect(os.path.join(tmp_path, INDEX_NAME))
    con.execute("UPDATE admission_state SET value = '{not json' WHERE name = 'state'")
    con.commit()
    con.close()
    with caplog.at_level("INFO", "cacheaffinity.worker"):
        with ColumnCache(tmp_path, capacity=CAPACITY, admission="rank") as cache:
            assert scan(cache) == 20
            assert len(cache) == 20
    assert "admission state of this cache replaced" in caplog.text
    assert state_of(tmp_path)[1]["policy"] == "rank"


_CRASH = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import cacheaffinity.config
    from cacheaffinity.worker._store import ColumnCache
    from cacheaffinity.worker._store import admitter

    real_save = admitter.Admitter._save

    def save_then_die(self, con):
        real_save(self, con)  # state, metadata and rows written, not committed
        os._exit(9)

    admitter.Admitter._save = save_then_die
    cache = ColumnCache(sys.argv[1], capacity=int(sys.argv[2]), admission="rank")
    held = list(cache)
    assert all(cache.get(k) is not None for k in held)  # lookups the insert's transaction applies
    cache["chunk999"] = np.zeros(1024, np.int64)  # rank above every held key? decided inside
    cache["chunk000x"] = np.zeros(1024, np.int64)
    """
)


def test_a_crash_mid_admission_leaves_the_last_commit(tmp_path):
    with ColumnCache(tmp_path, capacity=CAPACITY, admission="rank") as cache:
        for _ in range(2):
            scan(cache)
        held = set(cache)
    def due_log():
        con = sqlite3.connect(os.path.join(tmp_path, INDEX_NAME))
        try:
            return [con.execute(f"SELECT stale_from, id FROM {t} ORDER BY stale_from, id").fetchall()
                    for t in ("admission_due", "admission_inbox")]  # fmt: skip
        finally:
            con.close()

    before, log = state_of(tmp_path), due_log()
    assert log[0] or log[1]  # the runs' lookups appended records of when their entries go stale
    # (the dead transaction applies the crashing process's lookups: a record each, rolled back)
    r = subprocess.run([sys.executable, "-c", _CRASH, str(tmp_path), str(CAPACITY)], capture_output=True, text=True)
    assert r.returncode == 9, r.stderr
    assert state_of(tmp_path) == before and due_log() == log  # nothing of the dead transaction
    with ColumnCache(tmp_path, capacity=CAPACITY, admission="rank") as cache:
        assert set(cache) == held
        assert scan(cache) == 20
        assert cache.volume() <= CAPACITY


def _node_process(directory: str, me: int, runs: int, queue, barrier) -> None:
    cache = ColumnCache(directory, capacity=CAPACITY, admission="rank")
    hits = []
    for run in range(runs):
        barrier.wait(60)  # the two processes run each run at the same time
        # each chunk runs in one of the node's worker processes, another one next run
        mine = [k for i, k in enumerate(KEYS) if (i // 3 + run) % 2 == me]
        hits.append(scan(cache, mine))
        cache.save_admission(force=True)  # as a worker's heartbeat does
    reloads = cache.admission.describe()["reloads"]
    cache.close()
    queue.put((hits, reloads))


def test_two_processes_of_one_node_share_one_policy(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    q, barrier = ctx.Queue(), ctx.Barrier(2)
    procs = [ctx.Process(target=_node_process, args=(str(tmp_path), me, 5, q, barrier)) for me in range(2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with ColumnCache(tmp_path, capacity=CAPACITY, admission="rank") as cache:
        assert cache.volume() <= CAPACITY
        assert len(cache) == 20
        held = set(cache)
        assert scan(cache) == 20  # the same part for a third process
    # the two processes' lookups are one stream: together they keep the lowest ranks
    assert len(held & lowest(20)) >= 18
    # (the two processes' lookups interleave as they happen: a run may lose a chunk or two
    # to the other's unsaved lookups beyond the grace; without the grace 10-18 of 20)
    assert all(a + b >= 16 for a, b in list(zip(results[0][0], results[1][0]))[2:]), results
    assert sum(r[1] for r in results) > 2  # each reloaded what the other saved


def test_fifo_policy_writes_no_admission_state(tmp_path):
    with ColumnCache(tmp_path, capacity=CAPACITY, admission="fifo") as cache:
        scan(cache)
        assert cache.admission is None
    con = sqlite3.connect(os.path.join(tmp_path, INDEX_NAME))
    state = con.execute("SELECT count(*) FROM admission_state").fetchone()[0]
    sample = con.execute("SELECT count(*) FROM admission_sample").fetchone()[0]
    ranked = con.execute("SELECT count(*) FROM entries WHERE rank IS NOT NULL AND last_used IS NULL").fetchone()[0]
    con.close()
    assert state == sample == 0
    assert ranked == 20  # rows carry their rank (a later switch to rank finds them)


def test_unknown_policy_is_refused_with_the_choices():
    from cacheaffinity.worker._store.admitter import Admitter

    with pytest.raises(ValueError, match="use one of fifo, rank"):
        Admitter("lru", CAPACITY)


def test_a_damaged_version_is_a_replaced_state_never_an_error(tmp_path, caplog):
    with ColumnCache(tmp_path, capacity=CAPACITY, admission="rank") as cache:
        scan(cache)
    con = sqlite3.connect(os.path.join(tmp_path, INDEX_NAME))
    con.execute("UPDATE admission_state SET value = 'not a number' WHERE name = 'version'")
    con.execute("UPDATE admission_state SET value = '[]' WHERE name = 'state'")
    con.commit()
    con.close()
    with caplog.at_level("INFO", "cacheaffinity.worker"):
        with ColumnCache(tmp_path, capacity=CAPACITY, admission="rank") as cache:
            for _ in range(3):
                scan(cache)  # misses offered, hits recorded, saved: no exception
            assert scan(cache) >= 18 and cache.volume() <= CAPACITY
    assert "admission state of this cache replaced" in caplog.text
    version, state, _ = state_of(tmp_path)
    assert state["policy"] == "rank" and version >= 0


def test_a_save_takes_each_hits_row_as_its_lookup_read_it(tmp_path):
    """Saving a batch of hits writes every hit's row without reading the rows again (the
    lookup's own query read their policy columns)."""

    def last_used() -> dict[str, float]:
        con = sqlite3.connect(os.path.join(tmp_path, INDEX_NAME))
        try:
            return dict(con.execute("SELECT key, last_used FROM entries"))
        finally:
            con.close()

    with ColumnCache(tmp_path, capacity=CAPACITY, admission="rank") as cache:
        scan(cache)
        cache.flush()
        cache.save_admission(force=True)
        held = sorted(cache)
        before = last_used()
        statements: list[str] = []
        with cache.index.lock:
            con = cache.index.connection()
            con.set_trace_callback(statements.append)
        try:
            assert scan(cache, held) == len(held) == 20
            cache.save_admission(force=True)
        finally:
            con.set_trace_callback(None)
        after = last_used()
    assert any(s.startswith("UPDATE entries SET last_used") for s in statements)  # the save ran here
    reads = [s for s in statements if "FROM entries WHERE id IN" in s or "FROM entries WHERE key IN" in s]
    assert [s for s in reads if "last_used" in s and not s.startswith("SELECT key, file")] == []
    assert set(after) == set(held)
    assert all(after[k] > before[k] for k in held)  # every hit recorded


def test_small_values_are_pre_checked_only_while_most_inserts_are_refused(tmp_path):
    """A value below PRECHECK_BYTES skips the pre-check while this process's inserts are
    mostly stored (a cache being filled: the transaction decides), and is pre-checked once
    most are refused (a working set larger than the cache, where ``rank`` keeps a stable
    part): then a refused value costs no data file and no write transaction."""
    from cacheaffinity.worker._store import admitter

    assert 2 * BLOCK < admitter.PRECHECK_BYTES
    with ColumnCache(tmp_path, capacity=CAPACITY, admission="rank", write_queue=0) as cache:
        adm = cache.admission
        for k in KEYS[:20]:  # room for all of them: all stored
            cache[k] = value(k)
        assert adm.refused_share == 0.0 and not adm.prechecks(2 * BLOCK)
        assert adm.prechecks(admitter.PRECHECK_BYTES)  # a large value always
        for _ in range(2):
            scan(cache)  # 80 keys into room for 20: most refused
        assert adm.refused_share > admitter.PRECHECK_REFUSED and adm.prechecks(2 * BLOCK)
        top = max(cache, key=rank)
        key = next(f"zz{i}" for i in range(10**6) if rank(f"zz{i}") > rank(top))  # refused
        statements: list[str] = []
        with cache.index.lock:
            con = cache.index.connection()
            con.set_trace_callback(statements.append)
        try:
            cache[key] = value("chunk000")
        finally:
            con.set_trace_callback(None)
        assert key not in cache and not any(s.startswith("BEGIN") for s in statements), statements
        share = adm.refused_share
        adm.outcomes(stored=32)  # inserts stored again (about twice REFUSED_OVER): back to skipping it
        assert adm.refused_share < share * 0.2 and not adm.prechecks(2 * BLOCK)
        # a batch's outcomes count as mixed, not its refusals last: a background writer's batch
        # of 250 with 20 refused (8%) leaves the share near 8%, not at 1 - (15/16)^20 = 0.72
        adm.refused_share = 0.0
        adm.outcomes(stored=230, refused=20)
        assert 0.07 < adm.refused_share < 0.09 and not adm.prechecks(2 * BLOCK)
        adm.outcomes(refused=20)  # 20 refused in a row: pre-checked
        assert adm.prechecks(2 * BLOCK)
