"""coffea's ``buffer_cache`` hook for its own executors (runs in workers).

Defines :func:`cachestrategy`, the callable to pass as
``coffea.processor.Runner(cachestrategy=cacheaffinity.cachestrategy)``, and
:class:`IdentifiedKeys`, the mapping it returns: the node's column cache for
those of coffea's buffer keys that name their file.  Like the rest of
``cacheaffinity/coffea/`` it is the only place that knows coffea's buffer-key
grammar; the worker side (:mod:`cacheaffinity.worker`) stores whatever keys it
is given.

This module imports neither coffea nor uproot (``cachestrategy()`` is also used
inside plain Dask tasks); :class:`~cacheaffinity.coffea.CacheAffinityExecutor`
does not use it (its chunk tasks key buffers by the full identity of the file's
bytes: :class:`cacheaffinity.coffea._work.IdentityKeyedCache`).

Notes
-----
One :class:`IdentifiedKeys` serves one chunk in one thread (coffea calls
``cachestrategy`` once per chunk, inside the task); the node cache behind it is
thread-safe.  Unidentified keys live in that object's memory only and go with it.
"""

from __future__ import annotations

from collections.abc import MutableMapping

from cacheaffinity.worker._plugin import worker_cache
from cacheaffinity.worker._store import protocol

__all__ = ["IdentifiedKeys", "cachestrategy"]


def cachestrategy() -> IdentifiedKeys:
    """coffea ``Runner(cachestrategy=cacheaffinity.cachestrategy)`` hook.

    coffea calls it once per chunk, inside the task, and passes the result to
    ``NanoEventsFactory.from_root(buffer_cache=...)``.  Returns this worker's
    node cache (a fresh memory front over it) behind :class:`IdentifiedKeys`;
    raises a clear ``RuntimeError`` on a worker without the cacheaffinity
    plugin instead of running uncached silently.
    """
    return IdentifiedKeys(worker_cache().front())


class IdentifiedKeys(MutableMapping, protocol.ColumnStore):
    """A ``buffer_cache`` that sends to the node cache only keys naming their file.

    coffea's buffer keys start with the file's UUID (``<uuid>/<tree>/<start>-<stop>/...``).
    A parquet file without ``uuid`` in its Arrow metadata gives the literal ``None``
    there, so two different files would share keys: such buffers stay in this
    chunk's memory and never reach the disk cache (no hit, never a wrong one).
    :class:`~cacheaffinity.coffea.CacheAffinityExecutor` keys by the file's full
    identity instead and caches those files too.

    Parameters
    ----------
    front : MutableMapping
        The node cache's memory front for this chunk.
    """

    #: UUID parts that do not identify a file.
    UNIDENTIFIED = frozenset({"", "None", "none", "null"})

    def __init__(self, front: MutableMapping):
        self.front = front
        self.local: dict = {}

    def _identified(self, key: str) -> bool:
        return str(key).split("/", 1)[0] not in self.UNIDENTIFIED

    # chunk packs are keyed by the file's identity already: the node's front
    def get_packs(self, grp: str, start: int, stop: int) -> list:
        return protocol.get_packs(self.front, grp, start, stop)

    def put_pack(self, grp: str, start: int, stop: int, arrays: dict) -> None:
        protocol.put_pack(self.front, grp, start, stop, arrays)

    def count_served(self, hits: int = 0, misses: int = 0, nbytes: int = 0) -> None:
        protocol.count_served(self.front, hits=hits, misses=misses, nbytes=nbytes)

    def get(self, key, default=None):
        if self._identified(key):
            return self.front.get(key, default)
        return self.local.get(key, default)

    def __getitem__(self, key):
        return (self.front if self._identified(key) else self.local)[key]

    def get_many(self, keys: list[str]) -> dict:
        """``{key: buffer}`` of those ``keys`` held: the identified ones with one
        ``front.get_many`` call (one index query for all), each looked up once."""
        out: dict = {}
        ids = []
        for key in keys:
            if self._identified(key):
                ids.append(key)
            elif key in self.local:
                out[key] = self.local[key]
        if ids:
            out.update(protocol.get_many(self.front, ids))
        return out

    def __setitem__(self, key, value) -> None:
        (self.front if self._identified(key) else self.local)[key] = value

    def __delitem__(self, key) -> None:
        del (self.front if self._identified(key) else self.local)[key]

    def __iter__(self):
        yield from self.front
        yield from self.local

    def __len__(self) -> int:
        return len(self.front) + len(self.local)
