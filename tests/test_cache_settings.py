"""Settings every process of a cache directory agrees on (issue 13): the layout
version and the capacity in ``settings.json``; old-layout directories are
detected and their entries dropped, never read.  Real directories."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

from cacheaffinity.worker.store import LAYOUT_VERSION, SETTINGS_NAME, ColumnCache

LOGGER = "cacheaffinity.worker"


def fill(directory, n=3, capacity="1 MiB"):
    with ColumnCache(directory, capacity=capacity) as cache:
        for i in range(n):
            cache[f"uuid/Events/0-10/data/col{i}"] = np.arange(100, dtype=np.float32) + i
        assert len(cache) == n


def settings(directory):
    with open(os.path.join(directory, SETTINGS_NAME)) as f:
        return json.load(f)


def drops(caplog):
    return [r for r in caplog.records if r.name == LOGGER and "dropped" in r.getMessage()]


def test_new_directory_records_layout_and_capacity(tmp_path):
    fill(tmp_path)
    assert settings(tmp_path) == {"layout": LAYOUT_VERSION, "capacity": 2**20}


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda p: os.unlink(p), id="no-settings-old-layout"),
        pytest.param(lambda p: open(p, "w").write('{"layout": 2, "capacity": 1048576}'), id="layout-2"),
        pytest.param(lambda p: open(p, "w").write('{"layout": 99, "capacity": 1048576}'), id="layout-99"),
        pytest.param(lambda p: open(p, "w").write("{not json"), id="garbage"),
    ],
)
def test_other_layout_is_detected_and_dropped_with_one_line(tmp_path, caplog, damage):
    fill(tmp_path)
    damage(os.path.join(tmp_path, SETTINGS_NAME))
    caplog.set_level(logging.INFO, LOGGER)
    with ColumnCache(tmp_path, capacity="1 MiB") as cache:
        assert len(cache) == 0
        assert cache.get("uuid/Events/0-10/data/col0") is None
        assert [name for name in os.listdir(tmp_path / "columns") if os.listdir(tmp_path / "columns" / name)] == []
    (record,) = drops(caplog)
    assert "dropped its 3 entries" in record.getMessage() and str(tmp_path) in record.getMessage()
    assert settings(tmp_path)["layout"] == LAYOUT_VERSION
    # the next process finds the current layout: nothing dropped again
    fill(tmp_path, n=2)
    with ColumnCache(tmp_path, capacity="1 MiB") as cache:
        assert len(cache) == 2
    assert len(drops(caplog)) == 1


def test_read_only_open_changes_nothing(tmp_path):
    fill(tmp_path)
    os.unlink(os.path.join(tmp_path, SETTINGS_NAME))
    with ColumnCache(tmp_path, capacity="1 MiB", heal=False) as cache:
        assert len(cache) == 3  # cache info reports what is there ...
    assert not os.path.exists(os.path.join(tmp_path, SETTINGS_NAME))  # ... and writes nothing


def test_processes_agree_on_the_directory_capacity(tmp_path, caplog):
    fill(tmp_path, capacity="1 MiB")
    caplog.set_level(logging.INFO, LOGGER)
    with ColumnCache(tmp_path, capacity="64 KiB") as small:
        assert small.capacity == 2**20 and small.capacity_source == "directory"
        assert len(small) == 3
    assert any("records capacity 1.00 MiB" in r.getMessage() for r in caplog.records)
    with ColumnCache(tmp_path, capacity="2 MiB", set_capacity=True) as cache:
        assert cache.capacity == 2 * 2**20 and cache.capacity_source == "argument"
        assert len(cache) == 3  # changing the capacity keeps the entries
    assert settings(tmp_path)["capacity"] == 2 * 2**20
    with ColumnCache(tmp_path, capacity="1 MiB") as cache:
        assert cache.capacity == 2 * 2**20
