"""Worker side of cacheaffinity: the node-local column cache and its plugin.

Runs in Dask worker processes; never decides placement.  Imports nothing, so
that importing one part of it does not import the rest: the plugin is
:mod:`cacheaffinity.worker._plugin`, the store :mod:`cacheaffinity.worker._store`.
"""
