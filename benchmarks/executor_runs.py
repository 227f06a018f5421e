"""Consecutive coffea runs with CacheAffinityExecutor against the in-memory floor.

On generated NanoAOD-like data (LZMA-9 by default), one local cluster of W
worker processes (W cache nodes), side by side in one invocation:

- ``dask``:   coffea's DaskExecutor, no cache (reads and decompresses every run);
- ``run 1``:  CacheAffinityExecutor, cold node caches;
- ``run 2``, ``run 3``...:  CacheAffinityExecutor, warm node caches (disk);
- ``floor``:  the same executor with every column buffer already in worker memory
  (a per-process dict filled by a previous run) and the forms cached: what is left
  is the analysis itself plus coffea/Dask overhead.

Warm disk-cache runs and floor runs alternate (``--repeats``); the ratio uses the
best of each, so warm-up effects in the worker processes do not count.  To compare
the cache with the floor alone, switch stealing off (a stolen chunk is a miss in
both): ``DASK_CACHEAFFINITY__SCHEDULER__STEALING__ENABLED=False``.

    python benchmarks/executor_runs.py [--events 60000] [--files 4] [--workers 2]

Prints a table, writes benchmarks/results/executor_runs.json and .png.
"""

from __future__ import annotations

import argparse
import json
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
from distributed import Client, LocalCluster  # noqa: E402

import cacheaffinity  # noqa: E402
from benchmarks._common import pyplot, save_png, write_json  # noqa: E402
from benchmarks._memory import memory_buffers  # noqa: E402
from testbed.synthetic import dataset_stats, make_dataset  # noqa: E402
from examples.analysis import DimuonJetProcessor, summary  # noqa: E402

COUNTERS = ("hits", "misses", "storage_bytes", "storage_opens")




def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=60_000)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--chunksize", type=int, default=5_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2, help="warm runs of each kind")
    p.add_argument("--codec", default="lzma")
    p.add_argument("--data", default=str(ROOT / ".bench-data" / "executor_runs"))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = p.parse_args(argv)

    data = Path(args.data)
    stamp = data / "params.json"
    params = {"events": args.events, "files": args.files, "codec": args.codec, "seed": 1, "jitter": 0.02}
    if not stamp.exists() or json.loads(stamp.read_text()) != params:
        shutil.rmtree(data, ignore_errors=True)
        make_dataset(data, events=args.events, files=args.files, codec=args.codec, seed=1, progress=True)
        stamp.write_text(json.dumps(params))
    files = sorted(str(f) for f in data.glob("nano_*.root"))
    stats = dataset_stats(files)
    fileset = {"synthetic": files}
    cache_root = data.parent / "caches"
    shutil.rmtree(cache_root, ignore_errors=True)

    def runner(executor, **kw):
        return processor.Runner(
            executor=executor, schema=NanoAODSchema, chunksize=args.chunksize, **kw
        )

    rows = {}
    with dask.config.set(
        {
            "distributed.scheduler.preload": ["cacheaffinity"],
            "distributed.worker.preload": ["cacheaffinity"],
            "cacheaffinity.worker.directory": str(cache_root / "node-{name}"),
            "cacheaffinity.worker.capacity": "50 GiB",
        }
    ), LocalCluster(
        n_workers=args.workers, threads_per_worker=1, processes=True, host="127.0.0.1",
        dashboard_address="127.0.0.1:0",
    ) as cluster, Client(cluster) as client:  # fmt: skip
        client.wait_for_workers(args.workers)

        def timed(name, executor, **kw):
            before = cacheaffinity.cache_totals(client)
            t0 = time.perf_counter()
            out = runner(executor, **kw)(fileset, DimuonJetProcessor(), treename="Events")
            wall = time.perf_counter() - t0
            after = cacheaffinity.cache_totals(client)
            d = {k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS}
            lookups = d["hits"] + d["misses"]
            rows[name] = {
                "wall_s": wall,
                "hit_rate": d["hits"] / lookups if lookups else None,
                "storage_bytes": d["storage_bytes"],
                "storage_opens": d["storage_opens"],
            }
            print(f"{name:8s} {wall:8.2f} s  {rows[name]}", flush=True)
            return summary(out)

        ca = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
        reference = timed("dask", processor.DaskExecutor(client=client, status=False))
        results = [timed("run 1", ca), timed("run 2", ca)]
        timed("warm-mem", ca, cachestrategy=memory_buffers)
        # alternate warm disk-cache runs and in-memory runs: best of each
        for i in range(args.repeats):
            results.append(timed(f"floor {i + 1}", ca, cachestrategy=memory_buffers))
            results.append(timed(f"run {i + 3}", ca))
        identical = all(r == reference for r in results)

    r1 = rows["run 1"]["wall_s"]
    r2 = min(rows[f"run {i + 2}"]["wall_s"] for i in range(args.repeats + 1))
    floor = min(rows[f"floor {i + 1}"]["wall_s"] for i in range(args.repeats))
    ratios = {
        "run1_over_run2": r1 / r2,
        "run2_over_floor": r2 / floor,
        "dask_over_run2": rows["dask"]["wall_s"] / r2,
    }
    print()
    print(f"{'mode':8s} {'wall [s]':>9s} {'hit rate':>9s} {'storage MB':>11s} {'files':>6s}")
    for name, r in rows.items():
        hit = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}"
        print(f"{name:8s} {r['wall_s']:9.2f} {hit:>9s} {r['storage_bytes'] / 1e6:11.1f} "
              f"{r['storage_opens']:6d}")  # fmt: skip
    print(f"\nrun 1 / best warm run = {ratios['run1_over_run2']:.2f}x; best warm / best floor = "
          f"{ratios['run2_over_floor']:.2f} (target <= 1.2); dask / run 2 = "
          f"{ratios['dask_over_run2']:.2f}x; results identical: {identical}")  # fmt: skip
    out = Path(args.out)
    write_json(
        str(out / "executor_runs.json"),
        config={
            **vars(args),
            "dataset": stats,
            "stealing_enabled": cacheaffinity.config.get("scheduler.stealing.enabled"),
        },
        results={"runs": rows, "ratios": ratios, "identical": identical},
    )
    fig, ax = pyplot().subplots(figsize=(7, 4))
    names = [n for n in rows if n != "warm-mem"]
    colors = ["grey" if n == "dask" else "C2" if n.startswith("floor") else "C0" for n in names]
    ax.bar(names, [rows[n]["wall_s"] for n in names], color=colors)
    ax.set_ylabel("wall time [s]")
    ax.set_title(f"{args.events} events {args.codec}, {args.workers} workers: "
                 f"run 2 = {ratios['run2_over_floor']:.2f} x floor")  # fmt: skip
    save_png(fig, str(out / "executor_runs.png"))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
