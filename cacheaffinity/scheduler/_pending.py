"""Pending chunk tasks indexed by their nearest replica point (runs in the scheduler).

A join must find the chunk tasks that a new node now owns without looking at
every pending task. ``PendingIndex`` keeps each pending chunk task's point on
the torus, its nearest replica point (a stable id: node and replica number) and
the distance to it, and groups the tasks by that point (a *bucket*, the task's
Voronoi cell). When replica points are added (a node joins, or gains weight),
a task can only move to a new point ``a`` if its own point ``q`` lies within
``2 * R_q`` of ``a`` (``R_q``: an upper bound of the distance of ``q``'s tasks to
``q``; triangle inequality), so only the buckets near ``a`` are read. When points
are removed, only their buckets are re-homed. The result is the tree's answer
for every task, as a full query would give it (``tests/unit/test_pending_index.py``).

Memory: per pending task its point, distance and point id (numpy, ~48 bytes),
its slot in a dict and a set; per replica point holding tasks a set and a float.
Event-loop only (no locking); a relayout runs as a generator of slices.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator, Sequence
from itertools import repeat
from typing import TYPE_CHECKING

import numpy as np
from scipy.spatial import cKDTree

if TYPE_CHECKING:
    from cacheaffinity.placement import TorusPlacement

__all__ = ["PendingIndex", "SLICE"]

#: Replica points examined (added or removed) per slice of a relayout.
SLICE = 512
# A point id is node id << _J_BITS | replica number.
_J_BITS = 32
_NONE = -1
# Distances within this of a bound count as reaching it (float rounding).
_EPS = 1e-9


def _row_l1(x: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Periodic L1 distance of row k of ``x`` to row k of ``p``, with the float
    operations (and order) of ``cKDTree(boxsize=1.0)`` and ``placement._torus_l1``."""
    total = None
    for i in range(x.shape[1]):
        d = x[:, i] - p[:, i]
        d = np.where(d < -0.5, 1.0 + d, np.where(d > 0.5, d - 1.0, d))
        np.abs(d, out=d)
        total = d if total is None else total + d
    return total


class PendingIndex:
    """Pending chunk tasks by nearest replica point of ``placement``'s layout."""

    #: How added points find their tasks: ``"points"`` (buckets near each added
    #: point), ``"tasks"`` (every task asks the added points' tree: bursts) or None
    #: (whichever reads fewer entries).
    side: str | None = None

    def __init__(self, placement: TorusPlacement):
        self.placement = placement
        dim = placement.dimensions
        self._x = np.empty((0, dim), dtype=np.float64)
        self._d = np.empty(0, dtype=np.float64)
        self._pid = np.empty(0, dtype=np.int64)
        self._keys: list = []
        self.slot: dict[Hashable, int] = {}
        self._free: list[int] = []
        self._hold_free = 0  # > 0 while a relayout runs: freed slots are not reused
        self._held: list[int] = []
        # point id -> slots whose nearest point it is; -> bound of their distance
        self._bucket: dict[int, set[int]] = {}
        self._radius: dict[int, float] = {}
        self._rmax = 0.0
        # slots without a nearest point (no node yet)
        self._unhomed: set[int] = set()
        # node ids for point ids (bounded by the nodes seen while tasks were indexed)
        self._sid: dict[str, int] = {}
        self._sid_name: dict[int, str] = {}
        self._next_sid = 0
        self._layout = None  # the layout the homes refer to
        self._layout_sids = np.empty(0, dtype=np.int64)
        # the latest layout with a built tree and its node ids (at that time): a join
        # looks for buckets near its points in that tree and in a small tree of the
        # points added since (``_sources``), so it builds no tree of every point
        self._base = None
        self._base_sids = np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.slot)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.slot

    # ---- point ids -------------------------------------------------------------
    def _sid_of(self, name: str) -> int:
        sid = self._sid.get(name)
        if sid is None:
            self._next_sid += 1
            sid = self._sid[name] = self._next_sid
            self._sid_name[sid] = name
        return sid

    def _sids(self, layout) -> np.ndarray:
        if layout is self._layout:
            return self._layout_sids
        return np.array([self._sid_of(n) for n in layout.names], dtype=np.int64)

    def _pids(self, layout, sids: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """Point ids of point indices ``idx`` of ``layout``."""
        node = layout.point_node[idx]
        return (sids[node] << _J_BITS) | (idx - layout.starts[node])

    def node_of_pid(self, pid: int) -> str | None:
        return None if pid < 0 else self._sid_name.get(pid >> _J_BITS)

    def home(self, key: Hashable) -> str | None:
        """The node of the nearest replica point of pending task ``key`` (None: unknown)."""
        s = self.slot.get(key)
        if s is None:
            return None
        return self.node_of_pid(int(self._pid[s]))

    # ---- slots -----------------------------------------------------------------
    def _grow(self, n: int) -> None:
        cap = len(self._d)
        need = len(self._keys) + n
        if need <= cap:
            return
        new = max(need, cap * 2, 1024)
        x = np.empty((new, self._x.shape[1]), dtype=np.float64)
        x[:cap] = self._x
        d = np.full(new, np.inf)
        d[:cap] = self._d
        pid = np.full(new, _NONE, dtype=np.int64)
        pid[:cap] = self._pid
        self._x, self._d, self._pid = x, d, pid

    def _alloc(self, n: int) -> np.ndarray:
        free = self._free
        take = min(n, len(free))
        slots = free[len(free) - take:]
        del free[len(free) - take:]
        rest = n - take
        if rest:
            self._grow(rest)
            start = len(self._keys)
            self._keys.extend([None] * rest)
            slots.extend(range(start, start + rest))
        return np.array(slots, dtype=np.int64)

    def _put(self, slot: int, pid: int, d: float) -> None:
        if pid < 0:
            self._unhomed.add(slot)
            return
        b = self._bucket.get(pid)
        if b is None:
            b = self._bucket[pid] = set()
        b.add(slot)
        if d > self._radius.get(pid, -1.0):
            self._radius[pid] = d
            if d > self._rmax:
                self._rmax = d

    def _take(self, slot: int) -> None:
        pid = int(self._pid[slot])
        if pid < 0:
            self._unhomed.discard(slot)
            return
        b = self._bucket.get(pid)
        if b is not None:
            b.discard(slot)
            if not b:
                del self._bucket[pid]
                del self._radius[pid]

    def add(self, keys: Sequence[Hashable], x: np.ndarray, d=None, idx=None) -> None:
        """Index pending tasks ``keys`` at points ``x``; ``d``, ``idx``: their nearest
        distance and point index in the current layout (None: queried here)."""
        if not len(keys):
            return
        if self.slot and not self.slot.keys().isdisjoint(keys):
            for k in keys:
                if k in self.slot:
                    self.discard(k)
        layout = self.placement.layout()
        self._sync_layout(layout)
        if d is None:
            if layout.names:
                d, idx = self.placement.nearest_points(x, layout)
            else:
                d = np.full(len(keys), np.inf)
        slots = self._alloc(len(keys))
        self._x[slots] = x
        d = np.asarray(d, dtype=np.float64)
        self._d[slots] = d
        if idx is not None and layout.names:
            pids = self._pids(layout, self._sids(layout), np.asarray(idx))
        else:
            pids = np.full(len(keys), _NONE, dtype=np.int64)
        self._pid[slots] = pids
        slot_list = slots.tolist()
        self.slot.update(zip(keys, slot_list))
        names = self._keys
        lo = slot_list[0]
        if slot_list[-1] - lo == len(slot_list) - 1 and slot_list == list(range(lo, lo + len(slot_list))):
            names[lo:lo + len(slot_list)] = keys
        else:
            for k, s in zip(keys, slot_list):
                names[s] = k
        homed = pids >= 0
        if not homed.all():
            self._unhomed.update(slots[~homed].tolist())
            slots, pids, d = slots[homed], pids[homed], d[homed]
        if not len(slots):
            return
        order = np.argsort(pids, kind="stable")
        ps, ss, ds = pids[order], slots[order], d[order]
        first = np.flatnonzero(np.r_[True, ps[1:] != ps[:-1]])  # ps is sorted
        uniq = ps[first]
        rmax = np.maximum.reduceat(ds, first)
        bounds = first.tolist()[1:] + [len(ps)]
        sl = ss.tolist()
        bucket, radius = self._bucket, self._radius
        ul, rl = uniq.tolist(), rmax.tolist()
        if bucket.keys().isdisjoint(ul):  # new buckets only (a first graph): no loop
            lows = [0] + bounds[:-1]
            bucket.update(zip(ul, map(set, map(sl.__getitem__, map(slice, lows, bounds)))))
            radius.update(zip(ul, rl))
            ul = rl = bounds = ()
        lo = 0
        for p, hi, r in zip(ul, bounds, rl):
            b = bucket.get(p)
            if b is None:
                bucket[p] = set(sl[lo:hi])
                radius[p] = r
            else:
                b.update(sl[lo:hi])
                if r > radius[p]:
                    radius[p] = r
            lo = hi
        top = float(rmax.max())
        if top > self._rmax:
            self._rmax = top

    def add_chunks(self, keys: Sequence[Hashable], chunks: Sequence[str]) -> None:
        """Index pending tasks ``keys`` of chunk ids ``chunks`` (hashed here)."""
        if keys:
            self.add(keys, self.placement.coordinates(list(chunks)))

    def discard(self, key: Hashable) -> None:
        """Task ``key`` is no longer pending."""
        s = self.slot.pop(key, None)
        if s is None:
            return
        self._take(s)
        self._keys[s] = None
        self._pid[s] = _NONE
        self._d[s] = np.inf
        (self._held if self._hold_free else self._free).append(s)
        if not self.slot and not self._hold_free:
            self._release()

    def _release(self) -> None:
        """No task is pending: give the slots back (memory follows what is pending now,
        not the largest graph seen since the scheduler started)."""
        dim = self._x.shape[1]
        self._x = np.empty((0, dim), dtype=np.float64)
        self._d = np.empty(0, dtype=np.float64)
        self._pid = np.empty(0, dtype=np.int64)
        self._keys, self._free, self._held = [], [], []
        self._bucket.clear()
        self._radius.clear()
        self._unhomed.clear()
        self._rmax = 0.0

    # ---- relayout --------------------------------------------------------------
    def _sync_layout(self, layout) -> None:
        """Make ``layout`` current when no task is indexed (nothing to re-home)."""
        if layout is not self._layout and not self.slot:
            sids = self._sids(layout)
            self._layout, self._layout_sids = layout, sids

    def relayout(self) -> set[Hashable]:
        """:meth:`relayout_steps` in one piece."""
        gen = self.relayout_steps()
        while True:
            try:
                next(gen)
            except StopIteration as stop:
                return stop.value

    def relayout_steps(self) -> Iterator[None]:
        """Bring every home up to the placement's current layout, yielding between
        slices; returns (StopIteration value) the keys whose home node changed."""
        layout = self.placement.layout()
        old = self._layout
        changed: set[Hashable] = set()
        if layout is old:
            return changed
        self._hold_free += 1
        try:
            sids = self._sids(layout)
            old_counts = {}
            if old is not None:
                old_counts = dict(zip(old.names, old.counts.tolist()))
            new_counts = dict(zip(layout.names, layout.counts.tolist()))
            removed: list[int] = []
            for name, c in old_counts.items():
                n = new_counts.get(name, 0)
                if n < c:
                    sid = self._sid[name] << _J_BITS
                    removed.extend(sid | j for j in range(n, c))
            added_idx: list[int] = []
            name_pos = {n: i for i, n in enumerate(layout.names)}
            for name, n in new_counts.items():
                c = old_counts.get(name, 0)
                if n > c:
                    start = int(layout.starts[name_pos[name]])
                    added_idx.extend(range(start + c, start + n))
            if old is not None and old.built:
                self._base, self._base_sids = old, self._layout_sids
            self._layout = layout
            self._layout_sids = sids
            # tasks of removed points, and tasks without a home: query the tree
            rehome: list[int] = [] if not layout.names else sorted(self._unhomed)
            for pid in removed:
                b = self._bucket.pop(pid, None)
                self._radius.pop(pid, None)
                if b:
                    rehome.extend(b)
            if not layout.names:  # no node: every task loses its home
                for b in self._bucket.values():
                    rehome.extend(b)
                self._bucket.clear()
                self._radius.clear()
                for s in rehome:
                    k = self._keys[s]
                    if k is not None:
                        changed.add(k)
                        self._pid[s] = _NONE
                        self._d[s] = np.inf
                        self._unhomed.add(s)
                return changed
            for i in range(0, len(rehome), SLICE * 16):
                part = np.array(rehome[i:i + SLICE * 16], dtype=np.int64)
                self._rehome(layout, sids, part, changed)
                yield
            if added_idx and self._bucket:
                added = np.array(added_idx, dtype=np.int64)
                # ~points a ball of radius 2 * rmax holds around an added point
                dim = layout.points.shape[1]
                ball = len(layout.points) * (4 * self._rmax) ** dim / math.factorial(dim)
                side = self.side or (
                    "points" if len(added) * max(ball, 1.0) <= len(self._bucket) else "tasks"
                )
                if side == "points":
                    src = self._sources(layout, sids)
                    for i in range(0, len(added), SLICE):
                        self._attract(layout, sids, added[i:i + SLICE], changed, src)
                        yield
                else:  # many added points (a burst): every task asks the added points' tree
                    a_tree = cKDTree(layout.points[added], boxsize=1.0)
                    # homed live slots, ascending (a discarded slot has no point id);
                    # not sorted(self.slot.values()) nor a grid order of them all:
                    # ~0.3 s at 10^6 in one slice; each slice is grid-ordered instead
                    live = np.flatnonzero(self._pid[: len(self._keys)] >= 0)
                    yield
                    step = SLICE * 64
                    for i in range(0, len(live), step):
                        self._attract_slots(layout, sids, added, a_tree, live[i:i + step], changed)
                        yield
            self._prune_sids(layout)
        finally:
            self._hold_free -= 1
            if not self._hold_free and self._held:
                self._free.extend(self._held)
                self._held.clear()
        return changed

    def _prune_sids(self, layout) -> None:
        """Forget node ids of nodes gone from the layout (no home refers to them)."""
        if len(self._sid) > 2 * len(layout.names) + 64:
            live = set(layout.names)
            for name in [n for n in self._sid if n not in live]:
                self._sid_name.pop(self._sid.pop(name), None)

    def _rehome(self, layout, sids, slots: np.ndarray, changed: set) -> None:
        """Query the tree for ``slots`` (live ones) and file them under their homes."""
        slots = slots[[self._keys[s] is not None for s in slots.tolist()]]
        if not len(slots):
            return
        d, idx = self.placement.nearest_points(self._x[slots], layout)
        pids = self._pids(layout, sids, idx)
        self._move(slots, pids, d, changed)

    def _move(self, slots: np.ndarray, pids: np.ndarray, d: np.ndarray, changed: set) -> None:
        """File live slots ``slots`` (distinct) under point ids ``pids`` at distances
        ``d``; the keys whose home node changed go to ``changed``. ``_take`` and
        ``_put`` inline, the arrays written at once (a burst moves ~10^5 tasks)."""
        keys = self._keys
        sl = slots.tolist()
        alive = [keys[s] is not None for s in sl]
        if not all(alive):
            keep = np.array(alive, dtype=bool)
            slots, pids, d = slots[keep], pids[keep], d[keep]
            sl = slots.tolist()
        if not sl:
            return
        olds = self._pid[slots].tolist()
        self._pid[slots] = pids
        self._d[slots] = d
        bucket, radius, unhomed = self._bucket, self._radius, self._unhomed
        rmax = self._rmax
        for s, old, p, dd in zip(sl, olds, pids.tolist(), d.tolist()):
            if old < 0:
                unhomed.discard(s)
            else:
                b = bucket.get(old)
                if b is not None:
                    b.discard(s)
                    if not b:
                        del bucket[old]
                        del radius[old]
            if p < 0:
                unhomed.add(s)
            else:
                b = bucket.get(p)
                if b is None:
                    b = bucket[p] = set()
                b.add(s)
                if dd > radius.get(p, -1.0):
                    radius[p] = dd
                    if dd > rmax:
                        rmax = dd
            if old < 0 or (old >> _J_BITS) != (p >> _J_BITS):
                changed.add(keys[s])
        self._rmax = rmax

    def _sources(self, layout, sids) -> tuple:
        """Where the buckets near added points are looked for: ``(base, base_sids,
        extra, extra_tree)``, the latest layout with a built tree and ``layout``'s point
        indices ``extra`` not among its points (added since, or of a node whose id
        changed) with their own small tree; ``layout`` itself once its tree is built or
        the points added since exceed an eighth of all."""
        base = self._base
        if layout.built or base is None:
            return layout, sids, None, None
        bsid = dict(zip(base.names, self._base_sids.tolist()))
        bcount = dict(zip(base.names, base.counts.tolist()))
        extra: list[int] = []
        for name, sid, c, start in zip(
            layout.names, sids.tolist(), layout.counts.tolist(), layout.starts.tolist()
        ):
            cb = bcount.get(name, 0) if bsid.get(name) == sid else 0
            if c > cb:
                extra.extend(range(start + cb, start + c))
        if len(extra) * 8 > len(layout.points):
            return layout, sids, None, None
        if not extra:
            return base, self._base_sids, None, None
        ex = np.array(extra, dtype=np.int64)
        return base, self._base_sids, ex, cKDTree(layout.points[ex], boxsize=1.0)

    def _attract(self, layout, sids, added: np.ndarray, changed: set, src: tuple | None = None) -> None:
        """Tasks that the added points ``added`` (point indices) are now nearest to:
        around each added point ``a``, the buckets ``q`` with ``|q - a| <= 2 R_q``
        (looked for in ``src``: see ``_sources``; None: ``layout``'s tree)."""
        pts = layout.points
        a_pts = pts[added]
        base, base_sids, extra, extra_tree = src if src is not None else (layout, sids, None, None)
        r = 2 * self._rmax + _EPS
        near = base.tree.query_ball_point(a_pts, r, p=1)
        lens = np.fromiter(map(len, near), dtype=np.int64, count=len(near))
        qq_arr = np.fromiter((q for lst in near for q in lst), dtype=np.int64, count=int(lens.sum()))
        qa_arr = np.repeat(np.arange(len(near)), lens)
        qpid = self._pids(base, base_sids, qq_arr)
        q_pts = base.points[qq_arr]
        if extra_tree is not None:
            near = extra_tree.query_ball_point(a_pts, r, p=1)
            lens = np.fromiter(map(len, near), dtype=np.int64, count=len(near))
            qq2 = extra[np.fromiter((q for lst in near for q in lst), dtype=np.int64, count=int(lens.sum()))]
            qa_arr = np.concatenate([qa_arr, np.repeat(np.arange(len(near)), lens)])
            qpid = np.concatenate([qpid, self._pids(layout, sids, qq2)])
            q_pts = np.concatenate([q_pts, pts[qq2]])
        if not len(qpid):
            return
        dq = _row_l1(q_pts, a_pts[qa_arr])
        bucket, radius = self._bucket, self._radius
        ql = qpid.tolist()
        # buckets q with |q - a| <= 2 R_q (a point without tasks has no radius: -1)
        r = np.fromiter(map(radius.get, ql, repeat(-1.0, len(ql))), dtype=np.float64, count=len(ql))
        keep = np.flatnonzero((r >= 0) & ~(dq > 2 * r + _EPS))
        ps: list[int] = []
        pa: list[int] = []
        for a, q in zip(qa_arr[keep].tolist(), qpid[keep].tolist()):
            b = bucket[q]
            ps.extend(b)
            pa.extend([a] * len(b))
        self._improve(layout, sids, added, a_pts, ps, pa, changed)

    def _attract_slots(self, layout, sids, added: np.ndarray, a_tree, slots: np.ndarray, changed: set) -> None:
        """As :meth:`_attract` from the tasks' side (a burst of added points): each task
        of ``slots`` asks the tree of the added points for one nearer than its home."""
        slots = slots[self._pid[slots] >= 0]
        if not len(slots):
            return
        # by the distance to their home, in groups each bounded by its largest: a task
        # asks only for added points as near as its home (~30% less than rmax for all)
        dold = self._d[slots]
        order = np.argsort(dold, kind="stable")
        slots, dold = slots[order], dold[order]
        n = len(slots)
        dn = np.empty(n, dtype=np.float64)
        a = np.empty(n, dtype=np.intp)
        group = SLICE * 8  # 8 groups a slice
        for lo, hi in zip(range(0, n, group), [*range(group, n, group), n]):
            dn[lo:hi], a[lo:hi] = a_tree.query(
                self._x[slots[lo:hi]], k=1, p=1, distance_upper_bound=float(dold[hi - 1]) + _EPS
            )
        tie = dn == dold
        if tie.any():
            self._rehome(layout, sids, slots[tie], changed)
        better = dn < dold
        if better.any():
            s_arr = slots[better]
            self._move(s_arr, self._pids(layout, sids, added[a[better]]), dn[better], changed)

    def _improve(self, layout, sids, added, a_pts, ps: list[int], pa: list[int], changed: set) -> None:
        """Move slot ``ps[k]`` to added point ``pa[k]`` where that is nearer than its home."""
        if not ps:
            return
        s_arr = np.array(ps, dtype=np.int64)
        a_arr = np.array(pa, dtype=np.int64)
        dn = _row_l1(self._x[s_arr], a_pts[a_arr])
        dold = self._d[s_arr]
        tie = dn == dold
        better = dn < dold
        if tie.any():  # an exact tie: the tree decides, as a full query would
            self._rehome(layout, sids, np.unique(s_arr[tie]), changed)
        if not better.any():
            return
        s_arr, a_arr, dn = s_arr[better], a_arr[better], dn[better]
        # per slot the nearest added point (lowest distance, then lowest index)
        order = np.lexsort((a_arr, dn, s_arr))
        s_arr, a_arr, dn = s_arr[order], a_arr[order], dn[order]
        first = np.ones(len(s_arr), dtype=bool)
        first[1:] = s_arr[1:] != s_arr[:-1]
        s_arr, a_arr, dn = s_arr[first], a_arr[first], dn[first]
        # still better than the current home (a tie re-homed above may have moved it)
        keep = dn < self._d[s_arr]
        s_arr, a_arr, dn = s_arr[keep], a_arr[keep], dn[keep]
        # (two added points at exactly the same distance: the lower index, ~1e-15 per task)
        self._move(s_arr, self._pids(layout, sids, added[a_arr]), dn, changed)

    def check(self) -> list[Hashable]:
        """Keys whose home differs from a full tree query (empty: consistent)."""
        layout = self.placement.layout()
        if not self.slot or not layout.names:
            return []
        keys = list(self.slot)
        slots = np.array([self.slot[k] for k in keys], dtype=np.int64)
        d, idx = self.placement.nearest_points(self._x[slots], layout)
        want = self._pids(layout, self._sids(layout), idx) >> _J_BITS
        have = self._pid[slots] >> _J_BITS
        return [k for k, w, h in zip(keys, want.tolist(), have.tolist()) if w != h]
