"""Scheduler CPU that cacheaffinity's plugin adds per task.

Two real ``dask scheduler`` processes, each with W ``dask worker`` processes:
one plain, one started with ``--preload cacheaffinity`` (workers too, each its
own cache node).  The same N trivial tasks go to both, alternately, R times:

- plain:  ``client.map(..., workers=[addr], allow_other_workers=True)`` per worker,
  the chunk -> worker choice made on the client (hash % W): plain loose restrictions;
- plugin: ``cacheaffinity.map_chunks(...)``: the plugin places every task;
- unrestricted: one plain ``client.map`` (Dask places the tasks), for reference.

Scheduler CPU (user + system, from /proc via psutil) is read before and after
each batch, so client and worker CPU are not counted.  The process-level numbers
are noisy on a shared machine, so the plugin scheduler also runs
``benchmarks._hook_timer``, which measures the CPU time spent inside the plugin's
hooks exactly: that is what the plugin adds per task.

    python benchmarks/scheduler_overhead.py [--tasks 20000] [--rounds 3] [--workers 4]

Writes benchmarks/results/scheduler_overhead.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import xxhash
from distributed import Client

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cacheaffinity  # noqa: E402
from benchmarks._common import pyplot, save_png, write_json  # noqa: E402
from benchmarks._hook_timer import hook_seconds  # noqa: E402

BIN = Path(sys.executable).parent


def noop(x):
    return x


def start_cluster(tmp: Path, name: str, workers: int, preload: bool):
    sched_file = tmp / f"{name}.json"
    pre = ["--preload", "cacheaffinity"] if preload else []
    sched_pre = pre + (["--preload", "benchmarks._hook_timer"] if preload else [])
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    logs = open(tmp / f"{name}.log", "w")
    procs = [
        subprocess.Popen(
            [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
             "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sched_file), *sched_pre],
            stdout=logs, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    ]
    while not sched_file.exists():
        time.sleep(0.1)
    address = json.loads(sched_file.read_text())["address"]
    for i in range(workers):
        extra = ["--cache-directory", str(tmp / f"{name}-node{i}")] if preload else []
        procs.append(
            subprocess.Popen(
                [str(BIN / "dask"), "worker", address, "--nthreads", "1", "--no-nanny",
                 "--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0", *pre, *extra],
                stdout=logs, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        )
    client = Client(address)
    client.wait_for_workers(workers)
    return client, procs


def cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def run_plain(client, chunks):
    workers = sorted(client.scheduler_info()["workers"])
    groups: dict[str, list[str]] = {w: [] for w in workers}
    for c in chunks:
        groups[workers[xxhash.xxh3_64_intdigest(c.encode()) % len(workers)]].append(c)
    futs = []
    for w, cs in groups.items():
        futs += client.map(noop, cs, workers=[w], allow_other_workers=True, pure=False)
    client.gather(futs)


def run_unrestricted(client, chunks):
    client.gather(client.map(noop, chunks, pure=False))


def run_plugin(client, chunks):
    client.gather(cacheaffinity.map_chunks(client, noop, chunks, chunk_ids=chunks, pure=False))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="ca-overhead-"))
    clusters = {
        "plain": start_cluster(tmp, "plain", args.workers, preload=False),
        "plugin": start_cluster(tmp, "plugin", args.workers, preload=True),
    }
    runners = {"unrestricted": run_unrestricted, "plain": run_plain, "plugin": run_plugin}
    results: dict[str, list[float]] = {m: [] for m in runners}
    hooks: list[float] = []
    by_hook: dict[str, float] = {}
    try:
        cacheaffinity.check(clusters["plugin"][0])
        for r in range(args.rounds + 1):  # round 0 warms up
            chunks = [f"uuid-{r}-{i // 100}/Events/{i % 100}" for i in range(args.tasks)]
            for mode in runners:
                client, procs = clusters["plugin" if mode == "plugin" else "plain"]
                sched = psutil.Process(procs[0].pid)
                h0 = sum(client.run_on_scheduler(hook_seconds).values()) if mode == "plugin" else 0
                c0 = cpu(sched)
                runners[mode](client, chunks)
                c1 = cpu(sched)
                hs = client.run_on_scheduler(hook_seconds) if mode == "plugin" else {}
                h1 = sum(hs.values())
                if r:
                    results[mode].append((c1 - c0) / args.tasks * 1e6)
                    if mode == "plugin":
                        hooks.append((h1 - h0) / args.tasks * 1e6)
                    print(f"round {r} {mode:12s}: {results[mode][-1]:7.1f} us scheduler CPU per task")
    finally:
        for client, procs in clusters.values():
            client.close()
            for pr in procs[::-1]:  # workers first, then the scheduler
                pr.terminate()
                try:
                    pr.wait(20)
                except subprocess.TimeoutExpired:
                    pr.kill()
                    pr.wait()
    med = {m: sorted(v)[len(v) // 2] for m, v in results.items()}
    overhead = med["plugin"] / med["plain"] - 1
    vs_unrestricted = med["plugin"] / med["unrestricted"] - 1
    print(f"\nmedian scheduler CPU per task: unrestricted {med['unrestricted']:.1f} us, "
          f"plain restricted {med['plain']:.1f} us, plugin {med['plugin']:.1f} us")
    print(f"plugin vs plain restricted tasks: {overhead:+.1%}; "
          f"vs unrestricted tasks: {vs_unrestricted:+.1%}")  # fmt: skip
    by_hook = {k: v / (args.tasks * (args.rounds + 1)) * 1e6 for k, v in hs.items()}
    print("per hook, us per task (all rounds): "
          + ", ".join(f"{k} {v:.1f}" for k, v in sorted(by_hook.items())))  # fmt: skip
    hook_med = sorted(hooks)[len(hooks) // 2]
    hook_share = hook_med / med["plugin"]
    print(f"time inside the plugin's hooks: {hook_med:.1f} us per task = {hook_share:.1%} "
          f"of the plugin scheduler's CPU")  # fmt: skip
    out = Path(args.out)
    write_json(
        str(out / "scheduler_overhead.json"),
        config=vars(args),
        results={
            "us_per_task": results,
            "median_us_per_task": med,
            "overhead_vs_plain_restricted": overhead,
            "overhead_vs_unrestricted": vs_unrestricted,
            "hook_us_per_task": hooks,
            "hook_us_per_task_by_hook": by_hook,
            "hook_share_of_scheduler_cpu": hook_share,
        },
    )
    fig, ax = pyplot().subplots(figsize=(6, 4))
    for i, (m, v) in enumerate(results.items()):
        ax.scatter([i] * len(v), v, label=m)
        ax.hlines(med[m], i - 0.2, i + 0.2)
    ax.set_xticks(range(len(results)), list(results))
    ax.set_ylabel("scheduler CPU per task [us]")
    ax.set_title(f"{args.tasks} tasks x {args.rounds} rounds, {args.workers} workers: "
                 f"plugin {overhead:+.1%}")  # fmt: skip
    save_png(fig, str(out / "scheduler_overhead.png"))


if __name__ == "__main__":
    main()
