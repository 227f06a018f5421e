"""The admission state's rows encoded and decoded with what did not change kept
(cacheaffinity/worker/_store/state_rows.py): the same text and values as ``json`` gives,
whatever the rows hold; and the ``writers`` row written only when it has to be."""

from __future__ import annotations

import json
import math
import os
import random
import sqlite3

import numpy as np
import pytest

import cacheaffinity.config  # noqa: F401  (registers the config defaults)
from cacheaffinity.worker._store import BLOCK, INDEX_NAME, ColumnCache
from cacheaffinity.worker._store.admission import StableRank
from cacheaffinity.worker._store.admitter import WRITERS_LAG
from cacheaffinity.worker._store.state_rows import SEPARATORS, StateRows


def states(seed: int = 0, n: int = 300):
    """A node's scalars as they move: the clock every time, the window now and then (it fills
    up to 63, then slides), the parameters once; odd values among them."""
    rng = random.Random(seed)
    st = StableRank(1 << 30).scalars()
    reuses: list[float] = []
    for i in range(n):
        st = dict(st, clock=float(rng.randrange(1, 10**12)), sampled=rng.randrange(1024))
        if rng.random() < 0.2:
            reuses = (reuses + [float(rng.randrange(10**6, 10**10))])[-63:]
            st["demand"] = float(np.median(reuses))
        st["reuses"] = list(reuses)
        if i == n // 2:
            st["params"] = dict(st["params"], live=1.5)
        if i % 97 == 5:
            st["jitter"] = rng.choice([math.inf, 0.1, 1e-300])
        if i % 89 == 7:
            st["reuses"] = st["reuses"] + [math.nan]
        yield st


def test_encode_gives_json_dumps_text_as_the_window_and_parameters_change():
    rows = StateRows()
    for st in states():
        assert rows.encode(st) == json.dumps(st, separators=SEPARATORS)
    odd = {"policy": "rank", "clock": 1.0}  # no window, no parameters: json itself
    assert rows.encode(odd) == json.dumps(odd, separators=SEPARATORS)
    quoted = {"policy": 'a "reuses":null b', "params": {}, "reuses": [1.0], "clock": 2.0}
    assert json.loads(rows.encode(quoted)) == quoted


def test_decode_gives_json_loads_values_for_every_row_it_is_given():
    rows = StateRows()
    for st in states(seed=1):
        raw = json.dumps(st, separators=SEPARATORS)
        got, want = rows.decode(raw), json.loads(raw)
        assert json.dumps(got) == json.dumps(want)  # NaN compares unequal: compare the text
    window = [float(i) for i in range(63)]
    base = json.dumps({"policy": "rank", "clock": 3.0, "reuses": window}, separators=SEPARATORS)
    rows.decode(base)
    others = [
        json.dumps({"policy": "rank", "clock": 4.0, "reuses": window}),  # spaces: another writer's style
        json.dumps({"policy": 'x "reuses":[0.0,1.0] y', "reuses": window}, separators=SEPARATORS),
        json.dumps({"params": {"reuses": window}, "reuses": window[:3]}, separators=SEPARATORS),
        json.dumps({"clock": 5.0, "reuses": window, "more": [1, [2]]}, separators=SEPARATORS),
        json.dumps([{"reuses": window}], separators=SEPARATORS),
        '{"reuses":[0.0,1.0',
    ]
    for raw in others:
        try:
            want = json.loads(raw)
        except ValueError:
            with pytest.raises(ValueError):
                rows.decode(raw)
            continue
        assert rows.decode(raw) == want
    got = rows.decode(base)
    got["reuses"].append(99.0)  # the caller's copy: the next decode is not changed
    assert rows.decode(base)["reuses"] == window
    with pytest.raises(ValueError):
        rows.decode(base[:-1])


def test_writers_row_is_parsed_once_and_bad_rows_raise():
    rows = StateRows()
    raw = json.dumps({"1-a": 5.0, "2-b": 7})
    first = rows.writers(raw)
    assert first == {"1-a": 5.0, "2-b": 7.0}
    first["3-c"] = 1.0  # the caller's copy
    assert rows.writers(raw) == {"1-a": 5.0, "2-b": 7.0}
    for bad in ("[1, 2]", "not json", '{"a": "x"}'):
        with pytest.raises((TypeError, ValueError, AttributeError)):
            rows.writers(bad)


def _writers(directory) -> dict:
    con = sqlite3.connect(os.path.join(directory, INDEX_NAME))
    try:
        return json.loads(con.execute("SELECT value FROM admission_state WHERE name = 'writers'").fetchone()[0])
    finally:
        con.close()


def test_the_writers_row_changes_when_a_process_joins_or_its_clock_lags(tmp_path):
    """Two caches on one directory are two of the node's processes (one token each)."""
    capacity = 40 * BLOCK
    value = np.zeros(2 * BLOCK // 8, np.int64)
    a = ColumnCache(tmp_path, capacity=capacity, admission="rank", write_queue=0)
    b = ColumnCache(tmp_path, capacity=capacity, admission="rank", write_queue=0)
    try:
        a[f"k{0}"] = value
        first = _writers(tmp_path)
        assert len(first) == 1
        for i in range(1, 6):  # no demand yet: nothing lags; the row stays
            a[f"k{i}"] = value
        assert _writers(tmp_path) == first
        b["b0"] = value  # another process saves: listed beside the first
        both = _writers(tmp_path)
        assert len(both) == 2 and set(first) < set(both)
        a["k6"] = value
        assert a.admission._writers.keys() == both.keys()
        assert a.admission.grace() > 0  # the other process counts in the grace
        # with a demand, a clock that lags more than WRITERS_LAG demands is written again
        adm = a.admission
        token = adm._token
        with adm._lock:
            adm._policy.demand = float(4 * BLOCK)
        lag_before = _writers(tmp_path)[token]
        wrote_at = None
        for i in range(7, 40):
            a[f"k{i}"] = value
            now = _writers(tmp_path)[token]
            if now != lag_before:
                wrote_at = adm._policy.clock
                break
        assert wrote_at is not None
        assert wrote_at - lag_before > WRITERS_LAG * adm._policy.demand
    finally:
        a.close()
        b.close()
