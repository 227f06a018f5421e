"""What a column store offers: :class:`ColumnStore`, and :class:`Pack` (runs in workers).

Chunk tasks use a column store (``ColumnCache``, a chunk's ``MemoryFront`` over it, the
``PeerStore`` over that, coffea's buffer-key adapters); any other mapping is wrapped as
a :class:`MappingStore` by :func:`column_store`.  Imports nothing of the project."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, MutableMapping
from typing import Any, NamedTuple, Protocol, runtime_checkable

__all__ = [
    "ColumnStore",
    "MappingStore",
    "Pack",
    "column_store",
    "count_served",
    "fetch_packs",
    "get_many",
    "get_packs",
    "put_pack",
]

_MISSING = object()


class Pack(NamedTuple):
    """A chunk pack read back: entry range, ``{member: array}`` (views of one buffer)
    and the bytes it takes in the cache (whole blocks; 0 when not known)."""

    start: int
    stop: int
    members: dict
    size: int = 0


@runtime_checkable
class ColumnStore(Protocol):
    """A store of column buffers (plain entries by key) and chunk packs.

    Implementations subclass it; the abstract methods must be written,
    :meth:`fetch_packs` has a default (a store that asks no other node)."""

    @abstractmethod
    def get(self, key: str, default: Any = None) -> Any:
        """The buffer stored under ``key``, or ``default``."""

    @abstractmethod
    def get_many(self, keys: list[str]) -> dict[str, Any]:
        """``{key: buffer}`` of those ``keys`` the store holds, each looked up once."""

    @abstractmethod
    def get_packs(self, grp: str, start: int, stop: int) -> list[Pack]:
        """The chunk packs of ``grp`` overlapping ``[start, stop)`` held here (``[]`` if none are kept)."""

    @abstractmethod
    def put_pack(self, grp: str, start: int, stop: int, arrays: dict) -> object:
        """Keep the columns a chunk read for ``[start, stop)`` of ``grp`` as one pack (if packs are kept)."""

    @abstractmethod
    def count_served(self, hits: int = 0, misses: int = 0, nbytes: int = 0, peer_hits: int = 0) -> None:
        """Count lookups of packs: ``hits`` answered by packs (``peer_hits`` of them by packs
        fetched from other nodes), ``misses`` not; a store without counters does nothing."""

    def fetch_packs(self, grp: str, start: int, stop: int) -> list[Pack]:
        """Chunk packs of ``grp`` overlapping ``[start, stop)`` from other nodes (this default: ``[]``)."""
        return []


class MappingStore(ColumnStore):
    """A plain mapping as a :class:`ColumnStore`: its keys, no chunk packs (never written by ``put_pack``)."""

    def __init__(self, mapping: Mapping | MutableMapping):
        self.mapping = mapping

    def get(self, key: str, default: Any = None) -> Any:
        return self.mapping.get(key, default)

    def get_many(self, keys: list[str]) -> dict[str, Any]:
        out = {}
        for k in keys:
            v = self.mapping.get(k, _MISSING)
            if v is not _MISSING:
                out[k] = v
        return out

    def get_packs(self, grp: str, start: int, stop: int) -> list[Pack]:
        return []  # a mapping holds no packs

    def put_pack(self, grp: str, start: int, stop: int, arrays: dict) -> None:
        return None  # nor keeps them

    def count_served(self, hits: int = 0, misses: int = 0, nbytes: int = 0, peer_hits: int = 0) -> None:
        return None  # nor counts lookups


def column_store(store: ColumnStore | Mapping) -> ColumnStore:
    """``store`` itself if it is a :class:`ColumnStore`, else its :class:`MappingStore`."""
    return store if isinstance(store, ColumnStore) else MappingStore(store)


def get_many(store: ColumnStore | Mapping, keys: list[str]) -> dict[str, Any]:
    """``{key: value}`` of those ``keys`` that ``store`` holds, each looked up once."""
    return column_store(store).get_many(keys)


def get_packs(store: ColumnStore | Mapping, grp: str, start: int, stop: int) -> list[Pack]:
    """The chunk packs of ``grp`` overlapping ``[start, stop)`` that ``store`` holds."""
    return column_store(store).get_packs(grp, start, stop)


def put_pack(store: ColumnStore | Mapping, grp: str, start: int, stop: int, arrays: dict) -> None:
    """Keep a chunk pack in ``store`` (nothing for a store without packs)."""
    column_store(store).put_pack(grp, start, stop, arrays)


def count_served(
    store: ColumnStore | Mapping, hits: int = 0, misses: int = 0, nbytes: int = 0, peer_hits: int = 0
) -> None:
    """Add pack lookups to ``store``'s counters (nothing for a store without them): ``hits``
    include the ``peer_hits``, lookups answered by packs fetched from other nodes."""
    column_store(store).count_served(hits=hits, misses=misses, nbytes=nbytes, peer_hits=peer_hits)


def fetch_packs(store: ColumnStore | Mapping, grp: str, start: int, stop: int) -> list[Pack]:
    """Chunk packs of ``grp`` overlapping ``[start, stop)`` from other nodes if ``store``
    asks them (a ``PeerStore``; stored locally too), else ``[]``."""
    return column_store(store).fetch_packs(grp, start, stop)
