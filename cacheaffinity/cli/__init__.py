"""The ``cacheaffinity`` command line (entry point ``cacheaffinity.cli:main``), run by an operator.

``cacheaffinity cache info|verify|clear [DIR]`` run on a cache node and open its
directory directly (safe while workers use it; the node id is never touched);
``cacheaffinity preload-options`` lists the options of ``dask scheduler|worker --preload
cacheaffinity`` (which ``dask worker --help`` cannot show);
``cacheaffinity where|check|stats SCHEDULER`` ask the scheduler plugin from
anywhere a Dask client reaches it and give up after ``--timeout``, whatever
answers at the address.

Exit status: 0 on success; 1 when ``cache verify`` removed corrupt entries, a
confirmation was declined or could not be asked (no terminal, no ``--yes``), or
``check`` found nodes that cache nothing; 2 for usage errors, a path that is not
a cache directory or cannot be trusted, read or (``verify``, ``clear``) written,
a damaged index (without ``--repair``), and a scheduler that cannot be reached
or has no plugin.  Every error is one line (``Error: ...``) on stderr, never a
traceback.
"""

from __future__ import annotations

import logging
import sqlite3
import sys

import click

from cacheaffinity import __version__
from cacheaffinity.cli._common import CommandError, logger
from cacheaffinity.cli._cache_dir import cache
from cacheaffinity.cli._scheduler import check, stats, where

__all__ = ["CommandError", "cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cacheaffinity")
def cli() -> None:
    """Inspect and maintain cacheaffinity cache directories; ask where chunks go."""


@click.command("preload-options", short_help="The options of --preload cacheaffinity.")
def preload_options() -> None:
    """Options of dask scheduler|worker --preload cacheaffinity (--cache-directory, ...)."""
    from cacheaffinity.preload import preload_help

    click.echo(preload_help())


for _command in (cache, where, check, stats, preload_options):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    """Run the command line (``argv`` defaults to ``sys.argv[1:]``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    try:
        status = cli.main(args=argv, prog_name="cacheaffinity", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted!", err=True)
        sys.exit(1)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except (OSError, sqlite3.Error, ValueError) as e:
        # A disk or index problem the commands did not foresee: one line, no traceback.
        click.echo(f"Error: {type(e).__name__}: {e}", err=True)
        sys.exit(2)
    if isinstance(status, int) and status:
        sys.exit(status)
