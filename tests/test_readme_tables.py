"""The measured-results tables of README.md (the headline only) and docs/benchmarks.md
(every table) are rendered from benchmarks/results/*.json (tools/render_readme.py): both
files in the repository match the JSON, and a changed figure in a JSON file changes the
table and fails the check."""

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
from tools.readme import consecutive  # noqa: E402


def test_readme_and_benchmarks_page_match_results_json():
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "render_readme.py"), "--check"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "README.md tables match" in proc.stdout
    assert "docs/benchmarks.md tables match" in proc.stdout


def _tables(path: Path) -> list[str]:
    return [m.group("name") for m in render_readme.MARKER.finditer(path.read_text())]


def test_readme_holds_the_headline_and_the_benchmarks_page_every_table():
    assert _tables(REPO / "README.md") == ["headline"]
    assert set(_tables(REPO / "docs" / "benchmarks.md")) == set(render_readme.RENDERERS) - {"headline"}
    # the front page stays short: header, separator, one row per main mode, the floor
    (body,) = render_readme.MARKER.findall((REPO / "README.md").read_text())[0][2:3]
    assert body.count("\n| ") <= len(consecutive.HEADLINE_MODES) + 3


def test_a_changed_figure_fails_the_check_of_the_benchmarks_page(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(REPO / "benchmarks" / "results", results)
    page = tmp_path / "benchmarks.md"
    shutil.copy(REPO / "docs" / "benchmarks.md", page)
    path = results / "chunksize_change.json"  # a table only the benchmarks page holds
    doc = json.loads(path.read_text())
    doc["results"][1]["wall_s"] = 1234.5678
    path.write_text(json.dumps(doc))
    argv = ["--readme", str(page), "--results", str(results)]
    assert render_readme.main([*argv, "--check"]) == 1
    assert render_readme.main(argv) == 0
    assert "| 2 | 2500 | 32 | 1234.6 |" in page.read_text()
    assert render_readme.main([*argv, "--check"]) == 0


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


def _shape_doc(workers: int, per_node: int, run2: list[float], served: float) -> dict:
    def spread(values):
        v = sorted(values)
        return {"median": v[len(v) // 2], "min": v[0], "max": v[-1], "n": len(v), "values": values}

    return {
        "config": {"workers": workers, "per_node": per_node, "analysis": "realistic", "events": 160000,
                   "files": 8, "chunksize": 10000, "runs": 5, "repeats": len(run2),
                   "modes": ["direct", "cacheaffinity"]},
        "commit": "0123456789abcdef", "machine": {"time": "2026-11-28T11:00:00"},
        "results": {"headline": {
            "modes": {"cacheaffinity": {"run1_wall_s": spread([30.0] * len(run2)), "run2_wall_s": spread(run2),
                                        "run2_cache_rate": spread([served] * len(run2))},
                      "direct": {"run2_wall_s": spread([20.0] * len(run2))}},
            "ratios": {"direct run 2 / cacheaffinity run 2": spread([20.0 / x for x in run2]),
                       "cacheaffinity run 1 / run 2": spread([30.0 / x for x in run2])},
        }},
    }  # fmt: skip


def test_the_node_shape_table_sets_the_facility_shape_beside_the_headline(tmp_path):
    assert "Not measured yet" in consecutive.render_node_shape(str(tmp_path))
    (tmp_path / "consecutive_runs_4x1.json").write_text(json.dumps(_shape_doc(4, 1, [5.0, 6.0, 7.0], 1.0)))
    (tmp_path / "consecutive_runs_2x2.json").write_text(json.dumps(_shape_doc(2, 2, [6.0, 6.5, 7.0], 0.98)))
    text = consecutive.render_node_shape(str(tmp_path))
    assert "| one node per process: 4 nodes x 1 | 30 | 6 [5, 7] | 100.0% | 5 [4.29, 6] | - |" in text
    assert "| facility node shape: 2 nodes x 2 | 30 | 6.5 [6, 7] | 98.0% |" in text
    assert "--workers 2 --per-node 2" in text and "--workers 4 --runs 5" in text
    assert "facility node shape / one node per process: 1.08 (bound 1.10, met" in text
    (tmp_path / "consecutive_runs_2x2.json").write_text(json.dumps(_shape_doc(2, 2, [7.0, 7.5, 8.0], 1.0)))
    assert "1.25 (bound 1.10, **missed**" in consecutive.render_node_shape(str(tmp_path))
