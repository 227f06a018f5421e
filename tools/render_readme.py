"""Render the measured-results tables of README.md and docs/benchmarks.md from
benchmarks/results/*.json (run on a developer machine or in CI; no benchmark is run).

Each file (``FILES``: README.md holds the headline table only, docs/benchmarks.md every
table with its prose) holds each rendered table between marker comments::

    <!-- table:consecutive_runs -->
    ... generated, do not edit ...
    <!-- /table -->

Tables (``RENDERERS``):

``consecutive_runs``
    the headline (``consecutive_runs.json``): per mode run 2 (and run 1) wall time, origin
    and decompressed MB, hit rate, ratio to cacheaffinity's run 2; with ``--repeats`` data
    the median [min, max]; the floors and ratios; the commit it was measured on.
``consecutive_runs_light``
    the same for the light analysis (``consecutive_runs_light.json``), if measured.
``simulate_hetero``
    heterogeneous clusters (``simulate.json``, scenarios ``hetero`` and ``slowdown``): hit
    rate and makespan of runs 1-5 per policy.
``measured``
    one row per other benchmark (executor runs, cache read, warm-run profile, placement,
    stealing, scheduler CPU, scale, simulation) with its figures, command and commit.

Every figure comes from a JSON file; a JSON whose commit was stamped afterwards
(``commit_inferred``, see tools/stamp_results.py) is marked so.

    python tools/render_readme.py           # rewrite README.md and docs/benchmarks.md in place
    python tools/render_readme.py --check   # exit 1 (and show a diff) if either differs
    python tools/render_readme.py --readme F [--readme G]   # only these files
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import statistics
import sys
from collections.abc import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")
BENCHMARKS_PAGE = os.path.join(REPO, "docs", "benchmarks.md")
#: The files rendered by default.
FILES = (README, BENCHMARKS_PAGE)
RESULTS = os.path.join(REPO, "benchmarks", "results")
MARKER = re.compile(r"(<!-- table:(?P<name>[A-Za-z0-9_-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)

__all__ = ["FILES", "RENDERERS", "main", "render"]


# ----------------------------------------------------------------------------- helpers


def _load(results: str, name: str) -> dict | None:
    path = os.path.join(results, f"{name}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def commit_label(doc: dict) -> str:
    """Short hash of the commit a results file was measured on, marked when inferred or
    when the tree had local changes."""
    sha = doc.get("commit")
    if isinstance(sha, dict):  # stealing_slow_node.py's own stamp: {"sha": ..., "dirty": ...}
        sha = sha.get("sha")
    if not sha:
        return "unknown commit"
    label = f"`{sha[:7]}`"
    if doc.get("commit_inferred"):
        label += " (inferred)"
    if doc.get("dirty"):
        label += " (+ local changes)"
    return label


def _date(doc: dict) -> str:
    t = (doc.get("machine") or {}).get("time") or doc.get("created") or ""
    return t[:10]


def _f(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:.1f}"
    return f"{v:.{digits}g}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _spread(s: dict | None, fmt: Callable[[float], str] = _f) -> str:
    if not s or s.get("median") is None:
        return "-"
    if s.get("n", 1) > 1 and s["min"] != s["max"]:
        return f"{fmt(s['median'])} [{fmt(s['min'])}, {fmt(s['max'])}]"
    return fmt(s["median"])


MODE_LABELS = {
    "direct": "`direct` (coffea DaskExecutor)",
    "dask-default+cache": "`dask-default+cache` (Dask placement + our column cache)",
    "coffea-affinity+cache": "`coffea-affinity+cache` (`worker_affinity=True` + our cache)",
    "coffea-native": "`coffea-native` (`worker_affinity=True` + coffea's `BufferCache` on `zict.File`)",
    "xcache": "`xcache` (XRootD XCache proxy in front of the origin)",
    "cacheaffinity": "**`cacheaffinity`**",
}


# ----------------------------------------------------------------------------- consecutive runs


def render_consecutive_runs(results: str, name: str = "consecutive_runs") -> str:
    doc = _load(results, name)
    if doc is None:
        return f"Not measured yet (`make bench` writes `benchmarks/results/{name}.json`).\n"
    r, c = doc["results"], doc["config"]
    ds = r["dataset"]
    load = [x for x in (r.get("load_average_before"), r.get("load_average_after")) if x]
    loads = f"load average {min(x[0] for x in load):.1f}-{max(x[0] for x in load):.1f}" if load else ""
    analysis = r.get("analysis", "light")
    repeats = len(r.get("repeats") or [None])
    # the script's default modes: a JSON with exactly these needs no --modes in its command
    all_modes = ["direct", "dask-default+cache", "coffea-affinity+cache", "coffea-native", "xcache",
                 "cacheaffinity"]
    cmd = (
        f"python benchmarks/consecutive_runs.py --events {c['events']} --files {c['files']} "
        f"--chunksize {c['chunksize']} --workers {c['workers']} --runs {c['runs']}"
        + (f" --analysis {analysis} --repeats {repeats}" if "headline" in r else "")
        + (" --storage local" if c.get("storage") == "local" else "")
        + (" --modes " + " ".join(c["modes"]) if c.get("modes") and list(c["modes"]) != all_modes else "")
        + (" --scenarios " + " ".join(c["scenarios"])
           if c.get("scenarios") and list(c["scenarios"]) != ["stable", "membership"] else "")
        + (" --no-floors" if c.get("floors") is False else "")
        + (f" --native-variant {c['native_variant']}"
           if c.get("native_variant", "file") != "file" and "coffea-native" in (c.get("modes") or ()) else "")
    )  # fmt: skip
    caption = (
        f"Measured on commit {commit_label(doc)}, {_date(doc)}: {analysis} analysis, "
        f"{int(ds['events']):,} events ({ds['branches']} branches, "
        f"{ds['uncompressed_bytes'] / 1e6:.0f} MB uncompressed, {c['codec'].upper()}), "
        f"{c['workers']} nodes, storage {r['storage']['kind']}"
        + (f" ({c['rate']})" if r["storage"]["kind"] == "xrootd" and c.get("rate") else "")
        + f", {repeats} repeat(s), {loads}, {r['elapsed_s'] / 60:.0f} min; `{cmd}`."
    )
    lines = [caption, ""]
    if "headline" in r:
        lines += _consecutive_headline(r)
    else:
        lines += _consecutive_legacy(r)
    lines.append(f"- Results identical across all modes and runs: {'yes' if r['identical_results'] else 'NO'}.")
    missed = [k for k, t in r.get("targets", {}).items() if t.get("pass") is False]
    if missed:
        lines.append("- Targets missed in this measurement: " + "; ".join(
            f"{k} = {_f(r['targets'][k]['value'])} (target {r['targets'][k]['limit']})" for k in missed
        ) + ".")  # fmt: skip
    return "\n".join(lines) + "\n"


def _consecutive_legacy(r: dict) -> list[str]:
    stable = r["sequences"]["stable"]
    ca2 = stable["cacheaffinity"][1]["wall_s"]
    out = [
        "| mode (run 2) | wall s | origin MB | decompressed MB | hit rate | run 2 wall / cacheaffinity's |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for mode, rows in stable.items():
        r2 = rows[1]
        hit = _pct(r2["hit_rate"]) if r2["hit_rate"] is not None else "-"
        last = rows[-1]["hit_rate"]
        if r2["hit_rate"] is not None and last is not None and abs(last - r2["hit_rate"]) > 1e-9:
            hit += f" ({_pct(last)} by run {rows[-1]['run']})"
        origin = "-" if r2.get("origin_bytes") is None else f"{r2['origin_bytes'] / 1e6:.1f}"
        dec = "-" if r2.get("decompressed_bytes") is None else f"{r2['decompressed_bytes'] / 1e6:.1f}"
        ratio = "1" if mode == "cacheaffinity" else f"{r2['wall_s'] / ca2:.1f}x"
        wall = f"{r2['wall_s']:.1f}"
        label = MODE_LABELS.get(mode, f"`{mode}`")
        if mode == "cacheaffinity":
            wall, origin, dec, hit = (f"**{x}**" for x in (wall, origin, dec, hit))
        out.append(f"| {label} | {wall} | {origin} | {dec} | {hit} | {ratio} |")
    out.append("")
    ca = stable["cacheaffinity"]
    d1 = stable.get("direct", [None])[0]
    note = (f"- Single runs (no repeats). cacheaffinity's run 1: {ca[0]['wall_s']:.1f} s "
            f"(run 1 / run 2 = {ca[0]['wall_s'] / ca2:.1f}x)")  # fmt: skip
    if d1:
        note += (f"; `direct`'s run 1: {d1['wall_s']:.1f} s (cacheaffinity run 1 / direct run 1 = "
                 f"{ca[0]['wall_s'] / d1['wall_s']:.2f}; the clusters were not all started before "
                 "round 1 and the load varied, so this ratio is not a measurement of the cache-write cost)")  # fmt: skip
    out.append(note + ".")
    mem = (r["sequences"].get("membership") or {}).get("cacheaffinity")
    if mem and len(mem) >= 4:
        s = "- Membership: with a node removed before run 3 the hit rate was " + _pct(mem[2]["hit_rate"])
        if mem[2].get("removed_node_share") is not None:
            s += f" (the node held {_pct(mem[2]['removed_node_share'])} of the chunks)"
        s += f", with a new empty node added before run 4 {_pct(mem[3]['hit_rate'])}"
        if len(mem) >= 5:
            s += f", then {_pct(mem[4]['hit_rate'])} in run 5"
        out.append(s + ".")
    out.append("- No floors were measured in this run (they exist since the `--repeats` version).")
    return out


def _consecutive_headline(r: dict) -> list[str]:
    h = r["headline"]
    ratios = h["ratios"]
    served = any("run2_cache_rate" in m for m in h["modes"].values())  # since peer fetch
    head = "| mode | run 1 s | run 2 s | run 2 / cacheaffinity's | run 2 decompressed MB | run 2 origin MB | run 2 hit rate |"
    if served:
        head += " run 2 served by caches |"
    out = [head, "|" + " --- |" * (head.count("|") - 1)]
    for mode, m in h["modes"].items():
        ratio = "1" if mode == "cacheaffinity" else _spread(ratios.get(f"{mode} run 2 / cacheaffinity run 2"))
        row = [
            _spread(m["run1_wall_s"]), _spread(m["run2_wall_s"]), ratio,
            _spread(m["run2_decompressed_MB"]), _spread(m["run2_origin_MB"]),
            _spread(m["run2_hit_rate"], _pct),
        ]  # fmt: skip
        if served:
            row.append(_spread(m.get("run2_cache_rate"), _pct))
        if mode == "cacheaffinity":
            row = [f"**{x}**" for x in row]
        out.append(f"| {MODE_LABELS.get(mode, f'`{mode}`')} | " + " | ".join(row) + " |")
    labels = {
        "coffea-in-memory": "floor (b) `coffea-in-memory` (same pipeline, buffers in worker memory)",
        "processor-only": "floor (a) `processor-only` (`processor.process` on events in worker memory)",
    }
    for name, s in h["floors"].items():
        if s.get("median") is not None:
            out.append(f"| {labels.get(name, name)} | - | {_spread(s)} | - | 0 | 0 | - |" + (" - |" if served else ""))
    out.append("")
    out.append("All figures: median [min, max] over the repeats (fresh clusters and caches each).")
    for name, s in ratios.items():
        if " run 2 / cacheaffinity run 2" in name:
            continue
        out.append(f"- {name}: {_spread(s)}")
    pre = {m: d["run1_preprocess_s"] for m, d in h["modes"].items() if d.get("run1_preprocess_s")}
    if pre:
        out.append("- coffea's preprocessing (every file opened for its entry count; run 1 only, "
                   "later runs use the Runner's metadata cache), run 1 s: "
                   + ", ".join(f"{m} {_spread(s)}" for m, s in pre.items()))  # fmt: skip
    mem = (r["sequences"].get("membership") or {}).get("cacheaffinity")
    if mem and len(mem) >= 4:
        s = "- Membership (first repeat): node removed before run 3: hit rate " + _pct(mem[2]["hit_rate"])
        if mem[2].get("removed_node_share") is not None:
            s += f" (the node held {_pct(mem[2]['removed_node_share'])} of the chunks)"
        s += f"; new empty node added before run 4: {_pct(mem[3]['hit_rate'])}"
        out.append(s + ".")
    disk = {m: d["run2_disk_read_MB"] for m, d in h["modes"].items() if d.get("run2_disk_read_MB")}
    if disk:
        s = ("- Run 2 read from the workers' disks (`/proc/<pid>/io` read_bytes: what the page cache "
             "did not hold), MB: " + ", ".join(f"{m} {_spread(v)}" for m, v in disk.items()))
        if h.get("floor_b_disk_read_MB"):
            s += f"; floor (b) {_spread(h['floor_b_disk_read_MB'])}"
        out.append(s + ".")
    vol = r.get("decompressed_per_uncached_run")
    if vol:
        out.append(
            f"- The analysis reads {vol['branches_found']} branches: {vol['uncompressed'] / 1e6:.1f} of "
            f"{vol['total_uncompressed'] / 1e6:.1f} MB uncompressed per run "
            f"({vol['uncompressed'] / max(vol['total_uncompressed'], 1):.1%}; uproot's basket sizes)."
        )
    return out


# ----------------------------------------------------------------------------- other benchmarks


def _row(what: str, result: str, command: str, doc: dict) -> str:
    return f"| {what} | {result} | `{command}` | {commit_label(doc)}, {_date(doc)} |"


def _executor_runs(results: str) -> list[str]:
    doc = _load(results, "executor_runs")
    if doc is None:
        return []
    runs, c = doc["results"]["runs"], doc["config"]
    ds = c.get("dataset") or {}
    r2 = min((v for k, v in runs.items() if k.startswith("run ") and k != "run 1"), key=lambda v: v["wall_s"])
    floor = min((v["wall_s"] for k, v in runs.items() if k.startswith("floor")), default=None)
    dec = ds.get("uncompressed_bytes")
    res = (
        f"DaskExecutor {runs['dask']['wall_s']:.1f} s; run 1 {runs['run 1']['wall_s']:.1f} s; "
        f"best warm run {r2['wall_s']:.2f} s ({_pct(r2['hit_rate'])} hits, {r2['storage_bytes']} bytes and "
        f"{r2['storage_opens']} files from storage)"
    )
    if floor:
        res += f"; warm run / coffea-in-memory floor {r2['wall_s'] / floor:.2f}"
    if dec:
        res += f"; dataset {dec / 1e6:.0f} MB uncompressed, light analysis (a few MB decompressed per run)"
    stealing = {False: " (stealing off)", True: " (stealing on)"}.get(c.get("stealing_enabled"), "")
    return [_row(
        f"coffea runs, {c['events'] // 1000}k events {c['codec'].upper()}, {c['workers']} workers{stealing}",
        res, f"python benchmarks/executor_runs.py --events {c['events']} --files {c['files']}", doc,
    )]  # fmt: skip


def _cache_read(results: str) -> list[str]:
    doc = _load(results, "cache_read")
    if doc is None:
        return []
    res = doc["results"]
    warm = [v["cache_warm_MBps"] for v in res.values() if isinstance(v, dict) and "cache_warm_MBps" in v]
    lz = next((v for k, v in res.items() if k.upper().startswith("LZMA")), None)
    text = f"warm cache {min(warm) / 1e3:.1f}-{max(warm) / 1e3:.1f} GB/s"
    if lz:
        text += (f"; {lz['cache_warm_MBps'] / lz['uproot_warm_MBps']:.0f}x uproot on LZMA-9 "
                 f"({lz['uproot_warm_MBps']:.0f} MB/s); first-run write overhead "
                 f"{lz['write_overhead']:.1%} on LZMA-9; {lz['decompressed_bytes'] / 1e6:.0f} MB decompressed per pass")  # fmt: skip
    return [_row(f"column cache vs uproot, {doc['config'].get('threads', 1)} thread", text,
                 "python benchmarks/cache_read.py", doc)]  # fmt: skip


def _placement(results: str) -> list[str]:
    doc = _load(results, "placement")
    if doc is None:
        return []
    r = doc["results"]

    def load(method, nodes=100, chunks=100_000):
        return next((x["max_over_mean"] for x in r["load"] if x["method"] == method
                     and x["nodes"] == nodes and x["chunks"] == chunks), None)  # fmt: skip

    rows = []
    d3, d3b = load("torus-D3"), load("torus-D3-b1.05")
    if d3:
        rows.append(_row("placement balance, 100 nodes x 100k chunks",
                         f"max/mean {d3:.2f} (D=3, {doc['config']['replicas']} replicas)"
                         + (f", {d3b:.3f} with `balance=1.05`" if d3b else ""),
                         "python benchmarks/placement.py", doc))  # fmt: skip
    tgt = {(x["method"], x["chunks"]): x for x in r.get("target", [])}
    t3 = tgt.get(("torus-D3", 1_000_000)) or tgt.get(("torus-D3", 100_000))
    t4 = tgt.get(("torus-D4", 1_000_000)) or tgt.get(("torus-D4", 100_000))
    if t3:
        rows.append(_row("placement cost, 1000 nodes x 100 replicas",
                         f"{t3['us_per_chunk_best']:.2f} us per chunk batched (D=3"
                         + (f"; D=4: {t4['us_per_chunk_best']:.2f})" if t4 else ")"),
                         "python benchmarks/placement.py", doc))  # fmt: skip
    dis = {(x["method"], x["nodes"]): x for x in r.get("disruption", [])}
    t = dis.get(("torus-D3", 100))
    mod = dis.get(("mod", 100))
    if t:
        text = (f"remove/add one node moves {t['remove']['median']:.2f}/{t['add']['median']:.2f} x the "
                f"ideal 1/n (D=3), {t['remove']['between_survivors_max']} moves between survivors")  # fmt: skip
        if mod:
            text += f" (hash % n: {mod['remove']['median']:.0f}x)"
        rows.append(_row("placement disruption, 100 nodes", text, "python benchmarks/placement.py", doc))
    return rows


def _stealing(results: str) -> list[str]:
    doc = _load(results, "stealing_slow_node")
    if doc is None:
        return []
    r, c = doc["results"], doc["config"]
    if "per_run" in r:  # --repeats layout: medians over the repeats
        st, ca = r["per_run"]["stock"], r["per_run"]["cacheaffinity"]
        hit = "hit_rate_median"
        reps = c.get("repeats", 1)
        what = "single runs" if reps == 1 else f"median of {reps} repeats"
    else:
        st, ca = r["runs"]["stock"], r["runs"]["cacheaffinity"]
        hit, what, reps = "hit_rate", "single runs", 1
    text = (f"run-2 hit rate {_pct(ca[1][hit])} (Dask's stock stealing: {_pct(st[1][hit])}), "
            f"wall time of runs 2-{len(ca)} {r['wall_ratio_later_runs']:.3f}x stock's; {what}, "
            "light analysis")  # fmt: skip
    return [_row(f"one of {c['workers']} nodes {c['slowdown']:g}x slower, {c['runs']} consecutive runs", text,
                 "python benchmarks/stealing_slow_node.py" + (f" --repeats {reps}" if reps > 1 else ""),
                 doc)]  # fmt: skip


def _scheduler_overhead(results: str) -> list[str]:
    doc = _load(results, "scheduler_overhead")
    if doc is None:
        return []
    r, c = doc["results"], doc["config"]
    if "headline" in r:
        h = r["headline"]
        load = h.get("load_1min")
        text = (f"{_spread(h['chunk_us_per_task'])} us scheduler CPU per chunk task vs "
                f"{_spread(h['plain_us_per_task'])} us per plain task restricted with `workers=` to the same "
                f"workers: {_spread(h['overhead'], lambda v: f'{v:+.1%}')} (target <= +5%: "
                + ("met" if h.get("pass") else "**missed**")
                + (" by the median; the rounds' spread is wider than the target: this run cannot tell "
                   f"+5% from {h['overhead']['min']:+.0%} or {h['overhead']['max']:+.0%}"
                   if h.get("pass") and (h["overhead"].get("max") or 0) > 0.05
                   and (h["overhead"].get("min") or 0) < 0 else "")
                + f"; {c['tasks']:,} tasks, {c['rounds']} interleaved rounds); inside the plugin's hooks "
                f"{_spread(h['hook_us_per_task'], lambda v: f'{v:.1f}')} us per task"
                + (f"; load average {load:.1f} while measured: indicative only" if load and load > 2 else ""))  # fmt: skip
        ann, plain = h.get("annotated_us_per_task"), h["plain_us_per_task"]
        idle = h.get("idle_cpu_ms_per_s") or {}
        if ann and ann.get("median") and plain.get("median"):
            text += (f". Diagnostics: the same plain tasks carrying the chunk annotations, without the plugin: "
                     f"{ann['median'] / plain['median'] - 1:+.1%}")  # fmt: skip
        if idle.get("plugin", {}).get("median") is not None and idle.get("plain", {}).get("median") is not None:
            text += (f"; idle scheduler CPU {idle['plugin']['median']:.0f} ms/s with the plugin vs "
                     f"{idle['plain']['median']:.0f} ms/s without (periodic callbacks)")  # fmt: skip
        cmd = f"python benchmarks/scheduler_overhead.py --tasks {c['tasks']} --rounds {c['rounds']}"
    else:
        med = r["median_us_per_task"]
        text = (f"{med['plugin']:.0f} vs {med['plain']:.0f} us scheduler CPU per task: "
                f"{r['overhead_vs_plain_restricted']:+.1%} vs plain restricted tasks (hash % W workers, "
                f"{c['tasks']:,} tasks, median of {c['rounds']} rounds); inside the plugin's hooks "
                f"{statistics.median(r['hook_us_per_task']):.1f} us per task = "
                f"{r['hook_share_of_scheduler_cpu']:.1%} of the scheduler's CPU")  # fmt: skip
        cmd = "python benchmarks/scheduler_overhead.py"
    return [_row("scheduler CPU per chunk task", text, cmd, doc)]


def _scheduler_scale(results: str) -> list[str]:
    doc = _load(results, "scheduler_scale")
    if doc is None:
        return []
    rows = {x["tasks"]: x for x in doc["results"]}
    big = rows[max(rows)]
    small = rows[min(rows)]
    text = (f"{big['tasks']:,} tasks placed in {big['place_s']:.1f} s "
            f"({big['place_tracemalloc_peak_bytes'] / 1e6:.0f} MB tracemalloc peak); re-targeting "
            f"{small['tasks']:,} queued tasks: {small['retarget_leave_s']:.2f} s when a node leaves, "
            f"{small['retarget_join_s']:.2f} s when one joins")  # fmt: skip
    return [_row(f"placing chunk tasks over {big['nodes']} nodes (real scheduler, fake workers)", text,
                 "python benchmarks/scheduler_scale.py", doc)]  # fmt: skip


def _simulate(results: str) -> list[str]:
    doc = _load(results, "simulate")
    if doc is None:
        return []
    r = doc["results"]
    out = []
    key = "n1000/100000"
    st = r["stable"].get(key)
    if st:
        def hit(pol, run=1, scen=st):
            return scen[pol]["runs"][run]["hit_rate"]

        text = (f"run-2 hit rate {_pct(hit('cacheaffinity'))} (torus + stock-stealing model: "
                f"{_pct(hit('paper'))}; Dask placement: {_pct(hit('dask'))})")  # fmt: skip
        ad = r["adaptive"].get(key)
        if ad:
            ca = ad["cacheaffinity"]["runs"]
            text += (f"; adaptive churn (5% of nodes replaced between and 3% during each run): "
                     f"{_pct(ca[1]['hit_rate'])} -> {_pct(ca[-1]['hit_rate'])}")  # fmt: skip
        out.append(_row("simulated 1000 nodes x 8 threads, 100k chunks, 5 runs", text,
                        "python benchmarks/simulate.py", doc))  # fmt: skip
    summ = doc.get("summary") or {}
    gaps = [(k, v) for k, v in summ.items()
            if k.startswith("adaptive vs stable") and "served by caches" not in k]  # fmt: skip
    served = [(k, v) for k, v in summ.items()
              if k.startswith("adaptive vs stable") and "served by caches" in k]  # fmt: skip

    def gap_text(what, items):
        parts = []
        for k, v in items:
            scen = k.split("(")[-1].rstrip(")")
            parts.append(f"{scen}: {v['adaptive']:.1%} vs {v['stable']:.1%} stable = "
                         f"{v['points_lost']:.1f} points")  # fmt: skip
        met = all(v["ok"] for _, v in items)
        return (f"{what} of runs 2-5 under adaptive churn vs stable: " + "; ".join(parts)
                + f" (target: within {items[0][1]['target_points']} points: "
                + ("met" if met else "**missed**") + ")")  # fmt: skip

    if gaps:
        text = gap_text("mean hit rate (own node's cache)", gaps)
        if served:
            text += "; " + gap_text("mean served by caches (own node + peer fetch)", served)
        sweep = [(k, v) for k, v in summ.items() if k.startswith("churn sweep") and "n100/" in k]
        if sweep:
            text += "; churn sweep (n100), points lost (hit rate / served by caches): " + ", ".join(
                f"{k.split(': ')[-1].split(' between')[0]} -> {v['points_lost_vs_stable']:.1f}"
                + ("" if v.get("served_points_lost_vs_stable") is None
                   else f" / {v['served_points_lost_vs_stable']:.1f}")
                for k, v in sweep
            )  # fmt: skip
        out.append(_row("adaptive churn vs stable (simulated)", text, "python benchmarks/simulate.py", doc))
    return out


def _warm_run_profile(results: str) -> list[str]:
    rows = []
    for name in ("warm_run_profile", "warm_run_profile_gcfreeze"):
        doc = _load(results, name)
        if doc is None:
            continue
        r, c = doc["results"], doc["config"]
        s = r["summary"]
        pct = lambda v: f"{v * 100:.1f}%"  # noqa: E731
        sec = lambda v: f"{v:.2f} s"  # noqa: E731
        text = (f"warm run / floor (b) {_spread(s['ratio'], lambda v: f'{v:.2f}')} "
                f"({len(r['rounds'])} rounds, page cache warm)")
        if s.get("warm_s"):
            text += f"; warm run {_spread(s['warm_s'], sec)}, floor (b) {_spread(s['floor_b_s'], sec)}"
        if s["get_many_share"]["median"] is not None:
            text += (f"; the cache's read path (`ColumnCache.get_many`) {_spread(s['get_many_share'], pct)} "
                     f"of the warm run's chunk-task samples (index query "
                     f"{_spread(s['index_query_share'], pct)}, file reads "
                     f"{_spread(s['file_reads_share'], pct)}); warm / floor (b) task samples "
                     f"{_spread(s['task_samples_ratio'], lambda v: f'{v:.2f}')}")
        if s.get("warm_full_gc_s"):
            text += (f"; Python's full garbage collections per worker and run: warm "
                     f"{_spread(s['warm_full_gc_s'], sec)}, floor (b) {_spread(s['floor_b_full_gc_s'], sec)}")
        cmd = (f"python benchmarks/warm_run_profile.py --events {c['events']} --files {c['files']} "
               f"--chunksize {c['chunksize']} --workers {c['workers']} --rounds {c['rounds']}")
        what = (f"warm run vs floor (b), {c['analysis']} analysis, {c['events'] // 1000}k events, "
                f"{c['workers']} workers, local files, py-spy")
        if c.get("gc_freeze"):
            cmd += f" --gc-freeze --name {name}"
            what += ", `gc.freeze()` on the workers after the fill run"
        rows.append(_row(what, text, cmd, doc))
    return rows


def render_measured(results: str) -> str:
    rows = ["| what | result | command | measured on |", "| --- | --- | --- | --- |"]
    for fn in (_executor_runs, _cache_read, _warm_run_profile, _placement, _stealing,
               _scheduler_overhead, _scheduler_scale, _simulate):  # fmt: skip
        rows += fn(results)
    return "\n".join(rows) + "\n"


def render_chunksize_change(results: str, name: str = "chunksize_change") -> str:
    """Per-run table of ``benchmarks/chunksize_change.py`` (issue 13)."""
    doc = _load(results, name)
    if doc is None:
        return f"(no benchmarks/results/{name}.json yet)\n"
    c = doc["config"]
    peers = any("peer_hits" in r for r in doc["results"])
    head = "| run | chunksize | chunks | wall [s] | column hit rate |"
    if peers:  # since peer fetch: misses served by the node holding them
        head += " from other nodes' caches | served by caches |"
    rows = [
        head + " files opened | bytes from storage | = IterativeExecutor |",
        "|" + " --- |" * (head.count("|") - 1 + 3),
    ]
    for r in doc["results"]:
        same = {True: "yes", False: "NO", None: "not checked"}[r.get("identical")]
        lookups = (r.get("hits") or 0) + (r.get("misses") or 0)
        extra = ""
        if peers:
            share = (r.get("peer_hits") or 0) / lookups if lookups else None
            extra = f" {_pct(share)} | {_pct(r.get('cache_rate'))} |"
        rows.append(
            f"| {r['run']} | {r['chunksize']} | {r['chunks']} | {_f(r['wall_s'])} | {_pct(r['hit_rate'])} |"
            f"{extra} {r['storage_opens']} | {r['storage_bytes']} | {same} |"
        )
    stealing = "on" if c.get("stealing", True) else "off"
    cmp_ = doc.get("warm_comparison")
    if cmp_:
        rows.append("")
        rows.append(
            f"Warm run at unchanged chunksize {cmp_['chunksize']}, cluster entries / chunk entries "
            f"(the layout before 3, per-chunk placement, on a second cluster in the same "
            f"invocation, runs interleaved): **{cmp_['ratio_median']:.2f}** (median of "
            f"{len(cmp_['ratios'])}: {', '.join(f'{r:.2f}' for r in cmp_['ratios'])})."
        )
    rows.append("")
    rows.append(
        f"{c['events']} events in {c['files']} files (LZMA-{c.get('level', 9)}, clusters of "
        f"{c['basket_events']} entries), stripes of {c['stripe_entries']} entries "
        f"({c['stripe_boundaries']} stripe boundaries), {c['workers']} worker processes, stealing "
        f"{stealing}; measured on {commit_label(doc)}, {_date(doc)}:\n"
        f"`python benchmarks/chunksize_change.py --events {c['events']} --files {c['files']} "
        f"--chunksize {c['chunksize']} --stripe-entries {c['stripe_entries']} "
        f"--basket-events {c['basket_events']} --workers {c['workers']}`"
        + ("" if c.get("stealing", True) else " `--no-stealing`")
        + ("" if c.get("peer_fetch", True) else " `--no-peers`")
    )
    return "\n".join(rows) + "\n"


#: simulate.json sections of the heterogeneous-cluster table: (scenario, case, label)
HETERO_ROWS = (
    ("hetero", "vispa/20000", "VISPA as in the paper (7x8 + 3x64 cores, NFS links 1/4 Gbit/s), 20k chunks"),
    ("hetero", "h1000/100000", "1000 nodes of 4-32 threads, per-core speed 0.5-2x, 100k chunks"),
    ("slowdown", "vispa/20000/large-0000", "VISPA, a 64-core node 2x slower from run 3"),
    ("slowdown", "vispa/20000/small-0000", "VISPA, an 8-core node 2x slower from run 3"),
    ("slowdown", "h1000/100000/d-0040", "1000 nodes, a 32-thread node 2x slower from run 3"),
    ("hetero", "vispa_nfs1g/20000",
     "old VISPA model (one 125 MB/s NFS, 500 MB/s SSDs: 64-core nodes SSD-bound from run 2)"),
)


def render_simulate_hetero(results: str, name: str = "simulate") -> str:
    """Heterogeneous clusters (issue 15) from ``simulate.json``: per scenario and policy the
    hit rate and makespan of runs 1-5 (``cacheaffinity``; ``paper`` = torus + a model of Dask's
    stock stealing; ``before`` = the previous locator, ``cacheaffinity-hashlocator``)."""
    doc = _load(results, name)
    if doc is None:
        return f"(no benchmarks/results/{name}.json yet)\n"
    r = doc["results"]

    def pct(v):
        return "100" if v >= 0.9995 else "0" if v < 0.0005 else f"{100 * v:.1f}"

    def cell(pol):
        runs = pol["runs"]
        text = (" / ".join(pct(x["hit_rate"]) for x in runs) + "; "
                + " / ".join(f"{x['makespan_s']:.0f}" for x in runs))  # fmt: skip
        served = [x.get("served_rate") for x in runs]
        if any(v is not None and v > x["hit_rate"] + 1e-9 for v, x in zip(served, runs)):
            text += "; served by caches " + " / ".join("-" if v is None else pct(v) for v in served)
        return text

    rows = ["| scenario | cacheaffinity | `paper` | `before` |", "| --- | --- | --- | --- |"]
    for scen, case, label in HETERO_ROWS:
        sec = (r.get(scen) or {}).get(case)
        if not sec:
            continue
        cols = [cell(sec[p]) if p in sec else "-" for p in ("cacheaffinity", "paper", "cacheaffinity-hashlocator")]
        rows.append(f"| {label} | " + " | ".join(cols) + " |")
    rows.append("")
    rows.append(f"Hit rate % and makespan s of runs 1-5; `python benchmarks/simulate.py`, measured on "
                f"{commit_label(doc)}, {_date(doc)}.")  # fmt: skip
    return "\n".join(rows) + "\n"


RENDERERS: dict[str, Callable[[str], str]] = {
    "simulate_hetero": render_simulate_hetero,
    "chunksize_change": render_chunksize_change,
    "chunksize_change_nostealing": lambda results: render_chunksize_change(
        results, "chunksize_change_nostealing"
    ),
    "chunksize_change_nopeers": lambda results: render_chunksize_change(
        results, "chunksize_change_nopeers"
    ),
    "consecutive_runs": render_consecutive_runs,
    "consecutive_runs_light": lambda results: render_consecutive_runs(results, "consecutive_runs_light"),
    "measured": render_measured,
}


def render(text: str, results: str = RESULTS) -> str:
    """``text`` with every marked table replaced by its rendering from ``results``."""

    def sub(m: re.Match) -> str:
        name = m.group("name")
        if name not in RENDERERS:
            raise KeyError(f"marker table:{name}: unknown table; known: {', '.join(RENDERERS)}")
        body = RENDERERS[name](results)
        return m.group(1) + "<!-- generated by tools/render_readme.py from benchmarks/results; do not edit -->\n" + body + m.group(4)

    return MARKER.sub(sub, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if a file differs from the JSON")
    p.add_argument("--readme", action="append", metavar="FILE",
                   help="render this file (repeatable); default: README.md and docs/benchmarks.md")
    p.add_argument("--results", default=RESULTS)
    a = p.parse_args(argv)
    status = 0
    for path in a.readme or FILES:
        status = max(status, _one(path, a.results, a.check))
    return status


def _one(path: str, results: str, check: bool) -> int:
    name = os.path.relpath(path, REPO) if path.startswith(REPO) else path
    with open(path) as f:
        old = f.read()
    if not MARKER.search(old):
        print(f"{path}: no <!-- table:NAME --> markers", file=sys.stderr)
        return 1
    new = render(old, results)
    if check:
        if new != old:
            sys.stdout.writelines(difflib.unified_diff(
                old.splitlines(True), new.splitlines(True), name, "rendered from JSON"))  # fmt: skip
            print(f"\n{name} differs from benchmarks/results: run python tools/render_readme.py",
                  file=sys.stderr)  # fmt: skip
            return 1
        print(f"{name} tables match benchmarks/results")
        return 0
    if new != old:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(new)
        os.replace(tmp, path)
        print(f"rewrote {path}")
    else:
        print(f"{name} already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
