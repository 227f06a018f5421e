"""The documentation site builds nitpicky (every cross-reference resolves) with warnings as
errors and without network, its API reference covers every public module, and README is a
short front page whose relative links all resolve.  (Sphinx site under docs/; ``make docs``
builds it into docs/_build/html.)"""

from __future__ import annotations

import importlib
import inspect
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
#: The front page's length budget.
README_MAX_LINES = 200
# [text](target) and ![alt](target); the target up to the first space or ")"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
#: The public modules and packages; docs/api.md documents each, and each name of its __all__.
PUBLIC_MODULES = (
    "cacheaffinity", "cacheaffinity.client", "cacheaffinity.config", "cacheaffinity.placement",
    "cacheaffinity.protocol", "cacheaffinity.chunk_id", "cacheaffinity.preload",
    "cacheaffinity.jobqueue", "cacheaffinity.gateway", "cacheaffinity.exceptions",
    "cacheaffinity.filesystems", "cacheaffinity.coffea", "cacheaffinity.scheduler",
    "cacheaffinity.worker", "cacheaffinity.cli",
)  # fmt: skip
#: Bigger than any committed intersphinx inventory should be (they hold referenced names only).
INVENTORY_MAX_BYTES = 4096


@pytest.fixture(scope="module")
def built_docs(tmp_path_factory):
    """The site built as CI builds it: nitpicky (-n), warnings as errors (-W)."""
    import myst_parser  # noqa: F401  - the test extra installs both: a missing one fails here
    import sphinx  # noqa: F401

    out = tmp_path_factory.mktemp("docs")
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-n", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(out / "doctrees"), str(REPO / "docs"), str(out / "html")],
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    return proc, out / "html"


def test_sphinx_builds_nitpicky_with_warnings_as_errors(built_docs):
    proc, html = built_docs
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    for page in ("index", "install", "coffea", "dask", "deployment", "gateway", "operations",
                 "configuration", "api", "design", "benchmarks"):  # fmt: skip
        assert (html / f"{page}.html").is_file(), page
    config = (html / "configuration.html").read_text()
    # every key of the defaults file is in the generated reference, with its variable
    assert 'id="confval-cacheaffinity.worker.capacity"' in config
    assert "DASK_CACHEAFFINITY__SCHEDULER__STEALING__WARM_BACKLOG" in config
    assert 'id="cacheaffinity.CacheAffinityExecutor"' in (html / "api.html").read_text()
    # intersphinx links, resolved from the committed inventories
    dask_page = (html / "dask.html").read_text()
    assert 'href="https://distributed.dask.org/en/stable/api.html#distributed.Client.' in dask_page
    assert (
        'href="https://numpy.org/doc/stable/reference/generated/numpy.ndarray.html#numpy.ndarray"'
        in dask_page
    )


def test_intersphinx_reads_committed_inventories_only():
    """No inventory is fetched: the build works offline (CI, users without network)."""
    conf = runpy.run_path(str(REPO / "docs" / "conf.py"))
    mapping = conf["intersphinx_mapping"]
    assert {"python", "numpy", "dask", "distributed", "coffea"} <= set(mapping)
    for name, (url, location) in mapping.items():
        assert url.startswith("https://"), name
        assert "://" not in location, f"{name}: {location} would be fetched"
        path = REPO / "docs" / location
        assert path.is_file(), f"{path} missing: run tools/docs_inventories.py"
        assert path.read_bytes().startswith(b"# Sphinx inventory version 2\n"), name
        assert path.stat().st_size <= INVENTORY_MAX_BYTES, f"{name}: only referenced names"


def _resolve(dotted: str):
    """The object a documented name designates (importing its module), or None."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr, None)
        return obj
    return None


def test_api_reference_documents_every_public_module_and_name(built_docs):
    _proc, html = built_docs
    api = (html / "api.html").read_text()
    ids = set(re.findall(r'id="([^"]+)"', api))
    ours = {i.removeprefix("module-") for i in ids if i.removeprefix("module-").startswith("cacheaffinity")}
    assert not [i for i in ours if "._" in i], "a private module or object has an entry"
    missing = []
    for modname in PUBLIC_MODULES:
        if f"module-{modname}" not in ids:
            missing.append(f"module {modname}")
            continue
        module = importlib.import_module(modname)
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if inspect.ismodule(obj):
                found = f"module-{obj.__name__}" in ids
            else:  # here, or once under another public name (a re-export)
                found = f"{modname}.{name}" in ids or any(
                    i.rsplit(".", 1)[-1] == name and _resolve(i) is obj for i in ours
                )
            if not found:
                missing.append(f"{modname}.{name}")
    assert not missing, f"docs/api.md does not document: {missing}"
    # a re-exported name links to the one entry of its object (docs/_ext/reexports.py)
    assert re.search(
        r'href="#cacheaffinity\.CacheAffinityPlugin"[^>]*><code[^>]*><span class="pre">'
        r"cacheaffinity\.scheduler\.CacheAffinityPlugin<",
        api,
    )


def test_readme_is_a_short_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail to docs/"
    )


def relative_links(text: str) -> list[str]:
    """Link and image targets of a markdown text that are paths in the repository."""
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (https:, mailto:) or an anchor of this page
        out.append(target.split("#", 1)[0])
    return out


def test_readme_relative_links_point_to_files():
    links = relative_links(README.read_text())
    assert links, "README.md links no page of docs/"
    missing = [t for t in links if not (REPO / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("[a](docs/x.md) ![p](b/c.png)", ["docs/x.md", "b/c.png"], id="link-and-image"),
        pytest.param("[a](docs/x.md#part)", ["docs/x.md"], id="anchor-dropped"),
        pytest.param("[a](https://x.org/y) [b](#here)", [], id="urls-and-anchors-skipped"),
    ],
)
def test_relative_links_are_found(text, expected):
    assert relative_links(text) == expected
