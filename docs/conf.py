"""Sphinx configuration of the cacheaffinity documentation.

Build (warnings are errors, as in CI and tests/test_docs.py)::

    python -m sphinx -W -b html docs docs/_build/html

The configuration reference is generated at build time from the package's yaml and schema
(``_ext/configref.py``); the benchmark tables in ``benchmarks.md`` are rendered from
``benchmarks/results/*.json`` by ``tools/render_readme.py`` and checked by
``tests/test_readme_tables.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(REPO))

from cacheaffinity import __version__  # noqa: E402

project = "cacheaffinity"
author = "the cacheaffinity developers"
copyright = "the cacheaffinity developers (BSD-3-Clause)"
release = __version__
version = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "configref",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_use_ivar = True  # "Attributes" as fields: no second entry beside a property
autodoc_inherit_docstrings = False  # distributed's hook docstrings use its own labels
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
# The optional extras (dask-jobqueue, dask-gateway) are installed in the test venv;
# nothing else is mocked.
intersphinx_mapping = {}

html_theme = "furo"
html_title = f"cacheaffinity {release}"
