"""The package's import graph: no cycles, and every package layered.

Parses every module of ``cacheaffinity/`` with :mod:`ast` (nothing is imported),
builds the graph of ``cacheaffinity.*`` imports, counting every import: at module
level, inside functions and under ``if TYPE_CHECKING:`` (a cycle a type checker
follows is a cycle a reader follows).

The rules (STYLE.md, "Where code lives"): placement math is pure; the scheduler
side decides placement and never touches the worker side; the worker side stores
data and knows nothing of coffea, dask-jobqueue or dask-gateway; the client API
reaches neither process's side.  Known violations are ``xfail(strict=True)``
params naming the offending import: the test fails (XPASS) once they are fixed,
and then the mark goes.  Inside ``cacheaffinity/worker/`` no chain of imports is
longer than :data:`MAX_WORKER_CHAIN` modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "cacheaffinity"
#: Modules in the longest import chain allowed inside ``cacheaffinity/worker/``.
MAX_WORKER_CHAIN = 6


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """cacheaffinity modules ``path`` imports (anywhere in it, ``TYPE_CHECKING`` too)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()

    def resolve(name: str) -> str | None:
        # the longest known module prefix of a dotted name
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST) -> None:
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


def longest_chain(graph: dict[str, set[str]], package: str) -> list[str]:
    """The longest path of imports among the modules of ``package`` (an acyclic graph)."""
    memo: dict[str, list[str]] = {}

    def from_(node: str) -> list[str]:
        if node not in memo:
            nexts = [from_(n) for n in sorted(graph[node]) if _in(n, package)]
            memo[node] = [node] + max(nexts, key=len, default=[])
        return memo[node]

    return max((from_(m) for m in sorted(graph) if _in(m, package)), key=len, default=[])


def test_the_checker_counts_every_import(tmp_path, monkeypatch):
    pkg = tmp_path / "cacheaffinity"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from cacheaffinity import b\n")
    (pkg / "b.py").write_text("from . import c\n")
    (pkg / "c.py").write_text("import os\n")
    monkeypatch.setattr(f"{__name__}.PACKAGE", pkg)
    graph = import_graph()
    assert graph["cacheaffinity.a"] == {"cacheaffinity.b"}  # inside a function
    assert graph["cacheaffinity.b"] == {"cacheaffinity.c"}
    assert find_cycle(graph) is None
    assert longest_chain(graph, "cacheaffinity") == ["cacheaffinity.a", "cacheaffinity.b", "cacheaffinity.c"]
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cacheaffinity.a import f\n"
    )
    graph = import_graph()
    assert graph["cacheaffinity.c"] == {"cacheaffinity.a"}  # a type-checking import counts
    assert find_cycle(graph) == ["cacheaffinity.a", "cacheaffinity.b", "cacheaffinity.c",
                                 "cacheaffinity.a"]  # fmt: skip


def test_cacheaffinity_import_graph_is_acyclic():
    graph = import_graph()
    assert "cacheaffinity.scheduler._plugin" in graph and len(graph) > 10
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_worker_import_chains_are_short():
    """A reader of any worker module follows at most MAX_WORKER_CHAIN modules of
    imports (package ``__init__`` modules count) to reach everything it uses."""
    graph = import_graph()
    worker = {m: {n for n in graph[m] if _in(n, "cacheaffinity.worker")}
              for m in graph if _in(m, "cacheaffinity.worker")}  # fmt: skip
    assert "cacheaffinity.worker._store.cache" in worker
    assert find_cycle(worker) is None, " -> ".join(find_cycle(worker))
    chain = longest_chain(graph, "cacheaffinity.worker")
    assert len(chain) <= MAX_WORKER_CHAIN, " -> ".join(chain)


@pytest.mark.parametrize(
    "module, must_not_import",
    [
        pytest.param("cacheaffinity.scheduler._stealing", "cacheaffinity.scheduler._plugin",
                     id="stealing-not-plugin"),
        pytest.param("cacheaffinity.scheduler._locator", "cacheaffinity.scheduler._stealing",
                     id="locator-not-stealing"),
        pytest.param("cacheaffinity.scheduler._locator", "cacheaffinity.scheduler._plugin",
                     id="locator-not-plugin"),
        pytest.param("cacheaffinity.scheduler._membership", "cacheaffinity.scheduler._plugin",
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


def closure(graph: dict[str, set[str]], module: str) -> dict[str, str]:
    """Everything ``module`` imports, transitively: imported module -> the module
    that imports it on the first path found (to name the offending import)."""
    via: dict[str, str] = {}
    todo = [module]
    while todo:
        m = todo.pop()
        for nxt in sorted(graph[m]):
            if nxt not in via and nxt != module:
                via[nxt] = m
                todo.append(nxt)
    return via


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def violations(package: str, forbidden: str) -> list[str]:
    """``a imports b`` for every module ``a`` of ``package`` that reaches a module
    ``b`` of ``forbidden`` (the import that crosses the line, not the whole path)."""
    graph = import_graph()
    found = set()
    for module in graph:
        if not _in(module, package):
            continue
        for target, importer in closure(graph, module).items():
            if _in(target, forbidden) and not _in(importer, forbidden):
                found.add(f"{importer} imports {target}")
    return sorted(found)


RULES = [
    pytest.param("cacheaffinity.placement", "cacheaffinity", id="placement-imports-nothing"),
    pytest.param("cacheaffinity.scheduler", "cacheaffinity.worker", id="scheduler-not-worker"),
    pytest.param("cacheaffinity.scheduler", "cacheaffinity.coffea", id="scheduler-not-coffea"),
    pytest.param("cacheaffinity.scheduler", "cacheaffinity.jobqueue",
                 id="scheduler-not-jobqueue"),
    pytest.param("cacheaffinity.scheduler", "cacheaffinity.gateway", id="scheduler-not-gateway"),
    pytest.param("cacheaffinity.scheduler", "cacheaffinity.client", id="scheduler-not-client"),
    pytest.param("cacheaffinity.worker", "cacheaffinity.coffea", id="worker-not-coffea"),
    pytest.param("cacheaffinity.worker", "cacheaffinity.jobqueue", id="worker-not-jobqueue"),
    pytest.param("cacheaffinity.worker", "cacheaffinity.gateway", id="worker-not-gateway"),
    pytest.param("cacheaffinity.worker", "cacheaffinity.scheduler", id="worker-not-scheduler"),
    pytest.param("cacheaffinity.worker", "cacheaffinity.client", id="worker-not-client"),
    pytest.param("cacheaffinity.client", "cacheaffinity.scheduler", id="client-not-scheduler"),
    pytest.param("cacheaffinity.client", "cacheaffinity.worker", id="client-not-worker"),
    pytest.param("cacheaffinity.client", "cacheaffinity.coffea", id="client-not-coffea"),
    pytest.param("cacheaffinity.protocol", "cacheaffinity", id="protocol-imports-nothing"),
    pytest.param("cacheaffinity.config", "cacheaffinity", id="config-imports-nothing"),
    pytest.param("cacheaffinity._version", "cacheaffinity", id="version-imports-nothing"),
    pytest.param("cacheaffinity.filesystems", "cacheaffinity", id="filesystems-imports-nothing"),
    pytest.param("cacheaffinity._logging", "cacheaffinity", id="logging-imports-nothing"),
    pytest.param("cacheaffinity.exceptions", "cacheaffinity", id="exceptions-imports-nothing"),
    pytest.param("cacheaffinity.chunk_id", "cacheaffinity", id="chunk-id-imports-nothing"),
    pytest.param("cacheaffinity.jobqueue", "cacheaffinity.worker", id="jobqueue-not-worker"),
    pytest.param("cacheaffinity.gateway", "cacheaffinity.worker", id="gateway-not-worker"),
]  # fmt: skip


@pytest.mark.parametrize("package, forbidden", RULES)
def test_package_never_imports(package, forbidden):
    graph = import_graph()
    assert any(_in(m, package) for m in graph), f"no module {package}: rule out of date"
    if forbidden == "cacheaffinity":  # a leaf: nothing of the project but itself (and the exceptions)
        bad = sorted(
            f"{m} imports {t}"
            for m in graph if _in(m, package)
            for t in closure(graph, m) if not _in(t, package) and t != "cacheaffinity.exceptions"
        )  # fmt: skip
    else:
        bad = violations(package, forbidden)
    assert not bad, "; ".join(bad)


#: coffea's buffer-key grammar and its cache hook: what only cacheaffinity/coffea/
#: may define (no coffea knowledge outside coffea/).
COFFEA_NAMES = {"IdentifiedKeys", "IdentityKeyedCache", "cachestrategy"}


def defined_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        n.name for n in tree.body
        if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
    }  # fmt: skip


@pytest.mark.parametrize(
    "package",
    [
        pytest.param("worker"),
        pytest.param("scheduler"),
    ],
)
def test_coffea_key_grammar_lives_in_coffea(package):
    """Not an import (code that parses the keys need not import coffea/), so
    checked by name: no module outside coffea/ defines the coffea cache hook."""
    found = {
        f"{path.relative_to(PACKAGE.parent)} defines {name}"
        for path in sorted((PACKAGE / package).rglob("*.py"))
        for name in defined_names(path) & COFFEA_NAMES
    }
    assert not found, "; ".join(sorted(found))
