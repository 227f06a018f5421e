"""The write path of a node cache: :class:`WritePath` (runs in workers and in the CLI).

A value is checked (no objects, no structured dtypes) and becomes an :class:`Item`
whose table of contents is computed once.  :meth:`WritePath.put` refuses what never
fits or arrives while writes pause, then queues it or stores it now;
:meth:`WritePath.store_many` writes the data files, then one transaction (capacity
re-read, older values replaced, eviction, insert) and deletes the files of replaced
or evicted rows only after the commit.  A full disk makes room and retries once, then
leaves the value uncached and pauses writes for :data:`FULL_BACKOFF` seconds, with one
warning per cache and kind of problem."""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from dask.utils import format_bytes, parse_bytes

from cacheaffinity.exceptions import Closed, Lost
from cacheaffinity.worker._store.admission import rank
from cacheaffinity.worker._store.admitter import Admitter
from cacheaffinity.worker._store.capacity import Capacity, evict_rows, make_room
from cacheaffinity.worker._store.files import DataFiles, toc_of
from cacheaffinity.worker._store.health import Health
from cacheaffinity.worker._store.index import Index, problem
from cacheaffinity.worker._store.schema import UNSET
from cacheaffinity.worker._store.layout import blocks, pack_key
from cacheaffinity.worker._store.writer import WriteBehind

__all__ = ["FULL_BACKOFF", "Item", "WritePath", "pack_item", "plain_array", "queue_bytes"]

logger = logging.getLogger("cacheaffinity.worker")

#: Seconds that writes pause after a write failed twice on a full disk.
FULL_BACKOFF = 30.0


def queue_bytes(value: int | str) -> int:
    """``write_queue`` as bytes (``int`` or a dask byte string such as ``"256 MiB"``)."""
    try:
        n = parse_bytes(value) if isinstance(value, str) else int(value)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"cacheaffinity.worker.write-queue={value!r} is not a byte size; use bytes or "
            "a string like '256 MiB' (0 writes inline)"
        ) from e
    if n < 0:
        raise ValueError(f"cacheaffinity.worker.write-queue={value!r} must be >= 0 (0 writes inline)")
    return n


class Item:
    """One data file to write: a plain entry (``grp`` None) or a chunk pack."""

    __slots__ = ("key", "grp", "start", "stop", "arrays", "layout", "nbytes", "size")

    def __init__(self, key, grp, start, stop, arrays):
        self.key, self.grp, self.start, self.stop, self.arrays = key, grp, start, stop, arrays
        self.layout = toc_of(arrays)
        self.nbytes = self.layout[1]  # views of other members are not counted twice
        self.size = blocks(self.nbytes)


def plain_array(key: str, value: object) -> np.ndarray:
    """``value`` as a C-contiguous array the store can keep (``TypeError`` if never)."""
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


def pack_item(grp: str, start: int, stop: int, arrays: dict[str, np.ndarray]) -> Item:
    """The item of a chunk pack (``TypeError`` for names that are not ``str`` or
    arrays the store cannot keep)."""
    if not isinstance(grp, str) or not all(isinstance(k, str) for k in arrays):
        raise TypeError("chunk pack group and member names are str")
    arrays = {k: plain_array(k, v) for k, v in arrays.items()}
    return Item(pack_key(grp, start, stop, arrays), grp, int(start), int(stop), arrays)


class WritePath:
    """Writes of one cache: its ``index``, ``files``, ``health``, ``capacity``, ``writer``
    (limit 0: inline) and ``admission`` (None: ``fifo``); ``looked_up(key, size)`` records
    the miss a value answers, ``stored()`` runs after every stored batch."""

    def __init__(self, index: Index, files: DataFiles, health: Health, capacity: Capacity,
                 writer: WriteBehind, admission: Admitter | None,
                 looked_up: Callable[[str, int], None], stored: Callable[[], None]):  # fmt: skip
        self._index = index
        self._files = files
        self._health = health
        self._capacity = capacity
        self._writer = writer
        self._admission = admission
        self._looked_up = looked_up
        self._stored = stored

    def put(self, item: Item) -> bool:
        """Queue ``item`` for the writer thread, or store it now (``write_queue=0``).
        Returns whether it was taken (False: refused, not admitted, or dropped)."""
        health = self._health
        if not health.usable:
            health.count(skipped=1)
            return False
        capacity = self._capacity.in_force
        if item.size > capacity:
            health.warn_once(
                "oversize",
                "cacheaffinity: %r of %s exceeds cacheaffinity.worker.capacity=%s; not cached "
                "(raise the capacity, e.g. dask.config.set({'cacheaffinity.worker.capacity': "
                "'200 GiB'}))",
                item.key, format_bytes(item.nbytes), format_bytes(capacity),
            )  # fmt: skip
            health.count(skipped=1)
            self.discard(item.key)
            return False
        if health.writes_paused():
            health.count(skipped=1)
            self.discard(item.key)
            return False
        adm = self._admission
        if adm is not None:  # the miss this value answers is a lookup; not admitted: not written
            self._looked_up(item.key, item.size)
            if adm.prechecks(item.size) and not adm.admits(item.key, item.size, capacity):
                adm.outcomes(refused=1)
                health.count(not_admitted=1)
                return False
        writer = self._writer
        if writer.limit > 0:
            dropped = writer.put(item.key, item, item.nbytes)
            if dropped is None:
                health.count(skipped=1)
                return False
            if dropped:
                health.count(skipped=1, dropped=1)
                health.warn_once(
                    "queue",
                    "cacheaffinity: write queue of cache %s is full (%s waiting); %r and later "
                    "values that do not fit are not cached (counted as 'dropped'). Raise "
                    "cacheaffinity.worker.write-queue if this happens often.",
                    health.directory, format_bytes(writer.queued_bytes), item.key,
                )  # fmt: skip
                return False
            return True
        self.set_now(item, checked=adm is not None)
        return True

    def set_now(self, item: Item, checked: bool = False) -> None:
        """Store one item now; failures leave it uncached with one warning (``checked``:
        the admission policy's pre-check just said yes: not asked again before writing)."""
        health = self._health
        error: BaseException | None = None
        for attempt in range(2):
            try:
                self.store_many([item], checked)
                return
            except (Lost, Closed) as e:
                logger.debug("cacheaffinity: %r not cached: %s", item.key, e)
                health.count(skipped=1)
                return
            except (OSError, sqlite3.Error) as e:
                error = e
            if attempt or problem(error) != "full":
                break
            # The disk holds less than capacity says: room for twice the item (the index grows).
            health.count(errors=1)
            evicted, freed = make_room(self._index, self._files, 2 * item.size + 4096)
            health.count(evictions=evicted, bytes_evicted=freed)
        health.count(errors=1, skipped=1)
        kind = problem(error)
        if kind == "full":
            health.pause_writes(FULL_BACKOFF)
            health.warn_once(
                "disk",
                "cacheaffinity: disk of cache %s is full (%s); some columns are not cached "
                "(writes pause %.0f s after each failure). Lower cacheaffinity.worker.capacity "
                "or free space on that disk.",
                health.directory, error, FULL_BACKOFF,
            )  # fmt: skip
        elif kind == "unwritable":
            health.warn_once(
                "disk",
                "cacheaffinity: cache directory %s is not writable (%s); columns are not "
                "cached. Point cacheaffinity.worker.directory to a writable local directory.",
                health.directory, error,
            )  # fmt: skip
        else:
            health.warn_once("write", "cacheaffinity: storing %r in %s failed (%s); not cached",
                             item.key, health.directory, error)  # fmt: skip
        self.discard(item.key)

    def write_batch(self, batch: list) -> None:
        """Store queued items (in the writer thread): one index transaction if possible."""
        health = self._health
        latest: dict[str, Any] = {}
        for key, item, _ in batch:  # the last value of a key wins
            latest.pop(key, None)
            latest[key] = item
        items = [it for it in latest.values() if it is not None]
        for key in [k for k, it in latest.items() if it is None]:
            self.discard(key)
        if not items or not health.usable:
            return
        if not health.writes_paused():
            try:
                self.store_many(items)
                return
            except (Lost, Closed, OSError, sqlite3.Error) as e:
                logger.debug("cacheaffinity: batched write failed (%r); one by one", e)
                if isinstance(e, sqlite3.Error):
                    self._index.close_writer_connection()
        for item in items:
            if health.writes_paused():
                health.count(skipped=1)
                continue
            self.set_now(item)

    def store_many(self, items: list[Item], checked: bool = False) -> None:
        """Write the items' data files, then one index transaction for all of them
        (the admission policy, if any, decides inside it: ``Admitter``; ``checked``: its
        pre-check on this process's view just ran, in :meth:`put`)."""
        health, files = self._health, self._files
        adm = self._admission
        if adm is not None and not checked:  # decided on this process's view: not written at all
            capacity = self._capacity.in_force
            kept = [it for it in items if not adm.prechecks(it.size) or adm.admits(it.key, it.size, capacity)]
            if len(kept) < len(items):
                adm.outcomes(refused=len(items) - len(kept))
                health.count(not_admitted=len(items) - len(kept))
            items = kept
        written: list[tuple[Item, str, list, int, bytes]] = []
        refused = 0
        try:
            for item in items:
                name, toc, nbytes, digest = files.write(item.arrays, item.layout)
                written.append((item, name, toc, nbytes, digest))
            doomed: list[str] = []
            evicted = freed = 0
            now = time.time()
            with self._index.transaction() as con:
                capacity = self._capacity.follow(con)  # another process may have recorded a new one
                with adm.deciding(con, capacity) if adm is not None else contextlib.nullcontext() as decider:
                    for item, name, toc, nbytes, digest in written:
                        old = con.execute("SELECT id, file FROM entries WHERE key = ?", (item.key,)).fetchone()
                        if old is not None:
                            con.execute("DELETE FROM entries WHERE id = ?", (old[0],))
                            doomed.append(old[1])
                        fields = None
                        if decider is not None:
                            if decider.place(item.key, item.size, None if old is None else old[0]) is None:
                                doomed.append(name)  # not admitted after all: nothing names it
                                refused += 1
                                continue
                            gone, n = decider.evicted()  # rows the policy deleted
                            doomed.extend(gone)
                            evicted += len(gone)
                            freed += n
                            fields = decider.fields(item.key)
                        used = con.execute("SELECT value FROM meta WHERE name = 'size'").fetchone()[0]
                        gone, n = evict_rows(con, used + item.size - capacity)  # FIFO, or a safety net
                        if gone and decider is not None:
                            decider.deleted()
                        doomed.extend(gone)
                        evicted += len(gone)
                        freed += n
                        insert_row(con, item, name, toc, nbytes, digest, now, files.uid, fields)
        except BaseException:
            if adm is not None:
                adm.rolled_back()
            files.remove([w[1] for w in written])
            raise
        if adm is not None:
            adm.committed()
            adm.outcomes(stored=len(written) - refused, refused=refused)
        files.remove(doomed)  # only after the commit: nobody can find them any more
        gone = set(doomed)
        stored = [w for w in written if w[1] not in gone]
        health.count(
            writes=len(stored),
            packs_written=sum(1 for w in stored if w[0].grp is not None),
            bytes_written=sum(w[3] for w in stored),
            evictions=evicted,
            bytes_evicted=freed,
            not_admitted=refused,
        )
        self._stored()

    def discard(self, key: str) -> None:
        """Remove an older value of ``key`` after a failed store (best effort)."""
        if not self._health.usable:
            return
        try:
            with self._index.transaction() as con:
                row = con.execute("SELECT file FROM entries WHERE key = ?", (key,)).fetchone()
                if row is not None:
                    con.execute("DELETE FROM entries WHERE key = ?", (key,))
        except (sqlite3.Error, OSError, Closed) as e:
            logger.debug("cacheaffinity: could not remove old value of %r: %s", key, e)
            return
        if row is not None:
            self._files.remove([row[0]])


def insert_row(con: sqlite3.Connection, item: Item, name: str, toc: list, nbytes: int, digest: bytes,
               now: float, writer: int, fields: tuple | None = None) -> None:  # fmt: skip
    """The index row of ``item`` (data file ``name``, written by uid ``writer``, the
    admission policy's ``fields``: rank, last_used, stale_from, reuse_dist), inside the
    caller's transaction.  Without ``fields`` (``fifo``) the rank is still recorded, and
    the fields the policy sets at a lookup as :data:`~cacheaffinity.worker._store.schema.UNSET`
    (the row keeps its size when it sets them; ``fields`` are stored values already)."""
    if fields is None:
        fields = (rank(item.key), None, UNSET, UNSET)
    con.execute(
        "INSERT INTO entries (key, grp, start, stop, file, toc, nbytes, size, checksum, stored, "
        "writer, rank, last_used, stale_from, reuse_dist) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (item.key, item.grp, item.start, item.stop, name,
         json.dumps(toc, separators=(",", ":")), nbytes, item.size, digest, now, writer, *fields),
    )  # fmt: skip
