"""Names the client, scheduler and worker sides agree on (constants only)."""

from __future__ import annotations

#: Task annotation carrying a task's chunk identity (a string).
ANNOTATION = "cacheaffinity"
#: Optional task annotation carrying a chunk task's ``(start, stop)`` entry range within its chunk
#: identity, when several tasks share one (a stripe): the scheduler remembers which node ran it.
ENTRIES_ANNOTATION = "cacheaffinity-entries"
#: Name of the scheduler plugin, the worker plugin and the event topic.
PLUGIN_NAME = "cacheaffinity"
#: Worker metric with the cache-node id, weight and statistics, sent at registration and every heartbeat.
WORKER_METRIC = "cacheaffinity"
#: Event topic of a worker plugin set up after registration reporting its cache node (an event,
#: not a stream op, so that a scheduler without the plugin just stores it).
NODE_REPORT_TOPIC = "cacheaffinity-node"
#: Prefix of the fallback node id of a worker that reports no cache node.
HOST_NODE_PREFIX = "host:"
#: Worker statistics of the node's shared cache directory (not per-process counters).
DIRECTORY_WIDE = frozenset({"bytes", "entries", "capacity", "configured_capacity"})
#: Scheduler handler naming the nodes that processed a chunk task's entries (asked on a miss).
HOLDERS_HANDLER = "cacheaffinity_holders"
#: Worker handler that sends the chunk packs of a tree overlapping an entry range.
PACKS_HANDLER = "cacheaffinity_packs"
#: Worker handler that sends a stored NanoEvents form document (JSON) of a file.
FORM_HANDLER = "cacheaffinity_form"
#: Chunk-identity prefix of a coffea preprocessing task, ``file:<path>.<stamp>/<tree>``, placed
#: like a chunk and counted in its run's preprocessing figures, not in its ``tasks``.
PREPROCESS_PREFIX = "file:"
#: Optional task annotation carrying a chunk task's run (one per coffea ``Runner`` call); tasks
#: without it count in a run named after the graph that submitted them.
RUN_ANNOTATION = "cacheaffinity-run"
#: Event topic a chunk task reports its own figures to when it ends, ``{"key", "run", <figure>: n}``.
TASK_REPORT_TOPIC = "cacheaffinity-task"
#: The per-run figures (:func:`cacheaffinity.run_stats`), counted by the chunk tasks themselves
#: (``steals`` by the scheduler), not node totals: a worker restart cannot make them negative.
RUN_FIGURES = (
    "chunks",  # chunk tasks that reported (a task run twice counts twice)
    "hits",  # lookups answered by a cache: the node's own, or another node's (peer_hits)
    "peer_hits",  # of the hits, those answered by packs fetched from another node's cache
    "misses",  # lookups no cache answered (read from storage)
    "bytes_served",  # bytes read from the node's disk cache
    "peer_bytes",  # bytes fetched from other nodes' caches
    "storage_bytes",  # bytes requested from storage (the data files)
    "storage_opens",  # data files opened on storage
    "steals",  # chunk tasks moved by the stealing policy
    "uncached_chunks",  # chunk tasks that ran without a usable node cache
    "files_preprocessed",  # preprocessing tasks that reported (one per file)
    "metadata_hits",  # of those, files whose metadata the node cache held (not opened)
    "preprocess_ms",  # milliseconds the preprocessing tasks took, added up
    "chunk_bytes",  # bytes of the chunks' packs in the node cache (read from it or stored)
    "chunk_bytes_hit",  # of those, bytes read from the node's own cache
    "chunks_not_kept",  # chunk tasks whose node's cache did not admit their pack
)
#: Uncached reason of a worker without the cacheaffinity worker plugin.
NO_WORKER_PLUGIN = (
    "no cacheaffinity worker plugin (start the worker with `dask worker --preload "
    "cacheaffinity --cache-directory DIR`)"
)
