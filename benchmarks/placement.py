"""Placement benchmark: load balance, disruption and cost of chunk -> node placement.

Runs on the client (pure computation, no cluster). Compares, on the same chunk ids:

- ``torus-D{d}`` / ``torus-D{d}-b{balance}``: :class:`cacheaffinity.placement.TorusPlacement`
  (100 replicas per node), with and without bounded loads;
- ``mod``: ``xxh3(chunk) % n`` over the sorted node list (coffea's ``worker_affinity``);
- ``ring``: a consistent-hash ring, 100 virtual nodes per node, successor by binary search;
- ``rendezvous``: highest random weight, ``argmax_n mix64(xxh3(chunk) ^ xxh3(node))``,
  vectorised over nodes in numpy.

The baselines live here: they are comparison points, not product code.

Measures
--------
- **load**: max/mean chunks per node at 10, 100, 1000 nodes for 100k and 1M chunks;
- **disruption**: removing / adding one node (over several choices of the node): chunks
  moved as a multiple of the ideal fraction (1/n, resp. 1/(n+1)); and chunks moved
  between nodes that were there before and after (0 is ideal);
- **cost**: µs per chunk of a batched assign of 100k chunks (best of 3) and of a single
  chunk (``assign([x])``, for the torus also ``ranking(x, 1)``) in a loop of 2000.

Usage::

    python benchmarks/placement.py [--quick] [--out benchmarks/results]

writes ``placement.json`` (config, machine, results) and ``placement.png`` and prints
tables. ``--quick`` is a smoke test (< 1 min); the full run takes several minutes on 2
cores. Timings are wall clock: on a shared machine they vary (load average recorded).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections import Counter
from itertools import repeat

import numpy as np
import xxhash

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (  # noqa: E402
    best_of,
    machine_info,
    parser,
    print_table,
    pyplot,
    save_png,
    write_json,
)

from cacheaffinity.placement import TorusPlacement  # noqa: E402

_h64 = xxhash.xxh3_64_intdigest


def chunk_ids(n: int) -> list[str]:
    """coffea-like chunk identities: 100 chunks of 100k entries per file."""
    return [
        f"file-{i // 100}/Events/{(i % 100) * 100000}-{(i % 100 + 1) * 100000}" for i in range(n)
    ]


def node_ids(n: int) -> list[str]:
    return [f"node-{i:04d}" for i in range(n)]


def _hash_all(ids: list[str], seed: int = 0) -> np.ndarray:
    bs = [s.encode() for s in ids]
    return np.fromiter(map(_h64, bs, repeat(seed, len(bs))), dtype=np.uint64, count=len(bs))


# ------------------------------------------------------------------ methods
class Torus:
    def __init__(self, dimensions: int, balance: float | None, replicas: int = 100):
        self.p = TorusPlacement(dimensions=dimensions, replicas=replicas, balance=balance)
        self.name = f"torus-D{dimensions}" + ("" if balance is None else f"-b{balance}")
        self.family = "torus"

    def set_nodes(self, nodes: list[str]) -> None:
        self.p.set_nodes(dict.fromkeys(nodes, 1.0))

    def assign(self, chunks: list[str]) -> list[str]:
        return self.p.assign(chunks)

    def single(self, chunk: str) -> str:
        return self.p.assign([chunk])[0]


class ModHash:
    """coffea ``worker_affinity``: ``hash(chunk) % n_workers``."""

    name = family = "mod"

    def set_nodes(self, nodes: list[str]) -> None:
        self.nodes = np.array(sorted(nodes), dtype=object)

    def assign(self, chunks: list[str]) -> list[str]:
        return self.nodes[_hash_all(chunks) % np.uint64(len(self.nodes))].tolist()

    def single(self, chunk: str) -> str:
        return self.nodes[_h64(chunk.encode()) % len(self.nodes)]


class HashRing:
    """Consistent hashing: each node at ``vnodes`` ring positions, chunk -> successor."""

    family = "ring"

    def __init__(self, vnodes: int = 100):
        self.vnodes = vnodes
        self.name = f"ring-{vnodes}"
        self._cache: dict[str, np.ndarray] = {}

    def set_nodes(self, nodes: list[str]) -> None:
        for n in nodes:
            if n not in self._cache:
                self._cache[n] = _hash_all([f"{n}#{v}" for v in range(self.vnodes)])
        names = sorted(nodes)
        pos = np.concatenate([self._cache[n] for n in names])
        owner = np.repeat(np.arange(len(names)), self.vnodes)
        order = np.argsort(pos, kind="stable")
        self.pos, self.owner = pos[order], owner[order]
        self.names = np.array(names, dtype=object)

    def assign(self, chunks: list[str]) -> list[str]:
        i = np.searchsorted(self.pos, _hash_all(chunks), side="right") % len(self.pos)
        return self.names[self.owner[i]].tolist()

    def single(self, chunk: str) -> str:
        import bisect

        i = bisect.bisect_right(self.pos, _h64(chunk.encode())) % len(self.pos)
        return self.names[self.owner[i]]


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (in place on a uint64 array)."""
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


class Rendezvous:
    """Highest random weight: the node with the largest ``mix64(h(chunk) ^ h(node))``."""

    name = family = "rendezvous"

    def set_nodes(self, nodes: list[str]) -> None:
        self.names = np.array(sorted(nodes), dtype=object)
        self.hn = _hash_all(list(self.names), seed=1)

    def assign(self, chunks: list[str]) -> list[str]:
        hc = _hash_all(chunks)
        n = len(self.hn)
        block = max(1, 4_000_000 // n)
        out = np.empty(len(hc), dtype=np.int64)
        for s in range(0, len(hc), block):
            scores = _mix64(hc[s : s + block, None] ^ self.hn[None, :])
            out[s : s + block] = scores.argmax(axis=1)
        return self.names[out].tolist()

    def single(self, chunk: str) -> str:
        h = np.uint64(_h64(chunk.encode()))
        return self.names[int(_mix64(self.hn ^ h).argmax())]


def methods(dims: list[int], balances: list[float | None]) -> list:
    out = [Torus(d, b) for d in dims for b in balances]
    return out + [ModHash(), HashRing(100), Rendezvous()]


# ------------------------------------------------------------------ measurements
def load_balance(m, nodes: list[str], chunks: list[str]) -> dict:
    m.set_nodes(nodes)
    t = time.perf_counter()
    result = m.assign(chunks)
    seconds = time.perf_counter() - t
    counts = Counter(result)
    loads = np.array([counts.get(n, 0) for n in nodes])
    mean = len(chunks) / len(nodes)
    return {
        "method": m.name,
        "nodes": len(nodes),
        "chunks": len(chunks),
        "max_over_mean": float(loads.max() / mean),
        "min_over_mean": float(loads.min() / mean),
        "cv": float(loads.std() / mean),
        "seconds": seconds,
    }


def disruption(m, nodes: list[str], chunks: list[str], trials: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    n = len(nodes)
    m.set_nodes(nodes)
    before = np.array(m.assign(chunks), dtype=object)
    removed = []
    for gone in rng.choice(nodes, size=min(trials, n), replace=False).tolist():
        m.set_nodes([x for x in nodes if x != gone])
        after = np.array(m.assign(chunks), dtype=object)
        moved = before != after
        removed.append(
            {
                "node": gone,
                "moved_over_ideal": float(moved.mean() * n),
                "between_survivors": int((moved & (before != gone)).sum()),
            }
        )
    added = []
    for t in range(min(trials, n)):
        new = f"node-new-{t:02d}"
        m.set_nodes(nodes + [new])
        after = np.array(m.assign(chunks), dtype=object)
        moved = before != after
        added.append(
            {
                "node": new,
                "moved_over_ideal": float(moved.mean() * (n + 1)),
                "between_survivors": int((moved & (after != new)).sum()),
            }
        )
    m.set_nodes(nodes)

    def summary(rows):
        r = [x["moved_over_ideal"] for x in rows]
        s = [x["between_survivors"] for x in rows]
        return {
            "median": statistics.median(r),
            "worst": max(r),
            "between_survivors_median": statistics.median(s),
            "between_survivors_max": max(s),
            "trials": rows,
        }

    return {
        "method": m.name,
        "nodes": n,
        "chunks": len(chunks),
        "remove": summary(removed),
        "add": summary(added),
    }


def cost(m, nodes: list[str], chunks: list[str], singles: list[str], repeat_: int) -> dict:
    m.set_nodes(nodes)
    batched = best_of(lambda: m.assign(chunks), repeat_)

    def loop():
        for c in singles:
            m.single(c)

    single = best_of(loop, 1)
    out = {
        "method": m.name,
        "nodes": len(nodes),
        "chunks": len(chunks),
        "batched_us_best": batched.best / len(chunks) * 1e6,
        "batched_us_median": batched.median / len(chunks) * 1e6,
        "batched_cpu_us": batched.cpu / len(chunks) * 1e6,
        "single_us": single.best / len(singles) * 1e6,
    }
    if isinstance(m, Torus):

        def rank_loop():
            for c in singles:
                m.p.ranking(c, 1)

        out["ranking1_us"] = best_of(rank_loop, 1).best / len(singles) * 1e6
    return out


# ------------------------------------------------------------------ main
def main(argv=None) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    quick = args.quick
    config = {
        "quick": quick,
        "replicas": 100,
        "ring_vnodes": 100,
        "dimensions": [1, 2, 4] if quick else [1, 2, 3, 4, 6],
        "balances": [None, 1.05, 1.25],
        "load_nodes": [10, 100] if quick else [10, 100, 1000],
        "load_chunks": [20_000] if quick else [100_000, 1_000_000],
        # 1M chunks: only these methods (the others at 100k)
        "load_1m_methods": ["torus-D3", "torus-D3-b1.05", "torus-D4", "torus-D4-b1.05",
                            "torus-D4-b1.25", "torus-D1", "mod", "ring-100", "rendezvous"],
        "disruption_nodes": [100] if quick else [10, 100],
        "disruption_chunks": 20_000 if quick else 100_000,
        "disruption_trials": 3 if quick else 20,
        # disruption: D=6 left out (slow queries; same consistency property)
        "disruption_methods": (
            ["torus-D3", "torus-D4", "torus-D4-b1.05", "mod", "ring-100", "rendezvous"]
            if quick else
            ["torus-D1", "torus-D2", "torus-D3", "torus-D3-b1.05", "torus-D4", "torus-D4-b1.05",
             "torus-D4-b1.25", "mod", "ring-100", "rendezvous"]
        ),
        "cost_nodes": [100] if quick else [100, 1000],
        "cost_chunks": 20_000 if quick else 100_000,
        "cost_single": 200 if quick else 2000,
        "cost_repeat": 1 if quick else 3,
        "target_chunks": [100_000] if quick else [100_000, 1_000_000],
    }
    all_methods = methods(config["dimensions"], config["balances"])
    start = time.perf_counter()
    machine_start = machine_info()
    results: dict = {"load": [], "disruption": [], "cost": [], "target": [], "skipped": []}
    max_chunks = max(config["load_chunks"] + config["target_chunks"])
    ids = chunk_ids(max_chunks)

    # ---- load balance
    for c in config["load_chunks"]:
        for n in config["load_nodes"]:
            for m in all_methods:
                if c >= 1_000_000 and m.name not in config["load_1m_methods"]:
                    continue
                results["load"].append(load_balance(m, node_ids(n), ids[:c]))
        if c >= 1_000_000:
            results["skipped"].append(
                f"load at {c:,} chunks only for {', '.join(config['load_1m_methods'])} "
                f"(time budget; the other methods behave the same at 100k)"
            )
        print(f"[{time.perf_counter() - start:6.0f} s] load, {c:,} chunks done", flush=True)

    # ---- disruption
    left_out = [m.name for m in all_methods if m.name not in config["disruption_methods"]]
    if left_out:
        results["skipped"].append(f"disruption not measured for {', '.join(left_out)}")
    for n in config["disruption_nodes"]:
        for m in all_methods:
            if m.name in config["disruption_methods"]:
                results["disruption"].append(
                    disruption(m, node_ids(n), ids[: config["disruption_chunks"]],
                               config["disruption_trials"])
                )
        print(f"[{time.perf_counter() - start:6.0f} s] disruption, {n} nodes done", flush=True)

    # ---- cost
    singles = ids[-config["cost_single"]:]
    for n in config["cost_nodes"]:
        for m in all_methods:
            results["cost"].append(
                cost(m, node_ids(n), ids[: config["cost_chunks"]], singles, config["cost_repeat"])
            )
        print(f"[{time.perf_counter() - start:6.0f} s] cost, {n} nodes done", flush=True)

    # ---- the performance target, for the default D (3) and D=4: 1000 nodes x 100
    # replicas, weight 1
    n_target = 1000
    for dim in (TorusPlacement().dimensions, 4):
        t = Torus(dim, None)
        t.set_nodes(node_ids(n_target))
        for c in config["target_chunks"]:
            timing = best_of(lambda: t.assign(ids[:c]), 2 if c >= 1_000_000 else 3)
            results["target"].append(
                {"method": t.name, "nodes": n_target, "replicas": 100, "chunks": c,
                 "us_per_chunk_best": timing.best / c * 1e6,
                 "us_per_chunk_median": timing.median / c * 1e6,
                 "cpu_us_per_chunk": timing.cpu / c * 1e6}
            )
    t0 = time.perf_counter()
    t.set_nodes(node_ids(n_target) + ["node-joining"])
    join = time.perf_counter() - t0
    t0 = time.perf_counter()
    fresh = Torus(t.p.dimensions, None)
    fresh.set_nodes(node_ids(n_target))
    cold = time.perf_counter() - t0
    results["set_nodes"] = {"nodes": n_target, "replicas": 100,
                            "one_node_joins_seconds": join, "cold_seconds": cold}
    results["elapsed_seconds"] = time.perf_counter() - start

    # ---- tables
    tables = report(results, config)
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "placement.json")
    png_path = os.path.join(args.out, "placement.png")
    write_json(json_path, config, results, machine_at_start=machine_start, tables=tables)
    plot(results, config, png_path)
    print(f"\nwrote {json_path} and {png_path} in {results['elapsed_seconds']:.0f} s")
    return 0


def report(results: dict, config: dict) -> str:
    text = []
    load = results["load"]
    names = list(dict.fromkeys(r["method"] for r in load))
    cols = [(c, n) for c in config["load_chunks"] for n in config["load_nodes"]]
    rows = []
    for name in names:
        row = {"method": name}
        for c, n in cols:
            hit = [r for r in load if r["method"] == name and r["nodes"] == n and r["chunks"] == c]
            row[f"{n}n/{c // 1000}k"] = hit[0]["max_over_mean"] if hit else None
        rows.append(row)
    text.append(print_table(rows, title="\nLoad: max/mean chunks per node (- = not run)"))

    rows = []
    for r in results["disruption"]:
        rows.append({
            "method": r["method"], "nodes": r["nodes"],
            "rm median": r["remove"]["median"], "rm worst": r["remove"]["worst"],
            "rm survivor moves": r["remove"]["between_survivors_max"],
            "add median": r["add"]["median"], "add worst": r["add"]["worst"],
            "add survivor moves": r["add"]["between_survivors_max"],
        })
    text.append(print_table(
        rows,
        title=f"\nDisruption ({config['disruption_chunks']:,} chunks, "
              f"{config['disruption_trials']} nodes removed / added): moved / ideal "
              f"(1/n); survivor moves = max chunks moved between nodes present before "
              f"and after",
    ))

    rows = []
    for r in results["cost"]:
        rows.append({
            "method": r["method"], "nodes": r["nodes"],
            "batched µs (best)": r["batched_us_best"],
            "batched µs (median)": r["batched_us_median"],
            "batched CPU µs": r["batched_cpu_us"],
            "single µs": r["single_us"], "ranking(x,1) µs": r.get("ranking1_us"),
        })
    text.append(print_table(
        rows, title=f"\nCost per chunk (batched: assign of {config['cost_chunks']:,}; "
                    f"single: loop of {config['cost_single']:,})"))

    text.append(print_table(results["target"], title="\nTarget: batched assign at 1000 "
                            "nodes x 100 replicas (default D and D=4)"))
    s = results["set_nodes"]
    line = (f"set_nodes at {s['nodes']} nodes x {s['replicas']} replicas: cold "
            f"{s['cold_seconds']:.3f} s, one node joins {s['one_node_joins_seconds']:.3f} s")
    print(line)
    text.append(line)

    def get_load(name, n, c):
        hit = [r for r in load if r["method"] == name and r["nodes"] == n and r["chunks"] == c]
        return hit[0]["max_over_mean"] if hit else None

    def fmt(v, spec=".3f"):
        return "n/a" if v is None else format(v, spec)

    c0 = config["load_chunks"][0]
    checks = []
    for D in (TorusPlacement().dimensions, 4):
        tag = f"torus-D{D}"
        d = [r for r in results["disruption"] if r["method"] == tag and r["nodes"] == 100]
        checks += [
            (f"balanced (b=1.05) max/mean <= 1.05 at 100 nodes (D={D})",
             get_load(f"{tag}-b1.05", 100, c0), 1.05),
            (f"unbalanced D={D} max/mean <= 1.15 at 100 nodes", get_load(tag, 100, c0), 1.15),
            (f"median removal disruption <= 1.1 x ideal (D={D}, 100 nodes)",
             d[0]["remove"]["median"] if d else None, 1.1),
            (f"median addition disruption <= 1.1 x ideal (D={D}, 100 nodes)",
             d[0]["add"]["median"] if d else None, 1.1),
            (f"moves between survivors == 0 (D={D}, 100 nodes)",
             (d[0]["remove"]["between_survivors_max"] + d[0]["add"]["between_survivors_max"])
             if d else None, 0),
        ]
    for r in results["target"]:
        checks.append((
            f"batched assign <= 2 us/chunk at 1000 nodes x 100 replicas "
            f"({r['method']}, {r['chunks']:,} chunks, best wall)", r["us_per_chunk_best"], 2.0))
    rows = [
        {"target": what, "measured": fmt(v), "limit": limit,
         "met": "n/a" if v is None else ("yes" if v <= limit else "NO")}
        for what, v, limit in checks
    ]
    text.append(print_table(rows, title=f"\nTargets (load at {c0:,} chunks)"))
    for s in results["skipped"]:
        print("note:", s)
        text.append("note: " + s)
    load_avg = machine_info()["load_average_1_5_15"]
    note = f"load average at the end: {load_avg} on {os.cpu_count()} CPUs"
    print(note)
    text.append(note)
    return "\n".join(text)


def plot(results: dict, config: dict, path: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(15, 10))
    load = results["load"]
    names = list(dict.fromkeys(r["method"] for r in load))
    colors = {name: plt.cm.tab10(i % 10) for i, name in enumerate(
        [n for n in names if "-b" not in n])}

    def base(name):
        return name.split("-b")[0]

    for ax, balanced in ((axes[0, 0], False), (axes[0, 1], True)):
        for name in names:
            if ("-b" in name) != balanced:
                continue
            for c, style in zip(config["load_chunks"], ("-", ":")):
                pts = sorted((r["nodes"], r["max_over_mean"]) for r in load
                             if r["method"] == name and r["chunks"] == c)
                if not pts:
                    continue
                ls = style if not balanced else ("-" if name.endswith("1.05") else "--")
                if balanced and c != config["load_chunks"][0]:
                    continue
                label = name if c == config["load_chunks"][0] else None
                ax.plot(*zip(*pts), ls=ls, marker="o", color=colors[base(name)], label=label)
        ax.set_xscale("log")
        ax.set_xlabel("nodes")
        ax.set_ylabel("max / mean load")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    chunks_label = " / ".join(f"{c // 1000}k" for c in config["load_chunks"])
    axes[0, 0].set_title(f"Load, nearest node (solid / dotted: {chunks_label} chunks)")
    axes[0, 1].set_title(f"Load, bounded (torus, {config['load_chunks'][0] // 1000}k chunks; "
                         "solid 1.05, dashed 1.25)")

    ax = axes[1, 0]
    n_d = 100 if 100 in config["disruption_nodes"] else config["disruption_nodes"][0]
    rows = [r for r in results["disruption"] if r["nodes"] == n_d]
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["remove"]["median"] for r in rows], 0.4, label="remove one (median)")
    ax.bar(x + 0.2, [r["add"]["median"] for r in rows], 0.4, label="add one (median)")
    ax.scatter(x - 0.2, [r["remove"]["worst"] for r in rows], marker="v", c="k", s=14,
               label="worst", zorder=3)
    ax.scatter(x + 0.2, [r["add"]["worst"] for r in rows], marker="v", c="k", s=14, zorder=3)
    labels = []
    for r in rows:
        moves = max(r["remove"]["between_survivors_max"], r["add"]["between_survivors_max"])
        labels.append(r["method"] + (f"\n({moves:,} survivor moves)" if moves else ""))
    ax.axhline(1, color="grey", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(x, labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("chunks moved / ideal (1/n)")
    ax.set_title(f"Disruption ({n_d} nodes, {config['disruption_chunks']:,} chunks)")
    ax.legend(fontsize=7)

    ax = axes[1, 1]
    n_c = max(config["cost_nodes"])
    rows = [r for r in results["cost"] if r["nodes"] == n_c]
    x = np.arange(len(rows))
    ax.bar(x - 0.27, [r["batched_us_best"] for r in rows], 0.27, label="batched, wall (best)")
    ax.bar(x, [r["batched_cpu_us"] for r in rows], 0.27, label="batched, CPU (all threads)")
    ax.bar(x + 0.27, [r["single_us"] for r in rows], 0.27, label="single assign([x]), wall")
    ax.axhline(2, color="grey", lw=0.8, ls=":")
    ax.set_yscale("log")
    ax.set_xticks(x, [r["method"] for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("µs per chunk")
    ax.set_title(f"Cost ({n_c} nodes x 100 replicas, {config['cost_chunks']:,} chunks batched)")
    ax.legend(fontsize=7)

    fig.tight_layout()
    save_png(fig, path)


if __name__ == "__main__":
    sys.exit(main())
