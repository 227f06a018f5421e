"""Looking after a node cache directory (runs in workers and in the ``cacheaffinity`` CLI).

This module owns the work that is not a read or a write of a value:

- :func:`collect_orphans`: data files no row references (left by killed
  writers) are deleted, bounded work per pass (:data:`ORPHAN_BATCH` files,
  only those older than the cache's ``orphan_after``); writers run a pass at
  most every :data:`ORPHAN_INTERVAL` seconds (:func:`collect_orphans_if_due`);
- :func:`verify`: every row's data file checked against its digest, corrupt
  rows removed, orphans and stale temporaries deleted (``cacheaffinity cache
  verify``);
- :func:`repair`: the whole index checked and rebuilt if damaged, or set aside
  when this version cannot use it (``verify --repair``);
- :func:`info`: one consistent snapshot of the index (``cacheaffinity cache info``).

The functions take the :class:`~.cache.ColumnCache` to work on; its methods of
the same names are the API.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cacheaffinity.exceptions import Closed
from cacheaffinity.worker.store.index import corruption

if TYPE_CHECKING:
    from cacheaffinity.worker.store.cache import ColumnCache

__all__ = ["ORPHAN_AFTER", "ORPHAN_BATCH", "ORPHAN_INTERVAL", "collect_orphans", "info", "repair", "verify"]

logger = logging.getLogger("cacheaffinity.worker")

#: Writers look for orphaned data files at most this often (seconds) ...
ORPHAN_INTERVAL = 60.0
#: ... and look at no more than this many data files per pass.
ORPHAN_BATCH = 2048
#: A data file nobody references is deleted only when older than this (seconds).
ORPHAN_AFTER = 120.0


def collect_orphans(cache: ColumnCache, max_files: int | None = None) -> int:
    """Delete data files no row references; returns the number deleted."""
    cache._check_usable()
    if cache._disabled:
        return 0
    cache._next_orphan_pass = time.monotonic() + ORPHAN_INTERVAL
    files = cache.files
    removed = 0
    for prefix, names in files.orphan_candidates(
        ORPHAN_BATCH if max_files is None else max_files, cache.orphan_after
    ):
        upper = f"{int(prefix, 16) + 1:02x}" if prefix != "ff" else "g"
        known = cache.index.reachable_files(prefix, upper)
        removed += files.remove([n for n in names if n not in known])
    if removed:
        logger.info("cacheaffinity: deleted %d orphaned data files (left by killed writers) from %s",
                    removed, files.data)  # fmt: skip
        cache._count(orphans_removed=removed)
    return removed


def collect_orphans_if_due(cache: ColumnCache) -> None:
    """One bounded orphan pass if :data:`ORPHAN_INTERVAL` has passed (failures logged)."""
    if time.monotonic() >= cache._next_orphan_pass:
        try:
            collect_orphans(cache)
        except (OSError, sqlite3.Error, Closed) as e:
            logger.debug("cacheaffinity: orphan collection failed: %s", e)


def verify(cache: ColumnCache, on_entry: Callable[[], Any] | None = None) -> dict[str, int]:
    """Check every row's data file and tidy the directory (see :meth:`.ColumnCache.verify`)."""
    cache._settle()
    cache._check_usable()
    out = dict(checked=0, ok=0, corrupt=0, missing=0, orphans=0, temporaries=0)
    if cache._disabled:
        return out
    index, files = cache.index, cache.files
    rows = index.query("SELECT key, file, toc, nbytes, checksum, writer FROM entries ORDER BY id")
    for key, *row in rows:
        out["checked"] += 1
        before = cache.stats()["corrupt"]
        try:
            members = cache._read(key, tuple(row))
            if members is not None:
                out["ok"] += 1
            elif cache.stats()["corrupt"] > before:
                out["corrupt"] += 1  # removed and logged (once per cache) by _read
            else:
                out["missing"] += 1
        finally:
            if on_entry is not None:
                on_entry()
    known = {n for (n,) in index.query("SELECT file FROM entries")}
    cutoff = time.time() - cache.stale_after
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
    out["temporaries"] = files.remove_stale_temporaries(cache.stale_after)
    cache._count(temporaries_removed=out["temporaries"])
    return out


def info(cache: ColumnCache) -> dict[str, Any]:
    """The directory's figures in one snapshot (see :meth:`.ColumnCache.info`)."""
    cache._settle()
    cache._check_usable()
    out: dict[str, Any] = {
        "directory": cache.directory, "capacity": cache.capacity, "size": 0, "entries": 0,
        "packs": 0, "oldest": None, "newest": None,
    }  # fmt: skip
    if cache._disabled:
        return out
    index = cache.index
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


def repair(cache: ColumnCache) -> bool:
    """Check the whole index and rebuild it if damaged (see :meth:`.ColumnCache.repair`)."""
    cache._check_usable()
    if cache.unreadable_index:  # newer layout, or damage a rebuild did not cure
        cache._set_index_aside()
        cache._count(index_rebuilt=1)
        return True
    if cache._disabled:
        raise ValueError(f"{cache!r} cannot be used: {cache._disabled}")
    before = cache.stats()["index_rebuilt"]
    index = cache.index
    try:
        with index.lock:
            rows = index.connection().execute("PRAGMA integrity_check(1)").fetchall()
        if rows != [("ok",)]:
            raise sqlite3.DatabaseError(f"database disk image is malformed: {rows[:1]}")
    except sqlite3.DatabaseError as e:
        if not corruption(e):
            raise
        index.heal(e)
    if cache._disabled:
        raise ValueError(f"{cache!r} cannot be used: {cache._disabled}")
    return cache.stats()["index_rebuilt"] > before
