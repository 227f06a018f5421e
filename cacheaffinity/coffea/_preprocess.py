"""The preprocessing task: coffea's per-file metadata kept in the node cache (workers).

``MetadataTask`` replaces coffea's ROOT preprocessing function (parquet and
functions of other shapes run unchanged): it answers from a JSON document in
the node's form store, keyed by path, tree and identity stamp (a ``stat``, not
an open), and stores coffea's result there on a miss.  A missed task counts its
open in ``storage_opens`` but not the bytes coffea's open reads.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from cacheaffinity.coffea import _adapter as adapter
from cacheaffinity.coffea._identity import file_identity, warn_once
from cacheaffinity.coffea._work import plugin_or_none, report_task
from cacheaffinity.worker._forms import FormStore

logger = logging.getLogger("cacheaffinity.coffea")

__all__ = ["MetadataTask"]

#: Form-store option keying metadata documents apart from the file's form documents.
_KIND = "coffea-metadata"


def _document(item, out) -> dict | None:
    """The file's own metadata in coffea's result ``out`` (None if absent)."""
    if not isinstance(out, (set, frozenset)):  # None: a bad file skipped (skipbadfiles)
        return None
    for meta in out:
        if isinstance(meta, adapter.FileMeta) and meta == item and isinstance(meta.metadata, dict):
            md = meta.metadata
            uuid = md.get("uuid")
            if not isinstance(uuid, bytes) or not isinstance(md.get("numentries"), int):
                return None
            doc: dict[str, Any] = {"numentries": int(md["numentries"]), "uuid": uuid.hex()}
            if "clusters" in md:
                doc["clusters"] = [int(c) for c in md["clusters"]]
            return doc
    return None


def _metadata(item, doc: dict, align_clusters: bool) -> dict | None:
    """coffea's metadata of ``item`` from a stored document (None if unusable)."""
    try:
        md = dict(item.metadata or {})
        md.update(numentries=int(doc["numentries"]), uuid=bytes.fromhex(doc["uuid"]))
        if align_clusters:
            md["clusters"] = [int(c) for c in doc["clusters"]]
        return md
    except (KeyError, TypeError, ValueError):
        return None


class MetadataTask:
    """The function submitted per file instead of the ``Runner``'s preprocessing function."""

    def __init__(self, function):
        self.function = function

    def __dask_tokenize__(self):
        from dask.base import tokenize

        return ("cacheaffinity.MetadataTask", tokenize(self.function))

    def __call__(self, item):
        call = adapter.unwrap_metadata(self.function)
        if call is None or not isinstance(item, adapter.FileMeta):
            return self.function(item)
        tic = time.perf_counter()
        plugin = plugin_or_none()
        if plugin is None or plugin.forms is None or plugin.uncached:
            try:
                return self.function(item)
            finally:
                report_task({"files_preprocessed": 1, "storage_opens": 1,
                             "preprocess_ms": _ms(tic)})  # fmt: skip
        with plugin.task_tally() as tally:
            try:
                return self._cached(item, call, plugin.forms, plugin)
            finally:
                tally.update(files_preprocessed=1, preprocess_ms=_ms(tic))
                report_task(tally)

    def _cached(self, item, call: adapter.MetadataCall, forms: FormStore, plugin):
        try:
            ident = file_identity(item.filename)
        except FileNotFoundError:
            ident = None  # coffea's own error (and skipbadfiles), below
        except (OSError, ValueError) as e:
            warn_once(
                f"preprocess-identity:{type(e).__name__}",
                "cacheaffinity: cannot prove the bytes of %s unchanged (%s); its metadata "
                "is read from the file every run (logged once per condition)", item.filename, e,
            )  # fmt: skip
            ident = None
        if ident is None:
            plugin.count_storage(opens=1, nbytes=0)
            return self.function(item)
        name = FormStore.key(f"{item.filename}|{ident.stamp_token}", item.treename, _KIND)
        expect = ident.as_dict()
        doc = forms.get(name, identity=expect)
        if doc is not None:
            metadata = _metadata(item, doc, call.align_clusters)
            if metadata is not None:
                plugin.count_task(metadata_hits=1)
                return call.result(item, metadata)
        plugin.count_storage(opens=1, nbytes=0)
        out = self.function(item)
        doc = _document(item, out)
        if doc is not None:
            forms.put(name, doc, identity=expect)
        return out


def _ms(tic: float) -> int:
    return max(1, round((time.perf_counter() - tic) * 1000))
