"""coffea's ``buffer_cache`` hook for its own executors (workers).

Imports neither coffea nor uproot: it also runs inside plain Dask tasks.  One
``IdentifiedKeys`` serves one chunk in one thread; the node cache behind it is
thread-safe.  (``CacheAffinityExecutor`` keys by the file's full identity instead.)
"""

from __future__ import annotations

from collections.abc import MutableMapping

from cacheaffinity.worker._plugin import worker_cache
from cacheaffinity.worker._store import protocol

__all__ = ["IdentifiedKeys", "cachestrategy"]


def cachestrategy() -> MutableMapping:
    """coffea ``Runner(cachestrategy=cacheaffinity.cachestrategy)`` hook.

    coffea calls it once per chunk, inside the task.  Returns this worker's node
    cache (a fresh memory front); raises ``RuntimeError`` on a worker without the
    cacheaffinity plugin rather than run uncached.
    """
    return IdentifiedKeys(worker_cache().front())


class IdentifiedKeys(MutableMapping, protocol.ColumnStore):
    """A ``buffer_cache`` that sends to the node cache only keys naming their file.

    coffea's buffer keys start with the file's UUID; a parquet file without
    ``uuid`` metadata gives ``None`` there, shared by different files, so such
    buffers stay in this object's memory (no hit, never a wrong one).
    ``front`` is the node cache's memory front for this chunk.
    """

    UNIDENTIFIED = frozenset({"", "None", "none", "null"})

    def __init__(self, front: MutableMapping):
        self.front = front
        self.local: dict = {}

    def _identified(self, key: str) -> bool:
        return str(key).split("/", 1)[0] not in self.UNIDENTIFIED

    # chunk packs are keyed by the file's identity already
    def get_packs(self, grp: str, start: int, stop: int) -> list:
        return protocol.get_packs(self.front, grp, start, stop)

    def put_pack(self, grp: str, start: int, stop: int, arrays: dict) -> None:
        protocol.put_pack(self.front, grp, start, stop, arrays)

    def count_served(self, hits: int = 0, misses: int = 0, nbytes: int = 0, peer_hits: int = 0) -> None:
        protocol.count_served(self.front, hits=hits, misses=misses, nbytes=nbytes, peer_hits=peer_hits)

    def get(self, key, default=None):
        if self._identified(key):
            return self.front.get(key, default)
        return self.local.get(key, default)

    def __getitem__(self, key):
        return (self.front if self._identified(key) else self.local)[key]

    def get_many(self, keys: list[str]) -> dict:
        """``{key: buffer}`` of the ``keys`` held; identified ones in one index query."""
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
