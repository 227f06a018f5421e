"""Benchmark: NanoAOD columns from uproot (decompressing) vs. from a ColumnCache.

Usage::

    python benchmarks/cache_read.py [--quick] [--out benchmarks/results]

What it does (single-threaded, one process):

1. Makes NanoAOD-like columns by resampling the events of a real NanoAOD file
   (``--source``, default ``nano_dy.root``): 6 jagged collections (Jet, Muon,
   Electron, Photon, Tau, GenPart) and event-level branches, ~55 branches in all.
   Each collection is resampled by event (its fields keep their per-event
   counts); floats get 2 % multiplicative noise and are rounded to 12 mantissa
   bits (NanoAOD's reduced precision); integer fields are drawn element by
   element from the source's values (40 source events copied verbatim would
   compress unrealistically well); event numbers are unique.
2. Writes them with uproot (``mktree`` + ``extend``, several baskets per branch)
   once per codec: LZMA(9), ZLIB(1), LZ4(1), ZSTD(5).  The files are kept in
   ``--work-dir`` and reused when the configuration is the same.
3. Per codec measures, in decompressed bytes per second (MB = 10**6 bytes):

   - **uproot**: open the file and read every branch
     (``TBranch.array(library="ak")`` with serial executors), file in the page
     cache (warm) and after dropping the page cache (cold);
   - **cache warm / cold**: ``ColumnCache.get`` of the same buffers (the
     ``ak.to_buffers`` buffers: data and int64 offsets, as coffea caches them),
     page cache warm, and after dropping it;
   - **first-run write overhead**: ``time(uproot read + store all buffers into an
     empty ColumnCache) / time(uproot read) - 1``, both times taken in the same
     run (median over runs; the JSON also has it from separate runs).  Dirty
     pages are written back by the kernel in the background, as they would be
     in a real run.

Read rates are the best of ``--repeat`` runs (for cache reads: the fastest
complete pass), the least disturbed by other processes on a shared machine,
after an untimed warm-up pass of each kind.  The JSON keeps every run and the
load average.  Cold reads drop the page cache with
``sync; echo 3 > /proc/sys/vm/drop_caches`` (needs root), else
``posix_fadvise(POSIX_FADV_DONTNEED)`` per file; the JSON says which worked.  Writes ``<out>/cache_read.json`` (configuration, machine,
results) and ``<out>/cache_read.png``, and prints a table.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import awkward as ak
import numpy as np
import uproot
import xxhash

from cacheaffinity import ColumnCache

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks._common import git_info, portable_path  # noqa: E402
from testbed.samples import sample  # noqa: E402

from benchmarks._cache_read_data import CODECS, COLLECTIONS, FLAT, GENERATOR_VERSION, MB, SERIAL, write_file  # noqa: E402,F401,E501
from benchmarks._cache_read_figures import plot, print_table  # noqa: E402


# --------------------------------------------------------------- reading
def chunk_key(file_uuid: str, branch: str, part: str, n_events: int) -> str:
    """A coffea-style buffer key."""
    return (
        f"{file_uuid}/%2FEvents%3B1/0-{n_events}/data/"
        f"{branch}%2C%21load%2C%21{part.replace('-', '%2D')}"
    )


def uproot_read(path: str, branches: list[str]) -> tuple[dict[str, np.ndarray], float]:
    """Open ``path`` and read+decompress every branch; (buffers by key, seconds)."""
    t0 = time.perf_counter()
    with uproot.open(path) as f:
        tree = f["Events"]
        n = tree.num_entries
        file_uuid = str(f.file.uuid)
        buffers = {}
        for b in branches:
            array = tree[b].array(library="ak", **SERIAL)
            _, _, parts = ak.to_buffers(array)
            for part, buf in parts.items():
                buffers[chunk_key(file_uuid, b, part, n)] = np.asarray(buf)
    return buffers, time.perf_counter() - t0


def cache_read(cache: ColumnCache, keys: list[str]) -> tuple[dict[str, np.ndarray], list[float]]:
    """``cache.get`` of every key; (buffers, seconds per get)."""
    out, times = {}, []
    for key in keys:
        t0 = time.perf_counter()
        value = cache.get(key)
        times.append(time.perf_counter() - t0)
        if value is None:
            raise RuntimeError(f"benchmark cache lost {key!r}: is it too small?")
        out[key] = value
    return out, times


#: ``cacheaffinity.worker.read`` settings whose pack reads are compared.
READS = ("map", "copy")
#: Group of the benchmark's chunk packs (one pack per codec file: all its buffers).
PACK_GROUP = "cache-read/Events"


def pack_read(cache: ColumnCache, keys: list[str], n: int) -> tuple[dict[str, np.ndarray], float]:
    """The chunk-pack read path: one ``get_packs`` (one index query, one verified
    read of one file) and a member lookup per buffer; (buffers, seconds)."""
    t0 = time.perf_counter()
    packs = cache.get_packs(PACK_GROUP, 0, n)
    members = packs[0].members if packs else {}
    out = {key: members.get(key) for key in keys}
    seconds = time.perf_counter() - t0
    if any(v is None for v in out.values()):
        raise RuntimeError("benchmark cache lost the pack: is it too small?")
    return out, seconds


def drop_page_cache(paths: list[str]) -> str | None:
    """Evict ``paths`` from the page cache; the method used, or None."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        pass
    try:
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "posix_fadvise(DONTNEED) per file"
    except (OSError, AttributeError):
        return None


def files_under(directory: str) -> list[str]:
    paths = glob.glob(os.path.join(directory, "**"), recursive=True)
    return [p for p in paths if os.path.isfile(p)]


# ------------------------------------------------------------- reporting
def machine_info(cache_dir: str) -> dict:
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            models = (line.split(":", 1)[1].strip() for line in f if "model name" in line)
            model = next(models, None)
    except OSError:
        pass
    fs = None
    try:
        with open("/proc/mounts") as f:
            mounts = [line.split() for line in f]
        real = os.path.realpath(cache_dir)
        best = max(
            (m for m in mounts if real == m[1] or real.startswith(m[1].rstrip("/") + "/")),
            key=lambda m: len(m[1]),
        )
        fs = f"{best[2]} ({best[0]} on {best[1]})"
    except (OSError, ValueError):
        pass
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "uproot": uproot.__version__,
        "awkward": ak.__version__,
        "xxhash": xxhash.VERSION,
        "cache_filesystem": fs,
    }


# ------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small data, one repetition (<1 min)")
    parser.add_argument("--out", default=os.path.join(here, "results"), help="output directory")
    parser.add_argument(
        "--source",
        default=None,
        help="NanoAOD file to resample (default: nano_dy.root of the repository's "
        "data/nanoaod/, or of $CACHEAFFINITY_NANOAOD_DIR)",
    )
    parser.add_argument(
        "--events", type=int, help="events to generate (default 120000, quick 10000)"
    )
    parser.add_argument(
        "--repeat", type=int, help="timed repetitions of each measurement (default 5, quick 2)"
    )
    parser.add_argument(
        "--work-dir",
        default=os.path.join(tempfile.gettempdir(), "cacheaffinity-bench"),
        help="where ROOT files (reused) and the cache directory live",
    )
    parser.add_argument("--codecs", default=",".join(CODECS), help="comma-separated subset")
    args = parser.parse_args(argv)
    if args.source is None:
        args.source = str(sample("nano_dy.root"))
    n_events = args.events or (10_000 if args.quick else 120_000)
    repeat = args.repeat or (2 if args.quick else 5)
    baskets = 4 if args.quick else 8
    seed = 42
    codecs = [c.strip() for c in args.codecs.split(",")]
    for c in codecs:
        if c not in CODECS:
            parser.error(f"unknown codec {c!r}; choose from {', '.join(CODECS)}")
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work_dir, exist_ok=True)
    started = time.time()
    load_start = os.getloadavg()

    # 1-2. data files (reused if present), written in parallel
    tag = hashlib.sha1(
        json.dumps(
            [GENERATOR_VERSION, args.source, n_events, seed, baskets, COLLECTIONS, FLAT]
        ).encode()
    ).hexdigest()[:10]
    paths = {
        c: os.path.join(
            args.work_dir, f"nano_{n_events}_{tag}_{c.replace('(', '').replace(')', '')}.root"
        )
        for c in codecs
    }
    todo = {c: p for c, p in paths.items() if not os.path.exists(p)}
    if todo:
        print(f"writing {len(todo)} file(s) of {n_events} events ...", flush=True)
        t0 = time.perf_counter()
        with concurrent.futures.ProcessPoolExecutor(max_workers=min(2, len(todo))) as pool:
            futures = [
                pool.submit(write_file, p, c, args.source, n_events, seed, baskets)
                for c, p in sorted(todo.items(), key=lambda cp: cp[0] != "LZMA(9)")
            ]
            for future in futures:
                future.result()
        print(f"  done in {time.perf_counter() - t0:.0f} s", flush=True)
    with uproot.open(paths[codecs[0]]) as f:
        branches = [b for b in f["Events"].keys()]

    cache_dir = os.path.join(args.work_dir, "cache")
    shutil.rmtree(cache_dir, ignore_errors=True)
    results: dict[str, dict] = {}
    drop_methods = set()
    buffer_sizes: list[int] = []
    for codec in codecs:
        path = paths[codec]
        print(f"{codec}: reading ...", flush=True)
        reference, _ = uproot_read(path, branches)  # warms the file's page cache
        keys = list(reference)
        nbytes = sum(b.nbytes for b in reference.values())
        buffer_sizes = sorted(b.nbytes for b in reference.values())
        # uproot, warm file, and first runs storing into an empty cache
        t_read, t_read_store, t_store, paired = [], [], [], []
        with ColumnCache(cache_dir, capacity="4 GiB") as cache:
            # Untimed warm-up store: the first touch of fresh memory in a VM
            # costs far more than in a worker that has been running a while.
            cache.update(reference)
            cache.clear()
            for _ in range(repeat):
                # Each timed run starts without dirty pages of the previous one
                # (its own are written back in the background, as in real life).
                os.sync()
                _, seconds = uproot_read(path, branches)
                t_read.append(seconds)
                cache.clear()
                os.sync()
                t0 = time.perf_counter()
                buffers, _ = uproot_read(path, branches)
                t1 = time.perf_counter()
                for key, value in buffers.items():
                    cache[key] = value
                t2 = time.perf_counter()
                t_read_store.append(t2 - t0)
                t_store.append(t2 - t1)
                paired.append((t2 - t1) / (t1 - t0))
            stored = cache.stats()["bytes_written"] // (repeat + 1)
            # warm cache reads (everything was just written: in the page cache)
            warm = []
            for i in range(repeat + 1):
                got, times = cache_read(cache, keys)
                if i == 0:  # first pass: check, and do not time
                    for key in keys:
                        if not np.array_equal(got[key], reference[key]):
                            raise RuntimeError(f"cache returned wrong data for {key!r}")
                    continue
                warm.append(times)
        # the chunk-pack path (layout 4): all buffers of the file as one pack
        n_entries = int(uproot.open(path)["Events"].num_entries)
        pack_paired, pack_warm = [], []
        with ColumnCache(cache_dir, capacity="4 GiB") as cache:
            cache.clear()
            for _ in range(repeat):
                cache.clear()
                os.sync()
                t0 = time.perf_counter()
                buffers, _ = uproot_read(path, branches)
                t1 = time.perf_counter()
                cache.put_pack(PACK_GROUP, 0, n_entries, buffers)
                t2 = time.perf_counter()
                pack_paired.append((t2 - t1) / (t1 - t0))
            pack_bytes = cache.info()["size"]
        # the pack read both ways (worker.read: map, the default of a private cache;
        # copy), alternating pass by pass
        pack_copies = {}
        caches = {m: ColumnCache(cache_dir, capacity="4 GiB", read=m) for m in READS}
        try:
            pack_warm = {m: [] for m in READS}
            for i in range(repeat + 1):
                for m, cache in caches.items():
                    got, seconds = pack_read(cache, keys, n_entries)
                    if i == 0:
                        for key in keys:
                            if not np.array_equal(got[key], reference[key]):
                                raise RuntimeError(f"pack returned wrong data for {key!r}")
                        continue
                    pack_warm[m].append(seconds)
                    del got
            for m, cache in caches.items():
                # bytes the store copied into a new buffer (mapped bytes are not copied)
                # per byte of the buffers served, over the repeat + 1 passes
                pack_copies[m] = cache.stats()["bytes_read"] / ((repeat + 1) * nbytes)
        finally:
            for cache in caches.values():
                cache.close()
        pack_cold = None
        if drop_page_cache(files_under(cache_dir)):
            with ColumnCache(cache_dir, capacity="4 GiB") as cache:
                _, pack_cold = pack_read(cache, keys, n_entries)
        # cold: page cache dropped (plain entries: one file per buffer)
        with ColumnCache(cache_dir, capacity="4 GiB") as cache:
            cache.clear()
            cache.update(reference)
        method = drop_page_cache(files_under(cache_dir))
        drop_methods.add(method)
        cold_times = None
        if method:
            with ColumnCache(cache_dir, capacity="4 GiB") as cache:
                _, cold_times = cache_read(cache, keys)
        uproot_cold = None
        if drop_page_cache([path]):
            _, uproot_cold = uproot_read(path, branches)
        with ColumnCache(cache_dir, capacity="4 GiB") as cache:
            cache.clear()

        big = [i for i, k in enumerate(keys) if reference[k].nbytes >= 2**20]
        big_bytes = sum(reference[keys[i]].nbytes for i in big)
        warm_best = min(warm, key=sum)  # the fastest complete pass
        r = {
            "file_bytes": os.path.getsize(path),
            "decompressed_bytes": nbytes,
            "buffers": len(keys),
            "uproot_warm_s": min(t_read),
            "uproot_warm_MBps": nbytes / min(t_read) / MB,
            "uproot_cold_s": uproot_cold,
            "uproot_cold_MBps": nbytes / uproot_cold / MB if uproot_cold else None,
            "cache_warm_s": sum(warm_best),
            "cache_warm_MBps": nbytes / sum(warm_best) / MB,
            "cache_warm_multiMB_MBps": (
                big_bytes / sum(warm_best[i] for i in big) / MB if big else None
            ),
            "cache_cold_s": sum(cold_times) if cold_times else None,
            "cache_cold_MBps": nbytes / sum(cold_times) / MB if cold_times else None,
            "cache_cold_multiMB_MBps": (
                big_bytes / sum(cold_times[i] for i in big) / MB if cold_times and big else None
            ),
            "first_run_read_s": min(t_read),
            "first_run_read_store_s": min(t_read_store),
            # time(uproot + store) / time(uproot) - 1, both times from the same run
            "write_overhead": statistics.median(paired),
            "write_overhead_all": paired,
            # the same from separate runs (noisier on a shared machine)
            "write_overhead_separate_best": min(t_read_store) / min(t_read) - 1,
            "write_overhead_separate_median": (
                statistics.median(t_read_store) / statistics.median(t_read) - 1
            ),
            "store_s": min(t_store),
            "store_MBps": stored / min(t_store) / MB,
            "bytes_stored_per_run": stored,
            "t_read_all": t_read,
            "t_read_store_all": t_read_store,
            "t_store_all": t_store,
        }
        r.update({
            # one entry per buffer (one index row, one file, one digest each): the read
            # path of layout 3, priced per column
            "entry_us_per_lookup": 1e6 * sum(warm_best) / len(keys),
            # chunk packs (layout 4): one row, one file, one digest for all buffers;
            # mapped (worker.read: map, the default), and copied (worker.read: copy)
            "pack_warm_s": min(pack_warm["map"]),
            "pack_warm_MBps": nbytes / min(pack_warm["map"]) / MB,
            "pack_us_per_lookup": 1e6 * min(pack_warm["map"]) / len(keys),
            "pack_copy_warm_s": min(pack_warm["copy"]),
            "pack_copy_warm_MBps": nbytes / min(pack_warm["copy"]) / MB,
            "pack_copy_us_per_lookup": 1e6 * min(pack_warm["copy"]) / len(keys),
            "pack_warm_all": pack_warm,
            "pack_cold_s": pack_cold,
            "pack_cold_MBps": nbytes / pack_cold / MB if pack_cold else None,
            "pack_write_overhead": statistics.median(pack_paired),
            "pack_write_overhead_all": pack_paired,
            "pack_bytes_on_disk": pack_bytes,
            # measured: the store's bytes_read over the bytes served (members are views)
            "pack_bytes_copied_per_byte_served": pack_copies["map"],
            "pack_copy_bytes_copied_per_byte_served": pack_copies["copy"],
        })
        r["ratio_warm"] = r["cache_warm_MBps"] / r["uproot_warm_MBps"]
        r["ratio_cold"] = (
            r["cache_cold_MBps"] / r["uproot_warm_MBps"] if r["cache_cold_MBps"] else None
        )
        results[codec] = r

    # targets, reported as measured
    lines = [
        f"{n_events} events, {len(branches)} branches, {len(buffer_sizes)} buffers, "
        f"{sum(buffer_sizes) / MB:.1f} MB decompressed; buffer sizes: median "
        f"{statistics.median(buffer_sizes) / MB:.2f} MB, max {buffer_sizes[-1] / MB:.1f} MB, "
        f"{100 * sum(b for b in buffer_sizes if b >= 2**20) / sum(buffer_sizes):.0f} % of bytes "
        f"in buffers >= 1 MiB",
        "page cache dropped with: "
        + ", ".join(sorted(m or "nothing (not permitted)" for m in drop_methods)),
        "ratios divide cache MB/s by uproot warm-file MB/s; first-run overhead = "
        "time(uproot + store) / time(uproot) - 1 within one run, median over runs",
        f"load average (1 min) at start / end: {load_start[0]:.2f} / {os.getloadavg()[0]:.2f} "
        f"on {os.cpu_count()} cores",
    ]
    targets = {}
    warm_multi = [
        r["cache_warm_multiMB_MBps"] for r in results.values() if r["cache_warm_multiMB_MBps"]
    ]
    if warm_multi:
        targets["cache_warm_multiMB_at_least_1GBps"] = min(warm_multi) >= 1000
        lines.append(
            f"target: warm cache >= 1 GB/s for buffers >= 1 MiB: "
            f"{min(warm_multi) / 1000:.2f} GB/s (worst codec run) -> "
            f"{'met' if targets['cache_warm_multiMB_at_least_1GBps'] else 'NOT met'}"
        )
    if "LZMA(9)" in results:
        ratio = results["LZMA(9)"]["ratio_warm"]
        targets["lzma_ratio_at_least_50"] = ratio >= 50
        lines.append(
            f"target: cache >= 50x uproot on LZMA(9): {ratio:.0f}x warm"
            + (
                f", {results['LZMA(9)']['ratio_cold']:.0f}x cold"
                if results["LZMA(9)"]["ratio_cold"]
                else ""
            )
            + f" -> {'met' if ratio >= 50 else 'NOT met'}"
        )
    over = {c: r["write_overhead"] for c, r in results.items()}
    targets["write_overhead_at_most_10pct"] = {c: v <= 0.10 for c, v in over.items()}
    lines.append(
        "target: first-run write overhead <= 10 % (median over runs; [min, max]; "
        "from separate best runs):"
    )
    for c, v in over.items():
        r = results[c]
        lines.append(
            f"  {c:<8} {100 * v:5.1f} % [{100 * min(r['write_overhead_all']):.1f}, "
            f"{100 * max(r['write_overhead_all']):.1f}]; "
            f"{100 * r['write_overhead_separate_best']:.1f} % -> "
            f"{'met' if v <= 0.10 else 'NOT met'}"
        )
    lines.append(
        "read path per column lookup, warm (plain entries -> chunk pack copied -> chunk pack "
        "mapped), GB/s, bytes copied per byte served (copied / mapped pack):"
    )
    for c, r in results.items():
        lines.append(
            f"  {c:<8} {r['entry_us_per_lookup']:6.1f} -> {r['pack_copy_us_per_lookup']:6.1f} -> "
            f"{r['pack_us_per_lookup']:6.1f} us per lookup; {r['cache_warm_MBps'] / 1000:5.2f} -> "
            f"{r['pack_copy_warm_MBps'] / 1000:5.2f} -> {r['pack_warm_MBps'] / 1000:5.2f} GB/s; "
            f"{r['pack_copy_bytes_copied_per_byte_served']:.2f} / "
            f"{r['pack_bytes_copied_per_byte_served']:.2f} bytes copied per byte served; pack "
            f"first-run write overhead {100 * r['pack_write_overhead']:.1f} %"
        )
    summary = {"lines": lines, "targets": targets}
    print()
    print_table(results, summary)

    report = {
        "benchmark": "cache_read",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": time.time() - started,
        "config": {
            "quick": args.quick,
            "source": portable_path(args.source),
            "events": n_events,
            "baskets_per_branch": baskets,
            "repeat": repeat,
            "seed": seed,
            "codecs": codecs,
            "branches": branches,
            "buffers": len(buffer_sizes),
            "decompressed_bytes": sum(buffer_sizes),
            "threads": 1,
            "cache_dir": portable_path(cache_dir),
            "page_cache_drop": sorted(m or "not permitted" for m in drop_methods),
            "MB": "10**6 bytes",
            "timing": "best of `repeat` runs after a warm-up (cache reads: fastest pass)",
            "loadavg_start": load_start,
            "loadavg_end": os.getloadavg(),
        },
        "machine": machine_info(cache_dir),
        **{k: v for k, v in git_info().items()},
        "results": results,
        "summary": summary,
    }
    json_path = os.path.join(args.out, "cache_read.json")
    with open(json_path, "w") as f:
        json.dump(report, f, indent=1)
    png_path = os.path.join(args.out, "cache_read.png")
    plot(results, png_path)
    print(f"\nwrote {json_path} and {png_path} ({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
