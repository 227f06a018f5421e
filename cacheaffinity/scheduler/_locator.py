"""What the scheduler remembers of chunk tasks and chunks (runs in the scheduler).

``Locator`` keeps, per chunk task the scheduler has, its chunk id, entry range and
target node; per chunk id (at most ``locator-size``, oldest dropped first) the node
that processed it last, as a ``HolderRecord`` (a node, plus the entry ranges other
nodes processed since); per cache node its learned speed (``NodeSpeed``). From
these, ``follow_holders`` sends chunks to their holders within the damping bound,
and ``Locator.holder_of_task`` answers the stealing policy.

Event-loop only (no locking). Forgetting or confusing a chunk (ids are kept as
60-bit digests) costs at most a cache miss.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Mapping, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from cacheaffinity.chunk_id import parse_stripe

if TYPE_CHECKING:
    from distributed.scheduler import TaskState, WorkerState

    from cacheaffinity.placement import TorusPlacement
    from cacheaffinity.scheduler._membership import Membership

__all__ = [
    "MAX_RANGES",
    "HolderRecord",
    "Locator",
    "NodeSpeed",
    "chunk_digest",
    "follow_holders",
    "holder_for",
    "record_range",
    "stripe_parts",
]

#: The node that processed a chunk id (str), or ``(node, start1, stop1, node1, ...)``:
#: ``node`` except for the disjoint entry ranges ``node_i`` processed since, oldest
#: first. Flat tuples take ~100 bytes less than lists of triples.
HolderRecord = "str | tuple"
#: Entry ranges remembered per chunk id (see ``record_range``).
MAX_RANGES = 16


def _count_range(record: Any, start: int, stop: int, count: dict[str, int]) -> None:
    """Add to ``count[node]`` the entries of ``[start, stop)`` that ``node`` processed."""
    if isinstance(record, str):
        count[record] = count.get(record, 0) + stop - start
        return
    default = record[0]
    count.setdefault(default, 0)
    covered = 0
    for i in range(1, len(record), 3):
        n = min(stop, record[i + 1]) - max(start, record[i])
        if n > 0:
            count[record[i + 2]] = count.get(record[i + 2], 0) + n
            covered += n
    count[default] += (stop - start) - covered


def holder_for(record: Any, start: int | None = None, stop: int | None = None) -> str | None:
    """The node that processed most of the entries ``[start, stop)`` per ``record``.

    No range: the id's node; an empty range: the node of the range holding
    ``start``. A tie goes to the id's node.
    """
    if record is None or isinstance(record, str):
        return record
    default = record[0]
    if start is None or stop is None:
        return default
    if stop <= start:
        for i in range(1, len(record), 3):
            if record[i] <= start < record[i + 1]:
                return record[i + 2]
        return default
    count: dict[str, int] = {}
    _count_range(record, start, stop, count)
    return max(count, key=count.__getitem__)  # first maximum: the id's node


#: A task spanning more stripes than this is remembered under its own id only.
MAX_STRIPES_PER_TASK = 64


def stripe_parts(chunk: str, start: int, stop: int) -> list[tuple[str, int, int]]:
    """``[start, stop)`` of a task of ``chunk`` cut at stripe boundaries, own stripe first.

    Returns ``[(stripe id, start, stop), ...]``: entries of a neighbour stripe are
    remembered under its id (:mod:`cacheaffinity.chunk_id`). A non-stripe id, an
    empty range or too many stripes: ``[(chunk, start, stop)]``.
    """
    stripe = parse_stripe(chunk) if stop > start else None
    if stripe is None:
        return [(chunk, start, stop)]
    S, k = stripe.stripe_entries, stripe.stripe
    first, last = start // S, (stop - 1) // S
    if first == last or not first <= k <= last or last - first >= MAX_STRIPES_PER_TASK:
        return [(chunk, start, stop)]
    parts = []
    for j in range(first, last + 1):
        a, b = max(start, j * S), min(stop, (j + 1) * S)
        part = (chunk if j == k else stripe.sibling(j), a, b)
        if j == k:
            parts.insert(0, part)
        else:
            parts.append(part)
    return parts


def record_range(
    record: Any, node: str, start: int | None = None, stop: int | None = None
) -> Any:
    """The holder record after ``node`` processed the entries ``[start, stop)``.

    No range or no record: ``node`` holds the whole id. Beyond ``MAX_RANGES``
    ranges, the node holding most of their entries becomes the id's node (it took
    the stripe over), then the oldest ranges are dropped.
    """
    if record is None or start is None or stop is None:
        return node
    if isinstance(record, str):
        if record == node or stop <= start:
            return record
        return (record, start, stop, node)
    default = record[0]
    ranges: list[list] = []
    for i in range(1, len(record), 3):
        a, b, n = record[i], record[i + 1], record[i + 2]
        if stop <= a or b <= start or stop <= start:
            ranges.append([a, b, n])
            continue
        if a < start:
            ranges.append([a, start, n])
        if stop < b:
            ranges.append([stop, b, n])
    if node != default and start < stop:
        lo, hi = start, stop
        keep = []
        for r in ranges:
            if r[2] == node and (r[1] == lo or r[0] == hi):
                lo, hi = min(lo, r[0]), max(hi, r[1])
            else:
                keep.append(r)
        ranges = keep + [[lo, hi, node]]
    if len(ranges) > MAX_RANGES:
        held: dict[str, int] = {}
        for a, b, n in ranges:
            held[n] = held.get(n, 0) + b - a
        default = max(held, key=held.__getitem__)
        ranges = [r for r in ranges if r[2] != default][-MAX_RANGES:]
    if not ranges:
        return default
    return (default, *(x for r in ranges for x in r))


def chunk_digest(chunk: str) -> int:
    """xxh3-64 of a chunk id cut to 60 bits (an int below 2**60 takes 32 bytes, not 48)."""
    return xxhash.xxh3_64_intdigest(chunk.encode("utf-8", "surrogatepass")) >> 4


def _remember(d: dict, key: Hashable, value: Any, size: int) -> None:
    """Set ``d[key] = value`` as the newest entry, dropping the oldest beyond ``size``
    in batches (a plain dict takes ~60% of an ``OrderedDict``'s memory)."""
    if key in d:
        del d[key]
    d[key] = value
    if len(d) > size:
        _drop_oldest(d, size)


def _drop_oldest(d: dict, size: int) -> None:
    """Drop the oldest ``len(d) - size + size // 16`` entries of ``d``."""
    for old in list(islice(d, len(d) - size + size // 16)):
        del d[old]


def _entry_range(entries: Any) -> tuple[int, int] | None:
    """``(start, stop)`` from an annotation value, else None."""
    if isinstance(entries, (tuple, list)) and len(entries) == 2:
        a, b = entries
        if (
            isinstance(a, int)
            and isinstance(b, int)
            and not isinstance(a, bool)
            and not isinstance(b, bool)
            and 0 <= a <= b
        ):
            return (a, b)
    return None


def follow_holders(
    nodes: list[str],
    holders: Sequence[str | None],
    capacity: Mapping[str, float],
    slack: float,
    runner_up: Callable[[int], str | None] | None = None,
    speed: Mapping[str, float] | None = None,
) -> int:
    """Send each chunk to its live holder within the damping bound, in place.

    ``nodes[i]`` is the placement's node of chunk ``i``, ``holders[i]`` its holder
    (None: unknown). No node takes more than ``slack`` x its share of
    ``capacity`` (threads x speed) plus one, first come first served; the rest
    stay on their placement's node. A node sheds its own chunks to
    ``runner_up(i)`` only beyond ``slack`` x ``min(1, speed)`` x the chunks the
    placement gave it. ``slack`` inf: no bound. Returns how many chunks moved.
    """
    n = len(nodes)
    total = float(sum(capacity.values()))
    if not n or total <= 0:
        return 0
    bounded = slack != float("inf")
    cap = {node: slack * n * c / total + 1 for node, c in capacity.items()} if bounded else {}
    own_cap: dict[str, float] = {}
    if bounded:
        placed: dict[str, int] = {}
        for node in nodes:
            placed[node] = placed.get(node, 0) + 1
        sp = speed or {}
        own_cap = {
            node: slack * k * min(1.0, sp.get(node, 1.0)) + 1 for node, k in placed.items()
        }
    kept: dict[str, int] = {}
    moved = 0
    for i, (node, h) in enumerate(zip(nodes, holders)):
        w = h if h is not None and h in capacity else node
        if bounded and kept.get(w, 0) >= cap.get(w, n):
            if node != w:
                alt = node
            elif kept.get(w, 0) >= own_cap.get(w, n):
                alt = runner_up(i) if runner_up is not None else None
            else:
                alt = None
            if alt is not None and alt in capacity and kept.get(alt, 0) < cap[alt]:
                w = alt
        kept[w] = kept.get(w, 0) + 1
        if w != node:
            nodes[i] = w
            moved += 1
    return moved


class NodeSpeed:
    """Learned seconds per chunk task of each cache node (EWMA with hysteresis).

    The published value follows the smoothed one only on a relative change above
    ``hysteresis``. ``speed(node)`` is relative to the median node (1.0 = typical,
    also for nodes with fewer than ``min_samples`` tasks); tasks shorter than
    ``min_seconds`` are scheduling noise and not observed.
    """

    def __init__(
        self,
        alpha: float = 0.2,
        hysteresis: float = 0.25,
        min_samples: int = 10,
        min_seconds: float = 0.05,
    ):
        if not 0 < alpha <= 1:
            raise ValueError(f"NodeSpeed alpha={alpha!r} must be in (0, 1], e.g. 0.05")
        if hysteresis < 0:
            raise ValueError(f"NodeSpeed hysteresis={hysteresis!r} must be >= 0, e.g. 0.25")
        self.alpha, self.hysteresis, self.min_samples = alpha, hysteresis, min_samples
        self.min_seconds = min_seconds
        # node -> tasks observed, smoothed and published seconds per task
        self.count: dict[str, int] = {}
        self.smoothed: dict[str, float] = {}
        self.published: dict[str, float] = {}
        self._median: float | None = None

    def observe(self, node: str, seconds: float) -> None:
        if not seconds >= self.min_seconds or not seconds > 0:
            return
        m = self.smoothed.get(node)
        m = seconds if m is None else m + self.alpha * (seconds - m)
        self.smoothed[node] = m
        k = self.count[node] = self.count.get(node, 0) + 1
        p = self.published.get(node)
        if p is None or abs(m - p) > self.hysteresis * p or k == self.min_samples:
            self.published[node] = m
            self._median = None

    def speed(self, node: str) -> float:
        p = self.published.get(node)
        if p is None or self.count.get(node, 0) < self.min_samples:
            return 1.0
        if self._median is None:
            n = self.min_samples
            v = sorted(x for k, x in self.published.items() if self.count.get(k, 0) >= n)
            self._median = v[len(v) // 2]
        return self._median / p

    def to_dict(self) -> dict[str, float]:
        return dict(self.published)

    def retain(self, nodes) -> int:
        """Forget every node not in ``nodes``; returns how many were forgotten."""
        gone = {n for d in (self.count, self.smoothed, self.published) for n in d if n not in nodes}
        for n in gone:
            self.count.pop(n, None)
            self.smoothed.pop(n, None)
            self.published.pop(n, None)
        if gone:
            self._median = None
        return len(gone)


class Locator:
    """Chunk tasks, their targets, and where chunks were processed.

    ``size``, ``use_locator`` and ``slack`` are the settings ``locator-size``,
    ``locator`` and ``locator-slack`` (see ``follow_holders``).
    """

    def __init__(
        self,
        membership: Membership,
        placement: TorusPlacement,
        *,
        size: int,
        use_locator: bool = True,
        slack: float = 1.5,
        speed: NodeSpeed | None = None,
    ):
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(
                f"cacheaffinity.scheduler.locator-size={size!r} must be an integer >= 0, "
                "e.g. 2000000 (~160 MB of scheduler memory, up to ~240 MB once full)"
            )
        self.membership = membership
        self.placement = placement
        self.size: int = size
        self.use_locator: bool = bool(use_locator)
        if isinstance(slack, bool) or not isinstance(slack, (int, float)) or not slack >= 1:
            raise ValueError(
                f"cacheaffinity.scheduler.locator-slack={slack!r} must be a number >= 1, "
                "e.g. 1.5 (a holder keeps its chunks up to 1.5x its fair share of a batch)"
            )
        self.slack: float = float(slack)
        self.speed: NodeSpeed = speed if speed is not None else NodeSpeed()
        # per chunk task: chunk id, entry range, target node
        self.chunk_of: dict[Hashable, str] = {}
        self.entries: dict[Hashable, tuple[int, int]] = {}
        self.target: dict[Hashable, str] = {}
        self.node_tasks: defaultdict[str, set] = defaultdict(set)
        # tracked tasks without a target (they wait for a cache node)
        self.untargeted_keys: set = set()
        # task -> placement's node, for tasks sent to a holder instead
        self.hashed: dict[Hashable, str] = {}
        self.stolen: set = set()
        # chunk digest -> HolderRecord, newest last
        self.holder: dict[int, Any] = {}
        # task -> _compute_parts(), for tasks whose holder was looked up
        self._parts: dict[Hashable, tuple] = {}

    def track(self, key: Hashable, chunk: str, entries: Any = None) -> None:
        """Track chunk task ``key``; ``entries``: its ``cacheaffinity-entries``
        annotation (anything but ``(start, stop)``: the task is the whole id)."""
        self.chunk_of[key] = chunk
        if key not in self.target:
            self.untargeted_keys.add(key)
        if self._parts:
            self._parts.pop(key, None)
        if entries is None:  # the common case: no entry range
            if self.entries:
                self.entries.pop(key, None)
            return
        rng = _entry_range(entries)
        if rng is not None:
            self.entries[key] = rng
        else:
            self.entries.pop(key, None)

    def track_many(
        self,
        keys: Sequence[Hashable],
        chunks: Sequence[str],
        entries: Mapping[Hashable, Any],
        untargeted: bool = True,
    ) -> None:
        """:meth:`track` of every ``keys[i]``, ``chunks[i]`` (``entries``: the
        ``cacheaffinity-entries`` annotation by key) without per-task calls; with
        ``untargeted`` False the caller targets them all next (:meth:`set_targets`)."""
        self.chunk_of.update(zip(keys, chunks))
        if untargeted:
            target = self.target
            self.untargeted_keys.update(
                [k for k in keys if k not in target] if target else keys
            )
        if self._parts:
            pop = self._parts.pop
            for k in keys:
                pop(k, None)
        if entries:
            own = self.entries
            for k in keys:
                e = entries.get(k)
                rng = None if e is None else _entry_range(e)
                if rng is not None:
                    own[k] = rng
                elif own:
                    own.pop(k, None)
        elif self.entries:
            pop = self.entries.pop
            for k in keys:
                pop(k, None)

    def set_targets(self, keys: Sequence[Hashable], nodes: Sequence[str]) -> None:
        """:meth:`set_target` of every ``keys[i]`` to ``nodes[i]``, grouped by node."""
        target = self.target
        if target and not target.keys().isdisjoint(keys):
            set_target = self.set_target
            for k, n in zip(keys, nodes):
                set_target(k, n)
            return
        target.update(zip(keys, nodes))
        if self.untargeted_keys:
            self.untargeted_keys.difference_update(keys)
        code: dict[str, int] = {}
        codes = np.fromiter(
            (code.setdefault(n, len(code)) for n in nodes), dtype=np.int64, count=len(nodes)
        )
        self._group(keys, codes, list(code))

    def set_targets_coded(
        self, keys: Sequence[Hashable], codes: np.ndarray, names: Sequence[str]
    ) -> None:
        """:meth:`set_targets` with node ``names[codes[i]]`` for ``keys[i]``."""
        target = self.target
        if target and not target.keys().isdisjoint(keys):
            self.set_targets(keys, [names[c] for c in codes.tolist()])
            return
        target.update(zip(keys, np.asarray(names, dtype=object)[codes].tolist()))
        if self.untargeted_keys:
            self.untargeted_keys.difference_update(keys)
        self._group(keys, codes, names)

    def _group(self, keys: Sequence[Hashable], codes: np.ndarray, names: Sequence[str]) -> None:
        """Add ``keys[i]`` to ``node_tasks[names[codes[i]]]`` (keys not targeted before)."""
        if not len(keys):
            return
        order = np.argsort(codes, kind="stable")
        sc = codes[order]
        cut = np.flatnonzero(sc[1:] != sc[:-1]) + 1
        karr = np.empty(len(keys), dtype=object)
        karr[:] = keys
        ks = karr[order].tolist()
        node_tasks = self.node_tasks
        lo = 0
        for c, hi in zip(sc[np.r_[0, cut]].tolist(), cut.tolist() + [len(ks)]):
            node_tasks[names[c]].update(ks[lo:hi])
            lo = hi

    def _compute_parts(self, key: Hashable, chunk: str) -> int | tuple:
        """The digest of the task's id, or ``(digest, start, stop, ...)`` per stripe it
        spans (``stripe_parts``): ints only, nothing for the garbage collector."""
        rng = self.entries.get(key)
        if rng is None:
            return chunk_digest(chunk)
        parts = stripe_parts(chunk, *rng)
        if len(parts) == 1:
            return chunk_digest(chunk)
        return tuple(x for p, a, b in parts for x in (chunk_digest(p), a, b))

    def _parts_of(self, key: Hashable, chunk: str) -> int | tuple:
        """``_compute_parts``, computed once per task."""
        parts = self._parts.get(key)
        if parts is None:
            parts = self._parts[key] = self._compute_parts(key, chunk)
        return parts

    def holder_of_task(self, key: Hashable, chunk: str) -> str | None:
        """The node that processed most of the task's entries, over every stripe they
        fall in (None: unknown); called once per steal candidate."""
        parts = self._parts.get(key)
        if parts is None:
            parts = self._parts_of(key, chunk)
        holder = self.holder
        if parts.__class__ is int:
            record = holder.get(parts)
            if record is None or record.__class__ is str:
                return record
            return holder_for(record, *(self.entries.get(key) or ()))
        count: dict[str, int] = {}
        for i in range(0, len(parts), 3):  # own stripe first: its holder wins a tie
            record = holder.get(parts[i])
            if record is not None:
                _count_range(record, parts[i + 1], parts[i + 2], count)
        return max(count, key=count.__getitem__) if count else None

    def set_target(self, key: Hashable, node: str) -> str | None:
        """Make ``node`` the target of task ``key``; returns the previous target."""
        old = self.target.get(key)
        if old is not None and old != node:
            self.node_tasks[old].discard(key)
        self.target[key] = node
        self.node_tasks[node].add(key)
        if old is None:
            self.untargeted_keys.discard(key)
        return old

    def forget_task(self, key: Hashable) -> None:
        """Dask forgot task ``key``."""
        self.chunk_of.pop(key, None)
        self.entries.pop(key, None)
        if self._parts:
            self._parts.pop(key, None)
        self.hashed.pop(key, None)
        self.stolen.discard(key)
        self.untargeted_keys.discard(key)
        node = self.target.pop(key, None)
        if node is not None:
            tasks = self.node_tasks.get(node)
            if tasks is not None:
                tasks.discard(key)
                if not tasks:
                    del self.node_tasks[node]

    def untargeted(self) -> list[Hashable]:
        """Chunk tasks without a target (they wait for a cache node)."""
        return list(self.untargeted_keys)

    def relocate(self, keys: Sequence[Hashable], chunks: Sequence[str], nodes: list[str]) -> int:
        """Replace ``nodes[i]``, the placement's node of task ``keys[i]`` (chunk
        ``chunks[i]``), by the task's live holder within the bound; returns how many
        moved. Also prunes departed nodes."""
        self.prune_nodes()
        if not self.use_locator or not self.holder:
            return 0
        of_task = self.holder_of_task
        holders = [of_task(k, chunk) for k, chunk in zip(keys, chunks)]
        speed = {node: self.speed.speed(node) for node in self.membership.node_workers}
        capacity = {node: self.membership.weight(node) * s for node, s in speed.items()}
        before = list(nodes)
        placement = self.placement
        moved = follow_holders(
            nodes,
            holders,
            capacity,
            self.slack,
            runner_up=lambda i: (placement.ranking(chunks[i], 2)[1:] or [None])[0],
            speed=speed,
        )
        if moved:
            for k, h, n in zip(keys, before, nodes):
                if h != n:
                    self.hashed[k] = h
        return moved

    def prune_nodes(self) -> int:
        """Forget the speed of nodes neither live nor among the last ``MAX_DEPARTED``
        that left, once there are more; returns how many were forgotten."""
        limit = self.membership.known_limit()
        if len(self.speed.count) <= limit and len(self.speed.smoothed) <= limit:
            return 0
        return self.speed.retain(self.membership.known_nodes())

    def where_located(self, chunk: str) -> tuple[str, str] | None:
        """``(holder, placement's node)`` of a chunk held away from its node, else None."""
        h = holder_for(self.holder.get(chunk_digest(chunk)))
        if h is None or not self.membership.node_workers:
            return None
        placed = self.placement.nearest([chunk])[0]
        return None if placed == h else (h, placed)

    def set_located(self, chunk: str, holder: str) -> None:
        """Remember that ``holder`` processed (all of) ``chunk``."""
        _remember(self.holder, chunk_digest(chunk), holder, self.size)

    def holder_of(
        self, chunk: str, start: int | None = None, stop: int | None = None
    ) -> str | None:
        """The node that processed most of ``[start, stop)`` of ``chunk`` (None: unknown)."""
        return holder_for(self.holder.get(chunk_digest(chunk)), start, stop)

    def recorded(self, chunk: str, start: int | None = None, stop: int | None = None) -> bool:
        """Whether a holder of any stripe of ``[start, stop)`` of ``chunk`` is recorded."""
        if start is None or stop is None or stop <= start:
            return chunk_digest(chunk) in self.holder
        return any(chunk_digest(p) in self.holder for p, _, _ in stripe_parts(chunk, start, stop))

    def holders_of_range(
        self, chunk: str, start: int | None = None, stop: int | None = None
    ) -> list[str]:
        """Nodes that processed entries of ``[start, stop)`` of ``chunk``, most first,
        then the placement's nodes of its stripes (they cache what they process)."""
        count: dict[str, int] = {}
        if start is None or stop is None or stop <= start:
            parts = [(chunk, 0, 0)]
            h = holder_for(self.holder.get(chunk_digest(chunk)), start, stop)
            if h is not None:
                count[h] = 1
        else:
            parts = stripe_parts(chunk, start, stop)
            for part, a, b in parts:
                record = self.holder.get(chunk_digest(part))
                if record is not None:
                    _count_range(record, a, b, count)
        out = [n for n in sorted(count, key=count.__getitem__, reverse=True) if count[n] > 0]
        if self.membership.node_workers:
            for n in self.placement.nearest([p for p, _, _ in parts]):
                if n not in out:
                    out.append(n)
        return out

    def forget_holder(self, chunk: str) -> None:
        self.holder.pop(chunk_digest(chunk), None)

    def finished(
        self, key: Hashable, node: str | None, seconds: float | None = None, kept: bool = True
    ) -> bool | None:
        """Record that task ``key`` ran on ``node`` and learn the node's speed.

        ``kept=False``: the node's cache refused the chunk, so it does not become
        the holder. Returns whether the task ran on its target (None: unknown).
        """
        chunk = self.chunk_of.get(key)
        if self.stolen:
            self.stolen.discard(key)
        if self.hashed:
            self.hashed.pop(key, None)
        if chunk is None or node is None:
            return None
        if seconds is not None:
            self.speed.observe(node, seconds)
        if not kept:
            self._parts.pop(key, None) if self._parts else None
            return node == self.target.get(key)
        # every record becomes the newest entry, changed or not, so the map
        # drops the chunks processed longest ago first
        parts = self._parts.pop(key, None) if self._parts else None
        rng = self.entries.get(key)
        if parts is None:
            split = None if rng is None else stripe_parts(chunk, *rng)
            if split is None or len(split) == 1:
                parts = chunk_digest(chunk)
            else:
                parts = tuple(x for p, a, b in split for x in (chunk_digest(p), a, b))
        holder, size = self.holder, self.size
        if parts.__class__ is int:
            record = holder.pop(parts, None)
            if record is None or rng is None:
                record = node
            elif record != node:  # a str equal to node: nothing changes
                record = record_range(record, node, *rng)
            holder[parts] = record
            if len(holder) > size:
                _drop_oldest(holder, size)
        else:
            for i in range(0, len(parts), 3):
                digest = parts[i]
                record = holder.pop(digest, None)
                holder[digest] = record_range(record, node, parts[i + 1], parts[i + 2])
                if len(holder) > size:
                    _drop_oldest(holder, size)
        return node == self.target.get(key)

    def note_steal(self, key: Hashable) -> None:
        """The stealing policy moved chunk task ``key``."""
        if key in self.chunk_of:
            self.stolen.add(key)
