"""Package hygiene: the runtime package imports only what pyproject declares, uses all of it,
and nothing of the repository's test bed (``testbed/``), tests, examples or benchmarks."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "cacheaffinity"
# Modules allowed to import an optional extra's packages (extra name -> module paths).
OPTIONAL = {"jobqueue": {"cacheaffinity/jobqueue.py"}, "gateway": {"cacheaffinity/gateway.py"}}


def _imports(path: Path) -> set[str]:
    """Top-level names of the absolute imports in one file (TYPE_CHECKING blocks included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _requirement_name(req: str) -> str:
    return re.split(r"[\s<>=!~\[;]", req, maxsplit=1)[0].lower().replace("_", "-")


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = {_requirement_name(r) for r in project["dependencies"]}
    extras = {
        k: {_requirement_name(r) for r in v}
        for k, v in project.get("optional-dependencies", {}).items()
    }
    return runtime, extras


def _third_party_by_module() -> dict[str, set[str]]:
    """Module path -> distributions (normalised) it imports, stdlib and the package excluded."""
    dists = packages_distributions()
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(REPO))
        found = set()
        for name in _imports(path):
            if name in sys.stdlib_module_names or name == "cacheaffinity":
                continue
            assert name in dists, (
                f"{rel} imports {name!r}, which no installed distribution provides "
                "(the repository's test bed, tests, examples and benchmarks are not importable "
                "from the runtime package)"
            )
            found.update(d.lower().replace("_", "-") for d in dists[name])
        out[rel] = found
    return out


def test_runtime_imports_are_declared_dependencies():
    runtime, extras = _declared()
    for rel, used in _third_party_by_module().items():
        allowed = set(runtime)
        for extra, modules in OPTIONAL.items():
            if rel in modules:
                allowed |= extras[extra]
        missing = used - allowed
        assert not missing, (
            f"{rel} imports {sorted(missing)}, not declared in pyproject's dependencies: "
            f"add them to [project] dependencies"
        )


def test_declared_runtime_dependencies_are_used():
    runtime, _ = _declared()
    used = set().union(*_third_party_by_module().values())
    unused = runtime - used
    assert not unused, (
        f"pyproject declares {sorted(unused)} but cacheaffinity/ never imports them: "
        "drop them (or use them)"
    )


def test_runtime_package_imports_nothing_of_the_test_bed():
    code = (
        "import pkgutil, importlib, sys, cacheaffinity\n"
        "for m in pkgutil.walk_packages(cacheaffinity.__path__, 'cacheaffinity.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in "
        "('testbed', 'tests', 'examples', 'benchmarks'))\n"
        "print(bad)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd="/", capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_version_has_one_source():
    """pyproject reads the version from cacheaffinity/_version.py (setuptools ``attr:``)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"]
    assert "version" in pyproject["project"]["dynamic"]
    attr = pyproject["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "cacheaffinity._version.__version__"
    tree = ast.parse((PACKAGE / "_version.py").read_text())
    (value,) = [n.value.value for n in tree.body if isinstance(n, ast.Assign)
                and [t.id for t in n.targets] == ["__version__"]]  # fmt: skip
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+|rc\d+)?", value), value
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert f"## {value} " in changelog or "## Unreleased" in changelog


def test_distribution_ships_license_types_and_no_tests():
    """The sdist leaves the tests out (they need testbed/, tools/ and a cluster); it and
    the wheel ship LICENSE and ``py.typed``.  Checked on the build inputs: the build
    backend is not installed in the test venv (``python -m build`` makes both)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = pyproject["project"]
    assert project["license"] == "BSD-3-Clause" and project["license-files"] == ["LICENSE"]
    license_text = (REPO / "LICENSE").read_text()
    assert "BSD 3-Clause" in license_text and "the cacheaffinity developers" in license_text
    assert (PACKAGE / "py.typed").is_file()
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["cacheaffinity"]
    assert project["urls"] and any(c.startswith("Typing ::") for c in project["classifiers"])
    manifest = {
        tuple(line.split()) for line in (REPO / "MANIFEST.in").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }  # fmt: skip
    for folder in ("tests", "testbed", "benchmarks", "examples", "tools"):
        assert ("prune", folder) in manifest, folder
    include = set().union(*(set(m[1:]) for m in manifest if m[0] == "include"))
    assert {"LICENSE", "CHANGELOG.md", "README.md"} <= include
