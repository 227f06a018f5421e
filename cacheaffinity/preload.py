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
  worker registers;
* invalid settings never leave a server running without its plugin (Dask only
  logs a failing preload): :func:`refuse` ends a ``dask`` process with one
  line and status 1, and makes an in-process worker's start fail.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from cacheaffinity import config

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
    TypeError
        If ``server`` is neither a scheduler nor a worker.

    Notes
    -----
    Invalid settings (checked by :func:`cacheaffinity.config.settings`) never
    leave a server running without its plugin: see :func:`refuse`.
    """
    from distributed import Scheduler, Worker

    from cacheaffinity.scheduler import CacheAffinityPlugin
    from cacheaffinity.worker import CacheWorkerPlugin

    _log_like_distributed()
    if isinstance(server, Scheduler):
        try:
            plugin = CacheAffinityPlugin(balance=balance)
        except ValueError as e:
            refuse(server, e)
            return
        if server.status.name == "running":
            await server.register_scheduler_plugin(plugin, idempotent=True)
        else:  # the scheduler starts its plugins right after its preloads
            server.add_plugin(plugin, idempotent=True)
    elif isinstance(server, Worker):
        plugin = CacheWorkerPlugin(
            directory=cache_directory,
            capacity=cache_capacity,
            memory=cache_memory,
            weight=node_weight,
            shared_group=cache_shared_group,
        )
        try:
            plugin.validate(server)  # before Dask's plugin_add, which logs a traceback
        except ValueError as e:
            refuse(server, e)
            return
        await server.plugin_add(plugin, catch_errors=False)
    else:
        raise TypeError(
            f"cacheaffinity preload runs in a Dask scheduler or worker, not {type(server).__name__}"
        )


def _refused(error: ValueError):
    """A worker plugin whose setup raises ``error``: added to the worker's
    start-up plugins, it makes ``Worker.start`` fail with it."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class Refused(WorkerPlugin):
        name = "cacheaffinity-refused"

        def setup(self, worker):
            raise error

    return Refused()


def refuse(server: Any, error: ValueError) -> None:
    """Stop ``server`` from starting because its cacheaffinity settings are invalid.

    Dask only logs a failing preload and starts the server anyway, so:

    * in a process started by ``dask scheduler``/``dask worker`` (no nanny),
      print the one line (:func:`cacheaffinity.config.refusal`) to stderr and
      end the process with status 1 at once: nothing has started yet (preloads
      run before a server listens or registers), and unwinding Dask's start-up
      would add screens of tracebacks to the one line;
    * anywhere else (an in-process cluster, a worker process of a nanny), make
      the server's start fail with the error, which reaches the caller (an
      in-process ``LocalCluster`` raises ``RuntimeError("Worker failed to
      start.")`` caused by it) without touching the process or its event loop.
    """
    role = type(server).__name__.lower()
    role = "scheduler" if "scheduler" in role else "worker"
    line = config.refusal(role, error)
    if _command_line_process():
        print(line, file=sys.stderr, flush=True)
        logging.shutdown()  # flush the log handlers, nothing else will
        os._exit(1)
    refused = ValueError(line)
    if hasattr(server, "_pending_plugins"):  # a worker: fail its start with the error
        server._pending_plugins = (*server._pending_plugins, _refused(refused))
        return
    raise refused  # a scheduler: Dask logs it; cacheaffinity.check refuses such a scheduler


def _log_like_distributed() -> None:
    """In a ``dask scheduler``/``dask worker`` process (or a worker process of
    its nanny), log ``cacheaffinity.*`` at INFO where Dask logs, unless the
    ``cacheaffinity`` logger was configured (``distributed.logging``)."""
    import multiprocessing

    ours = logging.getLogger("cacheaffinity")
    theirs = logging.getLogger("distributed")
    nanny_child = multiprocessing.current_process().name.startswith("Dask Worker process")
    if ours.handlers or ours.level != logging.NOTSET or not theirs.handlers:
        return
    if _command_line_process() or nanny_child:
        for handler in theirs.handlers:
            ours.addHandler(handler)
        ours.setLevel(logging.INFO)
        ours.propagate = False


def _command_line_process() -> bool:
    """Whether this process is ``dask scheduler``/``dask worker`` itself (the
    command's click context is current while its server runs)."""
    import click

    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.command.name in ("scheduler", "worker")


async def dask_setup(server: Any) -> None:
    """Preload entry point without command-line options (settings from the Dask config).

    ``dask scheduler --preload cacheaffinity.preload`` and ``dask worker
    --preload cacheaffinity.preload``; also ``distributed.scheduler.preload`` /
    ``distributed.worker.preload`` in the Dask config.  Composes with other
    preloads, click-configurable ones included.
    """
    await setup(server)
