"""Small helpers shared by the benchmark scripts in this folder (run on the client).

- :func:`parser`: the common command line (``--quick``, ``--out``);
- :func:`machine_info`: what the numbers were measured on (CPU, load, versions);
- :func:`write_json`: results with the config used and the machine, written atomically
  (paths in them recorded by :func:`portable_path`);
- :func:`portable_path`: a path as results files record it (relative to the repository,
  or its base name), so that they name no folder of the machine they ran on;
- :func:`pyplot` and :func:`save_png`: matplotlib with the Agg backend (no display),
  PNG written atomically;
- :func:`print_table`: a plain-text table for the terminal; :func:`print_targets`: a
  benchmark's targets, one line each;
- :func:`best_of`: wall and CPU time of a callable, best and median of a few runs;
- :func:`git_info`: the commit the benchmark ran on and whether the tree was dirty
  (:func:`write_json` stamps it into every results file);
- :func:`spread`: median, min and max of repeated measurements (the headline form);
- :func:`branch_bytes`: uncompressed bytes of given branches of ROOT files (what a
  run that reads those branches decompresses);
- ``make_dataset``, ``dataset_stats``: the synthetic NanoAOD generator, imported here
  only, so that its module can move without touching every script.

Files are written under a temporary name in the target directory and renamed into
place, so an interrupted benchmark never leaves a truncated result behind.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from typing import Any, NamedTuple

__all__ = [
    "not_measured",
    "read_results",
    "parser",
    "machine_info",
    "write_json",
    "pyplot",
    "save_png",
    "print_table",
    "print_targets",
    "best_of",
    "Timing",
    "git_info",
    "spread",
    "branch_bytes",
    "make_dataset",
    "dataset_stats",
    "template_path",
    "synthetic_module",
    "portable_path",
    "table_end",
    "save_results",
    "served_share",
]

# The synthetic data generator: this is the one place benchmarks import it from (it may
# move out of the runtime package; change SYNTHETIC only).  Imported on first use, so
# that scripts without ROOT data (placement, simulate) do not load uproot.
SYNTHETIC = "testbed.synthetic"


def synthetic_module():
    """The synthetic data generator module (:data:`SYNTHETIC`)."""
    import importlib

    return importlib.import_module(SYNTHETIC)


_synthetic = synthetic_module


def make_dataset(*args: Any, **kwargs: Any) -> Any:
    """:func:`testbed.synthetic.make_dataset` (see :data:`SYNTHETIC`)."""
    kwargs.setdefault("template", template_path())
    return _synthetic().make_dataset(*args, **kwargs)


def dataset_stats(*args: Any, **kwargs: Any) -> Any:
    """:func:`testbed.synthetic.dataset_stats` (see :data:`SYNTHETIC`)."""
    return _synthetic().dataset_stats(*args, **kwargs)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with ``--quick`` and ``--out`` (add your own options)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--quick", action="store_true", help="small sizes: a smoke test in under a minute"
    )
    p.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help=f"directory for the JSON and PNG results (default: {DEFAULT_OUT})",
    )
    return p


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def machine_info(packages: Sequence[str] = ("numpy", "scipy", "xxhash")) -> dict[str, Any]:
    """CPU, memory, current load, Python and package versions."""
    versions = {}
    for name in ("cacheaffinity", *packages):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_bytes": _memory_bytes(),
        "load_average_1_5_15": load,
        "python": sys.version.split()[0],
        "versions": versions,
    }


def _atomic_write(path: str, write: Callable[[str], None]) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def git_info(repo: str = REPO) -> dict[str, Any]:
    """``{"commit": sha, "dirty": bool, "dirty_files": [...]}`` of the repository the
    benchmarks run from (``commit`` None outside a git checkout).

    ``dirty`` counts tracked files with changes (``git status --porcelain
    --untracked-files=no``) outside ``benchmarks/results/`` (results being rewritten
    by the run itself do not make the measured code dirty).
    """

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", repo, *args], capture_output=True, text=True, check=True, timeout=30
        ).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        status = git("status", "--porcelain", "--untracked-files=no").splitlines()
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None, "dirty_files": []}
    files = [line[3:] for line in status if not line[3:].startswith("benchmarks/results/")]
    return {"commit": commit, "dirty": bool(files), "dirty_files": files}


def template_path() -> str:
    """The NanoAOD template the synthetic data are resampled from:
    ``$CACHEAFFINITY_NANOAOD_TEMPLATE``, else ``nano_dy.root`` of the sample folder
    (``data/nanoaod/`` of the repository or ``$CACHEAFFINITY_NANOAOD_DIR``:
    :mod:`testbed.samples`)."""
    env = os.environ.get("CACHEAFFINITY_NANOAOD_TEMPLATE")
    if env:
        return env
    return str(_synthetic().default_template_path())


def portable_path(path: str | os.PathLike) -> str:
    """``path`` as a results file records it: relative to the repository root when it
    lies inside the repository, else its base name (results name no folder of the
    machine they were measured on)."""
    real = os.path.realpath(os.fspath(path))
    root = os.path.realpath(REPO)
    if real == root:
        return "."
    if real.startswith(root + os.sep):
        return os.path.relpath(real, root)
    return os.path.basename(os.path.normpath(os.fspath(path))) or os.fspath(path)


def _portable(value: Any) -> Any:
    """``value`` with every string that is an absolute path (one word, starting with
    ``/``) replaced by :func:`portable_path`; dicts (keys and values), lists and tuples
    recursively."""
    if isinstance(value, str):
        if value.startswith("/") and len(value) > 1 and not any(c.isspace() for c in value):
            return portable_path(value)
        return value
    if isinstance(value, dict):  # keys too: descriptors by target, files by path
        return {(_portable(k) if isinstance(k, str) else k): _portable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_portable(v) for v in value]
    if isinstance(value, os.PathLike):
        return portable_path(value)
    return value


def spread(values: Sequence[float]) -> dict[str, Any]:
    """``{"median", "min", "max", "n", "values"}`` of repeated measurements (None-safe:
    None values are left out; all None gives None statistics)."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0, "values": []}
    return {
        "median": statistics.median(vals),
        "min": min(vals),
        "max": max(vals),
        "n": len(vals),
        "values": vals,
    }


def branch_bytes(
    files: Sequence[str], branches: Sequence[str] | None, treename: str = "Events"
) -> dict[str, int]:
    """Uncompressed and compressed bytes of ``branches`` summed over ``files``, and of
    every branch (``branches=None``: all).

    Returns ``{"uncompressed", "compressed", "total_uncompressed", "total_compressed",
    "branches", "branches_found"}``: what a run reading those branches decompresses,
    and the files' totals (uproot's ``TBranch.uncompressed_bytes``; data baskets only).
    """
    import uproot

    want = None if branches is None else set(branches)
    out = dict.fromkeys(
        ("uncompressed", "compressed", "total_uncompressed", "total_compressed"), 0
    )
    found: set[str] = set()
    for f in files:
        with uproot.open(f) as rf:
            tree = rf[treename]
            for name, b in tree.iteritems(recursive=False):
                u, c = int(b.uncompressed_bytes), int(b.compressed_bytes)
                out["total_uncompressed"] += u
                out["total_compressed"] += c
                if want is None or name in want:
                    out["uncompressed"] += u
                    out["compressed"] += c
                    found.add(name)
    out["branches"] = len(want) if want is not None else len(found)
    out["branches_found"] = len(found)
    return out


@contextlib.contextmanager
def commit_tree(rev: str, work: str) -> Iterator[tuple[str, str]]:
    """A git worktree of commit ``rev`` in ``work``: ``(its short hash, its path)``, removed
    (and pruned) at the end, so that one run measures two commits' code side by side."""
    short = subprocess.check_output(["git", "-C", REPO, "rev-parse", "--short", rev], text=True).strip()
    path = os.path.join(work, f"tree-{short}")
    subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", "-f", path, short], check=True, capture_output=True)
    try:
        yield short, path
    finally:
        subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", path], capture_output=True)
        subprocess.run(["git", "-C", REPO, "worktree", "prune"], capture_output=True)


def run_child(script: str, code: str, spec: dict) -> dict:
    """``python script --child JSON(spec)`` with ``code`` (a checkout) first on the path: the
    JSON its last line printed, whose ``code`` must be where it imported cacheaffinity from."""
    env = {**os.environ, "PYTHONPATH": code}
    out = subprocess.run([sys.executable, os.path.abspath(script), "--child", json.dumps(spec)],
                         env=env, check=True, capture_output=True, text=True)  # fmt: skip
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    if os.path.realpath(doc["code"]) != os.path.realpath(code):
        raise RuntimeError(f"measured {doc['code']}, not {code}: the code under test was not the one imported")
    return doc


def serve_child(argv: list[str], child: Callable[[dict], dict]) -> bool:
    """In a process :func:`run_child` started (``argv`` is ``--child JSON``): print
    ``child(spec)`` as JSON and return True; else False."""
    if argv[:1] != ["--child"]:
        return False
    print(json.dumps(child(json.loads(argv[1]))))
    return True


def read_results(results: str, name: str) -> dict | None:
    """``<results>/<name>.json`` as written by :func:`write_json`, or None if it is not there."""
    path = os.path.join(results, f"{name}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def measured_at(doc: dict, command: str) -> str:
    """A rendered table's last line: the commit a results document was measured at, and how."""
    return f"Measured at {str(doc.get('commit', '?'))[:7]}{' (dirty)' if doc.get('dirty') else ''}, `{command}`."


def bounds_met(checks: dict) -> str:
    """A rendered table's line on its checks: ``Bounds met: M of N. Missed: name (value against bound); ...``."""
    met = [k for k, v in checks.items() if v.get("met")]
    missed = [f"{k} ({v.get('ratio', v.get('value'))} against {v.get('bound')})" for k, v in checks.items()
              if not v.get("met")]  # fmt: skip
    return f"Bounds met: {len(met)} of {len(checks)}." + (f" Missed: {'; '.join(missed)}." if missed else "")


def save_results(out: str, name: str, config: dict[str, Any], results: dict, started: float,
                 plot: Callable[[dict, str], None], rows: Sequence[dict], columns: Sequence[str]) -> str:
    """Write ``<out>/<name>.json`` (:func:`write_json`, with the seconds since ``started``,
    a ``time.perf_counter()``), draw ``<name>.png`` from it (``plot(doc, path)``), print
    ``rows`` (:func:`print_table`) and each of ``results["checks"]`` as met or MISSED;
    the JSON's path."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{name}.json")
    write_json(path, config, results, elapsed_s=time.perf_counter() - started)
    with open(path) as f:
        plot(json.load(f), path[:-5] + ".png")
    print_table(list(rows), list(columns))
    for k, v in results.get("checks", {}).items():
        x = "x" if "ratio" in v else ""
        value = v.get("ratio", v.get("value"))
        print(f"{'met   ' if v.get('met') else 'MISSED'} {k}: {value}{x} (bound {v.get('bound')}{x})")
    return path


def served_share(row: dict, cold: dict) -> float | None:
    """What the caches served in consecutive-runs row ``row``, own node or peer fetch: the
    share of the cold run ``cold``'s decompressed bytes it did not decompress again."""
    d, c = row.get("decompressed_bytes"), cold.get("decompressed_bytes")
    return None if d is None or not c else max(0.0, 1.0 - d / c)


def table_end(lines: list[str], note: str, checks: dict, doc: dict, command: str) -> str:
    """A rendered table's text: its ``lines``, then ``note``, the bounds met (:func:`bounds_met`)
    and where and how it was measured (:func:`measured_at`), a blank line before each."""
    return "\n".join([*lines, "", note, "", bounds_met(checks), "", measured_at(doc, command)]) + "\n"


def counts(text: str) -> list[int]:
    """``--sizes 1e3,4e4,1e6``: comma-separated counts, exponents allowed."""
    return [int(float(x)) for x in text.split(",")]


def not_measured(script: str, name: str) -> str:
    """What a renderer shows for a results file that is not there yet."""
    return f"Not measured yet (`python benchmarks/{script}` writes `benchmarks/results/{name}.json`).\n"


def write_json(path: str, config: dict[str, Any], results: Any, **extra: Any) -> None:
    """Write ``{"config", "machine", "commit", "dirty", "results", **extra}`` as
    indented JSON; ``commit``/``dirty`` from :func:`git_info`.  Absolute paths in
    ``config``, ``results`` and ``extra`` are recorded by :func:`portable_path`
    (relative to the repository, or their base name)."""
    g = git_info()
    doc = {
        "config": _portable(config),
        "machine": machine_info(),
        "commit": g["commit"],
        "dirty": g["dirty"],
        "dirty_files": g["dirty_files"],
        "results": _portable(results),
        **_portable(extra),
    }

    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1, default=_json_default)
            f.write("\n")

    _atomic_write(path, write)


def _json_default(o: Any) -> Any:
    # numpy scalars and arrays without importing numpy here
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def pyplot():
    """``matplotlib.pyplot`` with the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: str, dpi: int = 120) -> None:
    """Save a matplotlib figure as PNG (atomically) and close it."""
    _atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png", bbox_inches="tight"))
    pyplot().close(fig)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v != v:
            return "nan"
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 100:
            return f"{v:.1f}"
        return f"{v:.3g}" if abs(v) < 0.01 else f"{v:.2f}"
    return str(v)


def print_table(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[str] | None = None,
    title: str | None = None,
    file=None,
) -> str:
    """Print rows (dicts) as an aligned text table; return the text."""
    if columns is None:
        columns = list(dict.fromkeys(k for r in rows for k in r))
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = []
    if title:
        lines.append(title)
    lines.append("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    lines.append("  ".join("-" * w for w in widths))
    for row in cells:
        lines.append(
            "  ".join(
                v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths))
            )
        )
    text = "\n".join(lines)
    print(text, file=file or sys.stdout, flush=True)
    return text


def print_targets(targets: dict) -> None:
    """A benchmark's targets (``{name: {"value", "limit", "pass", "note"}}``), one line each:
    PASS, MISS or n/a (not measured), the value, the limit and the note."""
    print()
    for name, t in targets.items():
        v = t["value"]
        vs = "-" if v is None else f"{v:.4g}"
        verdict = {True: "PASS", False: "MISS", None: "n/a"}[t["pass"]]
        print(f"{verdict:4s}  {name}: {vs} ({t['limit']}) {t['note']}")


class Timing(NamedTuple):
    """Result of :func:`best_of` (seconds)."""

    best: float  #: shortest wall time
    median: float  #: median wall time
    cpu: float  #: shortest process CPU time (all threads): less sensitive to other load
    result: Any  #: what the last call returned


def best_of(fn: Callable[[], Any], repeat: int = 3) -> Timing:
    """Run ``fn`` ``repeat`` times and time it (wall and process CPU)."""
    walls, cpus = [], []
    result = None
    for _ in range(max(1, repeat)):
        c = time.process_time()
        t = time.perf_counter()
        result = fn()
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return Timing(min(walls), statistics.median(walls), min(cpus), result)
