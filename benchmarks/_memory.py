"""Worker-memory buffer store for the "floor" of benchmarks (runs in workers).

``Runner(cachestrategy=memory_buffers)`` keeps every column buffer in a plain dict of
the worker process, so a second run finds all data already in memory: what such a run
costs is the analysis itself plus coffea and Dask overhead, the floor a disk cache is
measured against.  Benchmarks only: nothing bounds its size.
"""

_BUFFERS: dict = {}


def memory_buffers() -> dict:
    return _BUFFERS
