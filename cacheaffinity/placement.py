"""Placement of chunks on cache nodes: nearest node on a periodic unit cube (torus).

Pure math (no dask, disk, network or clock): the scheduler plugin runs it, and any process
gets the same answer, which depends only on the chunk ids, the node ids and weights and
``dimensions``, ``replicas``, ``seed`` and ``balance`` (not on input order, addresses or
restarts). A node joining, leaving or changing weight moves only chunks to or from it.

Coordinate ``i < D`` of an identity ``b`` (a chunk id as UTF-8; ``f"{n}\\x00{j}"`` for
replica ``j`` of node ``n``) is ``(xxh3_64(b, seed=(seed * 1000003 + i) % 2**64) >> 11) *
2**-53``; a chunk goes to the node of the replica point at the smallest periodic L1 distance.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat

import numpy as np
import xxhash
from scipy.spatial import cKDTree

__all__ = ["TorusPlacement"]

_SEED_STRIDE = 1000003
_MASK64 = (1 << 64) - 1
#: Batches this large are sorted by grid cell (memory locality) and queried on all cores.
_LARGE_BATCH = 10_000
#: A ranking needing this fraction of all points (and more than _BRUTE_FORCE_MIN) is brute force.
_BRUTE_FORCE_FRACTION = 0.125
_BRUTE_FORCE_MIN = 256
#: float64 distances held at once by the brute-force ranking.
_BRUTE_FORCE_BLOCK = 4_000_000
#: Bound on all nodes' replica points (memory, tree build time).
_MAX_POINTS = 20_000_000
#: Rankings of at most this many chunks are computed row by row (less overhead).
_SMALL_BATCH = 16

_hash = xxhash.xxh3_64_intdigest


class _Nodes:
    """Immutable snapshot of the node set; swapped in as one attribute. Its k-d tree is
    built at its first query (~0.05 s at 256k points): a join whose moves the scheduler's
    index of pending tasks finds without it builds none."""

    __slots__ = ("names", "names_arr", "weights", "counts", "points", "point_node", "starts", "_tree")

    def __init__(
        self,
        names: tuple[str, ...],  # sorted node ids; index = lexicographic rank
        names_arr: np.ndarray,  # the same as an object array (fast fancy indexing)
        weights: dict[str, float],
        counts: np.ndarray,  # replicas per node (int64)
        points: np.ndarray,  # (P, D) replica points, grouped by node in name order
        point_node: np.ndarray,  # (P,) node index of every point
        starts: np.ndarray,  # (n,) index of each node's first point
    ):
        self.names = names
        self.names_arr = names_arr
        self.weights = weights
        self.counts = counts
        self.points = points
        self.point_node = point_node
        self.starts = starts
        self._tree: cKDTree | None = None

    @property
    def tree(self) -> cKDTree | None:
        """The k-d tree of the replica points (None without nodes), built on first use:
        sliding-midpoint splits, uncompacted nodes (half the build time of balanced
        ones at 256k points, queries as fast, the same nearest distances)."""
        t = self._tree
        if t is None and self.names:
            t = self._tree = cKDTree(
                self.points, boxsize=1.0, leafsize=16, balanced_tree=False, compact_nodes=False
            )
        return t

    @property
    def built(self) -> bool:
        """Whether the tree is built (reading it does not build it)."""
        return self._tree is not None


_EMPTY = _Nodes(
    names=(),
    names_arr=np.empty(0, dtype=object),
    weights={},
    counts=np.empty(0, dtype=np.int64),
    points=np.empty((0, 1)),
    point_node=np.empty(0, dtype=np.int64),
    starts=np.empty(0, dtype=np.int64),
)


def _dimension_seeds(seed: int, dimensions: int) -> list[int]:
    return [(seed * _SEED_STRIDE + i) & _MASK64 for i in range(dimensions)]


def _points(identities: Sequence[bytes], seeds: Sequence[int]) -> np.ndarray:
    """Points in [0, 1)^D of byte-string identities, shape ``(len(identities), D)``."""
    m = len(identities)
    if m <= _SMALL_BATCH:  # fewer numpy calls
        rows = [[_hash(b, s) >> 11 for s in seeds] for b in identities]
        return np.array(rows, dtype=np.float64).reshape(m, len(seeds)) * 2.0**-53
    out = np.empty((m, len(seeds)), dtype=np.float64)
    for i, s in enumerate(seeds):
        h = np.fromiter(map(_hash, identities, repeat(s, m)), dtype=np.uint64, count=m)
        out[:, i] = h >> np.uint64(11)
    out *= 2.0**-53
    return out


def _as_bytes(chunk_ids: Iterable[str | bytes], what: str) -> list[bytes]:
    """Chunk ids as UTF-8 bytes, with a clear error for anything else."""
    if isinstance(chunk_ids, (str, bytes, bytearray, memoryview)):
        raise TypeError(
            f"{what} takes a list of chunk ids, got the single id {chunk_ids!r}; "
            f"use {what.split('(')[0]}([chunk_id])"
        )
    ids = chunk_ids if isinstance(chunk_ids, (list, tuple)) else list(chunk_ids)
    try:
        return [c.encode() for c in ids]
    except (AttributeError, TypeError, UnicodeEncodeError):
        pass
    out = []
    for pos, c in enumerate(ids):
        if isinstance(c, str):
            out.append(c.encode("utf-8", "surrogatepass"))
        elif isinstance(c, (bytes, bytearray, memoryview)):
            out.append(bytes(c))
        else:
            raise TypeError(
                f"chunk ids must be str or bytes; chunk_ids[{pos}] is "
                f"{type(c).__name__} {c!r}"
            )
    return out


def _torus_l1(x: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Periodic L1 distances of rows ``x`` (m, D) to ``points`` (P, D), bit for bit the
    tree's: the float operations of ``cKDTree(boxsize=1.0)``, in its order."""
    total = None
    for i in range(x.shape[1]):
        d = x[:, i, None] - points[None, :, i]
        d = np.where(d < -0.5, 1.0 + d, np.where(d > 0.5, d - 1.0, d))
        np.abs(d, out=d)
        total = d if total is None else total + d
    return total


def _check_int(name: str, value, minimum: int, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(
            f"{name}={value!r} is not allowed: {name} must be an integer >= {minimum}{hint}"
        )
    return int(value)


def _check_k(k) -> int:
    return _check_int("k", k, 1, " (the number of nodes to rank)")


class TorusPlacement:
    """Deterministic, weighted, optionally load-bounded placement of chunks on nodes.

    A node of weight ``w`` has ``max(1, round(replicas * w))`` replica points on the torus of
    ``dimensions`` D >= 1 (1 is a consistent-hash ring); a chunk goes to the node of the nearest
    one. Changing ``seed`` reshuffles everything. ``balance`` (None or > 1) caps every node at
    ``ceil(balance * C * w_n / W)`` chunks of an :meth:`assign` batch of ``C`` distinct chunks
    (``W``: total weight). A concurrent :meth:`assign` sees the old or the new node set of
    :meth:`set_nodes`, never a mixture; callers serialise :meth:`set_nodes`. Raises only for
    invalid arguments (``ValueError``/``TypeError`` naming the value) and for placing chunks
    with no nodes.

    >>> p = TorusPlacement(dimensions=4, replicas=32)
    >>> p.set_nodes({"node-a": 1, "node-b": 2, "node-c": 1})
    >>> p.assign(["file-1/Events/0-100000", "file-1/Events/100000-200000"])
    ['node-b', 'node-c']
    >>> p.ranking("file-1/Events/0-100000", 3)
    ['node-b', 'node-c', 'node-a']
    """

    _dimensions: int
    _replicas: int
    _seed: int
    _balance: float | None
    _seeds: list[int]
    #: Replica points already computed, per current node: rows j = 0, 1, ...
    _cache: dict[str, np.ndarray]
    #: Current node set (replaced as a whole by set_nodes).
    _state: _Nodes

    def __init__(
        self,
        dimensions: int = 3,
        replicas: int = 32,
        seed: int = 0,
        balance: float | None = None,
    ):
        self._dimensions = _check_int(
            "dimensions", dimensions, 1, ", e.g. TorusPlacement(dimensions=4)"
        )
        self._replicas = _check_int(
            "replicas", replicas, 1, " (points per unit of node weight), e.g. replicas=32"
        )
        self._seed = _check_int("seed", seed, 0, ", e.g. seed=0")
        if balance is not None:
            if (
                isinstance(balance, bool)
                or not isinstance(balance, numbers.Real)
                or not math.isfinite(balance)
                or balance <= 1
            ):
                raise ValueError(
                    f"balance={balance!r} is not allowed: use a finite number > 1 "
                    f"(e.g. balance=1.25: at most 25% above a node's fair share) or "
                    f"balance=None (no cap)"
                )
            balance = float(balance)
        self._balance = balance
        self._seeds = _dimension_seeds(self._seed, self._dimensions)
        self._cache = {}
        self._state = _EMPTY

    def __repr__(self) -> str:
        return (
            f"TorusPlacement(dimensions={self._dimensions}, replicas={self._replicas}, "
            f"seed={self._seed}, balance={self._balance}) with {len(self._state.names)} nodes"
        )

    @property
    def dimensions(self) -> int:
        """Dimension D of the torus."""
        return self._dimensions

    @property
    def replicas(self) -> int:
        """Replica points per unit of node weight."""
        return self._replicas

    @property
    def seed(self) -> int:
        """Seed of the per-dimension hashes."""
        return self._seed

    @property
    def balance(self) -> float | None:
        """Bounded-load factor (> 1), or None for pure nearest-node placement."""
        return self._balance

    @property
    def nodes(self) -> dict[str, float]:
        """Current nodes and their weights (a copy; change them with :meth:`set_nodes`)."""
        return dict(self._state.weights)

    def set_nodes(self, weights: Mapping[str, float]) -> None:
        """Replace the cache nodes by ``weights``: node id -> finite weight > 0 (e.g. threads).

        An empty mapping is allowed (:meth:`assign` raises until nodes are set again). Only
        new replica points are hashed. Raises ``TypeError`` for a non-mapping or a non-str
        id, ``ValueError`` for a bad weight or more than 20 million replica points in all.
        """
        if not isinstance(weights, Mapping):
            raise TypeError(
                f"set_nodes() takes a mapping {{node_id: weight}}, got "
                f"{type(weights).__name__}; e.g. set_nodes({{'node-a': 1.0}})"
            )
        clean: dict[str, float] = {}
        for node, w in weights.items():
            if not isinstance(node, str):
                raise TypeError(
                    f"node ids must be str, got {type(node).__name__} {node!r}"
                )
            if isinstance(w, bool) or not isinstance(w, numbers.Real):
                raise ValueError(
                    f"weight of node {node!r} is {w!r}: weights must be finite numbers > 0"
                )
            w = float(w)
            if not math.isfinite(w) or w <= 0:
                raise ValueError(
                    f"weight of node {node!r} is {w!r}: weights must be finite numbers > 0"
                )
            clean[node] = w
        if clean == self._state.weights:
            return

        names = tuple(sorted(clean))
        counts = np.array(
            [max(1, round(self._replicas * clean[n])) for n in names], dtype=np.int64
        )
        if counts.sum() > _MAX_POINTS:
            heaviest = max(clean, key=clean.__getitem__)
            raise ValueError(
                f"set_nodes() would create {int(counts.sum()):,} replica points "
                f"(replicas={self._replicas} x total weight {math.fsum(clean.values()):g}; "
                f"node {heaviest!r} has weight {clean[heaviest]:g}), more than "
                f"{_MAX_POINTS:,}: weights are relative (e.g. threads per node), "
                f"scale them down"
            )
        cache = {n: self._cache[n] for n in names if n in self._cache}
        for n, c in zip(names, counts):
            have = cache.get(n)
            m = 0 if have is None else len(have)
            if m < c:
                new = _points(
                    [f"{n}\x00{j}".encode("utf-8", "surrogatepass") for j in range(m, c)],
                    self._seeds,
                )
                cache[n] = new if have is None else np.concatenate([have, new])
        if names:
            points = np.concatenate([cache[n][:c] for n, c in zip(names, counts)])
        else:
            points = np.empty((0, self._dimensions))
        starts = np.zeros(len(names), dtype=np.int64)
        np.cumsum(counts[:-1], out=starts[1:])
        state = _Nodes(
            names=names,
            names_arr=np.array(names, dtype=object),
            weights=clean,
            counts=counts,
            points=points,
            point_node=np.repeat(np.arange(len(names), dtype=np.int64), counts),
            starts=starts,
        )
        self._cache = cache
        self._state = state

    def capacities(self, n_chunks: int) -> dict[str, int]:
        """Cap of every node for a batch of ``n_chunks`` distinct chunks:
        ``ceil(balance * n_chunks * w_n / W)`` (float arithmetic, in that order), or ``n_chunks``."""
        st = self._nodes_or_raise()
        caps = self._caps(st, int(n_chunks))
        return dict(zip(st.names, caps.tolist()))

    def assign(self, chunk_ids: Iterable[str | bytes]) -> list[str]:
        """Node id of every chunk of one batch (e.g. one submitted graph), in input order.

        Without ``balance``: the node of the nearest replica point as the k-d tree reports it
        (an exact tie of two nodes, ~1e-15 per chunk, may differ from ``ranking()[0]``). With
        ``balance``: duplicates are one chunk; chunks in order of increasing distance to their
        nearest node (ties: by coordinates, then id) each take the first node of their
        :meth:`ranking` with room, computed in vectorised rounds of deferred acceptance whose
        unique stable outcome is that serial result (independent of the input order).
        """
        bs = _as_bytes(chunk_ids, "assign(chunk_ids)")
        st = self._nodes_or_raise()
        if not bs:
            return []
        if self._balance is not None:
            return self._assign_balanced(st, bs)
        return st.names_arr[self._nearest_nodes(st, bs)].tolist()

    def layout(self) -> _Nodes:
        """The node set: an immutable snapshot replaced by :meth:`set_nodes` (``is`` tells a change).

        :rtype: ``_Nodes`` (names, weights, replica points; its tree is built on first use)
        """
        return self._state

    def coordinates(self, chunk_ids: Iterable[str | bytes]) -> np.ndarray:
        """Points of chunks on the torus, shape ``(n, dimensions)`` (for plots)."""
        return _points(_as_bytes(chunk_ids, "coordinates(chunk_ids)"), self._seeds)

    def nearest_points(self, x: np.ndarray, layout: _Nodes | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(distance, point index)`` of the nearest replica point of every row of ``x``
        (points from :meth:`coordinates`) in ``layout`` (default: the current one):
        the tree query :meth:`assign` and :meth:`nearest` make, for callers that keep
        chunk points (the scheduler's index of pending chunk tasks).

        :type x: numpy.ndarray
        :type layout: a snapshot from :meth:`layout`, or None
        :rtype: tuple[numpy.ndarray, numpy.ndarray]
        """
        st = self._nodes_or_raise() if layout is None else layout
        if len(x) <= _SMALL_BATCH:
            d, i = st.tree.query(x, k=1, p=1)
            return np.atleast_1d(d), np.atleast_1d(i)
        d, i = self._query(st, x, 1)
        return d[:, 0], i[:, 0]

    def nearest(self, chunk_ids: Iterable[str | bytes]) -> list[str]:
        """Node of the nearest replica point of every chunk (its *home*): :meth:`assign`
        without bounded loads, in input order."""
        bs = _as_bytes(chunk_ids, "nearest(chunk_ids)")
        st = self._nodes_or_raise()
        if not bs:
            return []
        return st.names_arr[self._nearest_nodes(st, bs)].tolist()

    def ranking(self, chunk_id: str | bytes, k: int) -> list[str]:
        """The ``k >= 1`` nearest distinct nodes of one chunk (all if fewer), nearest first.

        Ordered by (distance of the node's nearest replica point, node id), ties included;
        ``balance`` is ignored: this is the preference list and the spill order of bounded loads.
        """
        if not isinstance(chunk_id, (str, bytes, bytearray, memoryview)):
            raise TypeError(
                f"chunk ids must be str or bytes, got {type(chunk_id).__name__} {chunk_id!r}"
            )
        return self.rankings([chunk_id], k)[0]

    def rankings(self, chunk_ids: Iterable[str | bytes], k: int) -> list[list[str]]:
        """:meth:`ranking` of every chunk of a batch, in input order."""
        k = _check_k(k)
        bs = _as_bytes(chunk_ids, "rankings(chunk_ids, k)")
        st = self._nodes_or_raise()
        if not bs:
            return []
        node_idx, _ = self._rank(st, _points(bs, self._seeds), k)
        return st.names_arr[node_idx].tolist()

    def _nodes_or_raise(self) -> _Nodes:
        st = self._state
        if not st.names:
            raise ValueError(
                "no cache nodes: call set_nodes({'node-id': weight, ...}) first"
            )
        return st

    def _caps(self, st: _Nodes, n_chunks: int) -> np.ndarray:
        if self._balance is None:
            return np.full(len(st.names), n_chunks, dtype=np.int64)
        total = math.fsum(st.weights.values())
        return np.array(
            [math.ceil(self._balance * n_chunks * st.weights[n] / total) for n in st.names],
            dtype=np.int64,
        )

    @staticmethod
    def _grid_order(x: np.ndarray) -> np.ndarray:
        """Permutation sorting points by grid cell (16-bit key; numpy's stable sort of it is a radix sort)."""
        d = x.shape[1]
        bits = max(1, 16 // d)
        key = np.zeros(len(x), dtype=np.uint16)
        for i in range(min(d, 16 // bits)):
            key <<= np.uint16(bits)
            key |= (x[:, i] * (1 << bits)).astype(np.uint16)
        return np.argsort(key, kind="stable")

    def _query(self, st: _Nodes, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Tree query of the ``k`` nearest points, 2-d results, in the order of ``x``."""
        if len(x) < _LARGE_BATCH:
            d, i = st.tree.query(x, k=k, p=1)
        else:
            order = self._grid_order(x)
            ds, is_ = st.tree.query(x[order], k=k, p=1, workers=-1)
            d, i = np.empty_like(ds), np.empty_like(is_)
            d[order], i[order] = ds, is_
        if k == 1:
            d, i = d[:, None], i[:, None]
        return d, i

    def _nearest_nodes(self, st: _Nodes, bs: list[bytes]) -> np.ndarray:
        """Node index of the nearest replica point of every chunk."""
        x = _points(bs, self._seeds)
        if len(bs) <= _SMALL_BATCH:
            return st.point_node[st.tree.query(x, k=1, p=1)[1]]
        return st.point_node[self._query(st, x, 1)[1][:, 0]]

    def _rank(self, st: _Nodes, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact rankings ``(node index, distance)``, each ``(m, min(k, n))``: the tree is asked for
        more points until a row has ``k`` nodes and no unseen point can tie the k-th."""
        n, total = len(st.names), len(st.points)
        k = min(k, n)
        m = len(x)
        out_n = np.empty((m, k), dtype=np.int64)
        out_d = np.empty((m, k), dtype=np.float64)
        if m <= _SMALL_BATCH:
            self._rank_rows(st, x, k, out_n, out_d)
            return out_n, out_d
        todo = np.arange(m)
        kq = min(total, k + 1)
        while todo.size and kq <= max(_BRUTE_FORCE_MIN, _BRUTE_FORCE_FRACTION * total):
            d, i = self._query(st, x[todo], kq)
            nodes = st.point_node[i]
            # first occurrence of each node in a row = its nearest point
            o = np.argsort(nodes, axis=1, kind="stable")
            sn = np.take_along_axis(nodes, o, axis=1)
            fs = np.ones_like(sn, dtype=bool)
            fs[:, 1:] = sn[:, 1:] != sn[:, :-1]
            first = np.empty_like(fs)
            np.put_along_axis(first, o, fs, axis=1)
            dm = np.where(first, d, np.inf)
            o = np.lexsort((nodes, dm), axis=-1)[:, :k]
            rn = np.take_along_axis(nodes, o, axis=1)
            rd = np.take_along_axis(dm, o, axis=1)
            if kq == total:  # every point seen
                ok = np.ones(len(todo), dtype=bool)
            else:  # k nodes, and no unseen point can be as near as the k-th one
                ok = (first.sum(axis=1) >= k) & (rd[:, -1] < d[:, -1])
            done = todo[ok]
            out_n[done], out_d[done] = rn[ok], rd[ok]
            todo = todo[~ok]
            if kq == total:
                break
            kq = min(total, kq * 4)
        if todo.size:
            self._rank_brute_force(st, x, k, todo, out_n, out_d)
        return out_n, out_d

    def _rank_rows(self, st, x, k, out_n, out_d) -> None:
        """:meth:`_rank` row by row in Python: less overhead for a few chunks."""
        total = len(st.points)
        for r in range(len(x)):
            kq = min(total, k + 1)
            while kq <= max(_BRUTE_FORCE_MIN, _BRUTE_FORCE_FRACTION * total):
                d, i = st.tree.query(x[r], k=kq, p=1)
                dl = np.atleast_1d(d).tolist()
                nearest: dict[int, float] = {}
                for node, dist in zip(st.point_node[np.atleast_1d(i)].tolist(), dl):
                    nearest.setdefault(node, dist)
                ranked = sorted(nearest.items(), key=lambda t: (t[1], t[0]))[:k]
                if kq == total or (len(ranked) == k and ranked[-1][1] < dl[-1]):
                    out_n[r] = [t[0] for t in ranked]
                    out_d[r] = [t[1] for t in ranked]
                    break
                kq = min(total, kq * 4)
            else:
                self._rank_brute_force(st, x, k, np.array([r]), out_n, out_d)

    @staticmethod
    def _rank_brute_force(st, x, k, rows, out_n, out_d) -> None:
        """Exact rankings from the distances to all points (for deep rankings)."""
        n, total = len(st.names), len(st.points)
        block = max(1, _BRUTE_FORCE_BLOCK // total)
        idx = np.arange(n)
        for s in range(0, len(rows), block):
            r = rows[s : s + block]
            dist = _torus_l1(x[r], st.points)
            per_node = np.minimum.reduceat(dist, st.starts, axis=1)  # (b, n)
            o = np.lexsort((np.broadcast_to(idx, per_node.shape), per_node), axis=-1)[:, :k]
            out_n[r] = o
            out_d[r] = np.take_along_axis(per_node, o, axis=1)

    def _assign_balanced(self, st: _Nodes, bs: list[bytes]) -> list[str]:
        # one entry per distinct chunk: a cache serves the same id from the same node
        uniq = list(dict.fromkeys(bs))
        if len(uniq) == 1:  # every cap is >= 1: the nearest node
            node = self._rank(st, _points(uniq, self._seeds), 1)[0][0, 0]
            return [st.names[node]] * len(bs)
        if len(uniq) == len(bs):
            inverse = None
        else:
            pos = {b: i for i, b in enumerate(uniq)}
            inverse = np.fromiter(map(pos.__getitem__, bs), dtype=np.int64, count=len(bs))
        c = len(uniq)
        x = _points(uniq, self._seeds)
        n = len(st.names)
        caps = self._caps(st, c)

        d0, i0 = self._query(st, x, 1)
        tab_n = st.point_node[i0]
        # priority: nearest-node distance, then coordinates (the digests), then id
        keys = [x[:, i] for i in range(self._dimensions - 1, -1, -1)] + [d0[:, 0]]
        order = np.lexsort(keys)
        xs = x[order]
        same = np.flatnonzero(np.all(xs[1:] == xs[:-1], axis=1))
        if same.size:  # different ids at identical points (a 53*D-bit collision): by id
            order = order.copy()
            for i in same[::-1]:  # merge runs from the back: a run i..j sorts as a block
                j = i + 1
                while j < len(xs) and np.array_equal(xs[j], xs[i]):
                    j += 1
                order[i:j] = sorted(order[i:j].tolist(), key=uniq.__getitem__)
        prio = np.empty(c, dtype=np.int64)
        prio[order] = np.arange(c)

        # level 0: nearest node; a chunk refused by all its nodes gets a deeper ranking
        tables = [tab_n]
        level = np.zeros(c, dtype=np.int64)
        row = np.arange(c)
        ptr = np.zeros(c, dtype=np.int64)
        assigned = np.full(c, n, dtype=np.int64)  # n = unassigned
        active = np.arange(c)
        while active.size:
            widths = np.array([t.shape[1] for t in tables])
            exhausted = active[ptr[active] >= widths[level[active]]]
            if exhausted.size:
                if widths[level[exhausted]].max() >= n:  # impossible: sum(caps) > C
                    raise RuntimeError("bounded loads: a chunk was refused by every node")
                width = min(n, int(widths[level[exhausted]].max()) * 4)
                level[exhausted] = len(tables)
                row[exhausted] = np.arange(len(exhausted))
                tables.append(self._rank(st, x[exhausted], width)[0])
            want = np.empty(active.size, dtype=np.int64)
            lv = level[active]
            for L in np.unique(lv):
                sel = lv == L
                a = active[sel]
                want[sel] = tables[L][row[a], ptr[a]]
            touched = np.zeros(n + 1, dtype=bool)
            touched[want] = True
            touched[n] = False
            holders = np.flatnonzero(touched[assigned])
            cand = np.concatenate([holders, active])
            cand_node = np.concatenate([assigned[holders], want])
            srt = np.argsort(cand_node * c + prio[cand], kind="stable")
            cand, cand_node = cand[srt], cand_node[srt]
            starts = np.flatnonzero(np.r_[True, cand_node[1:] != cand_node[:-1]])
            group_start = np.repeat(starts, np.diff(np.r_[starts, len(cand)]))
            keep = (np.arange(len(cand)) - group_start) < caps[cand_node]
            assigned[cand[keep]] = cand_node[keep]
            rejected = cand[~keep]
            assigned[rejected] = n
            ptr[rejected] += 1
            active = rejected
        if inverse is not None:
            assigned = assigned[inverse]
        return st.names_arr[assigned].tolist()
