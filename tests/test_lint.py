"""The repository passes ``ruff check`` with the configuration in pyproject.toml
([tool.ruff]; ruff's version is pinned in requirements/constraints.txt)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _ruff() -> list[str]:
    try:
        import ruff  # noqa: F401
    except ImportError:
        exe = shutil.which("ruff")
        if exe is None:
            pytest.fail("ruff is not installed: the test extra pins it (pip install -e '.[test]')")
        return [exe]
    return [sys.executable, "-m", "ruff"]


def test_ruff_check_passes():
    proc = subprocess.run(
        [*_ruff(), "check", "--no-cache", "--output-format", "concise", "."],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, (
        "ruff check found problems (fix them, or `ruff check --fix` for the fixable ones):\n"
        + proc.stdout[-6000:] + proc.stderr[-2000:]
    )
