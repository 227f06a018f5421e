"""Worker-side store of fully loaded events for the compute-only floor (runs in workers).

The true floor of a warm run is the processor's own compute on events whose arrays are
already in the worker's memory: no file, no column cache, no NanoEvents form building.
:func:`load` (one task per chunk, pinned to a worker) opens the chunk's file once, builds
its NanoEvents with every buffer the processor reads in a plain dict, runs the processor
once to materialise them, closes the file and keeps the events in :data:`_EVENTS`;
:func:`process` (pinned to the same worker) then times only ``processor.process(events)``.
A buffer missing after the load would need the closed file and fail: the floor cannot
silently read storage.  Benchmarks only: nothing bounds the store's size.
"""

from __future__ import annotations

import time
from typing import Any

from testbed.warmup import events_of as _events
from testbed.warmup import warm_up

__all__ = ["clear", "io_read_bytes", "load", "process", "warm_up"]

_EVENTS: dict[str, Any] = {}




def load(key: str, filename: str, treename: str, start: int, stop: int, dataset: str,
         processor_instance) -> dict:
    """Load chunk ``key`` (entries ``start``-``stop`` of ``filename``) into this worker."""
    import uproot

    t0 = time.perf_counter()
    buffers: dict = {}
    f = uproot.open(filename)
    try:
        events = _events(f, filename, treename, start, stop, dataset, buffers)
        processor_instance.process(events)  # materialise every buffer the processor reads
    finally:
        f.close()
    _EVENTS[key] = events
    return {
        "key": key,
        "seconds": time.perf_counter() - t0,
        "buffers": len(buffers),
        "bytes": int(sum(getattr(b, "nbytes", 0) for b in buffers.values())),
    }


def process(key: str, processor_instance) -> dict:
    """``processor_instance.process`` on the events of chunk ``key``, timed."""
    events = _EVENTS[key]
    t0 = time.perf_counter()
    out = processor_instance.process(events)
    return {"out": out, "seconds": time.perf_counter() - t0}


def io_read_bytes() -> int | None:
    """Bytes this process has had fetched from block storage so far (``read_bytes`` of
    ``/proc/self/io``: reads the page cache did not serve), or None where the kernel does
    not report it."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def clear() -> int:
    """Drop every loaded chunk; returns how many there were."""
    n = len(_EVENTS)
    _EVENTS.clear()
    return n


