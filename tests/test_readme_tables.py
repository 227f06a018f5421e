"""README's measured-results tables are rendered from benchmarks/results/*.json
(tools/render_readme.py): the README in the repository matches the JSON, and a changed
figure in a JSON file changes the table and fails the check."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tools import render_readme  # noqa: E402


def test_readme_matches_results_json():
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "render_readme.py"), "--check"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_a_changed_figure_is_rendered_and_fails_the_check(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(REPO / "benchmarks" / "results", results)
    readme = tmp_path / "README.md"
    shutil.copy(REPO / "README.md", readme)
    path = results / "consecutive_runs.json"
    doc = json.loads(path.read_text())
    if "headline" in doc["results"]:  # --repeats: the table shows the medians
        ca = doc["results"]["headline"]["modes"]["cacheaffinity"]["run2_wall_s"]
        old = ca["median"]
        ca["median"] = 1234.5678
    else:  # single runs
        ca = doc["results"]["sequences"]["stable"]["cacheaffinity"]
        old = ca[1]["wall_s"]
        ca[1]["wall_s"] = 1234.5678
    doc["commit"] = "f" * 40
    doc.pop("commit_inferred", None)
    path.write_text(json.dumps(doc))
    argv = ["--readme", str(readme), "--results", str(results)]
    assert render_readme.main([*argv, "--check"]) == 1
    assert render_readme.main(argv) == 0  # rewrite
    text = readme.read_text()
    assert re.search(r"\*\*1234\.6[* ]", text) and not re.search(rf"\*\*{old:.1f}[* ]", text)
    assert "`fffffff`" in text and "`fffffff` (inferred)" not in text
    assert render_readme.main([*argv, "--check"]) == 0
    # only the marked regions changed
    before = (REPO / "README.md").read_text()
    outside = render_readme.MARKER.sub("", before)
    assert render_readme.MARKER.sub("", text) == outside


def test_unknown_table_marker_is_refused():
    text = "<!-- table:nope -->\n<!-- /table -->\n"
    try:
        render_readme.render(text)
    except KeyError as e:
        assert "table:nope" in str(e) and "consecutive_runs" in str(e)
    else:
        raise AssertionError("unknown table was rendered")
