"""The preloads ``--preload cacheaffinity`` and ``--preload cacheaffinity.preload`` (run in the
scheduler or worker process that loads them).

:data:`command_line_setup` (the package's ``dask_setup``) is a click command taking
``--cache-directory`` and friends; :func:`dask_setup` here takes every setting from the Dask
config and composes with other click preloads (distributed allows one per process). Both run
:func:`setup`. Invalid settings never leave a server running without its plugin (Dask only logs
a failing preload): the server does not start.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import click

from cacheaffinity import config
from cacheaffinity.exceptions import InvalidSetting

__all__ = ["command_line_setup", "dask_setup", "preload_help", "setup"]


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
    """Add cacheaffinity's plugin to ``server``, a :class:`distributed.Scheduler` or a
    :class:`distributed.Worker` (before it registers). Settings left None come from the Dask
    config; invalid ones stop the server; another server raises ``TypeError``.
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
    """A worker plugin whose setup raises ``error``: ``Worker.start`` fails with it."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class Refused(WorkerPlugin):
        name = "cacheaffinity-refused"

        def setup(self, worker):
            raise error

    return Refused()


def refuse(server: Any, error: ValueError) -> None:
    """Stop ``server`` from starting because its cacheaffinity settings are invalid: in a
    ``dask scheduler``/``dask worker`` process, print the one line and exit with status 1 before
    anything listens (unwinding Dask's start-up adds screens of tracebacks); elsewhere, make
    the server's start fail with the error, leaving the process and its event loop alone."""
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
    """In a ``dask`` process (or its nanny's worker), log ``cacheaffinity.*`` at INFO where
    Dask logs, unless the ``cacheaffinity`` logger was configured (``distributed.logging``)."""
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
    """Whether this is a ``dask scheduler``/``dask worker`` process (its click context is current)."""
    import click

    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.command.name in ("scheduler", "worker")


async def dask_setup(server: Any) -> None:
    """``--preload cacheaffinity.preload``: :func:`setup` with every setting from the Dask
    config, composing with other preloads (click-configurable ones included)."""
    await setup(server)


class _Setting(click.ParamType):
    """An option for ``cacheaffinity.<key>``, checked when parsed (a usage error naming both)."""

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


#: Options of command_line_setup that take a value: command-line name -> (keyword, config key).
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
    """Callback of ``split``, run when Dask parses its command line and when the preload runs.

    Dask's parser keeps our first option (with a scheduler file or no address) as its
    scheduler address: at parse time it is taken back into its config key and the process's
    settings are checked (one line, status 1); at run time a leftover value equal to its
    option's config value is dropped, any other stray value refused.
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
    elif isinstance(address, str) and address.startswith("-"):
        # an option neither Dask nor the preload knows (no address is "-..."): Dask's parser
        # took it as the scheduler address; name it as a click parser would
        import difflib

        name = address.split("=", 1)[0]
        raise click.NoSuchOption(name, possibilities=difflib.get_close_matches(name, _VALUED_OPTIONS), ctx=ctx)
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


#: The command that prints the preload's options with their help (``dask worker --help`` cannot:
#: it prints its help before distributed imports the preload modules).
HELP_COMMAND = "cacheaffinity preload-options"


def _option_help(key: str) -> str:
    """An option's help: its role, the schema's description, its config key and default."""
    role = key.split(".", 1)[0]
    described = config._subschema(key)
    text = f"{role}: {described['description'] if described else ''}"
    default = config.default(key)
    suffix = f"; default {default}" if default is not None else ""
    return f"{text} [config cacheaffinity.{key}{suffix}]"


class _PreloadCommand(click.Command):
    """The preload's click command, named in usage errors as ``dask worker --preload
    cacheaffinity`` (distributed's context has no name), listing its options after the usage
    and naming the command that describes them (``cacheaffinity preload-options``). It offers
    no ``--help``: ``dask worker`` takes ``--help`` itself, so no one would see it."""

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
        formatter.write(f"Described by: {HELP_COMMAND}\n")


def preload_help() -> str:
    """The help of ``dask scheduler|worker --preload cacheaffinity``: usage and every option
    (what ``cacheaffinity preload-options`` prints)."""
    ctx = click.Context(command_line_setup, info_name="dask scheduler|worker --preload cacheaffinity")
    formatter = ctx.make_formatter()
    click.Command.format_usage(command_line_setup, ctx, formatter)
    formatter.write_paragraph()
    formatter.write_text(
        "Options of the preload, given after --preload cacheaffinity (dask worker --help "
        "does not list them: Dask prints its help before it imports the preload). Each "
        "takes the place of the Dask config key named in brackets; a scheduler ignores the "
        "worker options and a worker ignores --balance. Example:"
    )
    formatter.write_paragraph()
    formatter.write_text(
        '\b\ndask scheduler --preload cacheaffinity --balance 1.05\n'
        'dask worker tcp://scheduler:8786 --preload cacheaffinity \\\n'
        '    --cache-directory /scratch/$USER/cacheaffinity --cache-capacity "200 GiB"'
    )
    command_line_setup.format_options(ctx, formatter)
    return formatter.getvalue().rstrip("\n")


def _program() -> str:
    """``dask worker``/``dask scheduler`` while its command line is parsed, else both."""
    outer = click.get_current_context(silent=True)
    if outer is not None and outer.command.name in ("worker", "scheduler"):
        return outer.command_path or f"dask {outer.command.name}"
    return "dask scheduler|worker"


@click.command(
    cls=_PreloadCommand,
    context_settings={"ignore_unknown_options": False},
)
@click.option("--cache-directory", default=None, metavar="DIR", help=_option_help("worker.directory"))
@click.option(
    "--cache-capacity", default=None, type=_Setting("worker.capacity"), help=_option_help("worker.capacity")
)
@click.option(
    "--cache-memory", default=None, type=_Setting("worker.memory"), help=_option_help("worker.memory")
)
@click.option(
    "--node-weight", default=None, type=_Setting("worker.weight", float), help=_option_help("worker.weight")
)
@click.option(
    "--cache-shared-group", default=None, metavar="GROUP", help=_option_help("worker.shared-group")
)
@click.option(
    "--balance", default=None, type=_Setting("scheduler.balance", float), help=_option_help("scheduler.balance")
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
    """Preload entry point for ``dask scheduler``/``dask worker --preload cacheaffinity``: adds
    :class:`cacheaffinity.CacheAffinityPlugin` on a scheduler, :class:`cacheaffinity.CacheWorkerPlugin`
    on a worker before it registers. Settings are checked while Dask parses its command line
    (status 1; a bad option value is a usage error, status 2)."""
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


