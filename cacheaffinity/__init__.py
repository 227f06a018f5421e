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
from cacheaffinity.protocol import ANNOTATION, PLUGIN_NAME

# The other names are imported on first use (PEP 562): the ``cacheaffinity`` command and a
# worker's store need neither distributed's client, coffea nor scipy, whose imports take
# seconds (``cacheaffinity cache info`` on a node answers without them).
_LAZY = {
    "ChunkIds": "cacheaffinity.client",
    "cache_stats": "cacheaffinity.client",
    "cache_totals": "cacheaffinity.client",
    "check": "cacheaffinity.client",
    "chunk": "cacheaffinity.client",
    "chunks": "cacheaffinity.client",
    "forecast": "cacheaffinity.client",
    "map_chunks": "cacheaffinity.client",
    "run_stats": "cacheaffinity.client",
    "where": "cacheaffinity.client",
    "cachestrategy": "cacheaffinity.coffea._buffer_cache",
    "CacheAffinityExecutor": "cacheaffinity.coffea",
    "TorusPlacement": "cacheaffinity.placement",
    "dask_setup": "cacheaffinity.preload:command_line_setup",
    "CacheAffinityPlugin": "cacheaffinity.scheduler",
    "LocalityStealing": "cacheaffinity.scheduler",
    "CacheWorkerPlugin": "cacheaffinity.worker._plugin",
    "worker_cache": "cacheaffinity.worker._plugin",
    "ColumnCache": "cacheaffinity.worker._store",
    "ColumnStore": "cacheaffinity.worker._store",
    "MemoryFront": "cacheaffinity.worker._store",
    "Pack": "cacheaffinity.worker._store",
}

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


def __getattr__(name: str):
    import importlib

    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'cacheaffinity' has no attribute {name!r}")
    module, _, attr = where.partition(":")
    value = getattr(importlib.import_module(module), attr or name)
    globals()[name] = value  # once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
