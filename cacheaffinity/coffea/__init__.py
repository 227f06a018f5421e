"""cacheaffinity for coffea: the executor and everything that knows coffea.

:class:`~cacheaffinity.CacheAffinityExecutor` (client) places coffea's chunks on
their cache node; :class:`ChunkTask` (workers) runs coffea's work function behind
the identity-checked node caches; :class:`FileIdentity`, :func:`file_identity` and
:func:`chunk_identity` (both) name a file's bytes and a chunk;
:func:`cacheaffinity.cachestrategy` (workers) is the hook for coffea's own
executors.  Only the private ``_adapter`` module uses coffea's private names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cacheaffinity.coffea._executor import CacheAffinityExecutor
    from cacheaffinity.coffea._identity import FileIdentity, chunk_identity, file_identity
    from cacheaffinity.coffea._work import ChunkTask

__all__ = ["CacheAffinityExecutor", "ChunkTask", "FileIdentity", "chunk_identity", "file_identity"]

#: Imported on first use: workers running only plain Dask tasks with
#: ``cachestrategy`` need not import coffea and uproot.
_HOMES = {
    "CacheAffinityExecutor": "_executor",
    "ChunkTask": "_work",
    "FileIdentity": "_identity",
    "chunk_identity": "_identity",
    "file_identity": "_identity",
}


def __getattr__(name):
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
