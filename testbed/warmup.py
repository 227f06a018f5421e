"""Warm a fresh worker process before the first measured run (runs in workers).

A physicist's cluster has run Python before the analysis; a fresh worker process has not,
and its first run would also pay its first imports and first calls (2-6 s per cluster of 4
workers here).  :func:`warm_up` runs the processor once on a few events of a file that is
not part of the measured dataset (the generator's template), with buffers in a throw-away
dict: no column cache is touched.  The benchmarks and the cluster box both use it.
"""

from __future__ import annotations

import time


def events_of(f, filename: str, treename: str, start: int, stop: int, dataset: str, buffers: dict):
    """NanoAOD events of entries ``start``-``stop`` of the open file ``f`` (virtual mode,
    buffers in ``buffers``), with the metadata coffea's executors give a processor."""
    from coffea.nanoevents import NanoAODSchema, NanoEventsFactory

    return NanoEventsFactory.from_root(
        file=f, treepath=treename, schemaclass=NanoAODSchema, mode="virtual",
        metadata={"dataset": dataset, "filename": filename, "treename": treename,
                  "entrystart": start, "entrystop": stop},
        entry_start=start, entry_stop=stop, buffer_cache=buffers,
    ).events()  # fmt: skip


def warm_up(filename: str, processor_instance, events: int = 200) -> dict:
    """Run ``processor_instance`` once on the first ``events`` events of ``filename``."""
    import uproot

    t0 = time.perf_counter()
    with uproot.open(filename) as f:
        n = min(events, f["Events"].num_entries)
        processor_instance.process(events_of(f, filename, "Events", 0, n, "warm-up", {}))
    return {"seconds": time.perf_counter() - t0, "events": n}
