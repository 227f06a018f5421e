"""Where a warm cacheaffinity run spends the time that floor (b) does not.

The headline (``consecutive_runs.py``) measures cacheaffinity's warm run against floor (b),
``coffea-in-memory``: the same executor and coffea/NanoEvents pipeline with every column
buffer in a dict of the worker process.  This script explains that ratio on one cluster,
with the page cache warm and nothing else running: W worker processes (1 thread each, W
cache nodes), files read from the local directory, the realistic analysis by default.

1. run 1 (cold caches), then one floor (b) run that fills the workers' dicts (not timed);
2. ``--rounds`` rounds of one warm run and one floor (b) run, the order alternating from round
   to round; each run is profiled on every worker process with py-spy (``--rate`` samples/s,
   ``--nonblocking``) when py-spy is found (``--py-spy``, default: next to this Python, then
   ``PATH``; ``pip install py-spy``; it needs ptrace, i.e. root or ``ptrace_scope`` 0).

Per round: both walls, their ratio, bytes the workers read from block storage
(``/proc/<pid>/io``), the warm run's hit rate, and from the profiles the samples of the chunk
tasks (``ChunkTask.__call__``) and of the disk cache's read path inside them:
the chunk's pack path (``PackSourceMapping``: lookups, views, assembly), the store's pack
reads (``get_packs``: one index query, ``Index.query``, and one verified read per pack,
``DataFiles.read``: open, readv, xxh3).  py-spy samples wall time of
running threads, so on a machine with fewer cores than workers a sample share is a share of
the tasks' wall time, the CPU contention included.  The headline ratio is "what the disk cache
costs over a dict"; the read path's share is how much of that is the read path itself, and
its samples over the run's column lookups (hits) give microseconds per lookup.  For both runs the
profiles also give coffea's pipeline inside the tasks: the events built from the form
(``NanoEventsFactory.events``: awkward's ``from_buffers``) and the user's processor
(``<class>.process``), as shares of the task samples; floor (b) runs the same executor
and fast path (``_run_from_form``), its buffers from a dict.  Each run's task stream
(``distributed.get_task_stream``) gives where its wall went: seconds until the first
task computed, after the last one, and the busiest worker's summed compute.  Bytes copied
per byte served: the bytes of the cache's data files copied into a new buffer (``bytes_read``;
files mapped by ``worker.read: map``, ``bytes_mapped``, are not copied) plus what serving copied
after that (concatenations across packs, re-based offsets: ``PackSourceMapping.bytes_copied``),
over the bytes served.

Python's garbage collector is timed in every worker (``gc.callbacks``): seconds of full
(generation 2) and of younger collections per worker process and run.  ``--gc-freeze``
calls ``gc.collect(); gc.freeze()`` on every worker after the fill run (the objects alive
then, mostly the imported libraries, are left out of later collections: the one-line tuning
a user can apply with ``client.run``), to measure what the full collections cost.

    python benchmarks/warm_run_profile.py [--events 160000] [--files 8] [--chunksize 10000]
        [--workers 4] [--rounds 3] [--analysis realistic] [--gc-freeze] [--keep-profiles DIR]

``--keep-profiles DIR`` keeps the raw py-spy files (``<run>-<pid>.txt``, one stack per line with
its sample count) for a function-level comparison of the two runs.

Prints a table, writes benchmarks/results/warm_run_profile.json and .png (``--out``).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cacheaffinity  # noqa: E402
from distributed import get_task_stream  # noqa: E402
from benchmarks import _gctimer  # noqa: E402
from benchmarks._clusters import ModeCluster  # noqa: E402
from benchmarks._runs import ANALYSES, DEFAULT_DATA, Config, prepare_data  # noqa: E402
from benchmarks._storage import Storage  # noqa: E402
from benchmarks._common import print_table, pyplot, save_png, spread, write_json  # noqa: E402

#: (name in the JSON, what py-spy reports: a qualified function name, or a class name
#: followed by "." for any of its methods) of the warm read path, inclusive samples:
#: the chunk's whole pack path (lookups, views, assembly), the store's pack reads (one
#: index query and one verified read per pack), the query alone, the file reads alone
READ_PATH = (
    ("read_path", "PackSourceMapping."),
    ("get_packs", ".get_packs"),
    ("index_query", "Index.query"),
    ("file_reads", "DataFiles.read"),
)
#: (name in the JSON, function) of coffea's pipeline inside a chunk task, inclusive samples,
#: counted for both runs (floor (b) runs the same executor and fast path, its buffers from
#: a dict): the events built from the form (awkward's ``from_buffers``) and the user's
#: processor (any ``<class>.process`` below the task)
PIPELINE = (
    ("nanoevents", "NanoEventsFactory.events"),
    ("processor", ".process"),
)
TASK = "ChunkTask.__call__"


def _copies_install() -> None:
    """In a worker: add up what every chunk's pack mapping served and copied
    (:attr:`PackSourceMapping.bytes_served` / ``bytes_copied``) when it finishes."""
    from cacheaffinity.coffea import _packs as packs

    cls = packs.PackSourceMapping
    if getattr(cls, "_bench_copies", None) is not None:
        return
    totals = cls._bench_copies = {"served": 0, "copied": 0}
    finish = cls.finish

    def counted(self):
        totals["served"] += self.bytes_served
        totals["copied"] += self.bytes_copied
        return finish(self)

    cls.finish = counted


def _copies_read() -> dict:
    """In a worker: the totals since the last call (then reset)."""
    from cacheaffinity.coffea import _packs as packs

    totals = getattr(packs.PackSourceMapping, "_bench_copies", None) or {}
    out = dict(totals)
    for k in totals:
        totals[k] = 0
    return out


def copies(client) -> dict:
    """Bytes the workers' chunk tasks served from packs and copied in serving, since
    the last call, summed over the workers."""
    out = {"served": 0, "copied": 0}
    for got in client.run(_copies_read).values():
        for k in out:
            out[k] += got.get(k, 0)
    return out


def _gc_summary(per_worker: dict) -> dict:
    """Median over the workers of their collections' seconds and counts in one run."""
    return _gctimer.summary(per_worker)


def find_py_spy(given: str | None) -> str | None:
    if given:
        return given if os.access(given, os.X_OK) else None
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if os.access(here, os.X_OK) else shutil.which("py-spy")


class Profiler:
    """py-spy ``record`` on every worker process of a cluster for the span of a ``with``."""

    def __init__(self, exe: str | None, rate: int, outdir: str):
        self.exe, self.rate, self.outdir = exe, rate, outdir

    def __call__(self, client, tag: str):
        return _Recording(self, client, tag)


class _Recording:
    def __init__(self, prof: Profiler, client, tag: str):
        self.prof, self.client, self.tag = prof, client, tag
        self.procs: list[subprocess.Popen] = []
        self.files: list[str] = []

    def __enter__(self):
        if self.prof.exe is None:
            return self
        for pid in self.client.run(os.getpid).values():
            out = os.path.join(self.prof.outdir, f"{self.tag}-{pid}.txt")
            self.files.append(out)
            self.procs.append(subprocess.Popen(
                [self.prof.exe, "record", "-p", str(pid), "-r", str(self.prof.rate), "--format",
                 "raw", "--nonblocking", "-o", out],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            ))  # fmt: skip
        time.sleep(1.0)  # py-spy attaches before the run starts
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.send_signal(signal.SIGINT)
        for p in self.procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def shares(self) -> dict | None:
        """Samples of the chunk tasks and of the read path within them (None: no profile)."""
        if not self.files or not all(os.path.exists(f) for f in self.files):
            return None
        return stack_samples(self.files)


def _function(frame: str) -> str:
    # py-spy raw frames: "function (file.py:line)"
    return frame.split(" (", 1)[0]


def _matches(pattern: str, funcs: list[str]) -> bool:
    if pattern.endswith("."):
        return any(f.startswith(pattern) for f in funcs)
    if pattern.startswith("."):
        return any(f.endswith(pattern) or f == pattern[1:] for f in funcs)
    return pattern in funcs


def stack_samples(files: list[str]) -> dict:
    """Inclusive samples of :data:`TASK` and of each :data:`READ_PATH` function under it in
    py-spy ``--format raw`` files (one ``frame;frame;... count`` line per stack)."""
    counts: collections.Counter = collections.Counter()
    total = 0
    for path in files:
        with open(path) as f:
            for line in f:
                stack, _, n = line.rstrip("\n").rpartition(" ")
                if not stack or not n.isdigit():
                    continue
                total += int(n)
                funcs = [_function(fr) for fr in stack.split(";")]
                if TASK not in funcs:
                    continue
                counts["tasks"] += int(n)
                below = funcs[funcs.index(TASK):]
                for name, fn in READ_PATH + PIPELINE:
                    if _matches(fn, below):
                        counts[name] += int(n)
    out = {"all": total, "tasks": counts["tasks"]}
    for name, _ in READ_PATH + PIPELINE:
        out[name] = counts[name]
        out[f"{name}_share"] = counts[name] / counts["tasks"] if counts["tasks"] else None
    return out


def timeline(records: list[dict], t0: float, t1: float) -> dict:
    """Where a run's wall went, from its task stream (``distributed.get_task_stream``
    records) and the run's start ``t0`` and end ``t1`` (``time.time()``): seconds until
    the first task computed (``first_task_s``), after the last one (``tail_s``), the
    busiest worker's summed compute (``busiest_worker_s``) and each worker's task count."""
    spans: dict[str, float] = collections.defaultdict(float)
    tasks: collections.Counter = collections.Counter()
    starts, stops = [], []
    for r in records:
        for ss in r.get("startstops", ()):
            if ss.get("action") != "compute":
                continue
            starts.append(ss["start"])
            stops.append(ss["stop"])
            spans[r["worker"]] += ss["stop"] - ss["start"]
            tasks[r["worker"]] += 1
    if not starts:
        return {"first_task_s": None, "tail_s": None, "busiest_worker_s": None, "tasks_per_worker": []}
    return {
        "first_task_s": min(starts) - t0,
        "tail_s": t1 - max(stops),
        "busiest_worker_s": max(spans.values()),
        "tasks_per_worker": sorted(tasks.values()),
    }


def run(args) -> dict:
    cfg = Config(
        events=args.events, files=args.files, chunksize=args.chunksize, workers=args.workers,
        runs=2, storage="local", rate=None, modes=("cacheaffinity",), scenarios=("stable",),
        analysis=args.analysis, data=args.data, progress=False,
    )  # fmt: skip
    cfg.check()
    files = prepare_data(cfg)
    exe = find_py_spy(args.py_spy)
    if exe is None:
        print("py-spy not found: walls and ratios only (pip install py-spy)", flush=True)
    work = Path(tempfile.mkdtemp(prefix="warm-run-profile-", dir=args.workdir))
    prof = Profiler(exe, args.rate, str(work))
    rounds = []
    try:
        with Storage(cfg, files, work) as storage:
            mc = ModeCluster("cacheaffinity", cfg, storage, work).start()
            try:
                r1 = mc.run()
                print(f"run 1 {r1['wall_s']:.2f} s (cold)", flush=True)
                mc.floor_in_memory(fill=True)
                frozen = None
                if args.gc_freeze:
                    frozen = statistics.median(mc.client.run(_gctimer.freeze).values())
                    print(f"gc.freeze(): {frozen:.0f} objects per worker left out of collections",
                          flush=True)  # fmt: skip
                mc.client.run(_gctimer.install)  # (ModeCluster.start did already)
                mc.client.run(_copies_install)
                for k in range(args.rounds):
                    got = {}
                    order = ("warm", "floor") if k % 2 == 0 else ("floor", "warm")
                    for kind in order:
                        mc.client.run(_gctimer.read)  # reset
                        copies(mc.client)  # reset
                        t0 = cacheaffinity.cache_totals(mc.client)
                        with prof(mc.client, f"{kind}{k}") as rec:
                            with get_task_stream(mc.client) as stream:
                                start = time.time()
                                row = mc.run() if kind == "warm" else mc.floor_in_memory()
                                end = time.time()
                        # (the stream's records arrive when its ``with`` ends)
                        row["timeline"] = timeline(stream.data, start, end)
                        row["gc"] = _gc_summary(mc.client.run(_gctimer.read))
                        row["copies"] = copies(mc.client)
                        t1 = cacheaffinity.cache_totals(mc.client)
                        for how in ("read", "mapped"):
                            row["copies"][how] = t1.get(f"bytes_{how}", 0) - t0.get(f"bytes_{how}", 0)
                        got[kind] = (row, rec.shares())
                    (w, wp), (f, fp) = got["warm"], got["floor"]
                    r = {
                        "round": k + 1, "order": list(order),
                        "warm_s": w["wall_s"], "floor_b_s": f["wall_s"],
                        "ratio": w["wall_s"] / f["wall_s"],
                        "warm_hit_rate": w["hit_rate"],
                        "warm_disk_read_bytes": w.get("disk_read_bytes"),
                        "floor_b_disk_read_bytes": f.get("disk_read_bytes"),
                        "warm_profile": wp, "floor_b_profile": fp,
                        "warm_gc": w["gc"], "floor_b_gc": f["gc"],
                        "warm_timeline": w["timeline"], "floor_b_timeline": f["timeline"],
                        # bytes of the cache's data files copied into a new buffer (one
                        # copy each) / mapped (no copy), served to coffea, copied in serving
                        "warm_bytes_read": w["copies"]["read"],
                        "warm_bytes_mapped": w["copies"]["mapped"],
                        "warm_bytes_served": w["copies"]["served"],
                        "warm_bytes_copied": w["copies"]["copied"],
                    }  # fmt: skip
                    if w["copies"]["served"]:
                        # every copy per byte served: the store's read plus the serving's
                        r["copies_per_byte_served"] = (
                            (w["copies"]["read"] + w["copies"]["copied"]) / w["copies"]["served"]
                        )
                    rounds.append(r)
                    share = (wp or {}).get("read_path_share")
                    if wp and w.get("hits"):
                        # samples are per process at --rate per second: seconds of the read
                        # path summed over the workers, per column lookup of the run
                        r["read_path_us_per_lookup"] = wp["read_path"] / args.rate / w["hits"] * 1e6
                    print(f"round {k + 1}: warm {r['warm_s']:.2f} s, floor (b) {r['floor_b_s']:.2f} s, "
                          f"ratio {r['ratio']:.3f}, hits {r['warm_hit_rate']:.1%}, full GC per worker "
                          f"{w['gc']['full_s']:.2f} / {f['gc']['full_s']:.2f} s"
                          + (f", read path {share:.1%} of task samples" if share is not None else "")
                          + (f", {r['read_path_us_per_lookup']:.0f} us per lookup"
                             if r.get("read_path_us_per_lookup") else "")
                          + (f", {r['copies_per_byte_served']:.3f} bytes copied per byte served"
                             if r.get("copies_per_byte_served") else ""),
                          flush=True)  # fmt: skip
            finally:
                mc.close()
    finally:
        if args.keep_profiles:
            keep = Path(args.keep_profiles)
            keep.mkdir(parents=True, exist_ok=True)
            for f in work.glob("*.txt"):
                shutil.copy2(f, keep / f.name)
        shutil.rmtree(work, ignore_errors=True)
    summary = {"ratio": spread([r["ratio"] for r in rounds])}
    for name, _ in READ_PATH:
        summary[f"{name}_share"] = spread(
            [(r["warm_profile"] or {}).get(f"{name}_share") for r in rounds]
        )
    # task samples of the warm run over the floor's: how much longer the tasks took
    summary["task_samples_ratio"] = spread([
        r["warm_profile"]["tasks"] / r["floor_b_profile"]["tasks"]
        for r in rounds
        if r["warm_profile"] and r["floor_b_profile"] and r["floor_b_profile"]["tasks"]
    ])  # fmt: skip
    for kind in ("warm", "floor_b"):
        summary[f"{kind}_full_gc_s"] = spread([r[f"{kind}_gc"]["full_s"] for r in rounds])
        summary[f"{kind}_full_gc_share"] = spread(
            [r[f"{kind}_gc"]["full_s"] / r[f"{kind}_s"] for r in rounds]
        )
        for name, _ in PIPELINE:
            summary[f"{kind}_{name}_share"] = spread(
                [(r[f"{kind}_profile"] or {}).get(f"{name}_share") for r in rounds]
            )
        for what in ("first_task_s", "tail_s", "busiest_worker_s"):
            summary[f"{kind}_{what}"] = spread([r[f"{kind}_timeline"][what] for r in rounds])
    summary["read_path_us_per_lookup"] = spread([r.get("read_path_us_per_lookup") for r in rounds])
    summary["copies_per_byte_served"] = spread([r.get("copies_per_byte_served") for r in rounds])
    summary["warm_s"] = spread([r["warm_s"] for r in rounds])
    summary["floor_b_s"] = spread([r["floor_b_s"] for r in rounds])
    return {"run1_s": r1["wall_s"], "rounds": rounds, "summary": summary, "py_spy": exe,
            "dataset_files": len(files), "gc_frozen_objects": frozen}  # fmt: skip


def plot(doc: dict, path: str) -> None:
    plt = pyplot()
    rounds = doc["results"]["rounds"]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    x = [r["round"] for r in rounds]
    ax.bar([i - 0.2 for i in x], [r["ratio"] for r in rounds], width=0.4,
           label="warm run / floor (b) wall")  # fmt: skip
    shares = [(r["warm_profile"] or {}).get("read_path_share") for r in rounds]
    if all(s is not None for s in shares):
        ax.bar([i + 0.2 for i in x], [1 + s for s in shares], width=0.4,
               label="1 + read path share of task samples")  # fmt: skip
    ax.axhline(1.15, color="k", lw=0.8, ls="--", label="target 1.15")
    ax.set_xlabel("round")
    ax.set_ylim(0.9, None)
    ax.set_xticks(x)
    ax.legend(fontsize=8)
    ax.set_title(f"warm run vs floor (b), commit {doc['commit'][:7]}", fontsize=9)
    save_png(fig, path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=160_000)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--chunksize", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--analysis", default="realistic", choices=sorted(ANALYSES))
    p.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    p.add_argument("--py-spy", default=None, help="py-spy executable (default: search)")
    p.add_argument("--gc-freeze", action="store_true",
                   help="gc.collect(); gc.freeze() on every worker after the fill run")
    p.add_argument("--name", default="warm_run_profile", help="results file name (without .json)")
    p.add_argument("--data", default=str(DEFAULT_DATA), help="generated datasets (reused)")
    p.add_argument("--keep-profiles", default=None, metavar="DIR",
                   help="copy the raw py-spy profiles (one per worker and run) into DIR")
    p.add_argument("--workdir", default=None, help="where the caches go (default: temp dir)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    t0 = time.perf_counter()
    results = run(args)
    config = {k: v for k, v in vars(args).items() if k not in ("out", "name")}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{args.name}.json")
    write_json(path, config=config, results=results, elapsed_s=time.perf_counter() - t0,
               load_average=os.getloadavg())  # fmt: skip
    import json

    with open(path) as f:
        doc = json.load(f)
    plot(doc, path[:-5] + ".png")
    s = results["summary"]
    rows = [{"figure": name, "median": v["median"], "min": v["min"], "max": v["max"]}
            for name, v in s.items()]  # fmt: skip
    print_table(rows, ["figure", "median", "min", "max"])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
