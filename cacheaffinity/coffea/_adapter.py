"""Everything that knows coffea's internals, in one place (client and workers).

coffea has no public seam for building a chunk's events from a stored form
without opening the file, nor for reading which work function and options the
``Runner`` handed the executor (docs/coffea-seam.md proposes one), so this
module uses the private or undocumented coffea names below.  ``check()``
verifies them against the installed coffea: ``tests/test_coffea_inputs.py``
runs it, and workers run it once before using them (on a mismatch they log
once and run coffea's own work function).

Private names (leading underscore)
    - ``Runner._work_function`` and its parameter names (``SIGNATURES``):
      recognised in the function the ``Runner`` hands the executor, to read
      the options and replace ``cache_function``.
    - ``UprootSourceMapping._extract_base_form``: a TTree's NanoEvents base
      form (stored per file).
    - ``NanoEventsFactory._from_mapping``: events from a stored form and a
      mapping (called with keywords: coffea 2026.7 has an extra
      ``buffer_cache`` parameter).
    - ``BaseSchema._form`` (its top-level ``parameters["metadata"]`` is filled
      by the schema) and ``NanoEventsFactory(schema, mapping, partition_key,
      mode=...)``: ``SchemaCache`` copies a built schema per chunk.
    - ``BaseSourceMapping._column_source(uuid, path_in_source)``: overridden
      by ``PackSourceMapping`` (a fully cached chunk opens no file), called
      for the tree on a miss.

Undocumented shapes of public names
    - ``Runner.automatic_retries(retries, skipbadfiles, func, *args,
      use_result_type=...)``: the outer partial the executor receives.
    - ``Runner.metadata_fetcher_root(xrootdtimeout, align_clusters,
      uproot_options, item)``: the inner partial of preprocessing, returning
      a ``set_accumulator`` of ``FileMeta`` with ``numentries``, ``uuid`` (16
      bytes) and, with ``align_clusters``, ``clusters``.
    - ``coffea.processor.executor.WorkItem`` / ``FileMeta``: the items.
    - ``DaskExecutor.__call__`` submits chunk tasks with one
      ``self.client.map(function, items, ...)`` (where identities are attached).
    - ``UprootSourceMapping.get_column_handle(columnsource, name,
      allow_missing)``, ``extract_column(columnhandle, start, stop,
      allow_missing, use_ak_forth)``, ``decompression_executor`` and
      ``interpretation_executor``: overridden/used by ``PackSourceMapping``
      (every ``!load`` goes through them); like coffea it sets uproot's private
      ``interpretation._forth`` before ``TBranch.array``.
    - ``UprootSourceMapping(fileopener, start, stop, cache=, access_log=,
      file_handle=, use_ak_forth=, virtual=, buffer_cache=)`` with a
      ``UUIDOpener`` subclass; ``BaseSourceMapping.interpret_key`` and
      ``coffea.nanoevents.util.key_to_tuple`` (buffer keys
      ``<uuid>/<tree>/<start>-<stop>/<attribute>/<form key>``).
    - ``Runner(processor_compression=...)`` sends ``lz4.frame.compress(cloudpickle.dumps(p))``.

Public seams used as documented: ``Runner(cachestrategy=...)``,
``ExecutorBase.copy``/``function_name``, ``DaskExecutor`` fields,
``NanoEventsFactory.events()``.
"""

from __future__ import annotations

import copy
import inspect
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from typing import Any

from coffea.nanoevents import NanoEventsFactory, schemas
from coffea.nanoevents.mapping import UprootSourceMapping
from coffea.nanoevents.mapping.base import BaseSourceMapping, UUIDOpener
from coffea.nanoevents.schemas.base import BaseSchema
from coffea.nanoevents.util import key_to_tuple, tuple_to_key
from coffea.processor import DaskExecutor, ProcessorABC, Runner, set_accumulator
from coffea.processor.executor import FileMeta, WorkItem

__all__ = [
    "FileMeta",
    "MetadataCall",
    "ProcessorABC",
    "RunnerCall",
    "SchemaCache",
    "UUIDOpener",
    "WorkItem",
    "accessed_columns",
    "check",
    "events_from_form",
    "extract_base_form",
    "is_base_schema",
    "logged_columns",
    "unwrap",
    "unwrap_metadata",
]

#: (object, attribute) pairs this module needs, private ones first.
NAMES = (
    (Runner, "_work_function"),
    (UprootSourceMapping, "_extract_base_form"),
    (NanoEventsFactory, "_from_mapping"),
    (Runner, "automatic_retries"),
    (Runner, "metadata_fetcher_root"),
    (Runner, "get_cache"),
    (BaseSourceMapping, "interpret_key"),
    (BaseSourceMapping, "preload_column_source"),
    (BaseSourceMapping, "_column_source"),
    (UprootSourceMapping, "get_column_handle"),
    (UprootSourceMapping, "extract_column"),
    (UUIDOpener, "open_uuid"),
    (DaskExecutor, "__call__"),
)

#: Parameters each callable must accept, in this order (a prefix of its signature).
SIGNATURES = {
    "Runner._work_function": (
        Runner._work_function,
        ("format", "xrootdtimeout", "schema", "use_dataframes", "savemetrics", "item",
         "processor_instance", "uproot_options", "iteritems_options", "checkpointer",
         "cache_function"),
    ),  # fmt: skip
    "Runner.automatic_retries": (
        Runner.automatic_retries,
        ("retries", "skipbadfiles", "func", "args", "use_result_type", "kwargs"),
    ),
    "Runner.metadata_fetcher_root": (
        Runner.metadata_fetcher_root,
        ("xrootdtimeout", "align_clusters", "uproot_options", "item"),
    ),
    "Runner.get_cache": (Runner.get_cache, ("cachestrategy",)),
    "UprootSourceMapping._extract_base_form": (
        UprootSourceMapping._extract_base_form,
        ("tree", "iteritems_options"),
    ),

    "UprootSourceMapping.__init__": (
        UprootSourceMapping.__init__,
        ("self", "fileopener", "start", "stop", "cache", "access_log", "file_handle",
         "use_ak_forth", "virtual"),
    ),  # fmt: skip
    "BaseSourceMapping._column_source": (
        BaseSourceMapping._column_source,
        ("self", "uuid", "path_in_source"),
    ),
    "UprootSourceMapping.get_column_handle": (
        UprootSourceMapping.get_column_handle,
        ("self", "columnsource", "name", "allow_missing"),
    ),
    "UprootSourceMapping.extract_column": (
        UprootSourceMapping.extract_column,
        ("self", "columnhandle", "start", "stop", "allow_missing", "use_ak_forth"),
    ),
    "UUIDOpener.__init__": (UUIDOpener.__init__, ("self", "uuid_pfnmap")),
    "NanoEventsFactory.__init__": (
        NanoEventsFactory.__init__, ("self", "schema", "mapping", "partition_key", "mode"),
    ),
    "WorkItem": (
        WorkItem,
        ("dataset", "filename", "treename", "entrystart", "entrystop", "fileuuid",
         "usermeta", "preload"),
    ),  # fmt: skip
}

#: Parameters each callable must have, in any order (it is called with keywords).
KEYWORD_SIGNATURES = {
    "NanoEventsFactory._from_mapping": (
        NanoEventsFactory._from_mapping,
        ("mapping", "partition_key", "base_form", "schemaclass", "metadata", "mode"),
    ),
}

_WORK_PARAMS = SIGNATURES["Runner._work_function"][1]


def check() -> list[str]:
    """What of the above no longer holds in the installed coffea (empty: all)."""
    problems = []
    for obj, name in NAMES:
        if not hasattr(obj, name):
            problems.append(f"{obj.__module__}.{obj.__qualname__}.{name} is gone")
    for label, (fn, expected) in SIGNATURES.items():
        try:
            params = tuple(inspect.signature(fn).parameters)
        except (TypeError, ValueError) as e:
            problems.append(f"{label}: no signature ({e})")
            continue
        if params[: len(expected)] != expected:
            problems.append(f"{label}{params} no longer starts with {expected}")
    for label, (fn, expected) in KEYWORD_SIGNATURES.items():
        params = set(inspect.signature(fn).parameters)
        if not set(expected) <= params:
            problems.append(f"{label} lacks parameters {sorted(set(expected) - params)}")
    if "buffer_cache" not in inspect.signature(UprootSourceMapping.__init__).parameters:
        problems.append("UprootSourceMapping has no buffer_cache parameter")
    probe = BaseSchema({"fields": [], "contents": [], "parameters": {}})
    if not isinstance(getattr(probe, "_form", None), dict) or "parameters" not in probe._form:
        problems.append("BaseSchema keeps its form elsewhere than _form['parameters']")
    return problems


@dataclass
class RunnerCall:
    """What the ``Runner`` asked the executor to run per chunk: ``automatic_retries``
    arguments, and the ``_work_function`` partial (``inner``) and its arguments but ``item``."""

    retries: int
    skipbadfiles: Any
    use_result_type: bool
    work: dict
    inner: partial

    def coffea_work(self, cache_function=None) -> partial:
        """coffea's own work function, with ``cache_function`` replaced if given."""
        if cache_function is None:
            return self.inner
        return partial(
            self.inner.func,
            *self.inner.args,
            **dict(self.inner.keywords, cache_function=cache_function),
        )

    def run(self, work, arg):
        """``work(arg)`` under coffea's retry and ``skipbadfiles`` rules."""
        return Runner.automatic_retries(
            self.retries, self.skipbadfiles, work, arg, use_result_type=self.use_result_type
        )


def unwrap(function) -> RunnerCall | None:
    """The ``RunnerCall`` in ``partial(Runner.automatic_retries, retries, skipbadfiles,
    partial(Runner._work_function, ..., cache_function=...))``; else ``None``."""
    if not (
        isinstance(function, partial)
        and function.func is Runner.automatic_retries
        and len(function.args) == 3
        and isinstance(function.args[2], partial)
        and function.args[2].func is Runner._work_function
        and set(function.keywords) <= {"use_result_type"}
    ):
        return None
    inner = function.args[2]
    if "cache_function" not in inner.keywords:
        return None
    try:
        bound = inspect.signature(Runner._work_function).bind_partial(
            *inner.args, **inner.keywords
        )
    except TypeError:
        return None
    work = dict(bound.arguments)
    if "item" in work or set(work) != set(_WORK_PARAMS) - {"item"}:
        return None
    retries, skipbadfiles, _ = function.args
    return RunnerCall(
        retries=retries,
        skipbadfiles=skipbadfiles,
        use_result_type=function.keywords.get("use_result_type", False),
        work=work,
        inner=inner,
    )


@dataclass
class MetadataCall:
    """What the ``Runner`` asked the executor to run per file when preprocessing."""

    align_clusters: bool
    function: partial

    @staticmethod
    def result(item: FileMeta, metadata: dict):
        """What ``Runner.metadata_fetcher_root`` returns for ``item`` with ``metadata``."""
        return set_accumulator([FileMeta(item.dataset, item.filename, item.treename, metadata)])


def unwrap_metadata(function) -> MetadataCall | None:
    """The ``MetadataCall`` in a ROOT preprocessing function a ``Runner`` hands its
    executor (``Runner.metadata_fetcher_root`` under ``automatic_retries``); else ``None``."""
    if not (
        isinstance(function, partial)
        and function.func is Runner.automatic_retries
        and len(function.args) == 3
        and isinstance(function.args[2], partial)
        and function.args[2].func is Runner.metadata_fetcher_root
        and len(function.args[2].args) == 3
        and not function.args[2].keywords
        and set(function.keywords) <= {"use_result_type"}
    ):
        return None
    return MetadataCall(align_clusters=bool(function.args[2].args[1]), function=function)


def is_base_schema(schema) -> bool:
    return isinstance(schema, type) and issubclass(schema, schemas.BaseSchema)


def extract_base_form(tree, iteritems_options: dict) -> dict:
    """The NanoEvents base form of a TTree, as ``NanoEventsFactory.from_root`` builds it."""
    base_form = UprootSourceMapping._extract_base_form(tree, iteritems_options=iteritems_options)
    base_form["typenames"] = tree.typenames()
    return base_form


def events_from_form(
    opener: UUIDOpener,
    file_uuid: str,
    object_path: str,
    start: int,
    stop: int,
    base_form: dict,
    schema,
    metadata: dict,
    *,
    access_log: list,
    file_handle: Any,
    buffer_cache: Any = None,
    tree: Any = None,
    packs: dict | None = None,
    schema_instance: Any = None,
):
    """``(factory, mapping)`` of a chunk's virtual NanoEvents from a stored base form, without
    reading the file; with ``packs`` (``PackSourceMapping`` arguments) columns come from packs."""
    common = dict(
        cache={},
        access_log=access_log,
        file_handle=file_handle,
        use_ak_forth=True,
        virtual=True,
    )
    if packs is not None:
        from cacheaffinity.coffea._packs import PackSourceMapping

        mapping = PackSourceMapping(opener, start, stop, **packs, **common)
    else:
        mapping = UprootSourceMapping(opener, start, stop, buffer_cache=buffer_cache, **common)
    if tree is not None:
        mapping.preload_column_source(file_uuid, object_path, tree)
    if schema_instance is not None:
        factory = NanoEventsFactory(
            schema_instance, mapping, tuple_to_key((file_uuid, object_path, f"{start}-{stop}")),
            mode="virtual",
        )
        return factory, mapping
    kwargs = {}
    if "buffer_cache" in inspect.signature(NanoEventsFactory._from_mapping).parameters:
        kwargs["buffer_cache"] = buffer_cache  # coffea 2026.7 (unused there)
    factory = NanoEventsFactory._from_mapping(
        mapping=mapping,
        partition_key=(file_uuid, object_path, f"{start}-{stop}"),
        base_form=base_form,
        schemaclass=schema,
        metadata=metadata,
        mode="virtual",
        **kwargs,
    )
    return factory, mapping


class SchemaCache:
    """A form's NanoEvents schema, built once per process, copied per chunk.

    Built with a probe ``metadata`` dict to learn what the schema adds (NanoAOD:
    ``version``); each chunk's shallow copy has its own top-level parameters, the
    form dicts below are shared read-only.  Thread-safe; keeps ``size`` (LRU).
    """

    def __init__(self, size: int = 64):
        self.size = size
        self._schemas: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def schema(self, key: str, schemaclass, base_form, metadata: dict | None):
        """The chunk's schema; ``base_form()`` gives a fresh copy (the schema may change it)."""
        with self._lock:
            entry = self._schemas.get((key, schemaclass))
            if entry is not None:
                self._schemas.move_to_end((key, schemaclass))
        if entry is None:
            form = base_form()
            probe: dict = {}
            form["parameters"] = dict(form.get("parameters") or {}, metadata=probe)
            built = schemaclass(form)
            if not isinstance(built, BaseSchema):
                raise RuntimeError("Invalid schema type")
            entry = (built, dict(probe))
            with self._lock:
                self._schemas[(key, schemaclass)] = entry
                while len(self._schemas) > self.size:
                    self._schemas.popitem(last=False)
        built, added = entry
        chunk = copy.copy(built)
        parameters = dict(built._form["parameters"])
        parameters["metadata"] = {**(metadata or {}), **added}
        chunk._form = {**built._form, "parameters": parameters}
        return chunk


def accessed_columns(buffer_keys) -> set[str]:
    """``metrics["columns"]`` entries (``"<branch>-<attribute>"``) of buffer keys."""
    out = set()
    for key in buffer_keys:
        try:
            attribute = key_to_tuple(key)[3]
            nodes = BaseSourceMapping.interpret_key(key)[5]
        except Exception:
            continue
        for i, node in enumerate(nodes):
            if node.startswith("!load") and i > 0 and not nodes[i - 1].startswith("!"):
                out.add(f"{nodes[i - 1]}-{attribute}")
    return out


def logged_columns(access_log) -> set[str]:
    """``metrics["columns"]`` entries of an access log, as ``Runner._work_function`` computes them."""
    return {f"{x.branch}-{key_to_tuple(x.buffer_key)[3]}" for x in access_log}
