"""Generate a NanoAOD-like benchmark dataset (see :mod:`testbed.synthetic`).

    python benchmarks/make_dataset.py OUTDIR --events 200000 --files 8 \\
        [--codec lzma] [--level 9] [--seed 0] [--jitter 0.02] [--template PATH] \\
        [--branches 'Muon_*' ...] [--read-speed]

Writes OUTDIR/nano_000.root ... with a progress bar and prints a summary: files, events,
branches, bytes on disk, compression ratio (uncompressed bytes of the baskets / file bytes),
time, and the generation speed. ``--jitter 0`` writes exact copies of template events (no float
jitter, template event numbers). ``--read-speed`` also times single-threaded uproot reads of
every branch of the first file (page cache warm, no array cache): ``arrays(library="np")``,
where building one numpy array per event of a jagged branch costs as much as decompressing, and
``arrays(library="ak")``, closer to the decompression speed; both in MB/s of decompressed
baskets per second of CPU time.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path

import uproot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import synthetic_module  # noqa: E402  (the generator's one import)

_synthetic = synthetic_module()
CODECS = _synthetic.CODECS
DEFAULT_JITTER = _synthetic.DEFAULT_JITTER
MAX_JITTER = _synthetic.MAX_JITTER
TREE_NAME = _synthetic.TREE_NAME
dataset_stats = _synthetic.dataset_stats
file_name = _synthetic.file_name
make_dataset = _synthetic.make_dataset


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Write NanoAOD-like ROOT files resampled from a real NanoAOD template.",
    )
    p.add_argument("outdir", type=Path, help="output directory (created if missing)")
    p.add_argument("--events", type=int, required=True, help="total number of events")
    p.add_argument("--files", type=int, default=1, help="number of files (default 1)")
    p.add_argument(
        "--codec",
        default="lzma",
        choices=[*sorted(CODECS), "none"],
        help="basket compression (default lzma, as CMS NanoAOD)",
    )
    p.add_argument(
        "--level",
        type=int,
        default=None,
        help="compression level (default: lzma 9, zlib 1, lz4 4, zstd 5)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument(
        "--jitter",
        type=float,
        default=DEFAULT_JITTER,
        metavar="SIGMA",
        help=f"relative jitter of floating-point values, 0..{MAX_JITTER}: each is multiplied "
        f"by 1 + N(0, SIGMA) and rounded to its branch's precision; event numbers are made "
        f"unique (default {DEFAULT_JITTER}; 0: exact copies of template events)",
    )
    p.add_argument(
        "--template",
        default=None,
        help="NanoAOD template file (default: $CACHEAFFINITY_NANOAOD_TEMPLATE or "
        "data/nanoaod/nano_dy.root of the repository)",
    )
    p.add_argument(
        "--branches",
        nargs="+",
        default=None,
        metavar="GLOB",
        help="keep only these branches (glob patterns; counters and run/luminosityBlock/event "
        "are kept automatically); default all",
    )
    p.add_argument(
        "--basket-events",
        type=int,
        default=None,
        help="events per basket (default: ~32 MiB per cluster, 1000..10000 events)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--read-speed",
        action="store_true",
        help="time single-threaded uproot reads of the first file (every branch; "
        'arrays(library="np") and arrays(library="ak"))',
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.verbose:
        logging.getLogger("cacheaffinity").setLevel(logging.DEBUG)

    codec = None if args.codec == "none" else args.codec
    start = time.perf_counter()
    try:
        paths = make_dataset(
            args.outdir,
            events=args.events,
            files=args.files,
            template=args.template,
            codec=codec,
            level=args.level,
            seed=args.seed,
            branches=args.branches,
            basket_events=args.basket_events,
            progress=not args.no_progress,
            jitter=args.jitter,
        )
    except (ValueError, TypeError, FileNotFoundError) as err:
        print(f"make_dataset.py: error: {err}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - start

    stats = dataset_stats(paths)
    summary = {
        "outdir": str(args.outdir),
        "codec": args.codec,
        "level": args.level if args.level is not None else (CODECS[codec][1] if codec else None),
        "seed": args.seed,
        "jitter": args.jitter,
        **stats,
        "seconds": round(elapsed, 2),
        "output_MB_per_s": round(stats["file_bytes"] / 1e6 / elapsed, 3),
        "uncompressed_MB_per_s": round(stats["uncompressed_bytes"] / 1e6 / elapsed, 3),
        "events_per_s": round(stats["events"] / elapsed, 1),
    }
    if args.read_speed and paths:
        for library in ("np", "ak"):
            summary.update(read_speed(paths[0], library))
    written = {Path(p).name for p in paths}
    stale = sorted(
        p.name for p in args.outdir.glob("nano_*.root") if p.name not in written
    )
    if args.json:
        print(json.dumps({**summary, "other_nano_files": stale}))
    else:
        mb = 1e6
        print(f"wrote {stats['files']} files to {args.outdir} ({file_name(0)} ...)")
        print(f"  events             {stats['events']:,}")
        print(f"  branches           {stats['branches']:,}")
        print(f"  codec              {summary['codec']} (level {summary['level']})")
        print(f"  jitter             {args.jitter:g}")
        print(f"  bytes on disk      {stats['file_bytes']:,} ({stats['file_bytes'] / mb:.1f} MB)")
        print(
            f"  uncompressed       {stats['uncompressed_bytes']:,} "
            f"({stats['uncompressed_bytes'] / mb:.1f} MB of baskets)"
        )
        print(f"  compression ratio  {stats['compression_ratio']:.2f}")
        print(
            f"  time               {elapsed:.1f} s ({summary['output_MB_per_s']:.2f} MB/s written, "
            f"{summary['uncompressed_MB_per_s']:.1f} MB/s uncompressed, "
            f"{summary['events_per_s']:,.0f} events/s)"
        )
        if args.read_speed and paths:
            for library in ("np", "ak"):
                print(
                    f"  read ({library})          {summary['read_uncompressed_MB']:.1f} MB of "
                    f"{Path(paths[0]).name} in {summary[f'read_{library}_cpu_seconds']:.2f} s cpu: "
                    f"{summary[f'read_{library}_cpu_MB_per_s']:.1f} MB/s decompressed per core "
                    f"({summary[f'read_{library}_wall_MB_per_s']:.1f} MB/s wall)"
                )
        if stale:
            print(
                f"  note: {len(stale)} other nano_*.root files in {args.outdir} are not part of "
                f"this dataset: {', '.join(stale[:5])}{' ...' if len(stale) > 5 else ''}"
            )
    return 0


def read_speed(path: str, library: str = "np", repeats: int = 2) -> dict[str, float]:
    """Single-threaded uproot read of every branch of ``path`` (``arrays(library=library)``,
    uproot's default serial decompression): decompressed basket bytes per second of CPU time and
    of wall time, best of ``repeats`` after a warm-up read (page cache warm, array cache off)."""
    with uproot.open(path, array_cache=None) as f:
        tree = f[TREE_NAME]
        uncompressed = sum(b.uncompressed_bytes for b in tree.branches)
        tree.arrays(library=library)  # warm-up: page cache, interpretations
        best_cpu = best_wall = math.inf
        for _ in range(repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            tree.arrays(library=library)
            best_wall = min(best_wall, time.perf_counter() - wall)
            best_cpu = min(best_cpu, time.process_time() - cpu)
    mb = uncompressed / 1e6
    return {
        "read_uncompressed_MB": round(mb, 3),
        f"read_{library}_cpu_seconds": round(best_cpu, 3),
        f"read_{library}_cpu_MB_per_s": round(mb / max(best_cpu, 1e-9), 2),
        f"read_{library}_wall_MB_per_s": round(mb / max(best_wall, 1e-9), 2),
    }


if __name__ == "__main__":
    sys.exit(main())
