"""Where the real NanoAOD sample files are: the one place that says so.

The repository carries small real CMS NanoAOD files in ``data/nanoaod/`` (provenance and
licences in ``data/nanoaod/README.md``). Tests, examples, benchmarks and the synthetic
data generator (:mod:`testbed.synthetic`, default template ``data/nanoaod/nano_dy.root``)
find them through :func:`samples_dir`; the environment variable
``CACHEAFFINITY_NANOAOD_DIR`` points them at another folder holding files of the same
names.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DIR_ENV", "REPO", "REL_SAMPLES", "SAMPLES", "samples_dir", "sample"]

#: Environment variable that replaces the sample folder.
DIR_ENV = "CACHEAFFINITY_NANOAOD_DIR"

#: The repository root (the folder holding ``testbed/``).
REPO = Path(__file__).resolve().parents[1]

#: The sample folder as named in messages: relative to the repository root.
REL_SAMPLES = "data/nanoaod/"

#: The sample folder inside the repository.
SAMPLES = REPO / "data" / "nanoaod"


def samples_dir() -> Path:
    """``$CACHEAFFINITY_NANOAOD_DIR`` if set (and not empty), else :data:`SAMPLES`."""
    env = os.environ.get(DIR_ENV)
    return Path(env).expanduser() if env else SAMPLES


def sample(name: str = "nano_dy.root") -> Path:
    """The sample file ``name`` in :func:`samples_dir` (not checked to exist)."""
    return samples_dir() / name

