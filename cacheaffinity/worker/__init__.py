"""Worker side of cacheaffinity: the node-local column cache and its plugin.

Runs in Dask worker processes; never decides placement.
"""

from cacheaffinity.worker.node import read_or_create_node_id
from cacheaffinity.worker.plugin import CacheWorkerPlugin, worker_cache
from cacheaffinity.worker.store import ColumnCache, MemoryFront

__all__ = [
    "CacheWorkerPlugin",
    "ColumnCache",
    "MemoryFront",
    "read_or_create_node_id",
    "worker_cache",
]
