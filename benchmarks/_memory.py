"""Worker-memory buffer store for the ``coffea-in-memory`` floor (b) of the benchmarks
(runs in workers).

``Runner(cachestrategy=memory_buffers)`` keeps every column buffer in a plain dict of
the worker process, so a second run finds all data already in memory: what such a run
costs is the analysis plus the coffea/NanoEvents pipeline (chunk tasks, NanoEvents built
per chunk) and Dask overhead: what a perfect in-memory column cache would give.  It is
not the compute floor: that is ``processor-only`` (:mod:`benchmarks._floor`).
Benchmarks only: nothing bounds its size.
"""

_BUFFERS: dict = {}


def memory_buffers() -> dict:
    return _BUFFERS
