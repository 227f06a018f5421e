"""The simulator checked against a real multi-host run: the VISPA shape, scaled to this machine,
in a cluster box (testbed/hosts.py; needs root).

VISPA (the paper's section 2.2; ``benchmarks/simulate.py``'s ``vispa`` cluster): 7 small
workers of 8 threads on 1 Gbit/s links to the NFS storage and 3 large ones of 64 threads on
4 Gbit/s links.  Scaled here (``--hosts``, default ``s1:1:1 s2:1:1 b1:2:4``: name, threads,
link in VISPA Gbit/s): two small hosts of 1 thread and one large host of 2 threads, each a
network namespace with its own address, host name and tmpfs disk, its link shaped with HTB
to ``--link-scale`` x its VISPA rate (default 1/200: 5 and 20 Mbit/s), and a real XRootD
origin in its own namespace whose link is ``--link-scale`` x 8 Gbit/s (the simulator's
VISPA NFS total, 1000 MB/s).  Every host reads the generated NanoAOD-like LZMA-9 files
(:func:`testbed.synthetic.make_dataset`, the realistic analysis' branches) from the origin
over ``root://``.

Per repeat (``--repeats``), a fresh box (empty caches): the workers are warmed up
(:mod:`testbed.boxbench` ``warm``), then ``--runs`` consecutive runs of the realistic analysis
(``examples/realistic.py``) in two modes, interleaved (direct run k, then cacheaffinity run k):

``direct``
    coffea's plain ``DaskExecutor`` (no cache; Dask's placement and stealing);
``cacheaffinity``
    :class:`cacheaffinity.CacheAffinityExecutor` with the scheduler and worker plugins
    (``--preload cacheaffinity``, project defaults).

Each run is a new client process in the box's portal (:mod:`testbed.boxbench` ``run``), so
each pays coffea's preprocessing (``preprocess_s``, timed on its own); ``process_s`` is the
rest of the wall time.  Per run: wall and process time, own-node hit rate (hits / lookups of
the workers' counters), files opened by chunk tasks (``storage_opens``; ``direct`` opens its
file in every chunk task: = chunks), bytes the origin sent (its link's tc class counter,
preprocessing included), steals, per-host hits and misses, and whether the result equals
the first ``direct`` run's.

The model: ``benchmarks/simulate.py`` (:func:`simulate.simulate_shape`) on the same shape
(hosts, threads, link rates, origin rate, chunks, events per chunk, runs), its bytes per
event and compression ratio taken from the dataset, three times: with simulate.py's own
per-core rates (``uncalibrated``); ``calibrated`` with this machine's rates measured in this
process before the box starts (one chunk's branches decompressed by uproot; the processor
on that chunk's events in memory, :mod:`benchmarks._floor`), with the box's ``cpu_cores``
(all hosts share this machine's cores), and with the bytes of file metadata every chunk
that opens its file reads over its link (``open_bytes``: what uproot reads to open a file
of the dataset and its tree; coffea opens the file in every chunk task, so a cold chunk
moves its columns *and* the file's metadata: ~30% more bytes than the columns here), and
with a per-chunk cost measured the same way (:func:`calibrate_warm_task`: a warm chunk task
of cacheaffinity on one worker of one thread, beyond the processor's compute); and
``fitted``: the calibrated model plus a per-chunk cost fitted to cacheaffinity's warm runs
(:func:`fit_overheads`), so that only run 1, ``direct`` and the hit rates are predictions
there.  The generated files have basket clusters of ``--basket-events``
(default: the chunk size) events, so that a chunk reads its own baskets only, as the model
assumes.
Measured and simulated run-2 hit rate and run-1 / run-2 ratio stand side by side
(``comparison`` in the JSON, with the relative difference).

    python benchmarks/cluster_box.py --events 24000 --files 4 --chunksize 1000 --runs 4 --repeats 3
    python benchmarks/cluster_box.py --quick                 # 4000 events, 2 runs, 1 repeat
    python benchmarks/cluster_box.py --dry-run               # the shape and the model only

Writes benchmarks/results/cluster_box.json and .png (``--name``).  ``--shared-machine`` records
that other jobs used the CPU meanwhile (the figures are then indicative).
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

from _common import branch_bytes, make_dataset, parser, print_table, pyplot, save_png, spread, write_json  # noqa: E402

MODES = ("direct", "cacheaffinity")
#: VISPA's NFS total in the simulator's model (1000 MB/s), in Gbit/s
VISPA_STORAGE_GBIT = 8.0
DEFAULT_HOSTS = ("s1:1:1", "s2:1:1", "b1:2:4")
#: the box's Dask timeouts (a stuck run ends instead of hanging)
DASK_CONFIG = {
    "distributed.scheduler.worker-ttl": "30s",
    "distributed.comm.timeouts.connect": "20s",
}


def parse_hosts(specs) -> list[dict]:
    out = []
    for s in specs:
        name, threads, gbit = s.split(":")
        out.append({"name": name, "threads": int(threads), "vispa_link_gbit": float(gbit)})
    return out


def mbit(gbit: float, scale: float) -> float:
    return gbit * 1000.0 * scale


def shape_of(hosts: list[dict], scale: float, cpu_cores: int | None) -> dict:
    """The simulator's cluster dict of the box (MB/s = Mbit/s / 8)."""
    groups = [[h["name"], 1, h["threads"], {"link_MBps": mbit(h["vispa_link_gbit"], scale) / 8, "ssd_MBps": 2000.0}]
              for h in hosts]  # fmt: skip
    cl: dict[str, Any] = {"groups": groups, "storage_MBps": mbit(VISPA_STORAGE_GBIT, scale) / 8, "ssd_MBps": 2000.0}
    if cpu_cores:
        cl["cpu_cores"] = cpu_cores
    return cl


# ----------------------------------------------------------------------------- calibration


def calibrate(files: list[str], chunksize: int, branches) -> dict:
    """This machine's per-core rates, measured here (best of 2 chunks): uproot reading one
    chunk's branches (decompression), and the processor on that chunk's events in memory;
    and a property of the files: the bytes uproot reads to open one and its ``Events`` tree
    (``open_bytes``: header, directory, the TTree with its branches' basket tables), which
    every chunk task that opens the file reads over its link."""
    import uproot

    from benchmarks import _floor
    from examples.realistic import TTbarLikeProcessor

    dec, comp, nbytes, opened = [], [], 0, []
    for i, f in enumerate(files[:2]):
        with uproot.open(f) as rf:
            t = rf["Events"]
            opened.append(rf.file.source.num_requested_bytes)
            names = [b for b in branches if b in t.keys()]
            stop = min(chunksize, t.num_entries)
            t0 = time.perf_counter()
            arrays = t.arrays(names, entry_stop=stop, library="np")
            dec.append(time.perf_counter() - t0)
            nbytes = sum(getattr(a, "nbytes", 0) for a in arrays.values())
        _floor.load(f"cal{i}", f, "Events", 0, stop, "cal", TTbarLikeProcessor())
        comp.append(_floor.process(f"cal{i}", TTbarLikeProcessor())["seconds"])
    _floor.clear()
    return {"events": stop, "decompress_s": min(dec), "compute_s": min(comp), "read_bytes": nbytes,
            "open_bytes": statistics.median(opened)}  # fmt: skip


def _chunk_task_seconds(dask_scheduler=None, since: float = 0.0) -> dict[str, list[float]]:
    """Compute seconds of the tasks that ended since ``since``, per task name prefix."""
    from dask.utils import key_split

    out: dict[str, list[float]] = {}
    for rec in dask_scheduler.get_task_stream(start=since):
        secs = sum(ss["stop"] - ss["start"] for ss in rec.get("startstops", ()) if ss.get("action") == "compute")
        out.setdefault(key_split(rec.get("key", "")), []).append(secs)
    return out


def calibrate_warm_task(files: list[str], chunksize: int) -> dict:
    """What a warm chunk task costs on one core, measured outside the box: a LocalCluster of
    one single-threaded worker process with cacheaffinity (scheduler and worker preload, a
    fresh cache directory) runs the realistic analysis over one file twice
    (:func:`testbed.boxbench.run`); the compute seconds of the second run's chunk tasks (every
    column a hit: the cache read, NanoEvents built from the cached buffers, the processor), as
    a box worker runs a warm chunk but without the box's sharing of cores.  Beyond the
    calibrated compute (the processor on events already in memory) that is the per-chunk cost
    ``chunk_overhead_s`` of the calibrated model."""
    import dask
    from distributed import Client, LocalCluster

    import cacheaffinity
    from testbed.boxbench import run, warm

    with tempfile.TemporaryDirectory(prefix="cacheaffinity-box-cal-") as d:
        settings = {"distributed.scheduler.preload": ["cacheaffinity"],
                    "distributed.worker.preload": ["cacheaffinity"],
                    "cacheaffinity.worker.directory": os.path.join(d, "node-{name}")}  # fmt: skip
        with dask.config.set(settings), LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
            dashboard_address="127.0.0.1:0", local_directory=d,
        ) as cluster, Client(cluster) as client:  # fmt: skip
            deadline = time.monotonic() + 60
            while not any(n["workers"] for n in cacheaffinity.check(client)["nodes"].values()):
                if time.monotonic() > deadline:
                    raise TimeoutError("calibration cluster: no cache node after 60 s")
                time.sleep(0.1)
            warm(client)
            run(client, files[:1], chunksize, "cacheaffinity")
            second = run(client, files[:1], chunksize, "cacheaffinity")
            stream = client.run_on_scheduler(_chunk_task_seconds, since=second["start"])
    chunks = second["chunks"]
    # the chunk tasks: the prefix with one task per chunk (the accumulation has fewer)
    name = min(stream, key=lambda k: (abs(len(stream[k]) - chunks), -len(stream[k])))
    return {"warm_task_s": statistics.median(stream[name]), "warm_tasks": len(stream[name]),
            "warm_hit_rate": second["hit_rate"]}  # fmt: skip


# ----------------------------------------------------------------------------- box


def origin_sent(box) -> int:
    """Bytes the origin has sent (its link's HTB class counter)."""
    from testbed.hosts import _cmd, _ip, _tc

    out = _cmd([_ip(), "netns", "exec", box.ns("origin"), _tc(), "-s", "class", "show", "dev", "eth0"]).stdout
    m = re.search(r"class htb 1:10 .*?\n\s*Sent (\d+) bytes", out, re.S)
    return int(m.group(1)) if m else 0


def per_host(r: dict, key: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for node, d in r["per_node"].items():
        h = node.split("-")[0]
        out[h] = out.get(h, 0) + d[key]
    return out


def one_repeat(args, hosts, files, origin_dir, reference) -> dict:
    from testbed import hosts as hb

    specs = [hb.HostSpec(h["name"], nthreads=h["threads"], disk=args.disk,
                         link=hb.Link(rate=f"{mbit(h['vispa_link_gbit'], args.link_scale):g}mbit"))
             for h in hosts]  # fmt: skip
    origin_rate = f"{mbit(VISPA_STORAGE_GBIT, args.link_scale):g}mbit"
    rows: dict[str, list] = {m: [] for m in MODES}
    t_box = time.perf_counter()
    with hb.ClusterBox(specs, dask_config=DASK_CONFIG, origin_dir=origin_dir,
                       origin_link=hb.Link(rate=origin_rate)) as box:  # fmt: skip
        box_id = box.id
        urls = [box.url(f) for f in files]
        up = box.python("wait", "--workers", len(specs), timeout=120)
        warm = box.portal([sys.executable, "-m", "testbed.boxbench", "warm"], timeout=180)
        setup_s = time.perf_counter() - t_box
        for k in range(1, args.runs + 1):
            for mode in MODES:
                o0 = origin_sent(box)
                r = box.portal([sys.executable, "-m", "testbed.boxbench", "--timeout", 900, "run", *urls,
                                "--chunksize", args.chunksize, "--mode", mode], timeout=960)  # fmt: skip
                r["origin_bytes"] = origin_sent(box) - o0
                r["run"] = k
                r["identical"] = reference is None or r["summary"] == reference[0]
                if reference is not None and reference[0] is None:
                    reference[0] = r["summary"]
                    r["identical"] = True
                r.pop("summary")
                r["files_opened"] = r["storage_opens"] if mode == "cacheaffinity" else r["chunks"]
                r["steals"] = r["counters"].get("steals", 0)
                r["hits_per_host"] = per_host(r, "hits")
                r["misses_per_host"] = per_host(r, "misses")
                r.pop("per_node")
                rows[mode].append(r)
                hit = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}"
                print(f"  run {k} {mode:13s} wall {r['wall_s']:6.2f} s (preprocess {r['preprocess_s']:.2f}) "
                      f"hit {hit} opened {r['files_opened']} origin {r['origin_bytes'] / 1e6:.2f} MB "
                      f"steals {r['steals']}", flush=True)  # fmt: skip
    left = hb.leftovers(box_id)
    return {"runs": rows, "box_id": box_id, "setup_s": setup_s, "warm_up_s": warm["seconds"],
            "workers": up["workers"], "leftovers": left}  # fmt: skip


# ----------------------------------------------------------------------------- model


def simulate(args, hosts, n_chunks, events_per_chunk, ds, cal, fitted=None) -> dict:
    import simulate as sim

    bpe = ds["uncompressed"] / ds["events"]
    ratio = ds["uncompressed"] / max(ds["compressed"], 1)
    base = {"bytes_per_event": bpe, "compression_ratio": ratio}
    out = {}
    variants = {"uncalibrated": (base, None)}
    if cal:
        # the chunk's decompressed bytes per second (uproot's sizes of the analysis branches;
        # not the numpy arrays' nbytes, which count jagged arrays' object pointers only)
        calibrated = dict(base, decompress_MBps_per_core=bpe * cal["events"] / cal["decompress_s"] / 1e6,
                          compute_events_per_s_per_core=cal["events"] / cal["compute_s"])  # fmt: skip
        if cal.get("open_bytes"):  # the files' metadata, read by every chunk that opens one
            calibrated["open_bytes"] = cal["open_bytes"]
        if cal.get("warm_task_s"):  # a warm chunk task beyond the processor on in-memory events
            per = events_per_chunk / cal["events"]
            calibrated["chunk_overhead_s"] = max(0.0, cal["warm_task_s"] - cal["compute_s"] * per)
        variants["calibrated"] = (calibrated, os.cpu_count())
    if fitted:
        variants["fitted"] = (dict(variants["calibrated"][0], **fitted), os.cpu_count())
    for name, (rates, cores) in variants.items():
        cl = shape_of(hosts, args.link_scale, cores)
        runs = []
        for seed in range(1, args.sim_seeds + 1):
            runs.append(sim.simulate_shape(cl, n_chunks, runs=args.runs, events_per_chunk=events_per_chunk,
                                           rates=rates, policies=MODES, seed=seed))  # fmt: skip
        per_run = {}
        for mode in MODES:
            per_run[mode] = [
                {"run": k + 1,
                 "makespan_s": spread([r[mode][k]["makespan_s"] for r in runs]),
                 "hit_rate": spread([r[mode][k]["hit_rate"] for r in runs]),
                 "steals": spread([r[mode][k]["steals"] for r in runs])}
                for k in range(args.runs)
            ]  # fmt: skip
        out[name] = {"cluster": cl, "rates": {**sim.RATES, **rates}, "seeds": args.sim_seeds, "per_run": per_run,
                     "ratio_run1_run2": spread([r["cacheaffinity"][0]["makespan_s"] / r["cacheaffinity"][1]["makespan_s"]
                                                for r in runs]) if args.runs > 1 else None,
                     "direct_run1_over_ca_run1": spread([r["direct"][0]["makespan_s"] / r["cacheaffinity"][0]["makespan_s"]
                                                        for r in runs])}  # fmt: skip
    return out


def fit_overheads(measured: dict, cal: dict, hosts, n_chunks: int, events_per_chunk: float, runs: int) -> dict:
    """The per-chunk cost the calibration does not see, fitted to the box's runs: core-seconds
    per chunk (all threads sharing the machine's cores) of cacheaffinity's warm runs (2 and
    later, every column a hit) beyond the calibrated compute: task dispatch, NanoEvents
    construction, accumulation, and the runs' idle tails, all charged to the chunks.  The
    files' metadata read at every open is not fitted: it is ``open_bytes``, from the files."""
    if runs < 2:
        return {}
    cores = min(os.cpu_count() or 1, sum(h["threads"] for h in hosts))
    per = events_per_chunk / cal["events"]
    warm = statistics.median(x["process_s"]["median"] for x in measured["per_run"]["cacheaffinity"][1:])
    return {"chunk_overhead_s": max(0.0, warm * cores / n_chunks - cal["compute_s"] * per)}


# ----------------------------------------------------------------------------- summary


def summarise(repeats: list[dict], runs: int) -> dict:
    per_run: dict[str, list] = {}
    for mode in MODES:
        per_run[mode] = []
        for k in range(runs):
            rs = [rep["runs"][mode][k] for rep in repeats]
            per_run[mode].append({
                "run": k + 1,
                **{key: spread([r[key] for r in rs]) for key in
                   ("wall_s", "process_s", "preprocess_s", "hit_rate", "cache_rate", "files_opened",
                    "origin_bytes", "steals", "hits", "misses", "peer_hits")},
            })  # fmt: skip
    ratios = {}
    if runs > 1:
        for key in ("wall_s", "process_s"):
            ratios[f"cacheaffinity run 1 / run 2 ({key})"] = spread(
                [rep["runs"]["cacheaffinity"][0][key] / rep["runs"]["cacheaffinity"][1][key] for rep in repeats]
            )
            ratios[f"direct run 2 / cacheaffinity run 2 ({key})"] = spread(
                [rep["runs"]["direct"][1][key] / rep["runs"]["cacheaffinity"][1][key] for rep in repeats]
            )
        ratios["cacheaffinity run 1 / direct run 1 (process_s)"] = spread(
            [rep["runs"]["cacheaffinity"][0]["process_s"] / rep["runs"]["direct"][0]["process_s"] for rep in repeats]
        )
    return {"per_run": per_run, "ratios": ratios}


def _mean_warm(per_run: list[dict], key: str) -> dict | None:
    """Spread over the repeats (or seeds) of the mean of ``key`` over runs 2 and later."""
    cols = [r[key]["values"] for r in per_run[1:]]
    if not cols or any(len(c) != len(cols[0]) for c in cols) or not cols[0]:
        return None
    return spread([statistics.mean(v) for v in zip(*cols)])


def compare(measured: dict, simulated: dict, runs: int) -> list[dict]:
    """Rows: metric, measured median [min, max], simulated medians, relative differences."""
    rows = []
    if runs < 2:
        return rows
    m2 = measured["per_run"]["cacheaffinity"][1]
    ratio = measured["ratios"]["cacheaffinity run 1 / run 2 (process_s)"]
    items = [
        ("run-2 own-node hit rate", m2["hit_rate"], lambda s: s["per_run"]["cacheaffinity"][1]["hit_rate"]),
        ("run 1 / run 2 (cacheaffinity, without preprocessing)", ratio, lambda s: s["ratio_run1_run2"]),
        ("run 1 / run 2 (cacheaffinity, wall incl. preprocessing)",
         measured["ratios"]["cacheaffinity run 1 / run 2 (wall_s)"], lambda s: s["ratio_run1_run2"]),
        ("run-1 time s (cacheaffinity, without preprocessing)", measured["per_run"]["cacheaffinity"][0]["process_s"],
         lambda s: s["per_run"]["cacheaffinity"][0]["makespan_s"]),
        ("run-2 time s (cacheaffinity, without preprocessing)", m2["process_s"],
         lambda s: s["per_run"]["cacheaffinity"][1]["makespan_s"]),
        ("direct run-2 time s (without preprocessing)", measured["per_run"]["direct"][1]["process_s"],
         lambda s: s["per_run"]["direct"][1]["makespan_s"]),
    ]  # fmt: skip
    if runs > 2:
        items.insert(1, (f"run-{runs} own-node hit rate", measured["per_run"]["cacheaffinity"][-1]["hit_rate"],
                         lambda s: s["per_run"]["cacheaffinity"][-1]["hit_rate"]))  # fmt: skip
        # a steal in a warm run is a discrete event whose run differs between the model and
        # the box (and between repeats): the warm runs' mean time and steals compare them whole
        mca = measured["per_run"]["cacheaffinity"]
        items += [
            (f"warm runs 2-{runs}: mean time s (cacheaffinity, without preprocessing)",
             _mean_warm(mca, "process_s"), lambda s: _mean_warm(s["per_run"]["cacheaffinity"], "makespan_s")),
            (f"warm runs 2-{runs}: steals per run (cacheaffinity)", _mean_warm(mca, "steals"),
             lambda s: _mean_warm(s["per_run"]["cacheaffinity"], "steals")),
        ]  # fmt: skip
    for name, m, get in items:
        row: dict[str, Any] = {"metric": name, "measured": m}
        for variant, s in simulated.items():
            v = get(s)
            row[variant] = v
            mv, sv = (m or {}).get("median"), (v or {}).get("median")
            row[f"{variant}_diff"] = (sv - mv) / mv if mv not in (None, 0) and sv is not None else None
        rows.append(row)
    return rows


def plot(doc: dict, path: str) -> None:
    plt = pyplot()
    res = doc["results"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    runs = [x["run"] for x in res["measured"]["per_run"]["cacheaffinity"]]
    for mode, style in (("cacheaffinity", "-o"), ("direct", "-s")):
        m = res["measured"]["per_run"][mode]
        a2.plot(runs, [x["process_s"]["median"] for x in m], style, label=f"{mode} measured")
        for variant, ls in (("uncalibrated", ":"), ("calibrated", "--"), ("fitted", "-.")):
            s = res["simulated"].get(variant)
            if s:
                a2.plot(runs, [x["makespan_s"]["median"] for x in s["per_run"][mode]], ls, marker=style[-1],
                        label=f"{mode} simulated ({variant})", alpha=0.7)  # fmt: skip
    m = res["measured"]["per_run"]["cacheaffinity"]
    a1.plot(runs, [100 * (x["hit_rate"]["median"] or 0) for x in m], "-o", label="cacheaffinity measured")
    for variant, ls in (("uncalibrated", ":"), ("calibrated", "--"), ("fitted", "-.")):
        s = res["simulated"].get(variant)
        if s:
            a1.plot(runs, [100 * x["hit_rate"]["median"] for x in s["per_run"]["cacheaffinity"]], ls, marker="o",
                    label=f"simulated ({variant})", alpha=0.7)  # fmt: skip
    a1.set_ylabel("own-node hit rate [%]")
    a2.set_ylabel("run time without preprocessing [s] (median)")
    a2.set_yscale("log")
    c = doc["config"]
    for ax in (a1, a2):
        ax.set_xlabel("run")
        ax.set_xticks(runs)
        ax.legend(fontsize=7)
    fig.suptitle(f"cluster box: {' '.join(c['hosts_spec'])} (name:threads:VISPA Gbit/s) x {c['link_scale']:g}, "
                 f"{c['events']} events, {c['chunks']} chunks, {c['repeats']} repeat(s)", fontsize=9)  # fmt: skip
    save_png(fig, path)


def main(argv=None) -> int:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=24000)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--chunksize", type=int, default=1000)
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hosts", nargs="+", default=list(DEFAULT_HOSTS), help="name:threads:VISPA link Gbit/s")
    p.add_argument("--link-scale", type=float, default=1 / 200, help="box link rate / VISPA link rate")
    p.add_argument("--disk", default="256m", help="tmpfs size of each host's disk")
    p.add_argument("--sim-seeds", type=int, default=5, help="simulations per variant (medians)")
    p.add_argument("--basket-events", type=int, default=None,
                   help="events per basket cluster of the generated files (default: --chunksize)")  # fmt: skip
    p.add_argument("--shared-machine", action="store_true", help="record that other jobs used the CPU meanwhile")
    p.add_argument("--dry-run", action="store_true", help="print the shape and simulate it (uncalibrated); no box")
    p.add_argument("--keep-data", default=None, help="generate the dataset here (kept) instead of a temporary dir")
    p.add_argument("--name", default="cluster_box")
    p.add_argument("--resimulate", action="store_true",
                   help="recompute the model and the comparison from <out>/<name>.json (no box)")  # fmt: skip
    args = p.parse_args(argv)
    if args.resimulate:
        return resimulate(args)
    if args.quick:
        args.events, args.files, args.chunksize, args.runs, args.repeats = 4000, 2, 500, 2, 1
        args.sim_seeds = 2
    hosts = parse_hosts(args.hosts)
    args.basket_events = args.basket_events or args.chunksize
    files_n = args.files
    per_file = args.events // files_n
    n_chunks = files_n * -(-per_file // args.chunksize)
    events_per_chunk = per_file / -(-per_file // args.chunksize)
    shape = shape_of(hosts, args.link_scale, None)
    print(f"shape: {args.hosts} x {args.link_scale:g}: " + ", ".join(
        f"{h['name']} {h['threads']} thread(s) {mbit(h['vispa_link_gbit'], args.link_scale):g} Mbit/s" for h in hosts)
        + f"; origin {mbit(VISPA_STORAGE_GBIT, args.link_scale):g} Mbit/s; {n_chunks} chunks of "
        f"{events_per_chunk:g} events", flush=True)  # fmt: skip
    if args.dry_run:
        import simulate as sim

        r = sim.simulate_shape(shape, n_chunks, runs=args.runs, events_per_chunk=events_per_chunk, policies=MODES)
        print_table([{"mode": m, **{f"hit {x['run']}": f"{x['hit_rate']:.1%}" for x in v},
                      **{f"T{x['run']} s": round(float(x["makespan_s"]), 2) for x in v}} for m, v in r.items()])  # fmt: skip
        return 0

    from testbed import hosts as hb
    from testbed import xrootd as xrd

    reason = hb.unavailable_reason() or ("; ".join(xrd.missing_requirements(netns=False)) or None)
    if reason:
        print(f"cluster_box: cannot build a box here: {reason}", file=sys.stderr)
        return 2
    from benchmarks._runs import analysis_branches

    t_start = time.perf_counter()
    load0 = os.getloadavg()
    branches = analysis_branches("realistic")
    tmp = None
    if args.keep_data:
        data = Path(args.keep_data)
        data.mkdir(parents=True, exist_ok=True)
    else:
        data = Path(tmp := tempfile.mkdtemp(prefix="cacheaffinity-cluster-box-"))
    try:
        os.chmod(data, 0o755)  # the XRootD origin's unprivileged user reads it
        files = [str(f) for f in make_dataset(data, events=args.events, files=files_n, seed=27, branches=branches,
                                              basket_events=args.basket_events, progress=False)]  # fmt: skip
        ds = {"events": args.events, "files": files_n, **branch_bytes(files, branches)}
        print(f"dataset: {ds['uncompressed'] / 1e6:.1f} MB uncompressed, {ds['compressed'] / 1e6:.1f} MB "
              f"compressed ({ds['branches_found']} branches)", flush=True)  # fmt: skip
        cal = calibrate(files, args.chunksize, branches)
        cal.update(calibrate_warm_task(files, args.chunksize))
        print(f"calibration (1 core, {cal['events']} events): decompress {cal['decompress_s']:.3f} s, "
              f"compute {cal['compute_s']:.3f} s, warm chunk task {cal['warm_task_s']:.3f} s "
              f"(median of {cal['warm_tasks']}, hit rate {cal['warm_hit_rate']:.1%})", flush=True)  # fmt: skip
        reference: list = [None]
        repeats = []
        for i in range(args.repeats):
            print(f"repeat {i + 1}/{args.repeats}", flush=True)
            repeats.append(one_repeat(args, hosts, files, data, reference))
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    measured = summarise(repeats, args.runs)
    fitted = fit_overheads(measured, cal, hosts, n_chunks, events_per_chunk, args.runs)
    simulated = simulate(args, hosts, n_chunks, events_per_chunk, ds, cal, fitted)
    comparison = compare(measured, simulated, args.runs)
    netns_after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    mounts_after = Path("/proc/self/mounts").read_text()
    left = {"netns": [n for n in netns_after.splitlines() if n.startswith(hb.PREFIX)],
            "mounts": [m.split()[1] for m in mounts_after.splitlines() if f"/{hb.PREFIX}" in m]}  # fmt: skip
    config = {
        "events": args.events, "files": files_n, "chunksize": args.chunksize, "chunks": n_chunks,
        "events_per_chunk": events_per_chunk, "runs": args.runs, "repeats": args.repeats,
        "hosts_spec": args.hosts, "hosts": hosts, "link_scale": args.link_scale,
        "links_mbit": {h["name"]: mbit(h["vispa_link_gbit"], args.link_scale) for h in hosts},
        "origin_mbit": mbit(VISPA_STORAGE_GBIT, args.link_scale), "disk": args.disk, "basket_events": args.basket_events,
        "cpu_cores": os.cpu_count(), "threads": sum(h["threads"] for h in hosts), "dask_config": DASK_CONFIG, "modes": list(MODES),
        "analysis": "realistic", "codec": "lzma", "quick": args.quick, "sim_seeds": args.sim_seeds,
        "shared_machine": args.shared_machine,
        "note": ("run on a shared machine: other jobs used the CPU during the measurement"
                 if args.shared_machine else "run alone"),
    }  # fmt: skip
    results = {
        "dataset": ds, "calibration": cal, "fitted": fitted, "repeats": repeats,
        "measured": measured, "simulated": simulated, "comparison": comparison,
        "identical_results": all(r["identical"] for rep in repeats for m in MODES for r in rep["runs"][m]),
        "leftovers_after": left, "load_average_before": list(load0), "load_average_after": list(os.getloadavg()),
        "elapsed_s": time.perf_counter() - t_start,
    }  # fmt: skip
    path = os.path.join(args.out, f"{args.name}.json")
    write_json(path, config=config, results=results)
    import json

    with open(path) as f:
        doc = json.load(f)
    plot(doc, os.path.join(args.out, f"{args.name}.png"))
    rows = []
    for row in comparison:
        pct = "hit rate" in row["metric"]
        r = {"metric": row["metric"], "measured": _fmt(row["measured"], pct)}
        for v in simulated:
            r[v] = _fmt(row[v], pct)
            r[f"{v} diff"] = "-" if row[f"{v}_diff"] is None else f"{row[f'{v}_diff']:+.0%}"
        rows.append(r)
    print_table(rows, title="measured vs simulated (median [min, max])")
    print(f"results identical: {results['identical_results']}; leftovers: {left}")
    print(f"wrote {path}")
    return 0


def resimulate(args) -> int:
    """The model and the comparison again, from a results file's measurements."""
    import json

    path = os.path.join(args.out, f"{args.name}.json")
    with open(path) as f:
        doc = json.load(f)
    c, r = doc["config"], doc["results"]
    for k in ("runs", "link_scale", "sim_seeds"):
        setattr(args, k, c[k])
    fitted = fit_overheads(r["measured"], r["calibration"], c["hosts"], c["chunks"], c["events_per_chunk"], c["runs"])
    r["fitted"] = fitted
    r["simulated"] = simulate(args, c["hosts"], c["chunks"], c["events_per_chunk"], r["dataset"], r["calibration"], fitted)
    r["comparison"] = compare(r["measured"], r["simulated"], c["runs"])
    r["resimulated_on"] = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                                         text=True).stdout.strip()  # fmt: skip
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
        f.write("\n")
    plot(doc, os.path.join(args.out, f"{args.name}.png"))
    for row in r["comparison"]:
        print(row["metric"], {k: (v.get("median") if isinstance(v, dict) else v) for k, v in row.items() if k != "metric"})
    return 0


def _fmt(s: dict | None, pct: bool = False) -> str:
    if not s or s.get("median") is None:
        return "-"
    f = (lambda v: f"{v:.1%}") if pct else (lambda v: f"{v:.3g}")
    if s.get("n", 1) > 1 and s["min"] != s["max"]:
        return f"{f(s['median'])} [{f(s['min'])}, {f(s['max'])}]"
    return f(s["median"])


if __name__ == "__main__":
    sys.exit(main())
