"""The schema of a node cache's SQLite index (runs in workers and in the CLI): its tables and
indexes, how the admission policy's clocks are stored in its rows (:func:`stored`,
:func:`read`: a row keeps its size), and the in-place upgrades of indexes that earlier
versions made (schema 3, 4 or 5 -> 6, :func:`migrate`).
Connections, healing and the ``settings`` table are ``index.Index``'s."""

from __future__ import annotations

import json
import logging
import math
import sqlite3
from collections.abc import Callable

logger = logging.getLogger("cacheaffinity.worker")

__all__ = [
    "ADMISSION", "MIGRATES_FROM", "POLICY_COLUMNS", "ROW", "SCHEMA", "SCHEMA_VERSION", "UNSET",
    "DUE_TRIGGERS", "FILL_DUE", "OLD_INDEXES", "create_admission", "has_tables", "migrate", "read", "stored",
]  # fmt: skip

#: Index schema version (``PRAGMA user_version``): older ones dropped, newer refused.
SCHEMA_VERSION = 6
#: The oldest schema version upgraded in place (:func:`migrate`, every version from it up to
#: :data:`SCHEMA_VERSION`); older ones are dropped.
MIGRATES_FROM = 3
#: Columns of an index row, in the order :meth:`Index.salvage` returns them.
ROW = (
    "id, key, grp, start, stop, file, toc, nbytes, size, checksum, stored, writer, "
    "rank, last_used, stale_from, reuse_dist"
)
#: The admission policy's columns of a row (worker/_store/admitter.py), added by schema 4.
POLICY_COLUMNS = ("rank", "last_used", "stale_from", "reuse_dist")
#: ``stale_from`` and ``reuse_dist`` of a row not looked up since it was stored (read as
#: none; NULL, which earlier versions stored, is read so too).  Not NULL, and every policy
#: clock stored as an 8-byte REAL (:func:`stored`), so that a row keeps its size from its
#: insert on: SQLite overwrites a cell of the same size in place, writing only the pages
#: whose bytes change, but deletes and inserts again a cell that changes size: its page
#: splits when full (rows are appended to full pages) and a pack row's overflow pages (its
#: table of contents) are all rewritten.
UNSET = -0.5


def stored(value: float, _up=math.nextafter, _inf=math.inf, _big=2.0**52) -> float:
    """A policy clock (``last_used``, ``stale_from``, ``reuse_dist``) as the index stores it:
    a whole value below 2^52 as the next float up (SQLite stores a whole REAL as an integer
    of 0-6 bytes; every other value is a REAL of 8 bytes, or from 2^52 an integer of 8).
    (Three per lookup saved: written for speed, ~2x the plain form's.)"""
    if value.__class__ is not float:
        value = float(value)
    return _up(value, _inf) if value.is_integer() and -_big < value < _big else value


def read(value: float | None, _down=math.nextafter, _inf=-math.inf) -> float | None:
    """A policy clock as :func:`stored` wrote it, back to the value the policy computed
    (None: not set, :data:`UNSET` or NULL)."""
    if value is None or value < 0:
        return None
    if value.__class__ is float and not value.is_integer():
        below = _down(value, _inf)
        if below.is_integer():
            return below
    return value

#: What the admission policy keeps beside the rows: an ordered index on the rows' rank
#: (the highest: one index seek), the rows a ``fifo`` process stored without a clock, the
#: looked-up entries by when they go stale (``admission_due`` and its inbox
#: ``admission_inbox``, see :data:`DUE_TRIGGERS`), its bottom-k sample and its node-wide
#: scalars.  The oldest entry not looked up since it
#: was stored is the first such row by id (see ``IndexEntries.first_fresh``).
ADMISSION = """
CREATE INDEX IF NOT EXISTS entries_rank ON entries(rank);
CREATE INDEX IF NOT EXISTS entries_unclocked ON entries(id) WHERE last_used IS NULL;
CREATE TABLE IF NOT EXISTS admission_due (
    stale_from REAL NOT NULL, id INTEGER NOT NULL, PRIMARY KEY (stale_from, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS admission_inbox (stale_from REAL NOT NULL, id INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS admission_state (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS admission_sample (h INTEGER PRIMARY KEY, t REAL NOT NULL);
"""

#: ``admission_due`` is a log read lazily, like the simulator's heap (``RankEntries``): a
#: row that gets a ``stale_from`` adds ``(stale_from, id)``, and nothing takes the old
#: record out.  A record is valid while its row exists and still holds that ``stale_from``;
#: the others are dropped when a write transaction passes them, or all at once when they
#: outnumber the rows (``IndexEntries``).  An index on ``stale_from`` (``entries_stale``,
#: schema 4) moved a re-looked-up row's entry out of a random place of the index: at 10^6
#: entries that B-tree delete was 2/3 of what saving a lookup in random order cost.
#: These triggers append the record to ``admission_inbox`` (a rowid table: its last page),
#: which the first victim search of a write transaction moves into ``admission_due``, in
#: its order (schema 6): lookups in random order added their records at random places of
#: ``admission_due`` (~5,000 pages at 10^6 records: about one page more per lookup, by
#: count; measured: 1.0-2.7 µs more per lookup than appending, 45,000 records), and a warm run, which
#: evicts nothing, now moves its records once, together.
#: ``admission_due`` made from the rows, one valid record each, in its order (at 10^6 rows
#: 0.7 s, against 2.2 s in row order): the upgrade from schema 4 and ``rebuild_due``.
FILL_DUE = (
    "INSERT OR IGNORE INTO admission_due SELECT stale_from, id FROM entries WHERE stale_from >= 0 "
    "ORDER BY stale_from, id"
)
DUE_TRIGGERS = (
    """CREATE TRIGGER IF NOT EXISTS entries_due_insert AFTER INSERT ON entries
    WHEN NEW.stale_from >= 0 BEGIN
        INSERT INTO admission_inbox VALUES (NEW.stale_from, NEW.id);
    END""",
    """CREATE TRIGGER IF NOT EXISTS entries_due_update AFTER UPDATE OF stale_from ON entries
    WHEN NEW.stale_from >= 0 AND NEW.stale_from IS NOT OLD.stale_from BEGIN
        INSERT INTO admission_inbox VALUES (NEW.stale_from, NEW.id);
    END""",
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,  -- FIFO order, never reused
    key      TEXT NOT NULL UNIQUE,
    grp      TEXT,                               -- chunk packs: file identity/tree
    start    INTEGER,                            -- chunk packs: entry range
    stop     INTEGER,
    file     TEXT NOT NULL,                      -- 32 hex digits
    toc      TEXT NOT NULL,                      -- JSON [[member, dtype, shape, offset], ...]
    nbytes   INTEGER NOT NULL,                   -- bytes of the data file
    size     INTEGER NOT NULL,                   -- nbytes in whole blocks
    checksum BLOB NOT NULL,                      -- xxh3_64 digest of the file (8 bytes)
    stored   REAL NOT NULL,                      -- time.time() of the store
    writer   INTEGER,                            -- uid that wrote the data file
    rank       REAL,  -- admission: xxh3 rank of key in [0, 1)
    last_used  REAL,  -- admission clock (bytes looked up on the node) of the last lookup
    stale_from REAL,  -- admission clock from which it is stale (< 0 or NULL: no lookup since stored)
    reuse_dist REAL   -- bytes looked up between its last two lookups (< 0 or NULL: none yet)
);
CREATE INDEX IF NOT EXISTS entries_file ON entries(file);
CREATE INDEX IF NOT EXISTS entries_grp ON entries(grp, start);
""" + ADMISSION + ";\n".join(DUE_TRIGGERS) + """;
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('size', 0), ('count', 0);
CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TRIGGER IF NOT EXISTS entries_insert AFTER INSERT ON entries BEGIN
    UPDATE meta SET value = value + NEW.size WHERE name = 'size';
    UPDATE meta SET value = value + 1 WHERE name = 'count';
END;
CREATE TRIGGER IF NOT EXISTS entries_delete AFTER DELETE ON entries BEGIN
    UPDATE meta SET value = value - OLD.size WHERE name = 'size';
    UPDATE meta SET value = value - 1 WHERE name = 'count';
END;
"""


def create_admission(con: sqlite3.Connection) -> None:
    """Create what :data:`ADMISSION` and :data:`DUE_TRIGGERS` name that is missing, inside
    the caller's transaction (``executescript`` would commit it)."""
    for statement in ADMISSION.strip().split(";"):
        if statement.strip():
            con.execute(statement)
    for trigger in DUE_TRIGGERS:
        con.execute(trigger)


def migrate(con: sqlite3.Connection, rank: Callable[[str], float]) -> None:
    """Schema 3, 4 or 5 -> :data:`SCHEMA_VERSION` in place, in one transaction (the first process
    to open it; the others find it done).  ``rank`` is ``admission.rank``, passed in: the
    schema imports no policy.  O(entries), once."""
    con.execute("BEGIN IMMEDIATE")
    try:
        version = con.execute("PRAGMA user_version").fetchone()[0]
        if not MIGRATES_FROM <= version < SCHEMA_VERSION:
            con.execute("ROLLBACK")
            return
        if version == 3:
            _from_3(con, rank)
        if version <= 4:
            _from_4(con)
        _from_5(con)
        con.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        con.execute("COMMIT")
    except BaseException:
        if con.in_transaction:
            con.execute("ROLLBACK")
        raise
    logger.info(
        "cacheaffinity: index upgraded from schema %d to %d in place (entries kept)", version, SCHEMA_VERSION
    )


def _from_3(con: sqlite3.Connection, rank: Callable[[str], float]) -> None:
    """Schema 3 -> 4: the admission policy's per-entry metadata (a JSON row per entry in the
    ``admission`` table) and its sample become columns and a table; every row's rank is
    computed with ``rank``."""
    for column in POLICY_COLUMNS:
        con.execute(f"ALTER TABLE entries ADD COLUMN {column} REAL")
    con.executemany(
        "UPDATE entries SET rank = ? WHERE id = ?",
        ((rank(key), i) for i, key in con.execute("SELECT id, key FROM entries").fetchall()),
    )
    tables = {n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    updates = []
    if "admission" in tables:
        for key, meta in con.execute("SELECT key, meta FROM admission").fetchall():
            try:
                used, due, dist = json.loads(meta)
                updates.append((float(used), due, dist, key))
            except (TypeError, ValueError):
                continue
        con.execute("DROP TRIGGER IF EXISTS entries_delete_admission")
        con.execute("DROP TABLE admission")
    con.executemany("UPDATE entries SET last_used = ?, stale_from = ?, reuse_dist = ? WHERE key = ?", updates)
    sample = []
    if "admission_state" in tables:
        row = con.execute("SELECT value FROM admission_state WHERE name = 'state'").fetchone()
        try:
            state = json.loads(row[0]) if row else None
            sample = [(int(h) - 2**63, float(t)) for h, _, t in state.pop("sample", [])]
            con.execute("UPDATE admission_state SET value = ? WHERE name = 'state'", (json.dumps(state),))
        except (TypeError, ValueError, AttributeError):
            pass
    con.execute("CREATE TABLE IF NOT EXISTS admission_sample (h INTEGER PRIMARY KEY, t REAL NOT NULL)")
    con.executemany("INSERT OR REPLACE INTO admission_sample VALUES (?, ?)", sample)


#: Indexes on the rows' policy columns that schema 4 had (dropped by :func:`_from_4`):
#: - ``entries_fresh``, the entries not looked up since stored by last lookup: every first
#:   lookup of an entry moved it out (a B-tree delete at a random place, ~40% of an UPDATE's
#:   cost at 10^6 entries); a row id watermark finds the oldest of them now;
#: - ``entries_due``, the looked-up entries by ``stale_from`` (``WHERE stale_from IS NOT
#:   NULL``), then ``entries_stale`` (``WHERE stale_from >= 0``): every re-lookup moved the
#:   row's entry (see :data:`DUE_TRIGGERS`).
OLD_INDEXES = ("entries_fresh", "entries_due", "entries_stale")


def _from_4(con: sqlite3.Connection) -> None:
    """Schema 4 -> 5: :data:`OLD_INDEXES` dropped, ``admission_due`` made from the rows."""
    for name in OLD_INDEXES:
        con.execute(f"DROP INDEX IF EXISTS {name}")
    create_admission(con)
    con.execute(FILL_DUE)


def _from_5(con: sqlite3.Connection) -> None:
    """Schema 5 -> 6: ``admission_inbox`` created and :data:`DUE_TRIGGERS` append to it
    (schema 5's added to ``admission_due``: dropped and made again)."""
    for name in ("entries_due_insert", "entries_due_update"):
        con.execute(f"DROP TRIGGER IF EXISTS {name}")
    create_admission(con)


def has_tables(con: sqlite3.Connection) -> bool:
    return con.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0] > 0
