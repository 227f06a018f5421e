"""Python's garbage collector timed in a worker process (run with ``client.run``).

:func:`install` adds a ``gc.callbacks`` timer once per process; :func:`read` returns
and resets the seconds and counts of full (generation 2) and younger collections since
the last read; :func:`freeze` is ``gc.collect(); gc.freeze()`` (what
``cacheaffinity.worker.gc: freeze`` does after a worker's first chunk task), for the
modes that have no cacheaffinity worker plugin to do it.
"""

from __future__ import annotations

import statistics


def install() -> bool:
    import gc
    import time

    if getattr(gc, "_benchmark_gc_timer", None) is not None:
        return False
    state = {"s": [0.0, 0.0, 0.0], "n": [0, 0, 0], "t0": 0.0}

    def callback(phase, info):
        if phase == "start":
            state["t0"] = time.perf_counter()
        else:
            g = info["generation"]
            state["s"][g] += time.perf_counter() - state["t0"]
            state["n"][g] += 1

    gc.callbacks.append(callback)
    gc._benchmark_gc_timer = state
    return True


def read() -> dict:
    import gc

    state = getattr(gc, "_benchmark_gc_timer", None)
    if state is None:
        return {"full_s": None, "young_s": None, "full_n": None, "young_n": None, "frozen": None}
    out = {"full_s": state["s"][2], "young_s": state["s"][0] + state["s"][1],
           "full_n": state["n"][2], "young_n": state["n"][0] + state["n"][1],
           "frozen": gc.get_freeze_count()}  # fmt: skip
    state["s"], state["n"] = [0.0, 0.0, 0.0], [0, 0, 0]
    return out


def freeze() -> int:
    import gc

    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def summary(per_worker: dict) -> dict:
    """Median over the workers of :func:`read`'s figures."""
    rows = [r for r in per_worker.values() if r.get("full_s") is not None]
    if not rows:
        return {}
    return {k: statistics.median(r[k] for r in rows) for k in ("full_s", "young_s", "full_n", "young_n", "frozen")}
