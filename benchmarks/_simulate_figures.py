"""The simulator's report (benchmarks/simulate.py): a case's terminal table, a scenario's
plot, and the summary of the results (``summary`` in simulate.json; the beyond-capacity
scenarios' own)."""

from __future__ import annotations

import numpy as np

from benchmarks._common import print_table, pyplot, save_png

__all__ = ["CAPACITY_SCENARIOS", "capacity_summary", "plot", "print_case", "summarise"]

CAPACITY_SCENARIOS = ("beyond_capacity", "workload_change", "two_analyses")


def print_case(name, key, res):
    rows = []
    for pol, r in res.items():
        if pol.startswith("_"):
            continue
        row = {"policy": pol}
        for x in r["runs"]:
            row[f"hit {x['run']}"] = f"{x['hit_rate']:.1%}"
        if "makespan_s" not in r["runs"][0]:  # the offline optimum: hit rates only
            rows.append(row)
            continue
        if "written_GB" in r["runs"][0] and name in CAPACITY_SCENARIOS:
            for x in r["runs"]:
                row[f"wr {x['run']} [GB]"] = round(x["written_GB"], 1)
        if any(x.get("peer_hits") for x in r["runs"]):
            for x in r["runs"]:
                row[f"served {x['run']}"] = f"{x['served_rate']:.1%}"
        for x in r["runs"]:
            row[f"T{x['run']} [s]"] = round(x["makespan_s"], 1)
        row["steals"] = sum(x["steals"] for x in r["runs"])
        row["sim [s]"] = round(r["sim_seconds"], 1)
        rows.append(row)
    print_table(rows, title=f"\n== {name}: {key}")


def plot(name, section, path):
    plt = pyplot()
    cases = list(section)
    fig, axes = plt.subplots(2, len(cases), figsize=(5.5 * len(cases), 7.5), squeeze=False)
    for j, key in enumerate(cases):
        res = section[key]
        for pol, r in res.items():
            if pol.startswith("_"):
                continue
            runs = [x["run"] for x in r["runs"]]
            style = "-" if pol.startswith("cacheaffinity") else "--"
            if pol.endswith("+optimal"):
                if pol != "cacheaffinity (fifo)+optimal":
                    continue  # one optimum per case (the policies' differ by little)
                style = ":"
            (line,) = axes[0][j].plot(runs, [100 * x["hit_rate"] for x in r["runs"]], style, marker="o", label=pol)
            if "makespan_s" in r["runs"][0]:
                axes[1][j].plot(runs, [x["makespan_s"] for x in r["runs"]], style, marker="o", label=pol,
                                color=line.get_color())  # fmt: skip
        axes[0][j].set_title(f"{name}: {key} (nodes/chunks)")
        axes[0][j].set_ylabel("cache hit rate [%]")
        axes[1][j].set_ylabel("makespan [s] (simulated)")
        axes[1][j].set_xlabel("run")
        axes[1][j].set_yscale("log")
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xticks(runs)
    axes[0][0].legend(fontsize=7)
    save_png(fig, path)


def capacity_summary(results, cfg) -> dict:
    """Targets of the capacity scenarios, for the default cache policy (``capacity_default``):
    steady hit rate (runs 3+ of a repeated scan, mean) at least 0.9 x the optimum's, at every
    ratio; in the second run on a new dataset, at least 0.9 x the optimum's; bytes written per
    steady run at most 20% of FIFO's.  Plus every policy's steady ratio to its optimum."""
    s = {}
    if cfg is None or "capacity_default" not in cfg:
        return s
    d = cfg["capacity_default"]
    mode = f"cacheaffinity ({d})"

    def hits(res, m, runs):
        return float(np.mean([res[m]["runs"][r]["hit_rate"] for r in runs]))

    def per_policy(res, runs):
        out = {}
        for m in res:
            if m.startswith("_") or m.endswith("+optimal"):
                continue
            h, o = hits(res, m, runs), hits(res, f"{m}+optimal", runs)
            w = float(np.mean([res[m]["runs"][r]["written_GB"] for r in runs]))
            out[m] = {"hit_rate": round(h, 4), "optimal": round(o, 4), "vs_optimal": round(h / o, 3) if o else None,
                      "written_GB": round(w, 2)}  # fmt: skip
        return out

    for key, res in results.get("beyond_capacity", {}).items():
        steady = list(range(2, len(res[mode]["runs"])))
        pp = per_policy(res, steady)
        me, fifo = pp[mode], pp.get("cacheaffinity (fifo)")
        wr = me["written_GB"] / fifo["written_GB"] if fifo and fifo["written_GB"] else None
        s[f"beyond capacity ({key}): {d}, steady runs {steady[0] + 1}-{steady[-1] + 1}"] = {
            "hit_rate": me["hit_rate"], "optimal": me["optimal"], "vs_optimal": me["vs_optimal"],
            "written_vs_fifo": None if wr is None else round(wr, 4),
            "ok": bool(me["vs_optimal"] is not None and me["vs_optimal"] >= 0.9 and wr is not None and wr <= 0.2),
            "policies": pp}  # fmt: skip
    for key, res in results.get("workload_change", {}).items():
        plan = [p[0] for p in res["_plan"]]
        second = [i for i in range(1, len(plan)) if plan[i] == plan[i - 1] and (i < 2 or plan[i - 2] != plan[i])]
        second = [i for i in second if i > 2]  # after a switch (not the first dataset)
        pp = {}
        for m in res:
            if m.startswith("_") or m.endswith("+optimal"):
                continue
            pp[m] = [{"run": i + 1, "dataset": plan[i], "hit_rate": round(res[m]["runs"][i]["hit_rate"], 4),
                      "optimal": round(res[f"{m}+optimal"]["runs"][i]["hit_rate"], 4)} for i in second]  # fmt: skip
        ratios = [x["hit_rate"] / x["optimal"] if x["optimal"] else None for x in pp[mode]]
        s[f"workload change ({key}): {d}, second run on each new dataset"] = {
            "runs": pp[mode], "vs_optimal": [None if r is None else round(r, 3) for r in ratios],
            "ok": bool(ratios and all(r is not None and r >= 0.9 for r in ratios)), "policies": pp}  # fmt: skip
    for key, res in results.get("two_analyses", {}).items():
        steady = list(range(2, len(res[mode]["runs"])))
        pp = per_policy(res, steady)
        me = pp[mode]
        s[f"two analyses ({key}): {d}, runs {steady[0] + 1}-{steady[-1] + 1}"] = {
            **{k: me[k] for k in ("hit_rate", "optimal", "vs_optimal")},
            "ok": bool(me["vs_optimal"] is not None and me["vs_optimal"] >= 0.9), "policies": pp}  # fmt: skip
    return s


def summarise(results, cfg=None):
    s = capacity_summary(results, cfg)
    for key, res in results.get("hetero", {}).items():
        ca = res["cacheaffinity"]["runs"]
        best = min(res[p]["runs"][1]["makespan_s"] for p in ("paper", "cacheaffinity") if p in res)
        s[f"hetero ({key}): cacheaffinity run 2"] = {
            "hit_rate": ca[1]["hit_rate"], "target_hit_rate": 0.98 if key.startswith("h1000") else 0.97,
            "makespan_s": ca[1]["makespan_s"], "best_stealing_makespan_s": best,
            "wall_vs_best": ca[1]["makespan_s"] / best,
            "ok": bool(ca[1]["hit_rate"] >= (0.98 if key.startswith("h1000") else 0.97)
                       and ca[1]["makespan_s"] <= 1.05 * best)}  # fmt: skip
    for key, res in results.get("slowdown", {}).items():
        r0 = res["_slowdown_before_run"] - 1
        ca = res["cacheaffinity"]["runs"]
        s[f"slowdown ({key}): {res['_slow_node']} 2x slower from run {r0 + 1}, cacheaffinity"] = {
            "next_run_hit_rate": ca[r0]["hit_rate"], "run_after_hit_rate": ca[r0 + 1]["hit_rate"] if r0 + 1 < len(ca) else None,
            "ok": bool(ca[r0]["hit_rate"] >= 0.9 and r0 + 1 < len(ca) and ca[r0 + 1]["hit_rate"] >= 0.97),
            "makespans_s": [round(x["makespan_s"], 1) for x in ca],
            "paper_makespans_s": [round(x["makespan_s"], 1) for x in res["paper"]["runs"]]}  # fmt: skip
    st, ad = results.get("stable", {}), results.get("adaptive", {})
    for key in ad:
        if key in st:
            a = np.mean([x["hit_rate"] for x in ad[key]["cacheaffinity"]["runs"][1:]])
            b = np.mean([x["hit_rate"] for x in st[key]["cacheaffinity"]["runs"][1:]])
            s[f"adaptive vs stable, cacheaffinity mean hit rate runs 2+ ({key})"] = {
                "adaptive": float(a), "stable": float(b), "points_lost": float(100 * (b - a)),
                "target_points": 5, "ok": bool(100 * (b - a) <= 5)}  # fmt: skip
            sa = np.mean([x.get("served_rate", x["hit_rate"]) for x in ad[key]["cacheaffinity"]["runs"][1:]])
            sb = np.mean([x.get("served_rate", x["hit_rate"]) for x in st[key]["cacheaffinity"]["runs"][1:]])
            s[f"adaptive vs stable, cacheaffinity mean served by caches runs 2+ ({key})"] = {
                "adaptive": float(sa), "stable": float(sb), "points_lost": float(100 * (sb - sa)),
                "target_points": 5, "ok": bool(100 * (sb - sa) <= 5),
                "note": "own node's cache + peer fetch (the locator's holder, if alive)"}  # fmt: skip
            for x in ad[key].get("_churn_sweep", []):
                s[f"churn sweep ({key}): {x['between_runs']:.0%} between + {x['during_run']:.1%} during runs"] = {
                    "mean_hit_runs_2plus": x["mean_hit_runs_2plus"],
                    "points_lost_vs_stable": float(100 * (b - x["mean_hit_runs_2plus"])),
                    "served_points_lost_vs_stable": (
                        float(100 * (sb - x["mean_served_runs_2plus"]))
                        if "mean_served_runs_2plus" in x else None
                    ),
                    "ok": bool(100 * (b - x["mean_hit_runs_2plus"]) <= 5)}  # fmt: skip
    for key, res in results.get("burst", {}).items():
        b = res["_burst"]
        r = b["run"]  # runs 1..; index r-1 is the burst's run
        rows = {}
        for pol, x in res.items():
            if pol.startswith("_"):
                continue
            runs = x["runs"]
            before = runs[r - 2]
            rows[pol] = {
                "hit_rates": [round(y["hit_rate"], 4) for y in runs],
                "served_rates": [round(y["served_rate"], 4) for y in runs],
                # what the burst costs: points below the run before it, in its run and the next
                "points_lost_burst_run": round(100 * (before["hit_rate"] - runs[r - 1]["hit_rate"]), 2),
                "points_lost_next_run": (round(100 * (before["hit_rate"] - runs[r]["hit_rate"]), 2)
                                         if r < len(runs) else None),
                "makespans_s": [round(float(y["makespan_s"]), 1) for y in runs],
                "nodes": [y["nodes"] for y in runs],
            }  # fmt: skip
        s[f"burst ({key}): {b['nodes']} nodes join during run {r}"] = rows
    for key, res in st.items():
        if "paper" in res:
            s[f"gradual fill ({key})"] = {
                "paper (torus + stock stealing)": [round(x["hit_rate"], 4) for x in res["paper"]["runs"]],
                "cacheaffinity": [round(x["hit_rate"], 4) for x in res["cacheaffinity"]["runs"]],
            }
    return s
