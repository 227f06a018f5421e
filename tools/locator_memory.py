"""Memory of the scheduler's per-chunk map (``Locator.holder``).

A measurement script (not collected by pytest; runs in one process, no cluster).
It drives a real :class:`cacheaffinity.scheduler._locator.Locator` through the
life of N chunk tasks (tracked with their entry range, targeted, finished on a
node, forgotten by Dask; every ``--stolen-every``-th one processed away from its
target) and prints what tracemalloc sees allocated afterwards.  Chunk ids are
coffea stripe ids (``<uuid>/<tree>/s<S>:<k>``), ``--chunks-per-stripe`` tasks
per stripe (1: one holder entry per chunk, the most memory)::

    python tools/locator_memory.py --chunks 1000000 --stolen-every 10 --chunks-per-stripe 1
    python tools/locator_memory.py --chunks 1000000 --stolen-every 10 --chunks-per-stripe 2

Measured here (2026-11-23, shared 2-core machine), holders per entry range
(the locator on stripes), 10^6 chunks, 10% stolen: see the README
("Heterogeneous clusters") for the figures of the committed code.  Before:
with holders per chunk id: 74.1 MiB (78 B per chunk); OrderedDicts
``holder`` + ``located``: 136 MiB.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cacheaffinity.placement import TorusPlacement  # noqa: E402
from cacheaffinity.scheduler._locator import Locator  # noqa: E402
from cacheaffinity.scheduler._membership import Membership  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", type=int, default=100_000)
    ap.add_argument("--locator-size", type=int, default=2_000_000)
    ap.add_argument("--stolen-every", type=int, default=10,
                    help="every k-th chunk is processed off its target (0: none)")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--chunks-per-stripe", type=int, default=1,
                    help="chunk tasks sharing one stripe id (each with its own entry range)")
    args = ap.parse_args(argv)
    nodes = [f"node-{i:04d}" for i in range(args.nodes)]
    loc = Locator(Membership(), TorusPlacement(), size=args.locator_size)
    gc.collect()
    tracemalloc.start()
    every = args.stolen_every
    per = max(1, args.chunks_per_stripe)
    for i in range(args.chunks):
        key = ("process", i)
        j = i % 1000  # 1000 chunks of 1250 entries per file
        stripe = j // per
        chunk = f"uuid-{i // 1000:05d}.0123456789abcdef/Events/s{per * 1250}:{stripe}"
        loc.track(key, chunk, (j * 1250, (j + 1) * 1250))
        loc.set_target(key, nodes[(i // per) % args.nodes])
        stolen = bool(every) and i % every == 0
        if stolen:
            loc.note_steal(key)
        loc.finished(key, nodes[(i // per + stolen) % args.nodes])
        loc.forget_task(key)  # Dask forgets the task; the per-chunk memory stays
    current, peak = tracemalloc.get_traced_memory()
    ranged = sum(not isinstance(v, str) for v in loc.holder.values())
    print(f"chunks={args.chunks} chunks-per-stripe={per} stolen-every={every} "
          f"locator-size={args.locator_size} holder={len(loc.holder)} (with ranges: {ranged}) "
          f"current={current / 2**20:.1f} MiB "
          f"peak={peak / 2**20:.1f} MiB ({current / args.chunks:.0f} B per chunk)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
