"""The tier bookkeeping in ``tests/conftest.py``: selecting some tests of a file works, and an
entry of ``TIERS`` that names a test which no longer exists is refused."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import conftest

ROOT = Path(__file__).resolve().parent.parent


def test_one_test_of_a_file_with_tier_entries_can_be_selected():
    # test_consecutive_runs.py has a TIERS entry for another of its tests (test_xrootd_storage);
    # the selected test is in the slow tier, which the default addopts deselect
    node = "tests/test_consecutive_runs.py::test_what_a_worker_restart_keeps"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "slow", node],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("test_what_a_worker_restart_keeps[") == 2, out.stdout


def test_an_entry_naming_a_missing_test_is_found():
    module = types.ModuleType("test_example")
    module.test_present = lambda: None
    modules = {"test_example.py": module}
    assert conftest._names_a_missing_test("test_example.py::test_gone", modules)
    assert not conftest._names_a_missing_test("test_example.py::test_present", modules)
    assert not conftest._names_a_missing_test("test_other.py::test_gone", modules)  # not collected


def test_every_tier_entry_names_an_existing_test():
    for entries in conftest.TIERS.values():
        for entry in entries:
            file, _, test = entry.partition("::")
            paths = list((ROOT / "tests").rglob(file))
            assert len(paths) == 1, entry
            path = paths[0]
            if test:
                assert f"def {test}(" in path.read_text(), entry
