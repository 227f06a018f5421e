"""Compatibility alias (client): the executor moved to :mod:`cacheaffinity.coffea`."""

from cacheaffinity.coffea.executor import CacheAffinityExecutor, chunk_identity

__all__ = ["CacheAffinityExecutor", "chunk_identity"]
