"""What the first inserts after a warm run of a whole node cache cost, against the packs it holds.

A warm run looks up every pack of a node cache once.  The ``rank`` policy writes each
lookup's record of when the entry goes stale to an inbox, where it waits until the next
eviction moves it into the log (or makes the log again from the rows): only a write
transaction does that.  The first run of new data after it then inserts: each insert's
pre-check (the policy's plan of victims on the index as it is, before the pack's data file is
written; read only) meets every record of that warm run, and, with the background writer that
workers use, every chunk task's insert makes one until the writer's first batch commits.

Each (cache size, side, repeat) is one new process on a cache built as such a warm run leaves
it (:func:`benchmarks.store_scale.build` with ``looked_up=True, moved=False``: full, every
row looked up once, its record in the inbox, the fresh watermark at the first row, data files
in ``/dev/shm``).  It times ``--prechecks`` pre-checks of new packs (``Admitter.admits``, CPU),
then ``--puts`` inserts through a 256 MiB write queue as a worker makes them (``put_pack``:
the task thread's CPU per insert; all threads' CPU until the queue is written), then the
pre-checks again.  ``--before REV`` runs the same processes on the code of commit ``REV``
(a git worktree), alternating with this checkout's; a side's pre-checks stop after one over
``--limit`` seconds.  Medians of ``--repeats``.

    python benchmarks/precheck_scale.py [--before REV]
    python benchmarks/precheck_scale.py --quick
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks._common import (  # noqa: E402
    commit_tree, counts, not_measured, parser, pyplot, read_results, run_child, save_png, save_results, serve_child,
    table_end,
)  # fmt: skip

REPO = os.path.dirname(HERE)
PACKS = (1_000, 10_000, 100_000, 1_000_000)
WORK = "/dev/shm" if os.path.isdir("/dev/shm") else None
LIMIT_S = 5.0
#: This checkout's pre-check and task-thread insert at the most packs within this factor of
#: the same at the fewest (the cost does not grow with the packs the warm run looked up).
FLAT_BOUND = 1.5
MEASURES = ("precheck_ms", "put_ms", "put_max_ms", "behind_ms", "precheck_after_ms")


def child(spec: dict) -> dict:
    """In the measured code's process: pre-checks, inserts through the write queue, pre-checks."""
    sys.path.insert(0, spec["code"])
    import cacheaffinity
    from benchmarks.store_scale import _arrays, _where
    from cacheaffinity.worker._store import ColumnCache

    out: dict = {"code": os.path.dirname(os.path.dirname(cacheaffinity.__file__))}
    with ColumnCache(spec["directory"], admission="rank", write_queue="256 MiB") as cache:
        adm = cache.admission
        # the capacity in force, as an insert's pre-check plans in it (an Admitter kept the
        # configured one until its first insert transaction before 2026-11-30)
        adm._policy.capacity = cache.capacity

        def prechecks(tag: str) -> list[float]:
            times = []
            for i in range(spec["prechecks"]):
                c0 = time.process_time()
                adm.admits(f"{tag}-{i}", spec["pack_bytes"])
                times.append(time.process_time() - c0)
                if times[-1] > spec["limit"]:
                    break
            return times

        first = prechecks("precheck")
        puts = []
        c0 = time.process_time()
        for i in range(spec["puts"]):  # a first run's chunk tasks: new packs
            t0 = time.thread_time()
            cache.put_pack(*_where(10**8 + i, "n"), _arrays(i))
            puts.append(time.thread_time() - t0)
        cache.flush()
        behind = time.process_time() - c0
        after = prechecks("after")
        stats = cache.stats()
    out.update({
        "precheck_ms": 1e3 * statistics.median(first), "prechecks_done": len(first),
        "put_ms": 1e3 * statistics.median(puts), "put_max_ms": 1e3 * max(puts),
        "behind_ms": 1e3 * behind / len(puts), "precheck_after_ms": 1e3 * statistics.median(after),
        "stored": stats.get("writes", 0), "not_admitted": stats.get("not_admitted", 0),
    })  # fmt: skip
    return out


def summarize(raw: list[dict]) -> list[dict]:
    """Medians per (side, packs) over the repeats."""
    groups: dict[tuple, list[dict]] = {}
    for case in raw:
        groups.setdefault((case["side"], case["packs"]), []).append(case)
    return [{"side": side, "packs": n, "repeats": len(cases),
             **{m: statistics.median(c[m] for c in cases) for m in (*MEASURES, "stored", "not_admitted")}}
            for (side, n), cases in sorted(groups.items(), key=lambda kv: (kv[0][0] != "after", kv[0][1]))]  # fmt: skip


def checks(summary: list[dict]) -> dict:
    """This checkout's pre-check and task-thread insert flat in the packs (within FLAT_BOUND)."""
    mine = sorted((r for r in summary if r["side"] == "after"), key=lambda r: r["packs"])
    if len(mine) < 2:
        return {}
    lo, hi = mine[0], mine[-1]
    out = {}
    for m in ("precheck_ms", "put_ms"):
        ratio = hi[m] / lo[m]
        out[f"{m}_{hi['packs']}_vs_{lo['packs']}"] = {"ratio": round(ratio, 3), "bound": FLAT_BOUND, "met": ratio <= FLAT_BOUND}
    return out


def plot(doc: dict, path: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    titles = {"precheck_ms": "a pre-check right after the warm run", "put_ms": "an insert, the task thread (median)",
              "behind_ms": "an insert, all threads until written"}  # fmt: skip
    for ax, m in zip(axes, titles):
        for side, style in (("after", "-"), ("before", "--")):
            pts = sorted((r["packs"], r[m]) for r in doc["results"]["summary"] if r["side"] == side)
            if pts:
                label = "this checkout" if side == "after" else f"before ({doc['config']['before']})"
                ax.plot(*zip(*pts), style, marker="o", label=label)
        ax.set(xscale="log", yscale="log", xlabel="packs in the node cache, all looked up by the warm run",
               ylabel="CPU ms", title=titles[m])  # fmt: skip
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("The first inserts after a warm run of a whole node cache (precheck_scale.py)")
    fig.tight_layout()
    save_png(fig, path)


def render(results: str, name: str = "precheck_scale") -> str:
    """The docs' table (docs/benchmarks.md, ``<!-- table:precheck_scale -->``)."""
    doc = read_results(results, name)
    if doc is None:
        return not_measured("precheck_scale.py", name)
    c = doc["config"]
    rows = doc["results"]["summary"]
    find = {(r["side"], r["packs"]): r for r in rows}
    before = c.get("before")
    lines = ["| packs | pre-check ms | insert ms, task thread: median, max | insert ms, all threads | pre-check after ms |",
             "| ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip

    def cell(n: int, m: str, fmt: str = "{:.2f}") -> str:
        a, b = find.get(("after", n)), find.get(("before", n))
        text = fmt.format(a[m]) if a else "-"
        return text + (f" ({fmt.format(b[m])} at `{before}`)" if b else "")

    def put_cell(n: int) -> str:
        a, b = find.get(("after", n)), find.get(("before", n))
        text = f"{a['put_ms']:.2f}, max {a['put_max_ms']:.1f}" if a else "-"
        return text + (f" ({b['put_ms']:.2f}, max {b['put_max_ms']:.1f} at `{before}`)" if b else "")

    for n in sorted({r["packs"] for r in rows}):
        put = put_cell(n)
        lines.append(f"| {n:,} | {cell(n, 'precheck_ms')} | {put} | {cell(n, 'behind_ms')} | {cell(n, 'precheck_after_ms')} |")
    command = f"python benchmarks/precheck_scale.py --repeats {c['repeats']}"
    if c["packs"] != list(PACKS):
        command += " --packs " + ",".join(f"{n:.0e}".replace("+0", "") for n in c["packs"])
    if before:
        command += f" --before {before}"
    return table_end(
        lines,
        f"CPU per operation, medians of {c['repeats']} new processes ({c['prechecks']} pre-checks, then {c['puts']} "
        "inserts through the write queue, then the pre-checks again); in parentheses the same at "
        f"`{before}`." if before else f"CPU per operation, medians of {c['repeats']} new processes.",
        doc["results"].get("checks", {}),
        doc,
        command,
    )


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if serve_child(argv, child):
        return 0
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--packs", type=counts, default=None, help="packs per node cache (default 1e3,1e4,1e5,1e6)")
    p.add_argument("--prechecks", type=int, default=10, help="pre-checks before and after the inserts (default 10)")
    p.add_argument("--puts", type=int, default=20, help="inserts through the write queue (default 20)")
    p.add_argument("--repeats", type=int, default=None, help="new processes per case (median; default 3)")
    p.add_argument("--before", default=None, help="also measure the code of this commit (a git worktree)")
    p.add_argument("--limit", type=float, default=LIMIT_S, help="pre-checks stop after one over this (s)")
    p.add_argument("--work", default=WORK, help=f"where the caches are built (default: {WORK})")
    a = p.parse_args(argv)
    from benchmarks.store_scale import build

    sizes = a.packs or ([1000, 4000] if a.quick else list(PACKS))
    repeats = a.repeats or (1 if a.quick else 3)
    work = tempfile.mkdtemp(prefix="precheck-scale-", dir=a.work)
    codes = {"after": REPO}
    before = None
    trees = contextlib.ExitStack()
    config = {"packs": sizes, "prechecks": a.prechecks, "puts": a.puts, "repeats": repeats, "limit_s": a.limit,
              "quick": a.quick}  # fmt: skip
    raw: list[dict] = []
    tic = time.perf_counter()
    try:
        if a.before:
            before, codes["before"] = trees.enter_context(commit_tree(a.before, work))
        config["before"] = before
        for n in sizes:
            for i in range(repeats):
                for side in list(codes) if i % 2 == 0 else list(codes)[::-1]:
                    d = os.path.join(work, f"{side}-{n}-{i}")
                    os.makedirs(d)
                    built = build(d, n, looked_up=True, moved=False)
                    spec = {"code": codes[side], "directory": d, "pack_bytes": built["pack_bytes"],
                            "prechecks": a.prechecks, "puts": a.puts, "limit": a.limit}  # fmt: skip
                    doc = run_child(__file__, codes[side], spec)
                    shutil.rmtree(d)
                    doc["code"] = side  # (the worktree's path is this machine's)
                    raw.append({"side": side, "packs": n, "repeat": i, **doc})
                    print(f"{side:6} {n:>9,} packs: pre-check {doc['precheck_ms']:.2f} ms, insert {doc['put_ms']:.2f} ms "
                          f"(max {doc['put_max_ms']:.1f}), all threads {doc['behind_ms']:.2f} ms, after "
                          f"{doc['precheck_after_ms']:.2f} ms", flush=True)  # fmt: skip
    finally:
        trees.close()
        shutil.rmtree(work, ignore_errors=True)
    summary = summarize(raw)
    results = {"summary": summary, "checks": checks(summary), "cases": raw}
    save_results(a.out, "precheck_scale_quick" if a.quick else "precheck_scale", config, results, tic, plot, summary,
                 ["side", "packs", *MEASURES])
    return 0


if __name__ == "__main__":
    sys.exit(main())
