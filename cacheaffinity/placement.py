"""Placement of chunks on cache nodes: nearest node on a periodic unit cube (torus).

This module defines :class:`TorusPlacement`. It is pure math: no dask import, no disk,
no network, no clock. The scheduler plugin runs it on every submitted graph and on every
membership change, but it runs anywhere (client, tests, benchmarks) and gives the same
answer everywhere, because the answer depends only on

    (chunk ids, node ids, node weights, dimensions, replicas, seed, balance)

and not on the order of the input, on worker addresses, on restarts, on the process or
on the machine.

Geometry
--------
Every chunk and every *replica* of a cache node gets a point in the periodic unit cube
[0, 1)^D. Coordinate ``i`` (``0 <= i < D``) of the identity ``b`` (a ``bytes`` string) is ::

    h_i = xxhash.xxh3_64_intdigest(b, seed=(seed * 1000003 + i) % 2**64)
    x_i = (h_i >> 11) * 2**-53

i.e. the top 53 bits of a 64-bit xxh3 digest with a per-dimension seed, which is exactly
representable as a float64 in [0, 1). A chunk id ``str`` is encoded as UTF-8 (so ``"a"``
and ``b"a"`` are the same chunk); replica ``j`` of node ``n`` has the identity
``f"{n}\\x00{j}".encode()`` (UTF-8; lone surrogates pass through, as in chunk ids).

A chunk belongs to the node of the replica point at the smallest periodic L1 (torus)
distance, ``sum_i min(|c_i - w_i|, 1 - |c_i - w_i|)``, found in batch with
``scipy.spatial.cKDTree(points, boxsize=1.0).query(chunks, p=1)``. A node of weight ``w``
has ``max(1, round(replicas * w))`` replicas, ``j = 0, 1, ...``; since a replica's point
depends only on (node id, j, seed, D), a node joining or leaving (or changing weight)
moves only chunks to or from that node: nothing moves between the other nodes.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from typing import NamedTuple

import numpy as np
import xxhash
from scipy.spatial import cKDTree

__all__ = ["TorusPlacement"]

#: Multiplier of the user seed in the per-dimension xxh3 seed (a prime).
_SEED_STRIDE = 1000003
_MASK64 = (1 << 64) - 1
#: Batches at least this large are sorted along a space-filling order before the tree
#: query (better cache locality) and queried on all cores (``workers=-1``).
_LARGE_BATCH = 10_000
#: When a ranking would need this fraction of all replica points from the tree, the
#: distances to all points are computed directly instead.
_BRUTE_FORCE_FRACTION = 0.125
#: ... but the tree is always used for up to this many points.
_BRUTE_FORCE_MIN = 256
#: Bound on the number of float64 distances held at once by the brute-force ranking.
_BRUTE_FORCE_BLOCK = 4_000_000
#: Upper bound of the replica points of all nodes (memory, tree build time).
_MAX_POINTS = 20_000_000
#: Rankings of at most this many chunks are computed row by row (less overhead).
_SMALL_BATCH = 16

_hash = xxhash.xxh3_64_intdigest


class _Nodes(NamedTuple):
    """Immutable snapshot of the node set; swapped in as one attribute."""

    names: tuple[str, ...]  # sorted node ids; index = lexicographic rank
    names_arr: np.ndarray  # the same as an object array (fast fancy indexing)
    weights: dict[str, float]
    counts: np.ndarray  # replicas per node (int64)
    tree: cKDTree | None
    points: np.ndarray  # (P, D) replica points, grouped by node in name order
    point_node: np.ndarray  # (P,) node index of every point
    starts: np.ndarray  # (n,) index of each node's first point


_EMPTY = _Nodes(
    names=(),
    names_arr=np.empty(0, dtype=object),
    weights={},
    counts=np.empty(0, dtype=np.int64),
    tree=None,
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
    """Periodic L1 distance of every row of ``x`` (m, D) to every point (P, D).

    Computed with the same floating-point operations, in the same order, as
    ``cKDTree(boxsize=1.0)`` (wrap the difference into [-1/2, 1/2], take the absolute
    value, add the dimensions left to right), so the values agree bit for bit with the
    tree's distances; mathematically it is ``sum_i min(|c_i - w_i|, 1 - |c_i - w_i|)``.
    """
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

    Chunks and node replicas are hashed to points of the periodic unit cube [0, 1)^D
    (see the module docstring for the exact derivation); a chunk goes to the node of
    the nearest replica point by periodic L1 distance. The ``cacheaffinity.scheduler``
    config section holds the scheduler's values of the four arguments.

    Parameters
    ----------
    dimensions : int, default 3
        Dimension D of the torus, >= 1. ``1`` is a classic consistent-hash ring
        (with L1 = arc distance); higher D evens out the load: max/mean load ~1.1 at
        100 nodes and 100 replicas for D = 3 and 4 alike, and D = 3 costs half of
        D = 4 (the k-d tree query grows fast with D), hence the default.
    replicas : int, default 32
        Points per unit of node weight, >= 1. A node of weight ``w`` gets
        ``max(1, round(replicas * w))`` points (Python's ``round``: halves to even).
    seed : int, default 0
        Seed of the per-dimension hashes, >= 0. Changing it reshuffles everything.
    balance : float or None, default None
        Bounded loads: ``None`` places every chunk on its nearest node. A number
        ``> 1`` caps every node, per :meth:`assign` batch of ``C`` distinct chunks,
        at ``ceil(balance * C * w_n / W)`` chunks (``W`` is the total weight); see
        :meth:`assign` for how overflow is spilled.

    Notes
    -----
    *Ties.* :meth:`ranking` and :meth:`rankings` order nodes by (distance of the
    node's nearest replica, node id as a ``str``), exactly, including ties.
    :meth:`assign` (and the first choice of a chunk under bounded loads) takes the node
    of the replica point the k-d tree reports as nearest; an exact tie between two
    nodes' points (distinct 53-bit random positions at bit-identical float distances,
    probability ~1e-15 per chunk) is then decided by the tree's traversal order: still
    a deterministic function of the node set, but it may differ from ``ranking()[0]``.

    *Cost.* Coordinates cost D xxh3 calls per chunk (Python level); the tree query is
    C++. Batches of at least 10 000 chunks are first sorted by grid cell (better memory
    locality) and queried on all CPU cores (scipy ``workers=-1``, the GIL is released);
    neither changes the result. About 2 µs per chunk at 1000 nodes x 100 replicas, 4
    dimensions, 2 cores (``benchmarks/placement.py``); bounded loads cost 2-3x that.
    :meth:`set_nodes` keeps the replica points of current nodes, so a membership change
    hashes only the new replicas and rebuilds the tree (~40 ms for 100 000 points).

    *Threads.* :meth:`set_nodes` builds the new state completely and then swaps it in
    with one attribute assignment, so a concurrent :meth:`assign` sees either the old
    or the new node set, never a mixture. Concurrent :meth:`set_nodes` calls must be
    serialised by the caller.

    *Failure.* Nothing here does I/O; the only exceptions are for invalid arguments
    (``ValueError``/``TypeError`` naming the value) and for placing chunks while there
    are no nodes.

    Examples
    --------
    >>> p = TorusPlacement(dimensions=4, replicas=32)
    >>> p.set_nodes({"node-a": 1, "node-b": 2, "node-c": 1})
    >>> p.assign(["file-1/Events/0-100000", "file-1/Events/100000-200000"])
    ['node-b', 'node-c']
    >>> p.ranking("file-1/Events/0-100000", 3)
    ['node-b', 'node-c', 'node-a']
    """

    #: Dimension D of the torus.
    _dimensions: int
    #: Replica points per unit of node weight.
    _replicas: int
    #: User seed of the per-dimension hash seeds.
    _seed: int
    #: Bounded-load factor, or None.
    _balance: float | None
    #: xxh3 seed of every dimension.
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

    # ------------------------------------------------------------------ properties
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

    # ------------------------------------------------------------------ membership
    def set_nodes(self, weights: Mapping[str, float]) -> None:
        """Replace the set of cache nodes.

        Parameters
        ----------
        weights : mapping of str to float
            Every cache node id and its weight (a finite number > 0, e.g. its total
            threads). Nodes not in the mapping are removed. An empty mapping is
            allowed (then :meth:`assign` raises until nodes are set again).

        Raises
        ------
        ValueError
            If a weight is not a finite number > 0 (the message names the node), or
            the weights would need more than 20 million replica points in total.
        TypeError
            If ``weights`` is not a mapping or a node id is not a ``str``.
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
            tree = cKDTree(points, boxsize=1.0, leafsize=16)
        else:
            points, tree = np.empty((0, self._dimensions)), None
        starts = np.zeros(len(names), dtype=np.int64)
        np.cumsum(counts[:-1], out=starts[1:])
        state = _Nodes(
            names=names,
            names_arr=np.array(names, dtype=object),
            weights=clean,
            counts=counts,
            tree=tree,
            points=points,
            point_node=np.repeat(np.arange(len(names), dtype=np.int64), counts),
            starts=starts,
        )
        self._cache = cache
        self._state = state

    def capacities(self, n_chunks: int) -> dict[str, int]:
        """Cap of every node for a batch of ``n_chunks`` distinct chunks.

        ``ceil(balance * n_chunks * w_n / W)`` (float arithmetic, in that order), or
        ``n_chunks`` for every node when ``balance`` is None.
        """
        st = self._nodes_or_raise()
        caps = self._caps(st, int(n_chunks))
        return dict(zip(st.names, caps.tolist()))

    # ------------------------------------------------------------------ queries
    def assign(self, chunk_ids: Iterable[str | bytes]) -> list[str]:
        """Node id of every chunk, in input order.

        Parameters
        ----------
        chunk_ids : iterable of str or bytes
            The chunks of one batch (e.g. one submitted graph).

        Returns
        -------
        list of str
            ``result[i]`` is the node of ``chunk_ids[i]``.

        Notes
        -----
        Without ``balance``: the node of the nearest replica point.

        With ``balance``: duplicates are one chunk (same node); with ``C`` distinct
        chunks, node ``n`` takes at most ``ceil(balance * C * w_n / W)``. Chunks are
        considered in order of increasing distance to their nearest node (ties: by
        coordinates, i.e. by hash digest, then by id), and each takes the first node of
        its :meth:`ranking` that still has room. This serial order is computed in
        vectorised rounds (deferred acceptance with one priority list shared by all
        nodes, whose unique stable outcome is exactly that serial result), so the
        result is independent of the order of ``chunk_ids``.
        """
        bs = _as_bytes(chunk_ids, "assign(chunk_ids)")
        st = self._nodes_or_raise()
        if not bs:
            return []
        if self._balance is not None:
            return self._assign_balanced(st, bs)
        return st.names_arr[self._nearest_nodes(st, bs)].tolist()

    def layout(self) -> _Nodes:
        """The current node set: an immutable snapshot (node names, weights,
        replica counts, replica ``points`` and their ``point_node``), replaced as
        a whole by :meth:`set_nodes`, so ``is`` tells whether it changed."""
        return self._state

    def coordinates(self, chunk_ids: Iterable[str | bytes]) -> np.ndarray:
        """Points of chunks on the torus, shape ``(n, dimensions)`` (for plots)."""
        return _points(_as_bytes(chunk_ids, "coordinates(chunk_ids)"), self._seeds)

    def nearest(self, chunk_ids: Iterable[str | bytes]) -> list[str]:
        """Node of the nearest replica point of every chunk (its *home*), in input order.

        ``balance`` is ignored: this is :meth:`assign` without bounded loads, the
        node a chunk goes back to when nodes join or leave.
        """
        bs = _as_bytes(chunk_ids, "nearest(chunk_ids)")
        st = self._nodes_or_raise()
        if not bs:
            return []
        return st.names_arr[self._nearest_nodes(st, bs)].tolist()

    def ranking(self, chunk_id: str | bytes, k: int) -> list[str]:
        """The ``k`` nearest distinct nodes of one chunk, nearest first.

        Parameters
        ----------
        chunk_id : str or bytes
        k : int
            Number of nodes, >= 1; all nodes if there are fewer than ``k``.

        Returns
        -------
        list of str
            Nodes ordered by (distance of their nearest replica point, node id).
            ``balance`` is ignored: this is the preference list, and the spill order
            of bounded loads.
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

    # ------------------------------------------------------------------ internals
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
        """Permutation sorting points by grid cell (row-major, 16-bit cell key), so that
        consecutive tree queries touch nearby tree nodes. A stable sort of 16-bit keys is
        a radix sort in numpy: O(m)."""
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
        """Exact rankings: ``(node index, distance)``, each ``(m, min(k, n))``.

        Nodes are ordered by (distance of their nearest point, node index); node
        indices are in lexicographic order of the ids, so this is the documented order.
        The tree is asked for more and more points until each row has ``k`` distinct
        nodes *and* every point at a distance <= the k-th node's distance has been seen
        (so ties at the boundary are decided by node id too); a row that would need a
        large fraction of all points gets distances to all points instead.
        """
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

        # first choice: the nearest point (one tree query; deeper rankings on demand)
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

        # rankings by level: level 0 is the nearest node of every chunk; a chunk that
        # runs out of nodes gets a deeper ranking (whose prefix is the same ranking)
        tables = [tab_n]
        level = np.zeros(c, dtype=np.int64)
        row = np.arange(c)
        ptr = np.zeros(c, dtype=np.int64)
        assigned = np.full(c, n, dtype=np.int64)  # n = unassigned
        active = np.arange(c)
        while active.size:
            # widen exhausted rankings
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
