"""Run every benchmark in order, timing each step (``make bench``; runs on the client).

The headline figures must come from a quiet machine: run this alone (no tests, no other
benchmarks).  Steps, in order (the consecutive-run benchmark first, while the machine is
freshest; the pure-CPU ones last):

1. ``consecutive_runs``: the realistic analysis, 80k events LZMA-9, 4 nodes, XRootD origin,
   all six modes (coffea-native included), 5 runs, 3 repeats, membership scenario, both
   floors;
2. ``consecutive_runs_light``: the light analysis, same data, direct / xcache /
   cacheaffinity, 5 runs, 3 repeats;
3. ``scheduler_overhead``: 10^4 chunk tasks vs plain restricted tasks, 5 rounds;
4. ``executor_runs``, ``warm_run_profile``, ``stealing_slow_node``, ``cache_read``,
   ``placement``, ``scheduler_scale``, ``simulate``;
5. ``render_readme``: the README tables from the new JSON files.

Each step's wall time is printed when it ends and all of them at the end (also written to
``<out>/bench_steps.json``).  A failing step stops the sequence (exit status non-zero);
``--keep-going`` runs the rest anyway.

    python benchmarks/run_all.py              # full size (several hours on 2 cores)
    python benchmarks/run_all.py --dry-run    # print the commands only
    python benchmarks/run_all.py --quick      # every script at a tiny size (minutes), into a temp dir
    python benchmarks/run_all.py --only scheduler_overhead simulate
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
B = "benchmarks"

#: (name, full-size argv, quick argv); ``{out}`` and ``{data}`` are filled in
STEPS: list[tuple[str, list[str], list[str]]] = [
    ("consecutive_runs",
     [f"{B}/consecutive_runs.py", "--analysis", "realistic", "--events", "160000", "--files", "8",
      "--chunksize", "10000", "--workers", "4", "--runs", "5", "--repeats", "3", "--out", "{out}"],
     [f"{B}/consecutive_runs.py", "--analysis", "realistic", "--events", "1200", "--files", "1",
      "--chunksize", "600", "--workers", "2", "--runs", "2", "--repeats", "2", "--scenarios", "stable",
      "--modes", "direct", "xcache", "coffea-native", "cacheaffinity", "--data", "{data}", "--out", "{out}"]),
    ("consecutive_runs_light",
     [f"{B}/consecutive_runs.py", "--analysis", "light", "--events", "80000", "--files", "4",
      "--chunksize", "1250", "--workers", "4", "--runs", "5", "--repeats", "3", "--scenarios", "stable",
      "--modes", "direct", "xcache", "cacheaffinity", "--out", "{out}"],
     [f"{B}/consecutive_runs.py", "--analysis", "light", "--events", "1200", "--files", "1",
      "--chunksize", "600", "--workers", "2", "--runs", "2", "--repeats", "1", "--scenarios", "stable",
      "--modes", "direct", "cacheaffinity", "--data", "{data}", "--out", "{out}"]),
    ("scheduler_overhead",
     [f"{B}/scheduler_overhead.py", "--tasks", "10000", "--rounds", "5", "--workers", "4", "--out", "{out}"],
     [f"{B}/scheduler_overhead.py", "--tasks", "300", "--rounds", "2", "--workers", "2", "--out", "{out}"]),
    ("executor_runs",
     [f"{B}/executor_runs.py", "--events", "150000", "--files", "6", "--repeats", "3", "--out", "{out}"],
     [f"{B}/executor_runs.py", "--events", "2000", "--files", "2", "--chunksize", "500", "--workers", "2",
      "--repeats", "1", "--data", "{data}/executor_runs", "--out", "{out}"]),
    ("warm_run_profile",
     [f"{B}/warm_run_profile.py", "--events", "160000", "--files", "8", "--chunksize", "10000",
      "--workers", "4", "--rounds", "3", "--out", "{out}"],
     [f"{B}/warm_run_profile.py", "--events", "1200", "--files", "1", "--chunksize", "600",
      "--workers", "2", "--rounds", "1", "--data", "{data}", "--out", "{out}"]),
    ("stealing_slow_node",
     [f"{B}/stealing_slow_node.py", "--repeats", "3", "--out", "{out}"],
     [f"{B}/stealing_slow_node.py", "--events", "2000", "--chunksize", "250", "--runs", "2", "--workers", "2",
      "--cost", "0.05", "--workdir", "{data}/stealing", "--out", "{out}"]),
    ("cache_read", [f"{B}/cache_read.py", "--out", "{out}"], [f"{B}/cache_read.py", "--quick", "--out", "{out}"]),
    ("placement", [f"{B}/placement.py", "--out", "{out}"], [f"{B}/placement.py", "--quick", "--out", "{out}"]),
    ("scheduler_scale", [f"{B}/scheduler_scale.py", "--out", "{out}"],
     [f"{B}/scheduler_scale.py", "--quick", "--out", "{out}"]),
    ("simulate", [f"{B}/simulate.py", "--out", "{out}"], [f"{B}/simulate.py", "--quick", "--out", "{out}"]),
    ("store_scale", [f"{B}/store_scale.py", "--repeats", "3", "--out", "{out}"],
     [f"{B}/store_scale.py", "--quick", "--out", "{out}"]),
    # one insert evicting 1 to 10^4 smaller packs, rank and fifo
    ("eviction_scale", [f"{B}/eviction_scale.py", "--repeats", "3", "--out", "{out}"],
     [f"{B}/eviction_scale.py", "--quick", "--out", "{out}"]),
    # the first inserts after a warm run of a whole node cache, 10^3-10^6 packs
    ("precheck_scale", [f"{B}/precheck_scale.py", "--repeats", "3", "--out", "{out}"],
     [f"{B}/precheck_scale.py", "--quick", "--out", "{out}"]),
    # a transaction's admission state rows against the node's processes listed and the window
    ("state_rows", [f"{B}/state_rows.py", "--repeats", "15", "--out", "{out}"],
     [f"{B}/state_rows.py", "--quick", "--out", "{out}"]),
    # one process's inline inserts continuing its last transaction's table, 10^3-10^6 packs
    ("kept_table", [f"{B}/kept_table.py", "--repeats", "15", "--out", "{out}"],
     [f"{B}/kept_table.py", "--quick", "--out", "{out}"]),
    # the scheduler's run forecast per chunk task placed and per report, 10^4-10^6 tasks, against
    # the code before it kept each chunk's holder
    ("forecast_scale", [f"{B}/forecast_scale.py", "--repeats", "5", "--before", "912c8fb~1", "--out", "{out}"],
     [f"{B}/forecast_scale.py", "--quick", "--out", "{out}"]),
    # the worker's guard of sys._current_frames() (Python < 3.12) against the threads a worker has
    ("frame_snapshots", [f"{B}/frame_snapshots.py", "--repeats", "7", "--out", "{out}"],
     [f"{B}/frame_snapshots.py", "--quick", "--out", "{out}"]),
    # a warm coffea run on node caches already holding 0-10^6 other packs, rank against fifo
    ("facility_node", [f"{B}/facility_node.py", "--rounds", "3", "--out", "{out}"],
     [f"{B}/facility_node.py", "--quick", "--data", "{data}", "--out", "{out}"]),
    # the facility node shape (2 nodes x 2 processes each) against 4 nodes x 1, same settings
    ("consecutive_runs_4x1",
     [f"{B}/consecutive_runs.py", "--analysis", "realistic", "--events", "160000", "--files", "8",
      "--chunksize", "10000", "--workers", "4", "--runs", "3", "--repeats", "2",
      "--scenarios", "stable", "--modes", "direct", "coffea-native", "cacheaffinity", "--name", "consecutive_runs_4x1",
      "--out", "{out}"],
     [f"{B}/consecutive_runs.py", "--analysis", "realistic", "--events", "1200", "--files", "1",
      "--chunksize", "600", "--workers", "2", "--runs", "2", "--repeats", "1",
      "--scenarios", "stable", "--modes", "cacheaffinity", "--name", "consecutive_runs_4x1",
      "--data", "{data}", "--out", "{out}"]),
    ("consecutive_runs_2x2",
     [f"{B}/consecutive_runs.py", "--analysis", "realistic", "--events", "160000", "--files", "8",
      "--chunksize", "10000", "--workers", "2", "--per-node", "2", "--runs", "3", "--repeats", "2",
      "--scenarios", "stable", "--modes", "direct", "coffea-native", "cacheaffinity", "--name", "consecutive_runs_2x2",
      "--out", "{out}"],
     [f"{B}/consecutive_runs.py", "--analysis", "realistic", "--events", "1200", "--files", "1",
      "--chunksize", "600", "--workers", "2", "--per-node", "2", "--runs", "2", "--repeats", "1",
      "--scenarios", "stable", "--modes", "cacheaffinity", "--name", "consecutive_runs_2x2",
      "--data", "{data}", "--out", "{out}"]),
    ("chunksize_change",
     [f"{B}/chunksize_change.py", "--events", "80000", "--files", "4", "--chunksize", "2500",
      "--stripe-entries", "10000", "--basket-events", "500", "--out", "{out}"],
     [f"{B}/chunksize_change.py", "--quick", "--out", "{out}"]),
    ("chunksize_change_nostealing",
     [f"{B}/chunksize_change.py", "--events", "80000", "--files", "4", "--chunksize", "2500",
      "--stripe-entries", "10000", "--basket-events", "500", "--no-stealing", "--out", "{out}"],
     [f"{B}/chunksize_change.py", "--quick", "--no-stealing", "--out", "{out}"]),
    ("beyond_capacity", [f"{B}/beyond_capacity.py", "--out", "{out}"],
     [f"{B}/beyond_capacity.py", "--quick", "--data", "{data}", "--out", "{out}"]),
    ("soak", [f"{B}/soak.py", "--runs", "300", "--out", "{out}"],
     [f"{B}/soak.py", "--quick", "--data", "{data}/soak", "--out", "{out}", "--name", "soak_quick"]),
    ("soak_noprofiler", [f"{B}/soak.py", "--runs", "300", "--no-profiler", "--name", "soak_noprofiler",
                         "--out", "{out}"],
     [f"{B}/soak.py", "--quick", "--no-profiler", "--data", "{data}/soak", "--out", "{out}",
      "--name", "soak_noprofiler_quick"]),
    ("render_readme", ["tools/render_readme.py"], []),
]  # fmt: skip


def commands(quick: bool, out: str, data: str, only: list[str] | None = None) -> list[tuple[str, list[str]]]:
    """The (name, argv) of every step to run."""
    cmds = []
    for name, full, small in STEPS:
        if only and name not in only:
            continue
        argv = small if quick else full
        if not argv:  # render_readme: only for a full run into the results directory
            continue
        cmds.append((name, [PY, *(a.format(out=out, data=data) for a in argv)]))
    return cmds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, results into a temporary directory")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--only", nargs="+", choices=[s[0] for s in STEPS], help="run only these steps")
    p.add_argument("--out", default=None, help="results directory (default: benchmarks/results; "
                   "--quick: a temporary directory)")
    p.add_argument("--keep-going", action="store_true", help="run the remaining steps after a failure")
    a = p.parse_args(argv)
    if a.out:
        out = a.out
    elif a.quick:
        out = "<tmp>" if a.dry_run else tempfile.mkdtemp(prefix="cacheaffinity-bench-quick-")
        if not a.dry_run:  # the XRootD origin runs as its own user: it must read the data below
            os.chmod(out, 0o755)
    else:
        out = str(ROOT / "benchmarks" / "results")
    data = str(Path(out) / "data") if a.quick else str(ROOT / ".bench-data")
    cmds = commands(a.quick, out, data, a.only)
    if a.dry_run:
        for name, cmd in cmds:
            print(f"{name}: {shlex.join(cmd)}")
        return 0
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    times: list[dict] = []
    failed = []
    started = time.perf_counter()
    for name, cmd in cmds:
        load = os.getloadavg()[0]
        print(f"\n[bench] {name}: {shlex.join(cmd)}  (load {load:.1f})", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
        dt = time.perf_counter() - t0
        times.append({"step": name, "seconds": round(dt, 1), "returncode": rc, "load_before": load})
        print(f"[bench] {name}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {dt / 60:.1f} min",
              flush=True)  # fmt: skip
        if rc != 0:
            failed.append(name)
            if not a.keep_going:
                break
    total = time.perf_counter() - started
    print("\n[bench] step times:")
    for t in times:
        print(f"  {t['step']:24s} {t['seconds'] / 60:7.1f} min  {'ok' if t['returncode'] == 0 else 'FAILED'}")
    print(f"  {'total':24s} {total / 60:7.1f} min")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "bench_steps.json"), "w") as f:
        json.dump({"quick": a.quick, "steps": times, "total_seconds": round(total, 1)}, f, indent=1)
    if a.quick:
        print(f"[bench] quick results in {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
