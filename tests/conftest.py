"""Shared test helpers: paths to the real NanoAOD samples, cluster set-up."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NANOAOD = Path(
    os.environ.get("CACHEAFFINITY_NANOAOD_DIR", REPO.parent / "shared" / "data" / "nanoaod")
)


@pytest.fixture(scope="session")
def nanoaod_dir() -> Path:
    if not (NANOAOD / "nano_dy.root").exists():
        pytest.fail(
            f"real NanoAOD samples not found in {NANOAOD}; the repository expects "
            "../shared/data/nanoaod beside it (or set CACHEAFFINITY_NANOAOD_DIR)"
        )
    return NANOAOD
