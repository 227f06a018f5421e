"""Work stealing with one slow node: locality kept versus Dask's stock stealing.

W worker processes (W cache nodes, 1 thread each, or ``--threads`` per worker for a
heterogeneous cluster); the last one is a slower worker class: every chunk's compute
(a fixed cost per chunk, slept so that the 2-core machine's contention does not blur
it) takes ``--slowdown`` times longer there.
The same consecutive runs, side by side in one invocation:

- ``stock``:         cacheaffinity placement + node caches, Dask's own work stealing;
- ``cacheaffinity``: cacheaffinity placement + node caches + locality-preserving stealing
  (throttled, cache-aware, with the locator that remembers where a chunk was processed).

Per run: wall time, column-cache hit rate, steals, chunks processed off their node,
the machine's load average.  Both clusters are up at once and their runs alternate,
so drifts in the load of the (shared, 2-core) machine hit both modes alike.
``--repeats R`` does it all R times (fresh clusters and caches) and reports per run
the median and the spread (min-max) over the repeats.

    python benchmarks/stealing_slow_node.py [--workers 4] [--runs 3] [--slowdown 3]
    # 4 workers of 1-3 threads, the last 3x slower, 5 runs, 3 repeats
    python benchmarks/stealing_slow_node.py --threads 1 2 3 2 --runs 5 --repeats 3

Writes benchmarks/results/stealing_slow_node.json and .png.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

import dask  # noqa: E402
from coffea import processor  # noqa: E402
from coffea.nanoevents import NanoAODSchema  # noqa: E402
from distributed import Client, Nanny, Scheduler, SpecCluster, get_worker  # noqa: E402

import cacheaffinity  # noqa: E402
from benchmarks._common import make_dataset, pyplot, save_png, write_json  # noqa: E402
from examples.analysis import DimuonJetProcessor, summary  # noqa: E402


class SlowNodeProcessor(DimuonJetProcessor):
    """The analysis plus a fixed compute cost per chunk, ``slowdown`` x on one worker."""

    def __init__(self, cost: float, slowdown: float, slow_worker: str):
        self.cost, self.slowdown, self.slow_worker = cost, slowdown, slow_worker

    def process(self, events):
        out = super().process(events)
        slow = str(get_worker().name) == self.slow_worker
        time.sleep(self.cost * (self.slowdown if slow else 1.0))
        return out




def make_cluster(threads: list[int]) -> SpecCluster:
    """Worker processes (nannies) named 0..W-1 with ``threads[i]`` threads each."""
    workers = {
        str(i): {"cls": Nanny, "options": {"nthreads": t, "host": "127.0.0.1", "name": str(i)}}
        for i, t in enumerate(threads)
    }
    scheduler = {"cls": Scheduler,
                 "options": {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"}}  # fmt: skip
    return SpecCluster(workers=workers, scheduler=scheduler)


def mode_runs(mode, args, files, workdir, repeat=1):
    """Generator: one cluster for ``mode``; each ``next()`` does one run, returns its row."""
    cache_root = workdir / f"caches-{mode}-{repeat}"
    shutil.rmtree(cache_root, ignore_errors=True)
    settings = {
        "distributed.worker.preload": ["cacheaffinity"],
        "cacheaffinity.worker.directory": str(cache_root / "node-{name}"),
    }
    with dask.config.set(settings), make_cluster(args.threads) as cluster, Client(
        cluster
    ) as client:
        client.wait_for_workers(args.workers)
        # stock: Dask's WorkStealing moves chunk tasks as any task; cacheaffinity: chunk
        # tasks kept out of it and stolen by LocalityStealing (no locator for stock: the
        # paper's situation)
        client.register_plugin(
            cacheaffinity.CacheAffinityPlugin(stealing=mode != "stock", locator=mode != "stock")
        )
        info = cacheaffinity.check(client)
        assert len(info["nodes"]) == args.workers, info["nodes"]
        proc = SlowNodeProcessor(args.cost, args.slowdown, str(args.workers - 1))
        executor = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
        reference = None
        for run in range(1, args.runs + 1):
            before, c0 = cacheaffinity.cache_totals(client), cacheaffinity.check(client)["counters"]
            t0 = time.perf_counter()
            out = processor.Runner(executor=executor, schema=NanoAODSchema, chunksize=args.chunksize)(
                {"gen": files}, proc, treename="Events"
            )
            wall = time.perf_counter() - t0
            load = os.getloadavg()[0]
            after, c1 = cacheaffinity.cache_totals(client), cacheaffinity.check(client)["counters"]
            hits = after.get("hits", 0) - before.get("hits", 0)
            misses = after.get("misses", 0) - before.get("misses", 0)
            outcomes = {}
            for _, m in client.get_events("stealing"):
                if isinstance(m, (tuple, list)) and m and m[0] != "request":
                    outcomes[m[0]] = outcomes.get(m[0], 0) + 1
            row = {
                "run": run,
                "wall_s": wall,
                "hit_rate": hits / (hits + misses) if hits + misses else None,
                # column buffers that missed and were decompressed and cached this run
                "decompressed_MB": (after.get("bytes_written", 0) - before.get("bytes_written", 0)) / 1e6,
                "off_target": c1.get("off-target", 0) - c0.get("off-target", 0),
                "on_target": c1.get("on-target", 0) - c0.get("on-target", 0),
                "steal_outcomes_total": outcomes,
                "loadavg_1min": load,
                # learned seconds per chunk task of each node (the locator's NodeSpeed)
                "node_speed_s": cacheaffinity.check(client).get("node-speed"),
                "repeat": repeat,
            }
            print(f"{mode:14s} #{repeat} run {run}: {wall:6.2f} s, load {load:.1f}, hit rate "
                  f"{row['hit_rate'] if row['hit_rate'] is None else round(row['hit_rate'], 4)}, "
                  f"decompressed {row['decompressed_MB']:.1f} MB, "
                  f"off node {row['off_target']}, steal outcomes so far {outcomes}", flush=True)  # fmt: skip
            reference = reference or summary(out)
            assert summary(out) == reference
            yield row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--threads", type=int, nargs="+", default=None,
                   help="threads of each worker (sets --workers), e.g. 1 2 3 2")
    p.add_argument("--repeats", type=int, default=1,
                   help="repeat everything (fresh clusters and caches); medians and spread")
    p.add_argument("--name", default="stealing_slow_node", help="results file name")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--slowdown", type=float, default=3.0)
    p.add_argument("--cost", type=float, default=0.25, help="compute seconds per chunk")
    p.add_argument("--events", type=int, default=40_000)
    p.add_argument("--chunksize", type=int, default=500)
    p.add_argument("--workdir", default=str(ROOT / ".bench-data" / "stealing"))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--modes", nargs="+", default=["stock", "cacheaffinity"])
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="cacheaffinity config for the run, e.g. scheduler.stealing.idle-time=250ms")
    args = p.parse_args(argv)
    if args.threads:
        args.workers = len(args.threads)
    else:
        args.threads = [1] * args.workers
    if min(args.threads) < 1 or args.repeats < 1 or args.runs < 1:
        p.error(f"--threads {args.threads} / --repeats {args.repeats} / --runs {args.runs}: "
                "all must be >= 1")  # fmt: skip
    stamp = _git_commit()  # the code measured (taken before the runs)
    workdir = Path(args.workdir)
    data = workdir / "data"
    if not data.exists():
        make_dataset(
            data, events=args.events, files=4, codec="lzma", seed=5,
            branches=["Muon_*", "Jet_*", "Electron_*", "nMuon", "nJet", "nElectron"],
        )  # fmt: skip
    files = sorted(str(f) for f in data.glob("nano_*.root"))
    import yaml

    # values parsed as YAML, as in a Dask config file ("1.5" -> 1.5, "250ms" stays a string)
    overrides = {f"cacheaffinity.{k}": yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in args.set)}
    # results[mode][repeat] = rows of runs 1..R
    results: dict[str, list] = {mode: [] for mode in args.modes}
    with dask.config.set(overrides):
        for rep in range(1, args.repeats + 1):
            # both clusters stay up; their runs alternate, so a change in the machine's
            # load affects both modes alike (an idle cluster costs next to nothing)
            gens = {mode: mode_runs(mode, args, files, workdir, rep) for mode in args.modes}
            for mode in args.modes:
                results[mode].append([])
            for _ in range(args.runs):
                for mode, gen in gens.items():
                    results[mode][-1].append(next(gen))
            for gen in gens.values():
                gen.close()

    def med(xs):
        xs = sorted(x for x in xs if x is not None)
        if not xs:
            return None
        m = len(xs) // 2
        return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2

    per_run = {}
    print(f"\n{'mode':14s} {'run':>4s} {'wall [s] median (min-max)':>28s} "
          f"{'hit rate median (min-max)':>28s} {'load':>5s}")  # fmt: skip
    for mode, reps in results.items():
        per_run[mode] = []
        for i in range(args.runs):
            rows = [r[i] for r in reps]
            walls = [r["wall_s"] for r in rows]
            hits = [r["hit_rate"] for r in rows if r["hit_rate"] is not None]
            d = {"run": i + 1, "wall_s_median": med(walls), "wall_s_min": min(walls),
                 "wall_s_max": max(walls), "hit_rate_median": med(hits),
                 "hit_rate_min": min(hits) if hits else None,
                 "hit_rate_max": max(hits) if hits else None,
                 "loadavg_1min_median": med([r["loadavg_1min"] for r in rows])}  # fmt: skip
            per_run[mode].append(d)
            hit = "-" if not hits else f"{d['hit_rate_median']:.1%} ({min(hits):.1%}-{max(hits):.1%})"
            print(f"{mode:14s} {i + 1:4d} {d['wall_s_median']:9.2f} ({min(walls):.2f}-{max(walls):.2f})"
                  f"{hit:>28s} {d['loadavg_1min_median']:5.1f}")  # fmt: skip
    if set(results) != {"stock", "cacheaffinity"} or args.runs < 2:
        return
    # per repeat: runs 2..R wall of cacheaffinity / stock; then median and spread
    ratios = [
        sum(r["wall_s"] for r in ca[1:]) / sum(r["wall_s"] for r in st[1:])
        for ca, st in zip(results["cacheaffinity"], results["stock"])
    ]
    wall_ratio = med(ratios)
    run2_hits = [ca[1]["hit_rate"] for ca in results["cacheaffinity"]]
    print(f"\nruns 2..{args.runs}: cacheaffinity wall / stock wall = {wall_ratio:.3f} median "
          f"(per repeat {[round(x, 3) for x in ratios]}); run-2 hit rate cacheaffinity "
          f"{[round(h, 4) if h is not None else None for h in run2_hits]}")  # fmt: skip
    out = Path(args.out)
    write_json(str(out / f"{args.name}.json"), config=vars(args),
               results={"runs": results, "per_run": per_run,
                        "wall_ratio_later_runs": wall_ratio,
                        "wall_ratio_later_runs_per_repeat": ratios,
                        "run2_hit_rate_cacheaffinity_per_repeat": run2_hits,
                        "note": "measured on a shared 2-core machine; loadavg_1min per run"},
               commit=stamp)  # fmt: skip
    fig, (ax1, ax2) = pyplot().subplots(1, 2, figsize=(10, 4))
    for mode, rows in per_run.items():
        runs = [r["run"] for r in rows]
        lo = [r["wall_s_median"] - r["wall_s_min"] for r in rows]
        hi = [r["wall_s_max"] - r["wall_s_median"] for r in rows]
        ax1.errorbar(runs, [r["wall_s_median"] for r in rows], yerr=[lo, hi], fmt="o-",
                     capsize=3, label=mode)  # fmt: skip
        ax2.plot(runs, [100 * (r["hit_rate_median"] or 0) for r in rows], "o-", label=mode)
    load = med([r["loadavg_1min_median"] for rows in per_run.values() for r in rows])
    ax1.set(xlabel="run", ylabel="wall time [s] (median, min-max)",
            title=f"threads {args.threads}, last node {args.slowdown:g}x slower\n"
                  f"{args.repeats} repeats; measured under load (1-min load avg ~{load:.1f})")  # fmt: skip
    ax2.set(xlabel="run", ylabel="column-cache hit rate [%]", ylim=(0, 105))
    ax1.legend()
    save_png(fig, str(out / f"{args.name}.png"))


def _git_commit() -> dict:
    """``{"sha": HEAD, "dirty": bool}`` of this checkout, or {} outside git."""
    import subprocess

    try:
        sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()  # fmt: skip
        st = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {"sha": sha, "dirty": bool(st.strip())}


if __name__ == "__main__":
    main()
