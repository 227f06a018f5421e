"""The per-chunk memory front of plain entries: :class:`MemoryFront` (runs in workers)."""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, MutableMapping
from typing import Any

from dask.utils import format_bytes

from cacheaffinity import config
from cacheaffinity.worker._store.protocol import ColumnStore, Pack, count_served, get_many, get_packs, put_pack

__all__ = ["MemoryFront"]

_MISSING = object()

#: Every MemoryFront of this process, to replace their locks after fork.
_LIVE: weakref.WeakValueDictionary[int, MemoryFront] = weakref.WeakValueDictionary()


def _reset_locks_after_fork() -> None:
    for front in list(_LIVE.values()):
        front._reset_locks()


os.register_at_fork(after_in_child=_reset_locks_after_fork)


class MemoryFront(MutableMapping, ColumnStore):
    """coffea's ``buffer_cache`` for one chunk: memory in front of a :class:`~cacheaffinity.ColumnCache`.

    coffea asks for the same buffer several times per chunk; this keeps the chunk's
    buffers in a dict bounded in bytes (least recently used go first) and asks the store
    only for the rest (chunk packs pass straight through: a chunk keeps those it read).
    Thread-safe, with store I/O outside the lock; arrays are kept by reference.
    ``__setitem__`` writes through to the store; ``clear()`` empties the store too,
    :meth:`drop_memory` only the memory.

    Parameters
    ----------
    store : cacheaffinity.ColumnStore, MutableMapping or None
        The node's store (another mapping keeps no chunk packs); ``None`` keeps buffers
        in memory only (a worker whose cache directory is unusable).
    capacity : int or str, optional
        Bytes kept in memory; ``None`` reads ``cacheaffinity.worker.memory``.
    """

    def __init__(self, store: MutableMapping | None, capacity: int | str | None = None):
        #: The disk store behind this front (or None).
        self.store: MutableMapping | None = store
        #: Bytes kept in memory at most.
        self.capacity: int = config.get_bytes("worker.memory", capacity)
        self._memory: OrderedDict[str, Any] = OrderedDict()
        #: Bytes held in memory now.
        self.memory_bytes: int = 0
        self._lock = threading.Lock()
        self._counts = dict(hits=0, memory_hits=0, misses=0, bytes_served=0)
        _LIVE[id(self)] = self

    def _reset_locks(self) -> None:
        """A fresh lock in a forked child."""
        self._lock = threading.Lock()

    def _keep(self, key: str, value: Any) -> None:
        nbytes = int(getattr(value, "nbytes", 0))
        with self._lock:
            old = self._memory.pop(key, None)
            if old is not None:
                self.memory_bytes -= int(getattr(old, "nbytes", 0))
            if nbytes > self.capacity:
                return
            self._memory[key] = value
            self.memory_bytes += nbytes
            while self.memory_bytes > self.capacity:
                _, gone = self._memory.popitem(last=False)
                self.memory_bytes -= int(getattr(gone, "nbytes", 0))

    def get(self, key: str, default: Any = None) -> Any:
        """The buffer under ``key`` from memory, else from the store, else ``default``."""
        with self._lock:
            value = self._memory.get(key, _MISSING)
            if value is not _MISSING:
                self._memory.move_to_end(key)
                self._counts["hits"] += 1
                self._counts["memory_hits"] += 1
                self._counts["bytes_served"] += int(getattr(value, "nbytes", 0))
                return value
        value = _MISSING if self.store is None else self.store.get(key, _MISSING)
        if value is _MISSING:
            with self._lock:
                self._counts["misses"] += 1
            return default
        self._keep(key, value)
        with self._lock:
            self._counts["hits"] += 1
            self._counts["bytes_served"] += int(getattr(value, "nbytes", 0))
        return value

    def __getitem__(self, key: str) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def get_many(self, keys: list[str]) -> dict[str, Any]:
        """``{key: buffer}`` of those ``keys`` held in memory or in the store (one store query)."""
        out: dict[str, Any] = {}
        todo = []
        with self._lock:
            for key in keys:
                value = self._memory.get(key, _MISSING)
                if value is _MISSING:
                    todo.append(key)
                    continue
                self._memory.move_to_end(key)
                out[key] = value
                self._counts["hits"] += 1
                self._counts["memory_hits"] += 1
                self._counts["bytes_served"] += int(getattr(value, "nbytes", 0))
        if not todo:
            return out
        found = {} if self.store is None else get_many(self.store, todo)
        for key, value in found.items():
            self._keep(key, value)
        with self._lock:
            self._counts["misses"] += len(todo) - len(found)
            self._counts["hits"] += len(found)
            self._counts["bytes_served"] += sum(
                int(getattr(v, "nbytes", 0)) for v in found.values()
            )
        out.update(found)
        return out

    def get_packs(self, grp: str, start: int, stop: int) -> list[Pack]:
        return [] if self.store is None else get_packs(self.store, grp, start, stop)

    def put_pack(self, grp: str, start: int, stop: int, arrays: dict) -> None:
        if self.store is not None:
            put_pack(self.store, grp, start, stop, arrays)

    def count_served(self, hits: int = 0, misses: int = 0, nbytes: int = 0, peer_hits: int = 0) -> None:
        with self._lock:
            self._counts["hits"] += hits
            self._counts["misses"] += misses
            self._counts["bytes_served"] += nbytes
        if self.store is not None:
            count_served(self.store, hits=hits, misses=misses, nbytes=nbytes, peer_hits=peer_hits)

    def __setitem__(self, key: str, value: Any) -> None:
        if self.store is not None:
            self.store[key] = value  # validates (TypeError) before memory changes
        elif not isinstance(key, str):
            raise TypeError(f"MemoryFront keys are str, got {type(key).__name__}: {key!r}")
        self._keep(key, value)

    def __delitem__(self, key: str) -> None:
        with self._lock:
            old = self._memory.pop(key, _MISSING)
            if old is not _MISSING:
                self.memory_bytes -= int(getattr(old, "nbytes", 0))
        try:
            if self.store is None:
                raise KeyError(key)
            del self.store[key]
        except KeyError:
            if old is _MISSING:
                raise

    def __contains__(self, key: object) -> bool:
        with self._lock:
            if key in self._memory:
                return True
        return self.store is not None and key in self.store

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            memory = list(self._memory)
        seen = set(memory)
        yield from memory
        if self.store is not None:
            for key in self.store:
                if key not in seen:
                    yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def drop_memory(self) -> None:
        """Forget the in-memory buffers (the store keeps its copies)."""
        with self._lock:
            self._memory.clear()
            self.memory_bytes = 0

    def stats(self) -> dict[str, int]:
        """Counters of this front: ``hits`` (memory or disk), ``memory_hits``,
        ``misses``, ``bytes_served``, and ``memory_bytes``/``memory_entries`` now."""
        with self._lock:
            return dict(
                self._counts,
                memory_bytes=self.memory_bytes,
                memory_entries=len(self._memory),
            )

    def __repr__(self) -> str:
        return (
            f"<MemoryFront {len(self._memory)} buffers, {format_bytes(self.memory_bytes)}"
            f" of {format_bytes(self.capacity)} over {self.store!r}>"
        )
