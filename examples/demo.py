"""End-to-end demo: consecutive coffea runs with cacheaffinity on a local cluster.

``make demo`` runs ``python -m examples.demo``: it generates NanoAOD-like LZMA-9
data (resampled from a real CMS NanoAOD file), adds the real CMS NanoAOD files of
the repository's ``data/nanoaod/`` as further datasets, starts a local Dask cluster whose
worker processes act as separate cache nodes (each with its own cache
directory), runs the same analysis several times with the cacheaffinity
executor, once with coffea's plain ``DaskExecutor`` for comparison, checks that
every result is identical, and prints a table per run: wall time, column-cache
hit rate, bytes and files read from storage, tasks on their cache node.

Everything listens on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import dask
from coffea import processor
from coffea.nanoevents import NanoAODSchema
from distributed import Client, LocalCluster

import cacheaffinity
from testbed.samples import samples_dir
from testbed.synthetic import make_dataset
from examples.analysis import DimuonJetProcessor, quiet_known_schema_warnings_on, summary

COUNTERS = ("hits", "misses", "bytes_served", "storage_bytes", "storage_opens")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=3, help="worker processes = cache nodes")
    p.add_argument("--events", type=int, default=20_000)
    p.add_argument("--files", type=int, default=2)
    p.add_argument("--chunksize", type=int, default=2_500)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--codec", default="lzma", choices=["lzma", "zlib", "lz4", "zstd"])
    p.add_argument("--workdir", default=".demo", help="data and caches (reused)")
    p.add_argument("--keep-cache", action="store_true", help="do not clear caches first")
    p.add_argument(
        "--check", action="store_true", help="exit 1 unless the last run hit >= 95%% in the caches"
    )
    return p.parse_args(argv)


def dataset(args) -> list[str]:
    """Generate the data once; reuse it when the parameters match."""
    data = Path(args.workdir) / "data"
    stamp = data / "dataset.json"
    want = {"events": args.events, "files": args.files, "codec": args.codec, "seed": 0, "jitter": 0.02}
    if stamp.exists() and json.loads(stamp.read_text()).get("params") == want:
        return json.loads(stamp.read_text())["files"]
    shutil.rmtree(data, ignore_errors=True)
    print(f"generating {args.events} NanoAOD-like events in {args.files} files ({args.codec}) ...")
    t0 = time.perf_counter()
    files = make_dataset(
        data, events=args.events, files=args.files, codec=args.codec, seed=0, progress=True
    )
    print(f"  done in {time.perf_counter() - t0:.1f} s")
    stamp.write_text(json.dumps({"params": want, "files": [str(f) for f in files]}))
    return [str(f) for f in files]




def placement_counters(client) -> dict:
    return cacheaffinity.check(client)["counters"]


def run_once(client, fileset, executor) -> tuple[dict, float]:
    runner = processor.Runner(
        executor=executor, schema=NanoAODSchema, chunksize=ARGS.chunksize, savemetrics=False
    )
    t0 = time.perf_counter()
    out = runner(fileset, processor_instance=DimuonJetProcessor(), treename="Events")
    return out, time.perf_counter() - t0


def main(argv=None) -> int:
    global ARGS
    ARGS = args = parse_args(argv)
    files = dataset(args)
    fileset = {"synthetic": files}
    real = samples_dir()  # data/nanoaod/ of the repository, or $CACHEAFFINITY_NANOAOD_DIR
    for name in ("nano_dy.root", "nano_dimuon.root", "nanoAOD_2015_CMS_Open_Data_ttbar.root"):
        if (real / name).exists():  # real CMS NanoAOD beside the generated data
            fileset[name.removesuffix(".root")] = [str(real / name)]
    cache_root = Path(args.workdir).resolve() / "cache"
    if not args.keep_cache:
        shutil.rmtree(cache_root, ignore_errors=True)
    with dask.config.set(
        {
            "distributed.scheduler.preload": ["cacheaffinity"],
            "distributed.worker.preload": ["cacheaffinity"],
            "cacheaffinity.worker.directory": str(cache_root / "node-{name}"),
            "cacheaffinity.worker.capacity": "20 GiB",
        }
    ):
        with LocalCluster(
            n_workers=args.workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        ) as cluster, Client(cluster) as client:
            quiet_known_schema_warnings_on(client)  # the data's known schema gaps
            info = cacheaffinity.check(client)
            print(
                f"cluster: {args.workers} workers = {len(info['nodes'])} cache nodes; "
                f"dashboard {client.dashboard_link}"
            )
            rows = []
            reference, t_plain = run_once(
                client, fileset, processor.DaskExecutor(client=client, status=False)
            )
            rows.append(("dask (no cache)", t_plain, None, None, None, None))
            executor = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
            identical = True
            for run in range(1, args.runs + 1):
                before, pc0 = cacheaffinity.cache_totals(client), placement_counters(client)
                out, wall = run_once(client, fileset, executor)
                after, pc1 = cacheaffinity.cache_totals(client), placement_counters(client)
                d = {k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS}
                lookups = d["hits"] + d["misses"]
                on = pc1.get("on-target", 0) - pc0.get("on-target", 0)
                off = pc1.get("off-target", 0) - pc0.get("off-target", 0)
                identical &= summary(out) == summary(reference)
                rows.append(
                    (
                        f"cacheaffinity run {run}",
                        wall,
                        d["hits"] / lookups if lookups else 0.0,
                        d["storage_bytes"],
                        d["storage_opens"],
                        on / (on + off) if on + off else 0.0,
                    )
                )
    print()
    print(f"{'mode':24s} {'wall [s]':>9s} {'speedup':>8s} {'hit rate':>9s} "
          f"{'storage MB':>11s} {'files':>6s} {'on node':>8s}")  # fmt: skip
    first = rows[1][1]
    for name, wall, hit, nbytes, opens, on in rows:
        cells = [
            "-" if hit is None else f"{hit:.1%}",
            "-" if nbytes is None else f"{nbytes / 1e6:.1f}",
            "-" if opens is None else str(opens),
            "-" if on is None else f"{on:.1%}",
        ]
        print(
            f"{name:24s} {wall:9.2f} {first / wall:8.2f} {cells[0]:>9s} {cells[1]:>11s} "
            f"{cells[2]:>6s} {cells[3]:>8s}"
        )
    print("(speedup relative to cacheaffinity run 1; hit rate = column-cache hits / lookups;")
    print(" storage = bytes and files read from the data files by chunk tasks;")
    print(" on node = chunk tasks that ran on the cache node placement chose for them)")
    print()
    print("results identical to coffea's DaskExecutor:", "yes" if identical else "NO")
    if args.check and rows[-1][2] < 0.95:
        # (work stealing may send a chunk to a node that does not hold it)
        print("the last run did not come from the caches")
        return 1
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
