"""The client side of a cluster box: commands run in the box's portal (runs in the portal).

``python -m testbed.portal COMMAND ...`` connects to the box's scheduler (``$CABOX_SCHEDULER``,
set by :meth:`testbed.hosts.ClusterBox.portal`), does one thing and prints one line
``RESULT <json>`` (and, for ``run --progress``, ``PROGRESS <json>`` lines while it runs):

- ``wait --workers N``: wait until N workers and N cacheaffinity nodes are up; the nodes
  with their workers, host names (asked from each worker with a host restriction: a task
  submitted with ``workers=[<host address>]``) and cache directories;
- ``run FILE ... --chunksize C``: one run of the realistic analysis
  (``examples/realistic.py``) with :class:`cacheaffinity.CacheAffinityExecutor`: its
  summary, wall time, the cache counters of the run summed and per node (hits, misses,
  peer hits, files opened), the plugin's per-node placement counters, where each chunk was
  processed (the plugin's holder memory: chunk digest -> node) and the scheduler's worker
  removals and additions during the run.

Everything is bounded: ``--timeout`` ends a command that would hang with exit status 3.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

COUNTERS = ("hits", "misses", "peer_hits", "peer_bytes", "peer_requests", "peer_failed",
            "storage_opens", "storage_bytes", "bytes_written")  # fmt: skip


def watchdog(prog: str, command: str, timeout: float) -> threading.Timer:
    """Exit the process with status 3 (and one stderr line) if ``command`` is not done
    within ``timeout`` seconds: a portal command never hangs."""

    def give_up():
        print(f"{prog}: {command} did not finish within {timeout} s", file=sys.stderr, flush=True)
        os._exit(3)

    timer = threading.Timer(timeout, give_up)
    timer.daemon = True
    timer.start()
    return timer


def _client(timeout: float):
    from distributed import Client

    return Client(os.environ["CABOX_SCHEDULER"], timeout=timeout)


def _nodes(client) -> dict[str, dict]:
    import cacheaffinity

    info = cacheaffinity.check(client)
    workers = client.scheduler_info(n_workers=-1)["workers"]
    out = {}
    for node, d in info["nodes"].items():
        out[node] = {"workers": d["workers"], "directory": d["directory"],
                     "hosts": sorted({workers[a]["host"] for a in d["workers"] if a in workers})}  # fmt: skip
    return out


def wait(client, n: int, timeout: float) -> dict:
    import cacheaffinity

    deadline = time.monotonic() + timeout
    while True:
        workers = client.scheduler_info(n_workers=-1)["workers"]
        nodes = cacheaffinity.check(client)["nodes"]
        live = [n_ for n_, d in nodes.items() if d["workers"]]
        if len(workers) == n and len(live) == n:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(workers)} workers / {len(live)} nodes after {timeout} s, waited for {n}")
        time.sleep(0.2)
    # host restrictions: a task restricted to a host's address runs there, and the worker's
    # host name is its host's (UTS namespace)
    hostnames = {}
    for addr, w in workers.items():
        fut = client.submit(socket.gethostname, workers=[w["host"]], pure=False, allow_other_workers=False)
        hostnames[addr] = fut.result(timeout=30)
    return {"workers": {a: {"name": w["name"], "host": w["host"], "hostname": hostnames[a]}
                        for a, w in workers.items()},  # fmt: skip
            "nodes": _nodes(client)}


def _scheduler_progress(dask_scheduler=None) -> dict:
    processing = {}
    for ws in dask_scheduler.workers.values():
        processing[ws.host] = processing.get(ws.host, 0) + len(ws.processing)
    memory = sum(1 for ts in dask_scheduler.tasks.values() if ts.state == "memory")
    return {"t": time.time(), "memory": memory, "processing": processing}


def _scheduler_holders(dask_scheduler=None) -> dict[str, str]:
    """Where each chunk id (by digest) was processed last: the plugin's locator memory."""
    from cacheaffinity.protocol import PLUGIN_NAME

    plugin = dask_scheduler.plugins[PLUGIN_NAME]
    out = {}
    for digest, record in plugin.locator.holder.items():
        out[str(digest)] = record if isinstance(record, str) else str(record[0])
    return out


def _removals(client, since: float) -> list[dict]:
    out = []
    for t, msg in client.get_events("all"):
        if t >= since and isinstance(msg, dict) and msg.get("action") in ("remove-worker", "add-worker"):
            out.append({"t": t, "action": msg["action"], "worker": msg.get("worker"),
                        "reason": msg.get("stimulus_id") or msg.get("reason")})  # fmt: skip
    return out


def _worker_counters(client) -> dict[str, dict]:
    """Each worker's cache counters now: ``{address: {"node": id, <counter>: n}}``."""
    from cacheaffinity.client import _worker_stats

    out = {}
    # a worker that is leaving (removed by the scheduler) is not read: it counts as lost
    for addr, m in client.run(_worker_stats, on_error="return").items():
        if isinstance(m, dict) and m.get("node"):
            out[addr] = {"node": m["node"], **{k: v for k, v in (m.get("stats") or {}).items()
                                               if isinstance(v, (int, float))}}  # fmt: skip
    return out


def _per_node(before: dict, after: dict) -> dict[str, dict]:
    """A run's counters per node, from per-worker readings before and after it.

    The counters are per worker process: a worker that started during the run counts from
    0 (listed in ``started``); one that left during it took its counts along (``lost``).
    """
    out: dict[str, dict] = {}
    for addr, a in after.items():
        b = before.get(addr, {})
        node = out.setdefault(a["node"], {k: 0 for k in COUNTERS} | {"workers": [], "started": [], "lost": []})
        for k, v in a.items():
            if k != "node":
                node[k] = node.get(k, 0) + v - b.get(k, 0)
        node["workers"].append(addr)
        if addr not in before:
            node["started"].append(addr)
    for addr, b in before.items():
        if addr not in after:
            out.setdefault(b["node"], {k: 0 for k in COUNTERS} | {"workers": [], "started": [], "lost": []})
            out[b["node"]]["lost"].append(addr)
    return out


def run(client, files: Sequence[str], chunksize: int, progress: bool) -> dict:
    import uproot

    from coffea import processor
    from coffea.nanoevents import NanoAODSchema

    import cacheaffinity
    from examples.realistic import TTbarLikeProcessor, summary

    before = _worker_counters(client)
    c0 = cacheaffinity.check(client)
    nodes_before = _nodes(client)
    since = time.time()
    stop = threading.Event()

    def report():
        while not stop.wait(0.25):
            try:
                p = client.run_on_scheduler(_scheduler_progress)
            except Exception as exc:  # a progress line is only informative
                p = {"error": repr(exc)}
            print("PROGRESS " + json.dumps(p), flush=True)

    reporter = threading.Thread(target=report, daemon=True)
    if progress:
        print("PROGRESS " + json.dumps({"t": time.time(), "memory": 0, "processing": {}, "start": True}),
              flush=True)  # fmt: skip
        reporter.start()
    runner = processor.Runner(executor=cacheaffinity.CacheAffinityExecutor(client=client, status=False),
                              schema=NanoAODSchema, chunksize=chunksize, savemetrics=True)  # fmt: skip
    t0 = time.perf_counter()
    # root:// files: the xrootd bindings' handler (uproot's default fsspec one is far slower)
    xrootd = any(f.startswith("root://") for f in files)
    out, metrics = runner({"synthetic": list(files)}, processor_instance=TTbarLikeProcessor(), treename="Events",
                          uproot_options={"handler": uproot.XRootDSource} if xrootd else {})  # fmt: skip
    wall = time.perf_counter() - t0
    end = time.time()
    stop.set()
    after = _worker_counters(client)
    c1 = cacheaffinity.check(client)
    per_node = _per_node(before, after)
    totals = {k: sum(d[k] for d in per_node.values()) for k in COUNTERS}
    placed = {}
    for node, d in c1["nodes"].items():
        b = c0["nodes"].get(node, {}).get("counters", {})
        placed[node] = {k: v - b.get(k, 0) for k, v in d["counters"].items()}
    lookups = totals["hits"] + totals["misses"]
    return {
        "summary": summary(out),
        "wall_s": wall,
        "start": since,
        "end": end,
        "chunks": int(metrics.get("chunks", 0)),
        "hit_rate": totals["hits"] / lookups if lookups else None,
        **totals,
        "per_node": per_node,
        "placed": placed,
        "counters": {k: v - c0["counters"].get(k, 0) for k, v in c1["counters"].items()},
        "nodes_before": nodes_before,
        "nodes_after": _nodes(client),
        "membership": _removals(client, since),
        "holders": client.run_on_scheduler(_scheduler_holders),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.portal")
    parser.add_argument("--timeout", type=float, default=240, help="seconds before giving up (exit 3)")
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("wait")
    w.add_argument("--workers", type=int, required=True)
    r = sub.add_parser("run")
    r.add_argument("files", nargs="+")
    r.add_argument("--chunksize", type=int, required=True)
    r.add_argument("--progress", action="store_true")
    args = parser.parse_args(argv)

    timer = watchdog("portal", args.command, args.timeout)
    with _client(timeout=min(args.timeout, 30)) as client:
        if args.command == "wait":
            out: Any = wait(client, args.workers, args.timeout)
        else:
            out = run(client, args.files, args.chunksize, args.progress)
    timer.cancel()
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
