"""cacheaffinity: cache-affine chunk placement and node-local column caches for Dask.

Repeated analyses over the same data run fast when every chunk is processed on
the same node every time, so that node's local disk can serve the chunk's
decompressed columns.  The package is laid out by the process each part runs in:

- :mod:`cacheaffinity.placement` (anywhere; pure math): :class:`TorusPlacement`
  hashes chunks and weighted, replicated cache nodes onto a periodic
  N-dimensional torus and assigns each chunk to the nearest node (L1).
- :mod:`cacheaffinity.scheduler` (scheduler): :class:`CacheAffinityPlugin` places
  chunk tasks on their cache node; :class:`LocalityStealing` throttles stealing.
- :mod:`cacheaffinity.worker` (workers): :class:`ColumnCache` on local disk,
  :class:`CacheWorkerPlugin`, the coffea hook :func:`cachestrategy`.
- :mod:`cacheaffinity.coffea` (client and workers): :class:`CacheAffinityExecutor`
  for coffea's ``Runner`` and the only code that knows coffea internals.
- :mod:`cacheaffinity.client` (client): :func:`chunk`, :func:`chunks`,
  :func:`map_chunks` attach chunk identities; :func:`check`, :func:`where`.
- :mod:`cacheaffinity.config`: the ``cacheaffinity`` Dask config namespace.

``dask scheduler --preload cacheaffinity`` and ``dask worker --preload
cacheaffinity`` call :func:`dask_setup` here.
"""

from __future__ import annotations

__version__ = "0.1.0"

import click

from cacheaffinity import config
from cacheaffinity.client import (
    ChunkIds,
    cache_stats,
    cache_totals,
    check,
    chunk,
    chunks,
    map_chunks,
    where,
)
from cacheaffinity.placement import TorusPlacement
from cacheaffinity.protocol import ANNOTATION, PLUGIN_NAME
from cacheaffinity.scheduler import CacheAffinityPlugin, LocalityStealing
from cacheaffinity.worker import (
    CacheWorkerPlugin,
    ColumnCache,
    MemoryFront,
    cachestrategy,
    worker_cache,
)

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
    "map_chunks",
    "where",
    "worker_cache",
]


def __getattr__(name):
    # coffea is heavy to import and only the client needs the executor.
    if name == "CacheAffinityExecutor":
        from cacheaffinity.coffea import CacheAffinityExecutor

        return CacheAffinityExecutor
    raise AttributeError(f"module 'cacheaffinity' has no attribute {name!r}")


@click.command(context_settings={"ignore_unknown_options": False})
@click.option("--cache-directory", default=None, help="worker: cacheaffinity.worker.directory")
@click.option("--cache-capacity", default=None, help='worker: cacheaffinity.worker.capacity, e.g. "200 GiB"')
@click.option("--cache-memory", default=None, help="worker: cacheaffinity.worker.memory")
@click.option("--node-weight", default=None, type=float, help="worker: cacheaffinity.worker.weight")
@click.option("--balance", default=None, type=float, help="scheduler: cacheaffinity.scheduler.balance")
async def dask_setup(
    server,
    cache_directory=None,
    cache_capacity=None,
    cache_memory=None,
    node_weight=None,
    balance=None,
):
    """Preload entry point for ``dask scheduler``/``dask worker --preload cacheaffinity``.

    On a scheduler, adds :class:`CacheAffinityPlugin`; on a worker, adds
    :class:`CacheWorkerPlugin` before the worker registers, so its cache node is
    known from the first placement on.
    """
    from distributed import Scheduler, Worker

    if isinstance(server, Scheduler):
        plugin = CacheAffinityPlugin(balance=balance)
        if server.status.name == "running":
            await server.register_scheduler_plugin(plugin, idempotent=True)
        else:  # the scheduler starts its plugins right after its preloads
            server.add_plugin(plugin, idempotent=True)
    elif isinstance(server, Worker):
        await server.plugin_add(
            CacheWorkerPlugin(
                directory=cache_directory,
                capacity=cache_capacity,
                memory=cache_memory,
                weight=node_weight,
            ),
            catch_errors=False,
        )
    else:
        raise TypeError(
            f"cacheaffinity preload runs in a Dask scheduler or worker, not {type(server).__name__}"
        )
