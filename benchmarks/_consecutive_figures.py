"""The consecutive runs' figures (benchmarks/consecutive_runs.py): the headline over the
repeats, the targets, the tables and the Fig.-3 style plot."""

from __future__ import annotations

import statistics

from benchmarks._common import pyplot, served_share, spread
from benchmarks._runs import NATIVE

__all__ = [
    "NATIVE_TARGET",
    "NEW_PROCESS_TARGETS",
    "evaluate_targets",
    "headline",
    "headline_rows",
    "new_process_headline",
    "new_process_rows",
    "plot",
    "table_rows",
    "worker_gc_rows",
]

#: Target: cacheaffinity's run 2 at least this many times faster than coffea-native's
NATIVE_TARGET = 2.0
#: targets of the new-process runs: (name, limit text, test)
NEW_PROCESS_TARGETS = {
    "cacheaffinity new-process run 2 / same-process run 2": ("<= 1.10", lambda v: v <= 1.10),
    "coffea-native new-process run 2 / cacheaffinity new-process run 2": (">= 3", lambda v: v >= 3),
    "direct new-process run 2 / cacheaffinity new-process run 2": (">= 4", lambda v: v >= 4),
}


def headline(doc: dict) -> dict:
    """Median [min, max] over the repeats of every headline figure.

    Per mode: run-1 and run-2 wall, decompressed MB and hit rate of run 2; floors: per
    repeat the median of its floor runs; ratios are formed per repeat, then summarised.
    """
    per_mode: dict[str, dict] = {}
    ratios: dict[str, list] = {}
    floors_b, floors_a, floors_b_disk, floors_b_gc = [], [], [], []
    for rp in doc["repeats"]:
        stable = rp["sequences"].get("stable", {})
        fb = [r["wall_s"] for r in rp["floors"]["coffea-in-memory"]]
        fa = [r["wall_s"] for r in rp["floors"]["processor-only"]]
        fb_med = statistics.median(fb) if fb else None
        fa_med = statistics.median(fa) if fa else None
        floors_b.append(fb_med)
        floors_a.append(fa_med)
        fb_disk = [r["disk_read_bytes"] for r in rp["floors"]["coffea-in-memory"]
                   if r.get("disk_read_bytes") is not None]  # fmt: skip
        if fb_disk:
            floors_b_disk.append(_mb(statistics.median(fb_disk)))
        for mode, rows in stable.items():
            pm = per_mode.setdefault(mode, {"run1_wall_s": [], "run2_wall_s": [], "run2_hit_rate": [],
                                            "run2_cache_rate": [],
                                            "run1_decompressed_MB": [], "run2_decompressed_MB": [],
                                            "run2_origin_MB": []})  # fmt: skip
            pm["run1_wall_s"].append(rows[0]["wall_s"])
            if rows[0].get("preprocess_s") is not None:
                pm.setdefault("run1_preprocess_s", []).append(rows[0]["preprocess_s"])
            pm["run1_decompressed_MB"].append(_mb(rows[0]["decompressed_bytes"]))
            if len(rows) >= 2:
                pm["run2_wall_s"].append(rows[1]["wall_s"])
                pm["run2_hit_rate"].append(rows[1]["hit_rate"])
                pm["run2_cache_rate"].append(rows[1].get("cache_rate"))
                pm["run2_decompressed_MB"].append(_mb(rows[1]["decompressed_bytes"]))
                pm["run2_origin_MB"].append(_mb(rows[1]["origin_bytes"]))
                if rows[1].get("disk_read_bytes") is not None:
                    pm.setdefault("run2_disk_read_MB", []).append(_mb(rows[1]["disk_read_bytes"]))
                # Python's full collections per worker, share of the warm run's wall
                pm.setdefault("run2_gc_full_share", []).append(rows[1].get("gc_full_share"))
        fb_gc = [r.get("gc_full_share") for r in rp["floors"]["coffea-in-memory"]]
        fb_gc = [v for v in fb_gc if v is not None]
        if fb_gc:
            floors_b_gc.append(statistics.median(fb_gc))
        ca = stable.get("cacheaffinity")
        if not ca or len(ca) < 2:
            continue
        r2 = ca[1]["wall_s"]

        def add(name, v):
            ratios.setdefault(name, []).append(v)

        add("cacheaffinity run 1 / run 2", ca[0]["wall_s"] / r2)
        if ca[0].get("preprocess_s") is not None:
            # the same without coffea's preprocessing (run 1 pays it, later runs find the
            # entry counts in the Runner's metadata cache): the part the column cache changes
            add("cacheaffinity run 1 / run 2 without coffea's preprocessing",
                (ca[0]["wall_s"] - ca[0]["preprocess_s"]) / (r2 - ca[1]["preprocess_s"]))
        for mode, rows in stable.items():
            if mode != "cacheaffinity" and len(rows) >= 2:
                add(f"{mode} run 2 / cacheaffinity run 2", rows[1]["wall_s"] / r2)
        nat = stable.get(NATIVE)
        if nat and len(nat) >= 3 and len(ca) >= 3:  # the peer coffea users have, once more warm
            add(f"{NATIVE} run 3 / cacheaffinity run 3", nat[2]["wall_s"] / ca[2]["wall_s"])
        if "direct" in stable:
            add("cacheaffinity run 1 / direct run 1", ca[0]["wall_s"] / stable["direct"][0]["wall_s"])
        if fb_med:
            add("cacheaffinity run 2 / floor (b) coffea-in-memory", r2 / fb_med)
        if fa_med:
            add("cacheaffinity run 2 / floor (a) processor-only", r2 / fa_med)
    out = {
        "repeats": len(doc["repeats"]),
        "modes": {m: {k: spread(v) for k, v in d.items()} for m, d in per_mode.items()},
        "floors": {"coffea-in-memory": spread(floors_b), "processor-only": spread(floors_a)},
        # MB the floor's workers read from block storage (none expected: buffers in memory)
        **({"floor_b_disk_read_MB": spread(floors_b_disk)} if floors_b_disk else {}),
        **({"floor_b_gc_full_share": spread(floors_b_gc)} if floors_b_gc else {}),
        "ratios": {k: spread(v) for k, v in ratios.items()},
    }
    if any(rp.get("new_process") for rp in doc["repeats"]):
        out["new_process"] = new_process_headline(doc)
    return out


def new_process_headline(doc: dict) -> dict:
    """The new-process runs' figures, median [min, max] over the repeats: per mode run-1
    and run-2 wall, coffea's preprocessing, uproot files the workers opened, the whole
    child process, and (cacheaffinity's executor, where it reports them) ``storage_opens``,
    ``files_preprocessed``, ``metadata_hits``, ``preprocess_ms``; ratios formed per repeat:
    every mode's run 2 / cacheaffinity's, every mode's new-process run 2 / its
    same-process run 2 (the same repeat)."""
    per_mode: dict[str, dict[str, list]] = {}
    ratios: dict[str, list] = {}
    for rp in doc["repeats"]:
        new = rp.get("new_process") or {}
        same = rp["sequences"].get("stable", {})
        for mode, rows in new.items():
            pm = per_mode.setdefault(mode, {})
            for i, r in enumerate(rows[:2], start=1):
                st = r.get("last_run_stats") or {}
                ms = st.get("preprocess_ms")
                for k, v in (("wall_s", r["wall_s"]), ("preprocess_s", r.get("preprocess_s")),
                             ("file_opens", r.get("file_opens")), ("hit_rate", r.get("hit_rate")),
                             ("process_s", (r.get("child") or {}).get("process_s")),
                             ("storage_opens", st.get("storage_opens")),
                             ("files_preprocessed", st.get("files_preprocessed")),
                             ("metadata_hits", st.get("metadata_hits")),
                             ("reported_preprocess_s", None if ms is None else ms / 1000)):  # fmt: skip
                    pm.setdefault(f"run{i}_{k}", []).append(v)
            if len(rows) >= 2 and len(same.get(mode) or []) >= 2:
                ratios.setdefault(f"{mode} new-process run 2 / same-process run 2", []).append(
                    rows[1]["wall_s"] / same[mode][1]["wall_s"])
        ca = new.get("cacheaffinity")
        if ca and len(ca) >= 2:
            for mode, rows in new.items():
                if mode != "cacheaffinity" and len(rows) >= 2:
                    ratios.setdefault(f"{mode} new-process run 2 / cacheaffinity new-process run 2",
                                      []).append(rows[1]["wall_s"] / ca[1]["wall_s"])  # fmt: skip
    return {
        "modes": {m: {k: spread(v) for k, v in d.items()} for m, d in per_mode.items()},
        "ratios": {k: spread(v) for k, v in ratios.items()},
    }


def _mb(b):
    return None if b is None else b / 1e6


def evaluate_targets(doc: dict, cfg) -> dict:
    """The issue's targets, each with the measured value and pass/fail (None: not measured).

    Wall-time targets use the headline's medians over the repeats; hit-rate targets use
    the first repeat (the membership scenario runs there only).
    """
    stable = doc["sequences"]["stable"]
    ratios = doc["headline"]["ratios"]
    w = cfg.workers
    out: dict[str, dict] = {}

    def target(name, value, limit, ok, note=""):
        out[name] = {"value": value, "limit": limit, "pass": None if value is None else ok, "note": note}

    def med(name):
        return (ratios.get(name) or {}).get("median")

    def rng(name):
        r = ratios.get(name) or {}
        return "" if r.get("min") is None else f"min {r['min']:.3g}, max {r['max']:.3g}, n {r['n']}"

    ca = stable.get("cacheaffinity")
    if ca and len(ca) >= 2:
        hr = ca[1]["hit_rate"]
        target("cacheaffinity run-2 hit rate (stable)", hr, ">= 0.99", hr is not None and hr >= 0.99)
        cr = ca[1].get("cache_rate")
        if cr is not None:
            target(
                "cacheaffinity run-2 served by caches (stable; own node + peer fetch)",
                cr, ">= 0.99", cr >= 0.99,
            )  # fmt: skip
        name = "cacheaffinity run 1 / run 2"
        v = med(name)
        target(name, v, ">= 5", v is not None and v >= 5, rng(name))
        for mode in stable:
            name = f"{mode} run 2 / cacheaffinity run 2"
            if name in ratios and mode == NATIVE:  # target: at least 2x faster than it
                v = med(name)
                target(name, v, f">= {NATIVE_TARGET:g}", v is not None and v >= NATIVE_TARGET,
                       rng(name))  # fmt: skip
            elif name in ratios:
                v = med(name)
                target(name, v, "> 1", v is not None and v > 1, rng(name))
        name = f"{NATIVE} run 3 / cacheaffinity run 3"
        if name in ratios:
            v = med(name)
            target(name, v, "reported", True, rng(name))
        name = "cacheaffinity run 1 / run 2 without coffea's preprocessing"
        if name in ratios:
            v = med(name)
            target(name, v, "reported", True, rng(name))
        name = "cacheaffinity run 2 / floor (b) coffea-in-memory"
        v = med(name)
        target(name, v, "<= 1.00", v is not None and v <= 1.00, rng(name))
        name = "cacheaffinity run 2 / floor (a) processor-only"
        v = med(name)
        target(name, v, "<= 1.6", v is not None and v <= 1.6, rng(name))
        name = "cacheaffinity run 1 / direct run 1"
        v = med(name)
        target(name, v, "<= 1.03", v is not None and v <= 1.03, rng(name))
        r1 = doc["headline"]["modes"]["cacheaffinity"]["run1_wall_s"]["median"]
        target("run 1 >= 60 s (full size)", r1, ">= 60", r1 >= 60)
        g = doc["headline"]["modes"]["cacheaffinity"].get("run2_gc_full_share") or {}
        if g.get("median") is not None:
            target(
                f"cacheaffinity run 2: full garbage collections per worker / wall "
                f"(worker.gc {cfg.worker_gc[0]})", g["median"], "<= 0.05", g["median"] <= 0.05,
                f"min {g['min']:.3g}, max {g['max']:.3g}, n {g['n']}",
            )  # fmt: skip
    new_process_targets(doc, target)
    dd = stable.get("dask-default+cache")
    if ca and dd and len(dd) >= 2 and len(ca) >= 2 and dd[1]["hit_rate"] is not None:
        target(
            "dask-default+cache run-2 hit rate below cacheaffinity's",
            dd[1]["hit_rate"], f"< {ca[1]['hit_rate']}",
            ca[1]["hit_rate"] is not None and dd[1]["hit_rate"] < ca[1]["hit_rate"],
            f"expected ~1/W = {1 / w:.3f}",
        )
    for mode, rows in doc["sequences"]["membership"].items():
        if len(rows) < 4:
            continue
        # served by the caches, own node or peer fetch (a rate of lookups is lower: a chunk that
        # misses makes more lookups than one that hits, and an idle node that steals a warm
        # chunk hits on its holder's pack, not its own)
        # what the removed node's cache held of all the caches' bytes (else its share of the
        # chunk tasks that ran, else 1/W): what a perfect cache loses
        held, tasks = rows[2].get("removed_node_bytes_share"), rows[2].get("removed_node_share")
        share = held if held is not None else tasks if tasks is not None else 1.0 / w
        limit3 = 1.0 - share - 0.02
        s3, s4 = served_share(rows[2], rows[0]), served_share(rows[3], rows[0])
        target(
            f"{mode} run 3 after a node was removed (W={w}): served by the caches", s3,
            f">= {limit3:.4f}", s3 is not None and s3 >= limit3,
            f"1 - decompressed / run 1's; the removed node held {_pct(held)} of the caches' bytes "
            f"and ran {_pct(tasks)} of the chunk tasks; own-node hit rate of lookups "
            f"{_pct(rows[2]['hit_rate'])}, steals {rows[2].get('steals')}",
        )  # fmt: skip
        target(
            f"{mode} run 4 after a node was added (W'={w - 1} -> {w}): served by the caches", s4,
            ">= 0.98", s4 is not None and s4 >= 0.98,
            f"1 - decompressed / run 1's; own-node hit rate of lookups {_pct(rows[3]['hit_rate'])}, "
            f"steals {rows[3].get('steals')}",
        )  # fmt: skip
    return out


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"


def new_process_targets(doc: dict, target) -> None:
    """The new-process runs' targets (:data:`NEW_PROCESS_TARGETS` and cacheaffinity's run 2
    opening no file, in every repeat), each ``target(name, value, limit, ok, note)``."""
    h = (doc.get("headline") or {}).get("new_process")
    if not h:
        return
    opens = (h["modes"].get("cacheaffinity") or {}).get("run2_file_opens") or {}
    if opens.get("max") is not None:
        target("cacheaffinity new-process run 2: files opened (preprocessing included)", opens["max"],
               "== 0", opens["max"] == 0, f"most of any repeat; median {opens['median']:g}, n {opens['n']}")  # fmt: skip
    for name, (limit, ok) in NEW_PROCESS_TARGETS.items():
        r = h["ratios"].get(name) or {}
        if r.get("median") is not None:
            target(name, r["median"], limit, ok(r["median"]),
                   f"min {r['min']:.3g}, max {r['max']:.3g}, n {r['n']}")  # fmt: skip
    if doc.get("identical_across_processes") is not None:
        v = doc["identical_across_processes"]
        target("results identical in same-process and new-process runs", float(v), "== 1", v)


def headline_rows(doc: dict) -> list[dict]:
    """The headline table: per mode, median [min, max] over the repeats."""
    h = doc["headline"]
    rows = []

    def fmt(s, unit="", pct=False):
        if not s or s.get("median") is None:
            return None
        f = (lambda v: f"{v:.1%}") if pct else (lambda v: f"{v:.3g}")
        if s["n"] > 1 and s["min"] != s["max"]:
            return f"{f(s['median'])} [{f(s['min'])}-{f(s['max'])}]{unit}"
        return f"{f(s['median'])}{unit}"

    for mode, m in h["modes"].items():
        rows.append({
            "mode": mode,
            "run 1 [s]": fmt(m["run1_wall_s"]),
            "run 2 [s]": fmt(m["run2_wall_s"]),
            "run 2 decompr. MB": fmt(m["run2_decompressed_MB"]),
            "run 2 origin MB": fmt(m["run2_origin_MB"]),
            "run 2 hit rate": fmt(m["run2_hit_rate"], pct=True),
            "run 2 served by caches": fmt(m.get("run2_cache_rate") or {}, pct=True),
            "run 2 full GC / wall": fmt(m.get("run2_gc_full_share") or {}, pct=True),
        })  # fmt: skip
    for name, s in h["floors"].items():
        gc_share = h.get("floor_b_gc_full_share") if name == "coffea-in-memory" else None
        rows.append({"mode": f"floor: {name}", "run 2 [s]": fmt(s),
                     "run 2 decompr. MB": "0" if s.get("median") is not None else None,
                     "run 2 full GC / wall": fmt(gc_share or {}, pct=True)})  # fmt: skip
    return rows


def new_process_rows(doc: dict) -> list[dict]:
    """The new-process table: per mode, median [min, max] over the repeats."""
    h = (doc.get("headline") or {}).get("new_process") or {}
    rows = []

    def fmt(s):
        if not s or s.get("median") is None:
            return None
        if s["n"] > 1 and s["min"] != s["max"]:
            return f"{s['median']:.3g} [{s['min']:.3g}-{s['max']:.3g}]"
        return f"{s['median']:.3g}"

    for mode, m in h.get("modes", {}).items():
        rows.append({
            "mode": mode,
            "run 1 [s]": fmt(m.get("run1_wall_s")),
            "run 2 [s]": fmt(m.get("run2_wall_s")),
            "run 2 / same-process run 2": fmt(h["ratios"].get(f"{mode} new-process run 2 / same-process run 2")),
            "run 2 files opened": fmt(m.get("run2_file_opens")),
            "run 2 preprocessing [s]": fmt(m.get("run2_preprocess_s")),
            "run 2 storage_opens (executor)": fmt(m.get("run2_storage_opens")),
            "process [s]": fmt(m.get("run2_process_s")),
        })  # fmt: skip
    return rows


def worker_gc_rows(doc: dict) -> list[dict]:
    """Side by side per ``worker.gc`` setting (``--worker-gc`` with several): per mode,
    run-2 wall and full collections' share of it (median [min, max] over the repeats)."""
    rows = []
    for g, d in (doc.get("worker_gc") or {}).items():
        h = d["headline"]
        for mode, m in h["modes"].items():
            w, s = m["run2_wall_s"], m.get("run2_gc_full_share") or {}
            rows.append({
                "worker.gc": g, "mode": mode,
                "run 2 [s]": None if w["median"] is None else f"{w['median']:.3g}",
                "run 2 full GC / wall": None if s.get("median") is None else
                f"{s['median']:.1%} [{s['min']:.1%}-{s['max']:.1%}]",
            })  # fmt: skip
        fb = h["floors"].get("coffea-in-memory") or {}
        s = h.get("floor_b_gc_full_share") or {}
        rows.append({
            "worker.gc": g, "mode": "floor: coffea-in-memory",
            "run 2 [s]": None if fb.get("median") is None else f"{fb['median']:.3g}",
            "run 2 full GC / wall": None if s.get("median") is None else
            f"{s['median']:.1%} [{s['min']:.1%}-{s['max']:.1%}]",
        })  # fmt: skip
    return rows


def table_rows(doc: dict) -> list[dict]:
    """One row per repeat, scenario, mode and run, for :func:`benchmarks._common.print_table`."""
    rows = []
    for rp in doc.get("repeats") or [{"sequences": doc["sequences"]}]:
        seqs = dict(rp["sequences"])
        if rp.get("new_process"):
            seqs["stable, new process"] = rp["new_process"]
        for scenario, modes in seqs.items():
            for mode, runs in modes.items():
                for r in runs:
                    rows.append(
                        {
                            "rep": r.get("repeat", 1),
                            "scenario": scenario,
                            "mode": mode,
                            "run": r["run"],
                            "nodes": r["nodes"],
                            "wall [s]": r["wall_s"],
                            "storage MB": r["storage_bytes"] / 1e6,
                            "origin MB": None if r["origin_bytes"] is None else r["origin_bytes"] / 1e6,
                            "decompr. MB": None
                            if r["decompressed_bytes"] is None
                            else r["decompressed_bytes"] / 1e6,
                            "hit rate": None if r["hit_rate"] is None else f"{r['hit_rate']:.1%}",
                            "steals": r["steals"],
                            "on pref.": None
                            if r["on_preferred"] is None
                            else f"{r['on_preferred']:.1%}",
                        }
                    )
    return rows


def plot(doc: dict, title: str = ""):
    """Fig.-3 style: per mode, bars = data read from storage per run, points = wall time;
    bottom panel: hit rate per run.  Returns the matplotlib figure."""
    plt = pyplot()
    stable = doc["sequences"]["stable"]
    membership = doc["sequences"].get("membership") or {}
    panels = [(f"{m}", rows) for m, rows in stable.items()] + [
        (f"{m}\n(node -1 before run 3, +1 before 4)", rows) for m, rows in membership.items()
    ]
    if not panels:  # --processes new alone
        panels = [(f"{m}\n(new process per run)", rows) for m, rows in (doc.get("new_process") or {}).items()]
    n = len(panels)
    fig, axes = plt.subplots(2, n, figsize=(3.1 * n, 6), squeeze=False, sharex="col",
                             gridspec_kw={"height_ratios": [2, 1]})  # fmt: skip
    wmax = max(r["wall_s"] for _, rows in panels for r in rows)
    use_origin = all(r["origin_bytes"] is not None for _, rows in panels for r in rows)
    key = "origin_bytes" if use_origin else "storage_bytes"
    bmax = max(max(r[key] for _, rows in panels for r in rows), 1) / 1e6
    for i, (name, rows) in enumerate(panels):
        ax, axh = axes[0][i], axes[1][i]
        runs = [r["run"] for r in rows]
        ax.bar(runs, [r[key] / 1e6 for r in rows], color="C0", alpha=0.6)
        ax.set_ylim(0, bmax * 1.15)
        ax.set_title(name, fontsize=9)
        if i == 0:
            ax.set_ylabel(("origin" if use_origin else "storage") + " MB read (bars)", color="C0")
        tw = ax.twinx()
        tw.plot(runs, [r["wall_s"] for r in rows], "o-", color="C3")
        tw.set_ylim(0, wmax * 1.15)
        if i == n - 1:
            tw.set_ylabel("wall time [s] (points)", color="C3")
        else:
            tw.set_yticklabels([])
        hr = [None if r["hit_rate"] is None else 100 * r["hit_rate"] for r in rows]
        if any(h is not None for h in hr):
            axh.bar(runs, [h or 0 for h in hr], color="C2")
        else:
            axh.text(0.5, 0.5, "no column cache", ha="center", va="center", transform=axh.transAxes)
        axh.set_ylim(0, 105)
        axh.set_xlabel("run")
        axh.set_xticks(runs)
        if i == 0:
            axh.set_ylabel("hit rate [%]")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
