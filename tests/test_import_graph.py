"""The package's import graph: no cycles, and the scheduler side layered.

Parses every module of ``cacheaffinity/`` with :mod:`ast` (nothing is imported),
builds the graph of ``cacheaffinity.*`` imports, including imports inside
functions, and excluding imports under ``if TYPE_CHECKING:`` (never executed).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "cacheaffinity"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """cacheaffinity modules ``path`` imports at run time."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()

    def resolve(name: str) -> str | None:
        # the longest known module prefix of a dotted name
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (m := resolve(alias.name)) is not None:
                    found.add(m)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                # ``from pkg import submodule`` imports the submodule
                m = resolve(f"{origin}.{alias.name}") or resolve(origin)
                if m is not None:
                    found.add(m)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    found.discard(me)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports_of(p, modules) for p in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := dfs(nxt)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := dfs(node)) is not None:
            return cycle
    return None


def test_the_checker_finds_a_cycle_and_ignores_type_checking_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "cacheaffinity"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from cacheaffinity import b\n")
    (pkg / "b.py").write_text("from . import c\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cacheaffinity.a import f\n"
    )
    monkeypatch.setattr(f"{__name__}.PACKAGE", pkg)
    graph = import_graph()
    assert graph["cacheaffinity.a"] == {"cacheaffinity.b"}
    assert graph["cacheaffinity.b"] == {"cacheaffinity.c"}
    assert find_cycle(graph) is None  # c -> a only while type checking
    (pkg / "c.py").write_text("import cacheaffinity.a\n")
    assert find_cycle(import_graph()) == ["cacheaffinity.a", "cacheaffinity.b", "cacheaffinity.c",
                                          "cacheaffinity.a"]  # fmt: skip


def test_cacheaffinity_import_graph_is_acyclic():
    graph = import_graph()
    assert "cacheaffinity.scheduler.plugin" in graph and len(graph) > 10
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


@pytest.mark.parametrize(
    "module, must_not_import",
    [
        pytest.param("cacheaffinity.scheduler.stealing", "cacheaffinity.scheduler.plugin",
                     id="stealing-not-plugin"),
        pytest.param("cacheaffinity.scheduler.locator", "cacheaffinity.scheduler.stealing",
                     id="locator-not-stealing"),
        pytest.param("cacheaffinity.scheduler.locator", "cacheaffinity.scheduler.plugin",
                     id="locator-not-plugin"),
        pytest.param("cacheaffinity.scheduler.membership", "cacheaffinity.scheduler.plugin",
                     id="membership-not-plugin"),
        pytest.param("cacheaffinity.placement", "distributed", id="placement-pure"),
    ],
)  # fmt: skip
def test_scheduler_side_is_layered(module, must_not_import):
    graph = import_graph()
    seen, todo = set(), [module]
    while todo:  # everything ``module`` imports, transitively
        m = todo.pop()
        for nxt in graph[m]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert must_not_import not in seen
    if must_not_import == "distributed":
        source = (PACKAGE / "placement.py").read_text()
        assert "import distributed" not in source and "from distributed" not in source
