"""The preloads of ``dask scheduler``/``dask worker``: ``--preload cacheaffinity``
and ``--preload cacheaffinity.preload``.

Runs in the **scheduler** or **worker** process that loads it.  Two entry points:

* :func:`command_line_setup`, a click command with ``--cache-directory`` and
  friends: what ``--preload cacheaffinity`` runs (the package's
  ``dask_setup`` is this command);
* :func:`dask_setup` of this module, ``--preload cacheaffinity.preload``: a
  plain coroutine function taking every setting from the Dask config
  (``cacheaffinity.*``; in the environment
  ``DASK_CACHEAFFINITY__WORKER__DIRECTORY=/scratch/cache`` and so on).
  Distributed accepts only one click-configurable preload per process
  ("Multiple --preload modules with click-configurable setup"); a site whose
  scheduler already has one (dask-gateway adds ``dask_gateway.scheduler_preload``
  to every scheduler it starts) loads this one, which composes with any other.

Both share :func:`setup`, so they do the same thing:

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

import click

from cacheaffinity import config

__all__ = ["command_line_setup", "dask_setup", "setup"]


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


class _Size(click.ParamType):
    """A size option (``"200 GiB"`` or bytes), checked when the command line is parsed."""

    name = "size"

    def __init__(self, key: str):
        self.key = key

    def convert(self, value, param, ctx):
        if value is None:
            return None
        try:
            config.check(self.key, value)
        except ValueError as e:
            self.fail(str(e).replace("invalid cacheaffinity setting: ", ""), param, ctx)
        return value


#: Options of :func:`command_line_setup` that take a value, by their command-line name.
_VALUED_OPTIONS = {
    "--cache-directory": "cache_directory",
    "--cache-capacity": "cache_capacity",
    "--cache-memory": "cache_memory",
    "--node-weight": "node_weight",
    "--cache-shared-group": "cache_shared_group",
    "--balance": "balance",
}


def _split_values(ctx, param, values):
    """Recover ``--cache-directory DIR`` when Dask's command line split it.

    ``dask worker --scheduler-file F --preload cacheaffinity --cache-directory DIR``:
    Dask's own parser does not know ``--cache-directory``, keeps it as its
    positional scheduler address (ignored when a scheduler file is given) and
    hands only ``DIR`` to the preload.  The process's command line still has
    the pair (a worker started by a nanny inherits it), so each stray value is
    matched with the option that precedes it there.
    """
    if not values:
        return {}
    argv = list(sys.argv)
    pairs = [
        (argv[i], argv[i + 1])
        for i in range(len(argv) - 1)
        if argv[i] in _VALUED_OPTIONS
    ]
    out: dict[str, str] = {}
    for value in values:
        match = next(
            (opt for opt, v in pairs if v == value and _VALUED_OPTIONS[opt] not in out), None
        )
        if match is None:
            raise click.UsageError(
                f"unexpected argument {value!r} for the cacheaffinity preload; give its "
                "options as --cache-directory=DIR (or put the scheduler address before "
                "--preload cacheaffinity)",
                ctx,
            )
        name = _VALUED_OPTIONS[match]
        option = next(p for p in ctx.command.params if p.name == name)
        out[name] = option.type_cast_value(ctx, value)  # checked like --option=value
    return out


@click.command(context_settings={"ignore_unknown_options": False})
@click.option("--cache-directory", default=None, help="worker: cacheaffinity.worker.directory")
@click.option(
    "--cache-capacity",
    default=None,
    type=_Size("worker.capacity"),
    help='worker: cacheaffinity.worker.capacity, e.g. "200 GiB"',
)
@click.option(
    "--cache-memory", default=None, type=_Size("worker.memory"), help="worker: cacheaffinity.worker.memory"
)
@click.option("--node-weight", default=None, type=float, help="worker: cacheaffinity.worker.weight")
@click.option(
    "--cache-shared-group", default=None, help="worker: cacheaffinity.worker.shared-group"
)
@click.option("--balance", default=None, type=float, help="scheduler: cacheaffinity.scheduler.balance")
@click.argument("split", nargs=-1, callback=_split_values, metavar="")
async def command_line_setup(
    server,
    cache_directory=None,
    cache_capacity=None,
    cache_memory=None,
    node_weight=None,
    cache_shared_group=None,
    balance=None,
    split=None,
):
    """Preload with options: ``dask scheduler``/``dask worker --preload cacheaffinity``.

    On a scheduler, adds :class:`CacheAffinityPlugin`; on a worker, adds
    :class:`CacheWorkerPlugin` before the worker registers, so its cache node is
    known from the first placement on.

    A worker whose cacheaffinity settings are invalid does not start: Dask
    only logs a failing preload, so this logs the error (key, value, example)
    and raises ``SystemExit(1)``, which stops ``dask worker`` (with or without a
    nanny) with a non-zero exit status instead of running uncached.

    This is a click command, and distributed allows only one click-configurable
    preload per process: next to another one (dask-gateway's scheduler preload,
    for instance) use ``--preload cacheaffinity.preload``, which takes its
    settings from the Dask config (:func:`dask_setup`).
    """
    options = dict(
        cache_directory=cache_directory,
        cache_capacity=cache_capacity,
        cache_memory=cache_memory,
        node_weight=node_weight,
        cache_shared_group=cache_shared_group,
        balance=balance,
    )
    options.update(split or {})
    await setup(server, **options)
