"""Python's cyclic garbage collector in a worker process (``cacheaffinity.worker.gc``).

Runs in workers; the one home of the collector policy (why: docs/operations.md).
``freeze``: after chunk tasks 1, 2, 4, ... :data:`REFREEZE_UNTIL`, ``gc.collect()`` then
``gc.freeze()``, so later full collections skip what was alive then (the imported
libraries, the worker).  ``python``: the collector untouched.  ``auto`` (default):
``freeze`` in a process that exists to be a Dask worker, ``python`` where it also
runs the user's code (freezing is a property of the whole process)."""

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
