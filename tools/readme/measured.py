"""The "measured" table (one row per other benchmark: executor runs, cache read, placement,
stealing, scheduler CPU and scale, simulation, warm-run profile), the scheduler at scale
and the chunksize change."""

from __future__ import annotations

import statistics

from tools.readme._format import _date, _f, _load, _pct, _row, _spread, commit_label, not_measured


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
                 f"{lz['write_overhead']:.1%} on LZMA-9; "
                 f"{lz['decompressed_bytes'] / 1e6:.0f} MB decompressed per pass")  # fmt: skip
        if lz.get("pack_copy_warm_MBps"):
            text += (f"; all of it as one chunk pack: mapped (`worker.read: map`, the default) "
                     f"{lz['pack_warm_MBps'] / 1e3:.1f} GB/s, {lz['pack_us_per_lookup']:.0f} us per "
                     f"column lookup, {lz['pack_bytes_copied_per_byte_served']:.2f} bytes copied per "
                     f"byte served; copied (`copy`) {lz['pack_copy_warm_MBps'] / 1e3:.1f} GB/s, "
                     f"{lz['pack_copy_us_per_lookup']:.0f} us, "
                     f"{lz['pack_copy_bytes_copied_per_byte_served']:.2f}; one file per buffer "
                     f"(layout 3) {lz['entry_us_per_lookup']:.0f} us per lookup")  # fmt: skip
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
                + (f"; load average {load:.1f} while measured: indicative only"
                   if load and load > 2 else ""))  # fmt: skip
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
    peak = big.get("place_tracemalloc_peak_bytes")
    text = (f"{big['tasks']:,} tasks placed in {big['place_cpu_s']:.1f} s CPU"
            + (f" ({peak / 1e6:.0f} MB tracemalloc peak)" if peak else "")
            + f"; a node leaving {big['retarget_leave_cpu_s']:.2f} s, one joining "
            f"{big['retarget_join_cpu_s']:.2f} s CPU at {big['tasks']:,} pending")  # fmt: skip
    return [_row(f"placing chunk tasks over {big['nodes']} nodes (real scheduler, fake workers)", text,
                 "python benchmarks/scheduler_scale.py", doc)]  # fmt: skip


def render_scheduler_scale(results: str, name: str = "scheduler_scale") -> str:
    """Scheduler cost of placement, joins and leaves at 10^5-10^6 pending chunk tasks,
    with the plugin and without it, and the figures of the commit measured before."""
    doc = _load(results, name)
    if doc is None or not doc.get("summary"):
        return not_measured("scheduler_scale.py", name)
    burst = doc["config"].get("burst")
    head = ["pending chunk tasks"]
    sm = doc["summary"]
    head += [f"{x['tasks']:,}" for x in sm]

    def ms(v):
        return "-" if v is None else f"{v * 1e3:,.0f} ms" if v < 10 else f"{v:,.1f} s"

    def row(label, key, fmt=ms, stock=None):
        cells = []
        for x in sm:
            c = fmt(x.get(key))
            if stock and x.get(stock) is not None:
                c += f" ({fmt(x.get(stock))})"
            cells.append(c)
        return [label] + cells

    body = [
        row("placement, CPU (Dask's own task creation)", "place_cpu_s", stock="dask_new_task_cpu_s"),
        row("placement / Dask's task creation", "place_over_dask", fmt=lambda v: "-" if v is None else f"{v:.2f}x"),
        row("one join, CPU (median; without the plugin)", "join_one_median_cpu_s", stock="stock_join_one_median_cpu_s"),
        row("one join, CPU (slowest of them)", "join_one_max_cpu_s"),
        row(f"{burst} joins at once, CPU in all (without)", "join_burst_cpu_s", stock="stock_join_burst_cpu_s"),
        row("one leave, CPU (median; without)", "leave_median_cpu_s", stock="stock_leave_median_cpu_s"),
        row("one leave, CPU (slowest of them)", "leave_max_cpu_s"),
        row("longest loop block: joins one at a time (without)", "join_one_max_block_s",
            stock="stock_join_one_max_block_s"),
        row(f"longest loop block: {burst} joins at once (without)", "join_burst_max_block_s",
            stock="stock_join_burst_max_block_s"),
        row("longest loop block: leaves (without)", "leave_max_block_s", stock="stock_leave_max_block_s"),
        row("loop block of placement (Dask's own task creation)", "place_block_s", stock="dask_new_task_block_s"),
        row("scheduler RSS per pending chunk task (without)", "rss_per_task_bytes",
            fmt=lambda v: "-" if v is None else f"{v:,.0f} B", stock="stock_rss_per_task_bytes"),
    ]  # fmt: skip
    rows = {x["tasks"]: x for x in doc.get("results") or []}
    if all("query_ms" in rows.get(x["tasks"], {}) for x in sm):
        body.append(["slowest query on the loop (info, snapshot, /metrics, page, where, forecast)"] + [
            "{:,.0f} ms ({})".format(*max(((v, k) for k, v in rows[x["tasks"]]["query_ms"].items())))
            for x in sm])  # fmt: skip
    if all("steal_choose_ms" in rows.get(x["tasks"], {}) for x in sm):
        for n in ("1000", "100000"):
            body.append([f"one stealing choice over a queue of {int(n):,} tasks"] + [
                "-" if n not in rows[x["tasks"]]["steal_choose_ms"] else
                f"{rows[x['tasks']]['steal_choose_ms'][n]:,.1f} ms" for x in sm])  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    out = "\n".join(lines) + "\n"
    before = doc.get("before") or {}
    old = {x["tasks"]: x for x in before.get("results") or []}
    if old:
        cells = []
        for x in sm:
            o = old.get(x["tasks"])
            cells.append("-" if o is None else
                         f"join {o['retarget_join_cpu_s']:.2f} s, leave {o['retarget_leave_cpu_s']:.2f} s, "
                         f"placement {o['place_cpu_s']:.1f} s (Dask {o['dask_new_task_cpu_s']:.1f} s)")  # fmt: skip
        out += ("\nBefore (`" + str(before.get("commit") or "?")[:7] + "`, one join and one leave, CPU): "
                + "; ".join(f"{x['tasks']:,}: {c}" for x, c in zip(sm, cells)) + ".\n")
    checks = (doc.get("checks") or {}).get("must_show_1e6_over_1000_nodes")
    if checks:
        verdict = [f"{k[:-3]}: {'met' if v else 'missed'}" for k, v in checks.items() if k.endswith("_ok")]
        out += "\nMust-show at 10^6 over 1000 nodes: " + ", ".join(verdict) + ".\n"
    out += f"\nMeasured at {commit_label(doc)}, {_date(doc)}: `python benchmarks/scheduler_scale.py`" \
           " (CPU is `time.process_time`; a loop block is the loop thread's CPU while a 2 ms probe waited).\n"
    return out


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
        if (s.get("read_path_share") or {}).get("median") is not None:
            text += (f"; the cache's read path (`PackSourceMapping`) {_spread(s['read_path_share'], pct)} "
                     f"of the warm run's chunk-task samples (pack reads {_spread(s['get_packs_share'], pct)}, "
                     f"index query {_spread(s['index_query_share'], pct)}, file reads "
                     f"{_spread(s['file_reads_share'], pct)}), "
                     f"{_spread(s.get('read_path_us_per_lookup'), lambda v: f'{v:.0f} us')} per column "
                     f"lookup; warm / floor (b) task samples "
                     f"{_spread(s['task_samples_ratio'], lambda v: f'{v:.2f}')}")
        elif (s.get("get_many_share") or {}).get("median") is not None:  # layout 3's read path
            text += (f"; the cache's read path (`ColumnCache.get_many`) {_spread(s['get_many_share'], pct)} "
                     f"of the warm run's chunk-task samples (index query "
                     f"{_spread(s['index_query_share'], pct)}, file reads "
                     f"{_spread(s['file_reads_share'], pct)}); warm / floor (b) task samples "
                     f"{_spread(s['task_samples_ratio'], lambda v: f'{v:.2f}')}")
        if (s.get("warm_nanoevents_share") or {}).get("median") is not None:
            text += ("; chunk-task samples in coffea's pipeline, warm / floor (b): the events built "
                     f"from the form (`NanoEventsFactory.events`) {_spread(s['warm_nanoevents_share'], pct)} / "
                     f"{_spread(s['floor_b_nanoevents_share'], pct)}, the processor "
                     f"{_spread(s['warm_processor_share'], pct)} / {_spread(s['floor_b_processor_share'], pct)}")
        if (s.get("warm_busiest_worker_s") or {}).get("median") is not None:
            text += ("; task streams, warm / floor (b): until the first task "
                     f"{_spread(s['warm_first_task_s'], sec)} / {_spread(s['floor_b_first_task_s'], sec)}, "
                     f"after the last {_spread(s['warm_tail_s'], sec)} / {_spread(s['floor_b_tail_s'], sec)}, "
                     f"the busiest worker's compute {_spread(s['warm_busiest_worker_s'], sec)} / "
                     f"{_spread(s['floor_b_busiest_worker_s'], sec)}")
        if (s.get("copies_per_byte_served") or {}).get("median") is not None:
            text += (f"; bytes copied per byte served {_spread(s['copies_per_byte_served'], lambda v: f'{v:.2f}')}"
                     " (cache file reads into new buffers, plus concatenations and re-based offsets)")
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
    """Per-run table of ``benchmarks/chunksize_change.py``."""
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
