"""The ``cacheaffinity`` Dask configuration namespace (every process).

Importing :mod:`cacheaffinity` adds the defaults of ``cacheaffinity.yaml`` to ``dask.config``.
Values are read when an object is constructed, never at import, and validated there against
``cacheaffinity-schema.yaml`` (the JSON Schema keywords it uses, and the formats ``bytes`` and
``duration``): an invalid value raises :class:`~cacheaffinity.exceptions.InvalidSetting` (a
``ValueError``) naming the key, the value, what is allowed and an example.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from typing import Any

import dask.config
import yaml
from dask.utils import parse_bytes, parse_timedelta

from cacheaffinity.exceptions import InvalidSetting, SettingProblem

__all__ = [
    "DEFAULTS_PATH",
    "SCHEMA_PATH",
    "check",
    "default",
    "get",
    "get_bytes",
    "get_seconds",
    "refusal",
    "settings",
    "validate",
]

_HERE = os.path.dirname(__file__)
DEFAULTS_PATH = os.path.join(_HERE, "cacheaffinity.yaml")
SCHEMA_PATH = os.path.join(_HERE, "cacheaffinity-schema.yaml")

with open(DEFAULTS_PATH) as _f:
    _defaults = yaml.safe_load(_f)

dask.config.update_defaults(_defaults)

with open(SCHEMA_PATH) as _f:
    _schema = yaml.safe_load(_f)["properties"]["cacheaffinity"]

#: Formats of scheduler keys whose schema has no ``format`` (the schema's own wins).
_IMPLIED_FORMATS = {
    "scheduler.stealing.idle-time": "duration",
    "scheduler.stealing.interval": "duration",
}


_MISSING = object()


def default(key: str) -> Any:
    """The packaged default of ``cacheaffinity.<key>``."""
    node: Any = _defaults["cacheaffinity"]
    for part in key.split("."):
        node = node[part]
    return node


def _raw(key: str) -> Any:
    out = dask.config.get(f"cacheaffinity.{key}", default=_MISSING)
    if out is _MISSING:
        try:
            return default(key)
        except KeyError:
            return None
    return out


def get(key: str, value: Any = None) -> Any:
    """``value`` if not None, else ``cacheaffinity.<key>`` from the Dask config (the packaged
    default if a config reset dropped it); :class:`~cacheaffinity.exceptions.InvalidSetting`
    if it does not match the key's schema."""
    if value is not None:
        check(key, value, source="argument")
        return value
    out = _raw(key)
    check(key, out)
    return out


def get_bytes(key: str, value: Any = None) -> int:
    """A size in bytes from ``value`` or the config key, with an error naming the key."""
    raw = get(key, value)
    try:
        out = parse_bytes(raw) if isinstance(raw, str) else int(raw)
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidSetting(
            SettingProblem(key, raw, 'is not a size; use a number of bytes or a string such as "200 GiB"', "200 GiB")
        ) from e
    if out < 0:
        raise InvalidSetting(SettingProblem(key, raw, "must not be negative", "200 GiB"))
    return out


def get_seconds(key: str, value: Any = None) -> float:
    """A duration in seconds from ``value`` or the config key."""
    raw = get(key, value)
    try:
        out = float(parse_timedelta(raw, default="s"))
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise InvalidSetting(
            SettingProblem(key, raw, 'is not a duration; use seconds or a string such as "500ms"', "500ms")
        ) from e
    if not math.isfinite(out) or out < 0:
        raise InvalidSetting(SettingProblem(key, raw, "must be a finite duration >= 0", "500ms"))
    return out


def _subschema(key: str) -> dict | None:
    node: Any = _schema
    for part in key.split("."):
        props = node.get("properties", {}) if isinstance(node, dict) else {}
        if part not in props:
            part = part.replace("_", "-")
        if part not in props:
            extra = node.get("additionalProperties") if isinstance(node, dict) else None
            if isinstance(extra, dict):
                node = extra
                continue
            return None
        node = props[part]
    return node


def _example(key: str, schema: dict) -> str:
    examples = schema.get("examples")
    if examples:
        value = examples[0]
    else:
        try:
            value = default(key)
        except KeyError:
            value = None
    if value is None or isinstance(value, (dict, list)):
        shown = yaml.safe_dump(value, default_flow_style=True).strip()
        if shown.endswith("..."):
            shown = shown[:-3].strip()
    else:
        shown = str(value).lower() if isinstance(value, bool) else str(value)
    return shown


_TYPES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
    "object": "a mapping",
    "array": "a list",
}


def _is_type(value: Any, name: str) -> bool:
    if name == "string":
        return isinstance(value, str)
    if name == "integer":
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "null":
        return value is None
    if name == "object":
        return isinstance(value, Mapping)
    if name == "array":
        return isinstance(value, (list, tuple))
    return True


def _problems(key: str, value: Any, schema: dict) -> list[tuple[str, Any, str, dict]]:
    """(key, value, what is wrong, schema of key) for every problem under ``key``."""
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else list(types)
        if not any(_is_type(value, t) for t in types):
            allowed = " or ".join(_TYPES.get(t, t) for t in types)
            return [(key, value, f"must be {allowed}", schema)]
    if value is None:
        return []
    if "enum" in schema and value not in schema["enum"]:
        return [(key, value, f"must be one of {schema['enum']}", schema)]
    fmt = schema.get("format") or _IMPLIED_FORMATS.get(key)
    number = value
    if fmt == "bytes" and not isinstance(value, bool):
        try:
            number = parse_bytes(value) if isinstance(value, str) else int(value)
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
        except (TypeError, ValueError, OverflowError):
            return [(key, value, 'is not a size (a number of bytes or a string such as "10 GiB")', schema)]
    elif fmt == "duration" and not isinstance(value, bool):
        try:
            number = float(parse_timedelta(value, default="s"))
        except (TypeError, ValueError, KeyError, AttributeError):
            return [(key, value, 'is not a duration (seconds or a string such as "500ms")', schema)]
        if not math.isfinite(number):
            return [(key, value, "must be a finite duration", schema)]
    if isinstance(number, numbers.Real) and not isinstance(number, bool):
        if isinstance(number, float) and math.isnan(number):
            return [(key, value, "must be a number, not NaN", schema)]
        if isinstance(number, float) and math.isinf(number):
            return [(key, value, "must be a finite number", schema)]
        bounds = (
            ("minimum", lambda n, b: n >= b, ">="),
            ("exclusiveMinimum", lambda n, b: n > b, ">"),
            ("maximum", lambda n, b: n <= b, "<="),
            ("exclusiveMaximum", lambda n, b: n < b, "<"),
        )
        for name, ok, op in bounds:
            if name in schema and not ok(number, schema[name]):
                return [(key, value, f"must be {op} {schema[name]}", schema)]
    if isinstance(value, Mapping):
        out: list = []
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for sub, subvalue in value.items():
            name = str(sub)
            if name not in props and name.replace("_", "-") in props:
                name = name.replace("_", "-")
            if name in props:
                out += _problems(f"{key}.{name}", subvalue, props[name])
            elif extra is False:
                known = ", ".join(sorted(props))
                out.append(
                    (f"{key}.{name}", subvalue, f"is not a setting; the keys of cacheaffinity.{key} are {known}", {})
                )
            elif isinstance(extra, dict):
                out += _problems(f"{key}.{name}", subvalue, extra)
        return out
    return []


def _error(problems: list, argument: str | None = None) -> InvalidSetting:
    return InvalidSetting(
        [
            SettingProblem(key, value, what, _example(key, schema) if schema else None, argument)
            for key, value, what, schema in problems
        ]
    )


def check(key: str, value: Any, *, source: str = "config") -> None:
    """Raise :class:`~cacheaffinity.exceptions.InvalidSetting` unless ``value`` is valid for
    ``cacheaffinity.<key>`` (keys outside the schema pass); ``source="argument"`` names the
    keyword argument (``capacity=...``) in the message too."""
    schema = _subschema(key)
    if schema is None:
        return
    problems = _problems(key, value, schema)
    if problems:
        argument = key.rsplit(".", 1)[-1].replace("-", "_") if source == "argument" else None
        raise _error(problems, argument)


def validate(section: str | None = None) -> dict:
    """Validate ``cacheaffinity.<section>`` of the current Dask config (``"scheduler"``,
    ``"worker"``, ``"client"``, a dotted sub-key; default: all) and return its values, packaged
    defaults filled in; :class:`~cacheaffinity.exceptions.InvalidSetting` names every invalid key.
    """
    key = section or ""
    values = dask.config.get("cacheaffinity" + (f".{key}" if key else ""), default=_MISSING)
    if values is _MISSING:
        values = default(key) if key else _defaults["cacheaffinity"]
    if key:
        schema = _subschema(key)
        problems = [] if schema is None else _problems(key, values, schema)
    else:
        problems = []
        if not isinstance(values, Mapping):
            problems = [("", values, "must be a mapping", {})]
        else:
            for sub, subvalue in values.items():
                schema = _subschema(str(sub))
                if schema is None:
                    problems.append(
                        (str(sub), subvalue, f"is not a section; use {', '.join(_schema['properties'])}", {})
                    )
                else:
                    problems += _problems(str(sub), subvalue, schema)
    if problems:
        raise _error(problems)
    return dict(values) if isinstance(values, Mapping) else values


def settings(section: str, **options: Any) -> dict:
    """Validate ``cacheaffinity.<section>`` with snake_case keyword overrides (None: not given).

    The one check a scheduler, a worker or the command-line preload makes before any work.
    Returns the section's values (kebab-case keys) with the overrides;
    :class:`~cacheaffinity.exceptions.InvalidSetting` names every invalid key, config first.
    """
    # environment variables give snake_case keys (DASK_..._SHARED_GROUP -> shared_group)
    values = {**default(section), **{str(k).replace("_", "-"): v for k, v in validate(section).items()}}
    problems: list[SettingProblem] = []
    for name, value in options.items():
        if value is None:
            continue
        key = f"{section}.{name.replace('_', '-')}"
        try:
            check(key, value, source="argument")
        except InvalidSetting as e:
            problems += e.problems
        values[name.replace("_", "-")] = value
    if problems:
        raise InvalidSetting(problems)
    return values


def refusal(role: str, error: BaseException | str) -> str:
    """The one line a process prints when it refuses its settings and does not
    start (``role``: ``"scheduler"`` or ``"worker"``)."""
    return f"cacheaffinity: {role} not started: {error}"
