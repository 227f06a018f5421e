"""What the worker's guard of ``sys._current_frames()`` costs, against the threads a worker has.

On Python < 3.12 the worker plugin wraps ``sys._current_frames`` so that the garbage
collector is disabled while it runs (:func:`cacheaffinity.worker._collector.guard_frame_snapshots`,
CPython gh-106883). Dask's profiler calls it every 10 ms (``Worker.trigger_profile``) in
every worker process. Its cost grows with the threads of the process, whose frames it
returns. This script starts ``T`` threads, each waiting ``--depth`` calls deep (a worker's
task, comm and writer threads), and times the plain call and the guarded one side by side,
alternating, in one process. Medians of ``--repeats`` rounds of ``--calls`` calls each.

The bound: the guard adds at most :data:`BOUND_US_PER_S` µs of CPU per second of profiling
(100 snapshots a second) at any thread count, 0.1% of a core.

    python benchmarks/frame_snapshots.py [--threads 1,4,16,64] [--repeats 7]
    python benchmarks/frame_snapshots.py --quick
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks._common import (  # noqa: E402
    counts, not_measured, parser, pyplot, read_results, save_png, save_results, table_end,
)  # fmt: skip
from cacheaffinity.worker._collector import _without_collector  # noqa: E402

THREADS = (1, 4, 16, 64)
#: Dask's profiler: one snapshot every 10 ms (``distributed.worker.profile.interval``).
SNAPSHOTS_PER_S = 100
#: The guard's extra CPU per second of profiling, at most (µs; 0.1% of one core).
BOUND_US_PER_S = 1000.0


def _wait(depth: int, release: threading.Event) -> None:
    if depth > 0:
        _wait(depth - 1, release)
    else:
        release.wait()


def _per_call_us(fn, calls: int) -> float:
    t0 = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - t0) / calls * 1e6


def measure(threads: int, depth: int, calls: int, repeats: int) -> dict:
    """Plain and guarded ``sys._current_frames()`` with ``threads`` waiting threads (CPU µs
    per call, medians of ``repeats`` alternating rounds)."""
    plain = sys._current_frames
    plain = getattr(plain, "__wrapped__", plain)  # this process may be guarded already
    guarded = _without_collector(plain)
    release = threading.Event()
    pool = [threading.Thread(target=_wait, args=(depth, release), daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    try:
        while len(plain()) < threads + 1:
            time.sleep(0.001)
        rounds: dict[str, list[float]] = {"plain": [], "guarded": []}
        for i in range(repeats):
            order = ("plain", "guarded") if i % 2 == 0 else ("guarded", "plain")
            for side in order:
                rounds[side].append(_per_call_us(plain if side == "plain" else guarded, calls))
    finally:
        release.set()
        for t in pool:
            t.join(10)
    p, g = statistics.median(rounds["plain"]), statistics.median(rounds["guarded"])
    return {"threads": threads, "plain_us": round(p, 3), "guarded_us": round(g, 3), "ratio": round(g / p, 3),
            "extra_us": round(g - p, 3), "extra_us_per_s": round((g - p) * SNAPSHOTS_PER_S, 1),
            "rounds": rounds}  # fmt: skip


def checks(rows: list[dict]) -> dict:
    return {f"guard_cpu_per_s_{r['threads']}_threads": {"value": r["extra_us_per_s"], "bound": BOUND_US_PER_S,
                                                         "met": r["extra_us_per_s"] <= BOUND_US_PER_S}
            for r in rows}  # fmt: skip


def plot(doc: dict, path: str) -> None:
    plt = pyplot()
    rows = doc["results"]["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    x = [r["threads"] for r in rows]
    axes[0].plot(x, [r["plain_us"] for r in rows], "--", marker="o", label="sys._current_frames()")
    axes[0].plot(x, [r["guarded_us"] for r in rows], "-", marker="o", label="guarded (collector off)")
    axes[0].set(xscale="log", yscale="log", xlabel="threads waiting in the process", ylabel="CPU µs per call",
                title="one snapshot")  # fmt: skip
    axes[1].plot(x, [r["ratio"] for r in rows], marker="o")
    axes[1].axhline(1.0, color="grey", lw=0.8)
    axes[1].set(xscale="log", xlabel="threads waiting in the process", ylabel="guarded / plain",
                title="the guard's share")  # fmt: skip
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("sys._current_frames() with and without the worker's guard (frame_snapshots.py)")
    fig.tight_layout()
    save_png(fig, path)


def render(results: str, name: str = "frame_snapshots") -> str:
    """The docs' table (docs/benchmarks.md, ``<!-- table:frame_snapshots -->``)."""
    doc = read_results(results, name)
    if doc is None:
        return not_measured("frame_snapshots.py", name)
    c = doc["config"]
    lines = ["| threads | plain µs | guarded µs | guarded / plain | guard's CPU per second of profiling |",
             "| ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for r in doc["results"]["rows"]:
        lines.append(f"| {r['threads']} | {r['plain_us']:.2f} | {r['guarded_us']:.2f} | {r['ratio']:.2f}x | "
                     f"{r['extra_us_per_s']:.0f} µs |")  # fmt: skip
    command = f"python benchmarks/frame_snapshots.py --repeats {c['repeats']}"
    if c["threads"] != list(THREADS):
        command += " --threads " + ",".join(map(str, c["threads"]))
    return table_end(
        lines,
        f"CPU per call, medians of {c['repeats']} alternating rounds of {c['calls']:,} calls, threads waiting "
        f"{c['depth']} calls deep; Python {doc['results']['python']}. The last column is the guarded call's extra "
        f"CPU at Dask's {SNAPSHOTS_PER_S} snapshots a second.",
        doc["results"]["checks"],
        doc,
        command,
    )


def main(argv=None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--threads", type=counts, default=None, help="waiting threads (default 1,4,16,64)")
    p.add_argument("--depth", type=int, default=20, help="calls deep each thread waits (default 20)")
    p.add_argument("--calls", type=int, default=None, help="calls per round (default 20000; --quick 500)")
    p.add_argument("--repeats", type=int, default=None, help="alternating rounds (median; default 7)")
    a = p.parse_args(argv)
    threads = a.threads or ([1, 8] if a.quick else list(THREADS))
    calls = a.calls or (500 if a.quick else 20_000)
    repeats = a.repeats or (3 if a.quick else 7)
    config = {"threads": threads, "depth": a.depth, "calls": calls, "repeats": repeats, "quick": a.quick}
    tic = time.perf_counter()
    rows = [measure(n, a.depth, calls, repeats) for n in threads]
    results = {"rows": rows, "checks": checks(rows), "python": sys.version.split()[0]}
    save_results(a.out, "frame_snapshots_quick" if a.quick else "frame_snapshots", config, results, tic, plot, rows,
                 ["threads", "plain_us", "guarded_us", "ratio", "extra_us_per_s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
