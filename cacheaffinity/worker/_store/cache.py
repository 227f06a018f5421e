"""The node's column store: :class:`ColumnCache` (runs in workers and in the CLI).

A bounded store of decompressed column arrays in a directory on the node's local
disk, shared by all worker processes of the node; when full, an admission policy
decides what stays (:mod:`.admitter`: ``rank`` keeps the same part of a working set
larger than the cache run after run; ``fifo`` evicts the oldest).  Two ways in:

- a ``MutableMapping[str, numpy.ndarray]`` (``cache[key] = array``, ``get``,
  ``get_many``): one *plain entry* per key.  coffea's buffer keys use it
  (RNTuple, parquet, other schemas, ``Runner(cachestrategy=...)``);
- chunk packs (:meth:`ColumnCache.put_pack`, :meth:`ColumnCache.get_packs`): the
  columns one chunk task read from storage for its entry range of one tree,
  stored as **one** data file with **one** index row, and found again by a
  chunk of any range with **one** index query and one read per pack
  (:mod:`cacheaffinity.coffea._packs`).  What a read costs is priced per chunk,
  not per column.

This module is the facade: it opens the directory (trust, settings, healing),
composes the parts and answers the mapping API.  Each part owns its state and
gets the parts it works with when the cache is opened: :class:`~.health.Health`
(counters, disabled, closed, paused writes), :class:`~.files.DataFiles`,
:class:`~.index.Index` (SQLite, settings, healing, fork safety),
:class:`~.capacity.Capacity` (the capacity in force), :class:`~.admitter.Admitter`
(the admission policy), :class:`~.writer.WriteBehind` (the write queue),
:class:`~.reads.Reader`, :class:`~.writes.WritePath` and
:class:`~.maintenance.Maintenance` (orphans, verify, repair, info).

Why not :class:`diskcache.Cache`
    diskcache has the right ordering ideas (write the value, commit the index,
    delete files only after commit; FIFO, reads never write) and this store
    follows them, but its ``get`` unpickles any row whose mode says pickle
    (code execution in a directory other processes can write), it writes
    values straight to their final name (a killed writer leaves a torn file),
    culls at most ``cull_limit`` rows per set without saying which, and its
    last release is from 2023.

Notes
-----
Trust
    A directory is used only if its user alone can write it (see
    :mod:`cacheaffinity.worker._directory`; a shared-group mode relaxes this for
    one Unix group).  Otherwise the cache is disabled with one warning naming
    the path, its owner and the fix.  Data files are opened with ``O_NOFOLLOW``
    and must belong to the user that the row names as its writer.

Thread and process safety
    Any number of threads and processes of one node may use one directory at
    once, and a forked child may use the instance it inherited (the fork waits
    until no thread is inside SQLite; the child opens its own connection).
    Lookups take one short index query; file I/O happens outside every lock.  A
    data file is never modified once visible and names are never reused, so a
    reader sees a complete pack or nothing: a file deleted by another process's
    eviction after the lookup is a miss.  Every process evicts down to the
    directory's recorded ``capacity`` when it inserts.  The directory must be on
    a local file system (SQLite WAL does not work over NFS).

Disk use
    The accounted volume (data files in whole blocks) never exceeds
    ``capacity``.  A batch's files are written before the transaction that
    evicts room for them commits, so the disk briefly holds up to one write
    batch more (at most ``write-queue`` bytes; with the default 256 MiB queue
    and a small capacity, plan the file system for ``capacity + write-queue``).

Failures are misses, never errors
    Every read checks the size and xxh3-64 digest of the whole data file.  A
    missing, truncated, foreign or corrupt file is a miss; a corrupt row is
    removed (only that row) and logged.  A full disk (``ENOSPC``) makes a write
    evict the oldest entries and retry once; if that fails too, the value is
    not cached and writes pause for ``FULL_BACKOFF`` seconds.  When the index
    itself cannot be written (a full disk blocks SQLite's WAL), eviction
    deletes the oldest data files first (their rows then read as misses and are
    removed later).  A directory that cannot be written caches nothing.  Each
    of these conditions gives **one** warning per :class:`ColumnCache` (later
    ones are debug lines), not one per key.  ``__setitem__`` raises only for
    values that can never be stored (a non-``str`` key, an object or
    structured dtype: ``TypeError``).

Settings every process agrees on
    The index's ``settings`` table holds the capacity and the layout version.
    ``ColumnCache(..., set_capacity=True)`` records this process's ``capacity``
    (the last such open wins) and evicts the oldest entries down to it at
    once, with one log line; otherwise a process whose own ``capacity`` differs
    uses the directory's (one log line).  Open caches follow a capacity
    recorded later by another process: every insert transaction reads it, and
    :meth:`ColumnCache.follow_capacity` does on demand (workers: with every
    heartbeat).  With ``fit_disk=True`` (workers) the capacity in force is at
    most what the file system can hold (:mod:`.capacity`; per process, never
    recorded).

No pickle
    Keys and tables of contents are SQLite text, values are raw array bytes,
    dtypes are NumPy type strings checked on read.  Nothing in the directory is
    ever unpickled or evaluated.
"""

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
from cacheaffinity.worker._store.layout import PLAIN
from cacheaffinity.worker._store.maintenance import ORPHAN_AFTER, Maintenance
from cacheaffinity.worker._store.protocol import ColumnStore, Pack
from cacheaffinity.worker._store.reads import Reader
from cacheaffinity.worker._store.writer import WriteBehind
from cacheaffinity.worker._store.writes import Item, WritePath, pack_item, plain_array, queue_bytes

__all__ = ["ColumnCache", "Pack"]

logger = logging.getLogger("cacheaffinity.worker")

_MISSING = object()

#: Every ColumnCache of this process, to replace their locks after fork (the
#: index replaces its own: :mod:`.index`).
LIVE: weakref.WeakValueDictionary[int, ColumnCache] = weakref.WeakValueDictionary()


def _reset_after_fork() -> None:
    for cache in list(LIVE.values()):
        cache._reset_after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)


class ColumnCache(MutableMapping, ColumnStore):
    """Decompressed column buffers on local disk, shared by a node's workers.

    Config section: ``cacheaffinity.worker`` (``capacity``, ``shared-group``,
    ``write-queue``, ``read``).

    Parameters
    ----------
    directory : str, os.PathLike or CacheDirectory
        Cache directory on node-local disk, created if needed.  All worker
        processes of a node pass the same directory.
    capacity : int or str, optional
        Upper bound of the bytes stored (data files in whole 4 KiB blocks; the
        index is not counted).  ``None`` reads ``cacheaffinity.worker.capacity``.
    stale_after : float, optional
        Temporaries older than this many seconds are deleted on open.
    shared_group : str or int, optional
        A Unix group whose members share this directory; ``None`` reads
        ``cacheaffinity.worker.shared-group`` (default: a private cache).
    orphan_after : float, optional
        Grace in seconds before a data file that no row references is deleted
        (default ``min(stale_after, ORPHAN_AFTER)``).
    heal : bool, optional
        Rebuild a damaged index and drop an older layout (the default).  ``False``
        changes nothing and disables the cache with the reason in
        :attr:`disabled` (the read-only ``cacheaffinity cache info``).
    set_capacity : bool, optional
        Record this process's ``capacity`` as the directory's (replacing the
        recorded one; its other processes follow it) and evict the oldest
        entries down to it now.  Default: adopt the capacity recorded there,
        if any.  Needs ``heal=True``.
    write_queue : int or str, optional
        Bytes of values waiting for the background writer thread (see
        :mod:`.writer`); ``0`` (the default here; workers pass
        ``cacheaffinity.worker.write-queue``) writes inline.
    fit_disk : bool, optional
        Keep the capacity in force within what the directory's file system can
        hold (:func:`~.capacity.fit_to_disk`: free space at open plus what the
        cache holds, minus a reserve; one warning when it clamps).  Workers pass
        True; the default (False) uses the capacity as given or recorded.
    read : {"auto", "map", "copy"}, optional
        How data files are read (:mod:`.files`): mapped copy-on-write (no copy;
        a file truncated in place by a foreign process while mapped kills the
        process with SIGBUS) or copied into a new buffer.  ``None`` reads
        ``cacheaffinity.worker.read``; ``"auto"``: map in a private cache, copy
        in a shared-group one.
    admission : {"rank", "fifo"}, optional
        What a full cache admits and evicts (:mod:`.admitter`): ``"rank"`` keeps the
        same lowest-ranked part of a working set larger than the cache, run after
        run; ``"fifo"`` evicts the oldest entry.  ``None`` reads
        ``cacheaffinity.worker.admission``.

    Notes
    -----
    See the module docstring.  After :meth:`close`, reads miss and writes do
    nothing (running tasks keep working while a worker shuts down); the other
    methods raise ``ValueError``.
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
        #: The cache directory (its owner: path, trust, entry names, node id).
        self.place: CacheDirectory = directory
        #: Absolute path of the cache directory.
        self.directory: str = directory.path
        #: Group id of a shared-group cache, None for a private one.
        self.shared_gid: int | None = directory.gid
        #: How data files are read: ``"map"`` or ``"copy"`` (``worker.read``; see
        #: :mod:`.files`; ``auto``: map in a private cache, copy in a shared one).
        self.read_mode: str = config.get("worker.read", read)
        if self.read_mode == "auto":
            self.read_mode = "map" if self.shared_gid is None else "copy"
        #: Admission policy name (``worker.admission``).
        self.admission_policy: str = config.get("worker.admission", admission)
        self._heals = bool(heal)
        self._pid = os.getpid()
        #: The directory failed the trust checks (the message), or None.
        self.untrusted: str | None = None
        #: Counters, disabled and closed state, paused writes, warnings once.
        self.health = Health(self.directory)
        self.files = DataFiles(self.directory, os.geteuid(), self.shared_gid, mapped=self.read_mode == "map")
        self.index = Index(
            self.directory, self.files, heals=self._heals,
            on_rebuilt=lambda: self.health.count(index_rebuilt=1),
            on_unhealable=self._unhealable,
        )  # fmt: skip
        #: The capacity setting and the bound in force (:attr:`capacity`).
        self.limit = Capacity(self.index, self.files, self.health, self.directory, configured, fit_disk=fit_disk)
        #: Owner of the admission policy's state (None: ``fifo``, eviction by row id).
        self.admission: Admitter | None = (
            None if self.admission_policy == "fifo" else Admitter(self.admission_policy, self.capacity)
        )
        #: Byte bound of the background writer's queue (0: write inline).
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
        """Check the directory, open the index, agree on the settings (a failure
        disables the cache with one warning)."""
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
                f"{e}: written by an older cacheaffinity; its entries are dropped when a "
                "worker opens the directory"
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

    #: The index was found damaged and left as it is (``heal=False``).
    damaged: bool = False
    #: Why the index cannot be used by this version (newer layout, damage that
    #: could not be rebuilt), or None: :meth:`clear` sets such an index aside.
    unreadable_index: str | None = None

    # ------------------------------------------------------------------ setup
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

    # --------------------------------------------------------------- capacity
    @property
    def configured_capacity(self) -> int:
        """The capacity setting: the argument (or config), or the directory's recorded
        one (followed when another process records a new one)."""
        return self.limit.configured

    @property
    def capacity(self) -> int:
        """Size bound in force, in bytes: :attr:`configured_capacity`, with
        ``fit_disk`` at most what the file system holds."""
        return self.limit.in_force

    @property
    def capacity_source(self) -> str:
        """``"directory"`` if :attr:`capacity` was read from the index, else ``"argument"``."""
        return self.limit.source

    @property
    def free_at_open(self) -> int | None:
        """Free bytes on the directory's file system at open (``fit_disk`` only; None: unknown)."""
        return self.limit.free_at_open

    @property
    def fit_disk(self) -> bool:
        """Whether the capacity in force is kept within what the file system holds."""
        return self.limit.fit_disk

    def follow_capacity(self, con: sqlite3.Connection | None = None) -> int:
        """Follow the capacity the directory records now (another process may
        have recorded a new one since this cache was opened); returns the
        capacity in force.

        Parameters
        ----------
        con : sqlite3.Connection, optional
            The connection of the caller's open transaction (the write path);
            default: a query of its own.

        Notes
        -----
        A change is taken as :attr:`configured_capacity` (with ``fit_disk``,
        fitted to the file system again) and logged once per process.
        """
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
        """Check the whole index (``PRAGMA integrity_check``) and rebuild it if it
        is damaged, keeping the entries that still read (the node id is untouched).
        An index this version cannot use (a newer layout, damage beyond repair) is
        set aside and a new one started (:mod:`.maintenance`).

        Returns
        -------
        bool
            Whether the index was rebuilt.
        """
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

    # ------------------------------------------------------------ bookkeeping
    def count_served(self, hits: int = 0, misses: int = 0, nbytes: int = 0) -> None:
        """Record lookups answered outside :meth:`get` (chunk pack members served
        from, or read past, this cache by :mod:`cacheaffinity.coffea._packs`)."""
        self.health.count(hits=hits, misses=misses, bytes_served=nbytes)

    def stats(self) -> dict[str, int]:
        """Counters of this process since the cache was opened.

        Returns
        -------
        dict
            ``hits``, ``misses``, ``bytes_served`` (lookups: plain entries and
            chunk pack members), ``bytes_written``, ``writes`` (data files),
            ``packs_read``, ``packs_written``, ``bytes_read`` and
            ``bytes_mapped`` (bytes of verified data files copied into a new
            buffer / mapped, see ``read``: the members are views of it),
            ``evictions`` and
            ``bytes_evicted`` (by this process's inserts, and at open down
            to a capacity given with ``set_capacity``), ``errors``,
            ``corrupt`` (rows that failed verification), ``skipped`` (values not
            cached: too large, disk full, unwritable or dropped), ``dropped``
            (full write queue), ``temporaries_removed``, ``orphans_removed``,
            ``index_rebuilt``.
        """
        return self.health.counts()

    # ------------------------------------------------------------------ reads
    def get(self, key: str, default: Any = None) -> np.ndarray | Any:
        """The array stored under ``key``, or ``default`` on a miss (verified;
        any failure is a miss)."""
        found = self.get_many([key])
        return found.get(key, default) if isinstance(key, str) else default

    def get_many(self, keys: list[str]) -> dict[str, np.ndarray]:
        """``{key: array}`` of those ``keys`` that hit: one index query for all."""
        return self.reader.get_many(keys)

    def get_packs(self, grp: str, start: int, stop: int) -> list[Pack]:
        """Every readable chunk pack of ``grp`` that overlaps ``[start, stop)``,
        newest first: one index query, one verified read per pack (:mod:`.reads`).
        Lookups are counted by the caller (:meth:`count_served`); failures are logged."""
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
        """Keys in store order (oldest first), as of the call (chunk packs too)."""
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
        """``{"entries": n, "bytes": b}`` committed in the index now (all processes;
        this process's queued writes are not waited for)."""
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

    # ----------------------------------------------------------------- writes
    def __setitem__(self, key: str, value: np.ndarray) -> None:
        """Store ``value`` under ``key`` (replacing any older value).

        A value larger than ``capacity``, a full disk or an unwritable directory
        leave the value uncached (and an older value under ``key`` removed) with
        one warning; nothing is raised for them.

        Raises
        ------
        TypeError
            If ``key`` is not a ``str``, or ``value`` has an object or structured dtype.
        """
        if not isinstance(key, str):
            raise TypeError(f"ColumnCache keys are str, got {type(key).__name__}: {key!r}")
        self.write_path.put(Item(key, None, None, None, {PLAIN: plain_array(key, value)}))

    def put_pack(self, grp: str, start: int, stop: int, arrays: dict[str, np.ndarray]) -> tuple[int, bool]:
        """Store the columns a chunk read for ``[start, stop)`` of ``grp`` as one pack.

        ``arrays`` maps member names (:func:`~.layout.member`) to arrays; they
        must not be modified afterwards (they are written behind).  Failures are
        as for ``__setitem__`` (:mod:`.writes`).  Returns the bytes the pack takes
        in the cache (whole blocks; 0 for no arrays) and whether it was taken (not:
        not admitted, too large, writes paused, cache closed).
        """
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
        """Remove every entry of the directory (all processes' entries).

        Data files are deleted first, then the rows: on a full disk the first
        step frees what the second needs.  An index this version cannot use (a
        newer layout, damage beyond repair) is set aside and a new one started;
        the node id is kept in every case."""
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

    # ------------------------------------------------------------ maintenance
    def _settle(self) -> None:
        """Let queued writes land before a call that looks at or changes the index."""
        if self.writer.busy():
            self.flush()

    def pending(self) -> int:
        """Number of values waiting for the background writer (0 when writing inline)."""
        with self.writer.cond:
            return len(self.writer.pending)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the background writer has stored every queued value.

        Returns
        -------
        bool
            True if nothing is left to write.
        """
        return self.writer.flush(timeout)

    def save_admission(self, force: bool = False) -> None:
        """Save the admission policy's unsaved lookups (:mod:`.admitter`) if due, or
        with ``force`` if any (workers: with every heartbeat; at close)."""
        adm = self.admission
        if adm is None or not self.health.usable:
            return
        if force or adm.save_due():
            adm.save(self.index)

    def looked_up(self, key: str, size: int) -> None:
        """Record a hit of ``key`` (``size`` bytes, its row's) for the admission policy."""
        adm = self.admission
        if adm is not None and adm.looked_up(key, size) and self.health.usable:
            adm.save(self.index)  # other processes of the node see this process's hits soon

    def collect_orphans(self, max_files: int | None = None) -> int:
        """Delete data files that no row references (bounded work: up to
        ``max_files``, default :data:`~.maintenance.ORPHAN_BATCH`, looked at per
        call; only files older than ``orphan_after``).  Returns the number deleted."""
        return self.maintenance.collect_orphans(max_files)

    def verify(self, on_entry: Callable[[], Any] | None = None) -> dict[str, int]:
        """Check every row's data file against its digest and tidy the directory.

        Corrupt rows are removed and logged; data files no row references and
        temporaries, both older than ``stale_after``, are deleted.

        Returns
        -------
        dict
            ``checked`` rows, of which ``ok``, ``corrupt`` (removed) and
            ``missing`` (evicted meanwhile, or the file was lost); ``orphans``
            (unreferenced data files deleted); ``temporaries`` (deleted).
        """
        self._settle()
        self.health.check_open()
        return self.maintenance.verify(on_entry)

    def info(self) -> dict[str, Any]:
        """``directory``, ``capacity``, ``size`` (bytes, as :meth:`volume`),
        ``entries``, ``packs``, ``oldest`` and ``newest`` store times (None when empty)."""
        self._settle()
        self.health.check_open()
        return {"directory": self.directory, "capacity": self.capacity, **self.maintenance.info()}

    # -------------------------------------------------------------- lifecycle
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
