"""The benchmark scripts, tools and testbed stay small and acyclic (issue 42, part 3).

Every ``.py`` file under ``benchmarks/``, ``tools/`` and ``testbed/`` is at most
:data:`MAX_LINES` lines: shared parts live in the harness modules (``benchmarks/_clusters.py``,
``_runs.py``, ``_storage.py``, ``_common.py``), a script's own figures in a private module of
its own; the testbed's servers, network namespaces, self-checks, template and jitter each in a
module of their own.

The import graph of those modules, read with :mod:`ast` (nothing is imported), has no
cycle.  Every import counts: at module level and inside functions (a lazy import is still
an edge).  ``from _common import x`` in a script that puts its own folder on ``sys.path``
is its sibling ``benchmarks._common``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_import_graph import find_cycle  # one cycle finder for both import graphs

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("benchmarks", "tools", "testbed")
#: The most lines a file of benchmarks/, tools/ or testbed/ may have.
MAX_LINES = 800


def python_files(repo: Path = REPO, roots: tuple[str, ...] = ROOTS) -> list[Path]:
    return sorted(p for r in roots for p in (repo / r).rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path, repo: Path = REPO) -> str:
    parts = path.relative_to(repo).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(repo: Path = REPO, roots: tuple[str, ...] = ROOTS) -> dict[str, set[str]]:
    """``{module: modules of benchmarks/, tools/ and testbed/ it imports}``."""
    files = python_files(repo, roots)
    modules = {module_name(p, repo) for p in files}
    graph: dict[str, set[str]] = {}
    for path in files:
        me = module_name(path, repo)
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        found: set[str] = set()

        def resolve(name: str) -> str | None:
            # the module itself or the nearest module above it (``from benchmarks._common import
            # x``), else a sibling (a script with its own folder on sys.path: ``from _common import``)
            candidate = name
            while candidate:
                if candidate in modules:
                    return candidate
                candidate = candidate.rpartition(".")[0]
            candidate = f"{package}.{name}" if package else ""
            while candidate and candidate != package:
                if candidate in modules:
                    return candidate
                candidate = candidate.rpartition(".")[0]
            return None

        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                targets = [f"{base}.{a.name}" if base else a.name for a in node.names] + ([base] if base else [])
            else:
                continue
            for t in targets:
                got = resolve(t)
                if got is not None and got != me:
                    found.add(got)
        graph[me] = found
    return graph


def long_files(repo: Path = REPO, roots: tuple[str, ...] = ROOTS, limit: int = MAX_LINES) -> dict[str, int]:
    out = {}
    for p in python_files(repo, roots):
        n = len(p.read_text().splitlines())
        if n > limit:
            out[str(p.relative_to(repo))] = n
    return out


def test_no_file_of_benchmarks_or_tools_is_over_the_limit():
    assert python_files(), "no .py file found under benchmarks/, tools/ and testbed/"
    too_long = long_files()
    assert not too_long, (
        f"over {MAX_LINES} lines: {too_long}; move shared parts into the harness modules "
        "(benchmarks/_clusters.py, _runs.py, _storage.py, _common.py) or a script's own "
        "private module (benchmarks/_<script>_figures.py)"
    )


def test_benchmarks_and_tools_have_no_import_cycle():
    graph = import_graph()
    assert "benchmarks._runs" in graph and "tools.render_readme" in graph
    # the harness is reached as the scripts use it (the graph is read right)
    assert "benchmarks._clusters" in graph["benchmarks.consecutive_runs"]
    assert "benchmarks._common" in graph["benchmarks.placement"]  # ``from _common import``
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checks_see_a_cycle_and_a_long_file(tmp_path):
    """The two checks fail on a real violation: a lazy import back, a file one line too long."""
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "a.py").write_text("from benchmarks import b\n")
    (tmp_path / "benchmarks" / "b.py").write_text("def f():\n    from benchmarks.a import x\n")
    (tmp_path / "benchmarks" / "c.py").write_text("from _common import y\n" + "\n" * MAX_LINES)
    (tmp_path / "benchmarks" / "_common.py").write_text("import os\n")
    graph = import_graph(tmp_path, ("benchmarks",))
    assert graph["benchmarks.c"] == {"benchmarks._common"}
    assert find_cycle(graph) == ["benchmarks.a", "benchmarks.b", "benchmarks.a"]
    assert long_files(tmp_path, ("benchmarks",)) == {"benchmarks/c.py": MAX_LINES + 1}
    (tmp_path / "benchmarks" / "b.py").write_text("import os\n")
    assert find_cycle(import_graph(tmp_path, ("benchmarks",))) is None
