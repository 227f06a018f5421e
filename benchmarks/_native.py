"""coffea's own column cache for the ``coffea-native`` mode of the benchmarks (runs in workers).

What a coffea user builds without cacheaffinity (coffea >= 2026.3):
``DaskExecutor(worker_affinity=True)`` (``hash % n_workers``, strict restrictions) and
``Runner(cachestrategy=functools.partial(buffer_cache, variant))``, a
:func:`coffea.nanoevents.BufferCache` over ``zict.File`` in the worker's local directory
(``distributed.get_worker().local_directory``), as the BufferCache docstring recommends.

coffea calls the cache strategy once per chunk.  A BufferCache keeps each buffer's dtype
and shape in a dict of its own (``meta``), in memory: a second instance over the same
directory cannot decode what the first stored (its lookups miss and rewrite the file).
So :func:`buffer_cache` builds **one BufferCache per worker process** and returns it for
the process's lifetime.

Variants (``variant``; ``--native-variant`` of benchmarks/consecutive_runs.py):

``file`` (default)
    ``BufferCache(zict.File(dir), NoCompressionCodec())``: raw buffers, one file each.
``blosc-zstd``
    ``BufferCache(zict.File(dir), Blosc("zstd", clevel=1, shuffle=Blosc.BITSHUFFLE))``,
    the codec of the BufferCache docstring's examples; needs ``numcodecs``.
``memory+file``
    ``BufferCache(zict.Buffer(fast={}, slow=zict.File(dir), n=MEMORY_BYTES,
    weight=len), NoCompressionCodec())``: the docstring's hierarchical example, a memory
    front of :data:`MEMORY_BYTES` per worker process over the same files.

Measured here (2 cores shared with other developers' tests, load average 8-13 during the
runs), realistic analysis, ``--storage local --events 20000 --files 2 --chunksize 5000
--workers 2 --runs 3 --modes coffea-native cacheaffinity --no-floors``, two invocations per
variant, interleaved; warm runs (2 and 3) in seconds, and coffea-native / cacheaffinity of
the same run and invocation:

=============  ===========================  ==============================
variant        warm runs, s                 warm run / cacheaffinity's
=============  ===========================  ==============================
file           8.30, 11.62, 16.07, 9.65     0.98, 2.13, 2.88, 0.90
blosc-zstd     9.26, 12.67, 20.76, 9.84     1.73, 2.81, 4.50, 5.21
memory+file    32.92, 35.61, 16.79, 11.35   1.42, 1.59, 2.23, 4.57
=============  ===========================  ==============================

The load made these runs too scattered to rank the variants.  In isolation (one process,
every buffer of one realistic 5,000-event chunk, 183 buffers, 9.5 MB, read back through
each variant from a warm page cache, min of 7 passes): file 3.5 ms, blosc-zstd 21.9 ms,
memory+file 0.3 ms (a dict: 0.1 ms); writing them: 23, 60, 5 ms.  Against a warm chunk of
~1-2 s (coffea reopens the file and rebuilds the form for every chunk: coffea-native's run 2
still reads ~0.9 MB of ROOT metadata per chunk from storage), neither variant's gain is
visible in a run, so the default stays ``file``, the plain on-disk setup the BufferCache
docstring recommends; ``blosc-zstd`` is slower to read (decompression), ``memory+file`` faster
by ~3 ms per chunk here, and possibly more where the page cache does not hold the files
(not measured: a full-size run on a quiet machine would tell).  ``zict.File(memmap=True)``
is not offered: it fails on an empty buffer (``ValueError: cannot mmap an empty file``).

Counting: the mapping returned wraps the BufferCache in :class:`CountedBufferCache`, which
only counts (``get`` found / not found, bytes stored) so that the benchmark can report a
hit rate as for the other cached modes (one ``try``/``except`` and an integer addition per
lookup); :func:`stats` returns the counts of this process.

Notes
-----
Benchmarks only: nothing bounds the cache's size (zict.File has no eviction); zict.File
writes straight to the final file name and nothing checks the bytes read back.  The files
live in the worker's local directory, which the worker removes when it closes: after a
worker restart nothing of this cache is readable (and a new process's BufferCache could
not decode the files even if they were there).  The mapping is not thread-safe beyond what
zict gives; the benchmark's workers have one thread each.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, MutableMapping
from typing import Any

#: the variants :func:`buffer_cache` builds
VARIANTS = ("file", "blosc-zstd", "memory+file")
#: memory front of the ``memory+file`` variant, bytes per worker process
MEMORY_BYTES = 512 * 2**20
#: sub-directory of the worker's local directory that holds the files
SUBDIR = "coffea-buffer-cache"

_CACHE: CountedBufferCache | None = None
_VARIANT: str | None = None


class CountedBufferCache(MutableMapping):
    """A coffea BufferCache that counts its lookups (``hits``, ``misses``) and the bytes
    of the arrays stored (``bytes_written``, ``writes``); otherwise it only delegates."""

    def __init__(self, inner: MutableMapping, directory: str):
        self.inner = inner
        self.directory = directory
        self.hits = self.misses = self.writes = self.bytes_written = 0

    def get(self, key, default=None):
        try:
            value = self.inner[key]
        except KeyError:
            self.misses += 1
            return default
        self.hits += 1
        return value

    def __getitem__(self, key):
        return self.inner[key]

    def __setitem__(self, key, value) -> None:
        self.inner[key] = value
        self.writes += 1
        self.bytes_written += int(getattr(value, "nbytes", 0))

    def __delitem__(self, key) -> None:
        del self.inner[key]

    def __iter__(self) -> Iterator:
        return iter(self.inner)

    def __len__(self) -> int:
        return len(self.inner)


def _build(variant: str, directory: str) -> MutableMapping:
    import zict
    from coffea.nanoevents import BufferCache

    try:
        from coffea.nanoevents.mapping.buffer_cache import NoCompressionCodec
    except ImportError:  # pragma: no cover - coffea < 2026.3
        raise RuntimeError(
            "coffea-native needs coffea >= 2026.3 (coffea.nanoevents.BufferCache): "
            "pip install 'coffea>=2026.3'"
        ) from None
    if variant == "file":
        return BufferCache(cache=zict.File(directory), codec=NoCompressionCodec())
    if variant == "blosc-zstd":
        try:
            from numcodecs import Blosc
        except ModuleNotFoundError:
            raise RuntimeError(
                "--native-variant blosc-zstd needs numcodecs: pip install numcodecs"
            ) from None
        codec = Blosc("zstd", clevel=1, shuffle=Blosc.BITSHUFFLE)
        return BufferCache(cache=zict.File(directory), codec=codec)
    if variant == "memory+file":
        cache = zict.Buffer(fast={}, slow=zict.File(directory), n=MEMORY_BYTES,
                            weight=lambda k, v: len(v))  # fmt: skip
        return BufferCache(cache=cache, codec=NoCompressionCodec())
    raise ValueError(f"coffea-native variant={variant!r}: choose from {', '.join(VARIANTS)}")


def buffer_cache(variant: str = "file") -> CountedBufferCache:
    """``Runner(cachestrategy=functools.partial(buffer_cache, variant))``: this worker
    process's one BufferCache, built on first use in ``<local_directory>/`` :data:`SUBDIR`."""
    global _CACHE, _VARIANT
    if _CACHE is None:
        from distributed import get_worker

        directory = os.path.join(get_worker().local_directory, SUBDIR)
        _CACHE, _VARIANT = CountedBufferCache(_build(variant, directory), directory), variant
    elif variant != _VARIANT:
        raise RuntimeError(
            f"this worker's coffea BufferCache is variant {_VARIANT!r}, asked for {variant!r}: "
            "one variant per worker process (start a new cluster)"
        )
    return _CACHE


def stats() -> dict[str, Any]:
    """This process's counts: ``hits``, ``misses``, ``writes``, ``bytes_written``,
    ``entries`` (buffers stored), ``files`` and ``file_bytes`` (in its directory), and
    ``directory`` (None before the first :func:`buffer_cache`)."""
    c = _CACHE
    if c is None:
        return {"hits": 0, "misses": 0, "writes": 0, "bytes_written": 0, "entries": 0,
                "files": 0, "file_bytes": 0, "directory": None}  # fmt: skip
    names = os.listdir(c.directory) if os.path.isdir(c.directory) else []
    size = 0
    for n in names:
        try:
            size += os.stat(os.path.join(c.directory, n)).st_size
        except FileNotFoundError:
            pass
    return {"hits": c.hits, "misses": c.misses, "writes": c.writes,
            "bytes_written": c.bytes_written, "entries": len(c), "files": len(names),
            "file_bytes": size, "directory": c.directory}  # fmt: skip
