"""How much a node cache may hold and what goes when it is full (runs in workers
and in the ``cacheaffinity`` CLI).

This module owns the store's capacity policy:

- **the capacity every process agrees on**: the directory's ``settings`` table
  records one.  A process given a capacity explicitly
  (``ColumnCache(set_capacity=True)``; workers: ``--cache-capacity`` or a
  ``cacheaffinity.worker.capacity`` other than the default) records it and
  evicts down to it at once (:func:`impose`, one log line); any other process
  uses the recorded one (:func:`agree`).  Open caches follow a capacity another
  process recorded: writers in every insert transaction, workers with every
  heartbeat (:meth:`Capacity.follow`);
- **the capacity in force**: at most what the directory's file system can hold,
  the free space at open (plus what the cache already holds) minus a reserve
  (:func:`effective_capacity`, :func:`fit_to_disk`); per process, never recorded;
- **eviction**: first in, first out, inside the transaction that inserts
  (:func:`evict_rows`), down to a new capacity (:func:`shrink`), and, when the
  disk filled up below the capacity, data files first and rows after
  (:func:`make_room`).

:class:`Capacity` owns one open cache's figures (the setting, the bound in
force, where it came from) and keeps them in step with the directory.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading

from dask.utils import format_bytes

from cacheaffinity.exceptions import Closed
from cacheaffinity.worker._store.files import DataFiles
from cacheaffinity.worker._store.health import Health
from cacheaffinity.worker._store.index import Index

__all__ = [
    "GIVEN",
    "Capacity",
    "MAX_EVICTIONS_PER_INSERT",
    "RESERVE_FRACTION",
    "RESERVE_MAX",
    "agree",
    "effective_capacity",
    "evict_rows",
    "fit_to_disk",
    "impose",
    "make_room",
    "shrink",
]

logger = logging.getLogger("cacheaffinity.worker")

#: At most this many entries are evicted by one insert.
MAX_EVICTIONS_PER_INSERT = 1024
#: Part of the file system kept free by the capacity in force (at most :data:`RESERVE_MAX`).
RESERVE_FRACTION = 0.05
#: Bytes kept free at most.
RESERVE_MAX = 2**30
#: How an operator gives a worker's capacity (named in the log lines).
GIVEN = "--cache-capacity / cacheaffinity.worker.capacity"


# ------------------------------------------------------------------- agreement
def agree(index: Index, directory: str, mine: int, *, heals: bool) -> int | None:
    """The directory's recorded capacity if this process must use it instead of
    ``mine`` (logged when they differ), else None (``mine`` was recorded in a
    directory that had none, or a read-only open found nothing recorded)."""
    if not heals:  # read-only (``cache info``): report, change nothing
        recorded = index.settings().get("capacity")
    else:
        recorded, written = index.adopt_or_set("capacity", mine)
        if written:
            return None
    if recorded is None:
        return None
    recorded = int(recorded)
    if recorded != mine:
        logger.info(
            "cacheaffinity: cache directory %s records capacity %s, used instead of this "
            "process's default %s so that all its processes agree (a worker started with "
            "%s given explicitly changes it)",
            directory, format_bytes(recorded), format_bytes(mine), GIVEN,
        )  # fmt: skip
    return recorded


def impose(index: Index, files: DataFiles, directory: str, mine: int) -> tuple[int, int]:
    """Record ``mine`` as the directory's capacity (whatever it recorded: of
    processes doing this at once, the last one wins), then evict the oldest
    entries until the cache holds at most ``mine`` (:func:`shrink`).  One INFO
    line when the capacity changed or entries went.  Returns ``(entries
    evicted, bytes freed)``."""
    old = index.replace_setting("capacity", mine)
    evicted, freed = shrink(index, files, mine)
    if (old is not None and old != mine) or evicted:
        before = "none" if old is None else format_bytes(old)
        gone = f"; evicted the {evicted} oldest entries ({format_bytes(freed)})" if evicted else ""
        logger.info(
            "cacheaffinity: cache directory %s: capacity %s -> %s (%s)%s",
            directory, before, format_bytes(mine), GIVEN, gone,
        )  # fmt: skip
    return evicted, freed


def shrink(index: Index, files: DataFiles, capacity: int) -> tuple[int, int]:
    """Evict the oldest entries until the index accounts at most ``capacity``
    bytes: transactions of at most :data:`MAX_EVICTIONS_PER_INSERT` rows, each
    one's data files deleted after its commit.  Returns ``(entries evicted,
    bytes freed)``."""
    evicted = freed = 0
    while True:
        with index.transaction() as con:
            used = con.execute("SELECT value FROM meta WHERE name = 'size'").fetchone()[0]
            doomed, n = evict_rows(con, int(used) - int(capacity))
        if not doomed:
            return evicted, freed
        files.remove(doomed)  # only after the commit: nobody can find them any more
        evicted += len(doomed)
        freed += n


# ---------------------------------------------------------------- disk space
def effective_capacity(directory: str, configured: int, held: int = 0) -> tuple[int, int]:
    """``(capacity in force, free bytes now)`` of a cache in ``directory``.

    The capacity in force is ``min(configured, held + free - reserve)`` (never
    below 0): ``held`` is what the cache already stores there, ``free`` the
    bytes an unprivileged user may still write on the file system, ``reserve``
    :data:`RESERVE_FRACTION` of its size, at most :data:`RESERVE_MAX`.
    """
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    reserve = min(RESERVE_MAX, int(st.f_blocks * st.f_frsize * RESERVE_FRACTION))
    return max(0, min(int(configured), int(held) + free - reserve)), free


def fit_to_disk(directory: str, configured: int, held: int) -> tuple[int, int | None]:
    """``(capacity in force, free bytes)``: :func:`effective_capacity`, with one
    warning when the file system holds less than ``configured``.  When the free
    space cannot be read, ``(configured, None)``."""
    try:
        capacity, free = effective_capacity(directory, configured, held)
    except (OSError, ValueError) as e:
        logger.debug("cacheaffinity: free space of %s unknown: %r", directory, e)
        return configured, None
    if capacity < configured:
        logger.warning(
            "cacheaffinity: cache capacity %s is more than the file system of %s can "
            "hold (%s free, %s already cached, a reserve kept free): using %s. Lower "
            "cacheaffinity.worker.capacity (--cache-capacity) or free space on that disk.",
            format_bytes(configured), directory, format_bytes(free), format_bytes(held),
            format_bytes(capacity),
        )  # fmt: skip
    return capacity, free


# ------------------------------------------------------------------ eviction
def evict_rows(con: sqlite3.Connection, need: int) -> tuple[list[str], int]:
    """Delete the oldest rows until ``need`` bytes are freed (inside the caller's
    transaction).  Returns the data files to delete after the commit and the
    bytes freed."""
    if need <= 0:
        return [], 0
    victims, files, freed = [], [], 0
    for row_id, name, size in con.execute(
        "SELECT id, file, size FROM entries ORDER BY id LIMIT ?", (MAX_EVICTIONS_PER_INSERT,)
    ).fetchall():
        if freed >= need:
            break
        victims.append((row_id,))
        files.append(name)
        freed += size
    con.executemany("DELETE FROM entries WHERE id = ?", victims)
    return files, freed


def make_room(index: Index, files: DataFiles, need: int) -> tuple[int, int]:
    """Free at least ``need`` bytes after the disk filled up (best effort);
    returns ``(entries evicted, bytes freed)``.

    The oldest data files are deleted **before** the index is touched: on a
    full disk SQLite cannot grow its WAL to delete rows, and deleting files
    first frees the space it needs.  Their rows then read as misses (and are
    removed by that read, or here when the transaction can commit)."""
    try:
        rows = index.query(
            "SELECT id, file, size FROM entries ORDER BY id LIMIT ?", (MAX_EVICTIONS_PER_INSERT,)
        )
    except (sqlite3.Error, OSError, Closed):
        return 0, 0
    ids, freed = [], 0
    for row_id, name, size in rows:
        if freed >= need:
            break
        files.remove([name])
        ids.append((row_id,))
        freed += size
    try:
        with index.transaction() as con:
            con.executemany("DELETE FROM entries WHERE id = ?", ids)
    except (sqlite3.Error, OSError, Closed) as e:
        logger.debug("cacheaffinity: eviction rows not removed on a full disk (%s)", e)
    return len(ids), freed


# ------------------------------------------------------------ one open cache
class Capacity:
    """The capacity of one open cache: the setting and the bound in force.

    Parameters
    ----------
    index, files
        The cache's index and data files.
    health
        The cache's counters and state (nothing is followed once unusable).
    directory : str
        The cache directory.
    configured : int
        This process's capacity setting (the argument or the config).
    fit_disk : bool
        Keep the bound in force within what the file system holds (:func:`fit_to_disk`).
    """

    def __init__(self, index: Index, files: DataFiles, health: Health, directory: str,
                 configured: int, *, fit_disk: bool):  # fmt: skip
        self._index = index
        self._files = files
        self._health = health
        self.directory = directory
        #: The capacity setting: the argument (or config), or the directory's recorded one.
        self.configured = int(configured)
        #: Size bound in force, in bytes: :attr:`configured`, with ``fit_disk`` at
        #: most what the file system holds.
        self.in_force = self.configured
        #: ``"directory"`` if the capacity was read from the index, else ``"argument"``.
        self.source = "argument"
        #: Free bytes on the file system at open (``fit_disk`` only; None: unknown).
        self.free_at_open: int | None = None
        self.fit_disk = bool(fit_disk)
        self._lock = threading.Lock()

    def reset_after_fork(self) -> None:
        """A fresh lock in a forked child."""
        self._lock = threading.Lock()

    def settle(self, set_capacity: bool, heals: bool) -> None:
        """At open: record this process's setting and evict down to it (:func:`impose`),
        or adopt the directory's (:func:`agree`)."""
        if set_capacity:
            evicted, freed = impose(self._index, self._files, self.directory, self.configured)
            self._health.count(evictions=evicted, bytes_evicted=freed)
            return
        recorded = agree(self._index, self.directory, self.configured, heals=heals)
        if recorded is not None:
            self.source = "directory"
            self.configured = self.in_force = recorded

    def _held(self) -> int:
        return int(self._index.query("SELECT value FROM meta WHERE name = 'size'")[0][0])

    def fit(self) -> None:
        """At open (``fit_disk``): the bound in force at most what the file system holds."""
        try:
            held = 0 if self._health.disabled else self._held()
        except (OSError, sqlite3.Error, ValueError) as e:
            logger.debug("cacheaffinity: volume of %s unknown: %r", self.directory, e)
            return
        self.in_force, self.free_at_open = fit_to_disk(self.directory, self.configured, held)

    def follow(self, con: sqlite3.Connection | None = None) -> int:
        """Follow the capacity the directory records now; returns the bound in force.

        ``con``: the connection of the caller's open transaction (the write path),
        else a query of its own.  A change is logged once per process.
        """
        if not self._health.usable:
            return self.in_force
        sql = "SELECT value FROM settings WHERE name = 'capacity'"
        if con is None:
            rows = self._index.query(sql)
            recorded = int(rows[0][0]) if rows else None
        else:
            row = con.execute(sql).fetchone()
            recorded = None if row is None else int(row[0])
        with self._lock:
            if recorded is None or recorded == self.configured:
                return self.in_force
            old, self.configured = self.configured, recorded
        capacity = recorded
        if self.fit_disk:  # no lock held: the size query may wait for the index
            if con is None:
                held = self._held()
            else:
                held = int(con.execute("SELECT value FROM meta WHERE name = 'size'").fetchone()[0])
            capacity = fit_to_disk(self.directory, recorded, held)[0]
        with self._lock:
            if self.configured != recorded:  # a newer change overtook this one
                return self.in_force
            self.in_force = capacity
            self.source = "directory"
        logger.info(
            "cacheaffinity: cache directory %s: capacity %s -> %s, recorded by another process "
            "(the last one started with %s given explicitly)",
            self.directory, format_bytes(old), format_bytes(recorded), GIVEN,
        )  # fmt: skip
        return capacity
