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
        pytest.param("worker.capacity", -5, "must be >= 0", id="capacity-negative"),
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


# ------------------------------------------------------------- validate / check
@pytest.mark.parametrize(
    "section, key, value, words",
    [
        pytest.param("worker", "capacity", "lots", "is not a size", id="capacity-lots"),
        pytest.param("worker", "memory", "-1 GiB", "must be >= 0", id="memory-negative"),
        pytest.param("worker", "weight", 0, "must be > 0", id="weight-zero"),
        pytest.param("worker", "weight", "heavy", "must be a number or null", id="weight-str"),
        pytest.param("worker", "directory", 5, "must be a string or null", id="directory-int"),
        pytest.param("worker", "capacty", "1 GiB", "is not a setting", id="typo"),
        pytest.param("client", "max-chunk-id-length", 0, "must be >= 1", id="id-limit-zero"),
        pytest.param("client", "max-chunk-id-length", "big", "is not a size", id="id-limit-str"),
        pytest.param(
            "scheduler", "stealing.idle-time", "soon", "is not a duration", id="idle-time"
        ),
        pytest.param("scheduler", "dimensions", 0, "must be >= 1", id="dimensions-zero"),
        pytest.param("scheduler", "locator", "yes", "must be true or false", id="locator-str"),
    ],
)
def test_validate_names_key_value_and_an_example(section, key, value, words):
    with dask.config.set({f"cacheaffinity.{section}.{key}": value}):
        with pytest.raises(ValueError) as info:
            config.validate(section)
        with pytest.raises(ValueError):
            config.validate()  # the whole namespace too
        config.validate("worker" if section != "worker" else "client")  # others are fine
    message = str(info.value)
    assert f"cacheaffinity.{section}.{key}={value!r} {words}" in message
    if key != "capacty":  # a typo has no example; real keys do, with their env variable
        env = f"DASK_CACHEAFFINITY__{section.upper()}__" + key.upper().replace(".", "__").replace(
            "-", "_"
        )
        assert f'"cacheaffinity.{section}.{key}: ' in message and env in message
    else:
        assert "capacity, directory, gc, memory" in message


def test_validate_accepts_defaults_underscores_and_env_values(monkeypatch):
    assert config.validate("worker")["capacity"] == "10 GiB"
    assert config.validate()["client"]["max-chunk-id-length"] == "1 KiB"
    with dask.config.set({"cacheaffinity.scheduler.stealing.idle_time": "1s"}):
        config.validate("scheduler")
    monkeypatch.setenv("DASK_CACHEAFFINITY__WORKER__CAPACITY", "lots")
    dask.config.refresh()
    try:
        with pytest.raises(ValueError, match="capacity='lots' is not a size"):
            config.validate("worker")
    finally:
        monkeypatch.delenv("DASK_CACHEAFFINITY__WORKER__CAPACITY")
        dask.config.refresh()
    assert config.validate("worker")["capacity"] == "10 GiB"


def test_keyword_arguments_are_checked_and_named():
    with pytest.raises(ValueError, match=r"capacity='lots' \(cacheaffinity.worker.capacity\)"):
        config.get_bytes("worker.capacity", "lots")
    assert config.get_bytes("worker.capacity", "2 KiB") == 2048
    config.check("worker.weight", 2.5)
    with pytest.raises(ValueError, match="must be > 0"):
        config.check("worker.weight", -1)
    config.check("no.such.key", object())  # keys outside the schema are not checked


def test_validator_agrees_with_jsonschema_on_types_and_bounds():
    """The built-in validator and jsonschema agree wherever jsonschema can judge
    (everything but the bytes/duration formats)."""
    schema = _load(config.SCHEMA_PATH)
    samples = [0, -1, 1, 2.5, "x", None, True, {}, [1], "10 GiB"]
    for section in ("scheduler", "worker", "client"):
        for key in config.default(section):
            sub = schema["properties"]["cacheaffinity"]["properties"][section]["properties"][key]
            if sub.get("format") or sub.get("type") == "object":
                continue
            for value in samples:
                doc = _load(config.DEFAULTS_PATH)
                doc["cacheaffinity"][section][key] = value
                try:
                    jsonschema.validate(doc, schema)
                    expected = True
                except jsonschema.ValidationError:
                    expected = False
                try:
                    config.check(f"{section}.{key}", value)
                    got = True
                except ValueError:
                    got = False
                assert got == expected, (section, key, value)


def test_invalid_settings_are_structured_errors():
    """One exception type, carrying each problem's key, value and example (no parsing of
    its text), and still a ``ValueError`` for callers that know nothing of it."""
    from cacheaffinity.exceptions import CacheAffinityError, InvalidSetting

    with pytest.raises(InvalidSetting) as info:
        config.settings("worker", capacity="lots", weight=-1)
    e = info.value
    assert isinstance(e, ValueError) and isinstance(e, CacheAffinityError)
    assert [(p.key, p.value, p.argument) for p in e.problems] == [
        ("worker.capacity", "lots", "capacity"),
        ("worker.weight", -1, "weight"),
    ]
    assert (e.key, e.value) == ("worker.capacity", "lots") and e.example
    assert str(e) == InvalidSetting.PREFIX + e.detail and not e.detail.startswith(InvalidSetting.PREFIX)
    assert e.problems[0].environment_variable == "DASK_CACHEAFFINITY__WORKER__CAPACITY"
    with pytest.raises(InvalidSetting) as info:
        config.get_seconds("scheduler.stealing.idle-time", "soon")
    assert "is not a duration" in info.value.detail
    assert config.get_seconds("scheduler.stealing.idle-time", info.value.example) >= 0  # a valid one
    assert config.get_bytes("worker.capacity", e.example) > 0
