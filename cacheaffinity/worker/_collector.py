"""Python's cyclic garbage collector in a worker process (``cacheaffinity.worker.gc``).

Runs in the worker process; the one home of the collector policy.

Why a policy at all: a warm chunk task of a coffea analysis builds coffea's lazy
NanoEvents layout for every branch of the file's form (``ak.from_buffers`` inside
``NanoEventsFactory.events``), tens of thousands of small container objects per chunk
that live until the task ends.  Measured with the allocation sampler of
``benchmarks/warm_run_profile.py`` (the stack of every young collection): about 90% of
a warm run's young collections start inside ``ak.from_buffers``, 10% in the processor,
about 1% in cacheaffinity, and floor (b), coffea's pipeline over a dict of buffers,
triggers as many.  Those objects are promoted while the chunk runs and so start full
collections, each of which walks every object the process keeps alive: the imported
libraries (coffea, awkward, numba, distributed: ~200k objects) and the worker's state.
So full collections cost about a fifth of a warm run's wall, whatever the cache does.

Modes:

``auto`` (default)
    ``freeze`` in a process that exists to be a Dask worker (spawned by a nanny or
    started by ``dask worker``), ``python`` in a process that also runs the user's code
    (an in-process ``LocalCluster(processes=False)``, a notebook kernel): freezing is
    a property of the whole process and not ours to decide for a user's kernel.
``freeze``
    after the process's first chunk task, ``gc.collect()`` then ``gc.freeze()``: what
    is alive then (the libraries, the worker) moves to the permanent generation, and
    later full collections walk only what was created since.  Again after chunk tasks
    2, 4, 8, ... 1024 (:data:`REFREEZE_UNTIL`): what a run keeps (the schemas and forms
    of later files, coffea's and Dask's per-run state) is left out too, with
    log2(1024) = 10 extra collections of the unfrozen objects over a process's life.  Nothing is collected
    less: a full collection still runs as often, over fewer objects.  What the
    frozen objects reference is never collected; the collection just before the
    freeze leaves no garbage cycles among them, so this is memory that was alive
    anyway.
``python``
    the collector as Python set it up (or as the user did).
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import sys
import threading

logger = logging.getLogger("cacheaffinity.worker")

MODES = ("auto", "freeze", "python")
#: the last chunk task count (a power of two) after which ``freeze`` freezes again
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
    """The collector policy of one worker process: :meth:`after_chunk` is called by
    every chunk task when it ends (from the task's thread)."""

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
