"""Scheduler side of cacheaffinity (runs in the Dask scheduler; never touches disk).

Submodules, from the Dask hooks down:

- :mod:`~cacheaffinity.scheduler.plugin`: :class:`CacheAffinityPlugin`, Dask's
  hooks only; delegates to the modules below.
- :mod:`~cacheaffinity.scheduler.membership`: workers <-> cache nodes, weights.
- :mod:`~cacheaffinity.scheduler.locator`: chunk tasks and their targets, where
  chunks were processed (bounded), the steal preference.
- :mod:`~cacheaffinity.scheduler.stealing`: :class:`LocalityStealing`, stealing of
  chunk tasks; plain tasks keep Dask's own stealing.
- :mod:`~cacheaffinity.scheduler.retargeting`, :mod:`~cacheaffinity.scheduler.queries`:
  moving placed chunk tasks when nodes join or leave; what the plugin answers.
- :mod:`~cacheaffinity.scheduler.inheritance`, :mod:`~cacheaffinity.scheduler.counters`:
  nodes that joined with caches of no record here; per-node counters.
- :mod:`~cacheaffinity.scheduler._distributed`: the only module using
  distributed's undocumented internals (scheduler, dashboard; listed at its top).
- :mod:`~cacheaffinity.scheduler.metrics`, :mod:`~cacheaffinity.scheduler.dashboard`:
  Prometheus collector and dashboard page, reading ``CacheAffinityPlugin.snapshot()``.

No module here imports the plugin: each takes the components it reads as
constructor arguments (the plugin wires them).
"""

from cacheaffinity.scheduler.plugin import CacheAffinityPlugin
from cacheaffinity.scheduler.stealing import LocalityStealing

__all__ = ["CacheAffinityPlugin", "LocalityStealing"]
