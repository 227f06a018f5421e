"""``Forecast.submitted_columns`` (numpy counts per node) gives what one step per chunk
task gives, with sizes known and unknown, holders known and not, emptied nodes, and node
codes; and
``RunFigures.submitted_keys`` what ``submitted`` of a dict gives."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cacheaffinity.scheduler._forecast import Forecast
from cacheaffinity.scheduler._runs import RunFigures


def _reference(sizes: dict, placed: list[tuple[int, str]], empty: set, holders: dict) -> dict:
    """The per-node ``[chunks, bytes of known chunks, chunks of unknown size]``, a task at a
    time (a chunk another node holds is new where it is placed)."""
    rec: dict[str, list[int]] = {}
    for sk, node in placed:
        n = rec.setdefault(node, [0, 0, 0])
        n[0] += 1
        b = sizes.get(sk)
        if b is None or node in empty or holders.get(sk) not in (None, node):
            n[2] += 1
        else:
            n[1] += b
    return rec


@pytest.mark.parametrize("seed", range(6))
def test_columns_equal_one_task_at_a_time(seed):
    rng = random.Random(seed)
    names = [f"node-{i:03d}" for i in range(rng.randint(1, 40))]
    f = Forecast()
    for sk in range(0, 3000, rng.choice([1, 2, 3])):  # some sizes known, big ones too
        # held by one of the nodes, by a node never placed, or by none known
        f.reported(sk, rng.choice([1, 10**6, 3 * 10**12]), rng.choice([*names, "a-node-gone", None]))
    sizes = {sk: f.size(sk) for sk in f.sizes}
    holders = {sk: f.holder(sk) for sk in f.sizes}
    assert {None, "a-node-gone"} <= set(holders.values()) or len(holders) < 100
    m = rng.randint(1, 5000)
    codes = np.array([rng.randrange(len(names)) for _ in range(m)], dtype=np.int64)
    nodes = [names[c] for c in codes]
    sks = [rng.randrange(4000) for _ in range(m)]
    empty = set(rng.sample(names, k=min(2, len(names)))) | {"a-node-not-placed"}
    want = _reference(sizes, list(zip(sks, nodes)), empty, holders)
    assert any(v[2] for v in want.values())
    f.submitted_columns("r1", iter(sks), nodes, empty)
    f.submitted_columns("r2", sks, nodes, empty, coded=(codes, names))
    f.submitted("r3", zip(sks, nodes), empty)
    for run in ("r1", "r2", "r3"):
        assert f.runs[run] == want, run
    # a second submission of a run adds up
    f.submitted_columns("r1", sks, nodes, empty)
    assert f.runs["r1"] == {n: [2 * x for x in v] for n, v in want.items()}


def test_nothing_submitted_makes_an_empty_run():
    f = Forecast()
    f.submitted_columns("r", [], [])
    assert f.runs["r"] == {}


def test_submitted_keys_equal_submitted_of_a_dict():
    a, b = RunFigures(), RunFigures()
    keys = [f"k{i}" for i in range(100)]
    a.submitted(dict.fromkeys(keys, "run-1"))
    b.submitted_keys(keys, "run-1")
    assert a.task_run == b.task_run and a.get("run-1")[0]["tasks"] == b.get("run-1")[0]["tasks"] == 100
    # resubmitted keys count once; keys moved to another run count there
    a.submitted(dict.fromkeys(keys[:50], "run-1") | dict.fromkeys(keys[50:60], "run-2"))
    b.submitted_keys(keys[:50], "run-1")
    b.submitted_keys(keys[50:60], "run-2")
    assert a.task_run == b.task_run
    assert [r["tasks"] for r in a.get(last=2)] == [r["tasks"] for r in b.get(last=2)] == [100, 10]
