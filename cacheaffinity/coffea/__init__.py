"""cacheaffinity for coffea: the executor and everything that knows coffea.

Submodules, by the process they run in:

- :mod:`cacheaffinity.coffea.executor` (client): :class:`CacheAffinityExecutor`,
  a ``coffea.processor.DaskExecutor`` placing chunks on their cache node;
- :mod:`cacheaffinity.coffea.work` (workers): :class:`ChunkTask`, coffea's work
  function behind identity-checked node caches;
- :mod:`cacheaffinity.coffea.identity` (both): :class:`FileIdentity`,
  :func:`file_identity`, :func:`chunk_identity`;
- :mod:`cacheaffinity.coffea.buffer_cache` (workers): :func:`cachestrategy`, the
  ``Runner(cachestrategy=...)`` hook for coffea's own executors, and
  :class:`IdentifiedKeys`, which parses coffea's buffer keys;
- :mod:`cacheaffinity.coffea.adapter` (both): the only module that uses coffea
  names that are private or undocumented, listed at its top, checked by
  :func:`cacheaffinity.coffea.adapter.check`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cacheaffinity.coffea.executor import CacheAffinityExecutor
    from cacheaffinity.coffea.identity import FileIdentity, chunk_identity, file_identity
    from cacheaffinity.coffea.work import ChunkTask

__all__ = ["CacheAffinityExecutor", "ChunkTask", "FileIdentity", "chunk_identity", "file_identity"]

#: Where each name of :data:`__all__` is defined.  Imported on first use: the
#: executor and the chunk task import coffea and uproot, which workers running
#: plain Dask tasks with :func:`cacheaffinity.cachestrategy` (in
#: :mod:`.buffer_cache`, which imports neither) need not pay for.
_HOMES = {
    "CacheAffinityExecutor": "executor",
    "ChunkTask": "work",
    "FileIdentity": "identity",
    "chunk_identity": "identity",
    "file_identity": "identity",
}


def __getattr__(name):
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
