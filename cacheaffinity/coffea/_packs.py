"""A chunk's columns from the node's chunk packs, whatever the chunking (workers).

``PackSourceMapping`` replaces only the ``!load`` step of coffea's
``UprootSourceMapping``: a branch's array for the chunk's ``[start, stop)`` is
taken from the packs covering it (one index query, views where one pack covers
it), else from peers, else read from storage and stored as one new pack when
the task ends.  coffea derives its buffers from that array as from a fresh
read, so results are identical; its final buffers go into the pack too.
Branches of other layouts (nested jagged, strings, objects) are read as coffea
reads them, uncached.  Member names and the group key: ``worker/_store/layout.py``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import awkward
import coffea
import numpy as np
import xxhash
from coffea.nanoevents.mapping import UprootSourceMapping

from cacheaffinity.coffea._identity import warn_once
from cacheaffinity.worker._store import protocol
from cacheaffinity.worker._store.layout import FLAT_PARTS, JAGGED_PARTS, group, member

logger = logging.getLogger("cacheaffinity.coffea")

__all__ = ["PackSourceMapping", "branch_kinds"]

#: Member names of coffea's final buffers start with this (they depend on
#: coffea's transforms, so on its version: another version's are not used).
BUFFER_PREFIX = f"buf/{coffea.__version__}/"


def branch_kinds(base_form: dict) -> dict[str, list]:
    """``{branch: [kind, form digest]}`` of a NanoEvents base form.

    ``kind`` is ``"flat"`` (a NumpyArray), ``"jagged"`` (ListOffsetArray of a
    NumpyArray) or ``"other"`` (not cached in packs).
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


class PackSourceMapping(UprootSourceMapping):
    """``UprootSourceMapping`` whose ``!load`` reads the node's chunk packs.

    ``store`` is the chunk's store (memory front or peer store; None: read as
    coffea does), ``token`` the ``FileIdentity.token`` of the file's bytes,
    ``kinds`` the ``branch_kinds`` of its base form and ``forms`` its
    ``{branch: form}`` (answers empty ranges without opening the file).
    ``hits`` count column parts served from packs (``peer_hits`` of them from packs fetched
    from other nodes), ``misses`` those read from storage; ``bytes_copied`` what serving
    copied (concatenations, re-based offsets).
    """

    def __init__(self, fileopener, start, stop, *, store, token, treepath, kinds, forms=None, **kwargs):
        buffers = _ChunkBuffers()
        super().__init__(fileopener, start, stop, buffer_cache=buffers, **kwargs)
        buffers.mapping = self
        self._range = f"{int(start)}-{int(stop)}"
        #: coffea's final buffers computed by this chunk (stored with its pack).
        self._final: dict[str, np.ndarray] = {}
        self._store = store
        self._group = group(token, treepath)
        self._kinds = kinds
        self._forms = forms or {}
        self._packs: list | None = None
        self._asked_peers = False
        #: ids of the packs in :attr:`_packs` fetched from other nodes (the hits they
        #: answer are peer hits too)
        self._fetched: set[int] = set()
        #: Column parts read from storage by this chunk: stored as one pack by ``finish``.
        self._new: dict[str, np.ndarray] = {}
        self._new_range: tuple[int, int] | None = None
        self.hits = self.misses = self.peer_hits = self.bytes_served = self.bytes_copied = 0
        #: Buffer keys served without a ``!load``: coffea's access log misses them.
        self.served_keys: list[str] = []

    # file access is deferred to the first miss
    def _column_source(self, uuid, path_in_source):
        return _TreeRef(uuid, path_in_source)

    def _tree(self, ref: _TreeRef):
        return super()._column_source(ref.uuid, ref.treepath)

    def get_column_handle(self, columnsource, name, allow_missing):
        return _Handle(columnsource, name, allow_missing)

    def extract_column(self, columnhandle, start, stop, allow_missing, use_ak_forth=True):
        h = columnhandle
        if start >= stop and h.name in self._forms:
            return _empty(self._forms[h.name], allow_missing)
        kind, digest = self._kinds.get(h.name, ("other", ""))[:2]
        if kind == "other" or self._store is None or start >= stop:
            return self._direct(h, start, stop, allow_missing, use_ak_forth)
        names = [member(h.name, digest, p) for p in (FLAT_PARTS if kind == "flat" else JAGGED_PARTS)]
        found = self._find(names, start, stop)
        if found is None and not self._asked_peers:
            self._asked_peers = True
            fetched = protocol.fetch_packs(self._store, self._group, start, stop)
            if fetched:
                self._packs = fetched + (self._packs or [])
                self._fetched.update(id(p) for p in fetched)
                found = self._find(names, start, stop)
        if found is not None:
            parts, from_peer = found
            self.hits += len(names)
            self.peer_hits += len(names) if from_peer else 0
            self.bytes_served += sum(p.nbytes for p in parts)
            array, copied = _as_array(parts, kind)
            self.bytes_copied += copied
        else:
            read = self._read(h, start, stop, use_ak_forth, kind)
            if read is None:
                return self._direct(h, start, stop, allow_missing, use_ak_forth)
            self.misses += len(names)
            if self._new_range in (None, (start, stop)):
                self._new_range = (start, stop)
                self._new.update(zip(names, read))
            array = _as_array(read, kind)[0]
        array = awkward.Array(array)
        if allow_missing:
            array = awkward.Array(
                awkward.contents.IndexedOptionArray(
                    awkward.index.Index64(np.arange(stop - start, dtype=np.int64)), array.layout
                )
            )
        return array

    # ---------------------------------------------------- coffea's final buffers
    def _buffer_name(self, key: str) -> str | None:
        parts = str(key).split("/", 3)  # <uuid>/<tree>/<start>-<stop>/<attribute>/<form key>
        if len(parts) != 4 or parts[2] != self._range:
            return None
        return BUFFER_PREFIX + parts[3]

    def buffer(self, key: str, default, count: bool = True):
        """coffea's final buffer ``key``: computed earlier in this task, or from a pack
        of exactly this chunk's range; else ``default``.  ``count=False`` for
        coffea 2026.7's ``key in cache`` before ``cache[key]``."""
        name = self._buffer_name(key)
        if name is None:
            return default
        value = self._final.get(name)
        if value is not None:
            return value
        if self._packs is None:
            self._packs = protocol.get_packs(self._store, self._group, self._start, self._stop)
        for p in self._packs:
            if p.start == self._start and p.stop == self._stop:
                value = p.members.get(name)
                if value is not None:
                    if count:
                        self.hits += 1
                        self.peer_hits += id(p) in self._fetched
                        self.bytes_served += value.nbytes
                        self.served_keys.append(key)
                    return value
        return default

    def record_buffer(self, key: str, value) -> None:
        """Keep a final buffer coffea computed (stored with the chunk's pack)."""
        name = self._buffer_name(key)
        if name is not None and isinstance(value, np.ndarray) and not value.dtype.hasobject:
            self._final[name] = value

    def _find(self, names: list[str], start: int, stop: int) -> tuple[tuple, bool] | None:
        """The parts ``names`` of ``[start, stop)`` from the packs and whether a pack fetched
        from another node gave any of them, or None."""
        if self._packs is None:
            self._packs = protocol.get_packs(self._store, self._group, start, stop)
        packs = [p for p in self._packs if all(n in p.members for n in names)]
        if not packs:
            return None
        for p in packs:  # one pack covers the range: views only
            if p.start <= start and p.stop >= stop:
                return _slice(p, names, start - p.start, stop - p.start), id(p) in self._fetched
        pieces, pos, used = [], start, []
        while pos < stop:  # a chain of packs covers it: concatenated
            best = max((p for p in packs if p.start <= pos < p.stop), key=lambda p: p.stop, default=None)
            if best is None:
                return None
            end = min(best.stop, stop)
            pieces.append(_slice(best, names, pos - best.start, end - best.start))
            used.append(best)
            pos = end
        if len(names) == 1:
            out = (np.concatenate([p[0] for p in pieces]),)
        else:
            shifted, total = [], 0
            for i, (o, _) in enumerate(pieces):
                shifted.append((o if i == len(pieces) - 1 else o[:-1]) - o[0] + total)
                total += int(o[-1] - o[0])
            contents = [c[int(o[0]) : int(o[-1])] for o, c in pieces]
            out = (np.concatenate(shifted), np.concatenate(contents))
        self.bytes_copied += sum(a.nbytes for a in out)
        return out, any(id(p) in self._fetched for p in used)

    def finish(self) -> None:
        """Count this chunk's lookups and store what it read as one pack (at task end)."""
        protocol.count_served(
            self._store, hits=self.hits, misses=self.misses, nbytes=self.bytes_served, peer_hits=self.peer_hits
        )
        arrays = dict(self._new) if self._new_range in (None, (self._start, self._stop)) else {}
        arrays.update(self._final)  # views of the branch arrays are stored once
        if arrays and self._start < self._stop:
            try:
                protocol.put_pack(self._store, self._group, self._start, self._stop, arrays)
            except Exception as e:  # a cache problem is only a miss next time
                warn_once("pack-store", "cacheaffinity: chunk pack not cached: %r", e)
        self._new, self._final = {}, {}
        self._packs = None
        self._fetched = set()

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
            return (np.ascontiguousarray(layout.data),)
        if kind == "jagged" and isinstance(
            layout, (awkward.contents.ListOffsetArray, awkward.contents.ListArray)
        ):
            layout = layout.to_ListOffsetArray64(True)
            if isinstance(layout.content, awkward.contents.NumpyArray):
                offsets = np.asarray(layout.offsets.data, dtype=np.int64)
                content = np.asarray(layout.content.data)[: int(offsets[-1])]
                return (np.ascontiguousarray(offsets), np.ascontiguousarray(content))
        warn_once(
            f"pack-layout:{h.name}",
            "cacheaffinity: branch %s has layout %s, not the %s its form says; read "
            "uncached", h.name, type(layout).__name__, kind,
        )  # fmt: skip
        return None


class _ChunkBuffers:
    """The chunk's final buffers as coffea's ``buffer_cache`` (coffea >= 2026.9 calls
    ``get``/``__setitem__``; 2026.7 asks ``key in cache``, then ``cache[key]``)."""

    mapping: PackSourceMapping

    def get(self, key, default=None):
        return self.mapping.buffer(key, default)

    def __contains__(self, key) -> bool:
        return self.mapping.buffer(key, _ABSENT, count=False) is not _ABSENT

    def __getitem__(self, key):
        value = self.mapping.buffer(key, _ABSENT)
        if value is _ABSENT:
            raise KeyError(key)
        return value

    def __setitem__(self, key, value) -> None:
        self.mapping.record_buffer(key, value)


_ABSENT = object()


def _slice(pack, names: list[str], a: int, b: int) -> tuple:
    """Entries ``[a, b)`` (pack-relative) of parts ``names``: views, offsets not re-based."""
    if len(names) == 1:
        return (pack.members[names[0]][a:b],)
    offsets, content = pack.members[names[0]], pack.members[names[1]]
    return (offsets[a : b + 1], content)


def _as_array(parts: tuple, kind: str) -> tuple:
    """The awkward layout of a branch's parts (offsets re-based to 0) and the bytes copied."""
    if kind == "flat":
        return awkward.contents.NumpyArray(parts[0]), 0
    offsets, content = parts
    lo, hi = int(offsets[0]), int(offsets[-1])
    copied = 0
    if lo:
        offsets = offsets - lo
        copied = offsets.nbytes
    layout = awkward.contents.ListOffsetArray(
        awkward.index.Index64(offsets), awkward.contents.NumpyArray(content[lo:hi])
    )
    return layout, copied


def _empty(form: dict, allow_missing: bool):
    """A 0-entry branch array of ``form`` (no file is opened for an empty range)."""
    layout = awkward.forms.from_dict(form).length_zero_array()
    if allow_missing:
        layout = awkward.contents.IndexedOptionArray(awkward.index.Index64(np.zeros(0, np.int64)), layout)
    return awkward.Array(layout)
