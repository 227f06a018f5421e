"""Scheduler preload for benchmarks: time spent inside cacheaffinity's plugin hooks.

``dask scheduler --preload cacheaffinity --preload benchmarks._hook_timer`` wraps the
cacheaffinity plugin's ``update_graph``, ``transition``, ``add_worker`` and
``remove_worker`` with CPU-time accumulators (``time.thread_time``; the scheduler's
event loop is one thread).  ``client.run_on_scheduler(hook_seconds)`` returns the totals.
"""

import time
from functools import wraps

_TOTALS: dict[str, float] = {}


def _timed(name, fn):
    @wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            _TOTALS[name] = _TOTALS.get(name, 0.0) + time.thread_time() - t0

    return wrapper


def dask_setup(scheduler):
    plugin = scheduler.plugins["cacheaffinity"]
    for name in ("update_graph", "transition", "add_worker", "remove_worker"):
        setattr(plugin, name, _timed(name, getattr(plugin, name)))


def hook_seconds(dask_scheduler=None) -> dict[str, float]:
    return dict(_TOTALS)
