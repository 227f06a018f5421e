"""How much a node cache may hold and what goes when it is full (workers and the CLI).

The capacity every process agrees on is recorded in the ``settings`` table
(:func:`impose`, :func:`agree`, :meth:`Capacity.follow`); the one in force is at most
what the file system can hold (:func:`fit_to_disk`; per process, never recorded).
Eviction is FIFO inside the inserting transaction (:func:`evict_rows`), down to a new
capacity (:func:`shrink`), or data files first on a full disk (:func:`make_room`)."""

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
    "MAX_EVICTIONS_PER_TRANSACTION",
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

#: At most this many entries are evicted by one transaction of :func:`shrink` and by
#: :func:`make_room` (an insert evicts what it needs: :func:`evict_rows`).
MAX_EVICTIONS_PER_TRANSACTION = 1024
#: Part of the file system kept free by the capacity in force (at most :data:`RESERVE_MAX`).
RESERVE_FRACTION = 0.05
RESERVE_MAX = 2**30
#: How an operator gives a worker's capacity (named in the log lines).
GIVEN = "--cache-capacity / cacheaffinity.worker.capacity"


def agree(index: Index, directory: str, mine: int, *, heals: bool) -> int | None:
    """The directory's recorded capacity if this process must use it instead of ``mine``
    (logged if they differ), else None (``mine`` recorded, or nothing recorded)."""
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
    """Record ``mine`` as the directory's capacity (the last of concurrent writers wins) and
    evict the oldest entries down to it; returns ``(entries evicted, bytes freed)``."""
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
    """Evict the oldest entries down to ``capacity`` bytes, in transactions of at most
    :data:`MAX_EVICTIONS_PER_TRANSACTION` rows.  Returns ``(entries evicted, bytes freed)``."""
    evicted = freed = 0
    while True:
        with index.transaction() as con:
            used = con.execute("SELECT value FROM meta WHERE name = 'size'").fetchone()[0]
            doomed, n = evict_rows(con, int(used) - int(capacity), MAX_EVICTIONS_PER_TRANSACTION)
        if not doomed:
            return evicted, freed
        files.remove(doomed)  # only after the commit: nobody can find them any more
        evicted += len(doomed)
        freed += n


def effective_capacity(directory: str, configured: int, held: int = 0) -> tuple[int, int]:
    """``(capacity in force, free bytes)``: ``min(configured, held + free - reserve)``, at
    least 0; ``reserve`` is :data:`RESERVE_FRACTION` of the file system, at most :data:`RESERVE_MAX`.
    """
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    reserve = min(RESERVE_MAX, int(st.f_blocks * st.f_frsize * RESERVE_FRACTION))
    return max(0, min(int(configured), int(held) + free - reserve)), free


def fit_to_disk(directory: str, configured: int, held: int) -> tuple[int, int | None]:
    """:func:`effective_capacity` with one warning when it clamps ``configured``;
    ``(configured, None)`` if the free space cannot be read."""
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


def evict_rows(con: sqlite3.Connection, need: int, most: int | None = None) -> tuple[list[str], int]:
    """Delete the oldest rows until ``need`` bytes are freed (in the caller's transaction;
    at most ``most`` rows, None: as many as it takes, so that an insert never leaves the
    cache above its capacity); returns the data files to delete after the commit and the
    bytes freed.  Rows are read one at a time: the cost is the rows deleted."""
    if need <= 0:
        return [], 0
    victims, files, freed = [], [], 0
    sql = "SELECT id, file, size FROM entries ORDER BY id"
    cur = con.execute(sql if most is None else sql + " LIMIT ?", () if most is None else (most,))
    try:
        for row_id, name, size in cur:
            victims.append((row_id,))
            files.append(name)
            freed += size
            if freed >= need:
                break
    finally:
        cur.close()
    con.executemany("DELETE FROM entries WHERE id = ?", victims)
    return files, freed


def make_room(index: Index, files: DataFiles, need: int) -> tuple[int, int]:
    """Free at least ``need`` bytes after the disk filled up (best effort); returns
    ``(entries evicted, bytes freed)``.  Data files go **before** their rows: on a full
    disk SQLite cannot grow its WAL to delete rows, and the deleted files free that
    space (their rows read as misses until removed)."""
    try:
        rows = index.query(
            "SELECT id, file, size FROM entries ORDER BY id LIMIT ?", (MAX_EVICTIONS_PER_TRANSACTION,)
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
    index.checkpoint()  # the WAL's space too
    return len(ids), freed


class Capacity:
    """The capacity of one open cache, the setting and the bound in force, in step with the directory."""

    def __init__(self, index: Index, files: DataFiles, health: Health, directory: str,
                 configured: int, *, fit_disk: bool):  # fmt: skip
        self._index = index
        self._files = files
        self._health = health
        self.directory = directory
        #: The capacity setting: the argument (or config), or the directory's recorded one.
        self.configured = int(configured)
        #: Size bound in force, in bytes.
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
        """Adopt the capacity the directory records now (``con``: the caller's open
        transaction); returns the bound in force.  A change is logged once per process."""
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
