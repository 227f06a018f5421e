"""The node's admission policy inside the store: :class:`Admitter` (workers and the CLI).

One per ``ColumnCache`` running ``rank`` (``fifo`` has none).  The policy's per-entry
fields are columns of the index rows (``rank``, ``last_used``, ``stale_from``,
``reuse_dist``; ordered indexes find the stalest entry and the highest rank), its
bottom-k sample is the ``admission_sample`` table and its node-wide scalars (clock,
demand, jitter, ...) one small JSON row of ``admission_state`` with a ``version``.  No
process holds the entries: every operation reads and writes only the rows it concerns,
so its cost and a process's memory do not grow with what the node holds.

A process records its lookups in memory (a hit with its row id and the policy columns its
query read); every insert transaction and every save (:data:`SAVE_EVERY` lookups, or
:data:`SAVE_AFTER` seconds) runs :meth:`Admitter.deciding`: re-read the scalars if another
process saved since (the version), apply this process's unsaved lookups to the rows (a hit's
row as its lookup read it: the rows are not read again), decide, save the scalars; so a
crash loses at most unsaved lookups.  A state that does not parse is replaced by a fresh one (entries kept)."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Iterator

from cacheaffinity.exceptions import Closed
from cacheaffinity.worker._store.admission import POLICIES, StableRank, key_hash, make_policy, rank
from cacheaffinity.worker._store.index_sample import IndexSample
from cacheaffinity.worker._store.rank_tables import first_of
from cacheaffinity.worker._store.read_ahead import Kept, ReadAhead
from cacheaffinity.worker._store.schema import FILL_DUE, UNSET, read, stored
from cacheaffinity.worker._store.state_rows import StateRows

__all__ = ["PRECHECK_BYTES", "PRECHECK_MOST", "PRECHECK_REFUSED", "STORE_POLICIES", "UNSAVED", "Admitter",
           "IndexEntries", "IndexSample", "SAVE_EVERY", "Unplanned"]

logger = logging.getLogger("cacheaffinity.worker")

#: Policies the store runs through an :class:`Admitter` (``fifo`` evicts by row id).
STORE_POLICIES = ("rank",)
#: Lookups kept in memory until saved, at most (the oldest are dropped).
UNSAVED = 8192
#: Unsaved lookups are saved once there are this many (by the thread that made the last
#: one), or when older than :data:`SAVE_AFTER` seconds (workers: with each heartbeat); a
#: cache of many entries saves every 1/:data:`SAVE_SHARE` of its entries, at most
#: :data:`SAVE_MOST` (fewer transactions; the grace stays that share of the cache).
SAVE_EVERY = 64
SAVE_SHARE = 64
SAVE_MOST = 1024
SAVE_AFTER = 1.0
#: Processes of the node that saved within this many demands (a run's lookups) count in
#: the grace (see :meth:`Admitter.grace`); at most :data:`WRITERS_KEPT` are remembered.
WRITERS_WITHIN = 2.0
WRITERS_KEPT = 64
#: A process's clock in the ``writers`` row is written again once it lags this many demands
#: (or when the processes listed change): it stays within :data:`WRITERS_WITHIN` while the
#: process saves, and most transactions leave the row as it is.
WRITERS_LAG = 0.5
#: ``admission_due`` is made again from the rows when it holds more than this many records
#: per row, plus :data:`DUE_SLACK` (records a later lookup superseded that no eviction has
#: passed yet: the simulator's heap has the same bound).
DUE_PER_ROW = 4
DUE_SLACK = 1024
#: The records waiting in ``admission_inbox`` are moved into ``admission_due`` by the first
#: victim search of a write transaction; more than 1/:data:`INBOX_SHARE` of the rows (plus
#: :data:`DUE_SLACK`) and the log is made again from the rows instead (one pass in order:
#: a record moved costs a lookup of its row and an insert, several times a row of the pass).
INBOX_SHARE = 8
#: A pre-check (a victim plan outside a write transaction, which moves no inbox, drops no
#: superseded record and saves no watermark) reads at most this many inbox records,
#: superseded log records or rows past the fresh watermark; past it the insert's transaction
#: decides (:class:`Unplanned`), whose first plan moves, drops and saves them.  After a warm
#: run of a whole cache they are every row: 0.1 s per pre-check at 10^5 packs, until then.
PRECHECK_MOST = 1024
#: A value of at least this many bytes is always pre-checked before its data file is written.
#: A smaller one only while more than :data:`PRECHECK_REFUSED` of this process's recent
#: inserts were refused (a moving average over about :data:`REFUSED_OVER` of them): the
#: pre-check (~90 µs at 10^5 packs) is paid by every insert, while a small pack refused
#: without it costs its write and delete (30-130 µs for 4-64 KiB) and a write transaction
#: that refuses it (an insert's took ~300 µs at 10^5 packs, holding the node's write lock),
#: paid by refused ones only.  A cache being filled refuses few (no pre-check); a working
#: set larger than the cache, where ``rank`` refuses most, is pre-checked.
PRECHECK_BYTES = 64 << 10
PRECHECK_REFUSED = 0.25
REFUSED_OVER = 16


class Unplanned(Exception):
    """A pre-check's plan would read more than :data:`PRECHECK_MOST` records or rows."""


class IndexEntries(ReadAhead):
    """:class:`~cacheaffinity.worker._store.rank_tables.RankEntries` as columns of the index
    rows, through ``con`` (inside the caller's transaction for changes).  Rows the policy
    evicts are deleted here (their data files in :attr:`removed`, to delete after the
    commit); an admitted key's fields wait in :attr:`fields` for the row its caller inserts."""

    def __init__(self, con: sqlite3.Connection, fresh_from: int = 0, writing: bool = False):
        self.con = con
        #: inside a write transaction: records of ``admission_due`` found superseded are
        #: deleted (else only passed over)
        self.writing = writing
        #: records of ``admission_due`` and its inbox added (lookups written) and deleted
        #: here, and their number if the log was made again here (else None)
        self.due_added = 0
        self.due_dropped = 0
        self.due_rebuilt: int | None = None
        #: Every row below this id has been looked up since it was stored (is not fresh):
        #: rows are stored in clock order with ids that only grow, so the oldest fresh
        #: entry is the first fresh row from here (:meth:`first_fresh`), found without an
        #: index that every first lookup would have to change.
        self.fresh_from = fresh_from
        #: data files of the rows deleted, and their bytes
        self.removed: list[str] = []
        self.freed = 0
        #: key -> (rank, last lookup, stale from, reuse distance) of keys admitted
        self.fields: dict[str, tuple] = {}
        #: rows read ahead (:meth:`prefetch`; None: not held) and lookups not written yet
        self._rows: dict[str, tuple | None] = {}
        self._ids: dict[str, int] = {}
        self._touched: dict[str, tuple] = {}
        #: key -> (row id, data file, size) of rows an order passed (a victim's size and
        #: delete need no lookup by key: ids are never reused, a row's file and size never
        #: change), and keys found not held (until :meth:`add`)
        self._seen: dict[str, tuple[int, str, int]] = {}
        self._absent: set[str] = set()
        self._inbox_taken = False
        self._init_read_ahead()  # inside a write transaction: the orders read ahead

    def prefetch(self, lookups) -> None:
        """Hold the rows of a batch of ``(seq, key, size, row id or None, fields or None)``
        lookups: a hit's fields as its lookup read them (that row id: a row of that key
        since replaced or evicted is not changed), else read in a few queries by row id,
        or by key for a miss (a row of that key since replaced is not that id: not held)."""
        ids: dict[int, str] = {}
        keys: list[str] = []
        for _, key, size, rid, fields in lookups:
            if key in self._rows:
                continue
            if rid is not None and fields is not None:
                self._rows[key] = (size, *fields)
                self._ids[key] = rid
            elif rid is not None:
                ids[rid] = key
                self._rows[key] = None
            else:
                keys.append(key)
                self._rows[key] = None
        for column, values in (("id", list(ids)), ("key", keys)):
            for i in range(0, len(values), 500):
                part = values[i : i + 500]
                for key, rid, *row in self.con.execute(
                    "SELECT key, id, size, rank, last_used, stale_from, reuse_dist FROM entries "
                    f"WHERE {column} IN ({','.join('?' * len(part))})",
                    part,
                ):
                    if column == "key" or ids.get(rid) == key:
                        self._rows[key] = tuple(row)
                        self._ids[key] = rid

    def flush(self) -> None:
        """Write the lookups :meth:`touch` recorded (before any decision reads the rows)."""
        if self._touched:
            ids = self._ids
            # by row id: a batch of lookups in random order then walks the row and index
            # pages once in order (its save ~14% cheaper at 10^6 entries than in lookup order)
            self.con.executemany(
                "UPDATE entries SET last_used = ?, stale_from = ?, reuse_dist = ? WHERE id = ?",
                sorted(((*v, ids[k]) for k, v in self._touched.items() if k in ids), key=lambda r: r[3]),
            )
            self.con.executemany(
                "UPDATE entries SET last_used = ?, stale_from = ?, reuse_dist = ? WHERE key = ?",
                [(*v, k) for k, v in self._touched.items() if k not in ids],
            )
            # each appends a record to admission_inbox (its trigger); the old one stays, superseded
            self.due_added += len(self._touched)
            self._inbox_taken = False
            self._touched.clear()
            self.reread()
        self._rows.clear()
        self._ids.clear()

    def _one(self, sql: str, args: tuple = ()) -> tuple | None:
        return self.con.execute(sql, args).fetchone()

    @property
    def used(self) -> int:
        return int(self._one("SELECT value FROM meta WHERE name = 'size'")[0])

    def held(self) -> tuple[int, int]:
        """``(entries, bytes)`` the index holds."""
        rows = dict(self.con.execute("SELECT name, value FROM meta"))  # its two rows (a scan: ~2x faster)
        return int(rows["count"]), int(rows["size"])

    def __len__(self) -> int:
        return int(self._one("SELECT value FROM meta WHERE name = 'count'")[0])

    def __contains__(self, key: str) -> bool:
        if key in self._absent:
            return False
        if self._one("SELECT 1 FROM entries WHERE key = ?", (key,)) is not None:
            return True
        self._absent.add(key)
        return False

    def size(self, key: str) -> int | None:
        """The size of ``key`` (as an order read it), or None if not held."""
        seen = self._seen.get(key)
        if seen is not None:
            return seen[2]
        row = self._one("SELECT size FROM entries WHERE key = ?", (key,))
        return None if row is None else int(row[0])

    def get(self, key: str) -> tuple | None:
        if key in self._rows:
            row = self._rows[key]
        else:
            row = self._one("SELECT size, rank, last_used, stale_from, reuse_dist FROM entries WHERE key = ?", (key,))
        if row is None:
            return None
        size, r, used, due, dist = row
        return (size, rank(key) if r is None else r, read(used) or 0.0, read(due), read(dist))

    def add(self, key: str, size: float, r: float, used: float, due: float | None, dist: float | None) -> None:
        self.fields[key] = (r, stored(used), *(UNSET if v is None else stored(v) for v in (due, dist)))
        self._absent.discard(key)  # the caller inserts its row
        self._seen.pop(key, None)
        self._added(key, r, size)

    def touch(self, key: str, used: float, due: float, dist: float) -> None:
        row = self._rows.get(key) or self.get(key)
        values = (stored(used), stored(due), stored(dist))
        self._rows[key] = (row[0], row[1], *values)  # type: ignore[index]
        self._touched[key] = values

    def remove(self, key: str) -> None:
        if key in self._absent:
            return
        seen = self._seen.pop(key, None)
        if seen is not None and seen[0] is not None and self.con.execute(
            "DELETE FROM entries WHERE id = ?", (seen[0],)
        ).rowcount:
            row: tuple | None = seen
        else:  # not passed by an order (or inserted here), or its row deleted since (by id: that row or none)
            row = self._one("SELECT id, file, size FROM entries WHERE key = ?", (key,))
            if row is not None:
                self.con.execute("DELETE FROM entries WHERE id = ?", (row[0],))
        self._absent.add(key)
        if row is not None:
            self._dead.add(row[0])
            self.removed.append(row[1])
            self.freed += int(row[2])

    def gone(self, key: str, rid: int | None = None) -> None:
        """The caller deleted the row of ``key`` (if any: ``rid``) itself."""
        self._seen.pop(key, None)
        self._absent.add(key)
        if rid is not None:
            self._dead.add(rid)

    def _pass(self, key: str, rid: int, file: str, size: int) -> str:
        self._seen[key] = (rid, file, size)
        return key

    def due_order(self) -> Iterator[tuple[float, str]]:
        """``(stale from, key)`` of the valid records (their row still holds that
        ``stale_from``) of ``admission_due`` and its inbox, stale first first; a cursor
        stepped one record at a time (close it).  When :attr:`writing`, the inbox is moved
        into the log first (:meth:`take_inbox`), the log is read ahead and superseded records
        passed on the way are deleted once it is closed; else the inbox is read beside the
        log, only if its earliest record is not after the log's record at hand (:meth:`_inbox`)."""
        if self.writing:
            if not self._inbox_taken:  # only flush() appends to it (a transaction's lookups: first)
                self.take_inbox()
                self._inbox_taken = True
            yield from self._due_read_ahead()
            return
        first_in, waiting = self._one(  # type: ignore[misc]
            "SELECT min(stale_from), count(*) FROM (SELECT stale_from FROM admission_inbox LIMIT ?)",
            (PRECHECK_MOST + 1,),
        )
        if waiting > PRECHECK_MOST:
            raise Unplanned(f"more than {PRECHECK_MOST} lookups wait in the inbox")
        dead: list[tuple[float, int]] = []
        inbox: Iterator[tuple] | None = None
        head: tuple | None = None
        cur = self.con.execute(
            "SELECT d.stale_from, d.id, e.key, e.stale_from, e.file, e.size FROM admission_due d "
            "LEFT JOIN entries e ON e.id = d.id ORDER BY d.stale_from, d.id"
        )
        passed = self._pass
        try:
            for due, rid, key, now, file, size in cur:
                if now != due:  # the row is gone, or was looked up again since
                    dead.append((due, rid))
                    if len(dead) > PRECHECK_MOST:
                        raise Unplanned(f"more than {PRECHECK_MOST} superseded records")
                    continue
                if inbox is None and first_in is not None and first_in <= due:
                    inbox = self._inbox(due)
                    head = next(inbox, None)
                while head is not None and head[:2] < (due, rid):
                    yield read(head[0]), passed(head[2], head[1], head[3], head[4])
                    head = next(inbox, None)  # type: ignore[arg-type]
                yield read(due), passed(key, rid, file, size)
            if inbox is None and first_in is not None:
                inbox = self._inbox(None)
                head = next(inbox, None)
            while head is not None:
                yield read(head[0]), passed(head[2], head[1], head[3], head[4])
                head = next(inbox, None)  # type: ignore[arg-type]
        finally:
            cur.close()
            if inbox is not None:
                inbox.close()  # type: ignore[attr-defined]

    def _inbox(self, upto: float | None) -> Iterator[tuple]:
        """``(stale_from, id, key, file, size)`` of the inbox's valid records in order, read only: those
        up to ``upto`` first (most victim searches need no more: sorted alone), then the rest
        in one more pass if asked for (the inbox holds the lookups saved since the node's last
        eviction; ``upto`` None: all in one pass)."""
        sql = (
            "SELECT i.stale_from, i.id, e.key, e.file, e.size FROM admission_inbox i JOIN entries e "
            "ON e.id = i.id AND e.stale_from = i.stale_from WHERE {} ORDER BY i.stale_from, i.id"
        )
        windows = [("1", ())] if upto is None else [("i.stale_from <= ?", (upto,)), ("i.stale_from > ?", (upto,))]
        for where, args in windows:
            yield from self._stepped(sql.format(where), args)

    def _stepped(self, sql: str, args: tuple = ()) -> Iterator[tuple]:
        """The rows of ``sql``, one step of its cursor each (closed with the generator)."""
        cur = self.con.execute(sql, args)
        try:
            yield from cur
        finally:
            cur.close()

    def first_due(self, exclude=()) -> tuple[float, str] | None:
        """The first record of :meth:`due_order` whose key is not in ``exclude``."""
        return first_of(self.due_order(), exclude)

    def take_inbox(self) -> None:
        """Inside a write transaction: the inbox's valid records moved into ``admission_due``
        in its order (the others dropped), or, if the inbox holds more than 1/
        :data:`INBOX_SHARE` of the rows, the log made again from the rows."""
        lo, hi = self._one(  # type: ignore[misc]
            "SELECT (SELECT min(rowid) FROM admission_inbox), (SELECT max(rowid) FROM admission_inbox)"
        )
        self._due_ahead = None
        if hi is None:
            return
        waiting = hi - lo + 1  # only ever appended to, and emptied whole
        if waiting > self.held()[0] // INBOX_SHARE + DUE_SLACK:
            self.due_rebuilt = self.rebuild_due()
            self.due_added = self.due_dropped = 0
            return
        moved = self.con.execute(
            "INSERT OR IGNORE INTO admission_due SELECT i.stale_from, i.id FROM admission_inbox i "
            "JOIN entries e ON e.id = i.id AND e.stale_from = i.stale_from ORDER BY i.stale_from, i.id"
        ).rowcount
        self.con.execute("DELETE FROM admission_inbox")
        self.due_dropped += max(0, waiting - moved)

    def rebuild_due(self) -> int:
        """``admission_due`` made again from the rows (one valid record each), its inbox
        emptied: its records.  In its order (at 10^6 rows 0.7 s, against 2.2 s in row order)."""
        self._due_ahead = None
        self.con.execute("DELETE FROM admission_due")
        self.con.execute("DELETE FROM admission_inbox")
        return self.con.execute(FILL_DUE).rowcount

    def fresh_order(self) -> Iterator[tuple[float, str]]:
        """``(stored at, key)`` of the entries not looked up since stored, oldest first: the
        fresh rows from :attr:`fresh_from` in id order (which then moves up to the first,
        or past the last row if there is none: each row is passed over once, whatever the
        index holds) (close it)."""
        if self.writing:
            yield from self._fresh_read_ahead()
            return
        start = self.fresh_from
        end = start + PRECHECK_MOST  # a pre-check reads that many ids
        cur = self.con.execute(
            "SELECT last_used, key, id, file, size FROM entries "
            "WHERE id >= ? AND id < ? AND (stale_from IS NULL OR stale_from < 0) ORDER BY id",
            (start, end),
        )
        passed = self._pass
        try:
            first = True
            for used, key, rid, file, size in cur:
                if first:
                    self.fresh_from, first = rid, False
                yield read(used) or 0.0, passed(key, rid, file, size)
            top = self._one("SELECT max(id) FROM entries")[0] or 0
            if top >= end:  # rows left past what a pre-check reads
                raise Unplanned(f"the {PRECHECK_MOST} ids from the fresh watermark passed")
            if first:
                self.fresh_from = max(self.fresh_from, top + 1)
        finally:
            cur.close()

    def rank_order(self) -> Iterator[tuple[float, str]]:
        """``(rank, key)`` of the rows, highest rank first (ties: the newer) (close it)."""
        if self.writing:
            return self._rank_read_ahead()
        return self._rank_stepped()

    def _rank_stepped(self) -> Iterator[tuple[float, str]]:
        passed = self._pass
        rows = self._stepped("SELECT rank, key, id, file, size FROM entries ORDER BY rank DESC, id DESC")
        with contextlib.closing(rows):  # type: ignore[type-var]
            for r, key, rid, file, size in rows:
                yield r, passed(key, rid, file, size)

    def first_fresh(self, exclude=()) -> tuple[float, str] | None:
        """The first of :meth:`fresh_order` whose key is not in ``exclude``."""
        return first_of(self.fresh_order(), exclude)

    def highest(self, exclude=()) -> tuple[float, str] | None:
        """The first of :meth:`rank_order` whose key is not in ``exclude``."""
        return first_of(self.rank_order(), exclude)

    def items(self) -> list[tuple]:
        sql = "SELECT key, size, rank, last_used, stale_from, reuse_dist FROM entries ORDER BY id"
        return [(*row[:3], read(row[3]) or 0.0, read(row[4]), read(row[5])) for row in self.con.execute(sql)]


class Admitter:
    """Owner of a node cache's admission policy ``name`` (one of :data:`STORE_POLICIES`)
    for ``capacity`` bytes (updated by every :meth:`deciding`), kept in ``index``."""

    def __init__(self, name: str, capacity: int, index=None):
        if name not in STORE_POLICIES:
            known = ", ".join(("fifo", *STORE_POLICIES))
            raise ValueError(f"cacheaffinity.worker.admission={name!r} is not a store policy; use one of {known}")
        self.name = name
        self._index = index
        #: guards the policy object and its transactions
        self._lock = threading.RLock()
        #: guards taking lookups from :attr:`_unsaved` (a lookup appends without it: never waits)
        self._ulock = threading.Lock()
        self._policy: StableRank = make_policy(name, capacity)  # type: ignore[assignment]
        #: ``admission_state.version`` as this process last read or wrote it (None: never)
        self._version: int | None = None
        self._seq = itertools.count(1)
        #: (sequence number, key, size, row id or None, the row's policy fields or None) of
        #: lookups not saved yet (appended without a lock: a deque's append is atomic)
        self._unsaved: deque[tuple[int, str, int, int | None, tuple | None]] = deque(maxlen=UNSAVED)
        #: :attr:`save_every` as of the last transaction
        self._save_at = SAVE_EVERY
        self._saving_upto = 0
        self._last_save = time.monotonic()
        #: Times the scalars were read again because another process (or none yet) saved.
        self.reloads = 0
        #: Lookups saved (by any transaction of this process: :meth:`save`'s and the
        #: inserts'), and the CPU seconds of the saving thread in :meth:`save` alone (its
        #: transactions: the rows' page writes, the policy's bookkeeping): what keeping the
        #: policy costs beyond the lookups themselves (an insert's transaction is part of
        #: the insert's cost).
        self.lookups_saved = 0
        self.save_cpu_s = 0.0
        self._warned = False
        #: writer -> the clock at its last save, of the node's caches that save here
        self._writers: dict[str, float] = {}
        #: how many of them are other processes (:meth:`grace`; kept with :attr:`_writers`)
        self._others = 0
        #: the ``state`` and ``writers`` rows' JSON, what did not change kept
        self._rows = StateRows()
        self._token = f"{os.getpid()}-{id(self):x}"
        #: (entries, bytes) the index held at the last transaction
        self._held = (0, 0)
        #: :attr:`IndexEntries.fresh_from` as last read or saved (``admission_state``)
        self._fresh_from = 0
        #: records ``admission_due`` holds, as last read or saved (``admission_state``; an
        #: estimate: a lookup that sets a record already there counts one more)
        self._due = 0
        #: (version, size, largest hash) of the sample as this process saved it: still so
        #: while the version is that one (every change of the sample saves a new version)
        self._sample_saved: tuple | None = None
        #: the share of this process's recent inserts refused (moving average; see
        #: :data:`PRECHECK_BYTES`)
        self.refused_share = 0.0
        #: the last write transaction's table, for the next if nothing else wrote since
        self._kept = Kept()
        #: write transactions that continued the last one's table (:class:`Kept`)
        self.continued = 0

    def prechecks(self, size: int) -> bool:
        """Whether an insert of ``size`` bytes is pre-checked (:meth:`admits`) before its
        data file is written (see :data:`PRECHECK_BYTES`)."""
        return size >= PRECHECK_BYTES or self.refused_share > PRECHECK_REFUSED

    def outcomes(self, stored: int = 0, refused: int = 0) -> None:
        """Inserts of this process stored and refused (by a pre-check or a transaction): the
        average moves toward their refused share as far as that many single outcomes would
        (a batch's refusals are not counted as if they came last)."""
        n = stored + refused
        if n:
            target = refused / n
            self.refused_share = target + (self.refused_share - target) * (1.0 - 1.0 / REFUSED_OVER) ** n

    def reset_after_fork(self) -> None:
        """Fresh locks, and the next transaction re-reads the scalars (a forked child)."""
        self._lock = threading.RLock()
        self._ulock = threading.Lock()
        self._kept.drop()
        self._version = None
        self._sample_saved = None
        self._token = f"{os.getpid()}-{id(self):x}"
        self._set_writers(self._writers)

    def looked_up(self, key: str, size: int, rid: int | None = None, fields: tuple | None = None) -> bool:
        """A lookup of ``key`` (``size`` bytes): a hit (``rid``: the row it found, ``fields``:
        that row's ``rank, last_used, stale_from, reuse_dist`` as read), or a miss whose
        value is offered.  Returns whether :attr:`save_every` lookups wait to be saved (the
        caller saves)."""
        unsaved = self._unsaved
        unsaved.append((next(self._seq), key, int(size), rid, fields))
        return len(unsaved) >= self._save_at

    def _bind(self, con: sqlite3.Connection, writing: bool = False) -> IndexEntries:
        p = self._policy
        p.table, p.sample = IndexEntries(con, self._fresh_from, writing), IndexSample(con)  # type: ignore[assignment]
        return p.table  # type: ignore[return-value]

    def admits(self, key: str, size: int, capacity: int | None = None) -> bool:
        """Whether the policy would store ``key`` now, on the index as it is, its clock moved
        on by this process's unsaved lookups (the miss this value answers among them: the
        insert transaction applies them first), in ``capacity`` bytes (the capacity in force;
        None: as of this process's last transaction) (the transaction decides; an error says yes)."""
        index = self._index
        if index is None:
            return True
        try:
            with index.con_lock(), self._lock:  # the order of a transaction: no deadlock
                con = index.connection()
                self._read_scalars(con)
                self._bind(con)
                p = self._policy
                if capacity is not None:
                    p.capacity = capacity
                clock = p.clock
                p.clock += sum(item[2] for item in list(self._unsaved))
                try:
                    return key in p or p.admit(key, size)  # a held key's value is replaced
                finally:
                    p.clock = clock
        except Unplanned as e:
            logger.debug("cacheaffinity: admission pre-check not planned (%s); the insert decides", e)
            return True
        except (sqlite3.Error, OSError, Closed) as e:
            logger.debug("cacheaffinity: admission pre-check failed (%r); the insert decides", e)
            return True

    @property
    def save_every(self) -> int:
        """Lookups saved together: :data:`SAVE_EVERY`, or 1/:data:`SAVE_SHARE` of the entries
        (at most :data:`SAVE_MOST`)."""
        return min(SAVE_MOST, max(SAVE_EVERY, self._held[0] // SAVE_SHARE))

    def save_due(self) -> bool:
        """Whether unsaved lookups should be saved now (many, or old)."""
        with self._ulock:
            n = len(self._unsaved)
        return n >= self.save_every or (n > 0 and time.monotonic() - self._last_save > SAVE_AFTER)

    @contextlib.contextmanager
    def deciding(self, con: sqlite3.Connection, capacity: int) -> Iterator[Admitter]:
        """Inside the caller's write transaction: sync, let it :meth:`place` inserts, save; then
        the caller calls :meth:`committed` or :meth:`rolled_back`."""
        with self._lock:
            self._sync(con)
            self._policy.capacity = capacity
            yield self
            self._save(con)

    def place(self, key: str, size: int, replaced: int | None = None) -> list[str] | None:
        """Offer ``key`` (inside :meth:`deciding`; the caller deleted its row, if any: row id
        ``replaced``, a value replaced is offered anew): the keys evicted for it (their rows
        deleted: :meth:`evicted`), or None if it is not admitted."""
        p = self._policy
        p.table.gone(key, replaced)  # type: ignore[attr-defined]
        return p.offer(key, size)

    def deleted(self) -> None:
        """Inside :meth:`deciding`: the caller deleted rows other than :meth:`place`'s."""
        self._policy.table.reread()  # type: ignore[attr-defined]

    def evicted(self) -> tuple[list[str], int]:
        """Data files and bytes of the rows :meth:`place` deleted since the last call."""
        table = self._policy.table
        assert isinstance(table, IndexEntries)
        out = table.removed, table.freed
        table.removed, table.freed = [], 0
        return out

    def fields(self, key: str) -> tuple | None:
        """``(rank, last_used, stale_from, reuse_dist)`` for the row of ``key`` just admitted."""
        table = self._policy.table
        return table.fields.pop(key, None) if isinstance(table, IndexEntries) else None

    def committed(self) -> None:
        """The transaction of the last :meth:`deciding` committed."""
        self._kept.committed()
        with self._ulock:
            upto = self._saving_upto
            while self._unsaved and self._unsaved[0][0] <= upto:
                self._unsaved.popleft()
                self.lookups_saved += 1
        self._last_save = time.monotonic()

    def rolled_back(self) -> None:
        """The transaction of the last :meth:`deciding` failed: re-read the scalars next time."""
        with self._lock:
            self._kept.drop()
            self._version = None
            self._sample_saved = None

    def save(self, index) -> None:
        """Save unsaved lookups in a transaction of their own (best effort: a cache
        problem only delays them)."""
        with self._ulock:
            if not self._unsaved:
                return
        c0 = time.thread_time()
        try:
            with index.transaction() as con, self.deciding(con, self._policy.capacity):
                pass
        except Exception as e:  # sqlite3.Error, OSError, Closed: a miss later, never an error
            self.rolled_back()
            logger.debug("cacheaffinity: admission state not saved: %r", e)
            return
        finally:
            spent = time.thread_time() - c0
            with self._ulock:
                self.save_cpu_s += spent
        self.committed()

    def _read_scalars(self, con: sqlite3.Connection) -> None:
        """Adopt the scalars another process saved (one small row), if any did since
        (:attr:`_version` is then theirs); :attr:`_held` read with them (one statement)."""
        rows = dict(
            con.execute("SELECT name, value FROM admission_state UNION ALL SELECT '.' || name, value FROM meta")
        )
        try:
            self._held = (int(rows[".count"]), int(rows[".size"]))
        except (KeyError, TypeError, ValueError):
            pass  # (meta is written by triggers only: as of the last transaction)
        try:
            version = int(rows.get("version", 0))
        except (TypeError, ValueError):
            version = -1  # damaged: the state below is replaced and saved anew
        if version == self._version:
            return
        try:
            self._fresh_from = max(0, int(rows.get("fresh_from", 0)))
        except (TypeError, ValueError):
            self._fresh_from = 0  # the oldest fresh row is then searched from the first row
        try:
            self._due = max(0, int(rows.get("due", 0)))
        except (TypeError, ValueError):
            self._due = 0  # counted again from here (made again later than it could be)
        try:
            self._set_writers(self._rows.writers(rows["writers"]) if "writers" in rows else {})
        except (TypeError, ValueError, AttributeError):
            self._set_writers({})
        row = rows.get("state")
        p = self._policy
        if row is None:
            p.set_scalars({"clock": 0.0, "demand": None, "reuses": [], "sampled": 0})
        else:
            try:
                state = self._rows.decode(row)
                if not isinstance(state, dict) or POLICIES.get(state.get("policy")) is not type(p):
                    raise ValueError(f"a {state.get('policy') if isinstance(state, dict) else '?'} state")
                p.set_scalars(state)
            except (TypeError, ValueError, AttributeError, KeyError) as e:
                self._replace_state(con, e)
                if not con.in_transaction:
                    return  # the next transaction replaces it with the rows' clocks
        self._version = version
        self.reloads += 1

    def _replace_state(self, con: sqlite3.Connection, why: BaseException) -> None:
        if not self._warned:
            logger.info(
                "cacheaffinity: admission state of this cache replaced by a fresh %r one (%s); "
                "entries are kept", self.name, why,
            )  # fmt: skip
            self._warned = True
        fresh = make_policy(self.name, self._policy.capacity)
        self._policy.set_scalars(fresh.scalars())  # type: ignore[attr-defined]
        self._sample_saved = None
        if con.in_transaction:  # the entries' clocks were the old state's: all fresh now
            con.execute("UPDATE entries SET last_used = ?, stale_from = ?, reuse_dist = ?", (stored(0.0), UNSET, UNSET))
            con.execute("DELETE FROM admission_sample")
            con.execute("DELETE FROM admission_due")
            con.execute("DELETE FROM admission_inbox")
            self._fresh_from = 0
            self._due = 0

    def _sync(self, con: sqlite3.Connection) -> None:
        """Inside a write transaction: the scalars, the rows bound, this process's lookups applied."""
        p = self._policy
        table = self._kept.take(con)
        if table is None:
            self._read_scalars(con)
            # rows a fifo process of the node inserted (no lookup clock): fresh as of now
            con.execute("UPDATE entries SET last_used = ? WHERE last_used IS NULL", (stored(p.clock),))
            table = self._bind(con, writing=True)
        else:  # nothing else wrote since this process's last transaction: its scalars, its orders
            p.table, p.sample = table, IndexSample(con)  # type: ignore[assignment]
            self.continued += 1
        saved = self._sample_saved
        if saved is not None and saved[0] == self._version:  # nobody saved since this process
            p.sample.known(*saved[1:])  # type: ignore[attr-defined]
        self._save_at = self.save_every
        p.grace = self.grace()
        with self._ulock:
            batch = list(self._unsaved)
        table.prefetch(batch)
        seed = p.seed
        hashes = [key_hash(item[1], seed) for item in batch]
        p.sample.prefetch(hashes)  # type: ignore[attr-defined]
        for (_, key, size, _, _), h in zip(batch, hashes):
            p.lookup(key, size, h)
        table.flush()
        p.sample.flush()  # type: ignore[attr-defined]
        self._saving_upto = batch[-1][0] if batch else 0

    def grace(self) -> float:
        """Bytes of lookups the node's other recent savers may not have saved yet
        (:attr:`save_every` mean entries each): an entry is stale only beyond it."""
        others = self._others
        count, size = self._held
        if not others or not count:
            return 0.0
        return float(others * self.save_every * size / count)

    def _set_writers(self, writers: dict[str, float]) -> None:
        self._writers = writers
        self._others = sum(1 for w in writers if w != self._token)

    def _save(self, con: sqlite3.Connection) -> None:
        p = self._policy
        version = (self._version or 0) + 1
        rows = [("state", self._rows.encode(p.scalars())), ("version", str(version))]
        # the processes that save here (bounded: recent ones, at most WRITERS_KEPT), written
        # when they change or this one's clock lags (WRITERS_LAG)
        mine = self._writers.get(self._token)
        writers = dict(self._writers)
        writers[self._token] = float(p.clock)
        horizon = p.clock - WRITERS_WITHIN * (p.demand or float("inf"))
        recent = sorted(((c, w) for w, c in writers.items() if c >= horizon), reverse=True)[:WRITERS_KEPT]
        # (with this one listed, the same number listed is the same processes)
        if mine is None or len(recent) != len(self._writers) or (p.demand and p.clock - mine > WRITERS_LAG * p.demand):
            self._set_writers({w: c for c, w in recent})
            rows.append(("writers", json.dumps(self._writers)))
        self._version = version
        sample = p.sample
        self._sample_saved = (version, *sample.saved()) if isinstance(sample, IndexSample) else None
        table = p.table
        if isinstance(table, IndexEntries):
            self._held = table.held()
            if table.fresh_from != self._fresh_from:
                self._fresh_from = table.fresh_from
                rows.append(("fresh_from", str(self._fresh_from)))
            base = self._due if table.due_rebuilt is None else table.due_rebuilt
            due = max(0, base + table.due_added - table.due_dropped)
            table.due_added = table.due_dropped = 0
            table.due_rebuilt = None
            if due > DUE_PER_ROW * self._held[0] + DUE_SLACK:
                due = table.rebuild_due()
            if due != self._due:
                self._due = due
                rows.append(("due", str(due)))
        con.executemany("INSERT OR REPLACE INTO admission_state VALUES (?, ?)", rows)
        if isinstance(table, IndexEntries):
            self._kept.keep(con, table)

    def describe(self) -> dict:
        """``{"policy", "entries", "bytes", "demand", "theta", "reloads", "lookups_saved",
        "save_cpu_s"}`` (as of this process's last transaction)."""
        with self._lock:
            p = self._policy
            return {
                "policy": self.name,
                "entries": self._held[0],
                "bytes": int(self._held[1]),
                "demand": None if p.demand is None else int(p.demand),
                "theta": round(p.theta, 4),
                "reloads": self.reloads,
                "lookups_saved": self.lookups_saved,
                "save_cpu_s": round(self.save_cpu_s, 6),
            }
