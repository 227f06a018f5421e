"""The coffea executor: cache-affine analysis runs (runs in the client).

:class:`CacheAffinityExecutor` is a ``coffea.processor.DaskExecutor`` that

* gives every chunk task its chunk identity (:func:`chunk_identity`:
  ``<file uuid>.<stamp>/<tree>/<start>-<stop>``, the stamp taken from the file's
  size and modification time or storage checksum in every run) and every
  preprocessing task ``file:<path>.<stamp>/<tree>``, so the scheduler plugin
  sends it to the chunk's cache node, run after run, and a file replaced in
  place gets new identities;
* runs chunks through :class:`~cacheaffinity.coffea.work.ChunkTask`, which
  keys column buffers by the identity of the file's bytes and, for plain TTree
  chunks, builds the events from the node's stored form, so a fully cached
  chunk opens no file (``node_cache=False`` keeps coffea's own function and
  caching choices);
* refuses, with a clear message, a client whose scheduler has no cacheaffinity
  plugin.

Everything else (heavy input, compression, tree reduction, retries, progress
bar, error mapping, ``skipbadfiles``, ``use_dataframes``) is ``DaskExecutor``'s
own code: the executor only changes how tasks are submitted.

>>> from coffea import processor  # doctest: +SKIP
>>> run = processor.Runner(
...     executor=CacheAffinityExecutor(client=client),
...     schema=NanoAODSchema, chunksize=100_000,
... )
>>> out = run(fileset, processor_instance=MyProcessor(), treename="Events")
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields

from coffea.processor import DaskExecutor

from cacheaffinity import client as ca_client
from cacheaffinity.coffea import adapter
from cacheaffinity import config
from cacheaffinity.coffea.identity import (
    chunk_identity,
    default_stripe_entries,
    file_identities,
    warn_once,
)
from cacheaffinity.coffea.work import ChunkTask

logger = logging.getLogger("cacheaffinity.coffea")

__all__ = ["CacheAffinityExecutor", "chunk_identity"]


@dataclass
class CacheAffinityExecutor(DaskExecutor):
    """coffea ``DaskExecutor`` that places chunks on their cache node.

    Parameters
    ----------
    client : distributed.Client
        A client of a scheduler running the cacheaffinity plugin.
    node_cache : bool, optional
        Run chunks through the identity-checked node cache (default True).
    place_preprocessing : bool, optional
        Place preprocessing tasks by file as well (default True).
    All other parameters are ``DaskExecutor``'s (``treereduction``,
    ``retries``, ``priority``, ``status``, ``compression``, ``use_dataframes``
    ...).  ``worker_affinity`` is refused: it is coffea's ``hash % n_workers``
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
            if adapter.unwrap(function) is None:
                warn_once(
                    "function-shape",
                    "cacheaffinity: the function coffea's Runner handed the executor has an "
                    "unexpected shape (another caller or coffea version); chunks run with "
                    "coffea's own function, uncached by cacheaffinity",
                )
            else:
                function = ChunkTask(function)
        place = self.place_preprocessing or not preprocessing
        base = DaskExecutor(
            **{f.name: getattr(self, f.name) for f in fields(DaskExecutor) if f.init}
        )
        base.client = _ChunkClient(self.client) if place else self.client
        return DaskExecutor.__call__(base, items, function, accumulator)


class _ChunkClient:
    """The executor's client, with ``map`` attaching chunk identities.

    Every other attribute is the real client's.  A ``map`` over coffea work
    items (or ``(item, heavy input)`` pairs) goes through
    :func:`cacheaffinity.map_chunks`, with file identities taken once per file
    for this run; other maps (the tree reduction) pass through.
    """

    def __init__(self, client):
        self._client = client

    def __getattr__(self, name):
        return getattr(self._client, name)

    def map(self, func, *iterables, **kwargs):
        if len(iterables) == 1:
            items = list(iterables[0])
            firsts = [x[0] if isinstance(x, tuple) and x else x for x in items]
            if items and all(isinstance(x, (adapter.WorkItem, adapter.FileMeta)) for x in firsts):
                identities = file_identities(x.filename for x in firsts)
                stripe = self._stripe_entries(firsts)
                ids = [chunk_identity(x, identities, stripe) for x in firsts]
                entries = [
                    (int(x.entrystart), int(x.entrystop))
                    if isinstance(x, adapter.WorkItem) and 0 <= x.entrystart <= x.entrystop
                    else None
                    for x in firsts
                ]
                return ca_client.map_chunks(
                    self._client, func, items, chunk_ids=ids, entries=entries, **kwargs
                )
        return self._client.map(func, *iterables, **kwargs)

    def _stripe_entries(self, items) -> int | dict[str, int] | None:
        """``client.stripe-entries``, or when it is null ``{filename: S}``
        with each file's default (:func:`default_stripe_entries` of the largest
        chunk end of the run's chunks of that file)."""
        configured = config.get("client.stripe-entries")
        chunks = [x for x in items if hasattr(x, "entrystart")]
        if configured is not None or not chunks:
            return configured
        ends: dict[str, int] = {}
        for x in chunks:
            ends[x.filename] = max(ends.get(x.filename, 0), int(x.entrystop))
        stripes = {f: default_stripe_entries(n) for f, n in ends.items()}
        logger.info(
            "cacheaffinity: placement stripes of %s entries for %d files (set "
            "cacheaffinity.client.stripe-entries to fix one size)",
            "/".join(str(s) for s in sorted(set(stripes.values()))), len(stripes),
        )  # fmt: skip
        return stripes
