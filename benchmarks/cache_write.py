"""Cost of cache writes inside a task: inline vs. behind the task.

Runs in one process on a real cache directory: stores the arrays of one chunk
(``--arrays`` float32 arrays of ``--entries`` entries, about what the
realistic analysis stores per chunk) into a fresh :class:`ColumnCache` with
``write_queue=0`` (inline: checksum, file write, rename and one index
transaction per array, in ``__setitem__``) and with the default queue (the
task only queues; the writer thread batches the index transactions), repeats
interleaved.  Reports the median time spent in ``__setitem__`` (what the task
waits for) and until everything is stored (``flush``).

    python benchmarks/cache_write.py --out /tmp/results
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks._common import parser, write_json  # noqa: E402
from cacheaffinity import config  # noqa: E402
from cacheaffinity.worker._store import ColumnCache  # noqa: E402


def main(argv=None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--arrays", type=int, default=300)
    p.add_argument("--entries", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    if args.quick:
        args.arrays, args.repeats = 50, 2
    queue = config.get_bytes("worker.write-queue")
    rng = np.random.default_rng(0)
    arrays = [rng.random(args.entries).astype(np.float32) for _ in range(args.arrays)]
    times: dict[str, list] = {"inline": [], "queued": []}
    root = tempfile.mkdtemp(prefix="ca-write-")
    try:
        for rep in range(args.repeats):
            for mode, wq in (("inline", 0), ("queued", queue)):
                cache = ColumnCache(os.path.join(root, f"{mode}{rep}"), "1 GiB", write_queue=wq)
                t0 = time.perf_counter()
                for i, a in enumerate(arrays):
                    cache[f"k{i}"] = a
                task = time.perf_counter() - t0
                assert cache.flush(timeout=600)
                total = time.perf_counter() - t0
                assert len(cache) == args.arrays
                cache.close()
                times[mode].append({"task_s": task, "stored_s": total})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = {
        mode: {k: statistics.median(r[k] for r in rows) for k in ("task_s", "stored_s")}
        for mode, rows in times.items()
    }
    for mode, s in summary.items():
        print(
            f"{mode:7s} in task {s['task_s'] * 1e3:7.1f} ms, until stored "
            f"{s['stored_s'] * 1e3:7.1f} ms  (median of {args.repeats}; {args.arrays} "
            f"arrays of {args.entries} float32)"
        )
    ratio = summary["inline"]["task_s"] / summary["queued"]["task_s"]
    print(f"in-task write time, inline / queued: {ratio:.1f}x")
    config_doc = {"arrays": args.arrays, "entries": args.entries, "repeats": args.repeats,
                  "write_queue": queue}  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "cache_write.json"), config_doc, times, summary=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
