"""The NanoAOD template of :mod:`testbed.synthetic`: a real file's ``Events`` tree in memory.

:func:`load_template` reads every writable branch of a template file (``nano_dy.root`` of the
repository's ``data/nanoaod/`` by default, ``$CACHEAFFINITY_NANOAOD_TEMPLATE`` or ``template=``
otherwise) into a :class:`Template`: scalar branches as arrays, jagged collections as offsets
and flat contents (:class:`_Collection`).  :class:`_Plan` is what a dataset writes of it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import awkward as ak
import numpy as np
import uproot

from testbed.samples import REL_SAMPLES, sample

__all__ = ["TEMPLATE_ENV", "TREE_NAME", "Template", "default_template_path", "load_template", "resolve_template"]

logger = logging.getLogger("testbed.synthetic")

#: Environment variable that overrides the default template file.
TEMPLATE_ENV = "CACHEAFFINITY_NANOAOD_TEMPLATE"

#: Name of the tree that is read from the template and written to every file.
TREE_NAME = "Events"

# dtypes a TTree leaf written by uproot can hold (uproot.writing._cascadetree._dtype_to_char).
_WRITABLE_KINDS = {
    np.dtype(np.bool_),
    np.dtype(np.int8),
    np.dtype(np.uint8),
    np.dtype(np.int16),
    np.dtype(np.uint16),
    np.dtype(np.int32),
    np.dtype(np.uint32),
    np.dtype(np.int64),
    np.dtype(np.uint64),
    np.dtype(np.float32),
    np.dtype(np.float64),
}


# --------------------------------------------------------------------------------------------
# template


def default_template_path() -> Path:
    """The template used when none is given: ``$CACHEAFFINITY_NANOAOD_TEMPLATE`` if set, else
    ``nano_dy.root`` of the repository's sample folder ``data/nanoaod/``
    (:func:`testbed.samples.sample`; may not exist)."""
    env = os.environ.get(TEMPLATE_ENV)
    if env:
        return Path(env).expanduser()
    return sample("nano_dy.root")


def resolve_template(template: str | os.PathLike | None = None) -> Path:
    """The template file to use, checked to exist (FileNotFoundError naming the fix if not)."""
    if template is not None:
        path = Path(template).expanduser()
        origin = "template= argument"
    else:
        path = default_template_path()
        origin = f"${TEMPLATE_ENV}" if os.environ.get(TEMPLATE_ENV) else "default template location"
    if not path.is_file():
        raise FileNotFoundError(
            f"NanoAOD template file not found: {str(path)!r} (from the {origin}). "
            f"Pass template=<path to a NanoAOD ROOT file with an {TREE_NAME!r} TTree> "
            f"or set the environment variable {TEMPLATE_ENV}; the real sample files live in "
            f"the repository folder {REL_SAMPLES} (see its README.md)."
        )
    return path


@dataclass(frozen=True)
class _Collection:
    """A jagged collection of the template: counter ``n<name>``, branches ``<name>_<field>``
    (or the single branch ``<name>`` when ``fields == ("",)``)."""

    name: str
    fields: tuple[str, ...]
    offsets: np.ndarray  # int64, num_entries + 1, starting at 0
    contents: tuple[np.ndarray, ...]  # flat content of each field, in ``fields`` order

    @property
    def counter(self) -> str:
        return "n" + self.name

    def branch(self, field: str) -> str:
        return self.name if field == "" else f"{self.name}_{field}"

    @property
    def branches(self) -> tuple[str, ...]:
        return tuple(self.branch(f) for f in self.fields)

    def select(self, keep: set[str]) -> _Collection | None:
        pairs = [(f, c) for f, c in zip(self.fields, self.contents) if self.branch(f) in keep]
        if not pairs:
            return None
        fields, contents = zip(*pairs)
        return _Collection(self.name, tuple(fields), self.offsets, tuple(contents))


@dataclass(frozen=True)
class Template:
    """The writable content of a template's ``Events`` tree, held in memory.

    ``order`` lists every writable branch (counters included) in the template's order,
    ``dtypes`` their dtypes in the template (generated counters are written as int32);
    ``skipped`` the branches that cannot be written (strings, objects, unusual layouts).
    """

    path: str
    num_entries: int
    scalars: dict[str, np.ndarray]
    collections: dict[str, _Collection]
    order: tuple[str, ...]
    dtypes: dict[str, np.dtype]
    skipped: tuple[str, ...] = ()


def load_template(template: str | os.PathLike | None = None) -> Template:
    """Read the template's ``Events`` tree into memory (cached per path and modification time)."""
    path = resolve_template(template).resolve()
    stat = path.stat()
    return _load_template_cached(str(path), stat.st_mtime_ns, stat.st_size)


def _native(dtype: np.dtype) -> np.dtype:
    """``dtype`` in native byte order (subarray dtypes too)."""
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        return np.dtype((_native(base), shape))
    return dtype.newbyteorder("=") if dtype.byteorder not in ("=", "|") else dtype


@lru_cache(maxsize=4)
def _load_template_cached(path: str, _mtime_ns: int, _size: int) -> Template:
    with uproot.open(path) as f:
        try:
            tree = f[TREE_NAME]
        except KeyError:
            raise ValueError(f"template {path!r} has no {TREE_NAME!r} tree") from None
        if tree.classname != "TTree":
            raise ValueError(f"template {path!r}: {TREE_NAME!r} is a {tree.classname}, not a TTree")
        num_entries = int(tree.num_entries)

        skipped: list[str] = []
        scalar_names: list[str] = []
        # collection name -> member branch names (template order)
        members: dict[str, list[str]] = {}
        counters: set[str] = set()
        for branch in tree.branches:
            name = branch.name
            interp = branch.interpretation
            if branch.branches:  # split objects: not NanoAOD-like
                skipped.append(name)
                continue
            if isinstance(interp, uproot.AsDtype):
                if _native(interp.from_dtype).base in _WRITABLE_KINDS:
                    scalar_names.append(name)
                else:
                    skipped.append(name)
                continue
            if isinstance(interp, uproot.AsJagged) and isinstance(interp.content, uproot.AsDtype):
                count = branch.count_branch
                dtype = _native(interp.content.from_dtype)
                ok = (
                    count is not None
                    and count.name.startswith("n")
                    and len(count.name) > 1
                    and dtype.subdtype is None
                    and dtype in _WRITABLE_KINDS
                )
                coll = count.name[1:] if ok else ""
                if ok and (name == coll or name.startswith(coll + "_")):
                    members.setdefault(coll, []).append(name)
                    counters.add(count.name)
                    continue
            skipped.append(name)

        # a collection is either one bare jagged branch "X" or fields "X_*", not both
        for coll, names in list(members.items()):
            if coll in names and len(names) > 1:
                names.remove(coll)
                skipped.append(coll)

        # counters are read even when they are not writable scalars themselves
        member_names = [n for names in members.values() for n in names]
        wanted = list(dict.fromkeys([*scalar_names, *counters, *member_names]))
        arrays = tree.arrays(wanted, library="ak", how=dict) if num_entries else {}
        order_index = {b.name: i for i, b in enumerate(tree.branches)}
        dtypes: dict[str, np.dtype] = {}

        scalars: dict[str, np.ndarray] = {}
        for name in scalar_names:
            dtype = _native(tree[name].interpretation.from_dtype)
            dtypes[name] = dtype
            if num_entries:
                scalars[name] = np.ascontiguousarray(ak.to_numpy(arrays[name]), dtype=dtype.base)
            else:
                scalars[name] = np.zeros(0, dtype)

        collections: dict[str, _Collection] = {}
        for coll, names in members.items():
            counter = "n" + coll
            if num_entries:
                counts = np.asarray(ak.to_numpy(arrays[counter]), dtype=np.int64)
            else:
                counts = np.zeros(0, np.int64)
            offsets = np.zeros(num_entries + 1, np.int64)
            np.cumsum(counts, out=offsets[1:])
            fields: list[str] = []
            contents: list[np.ndarray] = []
            for name in names:
                dtype = _native(tree[name].interpretation.content.from_dtype)
                if num_entries:
                    layout = ak.to_layout(arrays[name])
                    if not isinstance(layout, ak.contents.ListOffsetArray):
                        layout = layout.to_ListOffsetArray64(True)
                    branch_offsets = np.asarray(layout.offsets, dtype=np.int64)
                    first = int(branch_offsets[0])
                    if not np.array_equal(branch_offsets - first, offsets):
                        logger.debug("template branch %s disagrees with %s: skipped", name, counter)
                        skipped.append(name)
                        continue
                    content = np.ascontiguousarray(
                        ak.to_numpy(layout.content[first : first + offsets[-1]]), dtype=dtype
                    )
                else:
                    content = np.zeros(0, dtype)
                fields.append("" if name == coll else name[len(coll) + 1 :])
                contents.append(content)
                dtypes[name] = dtype
            if fields:
                collections[coll] = _Collection(coll, tuple(fields), offsets, tuple(contents))
                dtypes.setdefault(counter, _native(tree[counter].interpretation.from_dtype))

        writable = set(scalars) | {c.counter for c in collections.values()}
        writable |= {b for c in collections.values() for b in c.branches}
        order = tuple(sorted(writable, key=lambda n: order_index.get(n, len(order_index))))
        if skipped:
            logger.debug(
                "template %s: %d branches cannot be written and are skipped: %s",
                path,
                len(skipped),
                ", ".join(skipped),
            )
        return Template(
            path=path,
            num_entries=num_entries,
            scalars=scalars,
            collections=collections,
            order=order,
            dtypes=dtypes,
            skipped=tuple(skipped),
        )


@dataclass(frozen=True)
class _Plan:
    """What to write, in output order: scalar branch names and collections."""

    groups: tuple[str | _Collection, ...]
    branch_types: dict[str, object]  # for mktree
    bytes_per_event: float  # uncompressed, without basket overheads

    @property
    def num_branches(self) -> int:
        return sum(1 if isinstance(g, str) else len(g.fields) + 1 for g in self.groups)
