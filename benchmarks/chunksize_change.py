"""Cache hits when the chunksize changes between runs.

Five consecutive runs of one analysis (:class:`examples.analysis.DimuonJetProcessor`)
with :class:`cacheaffinity.CacheAffinityExecutor` on generated NanoAOD-like LZMA-9 data
(:func:`testbed.synthetic.make_dataset`, ``--basket-events`` entries per cluster), on a
``LocalCluster`` of W worker processes (1 thread each) acting as W cache nodes, each with
its own, initially empty, cache directory:

run 1 chunksize C (cold), run 2 C, run 3 C/2, run 4 0.4*C (not cluster aligned), run 5 1.5*C.

``--compare N`` (default 3): a second cluster of W workers whose chunk tasks cache per chunk
entry range, as before layout 3 (``cacheaffinity.coffea._work.CHUNK_PACKS = False``), is
warmed with one run at C; then N warm runs at C of each layout, interleaved, give the ratio
of their wall times (``warm_comparison`` in the JSON): the warm run with an unchanged
chunksize must be no slower than before.

Per run: wall time, column hit rate (the node's own cache: (hits - peer_hits) / lookups;
``cache_rate``, served by any node's cache: hits / lookups; :func:`cacheaffinity.cache_totals`
deltas), files opened by chunk tasks and bytes they
requested from storage (the worker plugin's ``storage_opens`` / ``storage_bytes``), chunks,
and whether the output equals coffea's ``IterativeExecutor`` at the same chunksize
(``--check``, on by default).  ``stripe_boundaries`` is the number of placement-stripe
boundaries inside the files (``cacheaffinity.client.stripe-entries``): a chunk crossing one
may miss the clusters of its minority stripe, so ``storage_opens`` of runs 2-5 should stay
at or below about twice that number.

    python benchmarks/chunksize_change.py --events 40000 --files 2 --chunksize 2000 --stripe-entries 10000
    python benchmarks/chunksize_change.py --quick   # 8000 events, C=200, stripes of 1000

Prints a table, writes benchmarks/results/chunksize_change.json and .png
(``chunksize_change_nostealing.*`` with ``--no-stealing``).  Exits non-zero
only on errors (a result differing from IterativeExecutor is an error).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
import benchmarks._runs  # noqa: E402, F401  (the workers' environment: PYTHONPATH, coffea's warnings)

import warnings  # noqa: E402

warnings.filterwarnings("ignore", category=RuntimeWarning)
warnings.filterwarnings("ignore", category=UserWarning)

import dask  # noqa: E402
import uproot  # noqa: E402
from coffea import processor  # noqa: E402
from coffea.nanoevents import NanoAODSchema  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

import cacheaffinity  # noqa: E402
from benchmarks._common import (  # noqa: E402
    DEFAULT_OUT,
    make_dataset,
    parser,
    print_table,
    pyplot,
    save_png,
    write_json,
)
from examples.analysis import DimuonJetProcessor, summary  # noqa: E402

BRANCHES = ["Muon_*", "Jet_*"]
FACTORS = (1.0, 1.0, 0.5, 0.4, 1.5)
COUNTERS = ("hits", "misses", "storage_bytes", "storage_opens", "peer_hits", "peer_bytes")


#: Placement by chunk, as before layout 3: stripes of one entry make every chunk
#: its own placement unit (its identity names its first entry).
def old_placement():
    return dask.config.set({"cacheaffinity.client.stripe-entries": 1})


def _chunk_keyed() -> None:
    """In a worker: cache per chunk range, as before layout 3 (for the comparison)."""
    from cacheaffinity.coffea import _work as work

    work.CHUNK_PACKS = False


def chunksizes(c: int) -> list[int]:
    return [max(1, int(round(f * c))) for f in FACTORS]


def run_once(executor, files, chunksize):
    runner = processor.Runner(
        executor=executor, schema=NanoAODSchema, chunksize=chunksize, savemetrics=True,
        metadata_cache={},
    )  # fmt: skip
    out, metrics = runner({"gen": files}, processor_instance=DimuonJetProcessor(), treename="Events")
    return out, metrics


def main(argv=None) -> int:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=40_000)
    p.add_argument("--files", type=int, default=2)
    p.add_argument("--chunksize", type=int, default=2_000, help="C of run 1")
    p.add_argument("--stripe-entries", type=int, default=10_000)
    p.add_argument("--basket-events", type=int, default=500, help="entries per cluster")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--no-check", action="store_true", help="skip the IterativeExecutor comparison")
    p.add_argument(
        "--compare", type=int, default=3, metavar="N",
        help="warm runs at chunksize C of each layout, interleaved, against a second cluster "
        "caching per chunk range (the layout before 3); 0: skip",
    )
    p.add_argument(
        "--no-stealing", action="store_true",
        help="disable cacheaffinity's stealing (default: on, the project default)",
    )  # fmt: skip
    p.add_argument(
        "--no-peers", action="store_true",
        help="cacheaffinity.worker.peer-fetch: false (misses read from storage only)",
    )  # fmt: skip
    p.add_argument("--data", default=None, help="directory of the generated data (default: temporary)")
    args = p.parse_args(argv)
    out_dir = getattr(args, "out", None) or DEFAULT_OUT
    if args.quick:
        args.events, args.chunksize, args.stripe_entries, args.basket_events = 8000, 200, 1000, 50

    with tempfile.TemporaryDirectory(prefix="ca-chunksize-") as tmp:
        data = args.data or os.path.join(tmp, "data")
        files = make_dataset(
            data, events=args.events, files=args.files, codec="lzma", level=9,
            branches=BRANCHES, basket_events=args.basket_events, seed=13,
        )  # fmt: skip
        files = [str(f) for f in files]
        entries = [int(uproot.open(f)["Events"].num_entries) for f in files]
        S = args.stripe_entries
        boundaries = sum(max(0, -(-n // S) - 1) for n in entries)
        cfg = {
            "distributed.scheduler.preload": ["cacheaffinity"],
            "distributed.worker.preload": ["cacheaffinity"],
            "cacheaffinity.worker.directory": os.path.join(tmp, "node-{name}"),
            "cacheaffinity.client.stripe-entries": S,
            "cacheaffinity.scheduler.stealing.enabled": not args.no_stealing,
            "cacheaffinity.worker.peer-fetch": not args.no_peers,
        }
        rows = []
        with dask.config.set(cfg):
            with LocalCluster(
                n_workers=args.workers, threads_per_worker=1, processes=True,
                dashboard_address=":0", host="127.0.0.1",
            ) as cluster, Client(cluster) as client:  # fmt: skip
                ex = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
                compare = None
                if args.compare:
                    compare = contextlib.ExitStack()
                    compare.enter_context(
                        dask.config.set({"cacheaffinity.worker.directory": os.path.join(tmp, "old-{name}")})
                    )
                    old_cluster = compare.enter_context(LocalCluster(
                        n_workers=args.workers, threads_per_worker=1, processes=True,
                        dashboard_address=":0", host="127.0.0.1",
                    ))  # fmt: skip
                    old_client = compare.enter_context(Client(old_cluster))
                    old_client.run(_chunk_keyed)
                    old_ex = cacheaffinity.CacheAffinityExecutor(client=old_client, status=False)
                    with old_placement():
                        run_once(old_ex, files, args.chunksize)  # cold
                for i, c in enumerate(chunksizes(args.chunksize)):
                    before = cacheaffinity.cache_totals(client)
                    t0 = time.perf_counter()
                    out, metrics = run_once(ex, files, c)
                    wall = time.perf_counter() - t0
                    after = cacheaffinity.cache_totals(client)
                    d = {k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS}
                    identical = None
                    if not args.no_check:
                        ref, _ = run_once(processor.IterativeExecutor(), files, c)
                        identical = summary(out) == summary(ref)
                        if not identical:
                            print(f"run {i + 1}: result differs from IterativeExecutor", file=sys.stderr)
                            return 1
                    lookups = d["hits"] + d["misses"]
                    rows.append(
                        {
                            "run": i + 1,
                            "chunksize": c,
                            "chunks": int(metrics.get("chunks", 0)),
                            "wall_s": round(wall, 3),
                            # own node's (hits include the lookups peers' packs answered)
                            "hit_rate": round((d["hits"] - d["peer_hits"]) / lookups, 4) if lookups else None,
                            "hits": d["hits"],
                            "misses": d["misses"],
                            "peer_hits": d["peer_hits"],
                            "peer_bytes": d["peer_bytes"],
                            "cache_rate": (
                                round(d["hits"] / lookups, 4) if lookups else None
                            ),
                            "storage_opens": d["storage_opens"],
                            "storage_bytes": d["storage_bytes"],
                            "identical": identical,
                        }
                    )
                warm = {"cluster": [], "chunk": []}
                if compare is not None:
                    with compare:
                        for _ in range(args.compare):
                            for name, e in (("cluster", ex), ("chunk", old_ex)):
                                with old_placement() if name == "chunk" else contextlib.nullcontext():
                                    t0 = time.perf_counter()
                                    run_once(e, files, args.chunksize)
                                    warm[name].append(time.perf_counter() - t0)
    comparison = None
    if warm["cluster"]:
        ratios = [a / b for a, b in zip(warm["cluster"], warm["chunk"])]
        comparison = {
            "chunksize": args.chunksize,
            "warm_wall_s_cluster_entries": [round(x, 3) for x in warm["cluster"]],
            "warm_wall_s_chunk_entries": [round(x, 3) for x in warm["chunk"]],
            "ratio_median": round(statistics.median(ratios), 3),
            "ratios": [round(r, 3) for r in ratios],
        }
        print(f"warm run at C={args.chunksize}: cluster entries / chunk entries (before layout 3) "
              f"= {comparison['ratio_median']} (median of {ratios})")  # fmt: skip
    config = {
        "events": args.events, "files": args.files, "entries": entries, "chunksize": args.chunksize,
        "stripe_entries": S, "stripe_boundaries": boundaries, "basket_events": args.basket_events,
        "workers": args.workers, "stealing": not args.no_stealing, "peer_fetch": not args.no_peers, "codec": "lzma", "level": 9, "branches": BRANCHES,
        "analysis": "examples.analysis.DimuonJetProcessor",
    }  # fmt: skip
    print_table(rows, title=f"chunksize change, {args.workers} nodes, {boundaries} stripe boundaries")
    os.makedirs(out_dir, exist_ok=True)
    name = "chunksize_change" + ("_nostealing" if args.no_stealing else "") + ("_nopeers" if args.no_peers else "")
    write_json(os.path.join(out_dir, f"{name}.json"), config, rows, warm_comparison=comparison)
    plt = pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.2))
    labels = [f"{r['run']}\nC={r['chunksize']}" for r in rows]
    ax[0].bar(labels, [100 * (r["hit_rate"] or 0) for r in rows])
    ax[0].axhline(95, color="grey", ls="--", lw=1)
    ax[0].set_ylabel("column hit rate [%]")
    ax[1].bar(labels, [r["storage_opens"] for r in rows], color="tab:orange")
    ax[1].set_ylabel("files opened by chunks")
    fig.suptitle(f"{args.events} LZMA-9 events, {args.workers} nodes, stripes of {S} entries")
    save_png(fig, os.path.join(out_dir, f"{name}.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
