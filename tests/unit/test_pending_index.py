"""PendingIndex: every pending task's home is the tree's, after any layout change,
and a relayout reports exactly the tasks whose home node changed (no full scan)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cacheaffinity.placement import TorusPlacement
from cacheaffinity.scheduler import _pending
from cacheaffinity.scheduler._pending import PendingIndex


def _homes(p: TorusPlacement, chunks: dict) -> dict:
    keys = list(chunks)
    return dict(zip(keys, p.nearest([chunks[k] for k in keys]))) if keys else {}


def _run(
    seed: int, dims: int, replicas: int, steps: int, burst: bool = False, side=None, lazy: bool = False
) -> None:
    """``lazy``: the homes come from a second placement and the index is checked at
    the end only, so no layout's tree of ``p`` is built between the changes (a join
    then finds buckets in an older layout's tree and a small tree of the points since)."""
    rng = random.Random(seed)
    p = TorusPlacement(dimensions=dims, replicas=replicas, seed=seed % 3)
    ref = TorusPlacement(dimensions=dims, replicas=replicas, seed=seed % 3) if lazy else p
    nodes = {f"n{i}": float(rng.choice([1, 1, 2, 3])) for i in range(rng.randint(1, 6))}
    p.set_nodes(nodes)
    ref.set_nodes(nodes)
    ix = PendingIndex(p)
    ix.side = side
    chunks = {f"k{i}": f"file-{rng.randrange(10**6)}/Events/{i}" for i in range(rng.randint(0, 400))}
    if chunks:
        ix.add_chunks(list(chunks), list(chunks.values()))
    assert ix.relayout() == set()
    nxt = len(chunks)
    for step in range(steps):
        before = _homes(ref, chunks)
        op = rng.random()
        if op < 0.4 or len(nodes) < 2:  # joins (a burst now and then)
            for _ in range(rng.choice([1, 1, 2, 8] if burst else [1, 1, 2])):
                nodes[f"j{step}-{rng.randrange(10**6)}"] = float(rng.choice([1, 2]))
        elif op < 0.7:
            del nodes[rng.choice(sorted(nodes))]
        elif op < 0.85:  # a weight change adds or removes replica points
            n = rng.choice(sorted(nodes))
            nodes[n] = float(rng.choice([0.5, 1, 2, 4]))
        else:  # tasks come and go between layout changes
            for k in rng.sample(sorted(chunks), min(len(chunks), rng.randint(0, 30))):
                ix.discard(k)
                del chunks[k]
            new = {f"k{nxt + i}": f"file-{rng.randrange(10**6)}/Events/x{i}" for i in range(rng.randint(0, 30))}
            nxt += len(new)
            chunks.update(new)
            ix.add_chunks(list(new), list(new.values()))
            before = _homes(ref, chunks)
        p.set_nodes(nodes)
        ref.set_nodes(nodes)
        changed = ix.relayout()
        after = _homes(ref, chunks)
        assert changed == {k for k in chunks if before[k] != after[k]}
        assert {k: ix.home(k) for k in chunks} == after
        if not lazy:
            assert ix.check() == []
        assert len(ix) == len(chunks)
    assert ix.check() == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    dims=st.integers(1, 4),
    replicas=st.sampled_from([1, 4, 16, 32]),
    side=st.sampled_from([None, "points", "tasks"]),
)
def test_homes_match_a_full_query_after_every_change(seed, dims, replicas, side):
    _run(seed, dims, replicas, steps=8, side=side)


@pytest.mark.parametrize("side", ["points", "tasks"])
@pytest.mark.parametrize("seed", range(4))
def test_bursts_in_small_slices_match(seed, side, monkeypatch):
    # a small slice makes every relayout run in several slices
    monkeypatch.setattr(_pending, "SLICE", 2)
    _run(seed, 3, 32, steps=10, burst=True, side=side)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    dims=st.integers(1, 4),
    replicas=st.sampled_from([1, 4, 16, 32]),
    small_slices=st.booleans(),
)
def test_joins_without_a_tree_between_them_match(seed, dims, replicas, small_slices):
    # joins (and leaves, weight changes, task churn) in a row with no query of the
    # placement between them: buckets are found in an older tree plus the points since
    old = _pending.SLICE
    _pending.SLICE = 2 if small_slices else old
    try:
        _run(seed, dims, replicas, steps=10, burst=True, side="points", lazy=True)
    finally:
        _pending.SLICE = old


def test_a_join_builds_no_tree_of_every_point():
    p = TorusPlacement(dimensions=3, replicas=16)
    p.set_nodes({f"n{i}": 1.0 for i in range(50)})  # 3 joins add < 1/8 of the points
    ix = PendingIndex(p)
    chunks = [f"c{i}" for i in range(3000)]
    ix.add_chunks(chunks, chunks)
    for j in range(3):  # one join after another, nothing queries the placement
        p.set_nodes({**p.nodes, f"j{j}": 1.0})
        ix.side = "points"
        ix.relayout()
        assert not p.layout().built
    ref = TorusPlacement(dimensions=3, replicas=16)
    ref.set_nodes(p.nodes)
    assert {k: ix.home(k) for k in chunks} == dict(zip(chunks, ref.nearest(chunks)))


def test_no_node_then_nodes():
    p = TorusPlacement(dimensions=3, replicas=8)
    ix = PendingIndex(p)
    ix.add_chunks(["a", "b"], ["c-a", "c-b"])
    assert ix.home("a") is None
    p.set_nodes({"x": 1.0, "y": 1.0})
    assert ix.relayout() == {"a", "b"}
    assert ix.check() == []
    p.set_nodes({})
    assert ix.relayout() == {"a", "b"}
    assert ix.home("a") is None


def test_memory_is_per_pending_task():
    p = TorusPlacement(dimensions=3, replicas=8)
    p.set_nodes({f"n{i}": 1.0 for i in range(10)})
    ix = PendingIndex(p)
    keys = [f"k{i}" for i in range(2000)]
    ix.add_chunks(["stays"], ["a chunk pending all along"])
    for rnd in range(3):
        ix.add_chunks(keys, [f"r{rnd}-{k}" for k in keys])
        for k in keys:
            ix.discard(k)
    assert len(ix) == 1 and len(ix._bucket) == 1 and not ix._unhomed
    assert len(ix._keys) == 2001  # slots are reused while tasks are pending
    assert np.sum(ix._pid >= 0) == 1
    ix.discard("stays")  # nothing pending: the slots go (memory follows what is pending)
    assert len(ix) == 0 and not ix._bucket and not ix._radius and not ix._unhomed
    assert len(ix._keys) == 0 and len(ix._pid) == 0 and not ix._free
    ix.add_chunks(keys[:10], keys[:10])  # and it indexes again
    assert len(ix) == 10 and len(ix._keys) == 10
