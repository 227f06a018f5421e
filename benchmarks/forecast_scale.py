"""What the scheduler's run forecast costs per chunk task, against the chunk tasks placed at once.

Every ``update_graph`` that places chunk tasks counts them per node for the run's forecast
(``Forecast.submitted_columns``: numpy over the tasks, on the event loop), and every chunk
task's report records its chunk's size (``Forecast.reported``). Since the holders
(``912c8fb``) a size also keeps the node whose cache last read or stored the chunk, and a
chunk placed on another node counts as new there, which adds a lookup of each task's holder.

Each repeat is one new process per side: a forecast that knows the sizes of ``min(tasks,
SIZES_KEPT)`` chunks, each held by one of ``--nodes`` nodes, then places ``tasks`` chunk
tasks on random nodes (node codes, as the placement hands them over: ``coded``) and times
that (CPU), then ``--reports`` reports. ``--before REV`` runs the same on the code of commit
``REV`` (a git worktree), alternating with this checkout's. Medians of ``--repeats``.
Bounds: this checkout's cost per task at the most tasks within :data:`FLAT` x its cost at
the fewest, and within :data:`BEFORE` x the earlier code's.

    python benchmarks/forecast_scale.py [--before 912c8fb~1]
    python benchmarks/forecast_scale.py --quick
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

from benchmarks._common import (  # noqa: E402
    commit_tree, counts, not_measured, parser, pyplot, read_results, run_child, save_png, save_results, serve_child,
    table_end,
)  # fmt: skip

TASKS = (10_000, 100_000, 1_000_000)
#: Cost per task at the most tasks, at most this many times the cost at the fewest.
FLAT = 1.5
#: This checkout's cost per task, at most this many times the earlier code's.
BEFORE = 1.5
MEASURES = ("submit_ns", "report_ns")


def child(spec: dict) -> dict:
    """In a new process on ``spec["code"]``: per task count, the medians of ``rounds`` placements
    (ns per task) and of the reports (ns per report)."""
    sys.path.insert(0, spec["code"])
    import numpy as np

    import cacheaffinity
    from cacheaffinity.scheduler import _forecast

    names = [f"node-{i:04d}" for i in range(spec["nodes"])]
    rng = np.random.default_rng(spec["seed"])
    out = []
    for n in spec["tasks"]:
        f = _forecast.Forecast()
        known = min(n, _forecast.SIZES_KEPT)
        for sk in range(known):
            f.reported(sk, 5_000_000 + sk, names[sk % len(names)])
        codes = rng.integers(0, len(names), n)
        nodes = [names[c] for c in codes]
        sks = list(range(n))
        submit = []
        for r in range(spec["rounds"]):
            c0 = time.process_time()
            f.submitted_columns(f"run-{r}", sks, nodes, (), coded=(codes, names))
            submit.append((time.process_time() - c0) / n * 1e9)
        m = spec["reports"]
        c0 = time.process_time()
        for i in range(m):
            f.reported(i % known, 6_000_000, names[(i * 7) % len(names)])
        report = (time.process_time() - c0) / m * 1e9
        out.append({"tasks": n, "submit_ns": statistics.median(submit), "report_ns": report})
    return {"code": os.path.dirname(os.path.dirname(os.path.abspath(cacheaffinity.__file__))), "rows": out}


def summarize(raw: list[dict]) -> list[dict]:
    """Medians over the repeats, per side and task count."""
    keys = sorted({(r["side"], r["tasks"]) for r in raw})

    def med(m: str, s: str, n: int) -> float:
        return round(statistics.median(r[m] for r in raw if (r["side"], r["tasks"]) == (s, n)), 1)

    return [{"side": s, "tasks": n, **{m: med(m, s, n) for m in MEASURES}} for s, n in keys]


def checks(summary: list[dict]) -> dict:
    find = {(r["side"], r["tasks"]): r for r in summary}
    tasks = sorted({r["tasks"] for r in summary})
    out = {}
    for m in MEASURES:
        lo, hi = find[("after", tasks[0])], find[("after", tasks[-1])]
        ratio = round(hi[m] / lo[m], 3)
        out[f"{m}_flat"] = {"ratio": ratio, "bound": FLAT, "met": ratio <= FLAT}
        b = find.get(("before", tasks[-1]))
        if b is not None:
            ratio = round(hi[m] / b[m], 3)
            out[f"{m}_vs_before"] = {"ratio": ratio, "bound": BEFORE, "met": ratio <= BEFORE}
    return out


def plot(doc: dict, path: str) -> None:
    plt = pyplot()
    rows = doc["results"]["summary"]
    before = doc["config"].get("before")
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for m, label, marker in (("submit_ns", "placing (per task)", "o"), ("report_ns", "a report", "s")):
        for side, style in (("after", "-"), ("before", "--")):
            pts = sorted((r["tasks"], r[m]) for r in rows if r["side"] == side)
            if pts:
                who = "this code" if side == "after" else f"at {before}"
                ax.plot(*zip(*pts), style, marker=marker, label=f"{label}, {who}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("chunk tasks placed at once")
    ax.set_ylabel("CPU ns")
    ax.set_title("The run forecast's cost per chunk task")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save_png(fig, path)


def render(results: str, name: str = "forecast_scale") -> str:
    """The docs' table (docs/benchmarks.md, ``<!-- table:forecast_scale -->``)."""
    doc = read_results(results, name)
    if doc is None:
        return not_measured("forecast_scale.py", name)
    c = doc["config"]
    rows = doc["results"]["summary"]
    find = {(r["side"], r["tasks"]): r for r in rows}
    before = c.get("before")
    lines = ["| chunk tasks | placing, ns per task | a report, ns |", "| ---: | ---: | ---: |"]

    def cell(n: int, m: str) -> str:
        a, b = find.get(("after", n)), find.get(("before", n))
        text = f"{a[m]:.0f}" if a else "-"
        return text + (f" ({b[m]:.0f} at `{before}`)" if b else "")

    for n in sorted({r["tasks"] for r in rows}):
        lines.append(f"| {n:,} | {cell(n, 'submit_ns')} | {cell(n, 'report_ns')} |")
    command = f"python benchmarks/forecast_scale.py --repeats {c['repeats']}"
    if before:
        command += f" --before {before}"
    return table_end(
        lines,
        f"CPU, medians of {c['repeats']} new processes per side ({c['rounds']} placements each, "
        f"{c['reports']:,} reports; {c['nodes']} nodes; the sizes of up to 500,000 chunks known, each "
        "with its holder)" + (f"; in parentheses the same at `{before}`." if before else "."),
        doc["results"].get("checks", {}),
        doc,
        command,
    )


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if serve_child(argv, child):
        return 0
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--tasks", type=counts, default=None, help="chunk tasks placed at once (default 1e4,1e5,1e6)")
    p.add_argument("--nodes", type=int, default=64, help="nodes (default 64)")
    p.add_argument("--rounds", type=int, default=5, help="placements per process (median; default 5)")
    p.add_argument("--reports", type=int, default=100_000, help="reports per process (default 100000)")
    p.add_argument("--repeats", type=int, default=None, help="new processes per side (median; default 5)")
    p.add_argument("--before", default=None, help="also measure the code of this commit (a git worktree)")
    a = p.parse_args(argv)
    tasks = a.tasks or ([1000, 10_000] if a.quick else list(TASKS))
    repeats = a.repeats or (1 if a.quick else 5)
    reports = min(a.reports, 10_000) if a.quick else a.reports
    config = {"tasks": tasks, "nodes": a.nodes, "rounds": a.rounds, "reports": reports, "repeats": repeats,
              "quick": a.quick}  # fmt: skip
    codes = {"after": REPO}
    raw: list[dict] = []
    tic = time.perf_counter()
    with contextlib.ExitStack() as trees:
        work = trees.enter_context(tempfile.TemporaryDirectory(prefix="forecast-scale-"))
        config["before"] = None
        if a.before:
            config["before"], codes["before"] = trees.enter_context(commit_tree(a.before, work))
        for i in range(repeats):
            for side in list(codes) if i % 2 == 0 else list(codes)[::-1]:
                spec = {"code": codes[side], "tasks": tasks, "nodes": a.nodes, "rounds": a.rounds,
                        "reports": reports, "seed": i}  # fmt: skip
                doc = run_child(__file__, codes[side], spec)
                for r in doc["rows"]:
                    raw.append({"side": side, "repeat": i, **r})
                    print(f"{side:6} {r['tasks']:>9,} tasks: placing {r['submit_ns']:.0f} ns a task, "
                          f"a report {r['report_ns']:.0f} ns", flush=True)  # fmt: skip
    summary = summarize(raw)
    results = {"summary": summary, "checks": checks(summary), "cases": raw}
    save_results(a.out, "forecast_scale_quick" if a.quick else "forecast_scale", config, results, tic, plot, summary,
                 ["side", "tasks", *MEASURES])
    return 0


if __name__ == "__main__":
    sys.exit(main())
