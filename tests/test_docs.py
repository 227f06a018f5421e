"""The documentation site builds with warnings as errors, and README is a short front page
whose relative links all resolve.  (Sphinx site under docs/; ``make docs`` builds it into
docs/_build/html.)"""

from __future__ import annotations

import re
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


def test_sphinx_builds_with_warnings_as_errors(tmp_path):
    import myst_parser  # noqa: F401  - the test extra installs both: a missing one fails here
    import sphinx  # noqa: F401

    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), str(REPO / "docs"), str(tmp_path / "html")],
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    html = tmp_path / "html"
    for page in ("index", "install", "coffea", "dask", "deployment", "gateway", "operations",
                 "configuration", "api", "design", "benchmarks"):  # fmt: skip
        assert (html / f"{page}.html").is_file(), page
    config = (html / "configuration.html").read_text()
    # every key of the defaults file is in the generated reference, with its variable
    assert 'id="confval-cacheaffinity.worker.capacity"' in config
    assert "DASK_CACHEAFFINITY__SCHEDULER__STEALING__WARM_BACKLOG" in config
    assert 'id="cacheaffinity.CacheAffinityExecutor"' in (html / "api.html").read_text()


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
