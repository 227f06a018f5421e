"""The chunk task: coffea's work function behind identity-checked node caches (workers).

Retries, ``skipbadfiles`` and ``use_result_type`` stay coffea's
(``Runner.automatic_retries``), and so does the wording of its errors.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid as uuidlib
from collections.abc import MutableMapping
from typing import Any

import uproot

from cacheaffinity.coffea import _adapter as adapter
from cacheaffinity.coffea._packs import branch_kinds
from cacheaffinity.coffea._identity import (
    FileIdentity,
    IdentityUnavailable,
    file_identity,
    parquet_footer_digest,
    warn_once,
)
from cacheaffinity.worker._forms import FormStore

logger = logging.getLogger("cacheaffinity.coffea")

__all__ = ["ChunkTask", "IdentityKeyedCache", "LazyFile", "plugin_or_none", "report_task"]

_MISSING = object()


class IdentityKeyedCache(MutableMapping):
    """A ``buffer_cache`` prefixing coffea's keys with ``FileIdentity.token``.

    Keys served from the cache are appended to ``hits`` (for ``metrics["columns"]``).
    """

    def __init__(self, store: MutableMapping, token: str, hits: list):
        self.store = store
        self.token = token
        self.hits = hits

    def _key(self, key: str) -> str:
        return f"{self.token}/{key}"

    def get(self, key, default=None):
        value = self.store.get(self._key(key), _MISSING)
        if value is _MISSING:
            return default
        self.hits.append(key)
        return value

    def __getitem__(self, key):
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __setitem__(self, key, value) -> None:
        self.store[self._key(key)] = value

    def __delitem__(self, key) -> None:
        del self.store[self._key(key)]

    def __iter__(self):
        prefix = f"{self.token}/"
        return (k[len(prefix) :] for k in self.store if k.startswith(prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class _Opener(adapter.UUIDOpener):
    """Opens the chunk's file at most once, checks its UUID, counts and closes."""

    class Stale(RuntimeError):
        pass

    def __init__(self, uuid_pfnmap: dict, timeout, uproot_options: dict):
        super().__init__(uuid_pfnmap)
        self._timeout = timeout
        self._options = uproot_options
        self.opened: dict[str, Any] = {}

    def open_uuid(self, uuid: str):
        rootdir = self.opened.get(uuid)
        if rootdir is None:
            pfn = self._uuid_pfnmap[uuid]
            rootdir = uproot.open({pfn: None}, timeout=self._timeout, **self._options)
            self.opened[uuid] = rootdir
            if str(rootdir.file.uuid) != uuid:
                raise _Opener.Stale(
                    f"UUID of file {pfn} is {rootdir.file.uuid}, the work item says {uuid}"
                )
        return rootdir

    def close(self) -> tuple[int, int]:
        """Close what was opened; returns (bytes requested from storage, files)."""
        nbytes = 0
        for rootdir in self.opened.values():
            source = getattr(rootdir.file, "source", None)
            nbytes += int(getattr(source, "num_requested_bytes", 0) or 0)
            try:
                rootdir.close()
            except Exception:
                pass
        n = len(self.opened)
        self.opened = {}
        return nbytes, n


class LazyFile:
    """``factory.file_handle`` of a chunk run from a stored form: the file's
    ``uproot.ReadOnlyDirectory``, opened on first use and closed with the chunk."""

    def __init__(self, opener: _Opener, uuid: str):
        self._opener = opener
        self._uuid = uuid

    def _directory(self):
        return self._opener.open_uuid(self._uuid)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._directory(), name)

    def __getitem__(self, key):
        return self._directory()[key]

    def __contains__(self, key) -> bool:
        return key in self._directory()

    def __iter__(self):
        return iter(self._directory())

    def __len__(self) -> int:
        return len(self._directory())

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def __repr__(self) -> str:
        state = "open" if self._uuid in self._opener.opened else "not opened yet"
        return f"<LazyFile {self._opener._uuid_pfnmap[self._uuid]} ({state})>"


def _shared_form(doc: dict) -> dict:
    """``doc`` with ``form_digest``, its ``base_form`` and ``branch_kinds`` shared
    with every document of an equal base form (the files of one dataset)."""
    if "form_digest" in doc:
        return doc
    text = json.dumps(doc["base_form"], sort_keys=True, separators=(",", ":"))
    digest = hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
    shared = _FORMS.get(digest)
    if shared is None:
        if len(_FORMS) >= _DOCS_SIZE:
            _FORMS.pop(next(iter(_FORMS)), None)
        shared = _FORMS[digest] = (doc["base_form"], doc["branch_kinds"])
    return {**doc, "base_form": shared[0], "branch_kinds": shared[1], "form_digest": digest}


def plugin_or_none():
    """The worker's cacheaffinity plugin, or None (logged once)."""
    from cacheaffinity.worker._plugin import worker_cache

    try:
        return worker_cache()
    except (RuntimeError, ValueError) as e:
        warn_once("no-plugin", "cacheaffinity: %s; chunks run uncached", e)
        return None


def _with_peers(store, plugin):
    """``store``, asking other nodes for what it misses (``worker.peer-fetch``)
    when this runs as a chunk task in a worker."""
    if not getattr(plugin, "peer_fetch", False):
        return store
    from distributed import get_worker

    from cacheaffinity.worker._peers import PeerStore, task_annotations

    try:
        worker = get_worker()
    except ValueError:  # not in a worker (e.g. coffea's own executors in tests)
        return store
    annotations = task_annotations(worker)
    if not annotations:
        return store
    return PeerStore(store, worker, plugin, annotations)


def _identity(item, fmt: str) -> FileIdentity:
    ident = file_identity(item.filename)
    if fmt == "parquet":
        return ident.with_content("parquet:" + parquet_footer_digest(item.filename))
    if isinstance(item.fileuuid, bytes) and len(item.fileuuid) == 16:
        return ident.with_content(str(uuidlib.UUID(bytes=item.fileuuid)))
    raise IdentityUnavailable(f"work item of {item.filename} has no file UUID")


class ChunkTask:
    """The function ``CacheAffinityExecutor`` submits per chunk instead of the ``Runner``'s.

    Every column buffer is keyed by the identity of the file's bytes, taken
    now, so a cache entry never outlives its bytes.  A plain TTree chunk
    (NanoEvents schema, no preload, checkpointer or dataframes) runs from the
    node's stored form and chunk packs, opening the file only for a missing
    column or ``factory.file_handle``; other chunks run coffea's work function
    with the identity-keyed cache; where the identity cannot be proven, coffea's
    function runs uncached (logged once).  Columns served from the cache are
    added to ``metrics["columns"]``; the task's figures go to the scheduler.

    Parameters
    ----------
    function
        What the ``Runner`` handed the executor.
    """

    def __init__(self, function):
        self.function = function

    def __dask_tokenize__(self):
        from dask.base import tokenize

        return ("cacheaffinity.ChunkTask", tokenize(self.function))

    def __call__(self, arg):
        item = arg[0] if isinstance(arg, tuple) else arg
        call = adapter.unwrap(self.function)
        if call is None or not isinstance(item, adapter.WorkItem):
            return self.function(arg)
        plugin = plugin_or_none()
        if plugin is None or plugin.cache is None or plugin.uncached:
            out = self.function(arg)
            report_task({"chunks": 1, "uncached_chunks": 1})
            return out
        with plugin.task_tally() as tally:
            out = self._cached(arg, item, call, plugin)
        tally["chunks"] += 1
        report_task(tally)
        return out

    def _cached(self, arg, item, call, plugin):
        fmt = call.work["format"]
        try:
            ident = _identity(item, fmt)
        except FileNotFoundError:
            ident = None  # coffea's own error (and skipbadfiles), below
        except (OSError, ValueError) as e:
            warn_once(
                f"identity:{type(e).__name__}",
                "cacheaffinity: cannot prove the bytes of %s unchanged (%s); such chunks "
                "run uncached (logged once per condition)", item.filename, e,
            )  # fmt: skip
            plugin.count_task(uncached_chunks=1)
            ident = None
        if ident is None:
            # Outside the except clauses: an error of coffea's (a deleted file) is then
            # not chained to our stat ("During handling of the above exception ...").
            return self.function(arg)

        hits: list[str] = []
        user_cache = call.work["cache_function"]

        def raw_store():
            store = user_cache() if user_cache is not None else None
            return plugin.front() if store is None else store

        def cache_function():
            return IdentityKeyedCache(raw_store(), ident.token, hits)

        coffea_work = call.coffea_work(cache_function)
        if _fast_path_applies(call, item):

            def work(a):
                return _run_from_form(call, a, ident, plugin, raw_store, coffea_work)

        else:
            work = coffea_work
        out = call.run(work, arg)
        if call.work["savemetrics"] and isinstance(out, dict) and "metrics" in out:
            columns = out["metrics"].get("columns")
            if isinstance(columns, set):
                columns |= adapter.accessed_columns(hits)
        return out


def report_task(figures) -> None:
    """Send this task's figures to the scheduler, which adds them to its run (no-op outside a worker)."""
    from distributed import get_worker

    from cacheaffinity.protocol import RUN_ANNOTATION, TASK_REPORT_TOPIC

    try:
        worker = get_worker()
        key = worker.get_current_task()
    except Exception:  # not in a worker task (coffea's own executors in tests)
        return
    ts = worker.state.tasks.get(key)
    run = (getattr(ts, "annotations", None) or {}).get(RUN_ANNOTATION)
    msg = {k: int(v) for k, v in dict(figures).items() if v}
    msg.update(key=str(key), run=run)
    try:
        worker.log_event(TASK_REPORT_TOPIC, msg)
    except Exception as e:  # a closing worker: the figures of this task are lost
        logger.debug("cacheaffinity: task figures not sent: %r", e)


_FAST_PATH_PROBLEMS: list[str] | None = None
#: False caches coffea's buffers as plain entries instead of chunk packs: only for
#: ``benchmarks/chunksize_change.py`` (set with ``client.run``), not a setting.
CHUNK_PACKS = True
#: Fields of a stored TTree form document (documents without them are rebuilt).
_DOC_FIELDS = ("base_form", "object_path", "num_entries", "branch_kinds")
#: Schemas built once per form and process, keyed by the form's digest.
SCHEMAS = adapter.SchemaCache()
#: Parsed base forms by digest: one per dataset's form, not per file (every object
#: kept alive is walked by each of Python's full collections).
_FORMS: dict[str, tuple[dict, dict]] = {}
#: Form documents read in this process, by form name (which carries the file's identity).
_DOCS: dict = {}
_DOCS_SIZE = 64


def _fast_path_applies(call: adapter.RunnerCall, item) -> bool:
    global _FAST_PATH_PROBLEMS
    if _FAST_PATH_PROBLEMS is None:
        _FAST_PATH_PROBLEMS = adapter.check()
        if _FAST_PATH_PROBLEMS:
            warn_once(
                "adapter",
                "cacheaffinity: the installed coffea differs from what cacheaffinity.coffea._adapter "
                "expects (%s); chunks open their files as coffea does (columns stay cached)",
                "; ".join(_FAST_PATH_PROBLEMS),
            )
    w = call.work
    return (
        not _FAST_PATH_PROBLEMS
        and w["format"] == "root"
        and not w["use_dataframes"]
        and w["checkpointer"] is None
        and item.preload is None
        and adapter.is_base_schema(w["schema"])
    )


def _run_from_form(call, arg, ident: FileIdentity, plugin, raw_store, coffea_work):
    """One TTree chunk from the node's stored form and chunk packs; coffea's
    function where that cannot be done (RNTuple, UUID differs from the item)."""
    import cloudpickle
    import lz4.frame as lz4f

    w = call.work
    processor_instance = w["processor_instance"]
    item = arg
    if processor_instance == "heavy":
        item, processor_instance = arg
    uproot_options = dict(w["uproot_options"] or {})
    timeout = uproot_options.pop("timeout", w["xrootdtimeout"])
    iteritems_options = w["iteritems_options"] or {}
    file_uuid = ident.content
    forms = plugin.forms
    form_name = FormStore.key(ident.token, item.treename, sorted(iteritems_options.items(), key=repr))
    expect = ident.as_dict()
    doc = _DOCS.get((id(forms), form_name))
    if doc is None and forms is not None:
        doc = forms.get(form_name, identity=expect)
    if doc is not None and doc.get("kind") == "TTree" and not set(_DOC_FIELDS) <= set(doc):
        doc = None  # an older document without cluster offsets: rebuilt
    raw = raw_store()
    store = _with_peers(raw, plugin)
    if doc is None and hasattr(store, "form"):
        # another node ran a chunk of this file: its form spares opening the file
        doc = store.form(form_name, expect)
        if doc is not None and (doc.get("kind") != "TTree" or not set(_DOC_FIELDS) <= set(doc)):
            doc = None
        if doc is not None and forms is not None:
            forms.put(form_name, doc, identity=expect)
    opener = _Opener({file_uuid: item.filename}, timeout, uproot_options)
    tree = None
    mapping = None
    try:
        if doc is None:
            try:
                rootdir = opener.open_uuid(file_uuid)
                tree = rootdir[item.treename]
            except _Opener.Stale as e:
                warn_once(
                    "stale-item",
                    "cacheaffinity: %s (the file was replaced since the client read its "
                    "metadata); such chunks run through coffea's own function", e,
                )  # fmt: skip
                return coffea_work(arg)
            except Exception:
                return coffea_work(arg)  # coffea raises its own error for this file
            if isinstance(tree, uproot.behaviors.TTree.TTree):
                base_form = adapter.extract_base_form(tree, iteritems_options)
                doc = {
                    "kind": "TTree",
                    "base_form": base_form,
                    "object_path": tree.object_path,
                    "num_entries": int(tree.num_entries),
                    "branch_kinds": branch_kinds(base_form),
                }
            else:
                doc = {"kind": type(tree).__name__}
            if forms is not None:
                forms.put(form_name, doc, identity=expect)
        if doc.get("kind") != "TTree" or not set(_DOC_FIELDS) <= set(doc):
            return coffea_work(arg)
        doc = _shared_form(doc)

        if not isinstance(processor_instance, adapter.ProcessorABC) and not callable(processor_instance):
            processor_instance = cloudpickle.loads(lz4f.decompress(processor_instance))
        metadata = {
            "dataset": item.dataset,
            "filename": item.filename,
            "treename": item.treename,
            "entrystart": item.entrystart,
            "entrystop": item.entrystop,
            "fileuuid": file_uuid,
        }
        if item.usermeta is not None:
            metadata.update(item.usermeta)
        start = max(item.entrystart, 0)
        stop = min(item.entrystop, doc["num_entries"])
        materialized: list = []
        base_form = doc["base_form"]
        try:
            # a user's own cache_function mapping (no get_packs) gets coffea's buffers
            if CHUNK_PACKS and callable(getattr(raw, "get_packs", None)):
                source = {"packs": {
                    "store": store,
                    "token": ident.token,
                    "treepath": doc["object_path"],
                    "kinds": doc["branch_kinds"],
                    "forms": dict(zip(base_form.get("fields") or (), base_form.get("contents") or ()))
                    if start >= stop else None,
                }}
            else:
                source = {"buffer_cache": IdentityKeyedCache(raw, ident.token, [])}
            if doc.get("kind") == "TTree":
                if len(_DOCS) >= _DOCS_SIZE:
                    _DOCS.pop(next(iter(_DOCS)), None)
                _DOCS[(id(forms), form_name)] = doc  # per node store (in-process clusters)
            schema = SCHEMAS.schema(
                doc["form_digest"], w["schema"], lambda: json.loads(json.dumps(base_form)), metadata
            )
            factory, mapping = adapter.events_from_form(
                opener, file_uuid, doc["object_path"], start, stop,
                None, w["schema"], metadata, schema_instance=schema,
                access_log=materialized,
                file_handle=LazyFile(opener, file_uuid),
                tree=tree,
                **source,
            )  # fmt: skip
            events = factory.events()
        except Exception as e:
            raise Exception(f"Failed creating nanoevents: {item!r}. The error was: {e!r}.") from e
        tic = time.time()
        try:
            if isinstance(processor_instance, adapter.ProcessorABC):
                out = processor_instance.process(events)
            else:
                out = processor_instance(events)
        except Exception as e:
            raise Exception(f"Failed processing file: {item!r}. The error was: {e!r}.") from e
        if out is None:
            raise ValueError(
                "Output of process() should not be None. Make sure your processor's "
                "process() function returns an accumulator."
            )
        toc = time.time()
    finally:
        if mapping is not None and hasattr(mapping, "finish"):
            mapping.finish()
        nbytes, opens = opener.close()
        plugin.count_storage(opens=opens, nbytes=nbytes)
        plugin.after_chunk()

    if w["savemetrics"]:
        metrics: dict[str, Any] = {
            "bytesread": nbytes,
            "columns": adapter.logged_columns(materialized)
            | adapter.accessed_columns(getattr(mapping, "served_keys", ())),
            "entries": len(events),
            "processtime": toc - tic,
        }
        return {"out": out, "metrics": metrics, "processed": {item}}
    return {"out": out, "processed": {item}}
