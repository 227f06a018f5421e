"""The bulk paths of placement equal their per-task originals: ``Locator.track_many``
and ``set_targets``/``set_targets_coded`` leave the locator as ``track`` and
``set_target`` task by task; ``RunFigures.submitted``'s all-new fast path counts as its
loop; ``size_keys`` equals ``size_key``. Real ``Membership``/``TorusPlacement``/``Locator``."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cacheaffinity.placement import TorusPlacement
from cacheaffinity.scheduler._forecast import size_key, size_keys
from cacheaffinity.scheduler._locator import Locator
from cacheaffinity.scheduler._membership import Membership
from cacheaffinity.scheduler._runs import RunFigures

NODES = [f"n{i}" for i in range(5)]


def _locator() -> Locator:
    placement = TorusPlacement()
    placement.set_nodes({n: 1.0 for n in NODES})
    return Locator(Membership(), placement, size=1000)


def _state(loc: Locator) -> tuple:
    return (
        dict(loc.chunk_of), dict(loc.entries), dict(loc.target),
        {n: set(t) for n, t in loc.node_tasks.items() if t}, set(loc.untargeted_keys),
    )  # fmt: skip


@pytest.mark.parametrize("seed", range(6))
def test_bulk_tracking_and_targeting_equal_task_by_task(seed):
    rng = random.Random(seed)
    one, bulk = _locator(), _locator()
    for round_ in range(3):  # later rounds re-submit some keys (targeted or not)
        keys = [f"k{rng.randrange(40)}" for _ in range(25)]
        keys = list(dict.fromkeys(keys))
        chunks = [f"f{k}/Events/{round_}" for k in keys]
        entries = {k: (0, 10 + i) for i, k in enumerate(keys) if rng.random() < 0.3}
        if rng.random() < 0.3:
            entries[keys[0]] = "not a range"
        targeted = rng.random() < 0.7
        for k, c in zip(keys, chunks):
            one.track(k, c, entries.get(k))
        bulk.track_many(keys, chunks, entries, untargeted=not targeted)
        if targeted:
            nodes = [rng.choice(NODES) for _ in keys]
            for k, n in zip(keys, nodes):
                one.set_target(k, n)
            if rng.random() < 0.5:
                bulk.set_targets(keys, nodes)
            else:
                codes = np.array([NODES.index(n) for n in nodes], dtype=np.int64)
                bulk.set_targets_coded(keys, codes, NODES)
        assert _state(bulk) == _state(one)


def test_run_figures_fast_path_counts_as_the_loop():
    a, b = RunFigures(), RunFigures()
    first = {f"k{i}": "r1" for i in range(10)}
    again = {**{f"k{i}": "r2" for i in range(5)}, "k20": "r1"}
    for rf in (a, b):
        rf.submitted(first)
    # b's second call takes the loop (keys seen before), as a's would
    for rf in (a, b):
        rf.submitted(again)
    assert a.task_run == b.task_run
    assert a.runs["r1"]["tasks"] == 11 and a.runs["r2"]["tasks"] == 5


def test_size_keys_equal_size_key():
    chunks = ["a", "uuid/Events/0-100", "\udcff surrogate", ""]
    assert list(size_keys(chunks)) == [size_key(c) for c in chunks]
