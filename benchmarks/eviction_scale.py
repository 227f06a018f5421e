"""What one insert costs against how many packs it evicts: a large pack into a full node cache of small ones.

A node cache holds what earlier work left: packs of many sizes (a file's few branches, a
whole NanoAOD chunk).  A pack that needs the room of ``k`` smaller ones evicts ``k`` in its
insert transaction, which holds the node's index for every process of the node.  This
measures that transaction's cost against ``k`` (1 to 10^4) in node caches of 10^4, 10^5 and
10^6 packs (:func:`benchmarks.store_scale.build`: full, in the store's format, data files in
``/dev/shm``), with ``rank`` (the default) and ``fifo``, and records whether the cache
holds no more than its capacity afterwards.

Each (cache size, policy, repeat) is one new process that opens a freshly built cache and
inserts packs of about 1, 10, 100, ... small packs' size in turn (``put_pack``, inline),
each insert's CPU and wall time measured; each inserted pack's rank is low (< :data:`LOW_RANK`),
so that ``rank`` admits it in place of the highest ranks (a pack never displaces a live one of
lower rank: a refusal evicts nothing).  ``--before REV`` runs the same processes on the
code of commit ``REV`` (a git worktree, removed at the end), alternating with this
checkout's, so that the two are compared in one run; a side's series of inserts stops
after an insert over ``--limit`` seconds (recorded).  Medians of ``--repeats``.

    python benchmarks/eviction_scale.py [--before REV]
    python benchmarks/eviction_scale.py --quick
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks._common import (  # noqa: E402
    commit_tree, counts, parser, pyplot, run_child, save_png, save_results, serve_child,
)

REPO = os.path.dirname(HERE)
POLICIES = ("rank", "fifo")
VICTIMS = (1, 10, 100, 1000, 3000, 10_000)
PACKS = (10_000, 100_000, 1_000_000)
#: A side's series of inserts stops after one that took longer (seconds).
LIMIT_S = 5.0
#: The inserted packs' rank at most (``rank``: admitted in place of any higher one).
LOW_RANK = 0.01
WORK = "/dev/shm" if os.path.isdir("/dev/shm") else None
#: Checks on this checkout's side: the cost per evicted pack at the most victims within
#: this factor of its cost at 100 victims (linear), and of the same at 10x fewer packs held.
LINEAR_BOUND = 2.0
FLAT_BOUND = 1.5


def child(spec: dict) -> dict:
    """In the measured code's process: open the built cache, insert the packs in turn."""
    sys.path.insert(0, spec["code"])
    import numpy as np

    import cacheaffinity
    from cacheaffinity.worker._store import ColumnCache
    from cacheaffinity.worker._store.admission import rank
    from cacheaffinity.worker._store.layout import pack_key

    rows = []
    with ColumnCache(spec["directory"], admission=spec["policy"], write_queue=0) as cache:
        for k in spec["victims"]:
            before = cache.info()
            # k packs' bytes less a little: its stored size rounds up to k packs at most
            arrays = {"x": np.arange(max(1, k * spec["pack_bytes"] // 8 - 512), dtype=np.int64)}
            # a pack of low rank: rank admits it in place of ranks above it (a pack never
            # displaces a live one of lower rank: refused, no eviction to measure)
            grp = next(g for i in range(10**6) if rank(pack_key(g := f"big{k}-{i}", 0, 10, ["x"])) < LOW_RANK)
            c0, t0 = time.process_time(), time.perf_counter()
            _, stored = cache.put_pack(grp, 0, 10, arrays)
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
            after = cache.info()
            rows.append({"victims_asked": k, "rank": rank(pack_key(grp, 0, 10, ["x"])), "cpu_s": cpu, "wall_s": wall, "stored": bool(stored),
                         "evicted": before["entries"] + int(stored) - after["entries"],
                         "over_capacity_bytes": max(0, after["size"] - after["capacity"])})  # fmt: skip
            if wall > spec["limit"]:
                break
    return {"code": os.path.dirname(os.path.dirname(cacheaffinity.__file__)), "rows": rows}


def run_case(code: str, directory: str, policy: str, pack_bytes: int, victims: list[int], limit: float) -> dict:
    spec = {"code": code, "directory": directory, "policy": policy, "pack_bytes": pack_bytes,
            "victims": victims, "limit": limit}  # fmt: skip
    return run_child(__file__, code, spec)


def summarize(raw: list[dict]) -> list[dict]:
    """Medians per (side, packs, policy, victims asked) over the repeats."""
    groups: dict[tuple, list[dict]] = {}
    for case in raw:
        for row in case["rows"]:
            groups.setdefault((case["side"], case["packs"], case["policy"], row["victims_asked"]), []).append(row)
    out = []
    for (side, packs, policy, k), rows in sorted(groups.items()):
        cpu = statistics.median(r["cpu_s"] for r in rows)
        evicted = statistics.median(r["evicted"] for r in rows)
        out.append({"side": side, "packs": packs, "policy": policy, "victims": k, "runs": len(rows),
                    "cpu_s": cpu, "wall_s": statistics.median(r["wall_s"] for r in rows),
                    "evicted": evicted, "cpu_per_victim_us": 1e6 * cpu / max(1, evicted),
                    "stored": all(r["stored"] for r in rows),
                    "over_capacity_bytes": max(r["over_capacity_bytes"] for r in rows)})  # fmt: skip
    return out


def checks(summary: list[dict]) -> dict:
    find = {(r["side"], r["packs"], r["policy"], r["victims"]): r for r in summary if r["runs"]}
    mine = [r for r in summary if r["side"] == "after"]
    out: dict[str, dict] = {
        "within capacity after every insert (this checkout)": {
            "value": max((r["over_capacity_bytes"] for r in mine), default=None), "bound": 0,
            "met": bool(mine) and all(r["over_capacity_bytes"] == 0 for r in mine)},
        "every insert stored (this checkout)": {
            "value": sum(not r["stored"] for r in mine), "bound": 0, "met": bool(mine) and all(r["stored"] for r in mine)},
    }  # fmt: skip
    packs = sorted({r["packs"] for r in mine})
    for policy in POLICIES:
        for n in packs:
            ks = sorted(r["victims"] for r in mine if r["packs"] == n and r["policy"] == policy)
            if 100 in ks and ks[-1] > 100:
                most, base = find[("after", n, policy, ks[-1])], find[("after", n, policy, 100)]
                ratio = most["cpu_per_victim_us"] / base["cpu_per_victim_us"]
                out[f"{policy}, {n:,} packs: per victim at {ks[-1]:,} / at 100"] = {
                    "ratio": round(ratio, 2), "bound": LINEAR_BOUND, "met": ratio <= LINEAR_BOUND}
        if len(packs) > 1:
            small, large = packs[0], packs[-1]
            common = sorted({r["victims"] for r in mine if r["policy"] == policy and r["packs"] == small}
                            & {r["victims"] for r in mine if r["policy"] == policy and r["packs"] == large})
            if common:
                k = common[-1]
                ratio = find[("after", large, policy, k)]["cpu_s"] / find[("after", small, policy, k)]["cpu_s"]
                out[f"{policy}, {k:,} victims: {large:,} packs / {small:,}"] = {
                    "ratio": round(ratio, 2), "bound": FLAT_BOUND, "met": ratio <= FLAT_BOUND}  # fmt: skip
    return out


def plot(doc: dict, path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    summary = doc["results"]["summary"]
    for side, style in (("after", "-"), ("before", "--")):
        for policy, marker in (("rank", "o"), ("fifo", "s")):
            for n in sorted({r["packs"] for r in summary}):
                pts = [(r["evicted"], r["cpu_s"]) for r in summary
                       if (r["side"], r["policy"], r["packs"]) == (side, policy, n) and r["evicted"]]  # fmt: skip
                if pts:
                    label = f"{policy}, {n:,} packs" + ("" if side == "after" else f" (before: {doc['config']['before']})")
                    ax.plot(*zip(*sorted(pts)), style, marker=marker, label=label)
    ax.set(xscale="log", yscale="log", xlabel="packs evicted by the insert", ylabel="CPU seconds of the insert",
           title=f"one insert into a full node cache ({doc['commit'][:7]})")  # fmt: skip
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path)


def render(results: str, name: str = "eviction_scale") -> str:
    """The docs' table (docs/benchmarks.md, ``<!-- table:eviction_scale -->``) from ``<name>.json``."""
    from benchmarks._common import bounds_met, measured_at, not_measured, read_results

    doc = read_results(results, name)
    if doc is None:
        return not_measured("eviction_scale.py", name)
    summary = doc["results"]["summary"]
    find = {(r["side"], r["packs"], r["policy"], r["victims"]): r for r in summary}
    before = doc["config"].get("before")
    head = "| packs held | packs evicted | `rank` ms (µs per pack) | `fifo` ms (µs per pack) |"
    if before:
        head += f" `rank` ms at {before} | `fifo` ms at {before} |"
    lines = [head, "| ---: " * (head.count("|") - 1) + "|"]

    def cell(r: dict | None, evicted: float, per_victim: bool = True) -> str:
        if r is None:
            return "not run (an earlier insert over the limit)"
        text = f"{1e3 * r['cpu_s']:,.1f}" + (f" ({r['cpu_per_victim_us']:.0f})" if per_victim else "")
        if r["evicted"] != evicted:
            text += f", {r['evicted']:,.0f} evicted"
        if r["over_capacity_bytes"]:
            text += f", **{r['over_capacity_bytes'] / 2**20:.1f} MiB over capacity**"
        return text

    for n in sorted({r["packs"] for r in summary}):
        for k in sorted({r["victims"] for r in summary if r["packs"] == n}):
            a = [find.get(("after", n, p, k)) for p in POLICIES]
            ev = next((r["evicted"] for r in a if r), k)
            row = f"| {n:,} | {ev:,.0f} | " + " | ".join(cell(r, ev) for r in a) + " |"
            if before:
                row += " " + " | ".join(cell(find.get(("before", n, p, k)), ev, False) for p in POLICIES) + " |"
            lines.append(row)
    c = doc["config"]
    command = f"python benchmarks/eviction_scale.py --repeats {c['repeats']}"
    if before:
        command += f" --before {before}"
    lines += [
        "",
        f"CPU of one insert (medians of {c['repeats']} new processes per case; in parentheses per pack evicted). "
        + bounds_met(doc["results"]["checks"]),
        "",
        measured_at(doc, command),
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if serve_child(argv, child):
        return 0
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--packs", type=counts, default=None, help="packs per node cache (default 1e4,1e5,1e6)")
    p.add_argument("--victims", type=counts, default=None, help="packs evicted per insert (default 1,10,...,1e4)")
    p.add_argument("--repeats", type=int, default=None, help="new processes per case (median; default 3)")
    p.add_argument("--before", default=None, help="also measure the code of this commit (a git worktree)")
    p.add_argument("--limit", type=float, default=LIMIT_S, help="a series stops after an insert over this (s)")
    p.add_argument("--work", default=WORK, help=f"where the caches are built (default: {WORK})")
    a = p.parse_args(argv)
    from benchmarks.store_scale import build

    sizes = a.packs or ([2000] if a.quick else list(PACKS))
    victims = a.victims or ([1, 10, 100, 300] if a.quick else list(VICTIMS))
    repeats = a.repeats or (1 if a.quick else 3)
    work = tempfile.mkdtemp(prefix="eviction-scale-", dir=a.work)
    codes = {"after": REPO}
    before = None
    trees = contextlib.ExitStack()
    if a.before:
        before, codes["before"] = trees.enter_context(commit_tree(a.before, work))
    config = {"packs": sizes, "victims": victims, "repeats": repeats, "before": before, "limit_s": a.limit,
              "quick": a.quick}  # fmt: skip
    raw: list[dict] = []
    tic = time.perf_counter()
    try:
        for n in sizes:
            ks, total = [], 0
            for k in victims:  # inserted in turn into one cache: at most half of it evicted
                if k < n and total + k <= n // 2:
                    ks.append(k)
                    total += k
            for i in range(repeats):
                for j, policy in enumerate(POLICIES):
                    sides = list(codes) if (i + j) % 2 == 0 else list(codes)[::-1]
                    for side in sides:
                        d = os.path.join(work, f"{side}-{policy}-{n}-{i}")
                        os.makedirs(d)
                        built = build(d, n)
                        doc = run_case(codes[side], d, policy, built["pack_bytes"], ks, a.limit)
                        shutil.rmtree(d)
                        raw.append({"side": side, "packs": n, "policy": policy, "repeat": i, **doc})
                        last = doc["rows"][-1]
                        print(f"{side:6} {policy} {n:>9,} packs: {len(doc['rows'])} inserts, the last evicting "
                              f"{last['evicted']:,} in {last['cpu_s']:.3f} s CPU", flush=True)  # fmt: skip
    finally:
        trees.close()
        shutil.rmtree(work, ignore_errors=True)
    for case in raw:
        case["code"] = case["side"]  # (the worktree's path is this machine's)
    summary = summarize(raw)
    results = {"summary": summary, "checks": checks(summary), "cases": raw}
    save_results(a.out, "eviction_scale", config, results, tic, plot, summary,
                 ["side", "packs", "policy", "victims", "evicted", "cpu_s", "cpu_per_victim_us", "over_capacity_bytes"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
