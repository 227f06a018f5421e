"""The soak's plot and its markdown for docs/benchmarks.md (:mod:`benchmarks.soak`).

Only the standard library and benchmarks._common at the top: tools/render_readme.py imports
:func:`render` without dask or coffea.
"""

from __future__ import annotations

import math

from benchmarks._common import not_measured, pyplot, read_results

def plot(doc: dict, fig_data: dict, title: str = ""):
    """Every series by run (one subplot each), events as vertical lines."""
    plt = pyplot()
    samples = doc["samples"]
    x = [s["run"] for s in samples]
    slots = sorted({k for s in samples for k in s.get("workers", {})}, key=lambda k: int(k) if k.isdigit() else k)
    fig, axes = plt.subplots(5, 2, figsize=(13, 17))
    ax = axes.ravel()

    def per_slot(a, key, label):
        for slot in slots:
            ys = [s["workers"].get(slot, {}).get(key) for s in samples]
            a.plot(x, [math.nan if y is None else y for y in ys], lw=1, label=f"worker {slot}")
        a.set_ylabel(label)

    ax[0].plot(x, [s["scheduler_rss_mb"] for s in samples], color="k")
    ax[0].set_ylabel("scheduler RSS [MB]")
    per_slot(ax[1], "rss_mb", "worker RSS [MB]")
    ax[1].legend(fontsize=7)
    per_slot(ax[2], "fds", "worker open fds")
    ax[2].plot(x, [s["scheduler_fds"] for s in samples], color="k", lw=1, ls="--", label="scheduler")
    per_slot(ax[3], "threads", "worker threads")
    ax[3].plot(x, [s["scheduler_threads"] for s in samples], color="k", lw=1, ls="--", label="scheduler")
    # plugin structures that change after the warm-up (else the largest few)
    grown = [n for n, g in fig_data["plugin_state_growth_by_structure"].items() if g["max"] != g["first"]]
    names = sorted(grown or fig_data["plugin_state_growth_by_structure"],
                   key=lambda n: -fig_data["plugin_state_growth_by_structure"][n]["max"])[:8]  # fmt: skip
    for n in names:
        ax[4].plot(x, [s.get("plugin", {}).get(n) for s in samples], lw=1, label=n.removeprefix("plugin."))
    ax[4].set_ylabel("plugin structure length")
    ax[4].set_yscale("symlog")
    ax[4].legend(fontsize=6)
    caches = sorted({k for s in samples for k in s.get("caches", {})})
    for slot in caches:
        ax[5].plot(x, [s["caches"].get(slot, {}).get("index_bytes", math.nan) / 2**10 for s in samples],
                   lw=1, label=f"node {slot}")  # fmt: skip
        ax[6].plot(x, [s["caches"].get(slot, {}).get("data_bytes", math.nan) / 2**20 for s in samples],
                   lw=1, label=f"node {slot}")  # fmt: skip
    ax[5].set_ylabel("index files [KiB]")
    ax[6].axhline(doc["capacity_bytes"] / 2**20, color="r", ls="--", lw=1, label="capacity")
    ax[6].set_ylabel("cache data [MiB]")
    ax[6].legend(fontsize=7)
    ax[7].plot(x, [s.get("scheduler_log_lines") for s in samples], lw=1, label="scheduler lines")
    ax[7].plot(x, [s.get("worker_log_records") for s in samples], lw=1, label="worker records")
    ax[7].plot(x, [s.get("client_log_records") for s in samples], lw=1, label="client records")
    ax[7].set_ylabel("log lines per step")
    ax[7].legend(fontsize=7)
    runs = doc["runs"]
    colors = {"light": "tab:blue", "realistic": "tab:orange", "other": "tab:green"}
    for a in sorted(colors):
        rs = [r for r in runs if r["analysis"] == a and r["hit_rate"] is not None]
        ax[8].scatter([r["run"] for r in rs], [r["hit_rate"] for r in rs], s=6, color=colors[a], label=a)
        rs = [r for r in runs if r["analysis"] == a and r["wall_s"] is not None]
        ax[9].scatter([r["run"] for r in rs], [r["wall_s"] for r in rs], s=6, color=colors[a], label=a)
    ax[8].set_ylabel("hit rate")
    ax[8].legend(fontsize=7)
    ax[9].set_ylabel("wall time [s]")
    ax[9].legend(fontsize=7)
    for a in ax:
        for e in doc["events"]:
            a.axvline(e["run"], color={"kill": "r", "chunksize": "m"}.get(e["event"], "grey"), lw=0.6, alpha=0.5)
        a.axvline(fig_data["warmup_runs"], color="k", lw=0.6, ls=":")
        a.set_xlabel("run")
    for a in (ax[2], ax[3]):
        a.legend(fontsize=7)
    fig.suptitle(title or "soak", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    return fig


#: The issue's bounds, as (figure, its bound, how it is read): rendered beside the figures.
TARGETS = (
    ("scheduler_rss_mb_per_100_runs", 5.0, "under"),
    ("worker_rss_mb_per_100_runs", 5.0, "under"),
    ("fd_growth", 0, "at most"),
    ("thread_growth", 0, "at most"),
)


def _max_rss_by_half(doc: dict) -> tuple[float | None, float | None]:
    """The largest worker RSS (MB) in the first and in the second half of the runs after
    the warm-up: a worker that grows without bound has a larger one in the second half."""
    s, warmup = doc["series"], doc["config"]["warmup"]
    runs = s["run"]
    half = warmup + (max(runs) - warmup) // 2
    first, second = [], []
    for w in s["workers"].values():
        for run, rss in zip(runs, w["rss_mb"]):
            if rss is not None and run > warmup:
                (first if run <= half else second).append(rss)
    return (max(first) if first else None, max(second) if second else None)


def render(results: str, name: str = "soak", other: str = "soak_noprofiler") -> str:
    """Markdown for docs/benchmarks.md from ``<results>/<name>.json`` (Dask's profiler on)
    and ``<other>.json`` (off) side by side: every figure of the issue with its bound, the
    hit rate per kind of phase, the command and commit.  Hook: ``"soak": render`` in
    tools/render_readme.py."""
    docs = {label: read_results(results, n) for label, n in (("profiler on", name), ("profiler off", other))}
    docs = {label: d for label, d in docs.items() if d is not None}
    if not docs:
        return not_measured("soak.py", name)
    labels = list(docs)
    rows = ["| figure | bound | " + " | ".join(labels) + " |", "|" + " --- |" * (2 + len(labels))]

    def row(what: str, bound: str, cells: list) -> None:
        rows.append(f"| {what} | {bound} | " + " | ".join(str(c) for c in cells) + " |")

    def fig(key: str) -> list:
        return [d.get(key) for d in docs.values()]

    def verdict(key: str, limit: float, how: str) -> list:
        out = []
        for v in fig(key):
            ok = v is not None and (v < limit if how == "under" else v <= limit)
            out.append(f"{v} ({'met' if ok else '**missed**'})")
        return out

    row("runs", "≥ 300", fig("runs"))
    row("wrong / hung / failed runs", "0 / 0 / 0",
        [f"{d['wrong_results']} / {d['hung_runs']} / {d['failed_runs']}" for d in docs.values()])
    names = {"scheduler_rss_mb_per_100_runs": "scheduler RSS slope [MB / 100 runs]",
             "worker_rss_mb_per_100_runs": "worker RSS slope [MB / 100 runs], max over workers",
             "fd_growth": "worker fd growth (last - first), max", "thread_growth": "worker thread growth, max"}
    for key, limit, how in TARGETS:
        row(names[key], f"{how} {limit:g}", verdict(key, limit, how))
    row("worker fd / thread growth net of pools (connections, pool threads)", "-",
        [f"{d['fd_net_growth']} / {d['thread_net_growth']}" for d in docs.values()])
    row("still growing at the end (fd / thread, net of pools)", "≤ 0",
        [f"{d['fd_net_late_growth']} / {d['thread_net_late_growth']}" for d in docs.values()])
    row("largest worker RSS [MB], 1st / 2nd half of the runs", "2nd ≈ 1st",
        [" / ".join("-" if v is None else f"{v:.0f}" for v in _max_rss_by_half(d)) for d in docs.values()])
    row("scheduler fd / thread growth", "-",
        [f"{d['scheduler_fd_growth']} / {d['scheduler_thread_growth']}" for d in docs.values()])
    row("plugin structures beyond their bound", "0", [len(d["bounds"]) for d in docs.values()])
    row("cache over capacity (samples)", "0", fig("cache_over_capacity"))
    row("cache evictions", "> 0", fig("evictions"))
    row("log lines per step (scheduler / workers)", "-",
        [f"{d['log_per_step']['scheduler_log_lines']} / {d['log_per_step']['worker_log_records']}"
         for d in docs.values()])  # fmt: skip
    row("hit rate (mean of runs) / median wall [s]", "-",
        [f"{d['hit_rate']} / {d['wall_s_median']}" for d in docs.values()])
    rows.append("")
    # hit rate per kind of phase (the event that began it), of the first soak
    d = docs[labels[0]]
    kinds: dict[str, list] = {}
    for ph in d["phases"]:
        kind = ph["after"].split(",")[0].strip()
        kind = "kill a worker" if kind.startswith("kill") else kind
        kinds.setdefault(kind, []).append(ph)
    rows += [f"Hit rate per phase ({labels[0]}; the runs after each kind of event):", "",
             "| after | phases | runs | hit rate | its first run's hit rate | peer hits per run |",
             "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for kind, phs in kinds.items():
        n = sum(p["runs"] for p in phs)
        hit = sum(p["hit_rate"] * p["runs"] for p in phs) / n
        first = [p["first_run_hit_rate"] for p in phs if p["first_run_hit_rate"] is not None]
        peer = sum(p["peer_hits"] for p in phs) / n
        rows.append(f"| {kind} | {len(phs)} | {n} | {hit:.2f} | "
                    f"{(sum(first) / len(first)) if first else float('nan'):.2f} | {peer:.0f} |")  # fmt: skip
    rows.append("")
    for label, d in docs.items():
        rows.append(f"{label}: `{d['config']['command']}`, commit `{str(d.get('commit'))[:7]}`, "
                    f"{d['machine']['cpu_count']} cores, {d['results']['soak_s'] / 60:.0f} min.")  # fmt: skip
        rows.append("")
    return "\n".join(rows)


def render_long_lived(results: str, name: str = "soak_longlived", other: str = "soak_longlived_noprofiler") -> str:
    """Markdown for the long-lived soak (workers never killed nor scaled, the facility node
    shape): ``<name>.json`` (Dask's profiler on) and ``<other>.json`` (off) side by side,
    each must-show figure with its bound.  Hook: ``"soak_longlived"`` in
    tools/render_readme.py."""
    docs = {label: read_results(results, n) for label, n in (("profiler off", other), ("profiler on", name))}
    docs = {label: d for label, d in docs.items() if d is not None}
    if not docs:
        return not_measured("soak.py", name)
    rows = ["| figure | bound | " + " | ".join(docs) + " |", "|" + " --- |" * (2 + len(docs))]

    def row(what: str, bound: str, cells) -> None:
        rows.append(f"| {what} | {bound} | " + " | ".join(str(c) for c in cells) + " |")

    def judged(v, ok: bool) -> str:
        return f"{v} ({'met' if ok else '**missed**'})"

    def shape(d: dict) -> str:
        c = d["config"]
        return f"{c['workers']} nodes x {c.get('per_node', 1)} processes"

    def per_entry(d: dict) -> str:
        gs = [g for g in (d.get("index_bytes") or {}).values() if g and g.get("per_entry_first")]
        return ", ".join(f"{g['per_entry_first']:,.0f} -> {g['per_entry_last']:,.0f}" for g in gs) or "-"

    ds = list(docs.values())
    row("cluster", "-", [shape(d) for d in ds])
    row("runs (each worker in every run)", "≥ 1000", [judged(d["runs"], d["runs"] >= 1000) for d in ds])
    row("wrong / hung / failed runs", "0 / 0 / 0",
        [judged(f"{d['wrong_results']} / {d['hung_runs']} / {d['failed_runs']}",
                not (d["wrong_results"] or d["hung_runs"] or d["failed_runs"])) for d in ds])  # fmt: skip
    row("worker RSS slope, second half [MB / 100 runs], max over workers", "under 5",
        [judged(d["worker_rss_mb_per_100_runs"], (d["worker_rss_mb_per_100_runs"] or 0) < 5) for d in ds])
    row("scheduler RSS slope, second half [MB / 100 runs]", "-", [d["scheduler_rss_mb_per_100_runs"] for d in ds])
    row("largest worker RSS [MB], 1st / 2nd half of the runs", "2nd ≈ 1st",
        [" / ".join("-" if v is None else f"{v:.0f}" for v in _max_rss_by_half(d)) for d in ds])
    row("worker descriptors / threads net of pools, still growing at the end", "≤ 0 / ≤ 0",
        [judged(f"{d['fd_net_late_growth']} / {d['thread_net_late_growth']}",
                (d["fd_net_late_growth"] or 0) <= 0 and (d["thread_net_late_growth"] or 0) <= 0) for d in ds])  # fmt: skip
    row("index bytes per entry, per node: second half's start -> end", "end ≤ 1.5x start", [per_entry(d) for d in ds])
    row("index bytes per entry, end / start (worst node)", "≤ 1.5",
        [judged(d.get("index_bytes_per_entry_ratio"), (d.get("index_bytes_per_entry_ratio") or 99) <= 1.5)
         for d in ds])  # fmt: skip
    row("index WAL, largest [KiB] / free pages, largest [KiB]", "WAL ≤ ~1 MiB",
        [" / ".join(f"{max((g or {}).get(k) or 0 for g in d['index_bytes'].values()) / 1024:,.0f}"
                    for k in ("wal_max", "free_max")) for d in ds])  # fmt: skip
    row("form store: documents / bytes, largest", "≤ 4,096 / ≤ 1 GiB",
        [f"{d.get('forms_max')} / {(d.get('forms_bytes_max') or 0) / 2**10:,.0f} KiB" for d in ds])
    row("plugin structures beyond their bound", "0", [len(d["bounds"]) for d in ds])
    row("cache over capacity (samples) / evictions", "0 / > 0",
        [f"{d['cache_over_capacity']} / {d['evictions']}" for d in ds])
    row("hit rate (mean of runs) / median wall [s]", "-", [f"{d['hit_rate']} / {d['wall_s_median']}" for d in ds])
    rows.append("")
    for label, d in docs.items():
        rows.append(f"{label}: `{d['config']['command']}`, commit `{str(d.get('commit'))[:7]}`, "
                    f"{d['machine']['cpu_count']} cores, {d['results']['soak_s'] / 60:.0f} min; slopes and "
                    f"growths over runs {d['config']['warmup'] + 1}-{d['runs']}.")  # fmt: skip
        rows.append("")
    return "\n".join(rows)
