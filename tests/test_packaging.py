"""Package hygiene: the runtime package imports only what pyproject declares, uses all of it,
and nothing of the repository's test bed (``testbed/``), tests, examples or benchmarks; a
wheel installed in a fresh venv runs README's coffea example against ``dask scheduler
--preload cacheaffinity`` on 127.0.0.1."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import site
import subprocess
import sys
import time
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


def test_distribution_ships_license_types_and_tests():
    """The sdist carries the tests and what they collect with (testbed/, data/, examples/,
    the scripts of benchmarks/ and tools/); it and the wheel ship LICENSE and ``py.typed``.
    Checked on the build inputs here; :func:`test_sdist_tests_collect` builds the sdist."""
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
    for folder in ("tests", "testbed", "data", "examples"):
        assert ("graft", folder) in manifest, folder
    for folder in ("docs", "benchmarks/results"):
        assert ("prune", folder) in manifest, folder
    include = set().union(*(set(m[1:]) for m in manifest if m[0] == "include"))
    assert {"LICENSE", "CHANGELOG.md", "README.md", "conftest.py"} <= include


def _build_sdist(tmp: Path) -> Path:
    """The sdist of a copy of the checkout's tracked-or-new files (the checkout stays
    untouched), built by setuptools' PEP 517 backend with a setuptools>=77 that pip
    installs into a folder of its own from the configured index (as ``python -m build``
    does in its isolated environment; ``build`` itself is not a test dependency)."""
    src = tmp / "src"
    skip = shutil.ignore_patterns(".git", ".venv*", "__pycache__", "*.pyc", "*.egg-info",
                                  ".demo", ".bench-data", ".pytest_cache", ".hypothesis",
                                  "_build", "build", "dist")  # fmt: skip
    shutil.copytree(REPO, src, ignore=skip)
    backend = tmp / "backend"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(backend),
         "setuptools>=77"], capture_output=True, text=True, timeout=300, cwd=tmp, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, (
        "pip could not install setuptools>=77 for the sdist build (no package index?)\n"
        + proc.stderr[-3000:]
    )
    dist = tmp / "dist"
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
         "print(b.build_sdist(sys.argv[1]))", str(dist)],
        capture_output=True, text=True, timeout=300, cwd=src,
        env={**env, "PYTHONPATH": str(backend)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (sdist,) = dist.glob("cacheaffinity-*.tar.gz")
    return sdist


def test_sdist_tests_collect(tmp_path):
    """``python -m build --sdist``, unpacked: its tests collect without errors against the
    unpacked copy (the samples in its data/nanoaod/, its testbed/ and examples/)."""
    import tarfile

    sdist = _build_sdist(tmp_path)
    unpacked = tmp_path / "unpacked"
    with tarfile.open(sdist) as tar:
        tar.extractall(unpacked, filter="data")
    (root,) = unpacked.iterdir()
    for name in ("conftest.py", "tests/conftest.py", "testbed/samples.py",
                 "data/nanoaod/nano_dy.root", "data/nanoaod/README.md", "examples/demo.py"):
        assert (root / name).is_file(), f"the sdist lacks {name}"
    assert not (root / "docs").exists() and not (root / "benchmarks" / "results").exists()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEAFFINITY_NANOAOD")}
    env["PYTHONPATH"] = str(root)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert "error" not in proc.stdout.splitlines()[-1].lower(), proc.stdout[-3000:]
    assert re.search(r"^\d+(/\d+)? tests collected", proc.stdout.splitlines()[-1]), proc.stdout[-500:]
    assert "tests/unit/test_store.py::" in proc.stdout
    probe = subprocess.run(
        [sys.executable, "-c", "import testbed.samples as s; print(s.samples_dir())"],
        cwd=root, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert probe.stdout.strip() == str(root / "data" / "nanoaod"), probe.stdout + probe.stderr


# ----------------------------------------------------------------------------- the wheel

#: Marks the README block the wheel test runs (it works as written).
EXAMPLE_MARK = "<!-- example:coffea"
#: The scheduler address the README's example is written for; the test's scheduler listens
#: on another free port of 127.0.0.1, and only this string is replaced.
EXAMPLE_ADDRESS = "tcp://127.0.0.1:8786"
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "MANIFEST.in")


def readme_example() -> str:
    """The fenced python block that follows the example marker in README.md."""
    text = (REPO / "README.md").read_text()
    assert EXAMPLE_MARK in text, f"README.md has no {EXAMPLE_MARK} ... --> block"
    after = text[text.index(EXAMPLE_MARK):]
    m = re.search(r"```python\n(.*?)```", after, re.S)
    assert m, "no ```python block after the example marker in README.md"
    return m.group(1)


def _build_wheel(tmp: Path) -> Path:
    """``pip wheel`` of a copy of the build inputs (the checkout stays untouched: setuptools
    writes build/ and *.egg-info beside its input).  pip's isolated build gets setuptools>=77
    from the configured index; without one, the installed setuptools is used if it is new
    enough."""
    src = tmp / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "cacheaffinity", src / "cacheaffinity",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))  # fmt: skip
    dist = tmp / "dist"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(dist), str(src)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp, env=env)
    if proc.returncode != 0:
        try:
            from importlib.metadata import version

            new_enough = int(version("setuptools").split(".")[0]) >= 77
        except Exception:
            new_enough = False
        assert new_enough, (
            "pip could not build the wheel in an isolated environment (no package index?) and "
            "the installed setuptools is older than 77: pip install 'setuptools>=77'\n"
            + proc.stderr[-3000:]
        )
        proc = subprocess.run([*cmd[:4], "--no-build-isolation", *cmd[4:]], capture_output=True,
                              text=True, timeout=300, cwd=tmp, env=env)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = dist.glob("cacheaffinity-*.whl")
    return wheel


def _fresh_venv(tmp: Path, wheel: Path) -> Path:
    """A venv holding only the wheel; its dependencies come from this interpreter's
    site-packages through a plain path line (so their ``.pth`` files, among them the
    checkout's editable install, are not run and the checkout is not importable)."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)  # fmt: skip
    python = venv / "bin" / "python"
    out = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                         capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    # the wheel first: with the dependencies' path in place pip would take this
    # interpreter's (editable) cacheaffinity for an installed one and skip the wheel
    # (and from tmp, PYTHONPATH unset: a checkout's *.egg-info on sys.path counts as installed)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                    "--no-deps", "--no-index", str(wheel)], check=True, timeout=300, cwd=tmp,
                   env=env)  # fmt: skip
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(out.stdout.strip()) / "zz_dependencies.pth").write_text("\n".join(deps) + "\n")
    return python


def _wait_for_file(path: Path, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the scheduler exited with status {proc.returncode}"
        assert time.monotonic() < deadline, f"no {path.name} after {timeout} s"
        time.sleep(0.1)  # polling a file another process writes; nothing to wait on instead


CHECK = '''
again = runner({"DY": ["nano_dy.root"]}, processor_instance=Muons(), treename="Events")
import json
print("RESULT", json.dumps({
    "client": cacheaffinity.__file__,
    "workers": sorted(set(client.run(lambda: __import__("cacheaffinity").__file__).values())),
    "scheduler": client.run_on_scheduler(lambda: __import__("cacheaffinity").__file__),
    "out": out, "again": again, "run2": cacheaffinity.run_stats(client)[-1],
}))
'''


def test_wheel_in_a_fresh_venv_runs_the_readme_example(tmp_path, nanoaod_dir):
    """``pip install dist/*.whl`` into a fresh venv, ``dask scheduler --preload
    cacheaffinity`` and ``dask worker --preload cacheaffinity --cache-directory ...`` on
    127.0.0.1 from that venv, and the README's coffea example as written; a second run of it
    is served by the node's cache."""
    import uproot

    wheel = _build_wheel(tmp_path)
    python = _fresh_venv(tmp_path, wheel)
    run = tmp_path / "run"  # the processes' working directory: not the checkout
    run.mkdir()
    shutil.copy(nanoaod_dir / "nano_dy.root", run / "nano_dy.root")
    env = {"PATH": f"{python.parent}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}  # fmt: skip
    scheduler_file = run / "scheduler.json"
    dask = [str(python), "-m", "dask"]
    procs = []
    try:
        procs.append(subprocess.Popen(
            [*dask, "scheduler", "--preload", "cacheaffinity", "--host", "127.0.0.1", "--port", "0",
             "--no-dashboard", "--scheduler-file", str(scheduler_file)],
            cwd=run, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip
        try:
            _wait_for_file(scheduler_file, procs[0], 60)
        except AssertionError:
            procs[0].kill()
            raise AssertionError(procs[0].communicate()[1][-3000:]) from None
        address = json.loads(scheduler_file.read_text())["address"]
        assert address.startswith("tcp://127.0.0.1:"), address
        procs.append(subprocess.Popen(
            [*dask, "worker", address, "--preload", "cacheaffinity", "--cache-directory",
             str(tmp_path / "cache"), "--nworkers", "1", "--nthreads", "1", "--no-dashboard",
             "--host", "127.0.0.1"],
            cwd=run, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip
        example = readme_example()
        assert EXAMPLE_ADDRESS in example
        script = run / "example.py"
        script.write_text(example.replace(EXAMPLE_ADDRESS, address) + CHECK)
        proc = subprocess.run([str(python), str(script)], cwd=run, env=env, capture_output=True,
                              text=True, timeout=240)  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    site_packages = str(python.parent.parent / "lib")
    for where in (result["client"], result["scheduler"], *result["workers"]):
        assert where.startswith(site_packages), (where, "is not the wheel's copy")
    with uproot.open(run / "nano_dy.root") as f:
        muons = int(f["Events"]["nMuon"].array(library="np").sum())
    assert result["out"] == result["again"] == {"muons": muons}
    run2 = result["run2"]
    assert run2["misses"] == 0 and run2["hits"] > 0 and run2["storage_bytes"] == 0, run2
