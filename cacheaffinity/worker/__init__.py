"""Worker side of cacheaffinity: the node-local column cache and its plugin.

Runs in Dask worker processes; never decides placement.  Imports nothing, so that
importing one part does not import the rest; the public names
(:class:`~cacheaffinity.CacheWorkerPlugin`, :class:`~cacheaffinity.ColumnCache`,
:class:`~cacheaffinity.MemoryFront`) are re-exported by :mod:`cacheaffinity`."""
