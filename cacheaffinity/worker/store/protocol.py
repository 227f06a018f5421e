"""What a column store offers, and its defaults, in one place (runs in workers).

Every mapping the chunk tasks read through (:class:`~.cache.ColumnCache`,
:class:`~.front.MemoryFront`, :class:`~cacheaffinity.worker.peers.PeerStore`,
coffea's buffer-key adapters, a user's plain dict) is used through these
functions, so the fallbacks for a mapping that lacks a method are written once:

- :func:`get_many`: ``{key: value}`` of the keys the store holds (its own
  ``get_many``, one index query, when it has one);
- :func:`get_packs` / :func:`put_pack`: chunk packs (no packs: ``[]`` / not stored);
- :func:`count_served`: lookups answered from packs, for the store's counters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["count_served", "fetch_packs", "get_many", "get_packs", "put_pack"]

_MISSING = object()


def get_many(store: Mapping, keys: list[str]) -> dict[str, Any]:
    """``{key: value}`` of those ``keys`` that ``store`` holds, each looked up once."""
    method = getattr(store, "get_many", None)
    if method is not None:
        return method(keys)
    out = {}
    for k in keys:
        v = store.get(k, _MISSING)
        if v is not _MISSING:
            out[k] = v
    return out


def get_packs(store: Any, grp: str, start: int, stop: int) -> list:
    """The chunk packs of ``grp`` overlapping ``[start, stop)`` that ``store`` holds."""
    method = getattr(store, "get_packs", None)
    return [] if method is None else method(grp, start, stop)


def put_pack(store: Any, grp: str, start: int, stop: int, arrays: dict) -> bool:
    """Store a chunk pack if ``store`` keeps packs; whether it does."""
    method = getattr(store, "put_pack", None)
    if method is None:
        return False
    method(grp, start, stop, arrays)
    return True


def count_served(store: Any, hits: int = 0, misses: int = 0, nbytes: int = 0) -> None:
    """Add pack lookups to ``store``'s counters, if it counts."""
    method = getattr(store, "count_served", None)
    if method is not None:
        method(hits=hits, misses=misses, nbytes=nbytes)


def fetch_packs(store: Any, grp: str, start: int, stop: int) -> list:
    """Chunk packs of ``grp`` overlapping ``[start, stop)`` from other nodes, if
    ``store`` can ask them (:class:`~cacheaffinity.worker.peers.PeerStore`);
    they are stored locally too."""
    method = getattr(store, "fetch_packs", None)
    return [] if method is None else method(grp, start, stop)
