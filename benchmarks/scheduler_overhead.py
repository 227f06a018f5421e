"""Scheduler CPU that cacheaffinity adds per chunk task (headline: at 10^4 tasks).

Two real ``dask scheduler`` processes, each with W ``dask worker`` processes:
one plain, one started with ``--preload cacheaffinity`` (workers too, each its
own cache node).  Every round submits the same number N of trivial tasks to both:

- ``chunk``: ``cacheaffinity.map_chunks(...)`` on the plugin cluster: the plugin places
  every task on its cache node (loose restrictions);
- ``plain``: the same tasks on the plain cluster, each restricted with plain
  ``workers=[addr]`` to the worker with the same index as the one the plugin places that
  chunk on (from :func:`cacheaffinity.where`, asked before the round): the same placement,
  made on the client.  Strict restrictions (``allow_other_workers=False``): with loose ones
  Dask's stock stealing moves about half of the trivial tasks elsewhere, so the placement
  would no longer be the same;
- ``unrestricted``: one plain ``client.map`` (Dask places the tasks), for reference;
- ``annotated`` (diagnostic): ``plain`` plus the chunk annotations ``map_chunks`` attaches,
  on the plain scheduler: what carrying chunk identities costs without the plugin;
- ``hooks`` (diagnostic): ``chunk`` again (other chunk ids) with ``benchmarks._hook_timer``
  switched on, which measures the CPU time spent inside the plugin's hooks and its
  stealing policy's rounds exactly (a lower bound of what the plugin adds).  The timer costs the scheduler ~1 us per hook
  call (two ``thread_time`` reads, ~4 calls per chunk task), so it is off in ``chunk``.

Also per round, each scheduler's CPU while idle for 2 s (``idle_cpu_ms_per_s``: periodic
callbacks, e.g. a stealing policy's timer) and each batch's wall time, so that the part of
the difference that is periodic rather than per task can be estimated.

Headline (the definition the issue asks for): scheduler process CPU time (user + system
of the scheduler subprocess, from /proc via psutil, read before and after each batch, so
client and worker CPU do not count) per chunk task vs per plain restricted task, from
submission to the results gathered, plus the release of the batch (from dropping the
futures until the scheduler holds no task; the plugin's bookkeeping of forgotten tasks
counts, and no batch's release leaks into the next batch on the same scheduler);
``overhead`` = chunk / plain - 1, formed per round; the median [min, max] over the rounds
(``--rounds``, after one warm-up round; the order of the modes rotates every round).

    python benchmarks/scheduler_overhead.py [--tasks 10000] [--rounds 5] [--workers 4]

Writes benchmarks/results/scheduler_overhead.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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
from benchmarks._common import pyplot, save_png, spread, write_json  # noqa: E402
from benchmarks._hook_timer import hook_seconds, hook_timer  # noqa: E402

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


def placement_by_index(ca_client, chunks) -> list[int]:
    """For every chunk, the index (in sorted worker order) of the worker the plugin places
    it on (the first worker of its cache node)."""
    workers = sorted(ca_client.scheduler_info(n_workers=-1)["workers"])
    where = cacheaffinity.where(ca_client, chunks)
    return [workers.index(sorted(where[c]["workers"])[0]) for c in chunks]


def run_plain(client, chunks, placement):
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    groups: dict[str, list[int]] = {w: [] for w in workers}
    for n, i in enumerate(placement):
        groups[workers[i]].append(n)
    futs: list = [None] * len(chunks)
    for w, idx in groups.items():
        if idx:
            fs = client.map(noop, [chunks[n] for n in idx], workers=[w], allow_other_workers=False,
                            pure=False)  # fmt: skip
            for n, f in zip(idx, fs):
                futs[n] = f
    client.gather(futs)
    return futs  # in the order of chunks


def run_annotated(client, chunks, placement):
    """``plain`` + the chunk annotations of ``map_chunks``, on the plain scheduler (no
    plugin): what carrying chunk identities costs the scheduler by itself."""
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    groups: dict[str, list[int]] = {w: [] for w in workers}
    for n, i in enumerate(placement):
        groups[workers[i]].append(n)
    futs: list = [None] * len(chunks)
    for w, idx in groups.items():
        if idx:
            cs = [chunks[n] for n in idx]
            fs = cacheaffinity.map_chunks(client, noop, cs, chunk_ids=cs, workers=[w],
                                          allow_other_workers=False, pure=False)  # fmt: skip
            for n, f in zip(idx, fs):
                futs[n] = f
    client.gather(futs)
    return futs


def run_unrestricted(client, chunks, placement=None):
    futs = client.map(noop, chunks, pure=False)
    client.gather(futs)
    return futs


def run_chunk(client, chunks, placement=None):
    futs = cacheaffinity.map_chunks(client, noop, chunks, chunk_ids=chunks, pure=False)
    client.gather(futs)
    return futs


def _task_count(dask_scheduler=None) -> int:
    return len(dask_scheduler.tasks)


def steals(client) -> int:
    """Steal requests the plugin's stealing policy has sent so far."""
    return int((cacheaffinity.check(client, warn=False)["stealing"] or {}).get("steals", 0))


def wait_forgotten(client, timeout: float = 120.0) -> None:
    """Wait until the scheduler has released and forgotten every task."""
    deadline = time.monotonic() + timeout
    while client.run_on_scheduler(_task_count):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the scheduler still holds tasks after {timeout} s")
        time.sleep(0.02)


def ran_on_index(client, futs) -> list[int]:
    """Index (sorted worker order) of the worker each future's task ran on."""
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    who = client.who_has(futs)
    return [workers.index(sorted(who[f.key])[0]) if who.get(f.key) else -1 for f in futs]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=5, help="measured rounds (after one warm-up)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="ca-overhead-"))
    load_before = list(os.getloadavg())
    clusters = {
        "plain": start_cluster(tmp, "plain", args.workers, preload=False),
        "plugin": start_cluster(tmp, "plugin", args.workers, preload=True),
    }
    runners = {"chunk": run_chunk, "plain": run_plain, "unrestricted": run_unrestricted,
               "annotated": run_annotated, "hooks": run_chunk}  # fmt: skip
    walls: dict[str, list[float]] = {m: [] for m in runners}
    idle: dict[str, list[float]] = {"plugin": [], "plain": []}
    results: dict[str, list[float]] = {m: [] for m in runners}
    overheads: list[float] = []
    hooks: list[float] = []
    same_worker: list[float] = []
    steal_requests: list[int] = []
    hs: dict = {}
    try:
        ca_client = clusters["plugin"][0]
        cacheaffinity.check(ca_client)
        order = list(runners)
        for r in range(args.rounds + 1):  # round 0 warms up
            chunks = [f"uuid-{r}-{i // 100}/Events/{i % 100}" for i in range(args.tasks)]
            # the timed chunk batch gets chunk ids of its own (new to the locator, as chunk's)
            hook_chunks = [f"uuid-h{r}-{i // 100}/Events/{i % 100}" for i in range(args.tasks)]
            placement = placement_by_index(ca_client, chunks)  # asked before the round
            k = r % len(order)
            per_round = {}
            for mode in order[k:] + order[:k]:
                client, procs = clusters["plugin" if mode in ("chunk", "hooks") else "plain"]
                sched = psutil.Process(procs[0].pid)
                if mode == "hooks":
                    client.run_on_scheduler(hook_timer, on=True)
                    h0 = sum(client.run_on_scheduler(hook_seconds).values())
                if mode == "chunk":
                    s0 = steals(client)
                c0, w0 = cpu(sched), time.perf_counter()
                futs = runners[mode](client, hook_chunks if mode == "hooks" else chunks, placement)
                c1, w1 = cpu(sched), time.perf_counter()
                if mode == "chunk":
                    ran = ran_on_index(client, futs)
                    share = sum(a == b for a, b in zip(ran, placement)) / len(chunks)
                    stolen = steals(client) - s0
                elif mode == "plain":
                    ran_plain = ran_on_index(client, futs)
                # the release of the batch (to "forgotten") is part of its cost
                c2 = cpu(sched)
                del futs
                wait_forgotten(client)
                c3 = cpu(sched)
                if mode == "hooks":
                    client.run_on_scheduler(hook_timer, on=False)
                    hs = client.run_on_scheduler(hook_seconds)
                    h1 = sum(hs.values())
                per_round[mode] = (c1 - c0 + c3 - c2) / args.tasks * 1e6
                if r:
                    results[mode].append(per_round[mode])
                    walls[mode].append(w1 - w0)
                    if mode == "hooks":
                        hooks.append((h1 - h0) / args.tasks * 1e6)
                    elif mode == "chunk":
                        same_worker.append(share)
                        steal_requests.append(stolen)
                    print(f"round {r} {mode:12s}: {per_round[mode]:7.1f} us scheduler CPU per task",
                          flush=True)  # fmt: skip
            if r:
                for name in ("plugin", "plain"):
                    sched = psutil.Process(clusters[name][1][0].pid)
                    i0 = cpu(sched)
                    time.sleep(2.0)
                    idle[name].append((cpu(sched) - i0) / 2.0 * 1e3)
                overheads.append(per_round["chunk"] / per_round["plain"] - 1)
                print(f"round {r}: chunk / plain - 1 = {overheads[-1]:+.1%}; chunk tasks on their "
                      f"placed worker {same_worker[-1]:.1%}, plain tasks on the same index "
                      f"{sum(a == b for a, b in zip(ran_plain, placement)) / len(chunks):.1%}",
                      flush=True)  # fmt: skip
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
    load_after = list(os.getloadavg())
    med = {m: statistics.median(v) for m, v in results.items()}
    head = {
        "definition": "scheduler process CPU per chunk task (cacheaffinity.map_chunks, plugin "
        "places) vs per plain task restricted with workers=[same worker index], "
        "allow_other_workers=False; overhead = chunk/plain - 1 per round",
        "tasks": args.tasks,
        "chunk_us_per_task": spread(results["chunk"]),
        "plain_us_per_task": spread(results["plain"]),
        "unrestricted_us_per_task": spread(results["unrestricted"]),
        "overhead": spread(overheads),
        "hook_us_per_task": spread(hooks),
        "chunk_tasks_on_placed_worker": spread(same_worker),
        # the throttled stealing may move a few chunk tasks to a worker that fell idle (more
        # often on a loaded machine); every chunk task off its placed worker is one of these
        "chunk_steal_requests": spread(steal_requests),
        "annotated_us_per_task": spread(results["annotated"]),
        "hooks_timed_us_per_task": spread(results["hooks"]),
        "idle_cpu_ms_per_s": {k: spread(v) for k, v in idle.items()},
        "batch_wall_s": {k: spread(v) for k, v in walls.items()},
        "target": "<= +5%",
        "pass": statistics.median(overheads) <= 0.05,
        "load_1min": round(max(load_before[0], load_after[0]), 2),
        "load_before": load_before,
        "load_after": load_after,
    }
    o = head["overhead"]
    print(f"\nmedian scheduler CPU per task: chunk {med['chunk']:.1f} us, plain restricted to the "
          f"same workers {med['plain']:.1f} us, unrestricted {med['unrestricted']:.1f} us")  # fmt: skip
    print(f"HEADLINE chunk vs plain restricted: {o['median']:+.1%} [{o['min']:+.1%} .. {o['max']:+.1%}] "
          f"over {o['n']} rounds of {args.tasks} tasks (target <= +5%: "
          f"{'met' if head['pass'] else 'MISSED'}); load {load_before[0]:.1f} -> {load_after[0]:.1f}")  # fmt: skip
    print(f"diagnostics: plain + chunk annotations (no plugin) {med['annotated']:.1f} us per task; "
          f"idle scheduler CPU {statistics.median(idle['plugin']):.1f} ms/s with the plugin vs "
          f"{statistics.median(idle['plain']):.1f} ms/s plain; chunk batch wall "
          f"{statistics.median(walls['chunk']):.2f} s")  # fmt: skip
    by_hook = {k: v / (args.tasks * (args.rounds + 1)) * 1e6 for k, v in hs.items()}
    print(f"inside the plugin's hooks and stealing policy: {statistics.median(hooks):.1f} us per task ("
          + ", ".join(f"{k} {v:.1f}" for k, v in sorted(by_hook.items())) + ")")  # fmt: skip
    out = Path(args.out)
    write_json(
        str(out / "scheduler_overhead.json"),
        config=vars(args),
        results={
            "headline": head,
            "us_per_task": results,
            "median_us_per_task": med,
            "overhead_per_round": overheads,
            "hook_us_per_task": hooks,
            "hook_us_per_task_by_hook": by_hook,
        },
    )
    fig, ax = pyplot().subplots(figsize=(6, 4))
    for i, (m, v) in enumerate(results.items()):
        ax.scatter([i] * len(v), v, label=m)
        ax.hlines(med[m], i - 0.2, i + 0.2)
    ax.set_xticks(range(len(results)), list(results))
    ax.set_ylabel("scheduler CPU per task [us]")
    ax.set_title(f"{args.tasks} tasks x {args.rounds} rounds, {args.workers} workers: "
                 f"chunk vs plain restricted {o['median']:+.1%}")  # fmt: skip
    save_png(fig, str(out / "scheduler_overhead.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
