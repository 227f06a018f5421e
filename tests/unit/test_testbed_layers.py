"""``testbed/`` (test hosts, servers, data generators) sits below ``benchmarks/``: the
benchmarks use the testbed, never the other way round."""

from __future__ import annotations

import ast
from pathlib import Path

TESTBED = Path(__file__).resolve().parents[2] / "testbed"


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_testbed_never_imports_benchmarks():
    modules = sorted(TESTBED.glob("*.py"))
    assert len(modules) > 5
    offenders = [p.name for p in modules if "benchmarks" in imported_roots(p)]
    assert offenders == []


def test_the_checker_sees_an_import_inside_a_function(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("def f():\n    from benchmarks._common import x\n")
    assert "benchmarks" in imported_roots(p)
