"""Python's cyclic garbage collector in a worker process (``cacheaffinity.worker.gc``).

Runs in workers; the one home of the collector policy (why: docs/operations.md).
``freeze``: after chunk tasks 1, 2, 4, ... :data:`REFREEZE_UNTIL`, ``gc.collect()`` then
``gc.freeze()``, so later full collections skip what was alive then (the imported
libraries, the worker).  ``python``: the collector untouched.  ``auto`` (default):
``freeze`` in a process that exists to be a Dask worker, ``python`` where it also
runs the user's code (freezing is a property of the whole process).

Before Python 3.12, whatever the mode, :func:`guard_frame_snapshots` keeps the collector
out of ``sys._current_frames()`` (the one CPython name used here: distributed's profiler
calls it every 10 ms in every worker), which otherwise can deadlock the whole process."""

from __future__ import annotations

import gc
import logging
import multiprocessing
import sys
import threading

logger = logging.getLogger("cacheaffinity.worker")

MODES = ("auto", "freeze", "python")
#: The last chunk task count (a power of two) after which ``freeze`` freezes again.
REFREEZE_UNTIL = 1024


#: Pythons whose ``sys._current_frames()`` can run the collector while it holds the
#: interpreter's thread-list lock (CPython gh-106883, gh-116969; the fix, disabling the
#: collector in the call, was not released for 3.11; from 3.12 a collection starts only
#: between bytecodes, not inside the call's allocations).
FRAME_SNAPSHOT_DEADLOCK = sys.version_info < (3, 12)


def guard_frame_snapshots(module=sys) -> bool:
    """Wrap ``module._current_frames`` and ``_current_exceptions`` so that the collector is
    disabled while they run (and enabled again after, if it was), as CPython's own fix does.

    Without it, on Python 3.10-3.11, an allocation inside the call can start a collection,
    a finalizer run by the collection can let another thread take the GIL, and a thread
    that starts or ends then waits, holding the GIL, for the thread-list lock the call
    holds: every thread of the process stops for good (dask/distributed#8616; most
    likely what stopped a worker in CI's soak, which recorded no stack).  Distributed's
    profiler calls it every 10 ms.  Idempotent; True if this call wrapped something.  The
    process keeps the wrapper: it adds ~0.2 µs to a snapshot of 0.2-3 µs
    (``benchmarks/frame_snapshots.py``), and no collection is lost, only deferred."""
    wrapped = False
    for name in ("_current_frames", "_current_exceptions"):
        original = getattr(module, name, None)
        if original is None or getattr(original, "_cacheaffinity_guarded", False):
            continue
        setattr(module, name, _without_collector(original))
        wrapped = True
    return wrapped


def _without_collector(original):
    def snapshot():
        enabled = gc.isenabled()
        if enabled:
            gc.disable()
        try:
            return original()
        finally:
            if enabled:
                gc.enable()

    snapshot.__name__ = snapshot.__qualname__ = original.__name__
    snapshot.__doc__ = original.__doc__
    snapshot.__wrapped__ = original
    snapshot._cacheaffinity_guarded = True
    return snapshot


def dedicated_worker_process() -> bool:
    """Whether this process exists to be a Dask worker: a child of a nanny
    (``multiprocessing`` parent) or a ``dask worker --no-nanny`` process."""
    return (
        multiprocessing.parent_process() is not None
        or "distributed.cli.dask_worker" in sys.modules
    )


def resolve(mode: str) -> str:
    """The mode in force for ``mode`` in this process: ``freeze`` or ``python``."""
    if mode == "auto":
        return "freeze" if dedicated_worker_process() else "python"
    if mode not in MODES:
        raise ValueError(f"cacheaffinity.worker.gc: {mode!r} is not one of {', '.join(MODES)}")
    return mode


class Collector:
    """The collector policy of one worker process (:meth:`after_chunk` runs in the task's thread)."""

    def __init__(self, mode: str = "auto"):
        self.mode = str(mode)
        self.effective = resolve(self.mode)
        #: objects in the permanent generation after the last freeze (None: none yet)
        self.frozen: int | None = None
        self.chunks = 0
        self._lock = threading.Lock()

    def after_chunk(self) -> None:
        if self.effective != "freeze":
            return
        with self._lock:
            self.chunks += 1
            n = self.chunks
            if n > REFREEZE_UNTIL or n & (n - 1):
                return  # not a power of two
            gc.collect()
            gc.freeze()
            first, self.frozen = self.frozen is None, gc.get_freeze_count()
        (logger.info if first else logger.debug)(
            "cacheaffinity: gc.freeze() after chunk task %d: %d objects left out of "
            "Python's full collections (cacheaffinity.worker.gc: %s)",
            n, self.frozen, self.mode,
        )  # fmt: skip

    def describe(self) -> str:
        if self.mode == "auto":
            return f"auto ({self.effective})"
        return self.mode
