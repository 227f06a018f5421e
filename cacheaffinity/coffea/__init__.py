"""cacheaffinity for coffea: the executor and everything that knows coffea.

Submodules, by the process they run in:

- :mod:`cacheaffinity.coffea._executor` (client): :class:`CacheAffinityExecutor`,
  a ``coffea.processor.DaskExecutor`` placing chunks on their cache node;
- :mod:`cacheaffinity.coffea._work` (workers): :class:`ChunkTask`, coffea's work
  function behind identity-checked node caches;
- :mod:`cacheaffinity.coffea._identity` (both): :class:`FileIdentity`,
  :func:`file_identity`, :func:`chunk_identity`;
- :mod:`cacheaffinity.coffea._buffer_cache` (workers): :func:`cachestrategy`, the
  ``Runner(cachestrategy=...)`` hook for coffea's own executors, and
  :class:`IdentifiedKeys`, which parses coffea's buffer keys;
- :mod:`cacheaffinity.coffea._adapter` (both): the only module that uses coffea
  names that are private or undocumented, listed at its top, checked by
  :func:`cacheaffinity.coffea._adapter.check`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cacheaffinity.coffea._executor import CacheAffinityExecutor
    from cacheaffinity.coffea._identity import FileIdentity, chunk_identity, file_identity
    from cacheaffinity.coffea._work import ChunkTask

__all__ = ["CacheAffinityExecutor", "ChunkTask", "FileIdentity", "chunk_identity", "file_identity"]

#: Where each name of :data:`__all__` is defined.  Imported on first use: the
#: executor and the chunk task import coffea and uproot, which workers running
#: plain Dask tasks with :func:`cacheaffinity.cachestrategy` (in
#: :mod:`._buffer_cache`, which imports neither) need not pay for.
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
