"""What the scheduler knows about chunk tasks and chunks (runs in the scheduler).

Defines :class:`Locator`, the memory of the scheduler side:

* per chunk task the scheduler holds (freed when Dask forgets the task): its
  chunk id, its target cache node, the node's tasks, whether the stealing
  policy moved it, and the node placement chose when the locator sent it
  elsewhere;
* per chunk id, bounded by ``cacheaffinity.scheduler.locator-size`` (oldest
  entries dropped first): the node(s) that processed it last (its *holder*,
  whose cache holds its columns unless evicted since).  A chunk id may name a
  placement *stripe* that several chunk tasks share (coffea chunks:
  ``<uuid>/<tree>/s<S>:<k>``, see :mod:`cacheaffinity.chunk_id`, each task also
  carrying its entry range in the ``cacheaffinity-entries`` annotation), so a holder is a
  :data:`HolderRecord`: the node of the whole id, or that node plus the entry
  ranges other nodes processed since (:func:`record_range`, at most
  :data:`MAX_RANGES` per id); a task then goes where most of its entries were
  processed (:func:`holder_for`).  One plain dict entry per chunk id, keyed by
  a 60-bit digest: ~80 bytes per id, up to ~120 (~160 at the peak of a resize)
  once the map is full and drops old entries, plus ~150 bytes per id with
  ranges processed off its node (measured by ``tools/locator_memory.py``, see
  there), so ``locator-size`` bounds the memory;
* per cache node, its learned speed (:class:`NodeSpeed`: seconds per chunk
  task, smoothed, with hysteresis), for the live nodes and the last
  :data:`~cacheaffinity.scheduler.membership.MAX_DEPARTED` that left
  (:meth:`Locator.prune_nodes`);

the *locator* built on them (:func:`follow_holders`: a chunk goes to the live
node that holds it, whatever the hash says, unless that node's expected
backlog exceeds ``cacheaffinity.scheduler.locator-slack`` x its fair share; so
the stealing decisions of one run become the placement of the next, and a
node learned slower than ``1 / slack`` of the typical speed sheds part of its
own chunks), and the answer to "which node holds this task's chunk"
(:meth:`Locator.holder_of_task`) that the stealing policy
(:mod:`cacheaffinity.scheduler.stealing`) ranks candidates by.
Chunks are remembered by a 60-bit digest of their id (:func:`chunk_digest`; a
collision between two of 10^6 chunks has probability ~4e-7 and costs a cache miss).

Notes
-----
Event-loop only (no locking).  Forgetting a chunk costs at most a cache miss.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Mapping, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

import xxhash

from cacheaffinity.chunk_id import parse_stripe

if TYPE_CHECKING:
    from distributed.scheduler import TaskState, WorkerState

    from cacheaffinity.placement import TorusPlacement
    from cacheaffinity.scheduler.membership import Membership

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

#: What the locator remembers per chunk id: the node that processed it (str),
#: or ``(node, start1, stop1, node1, start2, stop2, node2, ...)``: ``node``
#: except for the entry ranges ``[start_i, stop_i)`` (disjoint, oldest first)
#: that ``node_i`` processed since.  Flat tuples: ~100 bytes less than a list of
#: triples.
HolderRecord = "str | tuple"
#: Entry ranges processed away from an id's node remembered per chunk id;
#: beyond, the node holding most of the ranges' entries becomes the id's node,
#: then the oldest ranges are dropped (a forgotten range costs at most misses).
MAX_RANGES = 16


def _count_range(record: Any, start: int, stop: int, count: dict[str, int]) -> None:
    """Add to ``count[node]`` the entries of ``[start, stop)`` (non-empty) that
    ``node`` processed according to ``record`` (not None)."""
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
    """The node that processed most of the entries ``[start, stop)`` of a chunk id
    whose holder record is ``record`` (see :data:`HolderRecord`).

    ``start`` None (a task without an entry range): the id's node.  An empty
    range counts the range that holds ``start``.  On a tie, the id's node.
    None if ``record`` is None.
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
    return max(count, key=count.__getitem__)  # first maximum: the id's node on a tie


#: A task spanning more stripes than this is remembered under its own id only.
MAX_STRIPES_PER_TASK = 64


def stripe_parts(chunk: str, start: int, stop: int) -> list[tuple[str, int, int]]:
    """The entry range ``[start, stop)`` of a task of chunk id ``chunk`` cut at
    stripe boundaries: ``[(stripe id, start, stop), ...]``, its own stripe first.

    A coffea chunk id names a placement stripe, ``<file>/<tree>/s<S>:<k>``
    (entries ``[k*S, (k+1)*S)``; the grammar is :mod:`cacheaffinity.chunk_id`'s),
    but a chunk crossing a stripe boundary
    processes entries of the neighbour stripe too (and its node then holds
    their clusters): they are remembered under the neighbour's id
    ``<file>/<tree>/s<S>:<j>``.  Any other id, an empty range or more than
    :data:`MAX_STRIPES_PER_TASK` stripes: ``[(chunk, start, stop)]``.
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

    Without a range (``start`` None) or without a record, ``node`` holds the
    whole id.  Otherwise the range is cut out of the ranges other nodes hold
    and, unless ``node`` is the id's node, added as a range of ``node``
    (merged with a range of ``node`` it touches).  More than
    :data:`MAX_RANGES` ranges: the node holding most of their entries becomes
    the id's node (a node that took over a stripe, e.g. because its old node
    left), then the oldest ranges are dropped.
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
    """The key under which the locator remembers a chunk: xxh3-64 of its id,
    shortened to 60 bits (a Python int below 2**60 takes 32 bytes, not 48)."""
    return xxhash.xxh3_64_intdigest(chunk.encode("utf-8", "surrogatepass")) >> 4


def _remember(d: dict, key: Hashable, value: Any, size: int) -> None:
    """Set ``d[key] = value`` as the newest entry; beyond ``size`` entries drop
    the oldest ``size // 16 + 1`` at once (plain dicts keep insertion order and
    take ~60% of an ``OrderedDict``'s memory; dropping in batches keeps the cost
    per entry constant)."""
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
    """``(start, stop)`` from an annotation value (a 2-sequence of ints), else None."""
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
    """Send each chunk to the live node that holds it, within bounds (in place).

    ``nodes[i]`` is the placement's node of chunk ``i`` and ``holders[i]`` the
    node that processed it last (None: unknown).  A chunk goes to its holder
    when that is live (in ``capacity``), else to its placement's node.  Bound
    (the damping): no node gets more than ``slack`` x its fair share of the
    batch (``capacity[node] / sum(capacity)``; capacity = threads x learned
    speed), plus one.  A node keeps the chunks that come first (submission
    order); the rest go to their placement's node.  A node's own chunks (placed
    there and held there or by nobody) are sent on only when it is also above
    ``slack`` x ``min(1, speed[node])`` x the chunks placement gave it, plus
    one: a node learned slower than ``1 / slack`` of the typical speed sheds
    part of them to ``runner_up(i)`` (the next-nearest node), if that one is
    under its bound; a node of typical speed keeps all of them, however
    unevenly the hash spread the batch (the no-locator placement; stealing
    balances the run).  ``speed`` None: every node typical.  ``slack`` = inf:
    no bound.  Returns how many chunks changed node.
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

    ``observe(node, seconds)`` smooths the durations of a node's finished chunk
    tasks (weight ``alpha`` for the newest); the *published* value, the one
    :meth:`speed` uses, follows only when the smoothed value differs from it by
    more than ``hysteresis`` (relative), so noise and short slowdowns do not
    change placement.  :meth:`speed` is a node's speed relative to the median
    of the nodes seen (1.0 = typical); a node with fewer than ``min_samples``
    finished tasks counts as typical (1.0), so the first, noisy tasks (imports,
    warm-up) move nothing; tasks shorter than ``min_seconds`` are not observed
    (their compute time is scheduling noise, not the node's speed).
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
        #: node -> tasks observed.  This and the two below hold the nodes observed;
        #: the locator keeps them to the live nodes and the last ones that left
        #: (:meth:`retain`, :meth:`Locator.prune_nodes`).
        self.count: dict[str, int] = {}
        #: node -> smoothed seconds per task
        self.smoothed: dict[str, float] = {}
        #: node -> published seconds per task
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
        """Forget what was learned of every node not in ``nodes`` (a container of
        node ids); returns how many nodes were forgotten."""
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

    Parameters
    ----------
    membership
        Workers <-> cache nodes.
    placement
        The placement (its :meth:`~cacheaffinity.placement.TorusPlacement.ranking`
        names a chunk's runner-up node for relocation and the steal preference).
    size
        Chunks remembered at most (``cacheaffinity.scheduler.locator-size``).
    use_locator
        ``cacheaffinity.scheduler.locator``: send a chunk to the node that
        processed it last (its holder).
    slack
        ``cacheaffinity.scheduler.locator-slack``: a holder takes chunks
        placed elsewhere while its share of a batch stays below ``slack`` x its
        fair share (threads x learned speed); a node learned slower than
        ``1 / slack`` sheds part of its own; see :func:`follow_holders`.
    speed
        The learned node speeds (a new :class:`NodeSpeed` if None).
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
        #: Chunks remembered at most.
        self.size: int = size
        #: Whether a chunk processed elsewhere goes to its holder next time.
        self.use_locator: bool = bool(use_locator)
        if isinstance(slack, bool) or not isinstance(slack, (int, float)) or not slack >= 1:
            raise ValueError(
                f"cacheaffinity.scheduler.locator-slack={slack!r} must be a number >= 1, "
                "e.g. 1.5 (a holder keeps its chunks up to 1.5x its fair share of a batch)"
            )
        #: A holder keeps its chunks up to ``slack`` x its fair share of a batch.
        self.slack: float = float(slack)
        #: Learned seconds per chunk task of each node.
        self.speed: NodeSpeed = speed if speed is not None else NodeSpeed()
        #: task key -> chunk id, for every chunk task the plugin places
        self.chunk_of: dict[Hashable, str] = {}
        #: task key -> ``(start, stop)`` entry range, for chunk tasks that carry one
        self.entries: dict[Hashable, tuple[int, int]] = {}
        #: task key -> cache node the task is meant for
        self.target: dict[Hashable, str] = {}
        #: cache node id -> keys of tasks meant for it
        self.node_tasks: defaultdict[str, set] = defaultdict(set)
        #: task key -> placement's node, for tasks the locator sent elsewhere
        self.hashed: dict[Hashable, str] = {}
        #: keys of chunk tasks the stealing policy moved (until they finish)
        self.stolen: set = set()
        #: chunk digest -> :data:`HolderRecord` (where it was processed last); newest last
        self.holder: dict[int, Any] = {}
        #: task key -> its parts ``((digest, start, stop), ...)`` (:meth:`_parts_of`),
        #: for tasks whose holder was looked up (freed with the task)
        self._parts: dict[Hashable, tuple] = {}

    # ------------------------------------------------------------ tasks
    def track(self, key: Hashable, chunk: str, entries: Any = None) -> None:
        """``key`` is a chunk task of ``chunk`` the plugin places; ``entries``:
        its ``(start, stop)`` entry range within the chunk id (the
        ``cacheaffinity-entries`` annotation), if it carries one (anything
        else is ignored: the task then counts as the whole id)."""
        self.chunk_of[key] = chunk
        if self._parts:  # empty while no holder was looked up (e.g. a first run)
            self._parts.pop(key, None)
        rng = _entry_range(entries)
        if rng is not None:
            self.entries[key] = rng
        else:
            self.entries.pop(key, None)

    def _compute_parts(self, key: Hashable, chunk: str) -> int | tuple:
        """Where task ``key`` of ``chunk`` is remembered: the digest of its id
        (no entry range, or a range within one stripe), else the flat tuple
        ``(digest, start, stop, ...)``, one triple per stripe its entry range
        falls in, its own stripe first (:func:`stripe_parts`).  An int or a
        flat tuple of ints: nothing for the garbage collector to track."""
        rng = self.entries.get(key)
        if rng is None:
            return chunk_digest(chunk)
        parts = stripe_parts(chunk, *rng)
        if len(parts) == 1:
            return chunk_digest(chunk)
        return tuple(x for p, a, b in parts for x in (chunk_digest(p), a, b))

    def _parts_of(self, key: Hashable, chunk: str) -> int | tuple:
        """:meth:`_compute_parts`, computed once per task (cached until it
        finishes or is forgotten)."""
        parts = self._parts.get(key)
        if parts is None:
            parts = self._parts[key] = self._compute_parts(key, chunk)
        return parts

    def holder_of_task(self, key: Hashable, chunk: str) -> str | None:
        """Which node holds chunk task ``key`` (of chunk id ``chunk``): the node
        that processed most of its entries (of every stripe they fall in,
        :func:`stripe_parts`), else its id's node; None: nobody is known to.
        What the stealing policy asks
        (:func:`~cacheaffinity.scheduler.stealing.steal_preference`)."""
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
        for i in range(0, len(parts), 3):  # its own stripe first: its holder wins a tie
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
        return old

    def forget_task(self, key: Hashable) -> None:
        """Dask forgot task ``key``."""
        self.chunk_of.pop(key, None)
        self.entries.pop(key, None)
        if self._parts:
            self._parts.pop(key, None)
        self.hashed.pop(key, None)
        self.stolen.discard(key)
        node = self.target.pop(key, None)
        if node is not None:
            tasks = self.node_tasks.get(node)
            if tasks is not None:
                tasks.discard(key)
                if not tasks:
                    del self.node_tasks[node]

    def untargeted(self) -> list[Hashable]:
        """Chunk tasks without a target (they wait for a cache node)."""
        return [k for k in self.chunk_of if k not in self.target]

    # ------------------------------------------------------------ chunks
    def relocate(self, todo: Sequence[tuple[TaskState, str]], nodes: list[str]) -> int:
        """Send chunks to the node that processed them last (their holder).

        ``nodes[i]`` is the placement's node of ``todo[i]``; it is replaced by
        the chunk's holder (for a task with an entry range: the node that
        processed most of its entries, :func:`holder_for`) when that is a
        live node, within the bound of
        :func:`follow_holders` (``slack`` x the holder's fair share by threads
        x learned speed).  Returns how many moved.  Also forgets what was learned
        of nodes long gone (:meth:`prune_nodes`: once per submitted graph).
        """
        self.prune_nodes()
        if not self.use_locator or not self.holder:
            return 0
        of_task = self.holder_of_task
        holders = [of_task(ts.key, chunk) for ts, chunk in todo]
        speed = {node: self.speed.speed(node) for node in self.membership.node_workers}
        capacity = {node: self.membership.weight(node) * s for node, s in speed.items()}
        before = list(nodes)
        placement = self.placement
        moved = follow_holders(
            nodes,
            holders,
            capacity,
            self.slack,
            runner_up=lambda i: (placement.ranking(todo[i][1], 2)[1:] or [None])[0],
            speed=speed,
        )
        if moved:
            for (ts, _), h, n in zip(todo, before, nodes):
                if h != n:
                    self.hashed[ts.key] = h
        return moved

    def prune_nodes(self) -> int:
        """Forget the learned speed of nodes that are neither live
        nor among the last :data:`~cacheaffinity.scheduler.membership.MAX_DEPARTED`
        that left (:meth:`~cacheaffinity.scheduler.membership.Membership.known_nodes`),
        once there are more than that many: per-node memory is bounded by the live
        nodes + ``MAX_DEPARTED`` (+ the nodes observed since the last call, which
        :meth:`relocate` makes once per submitted graph), however many nodes came and
        went.  Returns how many nodes were forgotten."""
        limit = self.membership.known_limit()
        if len(self.speed.count) <= limit and len(self.speed.smoothed) <= limit:
            return 0
        return self.speed.retain(self.membership.known_nodes())

    def where_located(self, chunk: str) -> tuple[str, str] | None:
        """``(holder node, placement's node)`` of a chunk whose holder is not its
        placement's node under the current membership, else None."""
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
        """The node that processed ``chunk`` last (None: unknown or forgotten);
        with ``start``, ``stop``: the one that processed most of those entries."""
        return holder_for(self.holder.get(chunk_digest(chunk)), start, stop)

    def recorded(self, chunk: str, start: int | None = None, stop: int | None = None) -> bool:
        """Whether a holder of any stripe of ``[start, stop)`` of ``chunk`` (or of
        the id, without a range) is recorded."""
        if start is None or stop is None or stop <= start:
            return chunk_digest(chunk) in self.holder
        return any(chunk_digest(p) in self.holder for p, _, _ in stripe_parts(chunk, start, stop))

    def holders_of_range(
        self, chunk: str, start: int | None = None, stop: int | None = None
    ) -> list[str]:
        """Nodes that processed entries of ``[start, stop)`` of ``chunk`` (of every
        stripe those fall in, :func:`stripe_parts`), most entries first, then
        the placement's nodes of those stripes (they cache what they process;
        the scheduler may have restarted since).  Without a range: the id's
        holder and its placement's node."""
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
        """Task ``key`` finished on ``node`` (taking ``seconds`` if known):
        remember where its chunk is and learn the node's speed.  ``kept=False``:
        the node's cache did not keep the chunk (its admission policy refused it),
        so the node is not its holder (a node that held it before stays so).

        Returns whether it ran on its target node (None: not a tracked chunk
        task or unknown node).
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
        # the digests computed when the task was placed or considered for a
        # steal, if it was; each record becomes the newest entry, changed or
        # not (as _remember does), so the map drops the chunks processed
        # longest ago first
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
