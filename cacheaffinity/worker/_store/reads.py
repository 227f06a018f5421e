"""The read path of a node cache: :class:`Reader` (runs in workers and in the CLI).

One index query for all the keys (or for a range's chunk packs), then one verified
read per data file; values queued for the writer are served from the queue.  Every
failure is a miss: a vanished file's row is removed, a corrupt one removed and logged
once per cache, anything else logged once and counted."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable
from typing import Any

import numpy as np

from cacheaffinity.exceptions import Closed, Corrupt
from cacheaffinity.worker._store.files import DataFiles, members_of
from cacheaffinity.worker._store.health import Health
from cacheaffinity.worker._store.index import Index
from cacheaffinity.worker._store.schema import POLICY_COLUMNS
from cacheaffinity.worker._store.layout import PLAIN
from cacheaffinity.worker._store.protocol import Pack
from cacheaffinity.worker._store.writer import DROPPED, WriteBehind

__all__ = ["QUERY_KEYS", "Reader"]

logger = logging.getLogger("cacheaffinity.worker")

#: Keys per index query of :meth:`Reader.get_many` (SQLite's variable limit).
QUERY_KEYS = 500
_MISSING = object()
#: The admission policy's columns of a row (:data:`~cacheaffinity.worker._store.index.POLICY_COLUMNS`),
#: read with every hit (see :class:`Reader`).
POLICY_FIELDS = ", ".join(POLICY_COLUMNS)


class Reader:
    """Verified reads of one cache; ``looked_up(key, size, row id, policy fields)`` is called
    for every hit (the fields: the row's ``rank, last_used, stale_from, reuse_dist`` as the
    lookup read them, so saving the lookup need not read the row again)."""

    def __init__(self, index: Index, files: DataFiles, health: Health, writer: WriteBehind,
                 looked_up: Callable[[str, int, int, tuple], None]):  # fmt: skip
        self._index = index
        self._files = files
        self._health = health
        self._writer = writer
        self._looked_up = looked_up

    def read(self, key: str, row: tuple) -> dict[str, np.ndarray] | None:
        """The verified members of the data file of ``row`` = (file, toc, nbytes, checksum,
        writer), or None: gone (row removed), corrupt (removed, logged) or unreadable (logged)."""
        name, toc, nbytes, checksum, writer = row
        try:
            buffer = self._files.read(name, nbytes, checksum, writer)
            if buffer is None:
                self.remove_entry(key, name)  # evicted after the lookup, or lost
                return None
            try:
                toc = json.loads(toc)
            except (TypeError, ValueError):
                raise Corrupt("unreadable table of contents", "toc") from None
            members = members_of(buffer, toc, nbytes)
            if self._files.maps(nbytes):
                self._health.count(bytes_mapped=int(nbytes))
            else:
                self._health.count(bytes_read=int(nbytes))
            return members
        except Corrupt as e:
            self._health.warn_once(
                f"corrupt:{e.kind}",
                "cacheaffinity: corrupt cache entry %r in %s (%s); removed, reading it from "
                "storage instead (later entries of this cache damaged this way are counted "
                "as 'corrupt' and logged at debug level)",
                key, self._index.directory, e,
            )  # fmt: skip
            self._health.count(corrupt=1, errors=1)
            self.remove_entry(key, name)
        except (OSError, ValueError) as e:
            self.failed(key, e)
        return None

    def failed(self, key: str, e: BaseException) -> None:
        """A lookup of ``key`` failed with ``e``: a miss, logged once per cache."""
        self._health.warn_once(
            "read", "cacheaffinity: cache read of %r in %s failed (%s); a miss", key, self._index.directory, e
        )
        self._health.count(errors=1)

    def remove_entry(self, key: str, name: str) -> None:
        """Delete exactly this row (not a newer value under the same key) and its file."""
        try:
            with self._index.transaction() as con:
                con.execute("DELETE FROM entries WHERE key = ? AND file = ?", (key, name))
        except (sqlite3.Error, OSError, Closed) as e:
            logger.debug("cacheaffinity: could not remove entry %r: %s", key, e)
            return
        self._files.remove([name])

    def _rows(self, keys: list[str]) -> dict[str, tuple]:
        rows: dict[str, tuple] = {}
        for i in range(0, len(keys), QUERY_KEYS):
            part = keys[i : i + QUERY_KEYS]
            marks = ",".join("?" * len(part))
            for row in self._index.query(
                f"SELECT key, file, toc, nbytes, checksum, writer, size, id, {POLICY_FIELDS} "
                f"FROM entries WHERE key IN ({marks})",
                tuple(part),
            ):
                rows[row[0]] = row[1:]
        return rows

    def get_many(self, keys: list[str]) -> dict[str, np.ndarray]:
        """``{key: array}`` of the plain entries of ``keys`` that hit: one index query."""
        out: dict[str, np.ndarray] = {}
        if not self._health.usable:
            self._health.count(misses=len(keys))
            return out
        todo = []
        for k in keys:
            item: Any = self._writer.pending_item(k, _MISSING)
            if item is _MISSING:
                todo.append(k)
            elif item is not DROPPED and item.grp is None:
                out[k] = item.arrays[PLAIN]
        try:
            rows = self._rows(todo) if todo else {}
        except Closed:
            rows = {}
        except (OSError, sqlite3.Error, ValueError) as e:
            self.failed(todo[0], e)
            rows = {}
        for k, row in rows.items():
            members = self.read(k, row[:5])
            value = None if members is None else members.get(PLAIN)
            if value is not None:
                out[k] = value
                self._looked_up(k, row[5], row[6], row[7:])
        served = sum(v.nbytes for v in out.values())
        self._health.count(hits=len(out), misses=len(keys) - len(out), bytes_served=served)
        return out

    def get_packs(self, grp: str, start: int, stop: int) -> list[Pack]:
        """Every readable pack of ``grp`` overlapping ``[start, stop)``, newest first
        (queued ones first of all)."""
        if not self._health.usable:
            return []
        out = [
            Pack(it.start, it.stop, it.arrays, it.size)
            for it in self._writer.pending_items()
            if it.grp == grp and it.start < stop and it.stop > start
        ]
        try:
            rows = self._index.query(
                "SELECT key, start, stop, size, id, file, toc, nbytes, checksum, writer, "
                f"{POLICY_FIELDS} FROM entries WHERE grp = ? AND start < ? AND stop > ? ORDER BY id DESC",
                (grp, int(stop), int(start)),
            )
        except Closed:
            return out
        except (OSError, sqlite3.Error, ValueError) as e:
            self.failed(grp, e)
            return out
        for key, a, b, size, rid, *row in rows:
            members = self.read(key, tuple(row[:5]))
            if members is not None:
                out.append(Pack(int(a), int(b), members, int(size)))
                self._health.count(packs_read=1)
                self._looked_up(key, size, rid, tuple(row[5:]))
        return out
