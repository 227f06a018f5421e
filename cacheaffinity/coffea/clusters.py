"""Column buffers cached per TTree cluster, whatever the chunking (runs in workers).

A chunk's column used to be cached under the chunk's entry range, so a run with
another ``chunksize`` (or other preprocessing boundaries) found nothing.  This
module caches what the bytes *are*: one entry per (file identity, tree, branch
and its interpretation, entry range of one TTree cluster), and assembles a
chunk's column from the clusters it overlaps.  Defines

- :func:`cluster_ranges`: the entry ranges of a tree's clusters (uproot's
  ``common_entry_offsets``), stored in the per-file form document so that a
  fully cached chunk of *any* chunking opens no file;
- :class:`ClusterSourceMapping`: coffea's ``UprootSourceMapping`` with its
  column extraction replaced: the ``!load`` step of a form key gets the branch
  array of ``[start, stop)`` from cached clusters, reading only the missing
  clusters' entry ranges from storage (contiguous missing clusters in one
  read) and storing them.  coffea then derives its buffers (``!offsets``,
  ``!content``, ``!counts2offsets`` ...) from that array exactly as it does
  from a fresh read, so the results are identical.

Cache keys (values are NumPy arrays in :class:`~cacheaffinity.worker.store.ColumnCache`)::

    c3/<identity token>/<tree>/<branch>/<form digest>/<cluster start>-<cluster stop>/<part>

``<form digest>`` is an xxh3-64 digest of the branch's awkward form (its
interpretation: dtype, jaggedness, type name); ``<part>`` is ``data`` for a
flat branch and ``offsets``/``content`` for a jagged one (offsets start at 0).
Branches of any other layout (nested jagged, strings, objects) are read from
storage for the chunk's range as coffea does, uncached.
"""

from __future__ import annotations

import bisect
import json
import logging
from dataclasses import dataclass
from typing import Any

import awkward
import numpy as np
import uproot
import xxhash
from coffea.nanoevents.mapping import UprootSourceMapping

from cacheaffinity.coffea.identity import warn_once

logger = logging.getLogger("cacheaffinity.coffea")

__all__ = ["ClusterSourceMapping", "branch_kinds", "cluster_ranges", "KEY_PREFIX"]

#: First component of every cluster key (the key layout version).
KEY_PREFIX = "c3"
#: Clusters longer than this many entries are cached in pieces of this size
#: (a file written as one cluster must not make every chunk read all of it).
MAX_CLUSTER_ENTRIES = 100_000

_MISSING = object()


def cluster_ranges(tree, max_entries: int = MAX_CLUSTER_ENTRIES) -> list[int]:
    """Entry offsets ``[0, b1, ..., num_entries]`` of a TTree's clusters.

    Ranges from ``tree.common_entry_offsets()`` (entries where every branch
    starts a basket); longer ones are split into pieces of ``max_entries``.
    """
    try:
        offsets = [int(x) for x in tree.common_entry_offsets()]
    except Exception as e:  # a tree uproot cannot tell: fixed pieces
        logger.debug("cacheaffinity: no common entry offsets for %s: %r", tree, e)
        offsets = [0, int(tree.num_entries)]
    if not offsets or offsets[0] != 0:
        offsets = [0] + offsets
    if offsets[-1] != int(tree.num_entries):
        offsets.append(int(tree.num_entries))
    out = [0]
    for a, b in zip(offsets[:-1], offsets[1:]):
        while b - a > max_entries:
            a += max_entries
            out.append(a)
        if b > out[-1]:
            out.append(b)
    return out


def branch_kinds(base_form: dict) -> dict[str, list]:
    """``{branch: [kind, form digest]}`` of a NanoEvents base form.

    ``kind`` is ``"flat"`` (a NumpyArray), ``"jagged"`` (ListOffsetArray of a
    NumpyArray) or ``"other"`` (not cached per cluster).
    """
    out = {}
    for name, form in zip(base_form.get("fields") or [], base_form.get("contents") or []):
        cls = form.get("class", "")
        if cls == "NumpyArray" and not form.get("inner_shape"):
            kind = "flat"
        elif (
            cls.startswith("ListOffsetArray")
            and form.get("content", {}).get("class") == "NumpyArray"
            and not form["content"].get("inner_shape")
        ):
            kind = "jagged"
        else:
            kind = "other"
        digest = xxhash.xxh3_64_hexdigest(json.dumps(form, sort_keys=True).encode())
        out[name] = [kind, digest]
    return out


@dataclass
class _TreeRef:
    uuid: str
    treepath: str


@dataclass
class _Handle:
    tree: _TreeRef
    name: str
    allow_missing: bool


class ClusterSourceMapping(UprootSourceMapping):
    """``UprootSourceMapping`` whose ``!load`` reads per-cluster cached arrays.

    Parameters
    ----------
    fileopener
        A ``UUIDOpener`` (opens the file on the first miss only).
    start, stop : int
        The chunk's entry range.
    store
        Mapping of cluster keys to arrays (a node's memory front), or None.
    token : str
        :attr:`FileIdentity.token` of the file's bytes.
    treepath : str
        Object path of the tree in the file.
    clusters : list of int
        Cluster entry offsets (:func:`cluster_ranges`).
    kinds : dict
        :func:`branch_kinds` of the file's base form.
    **kwargs
        Passed to ``UprootSourceMapping`` (``buffer_cache`` must not be given:
        buffers are derived from the cluster arrays for every chunk).
    """

    def __init__(self, fileopener, start, stop, *, store, token, treepath, clusters, kinds, **kwargs):
        super().__init__(fileopener, start, stop, **kwargs)
        self._store = store
        self._token = token
        self._treepath = treepath
        self._clusters = [int(x) for x in clusters]
        self._kinds = kinds

    # file access is deferred to the first missing cluster
    def _column_source(self, uuid, path_in_source):
        return _TreeRef(uuid, path_in_source)

    def _tree(self, ref: _TreeRef):
        return super()._column_source(ref.uuid, ref.treepath)

    def get_column_handle(self, columnsource, name, allow_missing):
        return _Handle(columnsource, name, allow_missing)

    def _key(self, name: str, digest: str, a: int, b: int) -> str:
        return f"{KEY_PREFIX}/{self._token}/{self._treepath}/{name}/{digest}/{a}-{b}"

    def extract_column(self, columnhandle, start, stop, allow_missing, use_ak_forth=True):
        h = columnhandle
        kind, digest = self._kinds.get(h.name, ("other", ""))
        if kind == "other" or self._store is None or start >= stop:
            return self._direct(h, start, stop, allow_missing, use_ak_forth)
        c = self._clusters
        first = bisect.bisect_right(c, start) - 1
        last = bisect.bisect_left(c, stop)  # exclusive cluster index end
        pieces: list = [None] * (last - first)
        parts = ("data",) if kind == "flat" else ("offsets", "content")
        keys = [
            [f"{self._key(h.name, digest, int(c[i]), int(c[i + 1]))}/{p}" for p in parts]
            for i in range(first, last)
        ]
        found = _get_many(self._store, [k for ks in keys for k in ks])
        for i, ks in enumerate(keys):
            got = [found.get(k, _MISSING) for k in ks]
            if not any(v is _MISSING for v in got):
                pieces[i] = got
        i = 0
        while i < len(pieces):  # read runs of missing clusters, one read per run
            if pieces[i] is not None:
                i += 1
                continue
            j = i
            while j < len(pieces) and pieces[j] is None:
                j += 1
            a, b = int(c[first + i]), int(c[first + j])
            read = self._read(h, a, b, use_ak_forth, kind)
            if read is None:
                return self._direct(h, start, stop, allow_missing, use_ak_forth)
            for k in range(i, j):
                ca, cb = int(c[first + k]), int(c[first + k + 1])
                got = _split(read, kind, ca - a, cb - a)
                key = self._key(h.name, digest, ca, cb)
                for p, v in zip(parts, got):
                    try:
                        self._store[f"{key}/{p}"] = v
                    except Exception as e:  # a cache problem is only a miss
                        warn_once("cluster-store", "cacheaffinity: cluster not cached: %r", e)
                pieces[k] = got
            i = j
        base = int(c[first])
        array = _assemble(pieces, kind, start - base, stop - base)
        if allow_missing:
            array = awkward.Array(
                awkward.contents.IndexedOptionArray(
                    awkward.index.Index64(np.arange(stop - start, dtype=np.int64)),
                    awkward.contents.NumpyArray(array),
                )
            )
        return array

    def _direct(self, h: _Handle, start, stop, allow_missing, use_ak_forth):
        """What coffea does: the chunk's range read from the file."""
        handle = super().get_column_handle(self._tree(h.tree), h.name, allow_missing)
        return super().extract_column(handle, start, stop, allow_missing, use_ak_forth=use_ak_forth)

    def _read(self, h: _Handle, a: int, b: int, use_ak_forth, kind):
        """Parts of ``[a, b)`` of a branch as NumPy arrays, or None if its layout is not ``kind``."""
        tree = self._tree(h.tree)
        if h.allow_missing and h.name not in tree:
            return None
        branch = tree[h.name]
        interp = branch.interpretation
        interp._forth = use_ak_forth
        array = branch.array(
            interp,
            entry_start=a,
            entry_stop=b,
            decompression_executor=self.decompression_executor,
            interpretation_executor=self.interpretation_executor,
        )
        layout = array.layout
        if kind == "flat" and isinstance(layout, awkward.contents.NumpyArray):
            return (np.asarray(layout.data),)
        if kind == "jagged" and isinstance(
            layout, (awkward.contents.ListOffsetArray, awkward.contents.ListArray)
        ):
            layout = layout.to_ListOffsetArray64(True)
            if isinstance(layout.content, awkward.contents.NumpyArray):
                return (np.asarray(layout.offsets.data), np.asarray(layout.content.data))
        warn_once(
            f"cluster-layout:{h.name}",
            "cacheaffinity: branch %s has layout %s, not the %s its form says; read "
            "uncached", h.name, type(layout).__name__, kind,
        )  # fmt: skip
        return None


def _get_many(store, keys: list[str]) -> dict:
    """``{key: value}`` of the keys ``store`` holds: one ``get_many`` call (one
    index query for all clusters and parts of a branch) when the store has it."""
    get_many = getattr(store, "get_many", None)
    if get_many is not None:
        return get_many(keys)
    out = {}
    for k in keys:
        v = store.get(k, _MISSING)
        if v is not _MISSING:
            out[k] = v
    return out


def _split(parts: tuple, kind: str, a: int, b: int) -> list:
    """Entries ``[a, b)`` of parts read for a run of clusters (copies: they are stored)."""
    if kind == "flat":
        return [np.ascontiguousarray(parts[0][a:b])]
    offsets, content = parts
    o = offsets[a : b + 1]
    return [np.ascontiguousarray(o - o[0]), np.ascontiguousarray(content[o[0] : o[-1]])]


def _assemble(pieces: list, kind: str, a: int, b: int) -> awkward.Array:
    """Entries ``[a, b)`` (relative to the first cluster) of concatenated cluster pieces."""
    if kind == "flat":
        data = pieces[0][0] if len(pieces) == 1 else np.concatenate([p[0] for p in pieces])
        return awkward.Array(awkward.contents.NumpyArray(data[a:b]))
    if len(pieces) == 1:
        offsets, content = pieces[0]
    else:
        shifted, total = [], 0
        for i, (o, _) in enumerate(pieces):
            shifted.append((o if i == len(pieces) - 1 else o[:-1]) + total)
            total += int(o[-1])
        offsets = np.concatenate(shifted)
        content = np.concatenate([p[1] for p in pieces])
    o = offsets[a : b + 1].astype(np.int64, copy=False)
    lo, hi = int(o[0]), int(o[-1])
    layout = awkward.contents.ListOffsetArray(
        awkward.index.Index64(o - lo), awkward.contents.NumpyArray(content[lo:hi])
    )
    return awkward.Array(layout)
