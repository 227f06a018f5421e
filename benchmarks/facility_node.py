"""Benchmark: a warm coffea run on facility-sized node caches, `rank` admission against `fifo`.

An analysis facility's node cache is not empty when an analysis starts: it holds 10^4-10^6
packs of earlier work, shared by the node's worker processes.  This runs the real thing at
that shape and asks whether the default admission policy (`rank`) keeps the warm run as
fast as `fifo` and as fast as on an empty cache, from 0 to 10^6 other packs per node:

- the realistic analysis (``examples/realistic.py``, ~180 branches) over the headline's
  generated NanoAOD-like LZMA files and chunks (160,000 events in 8 files, chunks of 10,000
  entries: 16 chunk tasks a run) read from the local disk, 2 cache nodes x 2 single-threaded worker
  processes (each node's processes share its directory), 3 consecutive runs;
- before run 1 each node's cache holds ``N`` packs of other data in the store's own format
  (index rows and data files, as ``benchmarks/store_scale.py`` builds them), ``--sizes``;
- each (N, policy) is one invocation of the consecutive-run harness
  (``consecutive_runs.py --workers 2 --per-node 2 --other-packs N --admission P --modes
  cacheaffinity --no-floors --processes same``; fresh cluster and caches), the two policies
  alternating which goes first, ``--rounds`` times.

Per round and size: run 1, 2 and 3 walls and the run-2 hit rate per policy; run 2 `rank` /
`fifo` (paired within the round) and run 2 at N / run 2 at the smallest N (same policy, same
round).  Checks (stated in the JSON, printed): run 2 all hits; `rank` / `fifo` <= 1.10 at
every size; `rank` at the largest size / at the smallest <= 1.10.  Walls are noisy on a
2-core machine: read the ratios, medians over rounds, [min, max].

    python benchmarks/facility_node.py [--sizes 0,4e4,1e5,1e6] [--rounds 3]
        [--events 160000] [--files 8] [--chunksize 10000]

Writes benchmarks/results/facility_node.json and .png (``--out``); ``--quick``: a smoke test.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks._common import counts, git_info, parser, print_table, pyplot, save_png, spread, write_json  # noqa: E402

POLICIES = ("rank", "fifo")
#: bounds of the checks: `rank` / `fifo` run 2, and run 2 at the largest size / the smallest
BOUND = 1.10
SHAPE = ("--workers", "2", "--per-node", "2")


def harness_command(n: int, policy: str, args, out: str, name: str) -> list[str]:
    """The consecutive-run harness for one size and policy (a fresh cluster and caches)."""
    return [
        sys.executable, os.path.join(HERE, "consecutive_runs.py"), *SHAPE,
        "--events", str(args.events), "--files", str(args.files), "--chunksize", str(args.chunksize),
        "--runs", str(args.runs), "--repeats", "1", "--analysis", "realistic", "--storage", "local",
        "--rate", "none", "--modes", "cacheaffinity", "--scenarios", "stable", "--no-floors",
        "--processes", "same", "--other-packs", str(n), "--admission", policy, "--data", args.data,
        "--out", out, "--name", name,
    ]  # fmt: skip


def runs_of(doc: dict) -> list[dict]:
    """The cacheaffinity runs of a consecutive-run results document (run 1 first)."""
    rows = doc["results"]["repeats"][0]["sequences"]["stable"]["cacheaffinity"]
    return sorted(rows, key=lambda r: r["run"])


def one(n: int, policy: str, args, out: str) -> dict:
    name = f"facility-{n}-{policy}"
    t0 = time.perf_counter()
    subprocess.run(harness_command(n, policy, args, out, name), check=True,
                   stdout=subprocess.DEVNULL if not args.verbose else None)  # fmt: skip
    with open(os.path.join(out, f"{name}.json")) as f:
        doc = json.load(f)
    runs = runs_of(doc)
    row = {"packs": n, "policy": policy, "invocation_s": time.perf_counter() - t0,
           "identical_results": doc["results"].get("identical_results")}  # fmt: skip
    for r in runs:
        row[f"run{r['run']}_s"] = r["wall_s"]
        row[f"run{r['run']}_hit_rate"] = r.get("cache_rate")
    return row


def summarize(rows: list[dict], sizes: list[int]) -> dict:
    """Per size and policy, medians [min, max] over the rounds; the paired ratios; checks."""
    find = {(r["round"], r["packs"], r["policy"]): r for r in rows}
    rounds = sorted({r["round"] for r in rows})
    out: dict = {"per_size": [], "checks": {}}
    for n in sizes:
        item: dict = {"packs": n}
        for p in POLICIES:
            got = [find[(k, n, p)] for k in rounds if (k, n, p) in find]
            for run in ("run1_s", "run2_s", "run3_s", "run2_hit_rate"):
                item[f"{p}_{run}"] = spread([g.get(run) for g in got])
            item[f"{p}_vs_smallest"] = spread([
                find[(k, n, p)]["run2_s"] / find[(k, sizes[0], p)]["run2_s"]
                for k in rounds if (k, n, p) in find and (k, sizes[0], p) in find
            ])  # fmt: skip
        item["rank_vs_fifo"] = spread([
            find[(k, n, "rank")]["run2_s"] / find[(k, n, "fifo")]["run2_s"]
            for k in rounds if (k, n, "rank") in find and (k, n, "fifo") in find
        ])  # fmt: skip
        out["per_size"].append(item)
        ratio = item["rank_vs_fifo"]["median"]
        out["checks"][f"rank_vs_fifo_run2_{n}"] = {"ratio": ratio, "bound": BOUND,
                                                   "met": ratio is not None and ratio <= BOUND}  # fmt: skip
    last = out["per_size"][-1]["rank_vs_smallest"]["median"]
    out["checks"][f"rank_run2_{sizes[-1]}_vs_{sizes[0]}"] = {"ratio": last, "bound": BOUND,
                                                             "met": last is not None and last <= BOUND}  # fmt: skip
    hits = [r.get("run2_hit_rate") for r in rows]
    out["checks"]["run2_all_hits"] = {"value": min(h for h in hits if h is not None) if any(h is not None for h in hits) else None,
                                      "bound": 1.0, "met": all(h == 1 for h in hits)}  # fmt: skip
    out["checks"]["identical_results"] = {"value": all(r.get("identical_results") for r in rows), "bound": True,
                                          "met": all(r.get("identical_results") for r in rows)}  # fmt: skip
    return out


def plot(summary: dict, path: str, commit: str = "") -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    sizes = [s["packs"] for s in summary["per_size"]]
    xs = [max(n, 1) for n in sizes]  # 0 drawn at 1 on the log axis
    for p, style in zip(POLICIES, ("o-", "s--")):
        for run, alpha in (("run2_s", 1.0), ("run3_s", 0.45)):
            med = [s[f"{p}_{run}"]["median"] for s in summary["per_size"]]
            lo = [m - s[f"{p}_{run}"]["min"] for m, s in zip(med, summary["per_size"])]
            hi = [s[f"{p}_{run}"]["max"] - m for m, s in zip(med, summary["per_size"])]
            ax.errorbar(xs, med, yerr=[lo, hi], fmt=style, alpha=alpha, capsize=3,
                        label=f"{p}, {run[:4]} {run[3]}")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels(["0" if n == 0 else f"{n:.0e}".replace("+0", "") for n in sizes])
    ax.set_ylim(0, None)
    ax.set_xlabel("other packs in each node's cache before run 1")
    ax.set_ylabel("wall, s (median, [min, max])")
    ax.legend(fontsize=8)
    ax.set_title(f"warm runs, 2 nodes x 2 processes, realistic analysis {commit[:7]}", fontsize=9)
    save_png(fig, path)


def render(results: str, name: str = "facility_node") -> str:
    """The docs' table (``<!-- table:facility_node -->``) from ``<name>.json``."""
    from benchmarks._common import measured_at, not_measured, read_results

    doc = read_results(results, name)
    if doc is None:
        return not_measured("facility_node.py", name)
    c, s = doc["config"], doc["summary"]

    def cell(d, f="{:.2f}"):
        if d.get("median") is None:
            return "-"
        return f"{f.format(d['median'])} [{f.format(d['min'])}, {f.format(d['max'])}]"

    lines = [
        "| other packs per node | run 2 s `rank` | run 2 s `fifo` | run 2 `rank` / `fifo` | run 2 `rank` / at "
        f"{s['per_size'][0]['packs']:,} | run 3 s `rank` / `fifo` | run 1 s `rank` / `fifo` | run 2 hits `rank` / `fifo` |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]  # fmt: skip
    for it in s["per_size"]:
        lines.append(
            f"| {it['packs']:,} | {cell(it['rank_run2_s'])} | {cell(it['fifo_run2_s'])} | {cell(it['rank_vs_fifo'])} "
            f"| {cell(it['rank_vs_smallest'])} | {it['rank_run3_s']['median']:.2f} / {it['fifo_run3_s']['median']:.2f} "
            f"| {it['rank_run1_s']['median']:.1f} / {it['fifo_run1_s']['median']:.1f} "
            f"| {it['rank_run2_hit_rate']['min']:.0%} / {it['fifo_run2_hit_rate']['min']:.0%} |"
        )  # fmt: skip
    met = [k for k, v in s["checks"].items() if v.get("met")]
    def value(v):
        x = v.get("ratio", v.get("value"))
        return f"{x:.3f}" if isinstance(x, float) else str(x)

    missed = [f"{k} = {value(v)} (bound {v['bound']})" for k, v in s["checks"].items() if not v.get("met")]
    sizes = ",".join("0" if n == 0 else f"{n:.0e}".replace("+0", "") for n in c["sizes"])
    command = (f"python benchmarks/facility_node.py --sizes {sizes} --rounds {c['rounds']} --events {c['events']} "
               f"--files {c['files']} --chunksize {c['chunksize']}")  # fmt: skip
    lines += [
        "",
        f"{c['events']:,} events in {c['files']} files, chunks of {c['chunksize']:,} entries, the realistic analysis, "
        f"2 nodes x 2 worker processes, files on the local disk; medians [min, max] over {c['rounds']} rounds, "
        "each (size, policy) a fresh cluster and fresh caches, the policies alternating; the ratios paired within a "
        "round (run 2 hits: the lowest over the rounds).",
        "",
        f"Checks met: {len(met)} of {len(met) + len(missed)}." + (f" Missed: {'; '.join(missed)}." if missed else ""),
        "",
        measured_at(doc, command),
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--sizes", type=counts, default=None,
                   help="other packs per node cache, comma separated (default 0,4e4,1e5,1e6)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 3)")
    p.add_argument("--runs", type=int, default=3, help="consecutive runs per invocation (>= 2)")
    p.add_argument("--events", type=int, default=None, help="events (default 160000: the headline's dataset)")
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--chunksize", type=int, default=10_000)
    p.add_argument("--data", default=os.path.join(os.path.dirname(HERE), ".bench-data", "consecutive_runs"),
                   help="where generated datasets are kept (reused)")  # fmt: skip
    p.add_argument("--verbose", action="store_true", help="show the harness's output")
    args = p.parse_args(argv)
    sizes = sorted(args.sizes or ([0, 2000] if args.quick else [0, 40_000, 100_000, 1_000_000]))
    rounds = args.rounds or (1 if args.quick else 3)
    args.events = args.events or (4000 if args.quick else 160_000)
    if args.quick and args.files == 8:
        args.files = 4
    if args.runs < 2:
        raise SystemExit("--runs must be >= 2: run 2 is what is measured")
    config = {"sizes": sizes, "rounds": rounds, "runs": args.runs, "events": args.events, "files": args.files,
              "chunksize": args.chunksize, "shape": "2 nodes x 2 processes", "analysis": "realistic",
              "storage": "local", "policies": list(POLICIES), "bound": BOUND, "quick": args.quick}  # fmt: skip
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="facility-node-") as out:
        for k in range(rounds):
            for n in sizes:
                for policy in POLICIES if (k + sizes.index(n)) % 2 == 0 else POLICIES[::-1]:
                    row = {"round": k + 1, **one(n, policy, args, out)}
                    rows.append(row)
                    print(f"round {k + 1}, {n:,} other packs, {policy}: run 1 {row['run1_s']:.2f} s, "
                          f"run 2 {row['run2_s']:.2f} s (hits {row['run2_hit_rate']:.0%}), "
                          f"run 3 {row.get('run3_s', float('nan')):.2f} s", flush=True)  # fmt: skip
    summary = summarize(rows, sizes)
    print_table([
        {"packs": it["packs"], "rank run 2": round(it["rank_run2_s"]["median"], 2),
         "fifo run 2": round(it["fifo_run2_s"]["median"], 2), "rank/fifo": round(it["rank_vs_fifo"]["median"], 3),
         "rank vs smallest": round(it["rank_vs_smallest"]["median"], 3)}
        for it in summary["per_size"]
    ])  # fmt: skip
    for k, v in summary["checks"].items():
        print(f"{k}: {v}")
    name = "facility_node_quick" if args.quick else "facility_node"
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, f"{name}.json"), config, rows, summary=summary)
    plot(summary, os.path.join(args.out, f"{name}.png"), str(git_info().get("commit") or ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
