"""The client side of the cluster-box benchmark (``benchmarks/cluster_box.py``; runs in a
box's portal, like :mod:`testbed.portal`).

``python -m testbed.boxbench COMMAND ...`` connects to the box's scheduler
(``$CABOX_SCHEDULER``), does one thing and prints one line ``RESULT <json>``:

- ``warm``: every worker runs the realistic analysis once on 200 events of the generator's
  template (:func:`testbed.warmup.warm_up`: no dataset file, no column cache), so that
  run 1 measures the analysis and not each fresh worker process's first imports;
- ``run FILE ... --chunksize C --mode M``: one run of the realistic analysis
  (``examples/realistic.py``), ``M`` = ``cacheaffinity``
  (:class:`cacheaffinity.CacheAffinityExecutor`) or ``direct`` (coffea's plain
  ``DaskExecutor``: no cache).  coffea's preprocessing (each file opened for its entry
  count) is timed on its own (``preprocess_s``; every run is a new client process, so
  every run pays it, as a new notebook session does); ``wall_s`` includes it and
  ``process_s`` is the rest.  Cache counters of the run summed and per node (the workers'
  cacheaffinity counters; zero for ``direct``), the plugin's placement counters, and how
  many tasks of each name ran on each host (``tasks_per_host``, from the scheduler's task
  stream).

Everything is bounded: ``--timeout`` ends a command that would hang with exit status 3.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from testbed.portal import COUNTERS, _client, _per_node, _worker_counters, watchdog


def warm(client) -> dict:
    from examples.realistic import TTbarLikeProcessor
    from testbed.synthetic import default_template_path
    from testbed.warmup import warm_up

    out = client.run(warm_up, str(default_template_path()), TTbarLikeProcessor())
    return {"seconds": {a: r["seconds"] for a, r in out.items()}}


def _task_hosts(dask_scheduler=None, since: float = 0.0) -> dict[str, dict[str, int]]:
    """Tasks that ended since ``since``, per task name prefix and worker host: what ran where."""
    from dask.utils import key_split

    out: dict[str, dict[str, int]] = {}
    for rec in dask_scheduler.get_task_stream(start=since):
        host = str(rec.get("worker", "")).split("://")[-1].rsplit(":", 1)[0]
        d = out.setdefault(key_split(rec.get("key", "")), {})
        d[host] = d.get(host, 0) + 1
    return out


def run(client, files: Sequence[str], chunksize: int, mode: str) -> dict:
    import uproot

    from coffea import processor
    from coffea.nanoevents import NanoAODSchema

    import cacheaffinity
    from examples.realistic import TTbarLikeProcessor, summary

    if mode == "cacheaffinity":
        executor = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
    elif mode == "direct":
        executor = processor.DaskExecutor(client=client, status=False)
    else:
        raise ValueError(f"mode {mode!r}: cacheaffinity or direct")
    before = _worker_counters(client)
    c0 = cacheaffinity.check(client)
    client.run_on_scheduler(_task_hosts, since=time.time())  # registers the task stream plugin
    since = time.time()
    runner = processor.Runner(executor=executor, schema=NanoAODSchema, chunksize=chunksize, savemetrics=True)
    fileset = {"synthetic": list(files)}
    # root:// files: the xrootd bindings' handler (uproot's default fsspec one is far slower)
    opts = {"handler": uproot.XRootDSource} if any(f.startswith("root://") for f in files) else {}
    t0 = time.perf_counter()
    runner.preprocess(fileset, treename="Events", uproot_options=opts)
    pre = time.perf_counter() - t0
    out, metrics = runner(fileset, processor_instance=TTbarLikeProcessor(), treename="Events",
                          uproot_options=opts)  # fmt: skip
    wall = time.perf_counter() - t0
    after = _worker_counters(client)
    c1 = cacheaffinity.check(client)
    per_node = _per_node(before, after)
    totals = {k: sum(d[k] for d in per_node.values()) for k in COUNTERS}
    lookups = totals["hits"] + totals["misses"]
    return {
        "mode": mode,
        "summary": summary(out),
        "wall_s": wall,
        "preprocess_s": pre,
        "process_s": wall - pre,
        "start": since,
        "chunks": int(metrics.get("chunks", 0)),
        "bytesread": int(metrics.get("bytesread", 0)),
        "hit_rate": totals["hits"] / lookups if lookups else None,
        "cache_rate": (totals["hits"] + totals["peer_hits"]) / lookups if lookups else None,
        **totals,
        "per_node": per_node,
        "counters": {k: v - c0["counters"].get(k, 0) for k, v in c1["counters"].items()},
        "tasks_per_host": client.run_on_scheduler(_task_hosts, since=since),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.boxbench")
    parser.add_argument("--timeout", type=float, default=600, help="seconds before giving up (exit 3)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("warm")
    r = sub.add_parser("run")
    r.add_argument("files", nargs="+")
    r.add_argument("--chunksize", type=int, required=True)
    r.add_argument("--mode", choices=("cacheaffinity", "direct"), required=True)
    args = parser.parse_args(argv)

    timer = watchdog("boxbench", args.command, args.timeout)
    with _client(timeout=min(args.timeout, 30)) as client:
        if args.command == "warm":
            out: Any = warm(client)
        else:
            out = run(client, args.files, args.chunksize, args.mode)
    timer.cancel()
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
