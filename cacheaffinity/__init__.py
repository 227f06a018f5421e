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


class _Setting(click.ParamType):
    """An option standing for ``cacheaffinity.<key>``, checked by
    :func:`cacheaffinity.config.check` when the command line is parsed (a usage
    error naming the option, the key, what is allowed and an example)."""

    def __init__(self, key: str, convert=str):
        self.key = key
        self.convert_value = convert
        self.name = "size" if convert is str else convert.__name__

    def convert(self, value, param, ctx):
        if value is None:
            return None
        try:
            out = self.convert_value(value) if isinstance(value, str) else value
        except ValueError:
            out = value  # let the schema say what is allowed
        try:
            config.check(self.key, out)
        except ValueError as e:
            self.fail(str(e).replace("invalid cacheaffinity setting: ", ""), param, ctx)
        return out


#: Options of :func:`dask_setup` that take a value: command-line name -> (keyword, config key).
_VALUED_OPTIONS = {
    "--cache-directory": ("cache_directory", "worker.directory"),
    "--cache-capacity": ("cache_capacity", "worker.capacity"),
    "--cache-memory": ("cache_memory", "worker.memory"),
    "--node-weight": ("node_weight", "worker.weight"),
    "--cache-shared-group": ("cache_shared_group", "worker.shared-group"),
    "--balance": ("balance", "scheduler.balance"),
}


def _is_ours(token) -> bool:
    return isinstance(token, str) and token.split("=", 1)[0] in _VALUED_OPTIONS


def _command_line(ctx, param, values):
    """Check the whole command line of ``dask scheduler``/``dask worker`` while
    Dask parses it, and recover the options its parser took as the address.

    Runs twice: when Dask parses its command line (Dask checks a click
    preload's arguments then), and when the server runs the preload.

    At parse time, in the ``dask`` process:

    * ``dask worker --scheduler-file F --preload cacheaffinity
      --cache-directory=D`` (or ``--cache-directory D``, or without an address
      at all): Dask's parser does not know the option and keeps the first one
      as its positional scheduler address (ignored next to a scheduler file),
      so the preload never sees it.  It is taken back (the address is unset)
      and applied as the config key it stands for
      (``cacheaffinity.worker.directory``), which this process and the worker
      processes of its nannies read;
    * the process's ``cacheaffinity.<scheduler or worker>`` settings (yaml,
      environment, options) are checked with :func:`cacheaffinity.config.settings`:
      an invalid one prints one line and ends the command with status 1
      before anything starts (a bad option value is a usage error, status 2).

    When the preload runs, a value left over by that split (``D`` of
    ``--cache-directory D``) is the value its option now has in the config, and
    is dropped; any other stray value is refused.
    """
    outer = click.get_current_context(silent=True)
    if outer is not None and outer is not ctx and outer.command.name in ("worker", "scheduler"):
        return _parse_time(ctx, outer, list(values))
    out: dict = {}
    for value in values:
        match = None
        for name, key in _VALUED_OPTIONS.values():
            option = next(p for p in ctx.command.params if p.name == name)
            try:
                cast = option.type_cast_value(ctx, value)
            except click.BadParameter:
                continue
            if name not in out and config._raw(key) == cast:
                match = name, cast
                break
        if match is None:
            raise click.UsageError(_stray(value), ctx)
        out[match[0]] = match[1]
    return out


def _stray(value) -> str:
    return (
        f"unexpected argument {value!r} for the cacheaffinity preload; give its options "
        "after --preload cacheaffinity as --cache-directory=DIR or --cache-directory DIR, "
        "and the scheduler address before --preload"
    )


def _parse_time(ctx, outer, values: list) -> dict:
    """:func:`_command_line` while Dask parses its command line (see there)."""
    import sys

    import dask

    recovered: dict = {}
    address = outer.params.get("scheduler")
    if _is_ours(address):
        sub = ctx.command.make_context(
            "dask_setup", [address, *values], parent=None, allow_extra_args=False
        )
        for name, value in sub.params.items():
            if value is not None and name != "split":
                recovered[name] = value
        if sub.params.get("split"):
            raise click.UsageError(_stray(next(iter(sub.params["split"]))), ctx)
        outer.params["scheduler"] = None
    elif values:
        raise click.UsageError(_stray(values[0]), ctx)
    keys = {name: key for name, key in _VALUED_OPTIONS.values()}
    given = {
        name: v
        for name, v in {**ctx.params, **recovered}.items()
        if name in keys and v is not None
    }
    role = outer.command.name
    options = {keys[n].split(".", 1)[1].replace("-", "_"): v for n, v in given.items() if keys[n].startswith(role)}
    try:
        config.settings(role, **options)
    except ValueError as e:
        print(config.refusal(role, e), file=sys.stderr, flush=True)
        ctx.exit(1)
    dask.config.set({f"cacheaffinity.{keys[n]}": v for n, v in recovered.items()})
    return recovered


@click.command(context_settings={"ignore_unknown_options": False})
@click.option("--cache-directory", default=None, help="worker: cacheaffinity.worker.directory")
@click.option(
    "--cache-capacity",
    default=None,
    type=_Setting("worker.capacity"),
    help='worker: cacheaffinity.worker.capacity, e.g. "200 GiB"',
)
@click.option(
    "--cache-memory", default=None, type=_Setting("worker.memory"), help="worker: cacheaffinity.worker.memory"
)
@click.option(
    "--node-weight", default=None, type=_Setting("worker.weight", float), help="worker: cacheaffinity.worker.weight"
)
@click.option(
    "--cache-shared-group", default=None, help="worker: cacheaffinity.worker.shared-group"
)
@click.option(
    "--balance", default=None, type=_Setting("scheduler.balance", float), help="scheduler: cacheaffinity.scheduler.balance"
)
@click.argument("split", nargs=-1, callback=_command_line, metavar="")
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

    A scheduler or worker whose cacheaffinity settings are invalid does not
    start (Dask only logs a failing preload): the command line and the process's
    config section are checked while Dask parses its command line (one line,
    status 1; a bad option value is a usage error, status 2), and what can only
    be checked on the worker is refused by :func:`cacheaffinity.preload.refuse`.
    Options Dask's parser took as its scheduler address are recovered (see
    :func:`_command_line`).

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
