"""Synthetic NanoAOD-like ROOT files for tests, the demo and benchmarks.

:func:`make_dataset` writes ``files`` ROOT files holding ``events`` events in total, each with a
TTree ``Events`` whose branch list, dtypes and value distributions are those of a real NanoAOD
*template* file. Events are resampled whole, with replacement: every output event is a copy of
one randomly drawn template event, all of its branches, with each jagged collection (``Muon_*``
and its counter ``nMuon``, ...) copied together so that counters and collections stay consistent.
By default (``jitter``) floating-point values then get a small random relative change (sigma 2 %)
and are rounded to the template's precision of their branch, so that generated baskets do not
repeat the template's few value sequences (see "Compression" below); integers, bools, counters,
indices and special float values are copied exactly, so per-event physics stays that of the
template (the Z peak, multiplicities, flags, leading objects). ``jitter=0`` copies events
exactly.

Layout, as CMS NanoAOD:

* TTrees written with ``uproot`` ``mktree`` + ``extend`` (``file["Events"] = dict`` would write
  an RNTuple), one ``extend`` per basket cluster of ``basket_events`` events, so every branch has
  ``ceil(entries / basket_events)`` baskets;
* jagged collections become a counter ``n<Collection>`` and branches ``<Collection>_<field>``
  (a collection without fields, e.g. ``LHEPdfWeight``, is the branch ``LHEPdfWeight`` with counter
  ``nLHEPdfWeight``), so that coffea's ``NanoAODSchema`` builds ``events.Muon.pt`` etc.;
* LZMA level 9 by default (the NanoAOD setting); ZLIB, LZ4, ZSTD or uncompressed on request.

Differences from a file written by CMSSW that a reader can see:

* counters are ``int32`` (uproot always writes its generated counters so); NanoAOD's are
  ``uint32``. Every other branch has the template's dtype;
* string and other non-numeric template branches are left out (NanoAOD has none in ``Events``);
  so is the ``Runs`` tree;
* ``run``/``luminosityBlock`` are the template event's; ``event`` numbers the events of the
  dataset 1, 2, ... (unique), or, with ``jitter=0``, is the template's (so event numbers repeat).

Determinism: the event content depends only on (template, branches, events, files, seed,
jitter): the same arguments give equal arrays in every file, whatever ``codec``, ``level``,
``basket_events`` or ``progress``. The file *bytes* differ between two writes, because every
ROOT file gets a new random UUID and the TKeys carry the write time: that is wanted, since the
file UUID is part of a cached chunk's identity. Different files of one dataset, and different
seeds, draw different events. With ``branches=[...]`` a file holds the same events as the full
file of the same arguments, restricted to those branches (jittered alike). The events drawn do
not depend on ``jitter``: ``jitter=0`` gives the same events, unjittered.

Compression: a template holds few events (40 in ``nano_dy.root``), so exact copies repeat the
same few value sequences many times, and a compressor with a long window (LZMA above all) finds
those repeats. Without jitter, generated data compress far better than real NanoAOD: 20,000
events from ``nano_dy.root`` give a whole-file ratio of about 12 with LZMA-9 and 6 with ZLIB-1
(single columns: ``Jet_pt`` 11.5 with LZMA against 1.5 to 2 for the template's own events,
``GenPart_pt`` 34 against 2.3 to 2.6), and LZMA decompresses them faster per decompressed byte
than real NanoAOD. A larger template (``nano_tt_v15.root``, 200 events) helps little. The
default jitter (sigma 0.02) breaks the repeats of floating-point values, which hold most of the
bytes: the same file compresses by about 5.7 with LZMA-9 and 3.5 with ZLIB-1, and its float
columns compress and decompress like real ones (same number of values, LZMA-9: ``Jet_pt`` 2.1,
``Jet_eta`` 1.6, ``GenPart_pt`` 3.0 against 2.1, 1.6, 2.6 for ``nano_tt_v15.root``'s own
events; liblzma decompresses the float columns at 31 MB/s of output per core against 36 for
the real ones, 56 without jitter). What keeps the whole-file ratio above real NanoAOD's (2 to
4) are the exactly copied integers and bools, nearly half of the uncompressed bytes of
``nano_dy.root`` events: their per-event sequences (ids, pdgIds, flags, indices) repeat, and
LZMA-9 compresses them by about 15 in baskets of 8,000 events (real NanoAOD columns of 200
events: 4 to 7). Use :func:`dataset_stats` to measure the ratio of a generated dataset.

Speed (2 cores, one used; ~1500 branches of ``nano_dy.root``): LZMA-9 fills about 500 to 600
events/s (3 MB/s of uncompressed baskets, 0.2 to 0.3 MB/s written); ZLIB-1, ZSTD-5 and LZ4 fill
12,000 to 30,000 events/s. On top, uproot's ``mktree`` costs about 6 s per file with 1500
branches (it grows with the square of the branch count); few-branch test files are fast. These
are without jitter; jitter itself costs about 20 us of CPU per event of all branches, and the
less repetitive data take the compressors longer: LZMA-9 and ZLIB-1 need 20 to 30 % more CPU.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path

import awkward as ak
import numpy as np
import uproot

from testbed.jitter import _INNER_BITS, _Jitter, _jitter_specs, _mantissa_bits, _round_mantissa  # noqa: F401
from testbed.nanoaod_template import (  # noqa: F401  (re-exported: the template's names)
    TEMPLATE_ENV,
    TREE_NAME,
    Template,
    _Collection,
    _Plan,
    default_template_path,
    load_template,
    resolve_template,
)

__all__ = [
    "CODECS",
    "DEFAULT_JITTER",
    "EVENT_ID_BRANCHES",
    "MAX_JITTER",
    "TEMPLATE_ENV",
    "TREE_NAME",
    "Template",
    "dataset_stats",
    "default_template_path",
    "file_name",
    "load_template",
    "make_dataset",
    "resolve_template",
]

logger = logging.getLogger(__name__)


#: codec name -> (uproot compression class, default level, (lowest, highest) level).
#: Defaults: LZMA 9 as CMS writes NanoAOD; ZLIB 1, LZ4 4 and ZSTD 5 as ROOT's own defaults
#: (compression settings 101, 404, 505).
CODECS: dict[str, tuple[type, int, tuple[int, int]]] = {
    "lzma": (uproot.LZMA, 9, (1, 9)),
    "zlib": (uproot.ZLIB, 1, (1, 9)),
    "lz4": (uproot.LZ4, 4, (1, 12)),
    "zstd": (uproot.ZSTD, 5, (1, 22)),
}

#: Kept in every file, whatever ``branches`` says: coffea's NanoAODSchema refuses files without.
EVENT_ID_BRANCHES = ("run", "luminosityBlock", "event")

#: Target of uncompressed bytes per basket cluster (all branches, one ``extend``) when
#: ``basket_events`` is not given; ROOT's default auto-flush is 30 MB.
DEFAULT_CLUSTER_BYTES = 32 * 1024 * 1024
#: Bounds of the default number of events per basket (NanoAOD: O(1e3 to 1e4)).
MIN_DEFAULT_BASKET_EVENTS = 1_000
MAX_DEFAULT_BASKET_EVENTS = 10_000

#: Default relative jitter of floating-point values: each value is multiplied by 1 + N(0, sigma)
#: with this sigma (see :func:`make_dataset`, ``jitter``).
DEFAULT_JITTER = 0.02
#: Largest accepted ``jitter``; the factor 1 + sigma * z stays positive (|z| < 6.8).
MAX_JITTER = 0.1

# Template events are drawn in fixed blocks, each from its own random stream, so that the
# content does not depend on basket_events and the index array stays small for huge files.
_DRAW_BLOCK = 1 << 16


def file_name(index: int) -> str:
    """Name of the ``index``-th file of a dataset: ``nano_{index:03d}.root``."""
    return f"nano_{index:03d}.root"


# --------------------------------------------------------------------------------------------
# selection of branches


def _select(template: Template, branches: list[str] | None) -> _Plan:
    names = template.order
    if branches is None:
        keep = set(names)
    else:
        keep = set()
        for pattern in branches:
            matched = [name for name in names if fnmatch.fnmatchcase(name, pattern)]
            if not matched:
                raise ValueError(
                    f"branch pattern {pattern!r} matches no writable branch of the template "
                    f"{template.path!r}"
                )
            keep.update(matched)
        keep.update(n for n in EVENT_ID_BRANCHES if n in template.scalars)

    kept = {}
    for coll in template.collections.values():
        selected = coll.select(keep)
        if selected is not None:
            kept[coll.name] = selected
    group_of = {b: c for c in kept.values() for b in (c.counter, *c.branches)}

    n = max(template.num_entries, 1)
    groups: list[str | _Collection] = []
    branch_types: dict[str, object] = {}
    bytes_per_event = 0.0
    for name in names:  # template order; a collection goes where its first branch is
        coll = group_of.get(name)
        if coll is not None:
            if coll.name not in branch_types:
                groups.append(coll)
                branch_types[coll.name] = _build_collection(coll, np.zeros(0, np.int64)).type
                bytes_per_event += 4 + sum(c.nbytes for c in coll.contents) / n
        elif name in keep and name in template.scalars:
            scalar = template.scalars[name]
            groups.append(name)
            branch_types[name] = np.dtype((scalar.dtype, scalar.shape[1:]))
            bytes_per_event += scalar.nbytes / n
    return _Plan(tuple(groups), branch_types, bytes_per_event)


# --------------------------------------------------------------------------------------------
# resampling


def _event_indices(
    seed: int, file_index: int, start: int, stop: int, n_template: int
) -> np.ndarray:
    """Template event drawn for each output event ``start..stop`` of file ``file_index``."""
    out = np.empty(stop - start, np.int64)
    block = start // _DRAW_BLOCK
    pos = start
    while pos < stop:
        block_start = block * _DRAW_BLOCK
        block_stop = block_start + _DRAW_BLOCK
        rng = np.random.default_rng([seed, file_index, block])
        drawn = rng.integers(0, n_template, size=_DRAW_BLOCK, dtype=np.int64)
        take_stop = min(stop, block_stop)
        out[pos - start : take_stop - start] = drawn[pos - block_start : take_stop - block_start]
        pos = take_stop
        block += 1
    return out


def _build_collection(
    coll: _Collection, idx: np.ndarray, jitter: _Jitter | None = None, start: int = 0
) -> ak.Array:
    counts = np.diff(coll.offsets)[idx]
    offsets = np.zeros(len(idx) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    total = int(offsets[-1])
    gather = np.repeat(coll.offsets[:-1][idx] - offsets[:-1], counts) + np.arange(total)
    values = [c[gather] for c in coll.contents]
    if jitter is not None and total and jitter.touches(coll):
        local = np.repeat(np.arange(len(idx), dtype=np.int64), counts)  # event in the basket
        index_in_event = np.arange(total, dtype=np.int64) - offsets[:-1][local]
        counters = ((local + start).astype(np.uint64) << np.uint64(_INNER_BITS)) | (
            index_in_event.astype(np.uint64)
        )
        for i, field in enumerate(coll.fields):
            name = coll.branch(field)
            values[i] = jitter.apply(name, values[i], counters)
            if name in jitter.sort_descending:
                # keep the template's pt order within each event (leading object first)
                values[i] = values[i][np.lexsort((-values[i], local))]
    contents = [ak.contents.NumpyArray(v) for v in values]
    if coll.fields == ("",):
        inner = contents[0]
    else:
        inner = ak.contents.RecordArray(contents, list(coll.fields), length=total)
    return ak.Array(ak.contents.ListOffsetArray(ak.index.Index64(offsets), inner))


def _build_basket(
    plan: _Plan,
    template: Template,
    idx: np.ndarray,
    jitter: _Jitter | None = None,
    start: int = 0,
    first_event: int = 0,
) -> dict[str, object]:
    """Branch arrays of output events ``start .. start + len(idx)`` of a file (template events
    ``idx``); ``first_event``: number of events in the dataset's earlier files."""
    data: dict[str, object] = {}
    counters = None
    for group in plan.groups:
        if isinstance(group, str):
            values = template.scalars[group][idx]
            if jitter is not None:
                if group == "event" and values.ndim == 1 and values.dtype.kind in "iu":
                    # unique, increasing event numbers: 1, 2, ... over the whole dataset
                    first = first_event + start + 1
                    values = np.arange(first, first + len(idx), dtype=np.uint64).astype(
                        values.dtype
                    )
                elif group in jitter.specs:
                    if counters is None:
                        counters = np.arange(start, start + len(idx), dtype=np.uint64)
                        counters <<= np.uint64(_INNER_BITS)
                    if values.ndim == 1:
                        values = jitter.apply(group, values, counters)
                    else:  # fixed-size array per event
                        inner = np.arange(values[0].size, dtype=np.uint64)
                        values = jitter.apply(group, values, counters[:, None] | inner)
            data[group] = values
        else:
            data[group.name] = _build_collection(group, idx, jitter, start)
    return data


# --------------------------------------------------------------------------------------------
# argument checks


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _compression(codec: str | None, level: int | None):
    if codec is None or (isinstance(codec, str) and codec.lower() in ("none", "uncompressed")):
        if level is not None:
            raise ValueError(f"level={level!r} given without a codec (codec=None is uncompressed)")
        return None
    if not isinstance(codec, str) or codec.lower() not in CODECS:
        raise ValueError(
            f"unknown codec {codec!r}; choose one of {sorted(CODECS)} or None (uncompressed)"
        )
    cls, default, (low, high) = CODECS[codec.lower()]
    if level is None:
        level = default
    if isinstance(level, bool) or not isinstance(level, (int, np.integer)):
        raise TypeError(f"level must be an int, got {type(level).__name__} {level!r}")
    if not low <= level <= high:
        raise ValueError(f"level for codec {codec!r} must be in {low}..{high}, got {level}")
    return cls(int(level))


def _check_jitter(jitter: object) -> float:
    if isinstance(jitter, (bool, np.bool_)):
        return DEFAULT_JITTER if jitter else 0.0
    if not isinstance(jitter, (int, float, np.integer, np.floating)):
        raise TypeError(
            f"jitter must be a bool or a float (relative sigma), got {type(jitter).__name__} "
            f"{jitter!r}"
        )
    if not 0.0 <= float(jitter) <= MAX_JITTER:  # NaN fails too
        raise ValueError(f"jitter must be in 0..{MAX_JITTER} (relative sigma), got {jitter!r}")
    return float(jitter)


def _split(events: int, files: int) -> list[int]:
    base, extra = divmod(events, files)
    return [base + (1 if i < extra else 0) for i in range(files)]


# --------------------------------------------------------------------------------------------
# public entry point


def make_dataset(
    directory: str | os.PathLike,
    *,
    events: int,
    files: int,
    template: str | os.PathLike | None = None,
    codec: str | None = "lzma",
    level: int | None = None,
    seed: int = 0,
    branches: Iterable[str] | str | None = None,
    basket_events: int | None = None,
    progress: bool = False,
    allow_empty: bool = False,
    jitter: float | bool = True,
) -> list[str]:
    """Write a NanoAOD-like dataset: ``events`` events in ``files`` files
    ``directory/nano_000.root`` ... with a TTree ``Events``, resampled from a real NanoAOD file.

    Args:
        directory: output directory (created if missing). Existing files of the same names are
            replaced (each is written under a temporary name and renamed when complete); other
            files in the directory are left alone.
        events: total number of events, >= 1 (>= 0 with ``allow_empty``).
        files: number of files, 1 <= files <= events (unless ``allow_empty``); events are spread
            as evenly as possible, the first ``events % files`` files get one more.
        template: NanoAOD ROOT file to resample; default ``$CACHEAFFINITY_NANOAOD_TEMPLATE`` or
            ``data/nanoaod/nano_dy.root`` of the repository.
        codec: ``"lzma"`` (default), ``"zlib"``, ``"lz4"``, ``"zstd"`` or ``None`` (uncompressed).
        level: compression level; default LZMA 9, ZLIB 1, LZ4 4, ZSTD 5.
        seed: non-negative int; equal arguments give equal event content (not equal file bytes:
            the ROOT file UUID and key timestamps are new on every write).
        branches: ``None`` for every writable template branch, or glob patterns
            (``["Muon_*", "Jet_pt", "run"]``, matched case-sensitively against template branch
            names). The counter ``nX`` of a kept collection branch ``X_*`` is kept automatically,
            and so are ``run``, ``luminosityBlock`` and ``event`` (coffea's NanoAODSchema
            requires them). A pattern that matches nothing is an error.
        basket_events: events per basket (one ``extend`` call); default: about 32 MiB of
            uncompressed data per cluster, clipped to 1,000..10,000 events.
        progress: show a tqdm progress bar of events written.
        allow_empty: allow ``events == 0`` and ``files > events``, which writes files whose
            ``Events`` tree has no entries.
        jitter: relative sigma (``0 .. MAX_JITTER``) of a random change of floating-point values
            that breaks the exact repeats of template values, so that the files compress and
            decompress like real NanoAOD; ``True`` (default) is :data:`DEFAULT_JITTER` (0.02),
            ``False`` or ``0`` writes exact copies of template events (and template event
            numbers), as before jitter existed. With jitter:

            * every value of a jittered float branch is multiplied by ``1 + N(0, sigma)``
              (``|N| < 6.8``), then rounded to the branch's precision in the template (the most
              mantissa bits its values use, at least 6: NanoAOD stores most floats with 6 to 16
              bits); an angle ``*phi`` is wrapped back into [-pi, pi], a branch whose template
              values lie in [-1, 1] (scores, fractions) is clipped to it, and the ``pt`` of a
              collection the template sorts by decreasing pt (``Jet``, ``Muon``...) is sorted
              again within each event, so the leading object stays first;
            * copied exactly: integers, bools, counters, indices; a float branch with few distinct
              values (distinct values <= 1/4 of its template values: ``Muon_mass``,
              ``GenPart_mass``, ``Jet_area``, ``genWeight``...); zeros, NaN and infinities; and a
              float branch's frequent values (at least 3 times and 5 % of its template values:
              defaults and sentinels such as ``-1``, ``-2``, ``1.0``);
            * ``event`` is the event's number in the dataset, 1, 2, ... (unique, as in real data);
              ``run`` and ``luminosityBlock`` are the template's.

            A value's random number is a hash of (seed, file, branch, event position in the file,
            index in the event): the content does not depend on ``basket_events`` or ``codec``,
            a branch subset holds the same values as the full file, and the events drawn are
            those of ``jitter=0``.

    Returns:
        The paths of the written files, in order.
    """
    events = _check_int("events", events, 0 if allow_empty else 1)
    files = _check_int("files", files, 1)
    seed = _check_int("seed", seed, 0)
    if files > events and not allow_empty:
        raise ValueError(
            f"files ({files}) must be <= events ({events}): a file would have no events "
            f"(pass allow_empty=True to write empty files)"
        )
    if basket_events is not None:
        basket_events = _check_int("basket_events", basket_events, 1)
    jitter = _check_jitter(jitter)
    compression = _compression(codec, level)
    if isinstance(branches, str):
        branches = [branches]
    elif branches is not None:
        branches = list(branches)
        if not branches:
            raise ValueError("branches=[] selects nothing; pass None for all branches")
        for pattern in branches:
            if not isinstance(pattern, str):
                raise TypeError(f"branches must be glob patterns (str), got {pattern!r}")

    tmpl = load_template(template)
    if tmpl.num_entries == 0:
        raise ValueError(f"template {tmpl.path!r} has no events to resample")
    plan = _select(tmpl, branches)
    if not plan.groups:
        raise ValueError(f"no writable branch selected from template {tmpl.path!r}")
    if basket_events is None:
        basket_events = int(
            np.clip(
                round(DEFAULT_CLUSTER_BYTES / max(plan.bytes_per_event, 1.0)),
                MIN_DEFAULT_BASKET_EVENTS,
                MAX_DEFAULT_BASKET_EVENTS,
            )
        )

    outdir = Path(directory)
    outdir.mkdir(parents=True, exist_ok=True)
    counts = _split(events, files)
    logger.info(
        "writing %d events in %d files to %s "
        "(template %s, %d branches, codec %s, %d events/basket)",
        events,
        files,
        outdir,
        tmpl.path,
        plan.num_branches,
        compression,
        basket_events,
    )

    from tqdm.auto import tqdm

    paths: list[str] = []
    start_time = time.perf_counter()
    bar = tqdm(
        total=events, unit="evt", unit_scale=True, disable=not progress, desc="make_dataset"
    )
    specs = _jitter_specs(tmpl, plan) if jitter else None
    with bar:
        for index, n in enumerate(counts):
            path = outdir / file_name(index)
            bar.set_postfix_str(path.name, refresh=False)
            file_jitter = _Jitter(jitter, seed, index, *specs) if specs is not None else None
            first_event = sum(counts[:index])
            _write_file(
                path, tmpl, plan, compression, seed, index, n, basket_events, bar,
                file_jitter, first_event,
            )  # fmt: skip
            paths.append(str(path))
    elapsed = time.perf_counter() - start_time
    size = sum(os.path.getsize(p) for p in paths)
    logger.info(
        "wrote %d files, %.1f MB in %.1f s (%.2f MB/s, %.0f events/s)",
        files,
        size / 1e6,
        elapsed,
        size / 1e6 / max(elapsed, 1e-9),
        events / max(elapsed, 1e-9),
    )
    return paths


def _write_file(
    path, tmpl, plan, compression, seed, index, n, basket_events, bar, jitter, first_event
):
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    nbaskets = math.ceil(n / basket_events)
    try:
        with uproot.recreate(tmp, compression=compression) as f:
            tree = f.mktree(
                TREE_NAME,
                plan.branch_types,
                title=TREE_NAME,
                initial_basket_capacity=max(nbaskets + 1, 10),
            )
            for start in range(0, n, basket_events):
                stop = min(n, start + basket_events)
                idx = _event_indices(seed, index, start, stop, tmpl.num_entries)
                tree.extend(_build_basket(plan, tmpl, idx, jitter, start, first_event))
                bar.update(stop - start)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------------------------
# measurements


def dataset_stats(paths: Iterable[str | os.PathLike]) -> dict[str, float]:
    """Sizes of written files from their metadata (no basket is read).

    Returns ``files``, ``events``, ``branches`` (of the first file), ``file_bytes`` (on disk),
    ``basket_bytes`` (compressed baskets, with keys), ``uncompressed_bytes`` (baskets
    uncompressed, with keys) and ``compression_ratio`` = uncompressed_bytes / file_bytes.
    """
    out = {
        "files": 0,
        "events": 0,
        "branches": 0,
        "file_bytes": 0,
        "basket_bytes": 0,
        "uncompressed_bytes": 0,
    }
    for path in paths:
        out["files"] += 1
        out["file_bytes"] += os.path.getsize(path)
        with uproot.open(path) as f:
            tree = f[TREE_NAME]
            out["events"] += int(tree.num_entries)
            out["branches"] = out["branches"] or len(tree.branches)
            for branch in tree.branches:
                out["basket_bytes"] += int(branch.compressed_bytes)
                out["uncompressed_bytes"] += int(branch.uncompressed_bytes)
    file_bytes = out["file_bytes"]
    out["compression_ratio"] = out["uncompressed_bytes"] / file_bytes if file_bytes else 0.0
    return out
