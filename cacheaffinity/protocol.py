"""Names shared by the client, scheduler and worker sides of cacheaffinity.

Nothing here runs; it is the vocabulary the three processes agree on.
"""

from __future__ import annotations

#: Task annotation that carries a task's chunk identity (a string).
ANNOTATION = "cacheaffinity"
#: Task annotation that carries a chunk task's ``(start, stop)`` entry range
#: within its chunk identity, when several tasks share one identity (coffea
#: chunks of one placement stripe): the scheduler remembers per range which node
#: processed it.  Optional.
ENTRIES_ANNOTATION = "cacheaffinity-entries"
#: Name of the scheduler plugin, the worker plugin and the event topic.
PLUGIN_NAME = "cacheaffinity"
#: Key of the worker metric (sent at registration and with every heartbeat)
#: that carries the worker's cache-node id, weight and cache statistics.
WORKER_METRIC = "cacheaffinity"
#: Event topic a worker plugin logs its cache node to at once (when the plugin
#: is set up after the worker registered).  An event, not a custom stream op,
#: so that a scheduler without the plugin just stores it.
NODE_REPORT_TOPIC = "cacheaffinity-node"
#: Prefix of the fallback node id of a worker that reports no cache node.
HOST_NODE_PREFIX = "host:"
#: Worker statistics that describe a node's shared cache directory (the same
#: for every worker of the node), as opposed to per-process counters.
DIRECTORY_WIDE = frozenset({"bytes", "entries", "capacity"})
#: Scheduler handler naming the nodes that processed a chunk task's entries
#: (asked by a worker whose task missed columns; see cacheaffinity.worker.peers).
HOLDERS_HANDLER = "cacheaffinity_holders"
#: Worker handler that sends the chunk packs of a tree overlapping an entry range.
PACKS_HANDLER = "cacheaffinity_packs"
#: Worker handler that sends a stored NanoEvents form document (JSON) of a file.
FORM_HANDLER = "cacheaffinity_form"
