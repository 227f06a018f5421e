"""coffea's per-chunk work function, made node-cache aware (runs in workers).

:func:`work_function` has the signature of ``coffea.processor.Runner._work_function``
and does the same job (open, build NanoEvents, run the processor, shape the
output and metrics), with two differences:

* the NanoEvents *base form* of a file (what coffea rebuilds from the file's
  branch list for every chunk) comes from the node's
  :class:`~cacheaffinity.worker.forms.FormStore` when it is there; the file is
  then opened only if a column buffer is missing from the column cache, so a
  fully cached chunk touches storage for nothing;
* every file opened and every byte requested from storage is counted in the
  worker plugin's statistics (``storage_opens``, ``storage_bytes``).

Column buffers go through the node cache (``buffer_cache``) as with
``Runner(cachestrategy=cacheaffinity.cachestrategy)``; if the Runner has no
cache strategy, the node cache is used.  Anything this function does not cover
(parquet, dataframes, checkpointing, preloaded branches, non-NanoEvents schemas)
is handed to coffea's own function unchanged.
"""

from __future__ import annotations

import copy
import time
import uuid
from typing import Any

import cloudpickle
import lz4.frame as lz4f
import uproot
from coffea.nanoevents import NanoEventsFactory, schemas
from coffea.nanoevents.mapping import TrivialUprootOpener, UprootSourceMapping
from coffea.nanoevents.util import key_to_tuple
from coffea.processor import ProcessorABC, Runner

from cacheaffinity.worker.forms import FormStore
from cacheaffinity.worker.plugin import worker_cache

__all__ = ["work_function"]


def work_function(
    format: str,
    xrootdtimeout: int,
    schema,
    use_dataframes: bool,
    savemetrics: bool,
    item,
    processor_instance,
    uproot_options: dict,
    iteritems_options: dict,
    checkpointer,
    cache_function,
) -> dict:
    """Drop-in for ``Runner._work_function`` that uses the node's caches."""
    plugin = worker_cache()
    front = cache_function() if cache_function is not None else None
    if front is None:
        front = plugin.front()

    def fallback():
        return Runner._work_function(
            format, xrootdtimeout, schema, use_dataframes, savemetrics, item,
            processor_instance, uproot_options, iteritems_options, checkpointer,
            lambda: front,
        )  # fmt: skip

    work_item = item[0] if processor_instance == "heavy" else item
    if (
        format != "root"
        or use_dataframes
        or checkpointer is not None
        or work_item.preload is not None
        or schema is None
        or not (isinstance(schema, type) and issubclass(schema, schemas.BaseSchema))
        or not work_item.fileuuid
    ):
        return fallback()

    uproot_options = dict(uproot_options)
    xrootdtimeout = uproot_options.pop("timeout", xrootdtimeout)
    if processor_instance == "heavy":
        item, processor_instance = item
    if not isinstance(processor_instance, ProcessorABC) and not callable(processor_instance):
        processor_instance = cloudpickle.loads(lz4f.decompress(processor_instance))

    file_uuid = str(uuid.UUID(bytes=item.fileuuid))
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

    forms = plugin.forms
    form_name = FormStore.key(file_uuid, item.treename, sorted((iteritems_options or {}).items(), key=repr))
    doc = forms.get(form_name) if forms is not None else None
    materialized: list = []
    mapping = None
    tree = None
    opened = []
    try:
        if doc is None:
            try:
                rootdir = uproot.open({item.filename: None}, timeout=xrootdtimeout, **uproot_options)
            except Exception as e:
                raise Exception(f"Failed to open file: {item!r}. The error was: {e!r}.") from e
            opened.append(rootdir.file)
            try:
                tree = rootdir[item.treename]
                base_form = UprootSourceMapping._extract_base_form(
                    tree, iteritems_options=iteritems_options
                )
                base_form["typenames"] = tree.typenames()
                doc = {
                    "base_form": base_form,
                    "object_path": tree.object_path,
                    "num_entries": int(tree.num_entries),
                    "file_uuid": file_uuid,
                    "filename": item.filename,
                }
                if forms is not None and str(rootdir.file.uuid) == file_uuid:
                    forms.put(form_name, doc)
            except Exception as e:
                raise Exception(
                    f"Failed creating nanoevents: {item!r}. The error was: {e!r}."
                ) from e
        try:
            start = max(item.entrystart, 0)
            stop = min(item.entrystop, doc["num_entries"])
            mapping = UprootSourceMapping(
                TrivialUprootOpener({file_uuid: item.filename}, uproot_options),
                start,
                stop,
                cache={},
                access_log=materialized,
                use_ak_forth=True,
                virtual=True,
                buffer_cache=front,
            )
            if tree is not None:
                mapping.preload_column_source(file_uuid, doc["object_path"], tree)
            partition_key = (file_uuid, doc["object_path"], f"{start}-{stop}")
            factory = NanoEventsFactory._from_mapping(
                mapping,
                partition_key,
                copy.deepcopy(doc["base_form"]),
                schema,
                metadata,
                mode="virtual",
            )
            events = factory.events()
        except Exception as e:
            raise Exception(f"Failed creating nanoevents: {item!r}. The error was: {e!r}.") from e

        tic = time.time()
        try:
            if isinstance(processor_instance, ProcessorABC):
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
        if mapping is not None:
            opened.extend(_sources(mapping))
        nbytes, opens = _close(opened)
        plugin.count_storage(opens=opens, nbytes=nbytes)

    if savemetrics:
        metrics: dict[str, Any] = {
            "bytesread": nbytes,
            "columns": {f"{x.branch}-{key_to_tuple(x.buffer_key)[3]}" for x in materialized},
            "entries": len(events),
            "processtime": toc - tic,
        }
        return {"out": out, "metrics": metrics, "processed": {item}}
    return {"out": out, "processed": {item}}


def _sources(mapping) -> list:
    """The ROOT files a mapping opened (coffea keeps them in ``mapping._cache``)."""
    return [
        f
        for f in (getattr(src, "file", None) for src in getattr(mapping, "_cache", {}).values())
        if f is not None
    ]


def _close(files: list) -> tuple[int, int]:
    """Bytes requested from storage by ``files`` and how many; closes them."""
    unique = {id(f): f for f in files}
    nbytes = 0
    for f in unique.values():
        nbytes += int(getattr(getattr(f, "source", None), "num_requested_bytes", 0) or 0)
        try:
            f.close()
        except Exception:
            pass
    return nbytes, len(unique)
