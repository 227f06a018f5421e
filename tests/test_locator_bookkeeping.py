"""The locator's fast paths give the same answers as the rule they implement.

:meth:`Locator.steal_preference` (one holder look-up per task, digests cached per
task, priorities compared without negation, runner-ups in one batch) against
:func:`choose_steal` fed from scratch with :func:`holder_for`/:func:`stripe_parts`;
:meth:`Locator.finished` (cached digests, records rewritten without
:func:`record_range` when nothing changes) against the holder map built with
:func:`record_range` and ``_remember``, entry order (what is dropped first)
included.  Real Dask ``TaskState``/``WorkerState`` objects, a real
:class:`Membership` and :class:`TorusPlacement`; random states from fixed seeds.
"""

from __future__ import annotations

import random

import pytest
from distributed.core import Status
from distributed.scheduler import TaskGroup, TaskPrefix, TaskState, WorkerState

from cacheaffinity.placement import TorusPlacement
from cacheaffinity.scheduler.locator import (
    Locator,
    _count_range,
    _remember,
    choose_steal,
    chunk_digest,
    holder_for,
    record_range,
    stripe_parts,
)
from cacheaffinity.scheduler.membership import Membership

NODES = 4
STRIPE = 100


def worker_states() -> list[WorkerState]:
    return [
        WorkerState(
            address=f"tcp://127.0.0.1:{9100 + i}", status=Status.running, pid=i, name=i,
            nthreads=2, memory_limit=0, local_directory="/tmp", nanny=None, server_id=str(i),
        )
        for i in range(NODES)
    ]


def make_locator(size: int = 10_000) -> tuple[Locator, list[WorkerState]]:
    ws = worker_states()
    m = Membership()
    m.bind({w.address: w for w in ws})
    for i, w in enumerate(ws):
        m.learn(w.address, f"n{i}", 1.0)
    p = TorusPlacement()
    p.set_nodes({f"n{i}": 1.0 for i in range(NODES)})
    return Locator(m, p, size=size), ws


def random_task(rng: random.Random, group: TaskGroup, i: int) -> tuple[TaskState, str, object]:
    ts = TaskState(f"t-{i}", None, "processing", group, False)
    ts.priority = (0, rng.randrange(3), rng.randrange(6))  # ties on purpose
    kind = rng.randrange(4)
    f = rng.randrange(3)
    if kind == 0:  # an id without stripes, no entry range
        return ts, f"file-{f}/Events/{rng.randrange(20)}", None
    start = rng.randrange(0, 2000)
    stop = start + rng.choice([0, 30, 100, 250])  # empty, inside, across stripes
    chunk = f"uuid-{f}/Events/s{STRIPE}:{start // STRIPE}"
    return ts, chunk, (start, stop)


def reference_holder(loc: Locator, key) -> str | None:
    """The holder of task ``key`` computed from scratch (the base commit's rule)."""
    chunk, rng = loc.chunk_of[key], loc.entries.get(key)
    if rng is None or rng[1] <= rng[0]:
        return holder_for(loc.holder.get(chunk_digest(chunk)), *(rng or ()))
    parts = stripe_parts(chunk, *rng)
    if len(parts) == 1:
        return holder_for(loc.holder.get(chunk_digest(chunk)), *rng)
    count: dict[str, int] = {}
    for part, a, b in parts:
        record = loc.holder.get(chunk_digest(part))
        if record is not None:
            _count_range(record, a, b, count)
    return max(count, key=count.__getitem__) if count else None


def reference_preference(loc, candidates, victim, thief, take_warm):
    node_of = loc.membership.worker_node
    tn, vn = node_of.get(thief.address), node_of.get(victim.address)
    return choose_steal(
        candidates,
        priority=lambda ts: ts.priority,
        chunk=lambda ts: ts.key if ts.key in loc.chunk_of else None,
        thief_holds=lambda k: tn is not None and reference_holder(loc, k) == tn,
        runner_up_is_thief=None
        if tn is None or len(loc.membership.node_workers) <= 1
        else lambda k: loc.placement.ranking(loc.chunk_of[k], 2)[1:] == [tn],
        victim_holds=None if vn is None else lambda k: reference_holder(loc, k) == vn,
        take_warm=take_warm,
    )


def reference_finished(ref: dict, size: int, chunk: str, entries, node: str) -> None:
    if entries is None:
        _remember(ref, chunk_digest(chunk), node, size)
        return
    for part, a, b in stripe_parts(chunk, *entries):
        d = chunk_digest(part)
        _remember(ref, d, record_range(ref.get(d), node, a, b), size)


@pytest.mark.parametrize("seed", range(6))
def test_steal_preference_matches_choose_steal_from_scratch(seed):
    rng = random.Random(seed)
    loc, ws = make_locator()
    group = TaskGroup("t", TaskPrefix("t"))
    tasks = [random_task(rng, group, i) for i in range(300)]
    for ts, chunk, entries in tasks:
        loc.track(ts.key, chunk, entries)
    nodes = [f"n{i}" for i in range(NODES)]
    done = 0
    outcomes = set()
    for step in range(60):
        # some tasks finish between two steals: holder records change, the
        # digests cached for the queued tasks must not go stale
        for ts, chunk, entries in tasks[done : done + 4]:
            loc.finished(ts.key, rng.choice(nodes))
            loc.forget_task(ts.key)
            loc.track(ts.key, chunk, entries)  # queued again (a new run)
        done += 4
        victim, thief = rng.sample(ws, 2)
        candidates = rng.sample([t for t, _, _ in tasks], rng.randrange(1, 120))
        if step % 5 == 0:  # a task without a chunk among them
            candidates.append(TaskState("plain", None, "processing", group, False))
            candidates[-1].priority = (0, 9, 9)
        for take_warm in (True, False):
            got = loc.steal_preference(candidates, victim, thief, take_warm=take_warm)
            want = reference_preference(loc, candidates, victim, thief, take_warm)
            assert got is want, (step, take_warm, got, want)
            outcomes.add(None if got is None else reference_holder(loc, got.key))
    # the states exercised every kind of choice: held by some node, and cold
    assert None in outcomes and len(outcomes) >= 3


def test_steal_preference_falls_back_on_priorities_of_other_lengths():
    loc, ws = make_locator()
    group = TaskGroup("t", TaskPrefix("t"))
    a = TaskState("a", None, "processing", group, False)
    b = TaskState("b", None, "processing", group, False)
    a.priority, b.priority = (1,), (1, 0)  # not comparable negated vs as they are
    loc.track("a", "x/Events/1")
    loc.track("b", "x/Events/2")
    for cands in ([a, b], [b, a]):
        got = loc.steal_preference(cands, ws[0], ws[1])
        assert got is reference_preference(loc, cands, ws[0], ws[1], True)


@pytest.mark.parametrize("size", [40, 10_000])
def test_finished_holder_map_equals_record_range_and_remember(size):
    rng = random.Random(size)
    loc, ws = make_locator(size)
    group = TaskGroup("t", TaskPrefix("t"))
    ref: dict = {}
    seen: set = set()
    nodes = [f"n{i}" for i in range(NODES)]
    for i in range(1500):
        ts, chunk, entries = random_task(rng, group, i)
        loc.track(ts.key, chunk, entries)
        loc.set_target(ts.key, "n0")
        if i % 3 == 0:  # placement or a steal looked the holder up: digests cached
            assert loc._holder_of_task(ts.key, chunk) == reference_holder(loc, ts.key)
        node = rng.choice(nodes[:2]) if i % 2 else rng.choice(nodes)
        assert loc.finished(ts.key, node) is (node == "n0")
        reference_finished(ref, size, chunk, loc.entries.get(ts.key), node)
        seen.update(ref)
        loc.forget_task(ts.key)
        assert list(loc.holder.items()) == list(ref.items())  # values and order
    assert not loc._parts and not loc.chunk_of
    assert len(loc.holder) <= size
    assert (len(seen) > size) is (size == 40)  # the small map dropped old chunks
    assert any(isinstance(r, tuple) for r in ref.values())  # ranges were recorded
