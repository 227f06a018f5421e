"""Micro-benchmark of the locator's per-task bookkeeping and steal preference (runs in-process).

A diagnostic beside ``scheduler_overhead.py``: real
:class:`~cacheaffinity.scheduler._locator.Locator` objects (with a real
:class:`~cacheaffinity.scheduler._membership.Membership` of Dask ``WorkerState`` objects
and a real :class:`~cacheaffinity.placement.TorusPlacement`) and real Dask
``TaskState`` objects, no cluster.  Times, as the minimum of ``--repeats`` runs,
for the locator of this checkout and for the one of a base commit (``--base``, loaded from
git into a module of its own) in one invocation:

- ``steal/<state>``: one steal preference (this checkout:
  :func:`~cacheaffinity.scheduler._stealing.steal_preference`; a base before the
  stealing rule moved there: ``Locator.steal_preference``) over a victim queue of
  ``--tasks`` chunk tasks (coffea stripe ids with entry ranges, a tenth of them crossing a
  stripe boundary), with the victim's chunks ``cold`` (no holder known), ``warm`` (the
  victim's node holds them all) or ``thief`` (also one chunk the thief's node holds);
- ``candidates``: the victim's stealable chunk tasks (``LocalityStealing._choose``'s
  filter over the victim's ``processing``; before: the base commit's filter, copied here);
- ``finished``: ``track`` + ``set_target`` + ``finished`` + ``forget_task`` of ``--tasks``
  tasks whose chunks were processed before (each holder record is rewritten);
- ``placed+finished``: the same with :meth:`Locator.relocate` first (what the plugin does
  when the holder map is not empty: the digests computed there are reused).

Both versions must agree: every timed call's result and the holder maps are compared
(exit status 1 if they differ).

    python benchmarks/locator_micro.py [--tasks 10000] [--repeats 7] [--base 9916205]

Prints a table (microseconds per task); writes nothing.
"""

from __future__ import annotations

import argparse
import gc
import random
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from distributed.core import Status  # noqa: E402
from distributed.scheduler import TaskGroup, TaskPrefix, TaskState, WorkerState  # noqa: E402

from cacheaffinity.placement import TorusPlacement  # noqa: E402
from cacheaffinity.scheduler import _distributed  # noqa: E402
from cacheaffinity.scheduler import _locator as current  # noqa: E402
from cacheaffinity.scheduler._membership import Membership  # noqa: E402
from cacheaffinity.scheduler._stealing import steal_preference  # noqa: E402

NODES = 4
STRIPE = 1000


def load_base(commit: str) -> types.ModuleType:
    """``cacheaffinity/scheduler/_locator.py`` at ``commit``, as a module of its own."""
    src = subprocess.run(
        ["git", "show", f"{commit}:cacheaffinity/scheduler/_locator.py"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    mod = types.ModuleType("cacheaffinity.scheduler._locator_base")
    mod.__file__ = f"<{commit}:cacheaffinity/scheduler/_locator.py>"
    sys.modules[mod.__name__] = mod
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)
    return mod


def workers() -> dict[str, WorkerState]:
    return {
        f"tcp://127.0.0.1:{9000 + i}": WorkerState(
            address=f"tcp://127.0.0.1:{9000 + i}", status=Status.running, pid=i, name=i,
            nthreads=2, memory_limit=0, local_directory="/tmp", nanny=None, server_id=str(i),
        )
        for i in range(NODES)
    }


def make_locator(mod: types.ModuleType, ws: dict[str, WorkerState]):
    m = Membership()
    m.bind(ws)
    for i, addr in enumerate(ws):
        m.learn(addr, f"n{i}", 1.0)
    p = TorusPlacement()
    p.set_nodes({f"n{i}": 1.0 for i in range(NODES)})
    return mod.Locator(m, p, size=2_000_000)


def tasks(n: int, run: int) -> list[tuple[TaskState, str, tuple[int, int]]]:
    """``n`` chunk tasks of run ``run`` (task keys differ per run, chunk ids do not)."""
    group = TaskGroup("chunk", TaskPrefix("chunk"))
    out = []
    for i in range(n):
        ts = TaskState(f"chunk-{run}-{i}", None, "processing", group, False)
        ts.priority = (0, run, i)
        start = i * 500 + (250 if i % 10 == 0 else 0)  # a tenth crosses a stripe boundary
        chunk = f"0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/Events/s{STRIPE}:{start // STRIPE}"
        out.append((ts, chunk, (start, start + 500)))
    return out


def timed(fn, repeats: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def steal_case(mod, state: str, n: int, repeats: int):
    ws = workers()
    addrs = list(ws)
    victim, thief = ws[addrs[0]], ws[addrs[1]]
    loc = make_locator(mod, ws)
    queue = tasks(n, 1)
    for ts, chunk, rng in queue:
        loc.track(ts.key, chunk, rng)
        loc.set_target(ts.key, "n0")
    if state in ("warm", "thief"):
        for ts, chunk, rng in queue:
            loc.set_located(chunk, "n0")
    if state == "thief":
        ts, chunk, rng = queue[n // 3]
        loc.set_located(chunk, "n1")
    # in the order of a set of TaskStates (a worker's ``processing``): not by priority
    cands = random.Random(0).sample([ts for ts, _, _ in queue], len(queue))
    if hasattr(loc, "steal_preference"):  # a base from before the rule moved to stealing.py
        prefer = lambda: loc.steal_preference(cands, victim, thief)  # noqa: E731
    else:
        prefer = lambda: steal_preference(loc, cands, victim, thief)  # noqa: E731
    sec, choice = timed(prefer, repeats)
    return sec, (choice.key if choice is not None else None)


def base_candidates(scheduler, ext, victim, thief, chunk):
    """The candidate filter of ``LocalityStealing._choose`` at the base commit."""
    in_flight = ext.in_flight if ext is not None else {}
    return [
        ts
        for ts in victim.processing
        if ts.key in chunk
        and ts not in in_flight
        and not _distributed.is_executing(victim, ts)
        and _distributed.may_run_on(scheduler, ts, thief)
    ]


def candidates_case(mod, n: int, repeats: int):
    """The victim's stealable chunk tasks (``mod`` None: the base's filter)."""
    ws = workers()
    addrs = list(ws)
    victim, thief = ws[addrs[0]], ws[addrs[1]]
    chunk = {}
    for ts, c, _ in tasks(n, 1):
        ts.loose_restrictions = True
        ts.worker_restrictions = {addrs[0]}
        victim.processing.add(ts)
        chunk[ts.key] = c
    fn = base_candidates if mod is None else _distributed.stealable_from
    sec, out = timed(lambda: fn(None, None, victim, thief, chunk), repeats)
    return sec, [ts.key for ts in out]


def finished_case(mod, n: int, repeats: int, place: bool):
    ws = workers()
    loc = make_locator(mod, ws)
    for ts, chunk, rng in tasks(n, 0):  # a previous run: every chunk has a holder
        loc.track(ts.key, chunk, rng)
        loc.finished(ts.key, "n2")
        loc.forget_task(ts.key)
    runs = iter(range(1, 10**6))

    def one():
        batch = tasks(n, next(runs))
        t0 = time.perf_counter()
        for ts, chunk, rng in batch:
            loc.track(ts.key, chunk, rng)
            loc.set_target(ts.key, "n3")
        if place:
            loc.relocate([(ts, chunk) for ts, chunk, _ in batch], ["n3"] * n)
        out = [loc.finished(ts.key, "n3" if i % 7 else "n1") for i, (ts, _, _) in enumerate(batch)]
        for ts, _, _ in batch:
            loc.forget_task(ts.key)
        return time.perf_counter() - t0, out

    best, result = float("inf"), None
    for _ in range(repeats):
        sec, result = one()
        best = min(best, sec)
    return best, (result, dict(loc.holder))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--base", default="9916205", help="commit of the 'before' locator")
    args = ap.parse_args(argv)
    base = load_base(args.base)
    n = args.tasks
    cases = {
        **{
            f"steal/{s}": (lambda mod, s=s: steal_case(mod, s, n, 3))
            for s in ("cold", "warm", "thief")
        },
        "candidates": lambda mod: candidates_case(None if mod is base else mod, n, 3),
        "finished": lambda mod: finished_case(mod, n, 1, place=False),
        "placed+finished": lambda mod: finished_case(mod, n, 1, place=True),
    }
    print(f"{n} tasks, min of {args.repeats} repeats, us per task "
          f"(steal: per queued task of one steal preference)")
    print(f"{'case':18s} {'before':>9s} {'after':>9s} {'ratio':>7s}  same result")
    bad = 0
    for name, fn in cases.items():
        # before and after alternate, each after a full garbage collection, so
        # that neither pays for the other's heap
        best = {"before": float("inf"), "after": float("inf")}
        results = {}
        for r in range(args.repeats):
            for which in (("before", "after") if r % 2 == 0 else ("after", "before")):
                gc.collect()
                sec, results[which] = fn(base if which == "before" else current)
                best[which] = min(best[which], sec)
        same = results["before"] == results["after"]
        bad += not same
        print(f"{name:18s} {best['before'] / n * 1e6:9.3f} {best['after'] / n * 1e6:9.3f} "
              f"{best['after'] / best['before']:7.2f}  {same}")
        results.clear()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
