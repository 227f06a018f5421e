"""Where the scheduler spends its CPU on chunk tasks: cProfile of the scheduler process.

A diagnostic beside ``scheduler_overhead.py`` (which measures the headline): the same
two clusters (real ``dask scheduler`` + ``dask worker`` processes, one plain, one with
``--preload cacheaffinity``), the same ``chunk`` and ``plain`` batches; around one
batch of each, the scheduler's event-loop thread runs under :mod:`cProfile` (switched
on and off with ``client.run_on_scheduler``, which runs on that thread), from
submission until the released batch is forgotten.  Prints, per
mode, the profiled scheduler CPU per task and the functions with the most own time,
then the cumulative time per task of cacheaffinity's hooks, and of the scheduler's
``_apply_annotations`` (where per-task annotations are processed) in both modes.

cProfile slows Python calls down by a roughly constant factor, so compare the modes
with each other, not with ``scheduler_overhead.py``'s figures.

    python benchmarks/scheduler_profile.py [--tasks 10000] [--rounds 2] [--top 25]

Writes ``<out>/scheduler_profile.json`` (per mode: total and per-function seconds).
"""

from __future__ import annotations

import argparse
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import write_json  # noqa: E402
from benchmarks.scheduler_overhead import (  # noqa: E402
    placement_by_index,
    run_chunk,
    run_plain,
    start_cluster,
    wait_forgotten,
)

def _profile_start(dask_scheduler=None) -> None:
    import cProfile

    # kept on the scheduler object: this module is pickled by value (``__main__``)
    p = dask_scheduler._cacheaffinity_profiler = cProfile.Profile()
    p.enable()


def _profile_stop(dask_scheduler=None) -> dict:
    """Stop the profiler; ``{"total": s, "functions": {name: [own s, cumulative s, calls]}}``."""
    p = dask_scheduler._cacheaffinity_profiler
    p.disable()
    del dask_scheduler._cacheaffinity_profiler
    st = pstats.Stats(p)
    funcs = {}
    for (file, line, name), (cc, nc, tt, ct, _) in st.stats.items():
        funcs[f"{Path(file).name}:{line}:{name}"] = [tt, ct, nc]
    return {"total": st.total_tt, "functions": funcs}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=2, help="profiled batches per mode")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", default="/tmp")
    args = p.parse_args(argv)
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="ca-profile-"))
    clusters = {
        "plain": start_cluster(tmp, "plain", args.workers, preload=False),
        "plugin": start_cluster(tmp, "plugin", args.workers, preload=True),
    }
    out: dict = {}
    try:
        ca_client = clusters["plugin"][0]
        for r in range(args.rounds + 1):  # round 0 warms up, unprofiled
            chunks = [f"uuid-p{r}-{i // 100}/Events/{i % 100}" for i in range(args.tasks)]
            placement = placement_by_index(ca_client, chunks)
            for mode, run in (("chunk", run_chunk), ("plain", run_plain)):
                client = clusters["plugin" if mode == "chunk" else "plain"][0]
                if r:
                    client.run_on_scheduler(_profile_start)
                futs = run(client, chunks, placement)
                del futs
                wait_forgotten(client)  # the release counts, as in scheduler_overhead.py
                if r:
                    res = client.run_on_scheduler(_profile_stop)
                    acc = out.setdefault(mode, {"total": 0.0, "functions": {}})
                    acc["total"] += res["total"]
                    for k, v in res["functions"].items():
                        a = acc["functions"].setdefault(k, [0.0, 0.0, 0])
                        for i in range(3):
                            a[i] += v[i]
    finally:
        for client, procs in clusters.values():
            client.close()
            for pr in procs[::-1]:
                pr.terminate()
                pr.wait(30)
    n = args.tasks * args.rounds
    for mode, acc in out.items():
        print(f"\n== {mode}: {acc['total'] / n * 1e6:.1f} us profiled scheduler CPU per task")
        top = sorted(acc["functions"].items(), key=lambda kv: -kv[1][0])[: args.top]
        for name, (tt, ct, nc) in top:
            print(f"  own {tt / n * 1e6:7.2f}  cum {ct / n * 1e6:7.2f} us/task  "
                  f"{nc / n:6.2f} calls/task  {name}")  # fmt: skip
    print("\ncumulative us/task of selected functions (chunk | plain):")
    keys = ("plugin.py", "_apply_annotations", "_generate_taskstates", "update_graph",
            "stealing.py", "locator.py", "client.py", "transitions", "valid_workers")  # fmt: skip
    names = sorted(
        {k for acc in out.values() for k in acc["functions"] if any(s in k for s in keys)}
    )
    for k in names:
        v = [out.get(m, {}).get("functions", {}).get(k, [0, 0, 0])[1] / n * 1e6
             for m in ("chunk", "plain")]  # fmt: skip
        if max(v) >= 0.2:
            print(f"  {v[0]:7.2f} | {v[1]:7.2f}  {k}")
    write_json(str(Path(args.out) / "scheduler_profile.json"), config=vars(args), results=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
