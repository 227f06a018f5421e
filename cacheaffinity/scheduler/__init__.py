"""Scheduler side of cacheaffinity: runs in the Dask scheduler, never touches disk.

:class:`~cacheaffinity.CacheAffinityPlugin` places chunk tasks on their cache nodes;
:class:`~cacheaffinity.LocalityStealing` steals chunk tasks without scattering
chunks (plain tasks keep Dask's own stealing). Everything here runs on the
scheduler's event loop and needs no locking. The private submodules take the
components they read as constructor arguments; only the plugin wires them.
"""

from cacheaffinity.scheduler._plugin import CacheAffinityPlugin
from cacheaffinity.scheduler._stealing import LocalityStealing

__all__ = ["CacheAffinityPlugin", "LocalityStealing"]
