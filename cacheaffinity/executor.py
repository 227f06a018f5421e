"""The coffea executor: cache-affine analysis runs (runs in the client).

:class:`CacheAffinityExecutor` is a ``coffea.processor.DaskExecutor`` that

* gives every chunk task its chunk identity ``<file uuid>/<tree>/<start>-<stop>``
  (and every preprocessing task ``file:<path>/<tree>``), so the scheduler plugin
  sends it to the chunk's cache node, run after run;
* runs chunks with :func:`cacheaffinity.worker.nanoevents.work_function`, which
  reads column buffers and the file's NanoEvents form from the node's cache, so
  a fully cached chunk opens no file (``node_cache=False`` keeps coffea's own
  work function);
* refuses, with a clear message, a client whose scheduler has no cacheaffinity
  plugin.

Everything else (heavy input, compression, tree reduction, retries, progress
bar, error mapping, ``skipbadfiles``) is ``DaskExecutor``'s own code: the
executor only changes how tasks are submitted.

>>> from coffea import processor  # doctest: +SKIP
>>> run = processor.Runner(
...     executor=CacheAffinityExecutor(client=client),
...     schema=NanoAODSchema, chunksize=100_000,
... )
>>> out = run(fileset, processor_instance=MyProcessor(), treename="Events")
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

from coffea.processor import DaskExecutor, Runner
from coffea.processor.executor import FileMeta, WorkItem

from cacheaffinity import client as ca_client

logger = logging.getLogger("cacheaffinity.executor")

__all__ = ["CacheAffinityExecutor", "chunk_identity"]


def chunk_identity(item: Any) -> str | None:
    """The chunk identity of a coffea work item (or ``(item, heavy)`` pair).

    ``<file uuid>/<tree>/<start>-<stop>`` for a :class:`WorkItem` (the same data
    has the same identity whoever reads it and from wherever), ``file:<path>/<tree>``
    for a preprocessing :class:`FileMeta`, ``None`` for anything else.
    """
    if isinstance(item, tuple) and item and isinstance(item[0], (WorkItem, FileMeta)):
        item = item[0]
    if isinstance(item, WorkItem):
        file_id = str(uuid.UUID(bytes=item.fileuuid)) if item.fileuuid else item.filename
        return f"{file_id}/{item.treename}/{item.entrystart}-{item.entrystop}"
    if isinstance(item, FileMeta):
        return f"file:{item.filename}/{item.treename}"
    return None


@dataclass
class CacheAffinityExecutor(DaskExecutor):
    """coffea ``DaskExecutor`` that places chunks on their cache node.

    Parameters
    ----------
    client : distributed.Client
        A client of a scheduler running the cacheaffinity plugin.
    node_cache : bool, optional
        Run chunks with the node-cache-aware work function (default True):
        column buffers and NanoEvents forms from the node's cache.
    place_preprocessing : bool, optional
        Place preprocessing tasks by file as well (default True).
    All other parameters are ``DaskExecutor``'s (``treereduction``,
    ``retries``, ``priority``, ``status``, ``compression`` ...).
    ``worker_affinity`` is refused: it is coffea's ``hash % n_workers``
    placement, which this executor replaces.
    """

    node_cache: bool = True
    place_preprocessing: bool = True

    def __call__(self, items, function, accumulator):
        if len(items) == 0:
            return accumulator
        if self.worker_affinity:
            raise ValueError(
                "CacheAffinityExecutor(worker_affinity=True): worker_affinity is coffea's "
                "hash % n_workers placement, which CacheAffinityExecutor replaces; "
                "drop worker_affinity=True"
            )
        if self.client is None:
            raise ValueError(
                "CacheAffinityExecutor needs a client of a scheduler running cacheaffinity: "
                "CacheAffinityExecutor(client=Client(scheduler_address))"
            )
        ca_client.check(self.client)
        preprocessing = self.function_name == "get_metadata"
        if self.node_cache and not preprocessing:
            function = _with_node_work_function(function)
        place = self.place_preprocessing or not preprocessing
        base = DaskExecutor(
            **{f.name: getattr(self, f.name) for f in fields(DaskExecutor) if f.init}
        )
        base.client = _ChunkClient(self.client) if place else self.client
        return DaskExecutor.__call__(base, items, function, accumulator)


def _with_node_work_function(function):
    """Swap coffea's ``Runner._work_function`` for the node-cache-aware one.

    ``function`` is ``partial(Runner.automatic_retries, retries, skipbadfiles,
    partial(Runner._work_function, ...), use_result_type=...)``; anything else is
    returned unchanged (the chunks then use the column cache only if the Runner
    has a cache strategy).
    """
    from cacheaffinity.worker.nanoevents import work_function

    if (
        isinstance(function, partial)
        and function.func is Runner.automatic_retries
        and len(function.args) >= 3
        and isinstance(function.args[2], partial)
        and function.args[2].func is Runner._work_function
    ):
        inner = function.args[2]
        swapped = partial(work_function, *inner.args, **inner.keywords)
        return partial(function.func, *function.args[:2], swapped, *function.args[3:], **function.keywords)
    logger.info(
        "cacheaffinity: coffea's work function has an unexpected shape; chunks keep "
        "coffea's own function (column cache only via Runner(cachestrategy=...))"
    )
    return function


class _ChunkClient:
    """The executor's client, with ``map`` attaching chunk identities.

    Every other attribute is the real client's.  A ``map`` over coffea work
    items (or ``(item, heavy input)`` pairs) goes through
    :func:`cacheaffinity.map_chunks`; other maps (the tree reduction) pass through.
    """

    def __init__(self, client):
        self._client = client

    def __getattr__(self, name):
        return getattr(self._client, name)

    def map(self, func, *iterables, **kwargs):
        if len(iterables) == 1:
            items = list(iterables[0])
            ids = [chunk_identity(x) for x in items]
            if items and all(i is not None for i in ids):
                return ca_client.map_chunks(self._client, func, items, chunk_ids=ids, **kwargs)
        return self._client.map(func, *iterables, **kwargs)
