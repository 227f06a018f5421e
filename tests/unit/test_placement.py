"""Tests of :mod:`cacheaffinity.placement`: properties over random inputs (hypothesis),
exact comparison with a brute-force torus computation, and argument validation."""

from __future__ import annotations

import math
import random
import time
from collections import Counter

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cacheaffinity import placement
from cacheaffinity.placement import TorusPlacement

SETTINGS = settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

# ---------------------------------------------------------------- strategies
node_ids = st.text(min_size=0, max_size=8)
weights = st.floats(min_value=0.25, max_value=4.0, allow_nan=False, allow_infinity=False)
node_sets = st.dictionaries(node_ids, weights, min_size=1, max_size=10)
chunk_ids = st.lists(st.one_of(st.text(max_size=12), st.binary(max_size=12)), max_size=120)
params = st.fixed_dictionaries(
    {
        "dimensions": st.integers(1, 5),
        "replicas": st.integers(1, 12),
        "seed": st.integers(0, 2**20),
    }
)
balances = st.one_of(st.none(), st.floats(1.01, 2.0))


def make(nodes, balance=None, **kw) -> TorusPlacement:
    p = TorusPlacement(balance=balance, **kw)
    p.set_nodes(nodes)
    return p


def as_bytes(c) -> bytes:
    return c.encode("utf-8", "surrogatepass") if isinstance(c, str) else bytes(c)


# ------------------------------------------------- the documented math, written out
def coords(identity: bytes, dimensions: int, seed: int) -> np.ndarray:
    """Coordinates as the module docstring defines them."""
    return np.array(
        [
            (xxhash.xxh3_64_intdigest(identity, seed=(seed * 1000003 + i) % 2**64) >> 11)
            / 2**53
            for i in range(dimensions)
        ]
    )


def torus_l1(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sum_i min(|a_i - b_i|, 1 - |a_i - b_i|), dimensions added left to right."""
    diff = np.abs(a - b)
    per_dim = np.minimum(diff, 1.0 - diff)
    total = np.zeros(per_dim.shape[:-1])
    for i in range(per_dim.shape[-1]):
        total = total + per_dim[..., i]
    return total


def brute_force_ranking(chunk, nodes, dimensions, replicas, seed) -> list[str]:
    """All nodes, ordered by (distance of their nearest replica, node id)."""
    c = coords(as_bytes(chunk), dimensions, seed)
    dist = {}
    for n, w in nodes.items():
        pts = np.array(
            [
                coords(f"{n}\x00{j}".encode(), dimensions, seed)
                for j in range(max(1, round(replicas * w)))
            ]
        )
        dist[n] = torus_l1(c, pts).min()
    return sorted(nodes, key=lambda n: (dist[n], n))


def serial_greedy(placement_, chunks, nodes) -> dict[bytes, str]:
    """Bounded loads as the docstring describes them, one chunk at a time."""
    uniq = sorted(set(map(as_bytes, chunks)))
    pts = {b: coords(b, placement_.dimensions, placement_.seed) for b in uniq}
    full = {b: placement_.ranking(b, len(nodes)) for b in uniq}
    d0 = {}
    for b in uniq:
        n0 = full[b][0]
        reps = [
            coords(f"{n0}\x00{j}".encode(), placement_.dimensions, placement_.seed)
            for j in range(max(1, round(placement_.replicas * nodes[n0])))
        ]
        d0[b] = torus_l1(pts[b], np.array(reps)).min()
    order = sorted(uniq, key=lambda b: (d0[b], *pts[b].tolist(), b))
    caps = placement_.capacities(len(uniq))
    load = Counter()
    out = {}
    for b in order:
        for n in full[b]:
            if load[n] < caps[n]:
                load[n] += 1
                out[b] = n
                break
    return out


# ---------------------------------------------------------------- properties
@SETTINGS
@given(nodes=node_sets, chunks=chunk_ids, kw=params, balance=balances)
def test_deterministic(nodes, chunks, kw, balance):
    a = make(nodes, balance, **kw)
    b = make(dict(reversed(list(nodes.items()))), balance, **kw)
    assert a.assign(chunks) == b.assign(chunks)
    assert a.rankings(chunks, 3) == b.rankings(chunks, 3)


@SETTINGS
@given(nodes=node_sets, chunks=chunk_ids, kw=params, balance=balances, rnd=st.randoms())
def test_order_independent(nodes, chunks, kw, balance, rnd):
    p = make(nodes, balance, **kw)
    chunks = chunks + chunks[: len(chunks) // 3]  # with duplicates
    shuffled = list(chunks)
    rnd.shuffle(shuffled)
    first = dict(zip(map(as_bytes, chunks), p.assign(chunks)))
    second = dict(zip(map(as_bytes, shuffled), p.assign(shuffled)))
    assert first == second
    # duplicates (and "x" == b"x") land on one node
    assert len(first) == len(set(map(as_bytes, chunks)))


@SETTINGS
@given(nodes=node_sets, chunks=chunk_ids, kw=params, data=st.data())
def test_removing_a_node_moves_only_its_chunks(nodes, chunks, kw, data):
    assume(len(nodes) >= 2)
    gone = data.draw(st.sampled_from(sorted(nodes)))
    before = make(nodes, **kw).assign(chunks)
    after = make({n: w for n, w in nodes.items() if n != gone}, **kw).assign(chunks)
    for b, a in zip(before, after):
        if b != gone:
            assert a == b
        else:
            assert a != gone


@SETTINGS
@given(nodes=node_sets, chunks=chunk_ids, kw=params, new=node_ids, w=weights)
def test_adding_a_node_moves_chunks_only_to_it(nodes, chunks, kw, new, w):
    assume(new not in nodes)
    p = make(nodes, **kw)
    before = p.assign(chunks)
    p.set_nodes({**nodes, new: w})  # incremental: replica points of old nodes cached
    after = p.assign(chunks)
    assert after == make({**nodes, new: w}, **kw).assign(chunks)
    for b, a in zip(before, after):
        assert a == b or a == new


@SETTINGS
@given(nodes=node_sets, chunks=chunk_ids, kw=params, data=st.data(), factor=st.floats(0.1, 3))
def test_changing_a_weight_moves_only_that_nodes_chunks(nodes, chunks, kw, data, factor):
    node = data.draw(st.sampled_from(sorted(nodes)))
    p = make(nodes, **kw)
    before = p.assign(chunks)
    p.set_nodes({**nodes, node: nodes[node] * factor})
    after = p.assign(chunks)
    for b, a in zip(before, after):
        if a != b:
            assert node in (a, b)
            # lower weight: only away from the node; higher weight: only to it
            assert (b == node) if factor < 1 else (a == node)


@SETTINGS
@given(nodes=node_sets, chunks=chunk_ids, kw=params, balance=st.floats(1.001, 1.5))
def test_bounded_loads_never_exceed_the_cap(nodes, chunks, kw, balance):
    p = make(nodes, balance, **kw)
    result = p.assign(chunks)
    distinct = dict(zip(map(as_bytes, chunks), result))
    caps = p.capacities(len(distinct))
    total = sum(nodes.values())
    for n, load in Counter(distinct.values()).items():
        assert load <= caps[n] == math.ceil(balance * len(distinct) * nodes[n] / total)


@SETTINGS
@given(nodes=node_sets, chunks=st.lists(st.text(max_size=8), max_size=25), kw=params,
       balance=st.floats(1.001, 1.5))
def test_bounded_loads_are_the_serial_greedy(nodes, chunks, kw, balance):
    p = make(nodes, balance, **kw)
    expected = serial_greedy(p, chunks, nodes)
    assert p.assign(chunks) == [expected[as_bytes(c)] for c in chunks]


@SETTINGS
@given(nodes=node_sets, chunks=chunk_ids, kw=params)
def test_unreachable_cap_is_nearest_node(nodes, chunks, kw):
    nearest = make(nodes, **kw).assign(chunks)
    assert make(nodes, balance=1e6, **kw).assign(chunks) == nearest


@SETTINGS
@given(nodes=node_sets, chunks=chunk_ids, kw=params, k=st.integers(1, 12))
def test_rankings(nodes, chunks, kw, k):
    p = make(nodes, **kw)
    ranked = p.rankings(chunks, k)
    assert [r[0] for r in ranked] == p.assign(chunks)
    for c, r in zip(chunks, ranked):
        assert len(r) == len(set(r)) == min(k, len(nodes))
        assert p.ranking(c, k) == r
    if chunks:
        c = chunks[0]
        expected = brute_force_ranking(c, nodes, **kw)
        assert p.ranking(c, k) == expected[:k]


@SETTINGS
@given(chunks=st.lists(st.text(max_size=12), min_size=1, max_size=30), kw=params)
def test_periodic_l1_brute_force(chunks, kw):
    """assign == argmin of the torus L1 distance, with coordinates as documented."""
    nodes = {f"n{i}": 1.0 for i in range(7)}
    p = make(nodes, **kw)
    for c, got in zip(chunks, p.assign(chunks)):
        assert got == brute_force_ranking(c, nodes, **kw)[0]


def test_brute_force_distances_equal_the_trees_bit_for_bit():
    """Deep rankings use distances to all points; they must equal the k-d tree's
    distances exactly, or rankings of different depths could disagree."""
    from scipy.spatial import cKDTree

    rng = np.random.default_rng(5)
    for d in (1, 2, 4, 6):
        pts, x = rng.random((500, d)), rng.random((50, d))
        dist, idx = cKDTree(pts, boxsize=1.0).query(x, k=20, p=1)
        full = placement._torus_l1(x, pts)
        assert np.array_equal(np.take_along_axis(full, idx, axis=1), dist)
        np.testing.assert_allclose(full, torus_l1(x[:, None, :], pts[None, :, :]), rtol=1e-15)


def test_distance_is_periodic_l1_not_another_metric():
    """On 300 chunks, the torus L1 answer differs from plain L1 and from torus L2:
    the brute-force comparison above would notice a wrong metric."""
    d, r = 3, 4
    nodes = {f"n{i}": 1.0 for i in range(12)}
    p = make(nodes, dimensions=d, replicas=r)
    pts = {n: np.array([coords(f"{n}\x00{j}".encode(), d, 0) for j in range(r)]) for n in nodes}
    chunks = [f"chunk-{i}" for i in range(300)]
    got = p.assign(chunks)

    def nearest(c, metric):
        x = coords(c.encode(), d, 0)
        return min(nodes, key=lambda n: (metric(x, pts[n]).min(), n))

    def plain_l1(a, b):
        return np.abs(a - b).sum(axis=-1)

    def torus_l2(a, b):
        diff = np.abs(a - b)
        return np.sqrt((np.minimum(diff, 1 - diff) ** 2).sum(axis=-1))

    assert got == [nearest(c, torus_l1) for c in chunks]
    assert got != [nearest(c, plain_l1) for c in chunks]
    assert got != [nearest(c, torus_l2) for c in chunks]


def test_deep_ranking_uses_all_points():
    """k = all nodes with many points: tree queries widen, then distances to all points."""
    nodes = {f"node-{i:02d}": 1.0 + (i % 3) for i in range(40)}
    p = make(nodes, dimensions=3, replicas=8)
    chunks = [f"chunk-{i}" for i in range(20)]
    expected = [brute_force_ranking(c, nodes, 3, 8, 0) for c in chunks]
    assert p.rankings(chunks, 40) == expected  # vectorised
    assert p.rankings(chunks, 1000) == expected
    assert p.rankings(chunks, 7) == [r[:7] for r in expected]
    for c, r in zip(chunks[:3], expected):  # row by row
        assert p.ranking(c, 40) == r
        assert p.ranking(c, 7) == r[:7]


@pytest.mark.parametrize(
    "n_nodes, replicas",
    [
        pytest.param(10, 3, id="tree-queries"),
        pytest.param(60, 8, id="distances-to-all-points"),  # > 256 points, k = all
    ],
)
def test_exact_ties_are_broken_by_node_id(monkeypatch, n_nodes, replicas):
    """Coordinates rounded to 1/4 make many points coincide: rankings order exact ties
    by node id, and bounded loads stay independent of input order (identical points of
    different chunks are ordered by id)."""
    original = placement._points
    monkeypatch.setattr(
        placement, "_points", lambda ids, seeds: np.floor(original(ids, seeds) * 4) / 4
    )
    nodes = {f"node-{i}": 1.0 for i in range(n_nodes)}
    p = make(nodes, dimensions=2, replicas=replicas)
    chunks = [f"c{i}" for i in range(200)]
    pts = {
        n: np.floor(
            np.array([coords(f"{n}\x00{j}".encode(), 2, 0) for j in range(replicas)]) * 4
        ) / 4
        for n in nodes
    }
    expected = []
    for c in chunks[:40]:
        x = np.floor(coords(c.encode(), 2, 0) * 4) / 4
        dist = {n: torus_l1(x, pts[n]).min() for n in nodes}
        expected.append(sorted(nodes, key=lambda n: (dist[n], n)))
    assert p.rankings(chunks[:40], n_nodes) == expected  # vectorised
    assert [p.ranking(c, n_nodes) for c in chunks[:10]] == expected[:10]  # row by row
    assert p.rankings(chunks[:40], 3) == [r[:3] for r in expected]
    b = make(nodes, 1.1, dimensions=2, replicas=replicas)
    expected = b.assign(chunks)
    rnd = random.Random(1)
    for _ in range(5):
        shuffled = rnd.sample(chunks, len(chunks))
        assert dict(zip(shuffled, b.assign(shuffled))) == dict(zip(chunks, expected))
    assert max(Counter(expected).values()) <= b.capacities(200)["node-0"]


def test_weights_are_proportional():
    """Weight-2 nodes get about twice the chunks of weight-1 nodes."""
    nodes = {f"node-{i}": 1.0 if i % 2 else 2.0 for i in range(20)}
    p = make(nodes, dimensions=4, replicas=100, seed=3)
    counts = Counter(p.assign([f"file-{i}" for i in range(20_000)]))
    heavy = np.mean([counts[n] for n, w in nodes.items() if w == 2])
    light = np.mean([counts[n] for n, w in nodes.items() if w == 1])
    assert 1.8 < heavy / light < 2.2


def test_load_is_even_with_4_dimensions_and_100_replicas():
    p = make({f"node-{i}": 1 for i in range(100)}, dimensions=4, replicas=100)
    counts = Counter(p.assign([f"chunk-{i}" for i in range(50_000)]))
    assert max(counts.values()) / (50_000 / 100) < 1.25
    b = make({f"node-{i}": 1 for i in range(100)}, balance=1.05, dimensions=4, replicas=100)
    counts = Counter(b.assign([f"chunk-{i}" for i in range(50_000)]))
    assert max(counts.values()) <= 525


def test_large_batches_agree_with_small_ones():
    """Batches of >= 10 000 chunks take another path (grid-sorted, multi-threaded
    queries); results are those of small batches."""
    nodes = {f"node-{i}": 1 + i % 3 for i in range(30)}
    chunks = [f"file-{i // 100}/Events/{i % 100}" for i in range(24_000)]
    p = make(nodes, dimensions=4, replicas=16)
    big = p.assign(chunks)
    assert big == [n for s in range(0, len(chunks), 5000) for n in p.assign(chunks[s : s + 5000])]
    ranked = p.rankings(chunks[:12_000], 3)
    assert ranked[::100] == [p.ranking(c, 3) for c in chunks[:12_000:100]]
    assert [r[0] for r in ranked] == big[:12_000]
    b = make(nodes, 1.05, dimensions=4, replicas=16)
    shuffled = random.Random(0).sample(chunks, len(chunks))
    balanced = b.assign(chunks)
    assert dict(zip(shuffled, b.assign(shuffled))) == dict(zip(chunks, balanced))
    caps = b.capacities(len(chunks))
    assert all(load <= caps[n] for n, load in Counter(balanced).items())


def test_docstring_examples():
    import doctest

    assert doctest.testmod(placement).failed == 0


def test_str_and_bytes_ids_are_the_same_chunk():
    p = make({"a": 1, "b": 1, "c": 1})
    ids = [f"chunk-{i}" for i in range(50)]
    assert p.assign(ids) == p.assign([i.encode() for i in ids])
    assert p.ranking("chunk-0", 3) == p.ranking(b"chunk-0", 3)


def test_membership_changes_are_cheap():
    p = TorusPlacement(dimensions=4, replicas=100)
    nodes = {f"node-{i}": 1 for i in range(1000)}
    p.set_nodes(nodes)
    start = time.perf_counter()
    p.set_nodes({**nodes, "node-new": 1})
    p.set_nodes(nodes)
    assert time.perf_counter() - start < 2.0  # measured ~0.05 s each


def test_properties_and_copies():
    p = TorusPlacement(dimensions=3, replicas=7, seed=11, balance=1.2)
    assert (p.dimensions, p.replicas, p.seed, p.balance) == (3, 7, 11, 1.2)
    assert p.nodes == {}
    p.set_nodes({"x": 2, "y": 0.5})
    nodes = p.nodes
    nodes["z"] = 1
    assert p.nodes == {"x": 2.0, "y": 0.5}
    assert p.assign([]) == [] and p.rankings([], 2) == []
    assert p.capacities(100) == {"x": 96, "y": 24}
    assert "3" in repr(p) and "2 nodes" in repr(p)
    p.set_nodes({})
    with pytest.raises(ValueError, match="no cache nodes"):
        p.assign(["a"])


# ---------------------------------------------------------------- invalid arguments
@pytest.mark.parametrize(
    "kwargs, words",
    [
        pytest.param({"dimensions": 0}, ["dimensions=0", ">= 1"], id="dimensions-zero"),
        pytest.param({"dimensions": 2.5}, ["dimensions=2.5", "integer"], id="dimensions-float"),
        pytest.param({"dimensions": True}, ["dimensions=True", "integer"], id="dimensions-bool"),
        pytest.param({"replicas": 0}, ["replicas=0", ">= 1"], id="replicas-zero"),
        pytest.param({"replicas": "32"}, ["replicas='32'", "integer"], id="replicas-str"),
        pytest.param({"seed": -1}, ["seed=-1", ">= 0"], id="seed-negative"),
        pytest.param({"balance": 1.0}, ["balance=1.0", "> 1", "None"], id="balance-one"),
        pytest.param({"balance": 0.5}, ["balance=0.5", "> 1"], id="balance-below-one"),
        pytest.param({"balance": float("nan")}, ["balance=nan", "> 1"], id="balance-nan"),
        pytest.param({"balance": float("inf")}, ["balance=inf", "finite"], id="balance-inf"),
        pytest.param({"balance": "1.2"}, ["balance='1.2'", "number"], id="balance-str"),
    ],
)
def test_invalid_constructor_arguments(kwargs, words):
    with pytest.raises(ValueError) as info:
        TorusPlacement(**kwargs)
    for w in words:
        assert w in str(info.value)


@pytest.mark.parametrize(
    "weights, words",
    [
        pytest.param({"a": 1, "b": 0}, ["'b'", "0.0", "> 0"], id="weight-zero"),
        pytest.param({"a": -2}, ["'a'", "-2.0", "> 0"], id="weight-negative"),
        pytest.param({"a": float("nan")}, ["'a'", "nan", "finite"], id="weight-nan"),
        pytest.param({"a": float("inf")}, ["'a'", "inf", "finite"], id="weight-inf"),
        pytest.param({"a": "1"}, ["'a'", "'1'", "number"], id="weight-str"),
        pytest.param({"a": None}, ["'a'", "None", "number"], id="weight-none"),
        pytest.param({"a": 1, "big": 10 * 2**30}, ["'big'", "replica points", "scale them down"],
                     id="weight-in-bytes"),
    ],
)
def test_invalid_weights(weights, words):
    p = TorusPlacement()
    with pytest.raises(ValueError) as info:
        p.set_nodes(weights)
    for w in words:
        assert w in str(info.value)
    assert p.nodes == {}  # unchanged


@pytest.mark.parametrize(
    "call, error, words",
    [
        pytest.param(lambda p: p.assign(["a"]), ValueError, ["no cache nodes", "set_nodes("],
                     id="assign-without-nodes"),
        pytest.param(lambda p: p.ranking("a", 1), ValueError, ["no cache nodes"],
                     id="ranking-without-nodes"),
        pytest.param(lambda p: p.rankings(["a"], 2), ValueError, ["no cache nodes"],
                     id="rankings-without-nodes"),
    ],
)
def test_no_nodes(call, error, words):
    with pytest.raises(error) as info:
        call(TorusPlacement())
    for w in words:
        assert w in str(info.value)


@pytest.mark.parametrize(
    "call, error, words",
    [
        pytest.param(lambda p: p.ranking("a", 0), ValueError, ["k=0", ">= 1"], id="k-zero"),
        pytest.param(lambda p: p.rankings(["a"], -1), ValueError, ["k=-1"], id="k-negative"),
        pytest.param(lambda p: p.ranking("a", 1.5), ValueError, ["k=1.5", "integer"],
                     id="k-float"),
        pytest.param(lambda p: p.assign("chunk-1"), TypeError, ["assign([chunk_id])"],
                     id="assign-single-str"),
        pytest.param(lambda p: p.assign(["a", 3]), TypeError, ["chunk_ids[1]", "int"],
                     id="assign-int-id"),
        pytest.param(lambda p: p.ranking(3, 1), TypeError, ["str or bytes"], id="ranking-int-id"),
        pytest.param(lambda p: p.set_nodes(["a"]), TypeError, ["mapping"], id="nodes-list"),
        pytest.param(lambda p: p.set_nodes({1: 1.0}), TypeError, ["node ids must be str"],
                     id="node-id-int"),
    ],
)
def test_invalid_calls(call, error, words):
    p = TorusPlacement()
    p.set_nodes({"a": 1})
    with pytest.raises(error) as info:
        call(p)
    for w in words:
        assert w in str(info.value)
