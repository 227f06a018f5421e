"""What every ``cacheaffinity`` sub-command shares: the error type, JSON and time output."""

from __future__ import annotations

import datetime
import json
import logging
import time
from typing import Any

import click
from dask.utils import format_time

__all__ = ["JSON", "CommandError", "echo_json", "logger", "when"]

logger = logging.getLogger("cacheaffinity")


class CommandError(click.ClickException):
    """An error the user can fix (exit status 2), printed as ``Error: <message>``."""

    exit_code = 2


#: The ``--json`` option of every command.
JSON = click.option("--json", "as_json", is_flag=True, help="Machine-readable output (JSON).")


def when(t: float | None) -> str:
    """A time stamp with its age, ``-`` for None."""
    if t is None:
        return "-"
    stamp = datetime.datetime.fromtimestamp(t).astimezone().isoformat(sep=" ", timespec="seconds")
    age = time.time() - t
    return f"{stamp} ({format_time(age)} ago)" if age >= 0 else stamp


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True))
