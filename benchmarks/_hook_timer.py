"""Scheduler preload for benchmarks: time spent inside cacheaffinity's plugin hooks.

``dask scheduler --preload cacheaffinity --preload benchmarks._hook_timer`` makes the
timer available; ``client.run_on_scheduler(hook_timer, on=True)`` wraps the
cacheaffinity plugin's ``update_graph``, ``transition``, ``add_worker`` and
``remove_worker`` (and the stealing policy's periodic ``balance``) with CPU-time accumulators (``time.thread_time``; the scheduler's
event loop is one thread), ``hook_timer(on=False)`` removes the wrappers again.
The timer's own cost per call (two clock reads) is measured once at start-up on a
wrapped no-op and subtracted from the totals, but it is still spent by the scheduler
process while the timer is on (two ``thread_time`` calls are ~1 us, and a chunk task
passes the ``transition`` hook about 4 times): switch it on only for batches whose
process CPU is not a headline figure.
``client.run_on_scheduler(hook_seconds)`` returns the net totals per hook.

Runs in the scheduler process.
"""

import time
from functools import wraps

_TOTALS: dict[str, float] = {}
_CALLS: dict[str, int] = {}
_OVERHEAD = [0.0]  # seconds per wrapped call, measured in dask_setup
_HOOKS = ("update_graph", "transition", "add_worker", "remove_worker")


def _timed(name, fn):
    @wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            _TOTALS[name] = _TOTALS.get(name, 0.0) + time.thread_time() - t0
            _CALLS[name] = _CALLS.get(name, 0) + 1

    return wrapper


def _calibrate(n: int = 200_000) -> float:
    noop = _timed("_calibration", lambda *a, **k: None)
    for _ in range(n):
        noop(1, 2, stimulus_id="x")
    per_call = _TOTALS.pop("_calibration") / n
    _CALLS.pop("_calibration")
    return per_call


def dask_setup(scheduler):
    _OVERHEAD[0] = min(_calibrate() for _ in range(3))


def hook_timer(dask_scheduler=None, on: bool = True) -> bool:
    """Wrap (``on``) or unwrap the plugin's hooks, and the locality stealing policy's
    periodic ``balance`` (timed as ``"stealing"``); returns whether they are wrapped."""
    plugin = dask_scheduler.plugins["cacheaffinity"]
    for name in _HOOKS:
        wrapped = name in vars(plugin)  # the wrapper is an instance attribute
        if on and not wrapped:
            setattr(plugin, name, _timed(name, getattr(plugin, name)))
        elif not on and wrapped:
            delattr(plugin, name)  # back to the class's method
    # the policy's tornado PeriodicCallback calls its ``callback`` attribute
    pc = dask_scheduler.periodic_callbacks.get("cacheaffinity-stealing")
    if pc is not None:
        original = getattr(pc.callback, "__wrapped__", pc.callback)
        pc.callback = _timed("stealing", original) if on else original
    return on


def hook_seconds(dask_scheduler=None) -> dict[str, float]:
    """Net CPU seconds inside each hook (timer cost subtracted)."""
    return {k: max(0.0, v - _CALLS[k] * _OVERHEAD[0]) for k, v in _TOTALS.items()}
