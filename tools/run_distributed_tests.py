"""Run distributed's own scheduler and stealing tests with and without cacheaffinity.

A maintenance script (runs on the developer's machine, not collected by pytest).
It checks the claim "Dask stays Dask": with ``cacheaffinity`` preloaded into
every scheduler, distributed's own ``test_steal.py`` and ``test_scheduler.py``
give the same results as without it.

distributed's source distribution on the package index ships no tests; they
live in the dask/distributed repository.  Get a checkout of the tag of the
installed version once, e.g.::

    git clone https://github.com/dask/distributed /tmp/distributed-src
    git -C /tmp/distributed-src checkout "$(python -c 'import distributed; print(distributed.__version__)')"

then run::

    python tools/run_distributed_tests.py --distributed-src /tmp/distributed-src \\
        --workdir /tmp/dist-tests

The script copies the selected test files, distributed's ``conftest.py`` and
its pytest settings into ``--workdir`` (outside this repository; nothing of
upstream is copied into the repository), so that the *installed* distributed
is imported, not the checkout.  It then runs pytest twice, one configuration
after the other:

* ``baseline``: the environment as given, with ``DASK_DISTRIBUTED__SCHEDULER__PRELOAD``
  removed;
* ``preload``: ``DASK_DISTRIBUTED__SCHEDULER__PRELOAD='["cacheaffinity"]'``
  (``gen_cluster`` resets ``dask.config`` to a snapshot taken at import time,
  which includes the environment, so every test scheduler loads the plugin).

It writes one JUnit XML file per configuration, compares the outcomes per
test, reruns every test whose outcome differs ``--reruns`` times in both
configurations to separate timing flakes from real differences, and writes a
JSON summary ``summary.json`` in ``--workdir``.  Exit status 1 when a
difference is reproducible (same outcome in every rerun of each configuration
and different between them).

Before the runs it checks, in a subprocess with the same environment, that
``distributed`` is imported from site-packages and that a scheduler started
with the preload has the ``cacheaffinity`` plugin.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

PRELOAD_ENV = "DASK_DISTRIBUTED__SCHEDULER__PRELOAD"
DEFAULT_TESTS = ("test_steal.py", "test_scheduler.py")

PROBE = r"""
import asyncio, json, os, sys
import distributed
from distributed import Scheduler

async def main():
    async with Scheduler(host="127.0.0.1", port=0, dashboard_address="127.0.0.1:0") as s:
        return sorted(s.plugins), type(s.extensions.get("stealing")).__name__
plugins, stealing = asyncio.run(main())
print(json.dumps({"distributed": distributed.__file__, "version": distributed.__version__,
                  "plugins": plugins, "stealing": stealing}))
"""


def _env(config: str, pythonpath: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(PRELOAD_ENV, None)
    if config == "preload":
        env[PRELOAD_ENV] = '["cacheaffinity"]'
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + (
            os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
        )
    return env


def prepare(src: Path, workdir: Path, tests: list[str]) -> None:
    """Copy the test files and distributed's pytest setup into ``workdir``."""
    tdir = src / "distributed" / "tests"
    missing = [t for t in tests if not (tdir / t).is_file()]
    if missing:
        sys.exit(
            f"--distributed-src={src}: no {', '.join(missing)} under distributed/tests; "
            "pass a checkout of the dask/distributed repository (see this script's docstring)"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    if (workdir / "distributed").exists():
        sys.exit(f"--workdir={workdir} holds a 'distributed' directory: use an empty directory")
    # distributed's conftest, plus: the TLS test certificates are not in the installed
    # wheel, point ``distributed.utils_test.certs_dir`` at the checkout's copies.
    conftest = (src / "conftest.py").read_text()
    certs = (tdir).resolve()
    conftest += (
        "\n\n# added by cacheaffinity's tools/run_distributed_tests.py\n"
        "import distributed.utils_test as _utils_test\n"
        f"_utils_test.certs_dir = {str(certs)!r}\n"
    )
    (workdir / "conftest.py").write_text(conftest)
    shutil.copy(src / "pyproject.toml", workdir / "pyproject.toml")
    for t in tests:
        shutil.copy(tdir / t, workdir / t)


def probe(workdir: Path, config: str, python: str, pythonpath: str | None) -> dict:
    out = subprocess.run(
        [python, "-c", PROBE],
        cwd=workdir,
        env=_env(config, pythonpath),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out.returncode:
        sys.exit(f"probe failed in configuration {config}:\n{out.stderr}")
    info = json.loads(out.stdout.strip().splitlines()[-1])
    if "site-packages" not in info["distributed"] and "dist-packages" not in info["distributed"]:
        sys.exit(f"distributed imported from {info['distributed']}, not the installed package")
    has = "cacheaffinity" in info["plugins"]
    if has != (config == "preload"):
        sys.exit(f"configuration {config}: scheduler plugins {info['plugins']}")
    return info


def run_pytest(
    workdir: Path,
    config: str,
    *,
    python: str,
    pythonpath: str | None,
    timeout: int,
    select: list[str],
    junit: Path,
    log: Path,
    extra: list[str] = (),
) -> int:
    cmd = [
        python,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "--rootdir",
        str(workdir),
        "--timeout",
        str(timeout),
        "-o",
        "addopts=-rsfE -p no:asyncio -p no:legacypath --strict-markers",
        f"--junitxml={junit}",
        *extra,
        *select,
    ]
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        return subprocess.call(
            cmd, cwd=workdir, env=_env(config, pythonpath), stdout=f, stderr=subprocess.STDOUT
        )


def outcomes(junit: Path) -> dict[str, str]:
    """Test id -> passed/failed/error/skipped/xfail/xpass from a JUnit XML file."""
    result: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")[0]
        tid = f"{module}.py::{case.get('name')}"
        kinds = {child.tag: child for child in case}
        if "failure" in kinds:
            out = "failed"
        elif "error" in kinds:
            out = "error"
        elif "skipped" in kinds:
            msg = (kinds["skipped"].get("type") or "") + (kinds["skipped"].get("message") or "")
            out = "xfail" if "xfail" in msg else "skipped"
        else:
            out = "passed"
        # a teardown error adds a second testcase element: keep the worse outcome
        if result.get(tid) in ("failed", "error") and out == "passed":
            continue
        result[tid] = out
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--distributed-src", type=Path, required=True,
                    help="checkout of dask/distributed at the installed version's tag")
    ap.add_argument("--workdir", type=Path, default=Path("dist-tests"),
                    help="empty directory outside this repository for copies, logs, results")
    ap.add_argument("--tests", nargs="+", default=list(DEFAULT_TESTS))
    ap.add_argument("--configs", nargs="+", default=["baseline", "preload"],
                    choices=["baseline", "preload"],
                    help="configurations to run now (others are read from earlier results)")
    ap.add_argument("--timeout", type=int, default=120, help="per-test timeout in seconds")
    ap.add_argument("--reruns", type=int, default=3, help="reruns of each differing test")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--pythonpath", default=str(Path(__file__).resolve().parents[1]),
                    help="prepended to PYTHONPATH so that this cacheaffinity is imported")
    ap.add_argument("--pytest-args", nargs=argparse.REMAINDER, default=[],
                    help="further pytest arguments, last on the line, e.g. "
                    "--pytest-args --runslow -m slow")
    ap.add_argument("--compare-only", action="store_true",
                    help="only compare (and rerun) from earlier junit files")
    args = ap.parse_args(argv)
    workdir = args.workdir.resolve()
    prepare(args.distributed_src.resolve(), workdir, args.tests)
    summary: dict = {"tests": args.tests, "configs": {}}
    for config in ("baseline", "preload"):
        info = probe(workdir, config, args.python, args.pythonpath)
        summary["configs"][config] = {"probe": info}
        junit = workdir / f"{config}.xml"
        if config in args.configs and not args.compare_only:
            print(f"[{config}] running {' '.join(args.tests)} ...", flush=True)
            run_pytest(workdir, config, python=args.python, pythonpath=args.pythonpath,
                       timeout=args.timeout, select=args.tests, junit=junit,
                       log=workdir / f"{config}.log", extra=args.pytest_args)
        if not junit.exists():
            sys.exit(f"no results for configuration {config}: {junit} is missing")
    results = {c: outcomes(workdir / f"{c}.xml") for c in ("baseline", "preload")}
    for c, r in results.items():
        summary["configs"][c]["counts"] = dict(Counter(r.values()))
        print(f"{c:9s}", dict(sorted(Counter(r.values()).items())))
    differing = sorted(
        t for t in set(results["baseline"]) | set(results["preload"])
        if results["baseline"].get(t) != results["preload"].get(t)
    )
    reruns: dict[str, dict[str, list[str]]] = {}
    for t in differing:
        reruns[t] = {}
        for config in ("baseline", "preload"):
            outs = []
            for i in range(args.reruns):
                junit = workdir / f"rerun-{config}-{i}.xml"
                run_pytest(workdir, config, python=args.python, pythonpath=args.pythonpath,
                           timeout=args.timeout, select=[t], junit=junit,
                           log=workdir / f"rerun-{config}.log", extra=args.pytest_args)
                outs.append(outcomes(junit).get(t, "missing"))
            reruns[t][config] = outs
        print(f"differs: {t}: first {results['baseline'].get(t)} / {results['preload'].get(t)};"
              f" reruns baseline {reruns[t]['baseline']} preload {reruns[t]['preload']}")
    real = [
        t for t, r in reruns.items()
        if len(set(r["baseline"])) == 1 and len(set(r["preload"])) == 1
        and r["baseline"][0] != r["preload"][0]
    ]
    summary["differing-first-run"] = {
        t: [results["baseline"].get(t), results["preload"].get(t)] for t in differing
    }
    summary["reruns"] = reruns
    summary["reproducible-differences"] = real
    (workdir / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"differing in the first run: {len(differing)}; reproducible: {len(real)} {real}")
    print(f"summary: {workdir / 'summary.json'}")
    return 1 if real else 0


if __name__ == "__main__":
    sys.exit(main())
