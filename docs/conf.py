"""Sphinx configuration of the cacheaffinity documentation.

Build (nitpicky, warnings are errors, as in CI and tests/test_docs.py)::

    python -m sphinx -n -W --keep-going -b html docs docs/_build/html

The build needs no network: intersphinx reads the small inventories committed under
``_inventories/`` (see its README; ``tools/docs_inventories.py`` regenerates them).

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
    "reexports",  # a re-exported object links to its one documented entry
    "typing_imports",  # names imported under TYPE_CHECKING get their full names
    "clickcommands",  # a click command's signature is its function's, not click's
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_inventories", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_use_ivar = True  # "Attributes" as fields: no second entry beside a property
# numpydoc type specs ("int, optional", "{'a', 'b'}", "default 3") become roles and literals
# instead of one cross-reference per word ("optional" is no class)
napoleon_preprocess_types = True
autodoc_inherit_docstrings = False  # distributed's hook docstrings use its own labels
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
# The optional extras (dask-jobqueue, dask-gateway) are installed in the test venv;
# nothing else is mocked.

#: intersphinx: project -> base URL of its documentation.  The inventory of each is a small
#: file committed under _inventories/ (only the entries these docs reference), so the build
#: never touches the network; tools/docs_inventories.py regenerates them.
INVENTORIES = {
    "python": "https://docs.python.org/3",
    "numpy": "https://numpy.org/doc/stable",
    "dask": "https://docs.dask.org/en/stable",
    "distributed": "https://distributed.dask.org/en/stable",
    "coffea": "https://coffea-hep.readthedocs.io/en/latest",
    "dask_gateway": "https://gateway.dask.org",
    "click": "https://click.palletsprojects.com/en/stable",
}
# A path without "://" is read relative to this directory.
intersphinx_mapping = {name: (url, f"_inventories/{name}.inv") for name, url in INVENTORIES.items()}

# Nitpicky builds (-n, as tests/test_docs.py runs) warn on every reference without a target.
# What genuinely has none would be listed here, each entry with the reason:
nitpick_ignore: list[tuple[str, str]] = []

html_theme = "furo"
html_title = f"cacheaffinity {release}"
