"""The click-free preload: ``--preload cacheaffinity.preload``.

Runs in the **scheduler** or **worker** process that loads it.  Distributed
accepts only one click-configurable preload per process ("Multiple --preload
modules with click-configurable setup"), and :func:`cacheaffinity.dask_setup`
is one (it takes ``--cache-directory`` and friends).  A site whose scheduler
already has a click preload (dask-gateway adds ``dask_gateway.scheduler_preload``
to every scheduler it starts) loads this module instead: its :func:`dask_setup`
is a plain coroutine function, so it composes with any other preload, and it
takes every setting from the Dask config (``cacheaffinity.*``; in the
environment ``DASK_CACHEAFFINITY__WORKER__DIRECTORY=/scratch/cache`` and so on).

Both entry points share :func:`setup`, so they do the same thing:

* on a scheduler, add :class:`~cacheaffinity.scheduler.CacheAffinityPlugin`
  (and with it the dashboard page);
* on a worker, add :class:`~cacheaffinity.worker.CacheWorkerPlugin` before the
  worker registers; invalid settings stop the worker (``SystemExit(1)``) instead
  of letting it run uncached, because Dask only logs a failing preload.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

__all__ = ["dask_setup", "setup"]


async def setup(
    server: Any,
    *,
    cache_directory: str | None = None,
    cache_capacity: Any = None,
    cache_memory: Any = None,
    node_weight: float | None = None,
    cache_shared_group: Any = None,
    balance: float | None = None,
) -> None:
    """Add cacheaffinity's plugin to a Dask scheduler or worker.

    Parameters
    ----------
    server : distributed.Scheduler or distributed.Worker
        The process's server, as a preload receives it.
    cache_directory, cache_capacity, cache_memory, node_weight, cache_shared_group
        Worker settings; None reads ``cacheaffinity.worker.*`` on the worker.
    balance
        Scheduler setting; None reads ``cacheaffinity.scheduler.balance``.

    Raises
    ------
    SystemExit
        On a worker whose settings are invalid (logged with key, value and a fix).
    TypeError
        If ``server`` is neither a scheduler nor a worker.
    """
    from distributed import Scheduler, Worker

    from cacheaffinity.scheduler import CacheAffinityPlugin
    from cacheaffinity.worker import CacheWorkerPlugin

    if isinstance(server, Scheduler):
        plugin = CacheAffinityPlugin(balance=balance)
        if server.status.name == "running":
            await server.register_scheduler_plugin(plugin, idempotent=True)
        else:  # the scheduler starts its plugins right after its preloads
            server.add_plugin(plugin, idempotent=True)
    elif isinstance(server, Worker):
        try:
            await server.plugin_add(
                CacheWorkerPlugin(
                    directory=cache_directory,
                    capacity=cache_capacity,
                    memory=cache_memory,
                    weight=node_weight,
                    shared_group=cache_shared_group,
                ),
                catch_errors=False,
            )
        except ValueError as e:
            message = f"cacheaffinity: worker not started: {e}"
            logging.getLogger("cacheaffinity.worker").critical(message)
            print(message, file=sys.stderr, flush=True)
            raise SystemExit(1) from e
    else:
        raise TypeError(
            f"cacheaffinity preload runs in a Dask scheduler or worker, not {type(server).__name__}"
        )


async def dask_setup(server: Any) -> None:
    """Preload entry point without command-line options (settings from the Dask config).

    ``dask scheduler --preload cacheaffinity.preload`` and ``dask worker
    --preload cacheaffinity.preload``; also ``distributed.scheduler.preload`` /
    ``distributed.worker.preload`` in the Dask config.  Composes with other
    preloads, click-configurable ones included.
    """
    await setup(server)
