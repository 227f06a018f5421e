"""Looking after a node cache directory: :class:`Maintenance` (workers and the CLI).

Bounded orphan passes (data files no row references, left by killed writers),
``verify`` (every row against its digest), ``repair`` (the whole index) and ``info``
(one consistent snapshot): what the ``cacheaffinity cache`` commands run."""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from cacheaffinity.exceptions import Closed
from cacheaffinity.worker._store.files import DataFiles
from cacheaffinity.worker._store.health import Health
from cacheaffinity.worker._store.index import Index, corruption
from cacheaffinity.worker._store.reads import Reader

__all__ = ["ORPHAN_AFTER", "ORPHAN_BATCH", "ORPHAN_INTERVAL", "Maintenance"]

logger = logging.getLogger("cacheaffinity.worker")

#: Seconds between two orphan passes of a writer, at least.
ORPHAN_INTERVAL = 60.0
#: Data files an orphan pass looks at, at most.
ORPHAN_BATCH = 2048
#: A data file nobody references is deleted only when older than this (seconds).
ORPHAN_AFTER = 120.0


class Maintenance:
    """Orphans, verify, repair and info of one cache: ``verify`` deletes unreferenced files and
    temporaries older than ``stale_after``, an orphan pass files older than ``orphan_after``.
    """

    def __init__(self, index: Index, files: DataFiles, health: Health, reader: Reader,
                 *, stale_after: float, orphan_after: float):  # fmt: skip
        self._index = index
        self._files = files
        self._health = health
        self._reader = reader
        self.stale_after = stale_after
        self.orphan_after = orphan_after
        self._next_orphan_pass = 0.0

    def collect_orphans(self, max_files: int | None = None) -> int:
        """Delete data files no row references; returns the number deleted."""
        health = self._health
        health.check_open()
        if health.disabled:
            return 0
        self._next_orphan_pass = time.monotonic() + ORPHAN_INTERVAL
        files = self._files
        removed = 0
        for prefix, names in files.orphan_candidates(
            ORPHAN_BATCH if max_files is None else max_files, self.orphan_after
        ):
            upper = f"{int(prefix, 16) + 1:02x}" if prefix != "ff" else "g"
            known = self._index.reachable_files(prefix, upper)
            removed += files.remove([n for n in names if n not in known])
        if removed:
            logger.info("cacheaffinity: deleted %d orphaned data files (left by killed writers) from %s",
                        removed, files.data)  # fmt: skip
            health.count(orphans_removed=removed)
        return removed

    def collect_orphans_if_due(self) -> None:
        """One bounded orphan pass if :data:`ORPHAN_INTERVAL` has passed (failures logged)."""
        if time.monotonic() >= self._next_orphan_pass:
            try:
                self.collect_orphans()
            except (OSError, sqlite3.Error, Closed) as e:
                logger.debug("cacheaffinity: orphan collection failed: %s", e)

    def verify(self, on_entry: Callable[[], Any] | None = None) -> dict[str, int]:
        """Check every row's data file and tidy the directory (see ``ColumnCache.verify``)."""
        health = self._health
        out = dict(checked=0, ok=0, corrupt=0, missing=0, orphans=0, temporaries=0)
        if health.disabled:
            return out
        index, files = self._index, self._files
        rows = index.query("SELECT key, file, toc, nbytes, checksum, writer FROM entries ORDER BY id")
        for key, *row in rows:
            out["checked"] += 1
            before = health.counts()["corrupt"]
            try:
                members = self._reader.read(key, tuple(row))
                if members is not None:
                    out["ok"] += 1
                elif health.counts()["corrupt"] > before:
                    out["corrupt"] += 1  # removed and logged (once per cache) by the read
                else:
                    out["missing"] += 1
            finally:
                if on_entry is not None:
                    on_entry()
        known = {n for (n,) in index.query("SELECT file FROM entries")}
        cutoff = time.time() - self.stale_after
        for name in list(files.all_names()):
            if name in known:
                continue
            try:
                if os.lstat(files.path(name)).st_mtime > cutoff:
                    continue  # may be a write that is about to commit
            except FileNotFoundError:
                continue
            if not index.query("SELECT 1 FROM entries WHERE file = ?", (name,)):
                out["orphans"] += files.remove([name])
        out["temporaries"] = files.remove_stale_temporaries(self.stale_after)
        health.count(temporaries_removed=out["temporaries"])
        return out

    def info(self) -> dict[str, Any]:
        """``size``, ``entries``, ``packs``, ``oldest`` and ``newest`` in one snapshot
        (zeros and None for a disabled cache)."""
        out: dict[str, Any] = {"size": 0, "entries": 0, "packs": 0, "oldest": None, "newest": None}
        if self._health.disabled:
            return out
        index = self._index
        with index.lock:
            con = index.connection()
            con.execute("BEGIN")  # one consistent snapshot
            try:
                meta = dict(con.execute("SELECT name, value FROM meta").fetchall())
                packs = con.execute("SELECT count(*) FROM entries WHERE grp IS NOT NULL").fetchone()[0]
                oldest = con.execute("SELECT stored FROM entries ORDER BY id LIMIT 1").fetchone()
                newest = con.execute("SELECT stored FROM entries ORDER BY id DESC LIMIT 1").fetchone()
            finally:
                con.execute("COMMIT")
        out.update(
            size=int(meta["size"]), entries=int(meta["count"]), packs=int(packs),
            oldest=oldest[0] if oldest else None, newest=newest[0] if newest else None,
        )  # fmt: skip
        return out

    def repair(self) -> bool:
        """Check the whole index (``PRAGMA integrity_check``) and rebuild it if damaged;
        returns whether it was rebuilt."""
        health = self._health
        before = health.counts()["index_rebuilt"]
        index = self._index
        try:
            with index.lock:
                rows = index.connection().execute("PRAGMA integrity_check(1)").fetchall()
            if rows != [("ok",)]:
                raise sqlite3.DatabaseError(f"database disk image is malformed: {rows[:1]}")
        except sqlite3.DatabaseError as e:
            if not corruption(e):
                raise
            index.heal(e)
        return health.counts()["index_rebuilt"] > before
