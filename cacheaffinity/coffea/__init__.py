"""cacheaffinity for coffea: the executor and everything that knows coffea.

Submodules, by the process they run in:

- :mod:`cacheaffinity.coffea.executor` (client): :class:`CacheAffinityExecutor`,
  a ``coffea.processor.DaskExecutor`` placing chunks on their cache node;
- :mod:`cacheaffinity.coffea.work` (workers): :class:`ChunkTask`, coffea's work
  function behind identity-checked node caches;
- :mod:`cacheaffinity.coffea.identity` (both): :class:`FileIdentity`,
  :func:`file_identity`, :func:`chunk_identity`;
- :mod:`cacheaffinity.coffea.adapter` (both): the only module that uses coffea
  names that are private or undocumented, listed at its top, checked by
  :func:`cacheaffinity.coffea.adapter.check`.
"""

from __future__ import annotations

from cacheaffinity.coffea.executor import CacheAffinityExecutor
from cacheaffinity.coffea.identity import FileIdentity, chunk_identity, file_identity
from cacheaffinity.coffea.work import ChunkTask

__all__ = ["CacheAffinityExecutor", "ChunkTask", "FileIdentity", "chunk_identity", "file_identity"]
