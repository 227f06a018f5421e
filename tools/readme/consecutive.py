"""The consecutive runs' tables (``consecutive_runs*.json``): README's headline, the full
table with the floors and ratios, the new-process runs, the workers' collector side by side."""

from __future__ import annotations

from benchmarks._common import served_share  # (stdlib only)
from tools.readme._format import _date, _f, _load, _pct, _spread, _spread_of, commit_label, MODE_LABELS


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
        + (" --processes " + ",".join(c["processes"])
           if c.get("processes") and list(c["processes"]) != ["same", "new"] else "")
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
    new = (r.get("headline") or {}).get("new_process")
    if new:
        lines += _consecutive_new_process(r, new)
        lines.append(f"- Results identical across all modes, runs and processes (same-process and "
                     f"new-process): {'yes' if r['identical_results'] else 'NO'}.")  # fmt: skip
    else:
        lines.append(f"- Results identical across all modes and runs: {'yes' if r['identical_results'] else 'NO'}.")
    # the new-process targets are shown met/missed beside their table
    missed = [k for k, t in r.get("targets", {}).items()
              if t.get("pass") is False and not (new and k in _new_process_target_names(r))]  # fmt: skip
    if missed:
        lines.append("- Targets missed in this measurement: " + "; ".join(
            # four digits: a ratio missed by less than 0.5% would read "1 (target <= 1.00)"
            f"{k} = {_f(r['targets'][k]['value'], 4)} (target {r['targets'][k]['limit']})" for k in missed
        ) + ".")  # fmt: skip
    return "\n".join(lines) + "\n"


#: The modes README's headline shows (docs/benchmarks.md has every mode).
HEADLINE_MODES = ("direct", "coffea-native", "xcache", "cacheaffinity")


def render_headline(results: str, name: str = "consecutive_runs") -> str:
    """README's short table: run 2 of each main mode, in the same process and in a new
    one, against cacheaffinity's; the full table is in docs/benchmarks.md."""
    doc = _load(results, name)
    if doc is None or "headline" not in doc["results"]:
        return f"Not measured yet (`make bench` writes `benchmarks/results/{name}.json`).\n"
    r, c = doc["results"], doc["config"]
    h = r["headline"]
    new = h.get("new_process") or {"modes": {}, "ratios": {}}
    repeats = len(r.get("repeats") or [None])
    lines = [
        f"Commit {commit_label(doc)}, {_date(doc)}: {int(r['dataset']['events']):,} events of "
        f"generated NanoAOD ({r['dataset']['uncompressed_bytes'] / 1e6:.0f} MB uncompressed, "
        f"{c['codec'].upper()}) read from {'an XRootD origin' if r['storage']['kind'] == 'xrootd' else 'local files'}, "
        f"{c['workers']} workers; median [min, max] of {repeats} repeat(s).",
        "",
        "| mode | run 2 s | run 2 / cacheaffinity's | run 2 hit rate "
        "| run 2 s, new process | files opened, new process |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for mode in HEADLINE_MODES:
        m, n = h["modes"].get(mode), new["modes"].get(mode) or {}
        if m is None:
            continue
        ratio = "1" if mode == "cacheaffinity" else _spread(h["ratios"].get(f"{mode} run 2 / cacheaffinity run 2"))
        row = [_spread(m["run2_wall_s"]), ratio, _spread(m["run2_hit_rate"], _pct),
               _spread(n.get("run2_wall_s")), _spread(n.get("run2_file_opens"))]  # fmt: skip
        if mode == "cacheaffinity":
            row = [f"**{x}**" for x in row]
        lines.append(f"| {MODE_LABELS.get(mode, f'`{mode}`')} | " + " | ".join(row) + " |")
    floor = h["floors"].get("coffea-in-memory") or {}
    if floor.get("median") is not None:
        lines.append(f"| floor: the same pipeline with every buffer in worker memory | {_spread(floor)} "
                     "| - | - | - | - |")  # fmt: skip
    missed = [k for k, t in r.get("targets", {}).items() if t.get("pass") is False]
    lines += [
        "",
        f"Results identical in every mode and run: {'yes' if r['identical_results'] else 'NO'}. "
        f"Targets of this measurement not met: {len(missed)} of {len(r.get('targets', {}))} "
        "(named in [benchmarks](docs/benchmarks.md), with the other modes and every other benchmark).",
    ]
    return "\n".join(lines) + "\n"


#: the new-process summary lines: (target name, label) in the order shown
NEW_PROCESS_LINES = (
    ("cacheaffinity new-process run 2: files opened (preprocessing included)",
     "cacheaffinity's new-process run 2: files opened (coffea's preprocessing included)"),
    ("cacheaffinity new-process run 2 / same-process run 2", "cacheaffinity new-process run 2 / same-process run 2"),
    ("coffea-native new-process run 2 / cacheaffinity new-process run 2", "coffea-native new-process run 2 / ours"),
    ("direct new-process run 2 / cacheaffinity new-process run 2", "direct new-process run 2 / ours"),
)


def _new_process_target_names(r: dict) -> set[str]:
    return {name for name, _ in NEW_PROCESS_LINES} | {
        k for k in r.get("targets", {}) if "new-process" in k}


def _verdict(t: dict | None) -> str:
    if not t or t.get("pass") is None:
        return "not measured"
    return f"target {t['limit']}: {'met' if t['pass'] else '**missed**'}"


def _consecutive_new_process(r: dict, new: dict) -> list[str]:
    """The new-process table (each run's client in a new Python process, the cluster
    kept) and its targets, met or missed."""
    ratios, modes = new["ratios"], new["modes"]
    out = [
        "",
        "A new Python process per run (a batch script, a restarted kernel; the workers and their "
        "caches kept): coffea's in-memory metadata cache starts empty in every run.",
        "",
        "| mode (new process per run) | run 1 s | run 2 s | run 2 / cacheaffinity's | run 2 / same-process run 2 "
        "| run 2 files opened |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for mode, m in modes.items():
        ratio = "1" if mode == "cacheaffinity" else _spread(
            ratios.get(f"{mode} new-process run 2 / cacheaffinity new-process run 2"))
        row = [_spread(m.get("run1_wall_s")), _spread(m.get("run2_wall_s")), ratio,
               _spread(ratios.get(f"{mode} new-process run 2 / same-process run 2")),
               _spread(m.get("run2_file_opens"))]  # fmt: skip
        if mode == "cacheaffinity":
            row = [f"**{x}**" for x in row]
        out.append(f"| {MODE_LABELS.get(mode, f'`{mode}`')} | " + " | ".join(row) + " |")
    out.append("")
    targets = r.get("targets", {})
    for name, label in NEW_PROCESS_LINES:
        s = (modes.get("cacheaffinity") or {}).get("run2_file_opens") if "files opened" in name else ratios.get(name)
        if s and s.get("median") is not None:
            out.append(f"- {label}: {_spread(s)} ({_verdict(targets.get(name))})")
    return out


def render_consecutive_processes(results: str, name: str = "consecutive_runs") -> str:
    """docs/benchmarks.md's details of the new-process runs (``--processes new``): per mode
    and run, wall, coffea's preprocessing, files opened, what cacheaffinity's executor
    reported, the child process's own time."""
    doc = _load(results, name)
    new = ((doc or {}).get("results", {}).get("headline") or {}).get("new_process")
    if not new:
        return (f"No new-process runs in `benchmarks/results/{name}.json` yet "
                "(`python benchmarks/consecutive_runs.py --processes same,new`).\n")  # fmt: skip
    r = doc["results"]
    same = r["headline"]["modes"]
    head = ("| mode | run 1 s | run 2 s | same-process run 2 s | run 1 / run 2 preprocessing s "
            "| run 1 / run 2 files opened | run 2 executor: storage opens, files preprocessed, "
            "metadata hits, preprocessing ms | run 2 hit rate | run 2 process s |")
    out = [head, "|" + " --- |" * (head.count("|") - 1)]
    for mode, m in new["modes"].items():
        ex = ["storage_opens", "files_preprocessed", "metadata_hits"]
        reported = [_spread(m.get(f"run2_{k}")) for k in ex]
        pre = m.get("run2_reported_preprocess_s") or {}
        reported.append(_spread(pre, lambda v: f"{v * 1000:.0f}"))
        out.append(
            f"| {MODE_LABELS.get(mode, f'`{mode}`')} | {_spread(m.get('run1_wall_s'))} | "
            f"{_spread(m.get('run2_wall_s'))} | {_spread((same.get(mode) or {}).get('run2_wall_s'))} | "
            f"{_spread(m.get('run1_preprocess_s'))} / {_spread(m.get('run2_preprocess_s'))} | "
            f"{_spread(m.get('run1_file_opens'))} / {_spread(m.get('run2_file_opens'))} | "
            + ("-" if all(x == "-" for x in reported) else ", ".join(reported))
            + f" | {_spread(m.get('run2_hit_rate'), _pct)} | {_spread(m.get('run2_process_s'))} |"
        )  # fmt: skip
    out.append("")
    out.append(
        "Median [min, max] over the repeats. Wall: the Runner call with coffea's preprocessing "
        "(what the same-process runs time); process s: the whole child process (interpreter "
        "start, imports, connecting, the run). Files opened: uproot files the workers opened "
        "(preprocessing and chunk tasks), the same counter for every mode."
    )
    per = r.get("identical_results_per_process") or {}
    across = r.get("identical_across_processes")
    out.append(
        "Results identical: same-process runs "
        + {True: "yes", False: "NO"}.get(per.get("same"), "-") + ", new-process runs "
        + {True: "yes", False: "NO"}.get(per.get("new"), "-") + ", same-process = new-process "
        + {True: "yes", False: "NO", None: "-"}[across] + "."
    )  # fmt: skip
    return "\n".join(out) + "\n"


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
                 "round 1 and the load varied, so this ratio is not a measurement of the "
                 "cache-write cost)")  # fmt: skip
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
    head = ("| mode | run 1 s | run 2 s | run 2 / cacheaffinity's | run 2 decompressed MB "
            "| run 2 origin MB | run 2 hit rate |")
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


def render_worker_gc(results: str, name: str = "consecutive_runs_worker_gc") -> str:
    """Python's collector in the workers, side by side, from
    ``consecutive_runs.py --worker-gc auto python --name consecutive_runs_worker_gc``: per
    setting and mode, run 2's wall and its full collections' share (seconds per worker
    over the run's wall), median [min, max] over the repeats."""
    doc = _load(results, name)
    if doc is None:
        return (f"Not measured yet (`python benchmarks/consecutive_runs.py --worker-gc auto python "
                f"--name {name}` writes `benchmarks/results/{name}.json`).\n")  # fmt: skip
    r, c = doc["results"], doc["config"]
    rows = ["| `worker.gc` | mode | run 2 [s] | run 3 [s] | run 2 full GC / wall | run 3 full GC / wall |",
            "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for g, d in r["worker_gc"].items():
        for mode in d["headline"]["modes"]:
            per = {k: [] for k in ("w2", "w3", "g2", "g3")}
            for rp in d.get("repeats") or []:
                rows_ = rp["sequences"]["stable"].get(mode) or []
                for i, k in ((1, "2"), (2, "3")):
                    if len(rows_) > i:
                        per["w" + k].append(rows_[i]["wall_s"])
                        per["g" + k].append(rows_[i].get("gc_full_share"))
            sp = {k: _spread_of(v) for k, v in per.items()}
            rows.append(f"| `{g}` | {MODE_LABELS.get(mode, mode)} | {_spread(sp['w2'])} | {_spread(sp['w3'])} "
                        f"| {_spread(sp['g2'], _pct)} | {_spread(sp['g3'], _pct)} |")  # fmt: skip
    cmd = (f"python benchmarks/consecutive_runs.py --events {c['events']} --files {c['files']} --chunksize "
           f"{c['chunksize']} --workers {c['workers']} --runs {c['runs']} --repeats {c['repeats']} --storage "
           f"{c['storage']} --scenarios stable --modes {' '.join(c['modes'])} --no-floors --worker-gc "
           f"{' '.join(c['worker_gc'])} --name {name}")  # fmt: skip
    rows.append("")
    rows.append(f"Results identical across settings, modes and runs: {'yes' if r['identical_results'] else 'NO'}. "
                f"Measured on {commit_label(doc)}, {_date(doc)}: `{cmd}`.")  # fmt: skip
    return "\n".join(rows) + "\n"


#: The facility node shape's bound: its run 2 at most this times the W x 1 cluster's.
NODE_SHAPE_BOUND = 1.10


def _shape_command(c: dict, name: str) -> str:
    return (f"`python benchmarks/consecutive_runs.py --analysis {c['analysis']} --events {c['events']} "
            f"--files {c['files']} --chunksize {c['chunksize']} --workers {c['workers']}"
            + (f" --per-node {c['per_node']}" if int(c.get("per_node") or 1) > 1 else "")
            + f" --runs {c['runs']} --repeats {c['repeats']} --scenarios stable --modes {' '.join(c['modes'])}"
            f" --name {name}`")  # fmt: skip


def render_node_shape(results: str, name: str = "consecutive_runs_2x2", base: str = "consecutive_runs_4x1") -> str:
    """One node per worker process (``base``: W nodes x 1) beside the facility node shape
    (``name``: nodes x processes per node sharing each node's cache directory), the same
    settings otherwise: cacheaffinity's run 1 and run 2, run 2's share served by the
    caches, the headline's ratios, and the bound on run 2 against the W x 1 cluster's."""
    shape, head = _load(results, name), _load(results, base)
    if shape is None:
        return f"Not measured yet (`benchmarks/consecutive_runs.py --per-node 2 --name {name}` writes it).\n"
    lines = [
        "| cluster | cacheaffinity run 1 s | run 2 s | run 2 served by caches | run 1 / run 2 | "
        "run 2 / floor (b) | direct / cacheaffinity run 2 | coffea-native / cacheaffinity run 2 | measured on |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    run2, commands = {}, []
    for label, key, doc in (("one node per process", base, head), ("facility node shape", name, shape)):
        if doc is None:
            continue
        c, h = doc["config"], doc["results"]["headline"]
        m, ratios = h["modes"].get("cacheaffinity") or {}, h["ratios"]
        run2[label] = (m.get("run2_wall_s") or {}).get("median")
        cells = [_spread(m.get("run1_wall_s")), _spread(m.get("run2_wall_s")), _spread(m.get("run2_cache_rate"), _pct)]
        cells += [_spread(ratios.get(r)) for r in (
            "cacheaffinity run 1 / run 2", "cacheaffinity run 2 / floor (b) coffea-in-memory",
            "direct run 2 / cacheaffinity run 2", "coffea-native run 2 / cacheaffinity run 2")]  # fmt: skip
        per = int(c.get("per_node") or 1)
        lines.append(f"| {label}: {c['workers']} nodes x {per} | " + " | ".join(cells)
                     + f" | {commit_label(doc)}, {_date(doc)} |")  # fmt: skip
        commands.append(f"{_shape_command(c, key)} ({c['repeats']} repeats)")
    lines += ["", "Medians [min, max] over the repeats of each; one after the other, alone: "
              + "; then ".join(commands) + "."]
    a, b = run2.get("facility node shape"), run2.get("one node per process")
    if a and b:
        r = a / b
        verdict = "met" if r <= NODE_SHAPE_BOUND else "**missed**"
        lines += ["", f"Run 2 of the facility node shape / one node per process: {r:.2f} (bound "
                  f"{NODE_SHAPE_BOUND:.2f}, {verdict}; medians of each invocation)."]  # fmt: skip
    return "\n".join(lines) + "\n"


def render_membership(results: str, name: str = "consecutive_runs_membership") -> str:
    """The membership scenario (``--scenarios membership``): per run the nodes, what the caches
    served (1 - decompressed / run 1's), the own node's share of the chunk bytes and of the
    lookups, the forecast, the steals; then the scenario's targets."""
    doc = _load(results, name)
    if doc is None:
        return f"Not measured yet (`benchmarks/consecutive_runs.py --scenarios membership --name {name}` writes it).\n"
    c, r = doc["config"], doc["results"]
    lines = [
        "| run | nodes | wall s | decompressed MB | served by the caches | own node, chunk bytes | "
        "own node, lookups | forecast | steals |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for mode, rows in r["sequences"]["membership"].items():
        for row in rows:
            s = row.get("last_run_stats") or {}
            d = row.get("decompressed_bytes")
            served = served_share(row, rows[0])
            own = s["chunk_bytes_hit"] / s["chunk_bytes"] if s.get("chunk_bytes") else None
            fc = (s.get("forecast") or {}).get("hit_rate")
            lines.append(f"| {row['run']} | {row['nodes']} | {_f(row['wall_s'])} | "
                         f"{_f(None if d is None else d / 1e6)} | {_pct(served)} | {_pct(own)} | "
                         f"{_pct(row.get('hit_rate'))} | {_pct(fc)} | {row.get('steals')} |")  # fmt: skip
        held, tasks = rows[2].get("removed_node_bytes_share"), rows[2].get("removed_node_share")
        lines += ["", f"`{mode}`, {c['workers']} nodes, the last removed before run 3 (it held {_pct(held)} "
                  f"of the caches' bytes and ran {_pct(tasks)} of the chunk tasks), a new one with an empty "
                  "cache added before run 4. Served by the caches: 1 - the run's decompressed bytes / run 1's "
                  "(own node or peer fetch); own node: the share of the chunk-pack bytes the node that ran a "
                  "chunk served from its own cache, and of the column lookups; the forecast counts neither "
                  "the run's steals nor a chunk another node still holds."]  # fmt: skip
    for k, t in r.get("targets", {}).items():
        if "node was" in k:
            lines.append(f"- {k}: {_f(t['value'], 4)} (target {t['limit']}: {'met' if t['pass'] else '**missed**'})")
    command = (f"python benchmarks/consecutive_runs.py --analysis {c['analysis']} --events {c['events']} "
               f"--files {c['files']} --chunksize {c['chunksize']} --workers {c['workers']} --runs {c['runs']} "
               f"--repeats {c['repeats']} --scenarios membership --modes {' '.join(c['modes'])} --no-floors "
               f"--processes {','.join(c['processes'])} --name {name}")  # fmt: skip
    lines += ["", f"Measured at {commit_label(doc)}, {_date(doc)}, `{command}`."]
    return "\n".join(lines) + "\n"
