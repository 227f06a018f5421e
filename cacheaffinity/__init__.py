"""cacheaffinity: cache-affine chunk placement and node-local column caches for Dask.

Each chunk runs on the same cache node every time, so that node's local disk serves its
decompressed columns. The names most users need are here; the public modules, by process:

- :mod:`cacheaffinity.placement` (anywhere, pure math): :class:`TorusPlacement`.
- :mod:`cacheaffinity.scheduler`: :class:`CacheAffinityPlugin`, :class:`LocalityStealing`.
- :mod:`cacheaffinity.worker`: :class:`CacheWorkerPlugin`, :class:`ColumnCache`, :class:`MemoryFront`,
  and the store contract :class:`ColumnStore` (:class:`Pack`).
- :mod:`cacheaffinity.coffea` (client and workers): :class:`CacheAffinityExecutor`, :func:`cachestrategy`.
- :mod:`cacheaffinity.client`: chunk identities (:func:`chunk`, :func:`map_chunks` ...) and
  queries (:func:`check`, :func:`where`, :func:`run_stats`, :func:`cache_stats` ...).
- :mod:`cacheaffinity.preload` (scheduler and workers): ``--preload cacheaffinity`` runs :data:`dask_setup`.
- :mod:`cacheaffinity.config`, :mod:`cacheaffinity.filesystems`, :mod:`cacheaffinity.jobqueue`,
  :mod:`cacheaffinity.gateway`, :mod:`cacheaffinity.cli` (the ``cacheaffinity`` command).
"""

from __future__ import annotations

from cacheaffinity import config
from cacheaffinity._version import __version__
from cacheaffinity.client import (
    ChunkIds,
    cache_stats,
    cache_totals,
    check,
    chunk,
    chunks,
    forecast,
    map_chunks,
    run_stats,
    where,
)
# imports neither coffea nor uproot (cacheaffinity.coffea imports them on first use)
from cacheaffinity.coffea._buffer_cache import cachestrategy
from cacheaffinity.placement import TorusPlacement
# ``--preload cacheaffinity`` runs dask_setup; distributed passes options only to a click command
from cacheaffinity.preload import command_line_setup as dask_setup
from cacheaffinity.protocol import ANNOTATION, PLUGIN_NAME
from cacheaffinity.scheduler import CacheAffinityPlugin, LocalityStealing
from cacheaffinity.worker._plugin import CacheWorkerPlugin, worker_cache
from cacheaffinity.worker._store import ColumnCache, ColumnStore, MemoryFront, Pack

__all__ = [
    "ANNOTATION",
    "PLUGIN_NAME",
    "CacheAffinityExecutor",
    "CacheAffinityPlugin",
    "CacheWorkerPlugin",
    "ChunkIds",
    "ColumnCache",
    "ColumnStore",
    "LocalityStealing",
    "MemoryFront",
    "Pack",
    "TorusPlacement",
    "cache_stats",
    "cache_totals",
    "cachestrategy",
    "check",
    "chunk",
    "chunks",
    "config",
    "dask_setup",
    "forecast",
    "map_chunks",
    "run_stats",
    "where",
    "worker_cache",
]


def __getattr__(name):
    # coffea is heavy to import and only the client needs the executor.
    if name == "CacheAffinityExecutor":
        from cacheaffinity.coffea import CacheAffinityExecutor

        return CacheAffinityExecutor
    raise AttributeError(f"module 'cacheaffinity' has no attribute {name!r}")
