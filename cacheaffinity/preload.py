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
* on a worker, add :class:`~cacheaffinity.worker._plugin.CacheWorkerPlugin` before the
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

import click

from cacheaffinity import config
from cacheaffinity.exceptions import InvalidSetting

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
    TypeError
        If ``server`` is neither a scheduler nor a worker.

    Notes
    -----
    Invalid settings (checked by :func:`cacheaffinity.config.settings`) never
    leave a server running without its plugin: see :func:`refuse`.
    """
    from distributed import Scheduler, Worker

    from cacheaffinity.scheduler import CacheAffinityPlugin
    from cacheaffinity.worker._plugin import CacheWorkerPlugin

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
    from cacheaffinity.scheduler._distributed import fail_worker_start

    if role == "worker" and fail_worker_start(server, _refused(refused)):
        return  # a worker: its start fails with the error
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
        except InvalidSetting as e:
            self.fail(e.detail, param, ctx)
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


class _PreloadCommand(click.Command):
    """The preload's click command, named in its errors as the program that parses it.

    Distributed parses a click preload's arguments in a context of its own making,
    without a name (``click.Context(command)`` while it parses its command line;
    ``"dask_setup"`` when the server runs the preload), so a usage error read
    ``Usage:  [OPTIONS]`` and ``Try ' --help'``.  Here the context gets the command
    line's name, ``dask worker --preload cacheaffinity`` (or ``dask scheduler ...``),
    and a line after the usage lists the options.  There is no ``Try '... --help'`` line:
    ``--help`` after ``--preload cacheaffinity`` is taken by ``dask worker`` itself,
    so no command shows this help.
    """

    def parse_args(self, ctx: click.Context, args: list) -> list:
        if not ctx.info_name or ctx.info_name == "dask_setup":
            ctx.info_name = f"{_program()} --preload cacheaffinity"
        return super().parse_args(ctx, args)

    def get_help_option(self, ctx: click.Context):
        return None

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_usage(ctx, formatter)
        names = [p.opts[0] for p in self.params if isinstance(p, click.Option)]
        formatter.write(f"Options: {' '.join(names)}\n")


def _program() -> str:
    """``dask worker``/``dask scheduler``: the command line being parsed (its click
    context is current then), else the process's role when known, else both."""
    outer = click.get_current_context(silent=True)
    if outer is not None and outer.command.name in ("worker", "scheduler"):
        return outer.command_path or f"dask {outer.command.name}"
    return "dask scheduler|worker"


@click.command(
    cls=_PreloadCommand,
    context_settings={"ignore_unknown_options": False},
)
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
    """Preload entry point for ``dask scheduler``/``dask worker --preload cacheaffinity``.

    On a scheduler, adds :class:`CacheAffinityPlugin`; on a worker, adds
    :class:`CacheWorkerPlugin` before the worker registers, so its cache node is
    known from the first placement on.

    A scheduler or worker whose cacheaffinity settings are invalid does not
    start (Dask only logs a failing preload): the command line and the process's
    config section are checked while Dask parses its command line (one line,
    status 1; a bad option value is a usage error, status 2), and what can only
    be checked on the worker is refused by :func:`refuse`.
    Options Dask's parser took as its scheduler address are recovered (see
    :func:`_command_line`).

    This is a click command, and distributed allows only one click-configurable
    preload per process: next to another one (dask-gateway's scheduler preload,
    for instance) use ``--preload cacheaffinity.preload``, which takes its
    settings from the Dask config (:mod:`cacheaffinity.preload`).
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


