"""The worker plugin :class:`CacheWorkerPlugin` and :func:`worker_cache` (runs in workers).

The plugin resolves ``cacheaffinity.worker.*`` on the worker, opens the node's
``ColumnCache`` and form store, reads or creates the node id, serves other nodes' pack
and form requests, and reports the node and its cache to the scheduler (the
``cacheaffinity`` worker metric).  It never decides placement.  An unusable or
untrusted directory gives one warning and an *uncached* worker (its host as node)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections import Counter
from collections.abc import Iterator, MutableMapping
from typing import Any

from dask.utils import format_bytes
from distributed import get_worker
from distributed.diagnostics.plugin import WorkerPlugin

from cacheaffinity import config
from cacheaffinity.protocol import (
    FORM_HANDLER,
    NODE_REPORT_TOPIC,
    PACKS_HANDLER,
    PLUGIN_NAME,
    WORKER_METRIC,
)
from cacheaffinity.worker._collector import FRAME_SNAPSHOT_DEADLOCK, Collector, guard_frame_snapshots
from cacheaffinity.worker._directory import CacheDirectory, ReadOnlyDirectory, UntrustedDirectory
from cacheaffinity.worker._forms import FormStore
from cacheaffinity.worker._store.cache import ColumnCache
from cacheaffinity.worker._store.front import MemoryFront

logger = logging.getLogger("cacheaffinity.worker")

__all__ = ["CacheWorkerPlugin", "worker_cache"]


#: Environment variables naming a per-job scratch directory that is deleted when the job ends.
JOB_SCRATCH_VARIABLES = ("_CONDOR_SCRATCH_DIR",)


def job_scratch_of(directory: str) -> str | None:
    """The per-job scratch directory (HTCondor's ``$_CONDOR_SCRATCH_DIR``) that
    ``directory`` lies in, or None."""
    path = os.path.realpath(directory)
    for var in JOB_SCRATCH_VARIABLES:
        scratch = os.environ.get(var)
        if scratch:
            scratch = os.path.realpath(scratch)
            if path == scratch or path.startswith(scratch.rstrip(os.sep) + os.sep):
                return scratch
    return None


class CacheWorkerPlugin(WorkerPlugin):
    """Node-local column cache of one worker process.

    Parameters
    ----------
    directory, capacity, memory, weight, shared_group, write_queue
        Override ``cacheaffinity.worker.<name>``; ``None`` reads the config on
        the worker when the plugin is set up.

    Raises
    ------
    ValueError
        In :meth:`setup`, for an invalid setting (the message names the key,
        the value and an example).

    Attributes
    ----------
    node_id : str
        The cache node this worker belongs to (set in :meth:`setup`).
    cache : ColumnCache or None
        The node's disk cache, or None if the directory is unusable.
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(
        self,
        directory: str | None = None,
        capacity: str | int | None = None,
        memory: str | int | None = None,
        weight: float | None = None,
        shared_group: str | int | None = None,
        write_queue: str | int | None = None,
    ):
        self._args = {
            "directory": directory,
            "capacity": capacity,
            "memory": memory,
            "weight": weight,
            "shared_group": shared_group,
            "write_queue": write_queue,
        }
        self.node_id: str | None = None
        self.directory: str | None = None
        self.cache: ColumnCache | None = None
        self.capacity: int = 0
        self.memory: int = 0
        #: Bytes of cache writes that may wait for the background writer.
        self.write_queue: int = 0
        self.weight: float | None = None
        self.shared_group: int | None = None
        #: Why :meth:`setup` refused the settings, or None.
        self.failed: str | None = None
        # Per-file metadata (NanoEvents base forms) of this node (not rendered: private type).
        self.forms: FormStore | None = None
        self._lock = threading.Lock()
        #: Storage reads by tasks on this worker.
        self.storage = {"storage_opens": 0, "storage_bytes": 0}
        #: Columns fetched from / served to other nodes' workers.
        self.peer = {
            "peer_hits": 0, "peer_bytes": 0, "peer_requests": 0, "peer_failed": 0,
            "peer_served": 0, "peer_served_bytes": 0, "peer_forms": 0, "peer_served_forms": 0,
            "peer_busy": 0,
        }  # fmt: skip
        #: Fetch missing columns from the nodes that hold them (``worker.peer-fetch``).
        self.peer_fetch: bool = True
        #: Seconds one scheduler or peer request may take (``worker.peer-timeout``).
        self.peer_timeout: float = 5.0
        #: Peer requests served at once at most (``worker.peer-serve-limit``; 0 for no limit).
        self.peer_serve_limit: int = 2
        #: Peer requests being served now (changed on the worker's event loop only).
        self.serving: int = 0
        #: Python's garbage collector policy in this process (``worker.gc``).
        self.gc = Collector("python")
        #: Why this worker caches nothing, or None.
        self.uncached: str | None = None
        #: The capacity setting (``capacity`` is the one in force, at most the disk's).
        self.configured_capacity: int = 0
        #: The capacity if given explicitly (then recorded as the directory's), else None.
        self.capacity_given: int | None = None
        #: Free bytes on the directory's file system when the plugin was set up.
        self.free_at_start: int | None = None
        #: thread id -> the tally of the chunk task running in that thread.  Not a
        #: ``threading.local``: on Python 3.11 the garbage collector freeing one inside
        #: ``sys._current_frames()`` (distributed's profiler, every 10 ms) deadlocks the
        #: process (CPython gh-106883), and a torn-down plugin is freed by the collector.
        self._tallies: dict[int, Counter] = {}

    def __getstate__(self):
        # Sent to workers before setup: only the arguments travel.
        return {"_args": self._args}

    def __setstate__(self, state):
        self.__init__(**state["_args"])

    def setup(self, worker) -> None:
        """Resolve the settings and open the node's cache (``ValueError`` for an invalid setting)."""
        if FRAME_SNAPSHOT_DEADLOCK and guard_frame_snapshots():
            logger.debug("cacheaffinity: sys._current_frames() runs without the garbage collector "
                         "(CPython gh-106883, Python < 3.12)")  # fmt: skip
        try:
            self._settings(worker)
        except ValueError as e:
            # Dask keeps a plugin whose setup failed: tasks must fail with why, not run uncached.
            self.failed = str(e)
            raise
        self.failed = None
        try:
            self._open(worker)
        except ValueError as e:  # a given capacity the cache does not use
            self.failed = str(e)
            raise

    def validate(self, worker) -> None:
        """Resolve this plugin's settings for ``worker`` without opening anything (``ValueError`` if invalid)."""
        self._settings(worker)

    def _settings(self, worker) -> None:
        c = config.settings("worker", **self._args)
        self.capacity = config.get_bytes("worker.capacity", c["capacity"])
        default = config.get_bytes("worker.capacity", config.default("worker.capacity"))
        given = self._args["capacity"] is not None or self.capacity != default
        self.capacity_given = self.capacity if given else None
        self.memory = config.get_bytes("worker.memory", c["memory"])
        self.write_queue = config.get_bytes("worker.write-queue", c["write-queue"])
        self.peer_fetch = bool(c["peer-fetch"])
        self.peer_timeout = config.get_seconds("worker.peer-timeout", c["peer-timeout"])
        self.peer_serve_limit = int(c["peer-serve-limit"])
        self.gc = Collector(c["gc"])
        self.weight = None if c["weight"] is None else float(c["weight"])
        #: The cache directory (path, trust, node id).
        self.place = CacheDirectory.for_worker(c["directory"], worker.name, shared_group=c["shared-group"])
        self.shared_group = self.place.gid
        self.directory = self.place.path

    def _open(self, worker) -> None:
        scratch = job_scratch_of(self.directory)
        if scratch is not None:
            logger.warning(
                "cacheaffinity: cache directory %s is inside the batch job's scratch "
                "directory %s, which the batch system deletes when the job ends: this node "
                "loses its cache and its identity with every job. Set "
                "cacheaffinity.worker.directory (or --cache-directory) to a node-local path "
                "that outlives jobs, e.g. /scratch/$USER/cacheaffinity.",
                self.directory,
                scratch,
            )
        try:
            self.place.trust()
            self.node_id = self.place.node_id()
            self.cache = ColumnCache(
                self.place,
                capacity=self.capacity,
                write_queue=self.write_queue,
                fit_disk=True,
                set_capacity=self.capacity_given is not None,
            )
            self.forms = FormStore(self.place)
            self.configured_capacity = self.cache.configured_capacity
            self.capacity = self.cache.capacity
            self.free_at_start = self.cache.free_at_open
            self.uncached = self.cache.disabled and (
                f"cache directory {self.directory} unusable: {self.cache.disabled}"
            )
        except UntrustedDirectory as e:
            logger.warning("cacheaffinity: %s This worker caches nothing.", e)
            self.cache = None
            self.forms = None
            self.node_id = None
            self.uncached = f"untrusted cache directory: {e}"
        except (OSError, ValueError) as e:
            if isinstance(e, OSError) and e.errno == errno.EROFS:
                # a read-only file system, met by the trust check or by a first write: one
                # sentence naming the directory and its fix once
                ro = e if isinstance(e, ReadOnlyDirectory) else ReadOnlyDirectory(self.directory)
                logger.warning("cacheaffinity: %s. This worker caches nothing.", ro)
                self.uncached = str(ro)
            else:
                logger.warning(
                    "cacheaffinity: cache directory %s is unusable (%s); this worker caches "
                    "nothing. Set cacheaffinity.worker.directory to a writable node-local path.",
                    self.directory,
                    e,
                )
                self.uncached = f"cache directory {self.directory} unusable: {e}"
            self.cache = None
            self.forms = None
            self.node_id = None
        self._check_capacity_given()
        worker.metrics[WORKER_METRIC] = self.metric
        from cacheaffinity.worker._peers import serve_form, serve_packs

        async def packs(group=None, start=None, stop=None):
            return await serve_packs(self, group, start, stop)

        async def form(name=None, identity=None):
            return await serve_form(self, name, identity)

        worker.handlers[PACKS_HANDLER] = packs
        worker.handlers[FORM_HANDLER] = form
        logger.info("%s", self.startup_line())
        # A plugin set up after registration must tell the scheduler now (before start the
        # message waits in the batched stream; a scheduler without cacheaffinity stores it).
        bs = getattr(worker, "batched_stream", None)
        if bs is not None:
            msg = {"node": self.node_id, "weight": self.weight, "uncached": self.uncached}
            try:
                bs.send({"op": "log-event", "topic": NODE_REPORT_TOPIC, "msg": msg})
            except Exception as e:  # closed stream: the worker is going away
                logger.debug("cacheaffinity: node report not sent: %r", e)

    def _check_capacity_given(self) -> None:
        """Refuse to run when a capacity given explicitly is not the one the
        opened cache uses (never silently ignored)."""
        cache, given = self.cache, self.capacity_given
        if given is None or cache is None or cache.disabled:
            return
        if cache.configured_capacity != given:
            cache.close()
            self.cache = self.forms = None
            raise ValueError(
                f"cacheaffinity.worker.capacity={format_bytes(given)} (--cache-capacity) was "
                f"given but cache directory {self.directory} could not record it and uses "
                f"{format_bytes(cache.configured_capacity)}; make its index writable by this user "
                "(cacheaffinity cache verify --repair DIR), or start the worker without "
                "--cache-capacity to use the recorded capacity"
            )

    def startup_line(self) -> str:
        """The one INFO line a worker logs at start: node id, directory, its file
        system, capacity, free space there, and the sharing mode."""
        from cacheaffinity.filesystems import filesystem_of

        fs = filesystem_of(self.directory)
        try:
            st = os.statvfs(self.directory)
            free = format_bytes(st.f_bavail * st.f_frsize)
        except OSError:
            free = "unknown"
        mode = "private" if self.shared_group is None else f"shared with group {self.shared_group}"
        state = f"node {self.node_id}" if self.cache is not None else "UNCACHED (see the warning above)"
        return (
            f"cacheaffinity worker cache: {state}, directory {self.directory} "
            f"({fs['fstype']} mounted at {fs['mount']}), capacity {format_bytes(self.capacity)}, "
            f"free {free}, {mode}"
        )

    def teardown(self, worker) -> None:
        worker.metrics.pop(WORKER_METRIC, None)
        worker.handlers.pop(PACKS_HANDLER, None)
        worker.handlers.pop(FORM_HANDLER, None)
        if self.cache is not None:
            self.cache.close()

    def stats(self, flush: bool = True) -> dict[str, Any]:
        """Cache statistics of this process (counters) and of the directory.

        With ``flush``, first wait (at most 60 s) until queued cache writes are stored; the
        heartbeat metric does not wait (its ``pending`` counts them)."""
        if flush:
            self.flush(60.0)
        self._follow_capacity()
        if self.cache is not None:
            try:  # the admission policy's lookups, for the node's other processes
                self.cache.save_admission(force=flush)
            except Exception as e:  # a broken index is a cache problem, not ours
                logger.debug("cacheaffinity: admission state not saved: %r", e)
        out: dict[str, Any] = {
            "capacity": self.capacity,
            "configured_capacity": self.configured_capacity or self.capacity,
        }
        with self._lock:
            out.update(self.storage)
            out.update(self.peer)
        if self.forms is not None:
            out["form_hits"] = self.forms.hits
            out["form_misses"] = self.forms.misses
        if self.cache is not None:
            out.update(self.cache.stats())
            out["pending"] = self.cache.pending()
            try:
                out.update(self.cache.totals())
            except Exception as e:  # a broken index is a cache problem, not ours
                logger.debug("cacheaffinity: cache size unavailable: %r", e)
        return out

    def _follow_capacity(self) -> None:
        """Take a capacity another process of the node recorded since setup."""
        if self.cache is None:
            return
        try:
            self.capacity = self.cache.follow_capacity()
            self.configured_capacity = self.cache.configured_capacity
        except Exception as e:  # a broken index is a cache problem, not ours
            logger.debug("cacheaffinity: recorded capacity unavailable: %r", e)

    def metric(self, worker=None) -> dict[str, Any]:
        """The ``cacheaffinity`` worker metric sent to the scheduler."""
        return {
            "node": self.node_id,
            "weight": self.weight,
            "directory": self.directory,
            "uncached": self.uncached,
            "admission": None if self.cache is None else self.cache.admission_policy,
            "stats": self.stats(flush=False),
        }

    def flush(self, timeout: float | None = 60.0) -> bool:
        """Wait (at most ``timeout`` seconds) until queued cache writes are stored; True if none is left."""
        return True if self.cache is None else self.cache.flush(timeout)

    def after_chunk(self) -> None:
        """Called by every chunk task when it ends (the garbage collector policy)."""
        self.gc.after_chunk()

    def count_storage(self, opens: int, nbytes: int) -> None:
        """Record files opened and bytes requested from storage by a task."""
        with self._lock:
            self.storage["storage_opens"] += opens
            self.storage["storage_bytes"] += nbytes
        self.count_task(storage_opens=opens, storage_bytes=nbytes)

    def count_peer(
        self,
        hits: int = 0,
        nbytes: int = 0,
        requests: int = 0,
        failed: int = 0,
        served: int = 0,
        served_bytes: int = 0,
        forms: int = 0,
        served_forms: int = 0,
        busy: int = 0,
    ) -> None:
        """Record columns fetched from (``hits``, ``nbytes``, ``requests``, ``failed``) or served
        to (``served``, ``served_bytes``) other nodes, and requests declined as ``busy``."""
        with self._lock:
            p = self.peer
            p["peer_hits"] += hits
            p["peer_bytes"] += nbytes
            p["peer_requests"] += requests
            p["peer_failed"] += failed
            p["peer_served"] += served
            p["peer_served_bytes"] += served_bytes
            p["peer_forms"] += forms
            p["peer_served_forms"] += served_forms
            p["peer_busy"] += busy
        if hits or nbytes:
            self.count_task(peer_hits=hits, peer_bytes=nbytes)

    @contextlib.contextmanager
    def task_tally(self) -> Iterator[Counter]:
        """Count the figures of the chunk task running in this thread (thread-local: exact with
        several threads per worker).

        Yields a ``Counter`` of this thread's cache hits, misses and bytes served (through
        :meth:`front`), peer hits and bytes, storage opens and bytes, until the block ends.
        """
        tally: Counter = Counter()
        me = threading.get_ident()
        outer = self._tallies.get(me)
        self._tallies[me] = tally
        try:
            yield tally
        finally:
            if outer is None:
                self._tallies.pop(me, None)
            else:
                self._tallies[me] = outer

    def count_task(self, **deltas: int) -> None:
        """Add to the tally of the chunk task running in this thread (if any)."""
        tally = self._tallies.get(threading.get_ident())
        if tally is not None:
            tally.update(deltas)

    def front(self) -> MemoryFront:
        """A fresh in-memory front over the node cache, for one chunk (its disk
        reads counted in the tally of :meth:`task_tally`, if one is open)."""
        store = None if self.cache is None else _Tallied(self.cache, self.count_task)
        return MemoryFront(store, capacity=self.memory)


class _Tallied(MutableMapping):
    """The node cache as one chunk's front sees it: reads counted for the task tally.
    Every read goes through :meth:`get_many` (``Mapping.get`` calls ``__getitem__``)."""

    def __init__(self, cache: ColumnCache, count):
        self.cache = cache
        self._count = count

    def get_many(self, keys: list[str]) -> dict:
        found = self.cache.get_many(keys)
        self._count(
            hits=len(found),
            misses=len(keys) - len(found),
            bytes_served=sum(int(getattr(v, "nbytes", 0)) for v in found.values()),
        )
        return found

    def __getitem__(self, key):
        found = self.get_many([key])
        if key not in found:
            raise KeyError(key)
        return found[key]

    def count_served(self, hits: int = 0, misses: int = 0, nbytes: int = 0, peer_hits: int = 0) -> None:
        """Chunk pack lookups: counted for the task and the cache (``peer_hits``, of the
        hits, by the peer store: :meth:`count_peer`)."""
        self._count(hits=hits, misses=misses, bytes_served=nbytes)
        self.cache.count_served(hits=hits, misses=misses, nbytes=nbytes)

    # Pack bytes read or stored count in the task's ``chunk_bytes`` (the forecast).
    def get_packs(self, grp: str, start: int, stop: int) -> list:
        packs = self.cache.get_packs(grp, start, stop)
        n = sum(p.size for p in packs)
        self._count(chunk_bytes=n, chunk_bytes_hit=n)
        return packs

    def put_pack(self, grp: str, start: int, stop: int, arrays: dict) -> tuple[int, bool]:
        size, kept = self.cache.put_pack(grp, start, stop, arrays)
        self._count(chunk_bytes=size, chunks_not_kept=0 if kept or not size else 1)
        return size, kept

    def __setitem__(self, key, value) -> None:
        self.cache[key] = value

    def __delitem__(self, key) -> None:
        del self.cache[key]

    def __contains__(self, key) -> bool:  # the index only: no read, not counted
        return key in self.cache

    def __iter__(self):
        return iter(self.cache)

    def __len__(self) -> int:
        return len(self.cache)

    def __getattr__(self, name):
        return getattr(self.cache, name)


def worker_cache(worker=None) -> CacheWorkerPlugin:
    """The cacheaffinity plugin of ``worker`` (default: the current worker).

    Raises
    ------
    RuntimeError
        If the worker has no cacheaffinity plugin, with the ways to add one.
    """
    if worker is None:
        worker = get_worker()
    plugin = worker.plugins.get(PLUGIN_NAME)
    if not isinstance(plugin, CacheWorkerPlugin):
        raise RuntimeError(
            f"worker {worker.address} has no cacheaffinity plugin, so this task would run "
            "uncached. Start workers with `dask worker --preload cacheaffinity`, set "
            "distributed.worker.preload: [cacheaffinity], or call "
            "client.register_plugin(cacheaffinity.CacheWorkerPlugin())."
        )
    if plugin.failed:
        raise RuntimeError(
            f"the cacheaffinity plugin of worker {worker.address} refused its settings, so "
            f"this task would run uncached: {plugin.failed}"
        )
    return plugin
