"""The ``cacheaffinity`` Dask configuration namespace.

Runs in every process (client, scheduler, worker): importing :mod:`cacheaffinity`
adds the defaults from ``cacheaffinity.yaml`` beside this file to ``dask.config``.
Values are read when an object is constructed, never at import time, so
``dask.config.set`` and ``DASK_CACHEAFFINITY__...`` environment variables work.
"""

from __future__ import annotations

import math
import os
from typing import Any

import dask.config
import yaml
from dask.utils import parse_bytes, parse_timedelta

__all__ = ["get", "get_bytes", "get_seconds", "default", "DEFAULTS_PATH", "SCHEMA_PATH"]

_HERE = os.path.dirname(__file__)
DEFAULTS_PATH = os.path.join(_HERE, "cacheaffinity.yaml")
SCHEMA_PATH = os.path.join(_HERE, "cacheaffinity-schema.yaml")

with open(DEFAULTS_PATH) as _f:
    _defaults = yaml.safe_load(_f)

dask.config.update_defaults(_defaults)


_MISSING = object()


def default(key: str) -> Any:
    """The packaged default of ``cacheaffinity.<key>``."""
    node: Any = _defaults["cacheaffinity"]
    for part in key.split("."):
        node = node[part]
    return node


def get(key: str, value: Any = None) -> Any:
    """``value`` if it is not None, else the config value of ``cacheaffinity.<key>``.

    Falls back to the packaged default when the key is missing from
    ``dask.config`` (e.g. a config that was reset after cacheaffinity was imported).
    """
    if value is not None:
        return value
    out = dask.config.get(f"cacheaffinity.{key}", default=_MISSING)
    return default(key) if out is _MISSING else out


def get_bytes(key: str, value: Any = None) -> int:
    """A size in bytes from ``value`` or the config key, with an error naming the key."""
    raw = get(key, value)
    try:
        out = parse_bytes(raw) if isinstance(raw, str) else int(raw)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"cacheaffinity.{key}={raw!r} is not a size; use a number of bytes or a "
            f'string such as "200 GiB"'
        ) from e
    if out < 0:
        raise ValueError(f"cacheaffinity.{key}={raw!r} must not be negative")
    return out


def get_seconds(key: str, value: Any = None) -> float:
    """A duration in seconds from ``value`` or the config key."""
    raw = get(key, value)
    try:
        out = float(parse_timedelta(raw, default="s"))
    except (TypeError, ValueError, KeyError) as e:
        raise ValueError(
            f"cacheaffinity.{key}={raw!r} is not a duration; use seconds or a string "
            f'such as "500ms"'
        ) from e
    if not math.isfinite(out) or out < 0:
        raise ValueError(f"cacheaffinity.{key}={raw!r} must be a finite duration >= 0")
    return out
