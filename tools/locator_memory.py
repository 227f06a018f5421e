"""Memory of the scheduler's per-chunk map (``Locator.holder``).

A measurement script (not collected by pytest; runs in one process, no cluster).
It drives a real :class:`cacheaffinity.scheduler.locator.Locator` through the
life of N chunk tasks (tracked, targeted, finished on a node, forgotten by Dask;
every ``--stolen-every``-th one processed away from its target) and prints what
tracemalloc sees allocated afterwards::

    python tools/locator_memory.py --chunks 1000000 --stolen-every 10

Measured here (2026-11-23, shared 2-core machine), issue 15 (plain dict, 60-bit
digests, no second map for stolen chunks): 10^6 chunks: 74.1 MiB (78 B per chunk,
independent of how many were stolen); 3 x 10^6 chunks through a map of
``--locator-size 1000000``: 114.1 MiB, peak 152.8 MiB.  Before (OrderedDicts
``holder`` + ``located``): 136 MiB at 10^6 chunks with 10% stolen.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cacheaffinity.placement import TorusPlacement  # noqa: E402
from cacheaffinity.scheduler.locator import Locator  # noqa: E402
from cacheaffinity.scheduler.membership import Membership  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", type=int, default=100_000)
    ap.add_argument("--locator-size", type=int, default=2_000_000)
    ap.add_argument("--stolen-every", type=int, default=10,
                    help="every k-th chunk is processed off its target (0: none)")
    ap.add_argument("--nodes", type=int, default=1000)
    args = ap.parse_args(argv)
    nodes = [f"node-{i:04d}" for i in range(args.nodes)]
    loc = Locator(Membership(), TorusPlacement(), size=args.locator_size)
    gc.collect()
    tracemalloc.start()
    every = args.stolen_every
    for i in range(args.chunks):
        key = ("process", i)
        chunk = f"uuid-{i // 1000:05d}/%2FEvents%3B1/{(i % 1000) * 1250}-{(i % 1000 + 1) * 1250}"
        loc.track(key, chunk)
        loc.set_target(key, nodes[i % args.nodes])
        stolen = bool(every) and i % every == 0
        if stolen:
            loc.note_steal(key)
        loc.finished(key, nodes[(i + stolen) % args.nodes])
        loc.forget_task(key)  # Dask forgets the task; the per-chunk memory stays
    current, peak = tracemalloc.get_traced_memory()
    print(f"chunks={args.chunks} locator-size={args.locator_size} holder={len(loc.holder)} "
          f"current={current / 2**20:.1f} MiB "
          f"peak={peak / 2**20:.1f} MiB ({current / max(len(loc.holder), 1):.0f} B per chunk)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
