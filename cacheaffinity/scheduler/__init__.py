"""Scheduler side of cacheaffinity: placement plugin and locality-preserving stealing.

Runs in the Dask scheduler process; never touches disk.
"""

from cacheaffinity.scheduler.plugin import CacheAffinityPlugin
from cacheaffinity.scheduler.stealing import LocalityStealing

__all__ = ["CacheAffinityPlugin", "LocalityStealing"]
