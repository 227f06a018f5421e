"""Shared test set-up: the real NanoAOD samples (``nanoaod_dir``) and the ``unit``
marker.

Layout: ``tests/unit/`` holds the fast tests (no Dask cluster: placement, config,
locator bookkeeping, forms, the column store; ``pytest tests/unit`` or ``pytest -m
unit`` runs them in well under a minute); every other ``tests/test_*.py`` runs
real clusters, processes or servers.  Helpers several modules share (cluster
client, coffea runs, cache-total deltas, ``dask`` processes) are in
``tests/helpers.py`` (``from helpers import ...``: this directory is on
``sys.path`` while the tests run).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.samples import REL_SAMPLES, samples_dir

REPO = Path(__file__).resolve().parent.parent
#: the real NanoAOD samples: the repository's data/nanoaod/ or $CACHEAFFINITY_NANOAOD_DIR
NANOAOD = samples_dir()


@pytest.fixture(scope="session")
def nanoaod_dir() -> Path:
    if not (NANOAOD / "nano_dy.root").exists():
        pytest.fail(
            f"real NanoAOD samples not found in {NANOAOD}; the repository carries them in "
            f"{REL_SAMPLES} (or set CACHEAFFINITY_NANOAOD_DIR to a folder holding them)"
        )
    return NANOAOD


UNIT = Path(__file__).resolve().parent / "unit"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if UNIT in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.unit)
