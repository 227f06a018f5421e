"""The simulator's tables: heterogeneous clusters (``simulate.json``), an adaptive burst
(``simulate_burst.json``), the simulator against a cluster box (``cluster_box.json``),
working sets beyond the caches (``simulate_capacity.json``)."""

from __future__ import annotations

from tools.readme._format import _date, _f, _load, _pct, _spread, commit_label


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
    """Heterogeneous clusters from ``simulate.json``: per scenario and policy the
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


#: policies of the burst table, as the simulator names them, and their labels
BURST_POLICIES = (
    ("cacheaffinity", "cacheaffinity"),
    ("cacheaffinity-nosteal", "torus, no stealing"),
    ("paper", "`paper` (torus + Dask's stealing)"),
    ("hash%n", "`hash % n` (coffea's worker affinity)"),
)


def render_simulate_burst(results: str, name: str = "simulate_burst") -> str:
    """An adaptive burst from ``simulate_burst.json``: per policy the hit rate of every run
    (served by caches, peers included, where it differs) and the points the burst costs in
    its run and the next against the run before it."""
    doc = _load(results, name)
    if doc is None or not (doc.get("results") or {}).get("burst"):
        return f"(no benchmarks/results/{name}.json yet)\n"
    out = []
    for key, sec in doc["results"]["burst"].items():
        b = sec["_burst"]
        r = b["run"]
        pols = [(p, label) for p, label in BURST_POLICIES if p in sec]
        runs = len(sec[pols[0][0]]["runs"])
        out.append("| policy | " + " | ".join(f"run {i + 1}" + (" (burst)" if i + 1 == r else "")
                                             for i in range(runs))
                   + " | points lost: burst run / next run |")  # fmt: skip
        out.append("|" + " --- |" * (runs + 2))
        for p, label in pols:
            xs = sec[p]["runs"]
            cells = []
            for x in xs:
                c = f"{100 * x['hit_rate']:.1f}"
                if x.get("served_rate") is not None and x["served_rate"] > x["hit_rate"] + 5e-4:
                    c += f" ({100 * x['served_rate']:.1f})"
                cells.append(c)
            before = xs[r - 2]["hit_rate"]
            lost = [100 * (before - xs[r - 1]["hit_rate"])]
            if r < len(xs):
                lost.append(100 * (before - xs[r]["hit_rate"]))
            out.append(f"| {label} | " + " | ".join(cells) + " | " + " / ".join(f"{v:.1f}" for v in lost) + " |")
        nodes = sec[pols[0][0]]["runs"]
        out.append("")
        out.append(f"{int(key.split('/')[1]):,} chunks on {nodes[0]['nodes']} nodes; {b['nodes']} nodes join at once "
                   f"{b['at']:.0%} into run {r} (its estimated makespan) and stay ({nodes[-1]['nodes']} nodes). "
                   "Hit rate % per run (in brackets: served by caches, a peer's included). "
                   f"`python benchmarks/simulate.py --scenario burst --name {name}`, measured on "
                   f"{commit_label(doc)}, {_date(doc)}.")  # fmt: skip
        out.append("")
    return "\n".join(out)


def render_cluster_box(results: str, name: str = "cluster_box") -> str:
    """The simulator against a real multi-host run of the same shape, from
    ``cluster_box.json``: per metric the measured median [min, max] over the repeats and the
    three model variants (median over seeds) with their relative differences."""
    doc = _load(results, name)
    if doc is None:
        return f"Not measured yet (`python benchmarks/cluster_box.py` writes `benchmarks/results/{name}.json`).\n"
    r, c = doc["results"], doc["config"]
    variants = [v for v in ("uncalibrated", "calibrated", "fitted") if v in r["simulated"]]
    head = "| metric | measured | " + " | ".join(f"simulated, {v}" for v in variants) + " |"
    rows = [head, "|" + " --- |" * (head.count("|") - 1)]
    for row in r["comparison"]:
        pct = "hit rate" in row["metric"]
        fmt = _pct if pct else _f
        cells = []
        for v in variants:
            d = row.get(f"{v}_diff")
            cells.append(_spread(row.get(v), fmt) + ("" if d is None else f" ({d:+.0%})"))
        rows.append(f"| {row['metric']} | {_spread(row['measured'], fmt)} | " + " | ".join(cells) + " |")
    rows.append("")
    hosts = ", ".join(f"{h['name']} {h['threads']} thread(s) {c['links_mbit'][h['name']]:g} Mbit/s" for h in c["hosts"])
    pr = r["measured"]["per_run"]
    ca, di = pr["cacheaffinity"], pr["direct"]
    runs_text = "; ".join(
        f"run {a['run']}: cacheaffinity {_spread(a['wall_s'])} s ({_spread(a['hit_rate'], _pct)} own-node hits, "
        f"{_spread(a['files_opened'])} files opened, {_spread(a['origin_bytes'], lambda v: f'{v / 1e6:.1f}')} MB "
        f"from the origin), direct {_spread(b['wall_s'])} s"
        for a, b in zip(ca, di)
    )  # fmt: skip
    cmd = (f"python benchmarks/cluster_box.py --events {c['events']} --files {c['files']} --chunksize "
           f"{c['chunksize']} --runs {c['runs']} --repeats {c['repeats']}"
           + (" --shared-machine" if c.get("shared_machine") else ""))  # fmt: skip
    fit = r.get("fitted") or {}
    cal = r["calibration"]
    rows.append(
        f"Box: {hosts}; origin {c['origin_mbit']:g} Mbit/s (VISPA's links x {c['link_scale']:g}); "
        f"{c['threads']} threads on {c['cpu_cores']} cores; {c['events']:,} events in {c['files']} files, "
        f"{c['chunks']} chunks of {c['events_per_chunk']:g} events (basket clusters of {c['basket_events']}); "
        f"{c['repeats']} repeat(s) of {c['runs']} runs; {c['note']}. Per run (wall incl. preprocessing, median "
        f"[min, max]): {runs_text}. Results identical: {'yes' if r['identical_results'] else 'NO'}; "
        f"box objects left after the runs: {sum(len(v) for v in r['leftovers_after'].values())}. "
        f"Calibration (one core, {cal['events']} events): decompression {cal['decompress_s']:.3f} s, "
        f"compute {cal['compute_s']:.3f} s"
        + (f", file metadata read per open {cal['open_bytes'] / 1e3:.0f} kB" if cal.get("open_bytes") else "")
        + (f", a warm chunk task {cal['warm_task_s']:.3f} s (cacheaffinity, one worker of one thread, median of "
           f"{cal['warm_tasks']}; the calibrated per-chunk cost is what it adds to the compute)"
           if cal.get("warm_task_s") else "")
        + (f"; fitted per-chunk cost: every chunk {fit['chunk_overhead_s']:.3f} s" if fit else "")
        + (f", a chunk read from storage {fit['open_overhead_s']:.3f} s more" if "open_overhead_s" in fit else "")
        + f". Measured on {commit_label(doc)}, {_date(doc)}: `{cmd}`."
    )  # fmt: skip
    return "\n".join(rows) + "\n"


#: Cache policies of the capacity scenarios, in the tables' order, and their labels.
_CAPACITY_POLICIES = ("fifo", "keep", "random", "rank", "rank-theta", "rank-fifo", "s3fifo")


def _capacity_label(policy: str, doc: dict) -> str:
    default = doc.get("config", {}).get("capacity_default")
    return f"`{policy}` (default)" if policy == default else f"`{policy}`"


def render_simulate_capacity(results: str, name: str = "simulate_capacity") -> str:
    """Working sets larger than the caches (``simulate_capacity.json``): per policy the mean
    hit rate of runs 3-6 against the optimum and GB written per run at each ratio, the
    second runs of the workload change and the two alternating analyses; then per run at 2x
    and for the workload change."""
    doc = _load(results, name)
    if doc is None:
        return f"_`benchmarks/results/{name}.json` not measured yet._\n"
    res = doc["results"]

    def case(scenario: str, suffix: str | None = None) -> dict:
        cases = res.get(scenario) or {}
        for k, v in cases.items():
            if suffix is None or k.endswith(suffix):
                return v
        return {}

    def runs(c: dict, policy: str, opt: bool = False) -> list[dict]:
        return (c.get(f"cacheaffinity ({policy})" + ("+optimal" if opt else "")) or {}).get("runs") or []

    def mean(rs: list[dict], key: str, lo: int = 3, hi: int = 6) -> float | None:
        vals = [r[key] for r in rs if lo <= r["run"] <= hi and r.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}"

    def gb(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    ratios = doc.get("config", {}).get("beyond_ratios", [1.25, 2.0, 4.0])
    wc, two = case("workload_change"), case("two_analyses")
    head = ["policy"]
    for q in ratios:
        head += [f"{q:g}x: hit % (optimum)", "GB written"]
    head += ["A,A,A,B,B,B,A,A: run 5 / run 8 hit % (optimum)", "two analyses: hit % (optimum)"]
    lines = [
        f"Measured on {commit_label(doc)} ({_date(doc)}). Runs 3-6 (mean), hit rate % with the "
        "optimum over the same lookups in brackets, GB written per run:",
        "",
        "| " + " | ".join(head) + " |",
        "| " + " | ".join("---" for _ in head) + " |",
    ]
    for policy in _CAPACITY_POLICIES:
        if not runs(case("beyond_capacity"), policy):
            continue
        row = [_capacity_label(policy, doc)]
        for q in ratios:
            c = case("beyond_capacity", f"/x{q:g}")
            row.append(f"{pct(mean(runs(c, policy), 'hit_rate'))} ({pct(mean(runs(c, policy, True), 'hit_rate'))})")
            row.append(gb(mean(runs(c, policy), "written_GB")))
        by = {r["run"]: r for r in runs(wc, policy)}
        opt = {r["run"]: r for r in runs(wc, policy, True)}
        row.append(" / ".join(
            f"{pct(by.get(n, {}).get('hit_rate'))} ({pct(opt.get(n, {}).get('hit_rate'))})" for n in (5, 8)
        ))  # fmt: skip
        row.append(f"{pct(mean(runs(two, policy), 'hit_rate'))} ({pct(mean(runs(two, policy, True), 'hit_rate'))})")
        lines.append("| " + " | ".join(row) + " |")
    for title, c in (
        ("Per run, each node's cache half its share (`beyond_capacity`, 2x):", case("beyond_capacity", "/x2")),
        ("Dataset A in runs 1-3, B in runs 4-6, A in runs 7-8 (`workload_change`, 2x):", wc),
        ("Two column sets of the same chunks, 1x and 0.6x the bytes, alternating (`two_analyses`, "
         "both together 2x the caches):", two),
    ):
        n = max((len(runs(c, p)) for p in _CAPACITY_POLICIES), default=0)
        lines += [
            "", title, "",
            f"| policy | hit rate % runs 1-{n} | optimum % | GB written per run |",
            "| --- | --- | --- | --- |",
        ]  # fmt: skip
        for policy in _CAPACITY_POLICIES:
            rs = runs(c, policy)
            if not rs:
                continue
            lines.append(
                f"| `{policy}` | {' / '.join(pct(r['hit_rate']) for r in rs)} | "
                f"{' / '.join(pct(r['hit_rate']) for r in runs(c, policy, True))} | "
                f"{' / '.join(gb(r.get('written_GB')) for r in rs)} |"
            )
    return "\n".join(lines) + "\n"
