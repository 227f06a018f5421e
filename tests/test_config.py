"""The cacheaffinity config namespace: defaults yaml and schema agree."""

from __future__ import annotations

import dask.config
import jsonschema
import pytest
import yaml

from cacheaffinity import config


def _load(path):
    with open(path) as f:
        return yaml.safe_load(f)


def _paths(defaults, schema, prefix=""):
    """Yield (path, problem) for every key present on one side only."""
    props = schema.get("properties", {})
    for key, value in defaults.items():
        if key not in props:
            yield f"{prefix}{key}", "in defaults, missing from schema"
        elif isinstance(value, dict) and props[key].get("type") == "object" and "properties" in props[key]:
            yield from _paths(value, props[key], f"{prefix}{key}.")
    for key in props:
        if key not in defaults:
            yield f"{prefix}{key}", "in schema, missing from defaults"


def test_yaml_and_schema_agree():
    defaults = _load(config.DEFAULTS_PATH)
    schema = _load(config.SCHEMA_PATH)
    assert list(_paths(defaults, schema)) == []
    jsonschema.validate(defaults, schema)


def test_every_schema_key_is_described():
    schema = _load(config.SCHEMA_PATH)

    def walk(node, path):
        for key, sub in node.get("properties", {}).items():
            if sub.get("type") == "object" and "properties" in sub:
                yield from walk(sub, f"{path}.{key}")
            else:
                yield f"{path}.{key}", sub.get("description")

    undocumented = [p for p, d in walk(schema, "") if not d]
    assert undocumented == []


def test_defaults_are_loaded_into_dask_config():
    assert any("cacheaffinity" in d for d in dask.config.defaults)
    with dask.config.set({"cacheaffinity.scheduler.dimensions": 5}):
        assert config.get("scheduler.dimensions") == 5
    assert config.get("scheduler.dimensions") == 3
    assert config.get_bytes("worker.capacity") == 10 * 2**30
    assert config.get_seconds("scheduler.stealing.idle-time") == 0.25


@pytest.mark.parametrize(
    "key, value, message",
    [
        pytest.param("worker.capacity", "lots", "not a size", id="capacity-not-a-size"),
        pytest.param("worker.capacity", -5, "must not be negative", id="capacity-negative"),
        pytest.param("scheduler.stealing.idle-time", "soon", "not a duration", id="bad-duration"),
    ],
)
def test_bad_values_name_the_key(key, value, message):
    getter = config.get_bytes if key.startswith("worker") else config.get_seconds
    with dask.config.set({f"cacheaffinity.{key}": value}):
        with pytest.raises(ValueError, match=message) as info:
            getter(key)
    assert f"cacheaffinity.{key}" in str(info.value)


def test_invalid_config_is_rejected_by_schema():
    schema = _load(config.SCHEMA_PATH)
    bad = _load(config.DEFAULTS_PATH)
    bad["cacheaffinity"]["scheduler"]["dimensoins"] = 3  # a typo
    with pytest.raises(jsonschema.ValidationError, match="dimensoins"):
        jsonschema.validate(bad, schema)
