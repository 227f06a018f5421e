"""cacheaffinity: cache-affine chunk placement and node-local column caches for Dask.

Repeated analyses over the same data run fast when every chunk is processed on
the same node every time, so that node's local disk can serve the chunk's
decompressed columns.  The package is laid out by the process each part runs in:

- :mod:`cacheaffinity.placement` (anywhere; pure math): :class:`TorusPlacement`
  hashes chunks and weighted, replicated cache nodes onto a periodic
  N-dimensional torus and assigns each chunk to the nearest node (L1).
- :mod:`cacheaffinity.scheduler` (scheduler): :class:`CacheAffinityPlugin` places
  chunk tasks on their cache node; :class:`LocalityStealing` throttles stealing
  (:mod:`cacheaffinity.scheduler._stealing`).
- :mod:`cacheaffinity.worker` (workers): :class:`ColumnCache` on local disk,
  :class:`CacheWorkerPlugin`.
- :mod:`cacheaffinity.coffea` (client and workers): :class:`CacheAffinityExecutor`
  for coffea's ``Runner``, the hook :func:`cachestrategy` for coffea's own
  executors, and the only code that knows coffea internals.
- :mod:`cacheaffinity.client` (client): :func:`chunk`, :func:`chunks`,
  :func:`map_chunks` attach chunk identities; :func:`check`, :func:`where`, :func:`run_stats`, :func:`forecast`.
- :mod:`cacheaffinity.config`: the ``cacheaffinity`` Dask config namespace.
- :mod:`cacheaffinity.filesystems` (anywhere): :func:`filesystem_of`, whether a
  cache directory is on a file system shared between machines.

- :mod:`cacheaffinity.preload` (scheduler and workers): the preloads.
  ``dask scheduler --preload cacheaffinity`` and ``dask worker --preload
  cacheaffinity`` run :data:`dask_setup` here, which is
  :func:`cacheaffinity.preload.command_line_setup` (a click command with
  ``--cache-directory`` and friends); ``--preload cacheaffinity.preload`` does
  the same with settings from the Dask config and composes with other click
  preloads, e.g. dask-gateway's.
- :mod:`cacheaffinity.gateway` configures dask-gateway-managed clusters,
  :mod:`cacheaffinity.jobqueue` dask-jobqueue ones; :mod:`cacheaffinity.cli` is
  the ``cacheaffinity`` command.
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
# what ``--preload cacheaffinity`` runs: distributed looks up ``dask_setup`` in the
# module it is named and passes command-line options only to a click command
from cacheaffinity.preload import command_line_setup as dask_setup
from cacheaffinity.protocol import ANNOTATION, PLUGIN_NAME
from cacheaffinity.scheduler import CacheAffinityPlugin, LocalityStealing
from cacheaffinity.worker._plugin import CacheWorkerPlugin, worker_cache
from cacheaffinity.worker._store import ColumnCache, MemoryFront

__all__ = [
    "ANNOTATION",
    "PLUGIN_NAME",
    "CacheAffinityExecutor",
    "CacheAffinityPlugin",
    "CacheWorkerPlugin",
    "ChunkIds",
    "ColumnCache",
    "LocalityStealing",
    "MemoryFront",
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
