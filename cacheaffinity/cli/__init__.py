"""The ``cacheaffinity`` command line (entry point ``cacheaffinity.cli:main``).

Runs as its own process, started by an operator:

- ``cacheaffinity cache info|verify|clear DIR`` on a cache node: a cache
  directory is node-local, so these open it directly (no cluster needed;
  ``info`` without DIR: the configured ``cacheaffinity.worker.directory``);
- ``cacheaffinity where SCHEDULER CHUNK...`` (or ``--file F --chunksize N``),
  ``cacheaffinity check SCHEDULER`` and ``cacheaffinity stats SCHEDULER``
  anywhere a Dask client can reach the scheduler: a client that asks the
  scheduler plugin.  Each gives up after its ``--timeout`` against any address
  (a closed port, a port that speaks HTTP, one that accepts and never answers):
  the connection and the question run under ``asyncio.wait_for``, and a
  watchdog ends the process shortly after the deadline should anything still
  hang.

``cache clear`` asks for confirmation on the terminal; ``--yes`` (``-y``) skips the
question, and without a terminal on stdin (a script, cron, ``ssh`` without ``-t``) it
refuses in one line naming ``--yes`` instead of prompting.

Exit status: 0 on success; 1 when ``cache verify`` found (and removed) corrupt
entries, a confirmation was declined or could not be asked (no terminal, no ``--yes``),
or ``check`` found nodes that cache nothing;
2 for usage errors, a path that is not a cache directory, a directory that
cannot be trusted, read or (for ``verify`` and ``clear``) written, a damaged
index (``info`` and ``verify`` without ``--repair`` leave it as it is), and a
scheduler that cannot be reached or has no plugin.  Every error is one line
(``Error: ...``) on stderr, never a traceback.

Notes
-----
A wrong path is never turned into a cache: ``info``, ``verify`` and ``clear``
refuse a path that does not exist, is not a directory, or holds neither a
``node-id`` nor a column index, before anything is opened.  The commands are
safe while workers use the directory (see :class:`~cacheaffinity.ColumnCache`):
``verify`` removes only entries it read as corrupt, ``clear`` turns the workers'
next reads into misses, and the node id is never touched, so the node keeps its
place (and its chunks) in the scheduler's placement.  ``verify --repair`` and
``clear`` rebuild a damaged index (as workers do when they open it), keeping
the entries that still read and the node id.

The commands live by concern in :mod:`cacheaffinity.cli._cache_dir` (a node's
directory) and :mod:`cacheaffinity.cli._scheduler` (questions to a scheduler).
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


for _command in (cache, where, check, stats):
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
