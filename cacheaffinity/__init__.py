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
  :func:`map_chunks` attach chunk identities; :func:`check`, :func:`where`, :func:`run_stats`.
- :mod:`cacheaffinity.config`: the ``cacheaffinity`` Dask config namespace.

``dask scheduler --preload cacheaffinity`` and ``dask worker --preload
cacheaffinity`` call :func:`dask_setup` here (a click command with
``--cache-directory`` and friends); ``--preload cacheaffinity.preload``
(:mod:`cacheaffinity.preload`) does the same with settings from the Dask config
and composes with other click preloads, e.g. dask-gateway's.
:mod:`cacheaffinity.gateway` configures dask-gateway-managed clusters.
"""

from __future__ import annotations

from cacheaffinity._version import __version__

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
    run_stats,
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


#: Options of :func:`dask_setup` that take a value, by their command-line name.
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
    import sys

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
async def dask_setup(
    server,
    cache_directory=None,
    cache_capacity=None,
    cache_memory=None,
    node_weight=None,
    cache_shared_group=None,
    balance=None,
    split=None,
):
    """Preload entry point for ``dask scheduler``/``dask worker --preload cacheaffinity``.

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
    settings from the Dask config (:mod:`cacheaffinity.preload`).
    """
    from cacheaffinity.preload import setup

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
