"""The beyond-capacity benchmark's figures (benchmarks/beyond_capacity.py): the summary over
the repeats, the targets, the terminal table, the plot and the markdown of
docs/benchmarks.md (:func:`render`).

Only the standard library and benchmarks._common: tools/render_readme.py imports
:func:`render` without dask or coffea.
"""

from __future__ import annotations

from benchmarks._common import not_measured, pyplot, read_results, spread

__all__ = [
    "ADMISSION_KEY",
    "MODES",
    "NAME",
    "command",
    "percent",
    "evaluate_targets",
    "plot",
    "progress_line",
    "render",
    "served_share",
    "summarize",
    "table_rows",
    "title",
]

#: values of ``cacheaffinity.worker.admission`` compared
MODES = ("fifo", "rank")
ADMISSION_KEY = "cacheaffinity.worker.admission"
NAME = "beyond_capacity"
HIT_RATE_TARGET = 0.45
FORECAST_POINTS = 0.10

def _runs_of(doc: dict, mode: str, i: int) -> list[dict]:
    """Run ``i`` (1-based) of ``mode`` in every repeat."""
    out = []
    for rp in doc["repeats"]:
        rows = rp["runs"].get(mode) or []
        if len(rows) >= i:
            out.append(rows[i - 1])
    return out


def served_share(stats: dict, all_hits_served: int | None = None) -> float | None:
    """The share of the run's chunk bytes its own node's cache served: ``chunk_bytes_hit /
    chunk_bytes`` of :func:`cacheaffinity.run_stats` (the bytes of the packs each chunk read
    from its node's cache, of all it read or stored), else (a scheduler without those
    figures) ``bytes_served`` / ``all_hits_served``."""
    total, hit = stats.get("chunk_bytes"), stats.get("chunk_bytes_hit")
    if total:
        return (hit or 0) / total
    if all_hits_served and stats.get("bytes_served") is not None:
        return stats["bytes_served"] / all_hits_served
    return None


def progress_line(mode: str, rep: int, r: dict) -> str:
    hit = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}"
    fc = (r.get("forecast") or {}).get("hit_rate")
    return (f"[repeat {rep + 1}] {mode:5s} run {r['run']}: {r['wall_s']:7.2f} s, own-node hits {hit}"
            + ("" if fc is None else f" (forecast {fc:.1%})")
            + f", peer hits {r['peer_hits']}, written {r['bytes_written'] / 1e6:.1f} MB, "
            f"evictions {r['evictions']}, files opened {r['storage_opens']}, "
            f"identical {r['identical']}")  # fmt: skip


def summarize(doc: dict) -> dict:
    """Per mode and run, median [min, max] over the repeats of the run's figures; the
    run-3 comparison (measured and expected gain per repeat, then summarised)."""
    modes = list(doc["repeats"][0]["runs"]) if doc["repeats"] else []
    n_runs = max((len(v) for rp in doc["repeats"] for v in rp["runs"].values()), default=0)
    per: dict[str, list[dict]] = {}
    for mode in modes:
        per[mode] = []
        for i in range(1, n_runs + 1):
            rows = _runs_of(doc, mode, i)
            fc = [(r.get("forecast") or {}).get("hit_rate") for r in rows]
            per[mode].append({
                "run": i,
                "wall_s": spread([r["wall_s"] for r in rows]),
                "workers_cpu_s": spread([r.get("workers_cpu_s") for r in rows]),
                "hit_rate": spread([r["hit_rate"] for r in rows]),
                "served_share": spread([r.get("served_share") for r in rows]),
                "peer_hits": spread([r["peer_hits"] for r in rows]),
                "written_MB": spread([r["bytes_written"] / 1e6 for r in rows]),
                "evictions": spread([r["evictions"] for r in rows]),
                "storage_MB": spread([None if r["storage_bytes"] is None else r["storage_bytes"] / 1e6 for r in rows]),
                "storage_opens": spread([r["storage_opens"] for r in rows]),
                "forecast_hit_rate": spread(fc),
                "identical": all(r["identical"] for r in rows) if rows and all(
                    r["identical"] is not None for r in rows) else None,
            })  # fmt: skip
    cal = doc["calibration"]
    keys = ("fifo_run3_s", "rank_run3_s", "rank_run3_hit_rate", "rank_run3_served_share", "gain_s",
            "expected_gain_s", "expected_gain_lookups_s", "expected_gain_warm_s")  # fmt: skip
    gain: dict[str, list] = {k: [] for k in keys}
    for rp in doc["repeats"]:
        f, r = rp["runs"].get("fifo") or [], rp["runs"].get("rank") or []
        if len(f) < 3 or len(r) < 3:
            continue
        fs, rs = f[2]["wall_s"], r[2]["wall_s"]
        h = r[2]["hit_rate"] or 0.0
        share = r[2].get("served_share")
        share = h if share is None else share
        gain["fifo_run3_s"].append(fs)
        gain["rank_run3_s"].append(rs)
        gain["rank_run3_hit_rate"].append(h)
        gain["rank_run3_served_share"].append(share)
        gain["gain_s"].append(fs - rs)
        # the hits' share of the work a miss costs beyond a run with every buffer in memory
        gain["expected_gain_s"].append(share * (fs - cal["floor_s"]))
        gain["expected_gain_lookups_s"].append(h * (fs - cal["floor_s"]))
        gain["expected_gain_warm_s"].append(share * (fs - cal["warm_all_hits_s"]))
    return {
        "modes": per,
        "run3": {k: spread(v) for k, v in gain.items()},
        "floor_s": cal["floor_s"],
        "warm_all_hits_s": cal["warm_all_hits_s"],
        "capacity_bytes": cal["capacity_bytes"],
        "need_mean_bytes": cal["need_mean_bytes"],
    }


def evaluate_targets(doc: dict) -> dict:
    """The targets, each ``{"value", "limit", "pass", "note"}`` (pass None: not measured)."""
    s = doc["summary"]
    out: dict[str, dict] = {}
    fallback = "" if doc.get("admission_supported") else (
        f" ({ADMISSION_KEY} not a setting of this commit: both modes ran FIFO)")

    def target(name, value, limit, ok, note=""):
        out[name] = {"value": value, "limit": limit, "pass": None if value is None or ok is None else bool(ok),
                     "note": note + fallback}  # fmt: skip

    def medians(mode, key):
        runs = (s["modes"].get(mode) or [])[2:5]
        return [x[key]["median"] for x in runs]

    for key, what in (("hit_rate", "own-node hit rate (hits / lookups, run_stats)"),
                      ("served_share", "own-node served share (chunk bytes hit / chunk bytes, run_stats)")):  # fmt: skip
        rank, fifo = medians("rank", key), medians("fifo", key)
        if rank and None not in rank:
            low = min(rank)
            note = "runs 3-5 medians: " + ", ".join(f"{v:.3f}" for v in rank)
            if fifo and None not in fifo:
                note += "; FIFO's: " + ", ".join(f"{v:.3f}" for v in fifo)
            target(f"rank {what}, runs 3-5 (lowest median)", low, f">= {HIT_RATE_TARGET}",
                   low >= HIT_RATE_TARGET, note)  # fmt: skip
    g = s["run3"]
    if g["gain_s"]["median"] is not None:
        gain, exp = g["gain_s"]["median"], g["expected_gain_s"]["median"]
        note = (f"FIFO run 3 {g['fifo_run3_s']['median']:.2f} s, rank run 3 {g['rank_run3_s']['median']:.2f} s, "
                f"rank run 3 served share {g['rank_run3_served_share']['median']:.3f} (hit rate "
                f"{g['rank_run3_hit_rate']['median']:.3f}), floor (b) {s['floor_s']:.2f} s; expected gain with the "
                f"lookup hit rate {g['expected_gain_lookups_s']['median']:.2f} s, with the all-hits run "
                f"({s['warm_all_hits_s']:.2f} s) instead of floor (b) {g['expected_gain_warm_s']['median']:.2f} s")  # fmt: skip
        name = "rank run 3 faster than FIFO run 3 by >= served share x (FIFO run 3 - floor (b)) [s]"
        target(name, gain, f">= {exp:.2f}", gain >= exp if exp > 0 else None,
               note + ("" if exp > 0 else "; nothing expected (no hits, or FIFO's run 3 not slower than the floor)"))  # fmt: skip
    rows = [r for rp in doc["repeats"] for m in rp["runs"].values() for r in m]
    n_diff = sum(1 for r in rows if r["identical"] is False)
    target("results identical to IterativeExecutor (every run, mode and repeat; calibration and floors)",
           1.0 if doc["identical_results"] else 0.0, "== 1", doc["identical_results"],
           f"{n_diff} of {len(rows)} runs differ")  # fmt: skip
    for mode in s["modes"]:
        diffs: dict[str, list] = {"hit_rate": [], "served_share": []}
        for rp in doc["repeats"]:
            for r in (rp["runs"].get(mode) or [])[1:5]:
                fc = (r.get("forecast") or {}).get("hit_rate")
                for k in diffs:
                    if fc is not None and r.get(k) is not None:
                        diffs[k].append(abs(fc - r[k]))
        name = (f"{mode}: forecast within {FORECAST_POINTS * 100:.0f} points of the own-node served share "
                "(bytes), runs 2-5")  # fmt: skip
        if diffs["served_share"]:
            worst = max(diffs["served_share"])
            note = f"largest difference of {len(diffs['served_share'])} runs"
            if diffs["hit_rate"]:
                note += f"; from the hit rate of lookups: {max(diffs['hit_rate']):.3f}"
            target(name, worst, f"<= {FORECAST_POINTS}", worst <= FORECAST_POINTS + 1e-12, note)
        else:
            out[name] = {"value": None, "limit": f"<= {FORECAST_POINTS}", "pass": None,
                         "note": "no forecast reported by the scheduler"}  # fmt: skip
    return out


def table_rows(doc: dict) -> list[dict]:
    """Per mode and run: medians over the repeats (the terminal table)."""
    out = []
    for mode, runs in doc["summary"]["modes"].items():
        for x in runs:
            out.append({
                "mode": mode, "run": x["run"],
                "hit rate": percent(x["hit_rate"]["median"]),
                "served share": percent(x["served_share"]["median"]),
                "forecast": percent(x["forecast_hit_rate"]["median"]),
                "wall [s]": _num(x["wall_s"]),
                "workers CPU [s]": _num(x["workers_cpu_s"]),
                "written MB": _num(x["written_MB"]),
                "evictions": x["evictions"]["median"],
                "peer hits": x["peer_hits"]["median"],
                "storage MB": x["storage_MB"]["median"],
                "files opened": x["storage_opens"]["median"],
                "identical": {True: "yes", False: "NO", None: "-"}[x["identical"]],
            })  # fmt: skip
    return out


def percent(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _num(s: dict, fmt=lambda v: f"{v:.3g}") -> str:
    if not s or s.get("median") is None:
        return "-"
    if s.get("n", 1) > 1 and s["min"] != s["max"]:
        return f"{fmt(s['median'])} [{fmt(s['min'])}, {fmt(s['max'])}]"
    return fmt(s["median"])


def plot(doc: dict, title: str = ""):
    """Three panels by run, one colour per mode (median, bars min-max over the repeats):
    own-node hit rate (solid; dashed: served share; dotted: the forecast, where reported), wall
    time, MB written into the caches."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    panels = ((("hit_rate", "-", "hit rate"), ("served_share", "--", "served share"),
               ("forecast_hit_rate", ":", "forecast")), "own-node hits [%]", 100.0), \
        ((("wall_s", "-", ""),), "wall time [s]", 1.0), ((("written_MB", "-", ""),), "MB written to the caches", 1.0)
    modes = doc["summary"]["modes"]
    for ax, (series, label, scale) in zip(axes, panels):
        for k, (mode, runs) in enumerate(modes.items()):
            for key, ls, what in series:
                pts = [(x["run"], x[key]) for x in runs if x[key]["median"] is not None]
                if not pts:
                    continue
                xs = [r + (k - 0.5) * 0.08 for r, _ in pts]
                med = [p["median"] * scale for _, p in pts]
                err = [[(p["median"] - p["min"]) * scale for _, p in pts],
                       [(p["max"] - p["median"]) * scale for _, p in pts]]  # fmt: skip
                ax.errorbar(xs, med, yerr=err, marker={"-": "o", "--": "s"}.get(ls, "x"), ls=ls, capsize=3,
                            label=f"{mode} {what}".strip(), color=f"C{k}", ms=4)  # fmt: skip
        if series[0][0] == "hit_rate":
            ax.axhline(100 * HIT_RATE_TARGET, color="grey", ls=":", lw=1)
            ax.set_ylim(-3, 103)
        if series[0][0] == "wall_s":
            cal = doc["calibration"]
            ax.axhline(cal["floor_s"], color="grey", ls=":", lw=1, label="floor (b)")
            ax.axhline(cal["warm_all_hits_s"], color="grey", ls="--", lw=1, label="all hits")
        if series[0][0] != "hit_rate":
            ax.set_ylim(bottom=0)
        ax.set_xlabel("run")
        ax.set_ylabel(label)
        ax.set_xticks(sorted({x["run"] for runs in modes.values() for x in runs}))
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def title(doc: dict, cfg: dict) -> str:
    cap = doc["calibration"]["capacity_bytes"]
    need = doc["calibration"]["need_mean_bytes"]
    return (f"{int(doc['dataset']['events']):,} events {cfg['codec']}, {cfg['workers']} nodes, "
            f"{doc.get('chunks')} chunks; node caches {cap / 1e6:.3g} MB = {cap / need:.2f} x the mean "
            f"node's working set; median [min, max] of {cfg['repeats']} repeat(s)"
            + ("" if doc.get("admission_supported") else f"\n({ADMISSION_KEY} not available: both modes FIFO)"))


def command(cfg: dict) -> str:
    """The command line that measures with ``cfg`` (as the JSON records it)."""
    cmd = (f"python benchmarks/beyond_capacity.py --events {cfg['events']} --files {cfg['files']} "
           f"--chunksize {cfg['chunksize']} --workers {cfg['workers']} --runs {cfg['runs']} "
           f"--repeats {cfg['repeats']}")  # fmt: skip
    if cfg.get("basket_events"):
        cmd += f" --basket-events {cfg['basket_events']}"
    if cfg.get("capacity_fraction", 0.5) != 0.5 or cfg.get("capacity_basis", "mean") != "mean":
        cmd += f" --capacity-fraction {cfg['capacity_fraction']:g} --capacity-basis {cfg['capacity_basis']}"
    if cfg.get("floor_runs", 2) != 2:
        cmd += f" --floor-runs {cfg['floor_runs']}"
    if tuple(cfg.get("modes") or MODES) != MODES:
        cmd += " --modes " + " ".join(cfg["modes"])
    if cfg.get("branches"):
        cmd += " --branches " + " ".join(cfg["branches"])
    if cfg.get("all_branches"):
        cmd += " --all-branches"
    return cmd


def render(results: str, name: str = NAME) -> str:
    """Markdown for docs/benchmarks.md from ``<results>/<name>.json``: per mode and run the
    own-node hit rate, the served share (and the forecast, where reported), wall time and MB
    written into the node caches (median [min, max] over the repeats); the targets; the
    command and commit.  Hook: ``"beyond_capacity": render`` in tools/render_readme.py's
    ``RENDERERS`` (a ``<!-- table:beyond_capacity -->`` marker in docs/benchmarks.md)."""
    doc = read_results(results, name)
    if doc is None:
        return not_measured("beyond_capacity.py", name)
    r, c = doc["results"], doc["config"]
    s = r["summary"]
    forecast = any(x["forecast_hit_rate"]["median"] is not None for runs in s["modes"].values() for x in runs)
    head = ("| mode | run | own-node hit rate | served share |" + (" forecast |" if forecast else "")
            + " wall [s] | MB written |")  # fmt: skip
    rows = [head, "|" + " --- |" * (head.count("|") - 1)]

    def pct(v):
        return f"{100 * v:.1f}%"

    for mode, runs in s["modes"].items():
        for x in runs:
            cells = [f"`{mode}`", str(x["run"]), _num(x["hit_rate"], pct), _num(x["served_share"], pct)]
            if forecast:
                cells.append(_num(x["forecast_hit_rate"], pct))
            cells += [_num(x["wall_s"]), _num(x["written_MB"], lambda v: f"{v:.1f}")]
            rows.append("| " + " | ".join(cells) + " |")
    rows.append("")
    cal = r["calibration"]
    ds = r["dataset"]
    g = s["run3"]
    rows.append(
        f"{int(ds['events']):,} events ({ds['branches']} branches, LZMA-9, basket clusters of "
        f"{c.get('basket_events') or c['chunksize']} entries), {r.get('chunks')} chunks of {c['chunksize']} "
        f"entries, {c['workers']} nodes (worker processes); node caches {cal['capacity_bytes'] / 1e6:.1f} MB = "
        f"{cal['capacity_fraction']:g} x the {cal['capacity_basis']} node's working set "
        f"({cal['need_mean_bytes'] / 1e6:.1f} MB mean, {cal['need_max_bytes'] / 1e6:.1f} MB largest, from a "
        f"calibration run on large caches). Median [min, max] over {c['repeats']} repeat(s), fresh clusters and "
        f"caches each, the modes' runs interleaved. Hit rate: hits / lookups of the run's chunk tasks; served "
        f"share: the share of the run's chunk bytes its node's cache served (a missed chunk makes more lookups "
        f"than a hit one, so the hit rate is below the share of chunks hit; the forecast is a share of "
        f"bytes). All hits "
        f"{cal['warm_all_hits_s']:.2f} s; floor (b), every buffer in worker memory, {cal['floor_s']:.2f} s."
        + ("" if g["gain_s"]["median"] is None else
           f" Run 3, FIFO - rank: {_num(g['gain_s'])} s; expected from the served share x (FIFO run 3 - "
           f"floor (b)): {_num(g['expected_gain_s'])} s.")
        + ("" if r.get("admission_supported") else
           f" **`{r.get('admission_key', ADMISSION_KEY)}` was not a setting of this commit: both modes ran FIFO.**")
    )  # fmt: skip
    rows.append("")
    for t_name, t in r["targets"].items():
        verdict = {True: "met", False: "**missed**", None: "not measured"}[t["pass"]]
        v = t["value"]
        vs = "-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))
        rows.append(f"- {t_name}: {vs} (target {t['limit']}: {verdict}){'; ' + t['note'] if t['note'] else ''}")
    rows.append("")
    sha = doc.get("commit")
    commit = f"`{sha[:7]}`" if sha else "unknown commit"
    if doc.get("dirty"):
        commit += " (+ local changes)"
    date = ((doc.get("machine") or {}).get("time") or "")[:10]
    before, after = r.get("load_average_before"), r.get("load_average_after")
    load = "" if not before or not after else f", load average {before[0]:.1f} -> {after[0]:.1f}"
    rows.append(f"Measured on {commit}, {date}{load}, {r['elapsed_s'] / 60:.0f} min: "
                f"`{c.get('command') or command(c)}`.")  # fmt: skip
    return "\n".join(rows) + "\n"
