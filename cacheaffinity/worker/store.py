"""Node-local store of decompressed column buffers, and its in-memory front.

Runs in **worker** processes.  Defines

- :class:`ColumnCache`, a ``MutableMapping[str, numpy.ndarray]`` over a directory
  on the node's local disk, bounded in bytes with FIFO eviction, shared by all
  worker processes of the node;
- :class:`MemoryFront`, the mapping handed to coffea as ``buffer_cache`` for one
  chunk: a small in-memory dict, bounded in bytes, in front of a
  :class:`ColumnCache`.

Layout of a cache directory (other files in it, such as ``node-id``, are left
alone)::

    columns.sqlite3     index: one row per key (file name, dtype, shape, size,
                        xxh3-64 checksum, store time, writer's uid), in FIFO order
    columns.lock        taken (flock) while a damaged index is rebuilt or the
                        settings are written
    settings.json       what every process must agree on: ``layout`` (the key
                        layout version) and ``capacity`` (bytes), written by the
                        first process that opens the directory
    columns/ab/<32 hex> data files: the raw C-order bytes of one array each,
                        written once, never modified, deleted when evicted
    columns-tmp/        values being written; renamed into ``columns/`` when
                        complete

Why not :class:`diskcache.Cache`
--------------------------------
diskcache has the right ordering ideas (write the value, commit the index, delete
files only after commit; FIFO, reads never write) and this store copies them, but
used as-is it falls short of what a *shared* column cache needs:

- its ``get`` unpickles any row whose mode says "pickle", whoever wrote it; in a
  directory other processes can write that is code execution.  Its ``Disk`` is a
  documented plug-in point (``Cache(disk=...)``), so a bytes/JSON-only ``Disk``
  that refuses pickled rows would close that hole, but it must be written and
  kept in step with diskcache's ``Disk`` API;
- it writes values straight to their final file name: a killed writer leaves a
  file that nothing references, which only ``check(fix=True)`` removes, by
  walking the whole directory under the write lock and deleting files other
  processes are still writing;
- its eviction is by bytes (``size_limit``; FIFO under the default
  "least-recently-stored" policy), but one ``set`` culls at most ``cull_limit``
  rows (default 10), does not say which keys it evicted (so this process cannot
  count evictions), and removes a corrupt entry only by key, which can delete a
  newer, good value stored meanwhile;
- dtype, shape and checksum would live in its ``tag`` column or a file header
  anyway.

What is left is small: a SQLite index in WAL mode (readers never block, one
writer at a time, atomic commit), write-once data files with unique random
names, and about as many lines as the adapter around diskcache would need.

Notes
-----
Trust
    A directory is used only if its user alone can write it: it is created
    with mode 0700, and an existing one must be a real directory (not a
    symbolic link) owned by this process's user and not writable by group or
    others (see :mod:`cacheaffinity.worker.directory`; a shared-group mode
    relaxes this for one Unix group).  Otherwise the cache is disabled with
    one warning naming the path, its owner and the fix.  Data files are opened
    with ``O_NOFOLLOW`` and must belong to the user that the entry names as
    its writer; anything else is a miss.

Thread and process safety
    Any number of threads and processes of one node may use one directory at
    the same time.  Each :class:`ColumnCache` holds one SQLite connection,
    guarded by a lock and reopened after ``fork``; the locks of every cache
    are replaced in a forked child (``os.register_at_fork``), so a fork while
    another thread holds one does not deadlock the child.  An index lookup takes
    microseconds, file I/O happens outside the lock.  Writers serialise on
    SQLite's write lock for the short index transaction only.  A data file is
    never modified once it is visible, and file names are never reused, so a
    reader sees either a complete value or nothing: a file deleted by another
    process's eviction after the index lookup is a miss.  Every process evicts
    down to *its own* ``capacity`` when it inserts.  The directory must be on a
    local file system (SQLite WAL does not work over NFS).

Crashes
    A value is written to ``columns-tmp/<name>.tmp``, renamed to
    ``columns/<ab>/<name>`` and only then committed to the index; files of
    replaced or evicted entries are deleted after the commit.  A process killed
    at any point leaves either a temporary (removed by the next
    :class:`ColumnCache` opened on the directory once it is older than
    ``stale_after``), a data file nothing references (an *orphan*: collected
    when a cache is opened and every ``ORPHAN_INTERVAL`` seconds by writers,
    at most ``ORPHAN_BATCH`` files per pass, once it is older than the
    ``orphan_after`` grace), or a complete entry.  Nothing is fsync'ed: after
    a power loss an entry may point to torn data, which its checksum turns into
    a miss.

Writes behind
    With ``write_queue > 0`` (workers: ``cacheaffinity.worker.write-queue``),
    ``__setitem__`` only queues the value and returns: a daemon thread per
    :class:`ColumnCache` writes queued values (checksum, temporary file,
    rename) and commits up to ``WRITE_BATCH`` of them, gathered for up to
    ``WRITE_COALESCE`` seconds after the first, in **one** index transaction, so a task never waits for the disk or SQLite's write lock.
    The crash ordering above is unchanged (an entry becomes visible only after
    its file is complete).  Queued values are served by ``get``/``get_many`` of
    this process; calls that look at or change the whole index (``len``,
    ``in``, iteration, ``volume``, ``info``, ``verify``, ``del``, ``clear``)
    first wait for the queue (:meth:`ColumnCache.flush`); :meth:`close` writes
    what is queued (bounded wait).  When the queued bytes would exceed
    ``write_queue`` a value is dropped (not cached, counted as ``dropped`` and
    ``skipped``, one warning) instead of blocking the task.  The values must
    not be modified after they were stored (the cluster arrays never are).

A damaged index heals
    An index SQLite reports as corrupt (garbage pages, a truncated file, not a
    database at all) is checked when a cache is opened (``PRAGMA
    quick_check``) and whenever a statement fails with ``SQLITE_CORRUPT`` or
    ``SQLITE_NOTADB``.  Under ``columns.lock`` the damaged file is moved aside
    to ``columns.sqlite3.corrupt`` (replacing an older one), a new index is
    created, and the rows that can still be read from the old one are copied
    over if their data file exists with the recorded size (their checksum is
    verified on every read anyway); the other data files become orphans.  The
    ``node-id`` file is never touched, so the node keeps its identity.  Other
    processes keep their connections: the new index is written over the old
    one through SQLite's backup API, which they see like any other commit.

Failures are misses, never errors
    ``get`` verifies the size and xxh3-64 checksum of every value it returns.
    A missing, truncated or corrupt file is a miss; a corrupt entry is removed
    (only that exact entry, so a newer value stored meanwhile is kept) and
    logged.  A full disk (``ENOSPC``) makes a write evict the oldest entries
    and retry once; if that fails too, the value is not cached and writes pause
    for ``_FULL_BACKOFF`` seconds (so that a disk filled by others does not
    drain the cache).  A directory that cannot be written (``EACCES``,
    ``EROFS``, one that cannot be created) caches nothing.  Each of these gives
    **one** warning per :class:`ColumnCache`, not one per key.  An older value
    under a key whose new value could not be stored is removed.
    ``__setitem__`` raises only for values that can never be stored: a
    non-``str`` key or an object or structured dtype (``TypeError``).

Settings every process agrees on
    ``settings.json`` holds the capacity and the layout version.  A process
    whose own ``capacity`` differs uses the directory's (one log line), so
    processes with different local configs do not evict each other's entries
    down to their own bound; ``ColumnCache(..., set_capacity=True)`` rewrites
    it.  A directory with no settings but entries (written by cacheaffinity
    before layout 3, whose keys were chunk entry ranges), another layout
    version or an unreadable settings file has its entries dropped, never
    read, with one warning.

No pickle
    Keys are SQLite text, values are raw array bytes, dtypes are NumPy type
    strings (``"<f4"``) checked on read, shapes are JSON integer lists.  Nothing
    in the directory is ever unpickled or evaluated.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import re
import shutil
import sqlite3
import stat
import threading
import time
import uuid
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import numpy as np
import xxhash
from dask.utils import format_bytes, parse_bytes

from cacheaffinity import config
from cacheaffinity.worker.directory import UntrustedDirectory, group_id, trusted_directory

__all__ = ["ColumnCache", "MemoryFront"]

logger = logging.getLogger("cacheaffinity.worker")

#: Version of the index schema and directory layout (1: without the writer
#: column and the file index; upgraded in place).
SCHEMA_VERSION = 2
#: Version of what keys and values mean (3: column entries per TTree cluster,
#: :mod:`cacheaffinity.coffea.clusters`).  Recorded in ``settings.json``; a
#: directory without it (written before version 3) or with another version
#: has its entries dropped on open, with one log line.
LAYOUT_VERSION = 3
SETTINGS_NAME = "settings.json"
INDEX_NAME = "columns.sqlite3"
LOCK_NAME = "columns.lock"
#: Where a damaged index is moved (replacing an older one).
CORRUPT_SUFFIX = ".corrupt"
DATA_DIR = "columns"
TMP_DIR = "columns-tmp"
#: Sizes are accounted in whole file-system blocks (a 10-byte array uses 4 KiB).
BLOCK = 4096
#: At most this many entries are evicted by one insert; a larger backlog (say,
#: after another process with a larger capacity filled the directory) is worked
#: off by the following inserts.
MAX_EVICTIONS_PER_INSERT = 1024
#: Seconds that writes pause after a write failed twice on a full disk.
_FULL_BACKOFF = 30.0
#: Seconds SQLite waits for another process's write transaction.
_BUSY_TIMEOUT = 30.0
#: Writers look for orphaned data files at most this often (seconds) ...
ORPHAN_INTERVAL = 60.0
#: ... and look at no more than this many data files per pass.
ORPHAN_BATCH = 2048
#: A data file nobody references is deleted only when older than this
#: (seconds): a live writer commits its entry within the busy timeout.
ORPHAN_AFTER = 4 * _BUSY_TIMEOUT
#: Seconds after a rebuild during which a damaged index is only a miss.
_HEAL_INTERVAL = 30.0
#: SQLite result codes of a damaged index.
_SQLITE_CORRUPT = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB
_NAME = re.compile(r"^[0-9a-f]{32}$")
_MISSING = object()
#: Stands for a value whose write was dropped (full write queue): a miss.
_DROPPED = object()
#: Keys per index query of :meth:`ColumnCache.get_many` (SQLite's variable limit).
_QUERY_KEYS = 500
#: Values the background writer stores in one index transaction at most.
WRITE_BATCH = 256
#: Seconds the background writer, woken by a first queued value, lets further
#: values gather before it writes (unless WRITE_BATCH are queued, a flush waits
#: or the cache closes): one transaction and one thread wake-up per batch
#: instead of per value while a task decompresses column after column.
WRITE_COALESCE = 0.05

_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
_UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR}

_UPGRADE_1 = """
ALTER TABLE entries ADD COLUMN writer INTEGER;
CREATE INDEX IF NOT EXISTS entries_file ON entries(file);
"""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,  -- FIFO order, never reused
    key      TEXT NOT NULL UNIQUE,
    file     TEXT NOT NULL,                      -- 32 hex digits
    dtype    TEXT NOT NULL,                      -- numpy type string, e.g. <f4
    shape    TEXT NOT NULL,                      -- JSON list of ints
    nbytes   INTEGER NOT NULL,                   -- bytes of data
    size     INTEGER NOT NULL,                   -- nbytes in whole blocks
    checksum BLOB NOT NULL,                      -- xxh3_64 digest (8 bytes)
    stored   REAL NOT NULL,                      -- time.time() of the store
    writer   INTEGER                             -- uid that wrote the data file
);
CREATE INDEX IF NOT EXISTS entries_file ON entries(file);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('size', 0), ('count', 0);
CREATE TRIGGER IF NOT EXISTS entries_insert AFTER INSERT ON entries BEGIN
    UPDATE meta SET value = value + NEW.size WHERE name = 'size';
    UPDATE meta SET value = value + 1 WHERE name = 'count';
END;
CREATE TRIGGER IF NOT EXISTS entries_delete AFTER DELETE ON entries BEGIN
    UPDATE meta SET value = value - OLD.size WHERE name = 'size';
    UPDATE meta SET value = value - 1 WHERE name = 'count';
END;
"""


def _blocks(nbytes: int) -> int:
    """Bytes a value of ``nbytes`` occupies on disk, in whole blocks."""
    return -(-nbytes // BLOCK) * BLOCK


def _as_bytes(arr: np.ndarray) -> np.ndarray:
    """A C-contiguous array's data as a flat uint8 view (works for datetimes too)."""
    return arr.reshape(-1).view(np.uint8)


def _problem(exc: BaseException) -> str:
    """Classify a write failure: ``"full"``, ``"unwritable"`` or ``"other"``."""
    if isinstance(exc, OSError):
        if exc.errno in _DISK_FULL:
            return "full"
        if exc.errno in _UNWRITABLE:
            return "unwritable"
        return "other"
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        text = str(exc).lower()
        if (code is not None and code & 0xFF == 13) or "disk is full" in text:
            return "full"
        if (code is not None and code & 0xFF in (8, 14)) or "readonly" in text:
            return "unwritable"
    return "other"


def _corruption(exc: BaseException) -> bool:
    """Whether ``exc`` says the index file is damaged (not merely busy or full)."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in _SQLITE_CORRUPT:
        return True
    text = str(exc).lower()
    return "malformed" in text or "not a database" in text


#: Every open ColumnCache and MemoryFront, to replace their locks after fork.
_LIVE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _reset_locks_after_fork() -> None:
    # A thread of the parent may have held a lock at fork(); that thread does
    # not exist in the child, so the lock would never be released.
    for obj in list(_LIVE.values()):
        obj._reset_locks()


os.register_at_fork(after_in_child=_reset_locks_after_fork)


def _queue_bytes(value: int | str) -> int:
    """``write_queue`` as bytes (``int`` or a dask byte string such as ``"256 MiB"``)."""
    try:
        n = parse_bytes(value) if isinstance(value, str) else int(value)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"cacheaffinity.worker.write-queue={value!r} is not a byte size; use bytes or "
            "a string like '256 MiB' (0 writes inline)"
        ) from e
    if n < 0:
        raise ValueError(
            f"cacheaffinity.worker.write-queue={value!r} must be >= 0 (0 writes inline)"
        )
    return n


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    except OSError as e:
        logger.debug("cacheaffinity: could not delete %s: %s", path, e)
        return False


class _Corrupt(Exception):
    """An index entry whose data does not read back as stored."""


class _Lost(Exception):
    """A temporary removed by another process (as stale) before its rename."""


class _Closed(ValueError):
    """The cache was closed (possibly by another thread, during a call)."""


#: Set in a thread while it reads entries for another node (not counted as lookups).
_FOR_PEER = threading.local()


class ColumnCache(MutableMapping):
    """Decompressed column buffers on local disk, shared by a node's workers.

    A bounded, FIFO-evicting ``MutableMapping[str, numpy.ndarray]`` over
    ``directory``.  Config section: ``cacheaffinity.worker`` (``capacity``).

    Parameters
    ----------
    directory : str or os.PathLike
        Cache directory on node-local disk, created if needed.  All worker
        processes of a node pass the same directory.
    capacity : int or str, optional
        Upper bound of the bytes stored (data files in whole 4 KiB blocks; the
        index is not counted).  ``None`` reads ``cacheaffinity.worker.capacity``.
    stale_after : float, optional
        Temporaries older than this many seconds are deleted on open: they were
        left by a killed writer.  (Deleting the temporary of a writer that is
        still alive only makes that one write fail quietly.)
    shared_group : str or int, optional
        A Unix group whose members share this directory (see
        :mod:`cacheaffinity.worker.directory`); ``None`` reads
        ``cacheaffinity.worker.shared-group`` (default null: a private cache).
    orphan_after : float, optional
        Grace in seconds before a data file that no entry references is deleted
        (default ``min(stale_after, ORPHAN_AFTER)``).
    heal : bool, optional
        Rebuild a damaged index (the default).  ``False`` leaves it as it is and
        disables the cache, with the damage in :attr:`disabled` (the read-only
        ``cacheaffinity cache info`` uses this); it also leaves the settings
        and entries of another layout as they are.
    set_capacity : bool, optional
        Write this process's ``capacity`` into the directory's settings
        (default: adopt the capacity recorded there, if any).
    write_queue : int or str, optional
        Bytes of values waiting to be written by a background writer thread
        (``__setitem__`` returns at once; see *Writes behind* in the module
        docstring).  ``0`` (the default here; workers pass
        ``cacheaffinity.worker.write-queue``) writes inline in ``__setitem__``.

    Attributes
    ----------
    directory : str
        Absolute path of the cache directory.
    capacity : int
        Size bound in bytes, enforced by this process's inserts (the
        directory's recorded capacity when it has one).
    capacity_source : str
        ``"directory"`` if :attr:`capacity` was read from ``settings.json``,
        else ``"argument"``.

    Notes
    -----
    See the module docstring for thread/process safety and failure behaviour.
    In short: ``get`` and ``__setitem__`` never raise for disk problems (a miss,
    or the value is not cached, plus one warning per instance); a value larger
    than ``capacity`` is not stored; object dtypes raise ``TypeError``.  A
    directory that cannot be written when the cache is opened disables it: every
    ``get`` misses and nothing is stored.  After :meth:`close`, ``get`` misses
    and ``__setitem__`` does nothing (running tasks keep working while a worker
    shuts down); the other methods raise ``ValueError``.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        capacity: int | str | None = None,
        *,
        stale_after: float = 300.0,
        shared_group: str | int | None = None,
        orphan_after: float | None = None,
        heal: bool = True,
        set_capacity: bool = False,
        write_queue: int | str = 0,
    ):
        #: Absolute path of the cache directory.
        self.directory: str = os.path.abspath(os.fspath(directory))
        #: Size bound in bytes.
        self.capacity: int = config.get_bytes("worker.capacity", capacity)
        self.capacity_source: str = "argument"
        self._set_capacity = bool(set_capacity)
        stale_after = float(stale_after)
        if not stale_after >= 0:
            raise ValueError(f"stale_after={stale_after!r} must be a number of seconds >= 0")
        #: Age in seconds after which a temporary is considered abandoned.
        self.stale_after: float = stale_after
        #: Age in seconds after which an unreferenced data file is deleted.
        self.orphan_after: float = (
            min(stale_after, ORPHAN_AFTER) if orphan_after is None else float(orphan_after)
        )
        group = config.get("worker.shared-group", shared_group)
        #: Group id of a shared-group cache, None for a private one.
        self.shared_gid: int | None = None if group is None else group_id(group)
        self._uid = os.geteuid()
        self._heals = bool(heal)
        self._index = os.path.join(self.directory, INDEX_NAME)
        self._data = os.path.join(self.directory, DATA_DIR)
        self._tmp = os.path.join(self.directory, TMP_DIR)
        #: Guards the SQLite connection (one statement or transaction at a time).
        self._lock = threading.RLock()
        #: Guards the counters and warning flags.
        self._stats_lock = threading.Lock()
        self._con: sqlite3.Connection | None = None
        #: No second rebuild before this ``time.monotonic()`` (a damage that a
        #: rebuild does not cure must not make every statement rebuild).
        self._next_heal = 0.0
        self._next_orphan_pass = 0.0
        #: Data subdirectory (two hex digits) the next orphan pass starts at.
        self._orphan_cursor = 0
        self._inherited: list[sqlite3.Connection] = []
        self._pid = os.getpid()
        self._closed = False
        #: Byte bound of the queue of the background writer (0: write inline).
        self.write_queue: int = _queue_bytes(write_queue)
        self._init_writer()
        #: Why this cache is unusable (None: usable).
        self._disabled: str | None = None
        #: The directory failed the trust checks (the message), or None.
        self.untrusted: str | None = None
        #: The index was found damaged and left as it is (``heal=False``).
        self.damaged: bool = False
        #: Writes are skipped until this ``time.monotonic()`` (full disk).
        self._pause_until = 0.0
        self._warned: set[str] = set()
        self._counts = dict.fromkeys(
            (
                "hits",
                "misses",
                "bytes_served",
                "bytes_written",
                "writes",
                "evictions",
                "bytes_evicted",
                "errors",
                "corrupt",
                "skipped",
                "temporaries_removed",
                "orphans_removed",
                "index_rebuilt",
                "dropped",
            ),
            0,
        )
        _LIVE[id(self)] = self
        try:
            trusted_directory(self.directory, shared_group=self.shared_gid)
        except UntrustedDirectory as e:
            self._untrusted(e)
            return
        except (OSError, ValueError) as e:
            self._unusable(e)
            return
        try:
            self._mkdir(self._data)
            self._mkdir(self._tmp)
            self._remove_stale_temporaries()
            self._probe_writable()
            self._open_index()
            self._settings()
        except UntrustedDirectory as e:  # a planted index, WAL or shm file
            self._untrusted(e)
            return
        except (OSError, sqlite3.Error) as e:
            self._unusable(e)
            return
        try:
            self.collect_orphans()
        except (OSError, sqlite3.Error, _Closed) as e:
            logger.debug("cacheaffinity: orphan collection on open failed: %s", e)

    def _untrusted(self, e: Exception) -> None:
        """Disable this process's cache: the directory (or a file in it) is not trusted."""
        self._disabled = self.untrusted = str(e)
        self._warn_once("disk", "cacheaffinity: %s Nothing is cached by this process.", e)

    def _unusable(self, e: Exception) -> None:
        """Disable this process's cache: the directory cannot be created, written or indexed."""
        self._disabled = f"{type(e).__name__}: {e}"
        self._warn_once(
            "disk",
            "cacheaffinity: cache directory %s cannot be used (%s); nothing will be "
            "cached by this process. Point cacheaffinity.worker.directory to a "
            "writable directory on local disk.",
            self.directory,
            self._disabled,
        )

    # ------------------------------------------------------------------ setup
    def _reset_locks(self) -> None:
        """Fresh locks in a forked child (the parent's may be held by a thread
        that does not exist here)."""
        self._lock = threading.RLock()
        self._stats_lock = threading.Lock()
        self._init_writer()  # the parent's writer thread does not exist here

    @property
    def _file_mode(self) -> int:
        return 0o600 if self.shared_gid is None else 0o660

    def _mkdir(self, path: str) -> None:
        """Create a directory of the cache (mode 0700, or 2770 in a shared group)."""
        try:
            os.mkdir(path, 0o700 if self.shared_gid is None else 0o770)
        except FileExistsError:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode):
                raise UntrustedDirectory(
                    f"{path} in cache directory {self.directory} is not a directory; "
                    f"remove it (the cache recreates it)"
                ) from None
            return
        if self.shared_gid is not None:
            os.chmod(path, 0o2770)

    def _probe_writable(self) -> None:
        path = os.path.join(self._tmp, f"{uuid.uuid4().hex}.tmp")
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
        )
        os.close(fd)
        os.unlink(path)

    def _check_index_file(self) -> None:
        """Refuse an index (or its WAL/shm files) that is a link or someone else's."""
        for suffix in ("", "-wal", "-shm"):
            path = self._index + suffix
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                raise UntrustedDirectory(
                    f"{path} is not a regular file (a link?); the cache never creates one. "
                    f"Remove it (the index is rebuilt)"
                )
            if self.shared_gid is None and st.st_uid != self._uid:
                raise UntrustedDirectory(
                    f"{path} belongs to uid {st.st_uid}, not to uid {self._uid} who runs this "
                    "process; remove it (the index is rebuilt) or use your own directory"
                )

    def _open_index(self) -> None:
        """Connect, check the index (``quick_check``) and rebuild it if it is damaged."""
        try:
            with self._lock:
                con = self._connection()
                result = con.execute("PRAGMA quick_check(1)").fetchone()
            if result is None or result[0] != "ok":
                raise sqlite3.DatabaseError(f"database disk image is malformed: {result}")
        except sqlite3.DatabaseError as e:
            if not _corruption(e):
                raise
            if not self._heals:
                self.damaged = True
                raise
            self._heal(e)

    def _read_settings(self) -> dict | None:
        """The directory's settings; None if absent; ``{}`` if unreadable."""
        path = os.path.join(self.directory, SETTINGS_NAME)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as e:
            logger.debug("cacheaffinity: %s unreadable: %s", path, e)
            return {}
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (
                self.shared_gid is None and st.st_uid != self._uid
            ):
                return {}
            with os.fdopen(fd, "rb", closefd=False) as f:
                doc = json.loads(f.read(65536))
        except (OSError, ValueError):
            return {}
        finally:
            os.close(fd)
        if not isinstance(doc, dict):
            return {}
        ok = isinstance(doc.get("layout"), int) and isinstance(doc.get("capacity"), int)
        return doc if ok and doc["capacity"] >= 0 else {}

    def _write_settings(self, doc: dict) -> None:
        path = os.path.join(self.directory, SETTINGS_NAME)
        tmp = os.path.join(self._tmp, f"{uuid.uuid4().hex}.tmp")
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
            self._file_mode,
        )  # fmt: skip
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, path)

    def _settings(self) -> None:
        """Adopt or write ``settings.json``; drop entries of another layout."""
        doc = self._read_settings()
        if doc is not None and doc.get("layout") == LAYOUT_VERSION and not self._set_capacity:
            self._adopt(doc)
            return
        if not self._heals:  # read-only (``cache info``): report, change nothing
            if doc:
                self._adopt(doc)
            return
        lock_path = os.path.join(self.directory, LOCK_NAME)
        fd = os.open(
            lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, self._file_mode
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            doc = self._read_settings()  # another process may have written it meanwhile
            if doc is not None and doc.get("layout") == LAYOUT_VERSION:
                if not self._set_capacity:
                    self._adopt(doc)
                    return
            else:
                entries = int(self._query("SELECT value FROM meta WHERE name = 'count'")[0][0])
                if entries:
                    if doc is None:
                        why = "written before layout version 3 (no settings.json)"
                    elif doc:
                        why = f"of layout version {doc.get('layout')}"
                    else:
                        why = "with an unreadable settings.json"
                    logger.warning(
                        "cacheaffinity: cache directory %s is %s, this cacheaffinity uses "
                        "layout version %d: dropped its %d entries (never read); the cache "
                        "fills again from storage",
                        self.directory, why, LAYOUT_VERSION, entries,
                    )  # fmt: skip
                    self.clear()
            self._write_settings({"layout": LAYOUT_VERSION, "capacity": int(self.capacity)})
        finally:
            os.close(fd)

    def _adopt(self, doc: dict) -> None:
        if doc["capacity"] != self.capacity:
            logger.info(
                "cacheaffinity: cache directory %s records capacity %s, used instead of this "
                "process's %s so that all its processes agree (ColumnCache(set_capacity=True) "
                "changes it)",
                self.directory, format_bytes(doc["capacity"]), format_bytes(self.capacity),
            )  # fmt: skip
        self.capacity = int(doc["capacity"])
        self.capacity_source = "directory"

    def repair(self) -> bool:
        """Check the whole index (``PRAGMA integrity_check``) and rebuild it if it is
        damaged, keeping the entries that still read (the node id is untouched).

        Returns
        -------
        bool
            Whether the index was rebuilt.
        """
        self._check_usable()
        if self._disabled:
            raise ValueError(f"{self!r} cannot be used: {self._disabled}")
        before = self.stats()["index_rebuilt"]
        try:
            with self._lock:
                rows = self._connection().execute("PRAGMA integrity_check(1)").fetchall()
            if rows != [("ok",)]:
                raise sqlite3.DatabaseError(f"database disk image is malformed: {rows[:1]}")
        except sqlite3.DatabaseError as e:
            if not _corruption(e):
                raise
            self._heal(e)
        if self._disabled:
            raise ValueError(f"{self!r} cannot be used: {self._disabled}")
        return self.stats()["index_rebuilt"] > before

    def _connect(self) -> sqlite3.Connection:
        self._check_index_file()
        con = sqlite3.connect(
            self._index,
            timeout=_BUSY_TIMEOUT,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            for attempt in range(20):  # journal_mode may be busy while others open
                try:
                    con.execute("PRAGMA journal_mode=WAL")
                    break
                except sqlite3.OperationalError as e:
                    if "locked" not in str(e) or attempt == 19:
                        raise
                    time.sleep(0.05)
            con.execute("PRAGMA synchronous=NORMAL")
            version = con.execute("PRAGMA user_version").fetchone()[0]
            if version == 1:  # add the writer column and the file index
                try:
                    con.execute("BEGIN IMMEDIATE")
                    if con.execute("PRAGMA user_version").fetchone()[0] == 1:
                        for statement in filter(None, map(str.strip, _UPGRADE_1.split(";"))):
                            con.execute(statement)
                        con.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                    con.execute("COMMIT")
                except BaseException:
                    if con.in_transaction:
                        con.execute("ROLLBACK")
                    raise
                version = SCHEMA_VERSION
            if version not in (0, SCHEMA_VERSION):
                raise sqlite3.DatabaseError(
                    f"{self._index} has layout version {version}, this cacheaffinity "
                    f"reads version {SCHEMA_VERSION}; delete the directory or use another"
                )
            if version == 0:
                # Processes opening a new directory together: the first creates
                # the schema, the others wait for its lock and find it there.
                try:
                    con.executescript(
                        f"BEGIN IMMEDIATE;{_SCHEMA}PRAGMA user_version={SCHEMA_VERSION};COMMIT;"
                    )
                except BaseException:
                    if con.in_transaction:
                        con.execute("ROLLBACK")
                    raise
            if self.shared_gid is not None:
                st = os.stat(self._index)
                if st.st_uid == self._uid and stat.S_IMODE(st.st_mode) & 0o060 != 0o060:
                    os.chmod(self._index, 0o660)  # -wal and -shm copy this mode
        except BaseException:
            con.close()
            raise
        return con

    def _in_writer(self) -> bool:
        return self._writer is not None and threading.current_thread() is self._writer

    def _con_lock(self) -> threading.RLock:
        """The lock of the calling thread's connection (the writer thread has its own)."""
        return self._wlock if self._in_writer() else self._lock

    def _connection(self) -> sqlite3.Connection:
        """The SQLite connection of this process (call with :meth:`_con_lock` held).

        The background writer thread has a connection of its own, so that its
        transactions (which may wait for other processes' write lock) never
        hold up lookups of the tasks.
        """
        if self._closed:
            raise _Closed(f"{self!r} is closed")
        if self._in_writer():
            if self._wcon is None:
                self._wcon = self._connect()
            return self._wcon
        if self._con is None or self._pid != os.getpid():
            # A connection must not cross fork(): the child opens its own and
            # never touches (not even closes) the one inherited from the parent.
            if self._con is not None:
                self._inherited.append(self._con)
            self._con = self._connect()
            self._pid = os.getpid()
        return self._con

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._con_lock():
            try:
                con = self._connection()
                con.execute("BEGIN IMMEDIATE")
                try:
                    yield con
                    con.execute("COMMIT")
                except BaseException:
                    if con.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            con.execute("ROLLBACK")
                    raise
            except sqlite3.DatabaseError as e:
                if _corruption(e) and self._heals:
                    self._heal(e)
                raise

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._con_lock():
            try:
                return self._connection().execute(sql, args).fetchall()
            except sqlite3.DatabaseError as e:
                if _corruption(e) and self._heals:
                    self._heal(e)
                raise

    # ---------------------------------------------------------------- healing
    def _salvage(self, con: sqlite3.Connection) -> list[tuple]:
        """The rows of a damaged index that can still be read, in FIFO order.

        A damaged page ends a scan; the next one starts at a growing distance
        past the last id read (about 40 attempts per damaged region at most).
        """
        columns = "id, key, file, dtype, shape, nbytes, size, checksum, stored"
        try:
            has_writer = any(r[1] == "writer" for r in con.execute("PRAGMA table_info(entries)"))
        except sqlite3.Error:
            return []
        if has_writer:
            columns += ", writer"
        rows: list[tuple] = []
        start, jump = -(2**63), 0
        while jump <= 2**40:
            try:
                got = 0
                for row in con.execute(
                    f"SELECT {columns} FROM entries WHERE id >= ? ORDER BY id", (start + jump,)
                ):
                    rows.append(row if has_writer else (*row, None))
                    start, jump, got = row[0] + 1, 0, got + 1
                return rows
            except sqlite3.Error:
                jump = max(1, 2 * jump)
            if start == -(2**63):
                start = 0
        return rows

    def _usable_row(self, row: tuple) -> bool:
        """Whether a salvaged row's data file exists with the recorded size."""
        _, key, name, dtype, shape, nbytes, size, checksum, stored, writer = row
        if not (isinstance(key, str) and isinstance(name, str) and _NAME.match(name)):
            return False
        if not (isinstance(nbytes, int) and isinstance(size, int) and size == _blocks(nbytes)):
            return False
        if not (isinstance(checksum, bytes) and len(checksum) == 8):
            return False
        try:
            st = os.lstat(self._path(name))
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size == nbytes and (
            writer is None or st.st_uid == writer
        )

    def _heal(self, exc: BaseException) -> None:
        """Rebuild a damaged index in place, keeping the rows that still read.

        Runs under ``columns.lock`` (one process heals, the others find a good
        index when they get the lock).  The new index is written over the old
        one with SQLite's backup API, so connections of other processes stay
        valid and see the new content; only when that fails is the file removed
        and created again.  Never raises: a cache that cannot be healed is
        disabled with one warning.
        """
        with self._lock:
            if self._closed or self._disabled or time.monotonic() < self._next_heal:
                return
            self._next_heal = time.monotonic() + _HEAL_INTERVAL
            try:
                self._rebuild(exc)
            except (OSError, sqlite3.Error) as e:
                self._disabled = f"the index is damaged ({exc}) and could not be rebuilt ({e})"
                self._warn_once(
                    "disk",
                    "cacheaffinity: index %s is damaged (%s) and could not be rebuilt (%s); "
                    "nothing is cached by this process. Run `cacheaffinity cache verify "
                    "--repair %s` as the workers' user.",
                    self._index,
                    exc,
                    e,
                    self.directory,
                )

    def _rebuild(self, exc: BaseException) -> None:
        lock_path = os.path.join(self.directory, LOCK_NAME)
        fd = os.open(
            lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, self._file_mode
        )
        try:
            if self.shared_gid is not None and os.fstat(fd).st_uid == self._uid:
                os.fchmod(fd, 0o660)
            fcntl.flock(fd, fcntl.LOCK_EX)
            if self._con is not None and self._pid == os.getpid():
                with contextlib.suppress(sqlite3.Error):
                    self._con.close()
            self._con = None
            # Another process may have rebuilt it while this one waited.
            raw = sqlite3.connect(self._index, timeout=_BUSY_TIMEOUT, isolation_level=None)
            try:
                try:
                    ok = raw.execute("PRAGMA quick_check(1)").fetchone()
                    if ok is not None and ok[0] == "ok":
                        version = raw.execute("PRAGMA user_version").fetchone()[0]
                        if version in (0, 1, SCHEMA_VERSION):
                            return
                except sqlite3.DatabaseError:
                    pass
                with contextlib.suppress(OSError):
                    shutil.copyfile(self._index, self._index + CORRUPT_SUFFIX)
                try:
                    page_size = int(raw.execute("PRAGMA page_size").fetchone()[0])
                except sqlite3.Error:
                    page_size = 4096
                rows = self._salvage(raw)
                kept = [r for r in rows if self._usable_row(r)]
                fresh = sqlite3.connect(":memory:", isolation_level=None)
                try:
                    fresh.execute(f"PRAGMA page_size={page_size}")
                    fresh.executescript(
                        f"BEGIN;{_SCHEMA}PRAGMA user_version={SCHEMA_VERSION};COMMIT;"
                    )
                    fresh.execute("BEGIN")
                    fresh.executemany(
                        "INSERT OR IGNORE INTO entries (id, key, file, dtype, shape, nbytes, size,"
                        " checksum, stored, writer) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        kept,
                    )
                    fresh.execute("COMMIT")
                    try:
                        fresh.backup(raw)
                        raw.execute("PRAGMA journal_mode=WAL")
                        good = raw.execute("PRAGMA quick_check(1)").fetchone()[0] == "ok"
                    except sqlite3.Error:
                        good = False
                    if not good:  # the header itself is gone: start a new file
                        raw.close()
                        for suffix in ("-wal", "-shm", ""):
                            _unlink(self._index + suffix)
                        raw = sqlite3.connect(self._index, timeout=_BUSY_TIMEOUT, isolation_level=None)
                        fresh.backup(raw)
                finally:
                    fresh.close()
            finally:
                raw.close()
            self._count(index_rebuilt=1)
            logger.warning(
                "cacheaffinity: index %s was damaged (%s); rebuilt it with %d of %d readable "
                "entries (a copy of the damaged file is %s; node id kept). Columns of the "
                "other entries are read from storage again.",
                self._index,
                exc,
                len(kept),
                len(rows),
                self._index + CORRUPT_SUFFIX,
            )
        finally:
            os.close(fd)  # releases the lock

    def collect_orphans(self, max_files: int | None = None) -> int:
        """Delete data files that no entry references (bounded work).

        Looks at the data subdirectories in turn, starting where the previous
        pass stopped, until ``max_files`` files were looked at or every
        subdirectory was visited once (``max_files`` defaults to
        ``ORPHAN_BATCH``).  Only files older than ``orphan_after``
        are deleted (a live writer commits its entry well within that).

        Returns
        -------
        int
            Files deleted.
        """
        self._check_usable()
        if self._disabled:
            return 0
        if max_files is None:
            max_files = ORPHAN_BATCH
        self._next_orphan_pass = time.monotonic() + ORPHAN_INTERVAL
        cutoff = time.time() - self.orphan_after
        seen = removed = 0
        for _ in range(256):
            if seen >= max_files:
                break
            prefix = f"{self._orphan_cursor:02x}"
            self._orphan_cursor = (self._orphan_cursor + 1) % 256
            sub = os.path.join(self._data, prefix)
            try:
                with os.scandir(sub) as it:
                    candidates = []
                    for f in it:
                        seen += 1
                        if not _NAME.match(f.name) or not f.name.startswith(prefix):
                            continue
                        try:
                            if f.stat(follow_symlinks=False).st_mtime > cutoff:
                                continue
                        except FileNotFoundError:
                            continue
                        candidates.append(f.name)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if not candidates:
                continue
            upper = f"{int(prefix, 16) + 1:02x}" if prefix != "ff" else "g"
            known = {
                n
                for (n,) in self._query(
                    "SELECT file FROM entries WHERE file >= ? AND file < ?", (prefix, upper)
                )
            }
            for name in candidates:
                if name not in known:
                    removed += _unlink(os.path.join(sub, name))
        if removed:
            logger.info(
                "cacheaffinity: deleted %d orphaned data files (left by killed writers) "
                "from %s",
                removed,
                self._data,
            )
            self._count(orphans_removed=removed)
        return removed

    def _remove_stale_temporaries(self) -> int:
        """Delete temporaries older than ``stale_after`` (left by dead writers)."""
        removed = 0
        cutoff = time.time() - self.stale_after
        with os.scandir(self._tmp) as it:
            for entry in it:
                if not entry.name.endswith(".tmp"):
                    continue
                try:
                    if entry.stat(follow_symlinks=False).st_mtime <= cutoff:
                        removed += _unlink(entry.path)
                except FileNotFoundError:
                    pass
        if removed:
            logger.info(
                "cacheaffinity: removed %d abandoned temporaries from %s", removed, self._tmp
            )
        self._count(temporaries_removed=removed)
        return removed

    @property
    def disabled(self) -> str | None:
        """Why the directory could not be used when the cache was opened, or None."""
        return self._disabled

    # ------------------------------------------------------------ bookkeeping
    def _count(self, **deltas: int) -> None:
        if getattr(_FOR_PEER, "on", False):  # lookups for another node are not ours
            for name in ("hits", "misses", "bytes_served"):
                deltas.pop(name, None)
        with self._stats_lock:
            for name, delta in deltas.items():
                self._counts[name] += delta

    def _warn_once(self, topic: str, msg: str, *args: Any) -> None:
        with self._stats_lock:
            first = topic not in self._warned
            self._warned.add(topic)
        logger.log(logging.WARNING if first else logging.DEBUG, msg, *args)

    def _path(self, name: str) -> str:
        return os.path.join(self._data, name[:2], name)

    def _check_usable(self) -> None:
        if self._closed:
            raise _Closed(f"{self!r} is closed")

    def stats(self) -> dict[str, int]:
        """Counters of this process since the cache was opened.

        Returns
        -------
        dict
            ``hits``, ``misses``, ``bytes_served``, ``bytes_written``, ``writes``,
            ``evictions`` and ``bytes_evicted`` (by this process's inserts),
            ``errors`` (I/O and index failures), ``corrupt`` (entries that failed
            verification), ``skipped`` (values not cached: too large, disk full,
            unwritable or dropped), ``dropped`` (values not cached because the
            write queue was full), ``temporaries_removed``, ``orphans_removed``,
            ``index_rebuilt``.  Hits include values served from the write queue.
        """
        with self._stats_lock:
            return dict(self._counts)

    # ------------------------------------------------------------------ reads
    def _lookup(self, key: str) -> tuple | None:
        rows = self._query(
            "SELECT file, dtype, shape, nbytes, checksum, writer FROM entries WHERE key = ?",
            (key,),
        )
        return rows[0] if rows else None

    def _read(self, key: str, row: tuple) -> np.ndarray | None:
        """Read and verify one entry.  None if its file is gone.

        Raises
        ------
        _Corrupt
            If the entry does not read back exactly as it was stored.
        """
        name, dtype_str, shape_json, nbytes, checksum, writer = row
        if not (isinstance(name, str) and _NAME.match(name)):
            raise _Corrupt(f"invalid file name {name!r} in the index")
        try:
            dtype = np.dtype(dtype_str)
            shape = tuple(json.loads(shape_json))
        except (TypeError, ValueError) as e:
            raise _Corrupt(f"unreadable dtype/shape {dtype_str!r} {shape_json!r}") from e
        if (
            dtype.hasobject
            or dtype.fields is not None
            or not all(type(n) is int and n >= 0 for n in shape)
            or len(shape) > 64
            or math.prod(shape) * dtype.itemsize != nbytes
        ):
            raise _Corrupt(
                f"inconsistent entry dtype={dtype_str} shape={shape_json} nbytes={nbytes}"
            )
        try:
            fd = os.open(self._path(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None  # evicted or replaced by another process after the lookup
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _Corrupt("the data file is a symbolic link") from None
            raise
        f = open(fd, "rb", buffering=0)
        with f:
            st = os.fstat(fd)
            owner = self._uid if writer is None and self.shared_gid is None else writer
            if not stat.S_ISREG(st.st_mode) or (owner is not None and st.st_uid != owner):
                raise _Corrupt(
                    f"the data file belongs to uid {st.st_uid}, the entry was written by "
                    f"uid {owner}"
                )
            out = np.empty(shape, dtype)
            view = memoryview(_as_bytes(out))
            done = 0
            while done < nbytes:
                n = f.readinto(view[done:])
                if not n:
                    break
                done += n
            if done != nbytes or st.st_size < nbytes:
                raise _Corrupt(f"file holds {done} bytes, the index says {nbytes}")
            if st.st_size > nbytes:
                raise _Corrupt(f"file is longer than the {nbytes} bytes in the index")
        if xxhash.xxh3_64_digest(view) != checksum:
            raise _Corrupt("xxh3 checksum mismatch")
        return out

    def _remove_entry(self, key: str, name: str) -> None:
        """Delete exactly this entry (not a newer value under the same key)."""
        try:
            with self._transaction() as con:
                con.execute("DELETE FROM entries WHERE key = ? AND file = ?", (key, name))
        except (sqlite3.Error, OSError, _Closed) as e:
            logger.debug("cacheaffinity: could not remove entry %r: %s", key, e)
            return
        if isinstance(name, str) and _NAME.match(name):
            _unlink(self._path(name))

    def get(self, key: str, default: Any = None) -> np.ndarray | Any:
        """The array stored under ``key``, or ``default`` on a miss.

        Every value is verified (size and xxh3-64 checksum) before it is
        returned.  A missing or corrupt entry, a closed or unusable cache and any
        I/O error are misses; corrupt entries are removed and logged.
        """
        if self._closed or self._disabled:
            self._count(misses=1)
            return default
        if self._pending:
            with self._wq_cond:
                pending = self._pending.get(key, _MISSING)
            if pending is not _MISSING:
                return self._served_pending(pending, default)
        try:
            row = self._lookup(key)
        except _Closed:
            self._count(misses=1)
            return default
        except (OSError, sqlite3.Error, ValueError) as e:
            self._read_failed(key, e)
            return default
        return self._get_row(key, row, default)

    def get_many(self, keys: list[str]) -> dict[str, np.ndarray]:
        """The stored arrays of those ``keys`` that hit, ``{key: array}``.

        Like :meth:`get` for each key (verified, failures are misses), with one
        index query for all of them.
        """
        out: dict[str, np.ndarray] = {}
        if self._closed or self._disabled:
            self._count(misses=len(keys))
            return out
        todo = []
        if self._pending:
            with self._wq_cond:
                found = [(k, self._pending.get(k, _MISSING)) for k in keys]
            for k, pending in found:
                if pending is _MISSING:
                    todo.append(k)
                else:
                    v = self._served_pending(pending, _MISSING)
                    if v is not _MISSING:
                        out[k] = v
        else:
            todo = list(keys)
        rows: dict[str, tuple] = {}
        try:
            for i in range(0, len(todo), _QUERY_KEYS):
                part = todo[i : i + _QUERY_KEYS]
                marks = ",".join("?" * len(part))
                for row in self._query(
                    "SELECT key, file, dtype, shape, nbytes, checksum, writer FROM entries "
                    f"WHERE key IN ({marks})",
                    tuple(part),
                ):
                    rows[row[0]] = row[1:]
        except _Closed:
            self._count(misses=len(todo))
            return out
        except (OSError, sqlite3.Error, ValueError) as e:
            self._read_failed(todo[0] if todo else "", e, n=len(todo))
            return out
        for k in todo:
            v = self._get_row(k, rows.get(k), _MISSING)
            if v is not _MISSING:
                out[k] = v
        return out

    def get_many_for_peer(self, keys: list[str]) -> dict[str, np.ndarray]:
        """:meth:`get_many` on behalf of another node (:mod:`cacheaffinity.worker.peers`):
        the same verified reads, not counted as this process's hits or misses
        (errors and corrupt entries still are)."""
        _FOR_PEER.on = True
        try:
            return self.get_many(keys)
        finally:
            _FOR_PEER.on = False

    def _served_pending(self, pending: Any, default: Any) -> Any:
        if pending is _DROPPED:
            self._count(misses=1)
            return default
        self._count(hits=1, bytes_served=pending.nbytes)
        return pending

    def _read_failed(self, key: str, e: BaseException, n: int = 1) -> None:
        self._warn_once(
            "read",
            "cacheaffinity: cache read of %r in %s failed (%s); a miss",
            key,
            self.directory,
            e,
        )
        self._count(misses=n, errors=n)

    def _get_row(self, key: str, row: tuple | None, default: Any) -> Any:
        """Read, verify and count the entry of ``key`` found in the index (or None)."""
        try:
            out = None if row is None else self._read(key, row)
        except _Corrupt as e:
            logger.warning(
                "cacheaffinity: corrupt cache entry %r in %s (%s); removed, reading it from "
                "storage instead",
                key,
                self.directory,
                e,
            )
            self._count(misses=1, corrupt=1, errors=1)
            self._remove_entry(key, row[0])
            return default
        except _Closed:
            self._count(misses=1)
            return default
        except (OSError, sqlite3.Error, ValueError) as e:
            self._warn_once(
                "read",
                "cacheaffinity: cache read of %r in %s failed (%s); a miss",
                key,
                self.directory,
                e,
            )
            self._count(misses=1, errors=1)
            return default
        if out is None:
            self._count(misses=1)
            if row is not None:
                # Evicted by another process after the lookup (then this deletes
                # nothing), or the file was lost: drop exactly that entry.
                self._remove_entry(key, row[0])
            return default
        self._count(hits=1, bytes_served=out.nbytes)
        return out

    def __getitem__(self, key: str) -> np.ndarray:
        out = self.get(key, _MISSING)
        if out is _MISSING:
            raise KeyError(key)
        return out

    def __contains__(self, key: object) -> bool:
        """Whether the index has ``key`` (cheap: the data file is not read)."""
        self._settle()
        self._check_usable()
        if self._disabled or not isinstance(key, str):
            return False
        return bool(self._query("SELECT 1 FROM entries WHERE key = ?", (key,)))

    def __iter__(self) -> Iterator[str]:
        """Keys in store order (oldest first), as of the call."""
        self._settle()
        self._check_usable()
        if self._disabled:
            return iter(())
        return iter([k for (k,) in self._query("SELECT key FROM entries ORDER BY id")])

    def __len__(self) -> int:
        """Number of entries in the directory (all processes)."""
        self._settle()
        self._check_usable()
        if self._disabled:
            return 0
        return int(self._query("SELECT value FROM meta WHERE name = 'count'")[0][0])

    def totals(self) -> dict[str, int]:
        """``{"entries": n, "bytes": b}`` committed in the index now (all
        processes; this process's queued writes are not waited for)."""
        self._check_usable()
        if self._disabled:
            return {"entries": 0, "bytes": 0}
        rows = dict(self._query("SELECT name, value FROM meta WHERE name IN ('size', 'count')"))
        return {"entries": int(rows.get("count", 0)), "bytes": int(rows.get("size", 0))}

    def volume(self) -> int:
        """Bytes stored in the directory (all processes), in whole blocks."""
        self._settle()
        self._check_usable()
        if self._disabled:
            return 0
        return int(self._query("SELECT value FROM meta WHERE name = 'size'")[0][0])

    # ----------------------------------------------------------------- writes
    def _validate(self, key: object, value: object) -> np.ndarray:
        if not isinstance(key, str):
            raise TypeError(f"ColumnCache keys are str, got {type(key).__name__}: {key!r}")
        arr = np.asarray(value)
        dtype = arr.dtype
        if dtype.hasobject:
            raise TypeError(
                f"cannot cache {key!r}: dtype {dtype} holds Python objects; only arrays of "
                "numbers, bools, bytes or strings are stored (objects would need pickle)"
            )
        if dtype.fields is not None or dtype.subdtype is not None:
            raise TypeError(
                f"cannot cache {key!r}: structured dtype {dtype} is not supported; store "
                "each field as its own array"
            )
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr).reshape(arr.shape)
        return arr

    def __setitem__(self, key: str, value: np.ndarray) -> None:
        """Store ``value`` under ``key`` (replacing any older value).

        A value larger than ``capacity``, a full disk or an unwritable directory
        leave the value uncached (and an older value under ``key`` removed) with
        one warning; nothing is raised for them.

        Raises
        ------
        TypeError
            If ``key`` is not a ``str``, or ``value`` has an object or structured
            dtype.
        """
        arr = self._validate(key, value)
        if self._closed or self._disabled:
            self._count(skipped=1)
            return
        size = _blocks(arr.nbytes)
        if size > self.capacity:
            self._warn_once(
                "oversize",
                "cacheaffinity: column %r of %s exceeds cacheaffinity.worker.capacity=%s; "
                "not cached (raise the capacity, e.g. dask.config.set("
                "{'cacheaffinity.worker.capacity': '200 GiB'}))",
                key,
                format_bytes(arr.nbytes),
                format_bytes(self.capacity),
            )
            self._count(skipped=1)
            self._discard(key)
            return
        if time.monotonic() < self._pause_until:
            self._count(skipped=1)
            self._discard(key)
            return
        if self.write_queue > 0:
            self._enqueue(key, arr, size)
            return
        self._set_now(key, arr, size)

    def _set_now(self, key: str, arr: np.ndarray, size: int) -> None:
        """Store one value now; failures leave it uncached with one warning."""
        try:
            self._store(key, arr, size)
            return
        except (_Lost, _Closed) as e:
            logger.debug("cacheaffinity: %r not cached: %s", key, e)
            self._count(skipped=1)
            return
        except (OSError, sqlite3.Error) as e:
            problem, error = _problem(e), e
        if problem == "full":
            # The disk holds less than capacity says.  Make room for this value
            # and as much again (the index grows too), then retry once.
            self._count(errors=1)
            self._make_room(2 * size + BLOCK)
            try:
                self._store(key, arr, size)
                return
            except (_Lost, _Closed):
                self._count(skipped=1)
                return
            except (OSError, sqlite3.Error) as e:
                problem, error = _problem(e), e
        self._count(errors=1, skipped=1)
        if problem == "full":
            self._pause_until = time.monotonic() + _FULL_BACKOFF
            self._warn_once(
                "disk",
                "cacheaffinity: disk of cache %s is full (%s); some columns are not "
                "cached (writes pause %.0f s after each failure). Lower "
                "cacheaffinity.worker.capacity or free space on that disk.",
                self.directory,
                error,
                _FULL_BACKOFF,
            )
        elif problem == "unwritable":
            self._warn_once(
                "disk",
                "cacheaffinity: cache directory %s is not writable (%s); columns are not "
                "cached. Point cacheaffinity.worker.directory to a writable local directory.",
                self.directory,
                error,
            )
        else:
            self._warn_once(
                "write",
                "cacheaffinity: storing %r in %s failed (%s); not cached",
                key,
                self.directory,
                error,
            )
        self._discard(key)

    # ----------------------------------------------------- writes behind
    def _init_writer(self) -> None:
        """Empty write queue; the writer thread starts with the first queued value."""
        self._wq_cond = threading.Condition(threading.Lock())
        self._wq: deque = deque()
        #: Values queued or being written, by key (``get`` serves them).
        self._pending: dict[str, Any] = {}
        self._wq_bytes = 0
        self._writing = 0
        self._stopping = False
        #: Threads waiting in :meth:`flush` (the writer then does not gather).
        self._flushing = 0
        self._writer: threading.Thread | None = None
        #: The writer thread's own SQLite connection and its lock.
        self._wcon: sqlite3.Connection | None = None
        self._wlock = threading.RLock()

    def _enqueue(self, key: str, arr: np.ndarray, size: int) -> None:
        """Queue one value for the writer thread; drop it if the queue is full."""
        with self._wq_cond:
            if self._stopping:
                dropped = None
            elif self._wq_bytes + arr.nbytes > self.write_queue and self._wq_bytes > 0:
                # a value larger than the whole queue is still taken when it is empty
                dropped = True
                self._pending[key] = _DROPPED
                self._wq.append((key, None, 0))  # removes an older value of key
            else:
                dropped = False
                self._pending[key] = arr
                self._wq.append((key, arr, size))
                self._wq_bytes += arr.nbytes
            if dropped is not None:
                idle = len(self._wq) == 1  # the writer waits only on an empty queue
                if self._writer is None or not self._writer.is_alive():
                    self._writer = threading.Thread(
                        target=self._write_loop,
                        name=f"cacheaffinity-writer-{os.path.basename(self.directory)}",
                        daemon=True,
                    )
                    self._writer.start()
                elif idle:
                    self._wq_cond.notify_all()
        if dropped is None:
            self._count(skipped=1)
        elif dropped:
            self._count(skipped=1, dropped=1)
            self._warn_once(
                "queue",
                "cacheaffinity: write queue of cache %s is full (%s waiting); %r and "
                "later values that do not fit are not cached (counted as 'dropped'). "
                "Raise cacheaffinity.worker.write-queue if this happens often.",
                self.directory,
                format_bytes(self._wq_bytes),
                key,
            )

    def _write_loop(self) -> None:
        while True:
            with self._wq_cond:
                while not self._wq and not self._stopping:
                    self._wq_cond.wait()
                if not self._wq:
                    self._close_writer_connection()
                    return
                gather = time.monotonic() + WRITE_COALESCE
                while len(self._wq) < WRITE_BATCH and not (self._stopping or self._flushing):
                    left = gather - time.monotonic()
                    if left <= 0:
                        break
                    self._wq_cond.wait(left)
                batch = [self._wq.popleft() for _ in range(min(WRITE_BATCH, len(self._wq)))]
                self._writing += 1
            try:
                self._write_batch(batch)
            except BaseException as e:  # never lose the thread to a bug
                logger.warning("cacheaffinity: background cache write failed: %r", e)
                self._close_writer_connection()
            finally:
                with self._wq_cond:
                    self._writing -= 1
                    for key, arr, _ in batch:
                        if self._pending.get(key, _MISSING) is (_DROPPED if arr is None else arr):
                            del self._pending[key]
                        if arr is not None:
                            self._wq_bytes -= arr.nbytes
                    self._wq_cond.notify_all()

    def _close_writer_connection(self) -> None:
        with self._wlock:
            if self._wcon is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._wcon.close()
            self._wcon = None

    def _write_batch(self, batch: list) -> None:
        """Store queued values: one index transaction for the batch if possible."""
        latest: dict[str, tuple] = {}
        for key, arr, size in batch:  # the last value of a key wins
            latest.pop(key, None)
            latest[key] = (arr, size)
        values = [(k, a, n) for k, (a, n) in latest.items() if a is not None]
        for key in [k for k, (a, _) in latest.items() if a is None]:
            self._discard(key)
        if not values or self._closed or self._disabled:
            return
        if time.monotonic() >= self._pause_until:
            try:
                self._store_many(values)
                return
            except (_Lost, _Closed, OSError, sqlite3.Error) as e:
                logger.debug("cacheaffinity: batched write failed (%r); one by one", e)
                if isinstance(e, sqlite3.Error):
                    self._close_writer_connection()
        for key, arr, size in values:
            if time.monotonic() < self._pause_until:
                self._count(skipped=1)
                continue
            self._set_now(key, arr, size)

    def _store_many(self, values: list[tuple[str, np.ndarray, int]]) -> None:
        """:meth:`_store` for several values with one index transaction."""
        files: list[tuple[str, str, np.ndarray, int, bytes]] = []
        try:
            for key, arr, size in values:
                name, digest = self._write_file(arr)
                files.append((key, name, arr, size, digest))
            doomed: list[str] = []
            evicted = freed = 0
            now = time.time()
            with self._transaction() as con:
                for key, name, arr, size, digest in files:
                    old = con.execute(
                        "SELECT id, file FROM entries WHERE key = ?", (key,)
                    ).fetchone()
                    if old is not None:
                        con.execute("DELETE FROM entries WHERE id = ?", (old[0],))
                        doomed.append(old[1])
                    used = con.execute("SELECT value FROM meta WHERE name = 'size'").fetchone()[0]
                    gone, n = self._evict_rows(con, used + size - self.capacity)
                    doomed.extend(gone)
                    evicted += len(gone)
                    freed += n
                    self._insert_entry(con, key, name, arr, size, digest, now)
        except BaseException:
            for f in files:
                _unlink(self._path(f[1]))
            raise
        for old_name in doomed:  # only after the commit
            if _NAME.match(str(old_name)):
                _unlink(self._path(old_name))
        self._count(
            writes=len(files),
            bytes_written=sum(f[2].nbytes for f in files),
            evictions=evicted,
            bytes_evicted=freed,
        )
        if time.monotonic() >= self._next_orphan_pass:
            try:
                self.collect_orphans()
            except (OSError, sqlite3.Error, _Closed) as e:
                logger.debug("cacheaffinity: orphan collection failed: %s", e)

    def _settle(self) -> None:
        """Let queued writes land before a call that looks at or changes the index."""
        if self._wq or self._writing:
            self.flush()

    def pending(self) -> int:
        """Number of values waiting for the background writer (0 when writing inline)."""
        with self._wq_cond:
            return len(self._pending)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the background writer has stored every queued value.

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait at most (``None``: until done).

        Returns
        -------
        bool
            True if nothing is left to write.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._wq_cond:
            self._flushing += 1
            self._wq_cond.notify_all()  # a writer gathering a batch writes it now
            try:
                while self._wq or self._writing:
                    if self._writer is None or not self._writer.is_alive():
                        break  # no thread (e.g. after fork): nothing will drain it
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._wq_cond.wait(left)
                return not self._wq and not self._writing
            finally:
                self._flushing -= 1

    def _write_temporary(self, data: memoryview) -> str:
        name = uuid.uuid4().hex
        tmp = os.path.join(self._tmp, name + ".tmp")
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
            0o600,
        )
        try:
            if self.shared_gid is not None:
                # readable by the group whatever the umask; written once, by its
                # writer only: another member can delete it, never change it
                os.fchmod(fd, 0o640)
            with open(fd, "wb", buffering=0, closefd=True) as f:
                done = 0
                while done < len(data):
                    done += f.write(data[done:])
        except BaseException:
            _unlink(tmp)
            raise
        return name

    def _publish(self, name: str) -> None:
        """Rename a complete temporary to its data file name."""
        tmp = os.path.join(self._tmp, name + ".tmp")
        final = self._path(name)
        try:
            os.rename(tmp, final)
        except FileNotFoundError:
            if not os.path.exists(tmp):
                if os.path.isdir(self._tmp):
                    raise _Lost(f"temporary {tmp} was removed as stale") from None
                raise
            self._mkdir(os.path.dirname(final))
            os.rename(tmp, final)

    def _insert_entry(self, con, key: str, name: str, arr: np.ndarray, size: int,
                      digest: bytes, stored: float) -> None:
        """The index row of a data file written by :meth:`_write_file`."""
        con.execute(
            "INSERT INTO entries (key, file, dtype, shape, nbytes, size, checksum, stored,"
            " writer) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (key, name, arr.dtype.str, json.dumps(list(arr.shape)), arr.nbytes, size, digest,
             stored, self._uid),
        )  # fmt: skip

    def _write_file(self, arr: np.ndarray) -> tuple[str, bytes]:
        """Write ``arr``'s bytes to a new data file (temporary, then renamed into
        place); return its name and xxh3 digest.  The index is not touched."""
        data = memoryview(_as_bytes(arr))
        digest = xxhash.xxh3_64_digest(data)
        name = self._write_temporary(data)
        try:
            self._publish(name)
        except BaseException:
            _unlink(os.path.join(self._tmp, name + ".tmp"))
            raise
        return name, digest

    def _store(self, key: str, arr: np.ndarray, size: int) -> None:
        name, digest = self._write_file(arr)
        doomed: list[str] = []
        try:
            with self._transaction() as con:
                old = con.execute("SELECT id, file FROM entries WHERE key = ?", (key,)).fetchone()
                if old is not None:
                    con.execute("DELETE FROM entries WHERE id = ?", (old[0],))
                    doomed.append(old[1])
                used = con.execute("SELECT value FROM meta WHERE name = 'size'").fetchone()[0]
                files, freed = self._evict_rows(con, used + size - self.capacity)
                self._insert_entry(con, key, name, arr, size, digest, time.time())
        except BaseException:
            _unlink(self._path(name))
            raise
        # Only after the commit: nobody can find these files any more.
        for old_name in doomed + files:
            if _NAME.match(str(old_name)):
                _unlink(self._path(old_name))
        self._count(
            writes=1, bytes_written=arr.nbytes, evictions=len(files), bytes_evicted=freed
        )
        if time.monotonic() >= self._next_orphan_pass:
            try:
                self.collect_orphans()
            except (OSError, sqlite3.Error, _Closed) as e:
                logger.debug("cacheaffinity: orphan collection failed: %s", e)

    def _evict_rows(self, con: sqlite3.Connection, need: int) -> tuple[list[str], int]:
        """Delete the oldest rows until ``need`` bytes are freed (inside a transaction)."""
        if need <= 0:
            return [], 0
        victims, files, freed = [], [], 0
        cursor = con.execute(
            "SELECT id, file, size FROM entries ORDER BY id LIMIT ?",
            (MAX_EVICTIONS_PER_INSERT,),
        )
        try:
            while freed < need:
                batch = cursor.fetchmany(64)
                if not batch:
                    break
                for row_id, name, size in batch:
                    if freed >= need:
                        break
                    victims.append((row_id,))
                    files.append(name)
                    freed += size
        finally:
            cursor.close()
        con.executemany("DELETE FROM entries WHERE id = ?", victims)
        return files, freed

    def _make_room(self, need: int) -> None:
        """Evict at least ``need`` bytes after the disk filled up (best effort)."""
        try:
            with self._transaction() as con:
                files, freed = self._evict_rows(con, need)
        except (sqlite3.Error, OSError, _Closed) as e:
            # The index cannot grow either.  Delete the oldest files without
            # touching the index: their entries read as misses and are removed
            # by the next read or eviction that meets them.
            logger.debug("cacheaffinity: eviction on a full disk failed (%s)", e)
            try:
                rows = self._query(
                    "SELECT file, size FROM entries ORDER BY id LIMIT ?",
                    (MAX_EVICTIONS_PER_INSERT,),
                )
            except (sqlite3.Error, OSError, _Closed):
                return
            files, freed = [], 0
            for name, size in rows:
                if freed >= need:
                    break
                if _NAME.match(str(name)) and _unlink(self._path(name)):
                    freed += size
            self._count(bytes_evicted=freed)
            return
        for name in files:
            if _NAME.match(str(name)):
                _unlink(self._path(name))
        self._count(evictions=len(files), bytes_evicted=freed)

    def _discard(self, key: str) -> None:
        """Remove an older value of ``key`` after a failed store (best effort)."""
        if self._closed or self._disabled:
            return
        try:
            with self._transaction() as con:
                row = con.execute("SELECT file FROM entries WHERE key = ?", (key,)).fetchone()
                if row is not None:
                    con.execute("DELETE FROM entries WHERE key = ?", (key,))
        except (sqlite3.Error, OSError, _Closed) as e:
            logger.debug("cacheaffinity: could not remove old value of %r: %s", key, e)
            return
        if row is not None and _NAME.match(str(row[0])):
            _unlink(self._path(row[0]))

    def __delitem__(self, key: str) -> None:
        self._check_usable()
        if self._disabled:
            raise KeyError(key)
        self._settle()
        with self._transaction() as con:
            row = con.execute("SELECT file FROM entries WHERE key = ?", (key,)).fetchone()
            if row is None:
                raise KeyError(key)
            con.execute("DELETE FROM entries WHERE key = ?", (key,))
        if _NAME.match(str(row[0])):
            _unlink(self._path(row[0]))

    def clear(self) -> None:
        """Remove every entry of the directory (all processes' entries)."""
        self._settle()
        self._check_usable()
        if self._disabled:
            return
        with self._transaction() as con:
            names = [n for (n,) in con.execute("SELECT file FROM entries")]
            con.execute("DELETE FROM entries")
        for name in names:
            if _NAME.match(str(name)):
                _unlink(self._path(name))

    # ------------------------------------------------------------ maintenance
    def verify(self, on_entry: Callable[[], Any] | None = None) -> dict[str, int]:
        """Check every entry's data against its checksum and tidy the directory.

        Corrupt entries are removed and logged; data files that no entry
        references and temporaries, both older than ``stale_after``, are deleted.

        Parameters
        ----------
        on_entry : callable, optional
            Called with no arguments after each entry is checked (a progress bar).

        Returns
        -------
        dict
            ``checked`` entries, of which ``ok``, ``corrupt`` (removed) and
            ``missing`` (evicted meanwhile, or the file was lost); ``orphans``
            (unreferenced data files deleted); ``temporaries`` (deleted).
        """
        self._settle()
        self._check_usable()
        out = dict(checked=0, ok=0, corrupt=0, missing=0, orphans=0, temporaries=0)
        if self._disabled:
            return out
        rows = self._query(
            "SELECT key, file, dtype, shape, nbytes, checksum, writer FROM entries ORDER BY id"
        )
        for key, *row in rows:
            out["checked"] += 1
            try:
                value = self._read(key, tuple(row))
            except _Corrupt as e:
                logger.warning(
                    "cacheaffinity: corrupt cache entry %r in %s (%s); removed",
                    key,
                    self.directory,
                    e,
                )
                self._remove_entry(key, row[0])
                out["corrupt"] += 1
            else:
                if value is not None:
                    out["ok"] += 1
                else:
                    # Evicted meanwhile, or the file is really gone: drop that entry.
                    out["missing"] += 1
                    self._remove_entry(key, row[0])
            finally:
                if on_entry is not None:
                    on_entry()
            value = None
        known = {n for (n,) in self._query("SELECT file FROM entries")}
        cutoff = time.time() - self.stale_after
        with os.scandir(self._data) as subdirs:
            for sub in subdirs:
                if not sub.is_dir(follow_symlinks=False):
                    continue
                with os.scandir(sub.path) as files:
                    for f in files:
                        if f.name in known or not _NAME.match(f.name):
                            continue
                        try:
                            if f.stat(follow_symlinks=False).st_mtime > cutoff:
                                continue  # may be a write that is about to commit
                        except FileNotFoundError:
                            continue
                        if not self._query("SELECT 1 FROM entries WHERE file = ?", (f.name,)):
                            out["orphans"] += _unlink(f.path)
        out["temporaries"] = self._remove_stale_temporaries()
        return out

    def info(self) -> dict[str, Any]:
        """Size and age of the directory's contents.

        Returns
        -------
        dict
            ``directory``, ``capacity`` (this instance's), ``size`` (bytes, as in
            :meth:`volume`), ``entries``, ``oldest`` and ``newest`` store times
            (seconds since the epoch, None when empty).
        """
        self._settle()
        self._check_usable()
        out: dict[str, Any] = {
            "directory": self.directory,
            "capacity": self.capacity,
            "size": 0,
            "entries": 0,
            "oldest": None,
            "newest": None,
        }
        if self._disabled:
            return out
        with self._lock:
            con = self._connection()
            con.execute("BEGIN")  # one consistent snapshot
            try:
                meta = dict(con.execute("SELECT name, value FROM meta").fetchall())
                oldest = con.execute("SELECT stored FROM entries ORDER BY id LIMIT 1").fetchone()
                newest = con.execute(
                    "SELECT stored FROM entries ORDER BY id DESC LIMIT 1"
                ).fetchone()
            finally:
                con.execute("COMMIT")
        out.update(
            size=int(meta["size"]),
            entries=int(meta["count"]),
            oldest=oldest[0] if oldest else None,
            newest=newest[0] if newest else None,
        )
        return out

    # -------------------------------------------------------------- lifecycle
    def close(self, timeout: float | None = 60.0) -> None:
        """Write what is queued, then close the index connection (idempotent).

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait at most for queued writes (what is left is not cached).
        """
        if self._pid == os.getpid():
            self.flush(timeout)
        with self._wq_cond:
            self._stopping = True
            left = len(self._wq)
            self._wq.clear()
            self._pending.clear()
            self._wq_cond.notify_all()
        if left:
            logger.warning(
                "cacheaffinity: %d queued values of cache %s not written at close",
                left,
                self.directory,
            )
        with self._lock:
            self._closed = True
            if self._con is not None and self._pid == os.getpid():
                with contextlib.suppress(sqlite3.Error):
                    self._con.close()
            self._con = None

    def __enter__(self) -> ColumnCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = " closed" if self._closed else (" disabled" if self._disabled else "")
        return (
            f"<ColumnCache {self.directory!r} capacity={format_bytes(self.capacity)}{state}>"
        )


class MemoryFront(MutableMapping):
    """coffea's ``buffer_cache`` for one chunk: memory in front of a :class:`ColumnCache`.

    coffea asks for the same column buffer several times while it processes a
    chunk and calls only ``get(key, default)`` and ``__setitem__``.  This keeps
    the buffers of the current chunk in a dict bounded in bytes (least recently
    used go first) and goes to the disk store only for what it does not hold.
    Config section: ``cacheaffinity.worker`` (``memory``).

    Parameters
    ----------
    store : MutableMapping or None
        The node's disk store, normally a :class:`ColumnCache`; ``None`` keeps
        buffers in memory only (a worker whose cache directory is unusable).
    capacity : int or str, optional
        Bytes kept in memory; ``None`` reads ``cacheaffinity.worker.memory``.

    Notes
    -----
    Thread-safe: the dict is guarded by a lock; store reads and writes happen
    outside it.  ``get`` keeps what it found on disk in memory; ``__setitem__``
    keeps the value and writes it through to the store (whose failures are
    misses, see :class:`ColumnCache`).  Arrays are kept by reference, like a
    dict.  ``clear()`` (a ``MutableMapping`` method) empties the store too; use
    :meth:`drop_memory` to let go of the memory only.
    """

    def __init__(self, store: MutableMapping | None, capacity: int | str | None = None):
        #: The disk store behind this front (or None).
        self.store: MutableMapping | None = store
        #: Bytes kept in memory at most.
        self.capacity: int = config.get_bytes("worker.memory", capacity)
        self._memory: OrderedDict[str, np.ndarray] = OrderedDict()
        #: Bytes held in memory now.
        self.memory_bytes: int = 0
        self._lock = threading.Lock()
        self._counts = dict(hits=0, memory_hits=0, misses=0, bytes_served=0)
        _LIVE[id(self)] = self

    def _reset_locks(self) -> None:
        """A fresh lock in a forked child."""
        self._lock = threading.Lock()

    def _keep(self, key: str, value: Any) -> None:
        nbytes = int(getattr(value, "nbytes", 0))
        with self._lock:
            old = self._memory.pop(key, None)
            if old is not None:
                self.memory_bytes -= int(getattr(old, "nbytes", 0))
            if nbytes > self.capacity:
                return
            self._memory[key] = value
            self.memory_bytes += nbytes
            while self.memory_bytes > self.capacity:
                _, gone = self._memory.popitem(last=False)
                self.memory_bytes -= int(getattr(gone, "nbytes", 0))

    def get(self, key: str, default: Any = None) -> Any:
        """The buffer under ``key`` from memory, else from the store, else ``default``."""
        with self._lock:
            value = self._memory.get(key, _MISSING)
            if value is not _MISSING:
                self._memory.move_to_end(key)
                self._counts["hits"] += 1
                self._counts["memory_hits"] += 1
                self._counts["bytes_served"] += int(getattr(value, "nbytes", 0))
                return value
        value = _MISSING if self.store is None else self.store.get(key, _MISSING)
        if value is _MISSING:
            with self._lock:
                self._counts["misses"] += 1
            return default
        self._keep(key, value)
        with self._lock:
            self._counts["hits"] += 1
            self._counts["bytes_served"] += int(getattr(value, "nbytes", 0))
        return value

    def __getitem__(self, key: str) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def get_many(self, keys: list[str]) -> dict[str, Any]:
        """``{key: buffer}`` of those ``keys`` held in memory or in the store.

        One store query (``store.get_many``, if it has one) for all the keys
        that are not in memory.
        """
        out: dict[str, Any] = {}
        todo = []
        with self._lock:
            for key in keys:
                value = self._memory.get(key, _MISSING)
                if value is _MISSING:
                    todo.append(key)
                    continue
                self._memory.move_to_end(key)
                out[key] = value
                self._counts["hits"] += 1
                self._counts["memory_hits"] += 1
                self._counts["bytes_served"] += int(getattr(value, "nbytes", 0))
        if not todo:
            return out
        if self.store is None:
            found: dict = {}
        elif hasattr(self.store, "get_many"):
            found = self.store.get_many(todo)
        else:
            found = {}
            for key in todo:
                value = self.store.get(key, _MISSING)
                if value is not _MISSING:
                    found[key] = value
        for key, value in found.items():
            self._keep(key, value)
        with self._lock:
            self._counts["misses"] += len(todo) - len(found)
            self._counts["hits"] += len(found)
            self._counts["bytes_served"] += sum(
                int(getattr(v, "nbytes", 0)) for v in found.values()
            )
        out.update(found)
        return out

    def __setitem__(self, key: str, value: Any) -> None:
        if self.store is not None:
            self.store[key] = value  # validates (TypeError) before memory changes
        elif not isinstance(key, str):
            raise TypeError(f"MemoryFront keys are str, got {type(key).__name__}: {key!r}")
        self._keep(key, value)

    def __delitem__(self, key: str) -> None:
        with self._lock:
            old = self._memory.pop(key, _MISSING)
            if old is not _MISSING:
                self.memory_bytes -= int(getattr(old, "nbytes", 0))
        try:
            if self.store is None:
                raise KeyError(key)
            del self.store[key]
        except KeyError:
            if old is _MISSING:
                raise

    def __contains__(self, key: object) -> bool:
        with self._lock:
            if key in self._memory:
                return True
        return self.store is not None and key in self.store

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            memory = list(self._memory)
        seen = set(memory)
        yield from memory
        if self.store is not None:
            for key in self.store:
                if key not in seen:
                    yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def drop_memory(self) -> None:
        """Forget the in-memory buffers (the store keeps its copies)."""
        with self._lock:
            self._memory.clear()
            self.memory_bytes = 0

    def stats(self) -> dict[str, int]:
        """Counters of this front: ``hits`` (memory or disk), ``memory_hits``,
        ``misses``, ``bytes_served``, and ``memory_bytes``/``memory_entries`` now."""
        with self._lock:
            return dict(
                self._counts,
                memory_bytes=self.memory_bytes,
                memory_entries=len(self._memory),
            )

    def __repr__(self) -> str:
        return (
            f"<MemoryFront {len(self._memory)} buffers, {format_bytes(self.memory_bytes)}"
            f" of {format_bytes(self.capacity)} over {self.store!r}>"
        )
