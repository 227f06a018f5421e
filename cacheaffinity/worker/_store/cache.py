"""The node's column store: :class:`ColumnCache` (runs in workers and in the CLI).

This facade opens the directory and composes the parts, each the owner of its state.
Any threads and processes of a node, and a forked child, may share one directory on a
local file system (SQLite WAL fails over NFS).  The disk may briefly hold one write
batch (``write-queue`` bytes at most) beyond ``capacity``."""

from __future__ import annotations

import logging
import os
import sqlite3
import weakref
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import numpy as np
from dask.utils import format_bytes

from cacheaffinity import config
from cacheaffinity.exceptions import Closed, NewerLayout, OlderLayout, UntrustedDirectory
from cacheaffinity.worker._directory import CacheDirectory
from cacheaffinity.worker._store.admitter import Admitter
from cacheaffinity.worker._store.capacity import Capacity
from cacheaffinity.worker._store.files import DataFiles
from cacheaffinity.worker._store.health import Health
from cacheaffinity.worker._store.index import Index, corruption
from cacheaffinity.worker._store.schema import MIGRATES_FROM
from cacheaffinity.worker._store.layout import PLAIN
from cacheaffinity.worker._store.maintenance import ORPHAN_AFTER, Maintenance
from cacheaffinity.worker._store.protocol import ColumnStore, Pack
from cacheaffinity.worker._store.reads import Reader
from cacheaffinity.worker._store.writer import WriteBehind
from cacheaffinity.worker._store.writes import Item, WritePath, pack_item, plain_array, queue_bytes

__all__ = ["ColumnCache", "Pack"]

logger = logging.getLogger("cacheaffinity.worker")

_MISSING = object()

#: Every ColumnCache of this process (their locks are replaced after fork).
LIVE: weakref.WeakValueDictionary[int, ColumnCache] = weakref.WeakValueDictionary()


def _reset_after_fork() -> None:
    for cache in list(LIVE.values()):
        cache._reset_after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)


class ColumnCache(MutableMapping, ColumnStore):
    """Decompressed column buffers on local disk, shared by a node's workers.

    A mapping of *plain entries* (``cache[key] = array``) plus *chunk packs*
    (:meth:`put_pack`, :meth:`get_packs`).  Every cache problem is a miss, never an error.
    Options left ``None`` read ``cacheaffinity.worker.<name>``.  After :meth:`close`,
    reads miss and writes do nothing; the other methods raise ``ValueError``.

    Parameters
    ----------
    directory : str or os.PathLike
        Cache directory (or a ``CacheDirectory``) on node-local disk, the same for every
        process of a node; created if needed, used only if it passes the trust rules.
    capacity : int or str, optional
        Bytes stored at most (data files in whole 4 KiB blocks).
    stale_after, orphan_after : float
        Seconds after which abandoned temporaries (at open) and unreferenced data files
        (default ``min(stale_after, 120)``) are deleted.
    shared_group : str or int, optional
        Unix group sharing the directory (default: private).
    heal : bool
        Rebuild a damaged index and drop an older layout; with ``False`` such a cache is
        left unchanged and disabled (the reason in :attr:`disabled`).
    set_capacity : bool
        Record ``capacity`` as the directory's and evict down to it now (needs
        ``heal``); default: adopt the recorded capacity.
    write_queue : int or str
        Bytes that may wait for the background writer; ``0`` writes inline.
    fit_disk : bool
        Keep the capacity in force within what the file system can hold.
    read : {"auto", "map", "copy"}, optional
        Map data files copy-on-write (a file truncated in place by a foreign process
        then kills this one with SIGBUS) or copy them; ``"auto"`` maps in a private
        cache only.
    admission : {"rank", "fifo"}, optional
        What a full cache keeps: ``"rank"`` the same part of a larger working set
        every run, ``"fifo"`` the newest entries.
    """

    def __init__(
        self,
        directory: str | os.PathLike | CacheDirectory,
        capacity: int | str | None = None,
        *,
        stale_after: float = 300.0,
        shared_group: str | int | None = None,
        orphan_after: float | None = None,
        heal: bool = True,
        set_capacity: bool = False,
        write_queue: int | str = 0,
        fit_disk: bool = False,
        read: str | None = None,
        admission: str | None = None,
    ):
        if set_capacity and not heal:
            raise ValueError(
                "ColumnCache(set_capacity=True, heal=False): a read-only open cannot record "
                "a capacity; pass heal=True, or set_capacity=False to use the recorded one"
            )
        configured = config.get_bytes("worker.capacity", capacity)
        stale_after = float(stale_after)
        if not stale_after >= 0:
            raise ValueError(f"stale_after={stale_after!r} must be a number of seconds >= 0")
        self.stale_after: float = stale_after
        self.orphan_after: float = (
            min(stale_after, ORPHAN_AFTER) if orphan_after is None else float(orphan_after)
        )
        if not isinstance(directory, CacheDirectory):
            directory = CacheDirectory(directory, shared_group=config.get("worker.shared-group", shared_group))
        # The cache directory: path, trust rules, node id (not rendered: private type).
        self.place: CacheDirectory = directory
        #: Absolute path of the cache directory.
        self.directory: str = directory.path
        #: Group id of a shared-group cache, None for a private one.
        self.shared_gid: int | None = directory.gid
        #: How data files are read, ``"map"`` or ``"copy"``.
        self.read_mode: str = config.get("worker.read", read)
        if self.read_mode == "auto":
            self.read_mode = "map" if self.shared_gid is None else "copy"
        #: Admission policy name (``worker.admission``).
        self.admission_policy: str = config.get("worker.admission", admission)
        self._heals = bool(heal)
        self._pid = os.getpid()
        #: The directory failed the trust checks (the message), or None.
        self.untrusted: str | None = None
        self.health = Health(self.directory)
        self.files = DataFiles(self.directory, os.geteuid(), self.shared_gid, mapped=self.read_mode == "map")
        self.index = Index(
            self.directory, self.files, heals=self._heals,
            on_rebuilt=lambda: self.health.count(index_rebuilt=1),
            on_unhealable=self._unhealable,
        )  # fmt: skip
        self.limit = Capacity(self.index, self.files, self.health, self.directory, configured, fit_disk=fit_disk)
        self.admission: Admitter | None = (
            None if self.admission_policy == "fifo" else Admitter(self.admission_policy, self.capacity, self.index)
        )
        #: Byte bound of the background writer's queue (0 writes inline).
        self.write_queue: int = queue_bytes(write_queue)
        self.writer = WriteBehind(
            self.write_queue,
            f"cacheaffinity-writer-{os.path.basename(self.directory)}",
            self._write_queued,
            self.index.writer_started,
        )
        self.reader = Reader(self.index, self.files, self.health, self.writer, self.looked_up)
        self.maintenance = Maintenance(
            self.index, self.files, self.health, self.reader,
            stale_after=self.stale_after, orphan_after=self.orphan_after,
        )  # fmt: skip
        self.write_path = WritePath(
            self.index, self.files, self.health, self.limit, self.writer, self.admission,
            self.looked_up, self.maintenance.collect_orphans_if_due,
        )  # fmt: skip
        LIVE[id(self)] = self
        self._open(set_capacity)
        if self.fit_disk:
            self.limit.fit()

    def _open(self, set_capacity: bool) -> None:
        """Check the directory, open the index, agree on the settings; a failure disables the cache."""
        try:
            self.place.trust()
        except UntrustedDirectory as e:
            self._untrusted(e)
            return
        except (OSError, ValueError) as e:
            self._unusable(e)
            return
        try:
            self.files.setup()
            removed = self.files.remove_stale_temporaries(self.stale_after)
            if removed:
                logger.info("cacheaffinity: removed %d abandoned temporaries from %s", removed, self.files.tmp)
            self.health.count(temporaries_removed=removed)
            self.index.open()
            self.limit.settle(set_capacity, self._heals)
        except UntrustedDirectory as e:  # a planted index, WAL or shm file
            self._untrusted(e)
            return
        except NewerLayout as e:
            self.health.disabled = self.unreadable_index = str(e)
            self.health.warn_once("disk", "cacheaffinity: %s; nothing is cached by this process.", e)
            return
        except OlderLayout as e:  # read-only open (heal=False): reported, not dropped
            self.health.disabled = (
                f"{e}: written by an older cacheaffinity; its entries are upgraded in place "
                f"(schema {MIGRATES_FROM} on) or dropped (older) when a worker opens the directory"
            )
            return
        except (OSError, sqlite3.Error) as e:
            if isinstance(e, sqlite3.DatabaseError) and corruption(e):
                self.damaged = True
            self._unusable(e)
            return
        try:
            self.collect_orphans()
        except (OSError, sqlite3.Error, Closed) as e:
            logger.debug("cacheaffinity: orphan collection on open failed: %s", e)

    #: The index was found damaged and left as is (``heal=False``).
    damaged: bool = False
    #: Why this version cannot use the index (newer, unrebuildable), or None.
    unreadable_index: str | None = None

    def _untrusted(self, e: Exception) -> None:
        self.health.disabled = self.untrusted = str(e)
        self.health.warn_once("disk", "cacheaffinity: %s Nothing is cached by this process.", e)

    def _unusable(self, e: Exception) -> None:
        self.health.disabled = f"{type(e).__name__}: {e}"
        self.health.warn_once(
            "disk",
            "cacheaffinity: cache directory %s cannot be used (%s); nothing will be cached "
            "by this process. Point cacheaffinity.worker.directory to a writable directory "
            "on local disk.",
            self.directory, self.health.disabled,
        )  # fmt: skip

    def _unhealable(self, msg: str) -> None:
        self.health.disabled = self.unreadable_index = msg
        self.health.warn_once("disk", "cacheaffinity: %s", msg)

    def _reset_after_fork(self) -> None:
        """Fresh locks and no writer thread in a forked child."""
        self.health.reset_after_fork()
        self.limit.reset_after_fork()
        self.writer.reset()
        if self.admission is not None:
            self.admission.reset_after_fork()

    def _write_queued(self, batch: list) -> None:
        self.write_path.write_batch(batch)

    @property
    def configured_capacity(self) -> int:
        """The capacity setting, from the argument (or config) or recorded in the directory."""
        return self.limit.configured

    @property
    def capacity(self) -> int:
        """Size bound in force, in bytes (with ``fit_disk``, at most what the file system holds)."""
        return self.limit.in_force

    @property
    def capacity_source(self) -> str:
        """``"directory"`` if :attr:`capacity` was read from the index, else ``"argument"``."""
        return self.limit.source

    @property
    def free_at_open(self) -> int | None:
        """Free bytes on the directory's file system at open (``fit_disk`` only; else None)."""
        return self.limit.free_at_open

    @property
    def fit_disk(self) -> bool:
        """Whether the capacity in force is kept within what the file system holds."""
        return self.limit.fit_disk

    def follow_capacity(self, con: sqlite3.Connection | None = None) -> int:
        """Adopt the capacity the directory records now; returns the bound in force."""
        return self.limit.follow(con)

    def _set_index_aside(self) -> None:
        """Replace an index this version cannot use by a new one (node id kept)."""
        self.index.set_aside(f"could not be used ({self.unreadable_index})")
        self.health.disabled = self.unreadable_index = None
        self.limit.settle(False, self._heals)
        if self.fit_disk:
            self.limit.fit()

    @property
    def disabled(self) -> str | None:
        """Why the directory could not be used when the cache was opened, or None."""
        return self.health.disabled

    def repair(self) -> bool:
        """Check the whole index and rebuild it if damaged (keeping the entries that still
        read), or set aside one this version cannot use.  Returns whether it was rebuilt."""
        self.health.check_open()
        if self.unreadable_index:  # newer layout, or damage a rebuild did not cure
            self._set_index_aside()
            self.health.count(index_rebuilt=1)
            return True
        if self.disabled:
            raise ValueError(f"{self!r} cannot be used: {self.disabled}")
        rebuilt = self.maintenance.repair()
        if self.disabled:
            raise ValueError(f"{self!r} cannot be used: {self.disabled}")
        return rebuilt

    def count_served(self, hits: int = 0, misses: int = 0, nbytes: int = 0, peer_hits: int = 0) -> None:
        """Count chunk pack lookups answered outside :meth:`get` (``peer_hits``, hits a
        peer's pack answered, are counted by the worker plugin)."""
        self.health.count(hits=hits, misses=misses, bytes_served=nbytes)

    def stats(self) -> dict[str, int]:
        """Counters of this process since the cache was opened: ``hits``, ``misses``,
        ``bytes_served`` (plain entries and pack members), ``writes``, ``bytes_written``,
        ``packs_written``, ``packs_read``, ``bytes_read``/``bytes_mapped`` (copied/mapped),
        ``evictions``, ``bytes_evicted``, ``not_admitted``, ``errors``, ``corrupt``, ``skipped``,
        ``dropped`` (full queue), ``temporaries_removed``, ``orphans_removed``, ``index_rebuilt``.
        """
        return self.health.counts()

    def get(self, key: str, default: Any = None) -> np.ndarray | Any:
        """The array stored under ``key`` (verified), or ``default`` on a miss."""
        found = self.get_many([key])
        return found.get(key, default) if isinstance(key, str) else default

    def get_many(self, keys: list[str]) -> dict[str, np.ndarray]:
        """``{key: array}`` of those ``keys`` that hit: one index query for all."""
        return self.reader.get_many(keys)

    def get_packs(self, grp: str, start: int, stop: int) -> list[Pack]:
        """Every readable chunk pack of ``grp`` overlapping ``[start, stop)``, newest first (one
        index query); the caller counts the lookups (:meth:`count_served`)."""
        return self.reader.get_packs(grp, start, stop)

    def __getitem__(self, key: str) -> np.ndarray:
        out = self.get(key, _MISSING)
        if out is _MISSING:
            raise KeyError(key)
        return out

    def __contains__(self, key: object) -> bool:
        """Whether the index has ``key`` (cheap: the data file is not read)."""
        self._settle()
        self.health.check_open()
        if self.disabled or not isinstance(key, str):
            return False
        return bool(self.index.query("SELECT 1 FROM entries WHERE key = ?", (key,)))

    def __iter__(self) -> Iterator[str]:
        """Keys, oldest first, as of the call (chunk packs too)."""
        self._settle()
        self.health.check_open()
        if self.disabled:
            return iter(())
        return iter([k for (k,) in self.index.query("SELECT key FROM entries ORDER BY id")])

    def __len__(self) -> int:
        """Number of rows in the directory's index (all processes)."""
        self._settle()
        self.health.check_open()
        if self.disabled:
            return 0
        return int(self.index.query("SELECT value FROM meta WHERE name = 'count'")[0][0])

    def totals(self) -> dict[str, int]:
        """``{"entries": n, "bytes": b}`` committed in the index now (queued writes not waited for)."""
        self.health.check_open()
        if self.disabled:
            return {"entries": 0, "bytes": 0}
        rows = dict(self.index.query("SELECT name, value FROM meta WHERE name IN ('size', 'count')"))
        return {"entries": int(rows.get("count", 0)), "bytes": int(rows.get("size", 0))}

    def volume(self) -> int:
        """Bytes stored in the directory (all processes), in whole blocks."""
        self._settle()
        self.health.check_open()
        if self.disabled:
            return 0
        return int(self.index.query("SELECT value FROM meta WHERE name = 'size'")[0][0])

    def __setitem__(self, key: str, value: np.ndarray) -> None:
        """Store ``value`` under ``key``, replacing any older value (``TypeError`` for a
        non-``str`` key or an object or structured dtype; any other failure leaves the value
        uncached, an older value removed, with one warning)."""
        if not isinstance(key, str):
            raise TypeError(f"ColumnCache keys are str, got {type(key).__name__}: {key!r}")
        self.write_path.put(Item(key, None, None, None, {PLAIN: plain_array(key, value)}))

    def put_pack(self, grp: str, start: int, stop: int, arrays: dict[str, np.ndarray]) -> tuple[int, bool]:
        """Store the columns a chunk read for ``[start, stop)`` of ``grp`` as one pack; the arrays
        are written behind (do not modify them).  Returns the bytes it takes (whole blocks)
        and whether it was taken (not: not admitted, too large, writes paused, closed)."""
        if not arrays:
            return 0, False
        item = pack_item(grp, start, stop, arrays)
        return item.size, self.write_path.put(item)

    def __delitem__(self, key: str) -> None:
        self.health.check_open()
        if self.disabled:
            raise KeyError(key)
        self._settle()
        with self.index.transaction() as con:
            row = con.execute("SELECT file FROM entries WHERE key = ?", (key,)).fetchone()
            if row is None:
                raise KeyError(key)
            con.execute("DELETE FROM entries WHERE key = ?", (key,))
        self.files.remove([row[0]])

    def clear(self) -> None:
        """Remove every entry, data files first (on a full disk that frees what the index
        needs); an index this version cannot use is set aside.  The node id is kept."""
        self._settle()
        self.health.check_open()
        if self.unreadable_index:
            self._set_index_aside()
            return
        if self.disabled:
            return
        names = [n for (n,) in self.index.query("SELECT file FROM entries")]
        self.files.remove(names)
        with self.index.transaction() as con:
            con.execute("DELETE FROM entries")

    def _settle(self) -> None:
        """Let queued writes land before a call that looks at or changes the index."""
        if self.writer.busy():
            self.flush()

    def pending(self) -> int:
        """Number of values waiting for the background writer (0 when writing inline)."""
        with self.writer.cond:
            return len(self.writer.pending)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the background writer has stored every queued value; True if none is left."""
        return self.writer.flush(timeout)

    def save_admission(self, force: bool = False) -> None:
        """Save the admission policy's unsaved lookups if due, or any with ``force``."""
        adm = self.admission
        if adm is None or not self.health.usable:
            return
        if force or adm.save_due():
            adm.save(self.index)

    def looked_up(self, key: str, size: int, rid: int | None = None, fields: tuple | None = None) -> None:
        """Record a lookup of ``key`` (``size`` bytes; a hit: its row id and the row's policy
        fields as read) for the admission policy."""
        adm = self.admission
        if adm is not None and adm.looked_up(key, size, rid, fields) and self.health.usable:
            adm.save(self.index)  # so the node's other processes see these hits soon

    def collect_orphans(self, max_files: int | None = None) -> int:
        """Delete data files no row references and older than ``orphan_after`` (looking at
        ``max_files``, default 2048, at most); returns the number deleted."""
        return self.maintenance.collect_orphans(max_files)

    def verify(self, on_entry: Callable[[], Any] | None = None) -> dict[str, int]:
        """Check every row's data file against its digest, remove corrupt rows, delete
        unreferenced files and temporaries older than ``stale_after``.  Returns the counts
        ``checked``, ``ok``, ``corrupt``, ``missing`` (rows), ``orphans``, ``temporaries``."""
        self._settle()
        self.health.check_open()
        return self.maintenance.verify(on_entry)

    def info(self) -> dict[str, Any]:
        """``directory``, ``capacity``, ``size``, ``entries``, ``packs``, ``oldest`` and ``newest`` store times."""
        self._settle()
        self.health.check_open()
        return {"directory": self.directory, "capacity": self.capacity, **self.maintenance.info()}

    def close(self, timeout: float | None = 60.0) -> None:
        """Write what is queued (bounded wait), then close the index (idempotent)."""
        if self._pid == os.getpid():
            self.flush(timeout)
            self.save_admission(force=True)
        left = self.writer.stop()
        if left:
            logger.warning("cacheaffinity: %d queued values of cache %s not written at close", left, self.directory)
        self.health.closed = True
        self.index.close()
        self.index.close_writer_connection()

    def __enter__(self) -> ColumnCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = " closed" if self.health.closed else (" disabled" if self.disabled else "")
        return f"<ColumnCache {self.directory!r} capacity={format_bytes(self.capacity)}{state}>"
