"""An admission order's rows read ahead inside one write transaction (``admitter.IndexEntries``).

The background writer stores a batch of packs in one transaction, and every insert plans its
victims over three orders of the index rows (stale, fresh, by rank). Opening their cursors
anew for each insert read the same first rows again each time (through the writer at 10^5
packs the plan took ~45 of ~270 µs an insert, ~27 read ahead; timers around it, ad hoc).
Inside a write transaction only that transaction changes the rows, so an order is read a few
rows at a time (:data:`FIRST_READ`, doubling up to :data:`MOST_READ`) and kept in an
:class:`Ahead`: a plan walks the rows kept (:func:`walk`), passing over those the
transaction deleted since, and reads on after the last row read. What the transaction
changes otherwise is the caller's to apply: a row it inserts enters the rank order kept
where the order has been read (``IndexEntries.add``), the fresh order reads on to it;
lookups written, the log made again and the FIFO safety net's deletes (``Admitter.deleted``)
drop what was kept.

A process that inserts one pack per transaction (``write_queue=0``, or a writer's batch of one)
opened the three orders and re-read the node's scalars in every transaction (one process at
10^6 packs, ``benchmarks/kept_table.py``: 414 µs an insert that way, 347 kept, 215 with
``fifo``).  :class:`Kept` carries
the table with its orders read ahead to the next write transaction of the same connection when
nothing else wrote the index in between: no other connection committed (``PRAGMA
data_version``, which SQLite changes for exactly that) and this connection changed no row
outside it (its ``total_changes``); its transaction committed (``Admitter.committed``)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator

from cacheaffinity.worker._store.schema import read

__all__ = ["FIRST_READ", "KEPT_MOST", "MOST_READ", "Ahead", "Kept", "ReadAhead", "walk"]

#: Rows an order's first read takes (a single insert's plan mostly needs one of each, as a
#: stepped cursor reads it: a second row of the stale or rank order is a random page at
#: 10^6 packs); each next read takes twice as many, at most :data:`MOST_READ`.
FIRST_READ = 1
MOST_READ = 64
#: A table is kept for the next transaction while it remembers at most this many keys and
#: ids (rows passed, deleted, found absent: a few per insert); then the next one starts anew.
KEPT_MOST = 4096


class Ahead:
    """One order's rows read so far and not deleted: ``rows`` (``(value, key, row id or
    None for a row this transaction inserted, file, size, ...)``, in the order's order),
    ``last`` (where the next read starts after: the caller's), ``done`` (the last read
    found fewer rows than it asked for).  ``read(ahead, n)`` appends up to ``n`` rows read
    on from ``last`` and returns how many it read from the index (kept or not)."""

    __slots__ = ("rows", "last", "done", "step", "read")

    def __init__(self, read: Callable[[Ahead, int], int]):
        self.rows: list[tuple] = []
        self.last: tuple | int | None = None
        self.done = False
        self.step = FIRST_READ
        self.read = read

    def more(self) -> bool:
        """Read on (False: none left)."""
        if self.done:
            return False
        n = self.step
        self.step = min(2 * n, MOST_READ)
        if self.read(self, n) < n:
            self.done = True
        return True


def walk(ahead: Ahead, valid: Callable[[tuple], bool], passed: Callable[..., str],
         dead: Callable[[tuple], None] | None = None) -> Iterator[tuple]:  # fmt: skip
    """``(value, passed(key, id, file, size))`` of the rows of ``ahead`` in order, reading on
    as the caller steps past the last; a row not ``valid`` (deleted since it was read) is
    dropped, and given to ``dead``."""
    rows = ahead.rows
    i = 0
    while True:
        if i == len(rows):
            if not ahead.more():
                return
            continue
        row = rows[i]
        if not valid(row):
            del rows[i]
            if dead is not None:
                dead(row)
            continue
        i += 1
        yield row[0], passed(row[1], row[2], row[3], row[4])


class Kept:
    """A write transaction's table (``admitter.IndexEntries``), kept for the next write
    transaction of the same connection if nothing else changed the index in between (see the
    module's text): :meth:`take` at its start, :meth:`keep` after its last change,
    :meth:`committed` once it committed, :meth:`drop` if it did not."""

    __slots__ = ("_table", "_mark", "_pending", "_started")

    def __init__(self) -> None:
        self.drop()

    def drop(self) -> None:
        """Nothing kept (a transaction rolled back, a fork)."""
        self._table: ReadAhead | None = None
        self._mark: tuple | None = None
        self._pending: tuple | None = None
        self._started: tuple | None = None

    def take(self, con: sqlite3.Connection) -> ReadAhead | None:
        """Inside a write transaction of ``con``: the table kept, if nothing else changed the
        index since its transaction (else None); either way it is no longer kept."""
        version = con.execute("PRAGMA data_version").fetchone()[0]
        table, mark = self._table, self._mark
        self._table = self._mark = self._pending = None
        self._started = (con, version)
        if table is None or mark != (con, con.total_changes, version):
            return None
        return table

    def keep(self, con: sqlite3.Connection, table: ReadAhead) -> None:
        """After the last change of the transaction that :meth:`take` started (before its
        commit): ``table`` is kept once that transaction's thread says it committed."""
        started = self._started
        self._started = None
        if started is None or started[0] is not con or table.remembered() > KEPT_MOST:
            return
        self._pending = (table, (con, con.total_changes, started[1]), threading.get_ident())

    def committed(self) -> None:
        """The calling thread's transaction committed: what :meth:`keep` was given in it is
        kept (another thread's, which may not commit, is not)."""
        pending = self._pending
        if pending is not None and pending[2] == threading.get_ident():
            self._table, self._mark = pending[:2]
            self._pending = None


class ReadAhead:
    """The three orders of ``admitter.IndexEntries`` read ahead in a write transaction (its
    ``due_order``, ``fresh_order`` and ``rank_order`` there), with what the rows changed by
    the transaction need: :meth:`_valid` passes over the ids the table deleted, ``add``
    places an inserted row, :meth:`reread` drops what was read."""

    con: sqlite3.Connection
    fresh_from: int
    due_dropped: int
    _absent: set[str]
    _seen: dict[str, tuple]
    _pass: Callable[..., str]
    _one: Callable[..., tuple | None]

    def _init_read_ahead(self) -> None:
        #: the ids of the rows deleted in this transaction (passed over), superseded log
        #: records found on the way (deleted when the order is closed)
        self._dead: set[int] = set()
        self._dead_due: list[tuple[float, int]] = []
        self.reread()

    def _due_read_ahead(self) -> Iterator[tuple[float, str]]:
        """:meth:`due_order` in a write transaction: the log read ahead, superseded records
        passed (and those of rows deleted since) deleted once it is closed."""
        if self._due_ahead is None:
            self._due_ahead = Ahead(self._read_due)
        dead = self._dead_due
        try:
            yield from walk(self._due_ahead, self._valid, self._pass, lambda row: dead.append((row[5], row[2])))
        finally:
            if dead:
                self.con.executemany("DELETE FROM admission_due WHERE stale_from = ? AND id = ?", dead)
                self.due_dropped += len(dead)
                dead.clear()

    def _read_due(self, ahead: Ahead, n: int) -> int:
        sql = (
            "SELECT d.stale_from, d.id, e.key, e.stale_from, e.file, e.size FROM admission_due d "
            "LEFT JOIN entries e ON e.id = d.id {}ORDER BY d.stale_from, d.id LIMIT ?"
        )
        last = ahead.last
        rows = self.con.execute(
            sql.format("" if last is None else "WHERE (d.stale_from, d.id) > (?, ?) "),
            (n,) if last is None else (*last, n),  # type: ignore[misc]
        ).fetchall()
        for due, rid, key, now, file, size in rows:
            if now != due:  # the row is gone, or was looked up again since
                self._dead_due.append((due, rid))
            else:
                ahead.rows.append((read(due), key, rid, file, size, due))
        if rows:
            ahead.last = rows[-1][:2]
        return len(rows)

    def _fresh_read_ahead(self) -> Iterator[tuple[float, str]]:
        """:meth:`fresh_order` in a write transaction, read ahead (rows it inserts: read on to)."""
        if self._fresh_ahead is None:
            self._fresh_ahead = Ahead(self._read_fresh)
            self._fresh_ahead.last = self.fresh_from - 1
        ahead = self._fresh_ahead
        first = True
        for row in walk(ahead, self._valid, self._pass):
            if first:
                first = False
                rid = self._seen[row[1]][0]  # as walk passed it
                if rid is not None:
                    self.fresh_from = rid
            yield row
        if first:  # none: past the last row (read once)
            if not self._fresh_topped:
                ahead.last = max(ahead.last, self._one("SELECT max(id) FROM entries")[0] or 0)  # type: ignore[call-overload]
                self._fresh_topped = True
            self.fresh_from = max(self.fresh_from, ahead.last + 1)  # type: ignore[operator]

    def _read_fresh(self, ahead: Ahead, n: int) -> int:
        rows = self.con.execute(
            "SELECT last_used, key, id, file, size FROM entries "
            "WHERE id > ? AND (stale_from IS NULL OR stale_from < 0) ORDER BY id LIMIT ?",
            (ahead.last, n),
        ).fetchall()
        ahead.rows.extend((read(used) or 0.0, key, rid, file, size) for used, key, rid, file, size in rows)
        if rows:
            ahead.last = rows[-1][2]
        return len(rows)

    def _rank_read_ahead(self) -> Iterator[tuple[float, str]]:
        """:meth:`rank_order` in a write transaction, read ahead (rows it inserts: :meth:`add`)."""
        if self._rank_ahead is None:
            self._rank_ahead = Ahead(self._read_rank)
        return walk(self._rank_ahead, self._valid, self._pass)

    def _read_rank(self, ahead: Ahead, n: int) -> int:
        last = ahead.last
        rows = self.con.execute(
            "SELECT rank, key, id, file, size FROM entries {}ORDER BY rank DESC, id DESC LIMIT ?".format(
                "" if last is None else "WHERE (rank, id) < (?, ?) "
            ),
            (n,) if last is None else (*last, n),  # type: ignore[misc]
        ).fetchall()
        ahead.rows.extend(rows)
        if rows:
            ahead.last = (rows[-1][0], rows[-1][2])
        return len(rows)

    def _valid(self, row: tuple) -> bool:
        """A row read ahead is not deleted: its key is not known absent, and its id (None:
        a row this transaction inserted) not deleted (its key may have a new row since)."""
        return row[1] not in self._absent and row[2] not in self._dead

    def remembered(self) -> int:
        """Keys and ids this table remembers beyond its orders' rows (bounded by :class:`Kept`)."""
        return len(self._seen) + len(self._absent) + len(self._dead)

    def reread(self) -> None:
        """Drop the orders read ahead (the caller changed rows other than by this table)."""
        self._due_ahead: Ahead | None = None
        self._fresh_ahead: Ahead | None = None
        self._rank_ahead: Ahead | None = None
        self._fresh_topped = False

    def _added(self, key: str, r: float, size: int) -> None:
        """The caller inserts a row of ``key`` (rank ``r``): placed in the rank order where
        it was read (its id not known yet: None; ties: the newer first); the fresh order
        reads on to it."""
        ahead = self._rank_ahead
        last = None if ahead is None else ahead.last
        if ahead is not None and (ahead.done or (last is not None and r >= last[0])):  # type: ignore[index]
            rows = ahead.rows
            i = next((i for i, row in enumerate(rows) if row[0] <= r), len(rows))
            rows.insert(i, (r, key, None, None, size))
        if self._fresh_ahead is not None:
            self._fresh_ahead.done = False
