"""The SQLite index of a node cache: :class:`Index` (runs in workers and in the CLI).

Owns everything SQLite: a lookup connection per process and one for the background
writer thread (whose transactions may wait for other processes' write lock), the
schema's creation and version (the schema itself and its upgrades: ``schema``), the
``settings`` table and healing.  An older schema is dropped
with its data files (node id kept); a newer one raises :class:`NewerLayout`, untouched.
A damaged index (``quick_check`` at open up to :data:`CHECK_AT_OPEN`,
``SQLITE_CORRUPT``/``SQLITE_NOTADB`` from any statement) is copied to
``columns.sqlite3.corrupt`` and rebuilt in place under
``columns.lock`` from the rows that still read, with SQLite's backup API so that other
processes' connections stay valid.  A fork waits until no thread is inside SQLite
through an ``Index``; the child opens its own connections, never touching the parent's.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import sqlite3
import stat
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from cacheaffinity.exceptions import Closed, NewerLayout, OlderLayout, UntrustedDirectory
from cacheaffinity.worker._directory import INDEX_NAME, LOCK_NAME, NEW_FILE
from cacheaffinity.worker._store.layout import (
    CORRUPT_SUFFIX,
    FILE_NAME,
    LAYOUT_VERSION,
    LEGACY_SETTINGS_NAME,
    blocks,
)
from cacheaffinity.worker._store.schema import (
    MIGRATES_FROM,
    ROW,
    SCHEMA,
    SCHEMA_VERSION,
    has_tables,
    migrate,
)

logger = logging.getLogger("cacheaffinity.worker")

__all__ = ["FileStore", "Index", "corruption", "problem"]

#: Seconds SQLite waits for another process's write transaction.
BUSY_TIMEOUT = 30.0
#: An index up to this size is checked page by page (``quick_check``) at every open; a
#: larger one (a facility node's: 10^6 entries are ~400 MB) only when a statement finds
#: damage, and by ``cacheaffinity cache verify`` (its open must not cost O(entries)).
CHECK_AT_OPEN = 64 * 2**20
#: Bytes the WAL file is truncated to after a checkpoint (``PRAGMA journal_size_limit``),
#: and the WAL pages after which a commit checkpoints (``PRAGMA wal_autocheckpoint``;
#: SQLite's default, 1,000 pages, let the log take 4 MB of a small full disk).  The limit
#: keeps what the saves of a facility node's processes write between two checkpoints that
#: reach the end of the log (each save up to ``SAVE_MOST`` lookups in random order: ~1,100
#: pages, 4.5 MB at 10^6 entries; while another process reads, the log grows past it)
#: instead of truncating the file and growing it again.  At 10^6 entries, saving a
#: random-order lookup with 8 processes cost 21 µs of CPU with an 8 MiB limit, 15 µs with
#: 64 MiB (with 1 process at 1 MiB: ~5% more than at 8 MiB).  A small cache's saves are a
#: few pages, so its log stays small whatever the limit.
WAL_LIMIT = 64 * 2**20
WAL_CHECKPOINT_PAGES = 256
#: Seconds after a rebuild during which a damaged index is only a miss.
HEAL_INTERVAL = 30.0
#: SQLite result codes of a damaged index.
_SQLITE_CORRUPT = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB
_DISK_FULL_CODES = (13,)  # SQLITE_FULL
_READONLY_CODES = (8, 14)  # SQLITE_READONLY, SQLITE_CANTOPEN


def problem(exc: BaseException) -> str:
    """Classify a write failure: ``"full"``, ``"unwritable"`` or ``"other"``."""
    import errno

    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return "full"
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR):
            return "unwritable"
        return "other"
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        text = str(exc).lower()
        if (code is not None and code & 0xFF in _DISK_FULL_CODES) or "disk is full" in text:
            return "full"
        if (code is not None and code & 0xFF in _READONLY_CODES) or "readonly" in text:
            return "unwritable"
    return "other"


def corruption(exc: BaseException) -> bool:
    """Whether ``exc`` says the index file is damaged (not merely busy or full)."""
    if not isinstance(exc, sqlite3.DatabaseError) or isinstance(exc, (NewerLayout, OlderLayout)):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in _SQLITE_CORRUPT:
        return True
    text = str(exc).lower()
    return "malformed" in text or "not a database" in text


class FileStore(Protocol):
    """What an :class:`Index` uses of the cache's data files (``DataFiles``)."""

    uid: int
    shared_gid: int | None

    @property
    def file_mode(self) -> int: ...

    def path(self, name: str) -> str: ...

    def remove(self, names: Iterable[str]) -> int: ...

    def all_names(self) -> Iterator[str]: ...


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


class Index:
    """The SQLite index of one cache directory.

    ``heals``: rebuild a damaged index and drop an old layout (False: leave both as they
    are, the read-only ``cache info``); ``on_rebuilt()`` is called after a rebuild,
    ``on_unhealable(message)`` when a damaged index cannot be rebuilt."""

    def __init__(
        self,
        directory: str,
        files: FileStore,
        *,
        heals: bool = True,
        on_rebuilt: Callable[[], None] = lambda: None,
        on_unhealable: Callable[[str], None] = lambda msg: None,
    ):
        self.directory = directory
        self.path = os.path.join(directory, INDEX_NAME)
        self.files = files
        self.heals = heals
        self._on_rebuilt = on_rebuilt
        self._on_unhealable = on_unhealable
        self.closed = False
        #: The index was found damaged and left as it is (``heals=False``).
        self.damaged = False
        #: The background writer thread (it gets a connection of its own).
        self.writer_thread: threading.Thread | None = None
        self._next_heal = 0.0
        #: Connections of the parent process (a forked child): kept, never used or closed.
        self._inherited: list[sqlite3.Connection] = []
        #: Guards the lookup connection (one statement or transaction at a time).
        self.lock = threading.RLock()
        #: Guards the writer thread's connection.
        self.wlock = threading.RLock()
        self._wcon: sqlite3.Connection | None = None
        self._con: sqlite3.Connection | None = None
        self._pid = os.getpid()
        _OPEN.add(self)

    def reset_after_fork(self) -> None:
        """In a forked child: fresh locks, no writer thread, the parent's connections set aside."""
        self.lock = threading.RLock()
        self.wlock = threading.RLock()
        self._inherited.extend(c for c in (self._con, self._wcon) if c is not None)
        self._con = self._wcon = None
        self._pid = os.getpid()
        self.writer_thread = None

    def writer_started(self, thread: threading.Thread) -> None:
        """``thread`` is the background writer from now on (a connection of its own)."""
        self.close_writer_connection()
        self.writer_thread = thread

    @property
    def uid(self) -> int:
        return self.files.uid

    @property
    def shared_gid(self) -> int | None:
        return self.files.shared_gid

    def _check_file(self) -> None:
        """Refuse an index (or its WAL/shm files) that is a link or someone else's."""
        for suffix in ("", "-wal", "-shm"):
            path = self.path + suffix
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                raise UntrustedDirectory(
                    f"{path} is not a regular file (a link?); the cache never creates one. "
                    f"Remove it (the index is rebuilt)"
                )
            if self.shared_gid is None and st.st_uid != self.uid:
                raise UntrustedDirectory(
                    f"{path} belongs to uid {st.st_uid}, not to uid {self.uid} who runs this "
                    "process; remove it (the index is rebuilt) or use your own directory"
                )

    def _connect(self) -> sqlite3.Connection:
        self._check_file()
        existed = os.path.exists(self.path)
        if not existed:
            self._create_file()
        con = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
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
            # the WAL is truncated to this after a checkpoint (it never keeps a burst's size)
            con.execute(f"PRAGMA journal_size_limit={WAL_LIMIT}")
            con.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
            version = con.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise NewerLayout(
                    f"index {self.path} has schema version {version}; this cacheaffinity "
                    f"reads version {SCHEMA_VERSION} (layout {LAYOUT_VERSION}). Upgrade "
                    f"cacheaffinity on this node, or run `cacheaffinity cache clear "
                    f"{self.directory}` to set the index aside and start empty (the node id "
                    "is kept)"
                )
            if MIGRATES_FROM <= version < SCHEMA_VERSION and self.heals:
                from cacheaffinity.worker._store.rank_tables import rank

                migrate(con, rank)
                version = SCHEMA_VERSION
            if 0 < version < SCHEMA_VERSION or (version == 0 and has_tables(con)):
                raise OlderLayout(f"index {self.path} has schema version {version}")
            if version == 0:
                # Of processes opening a new directory together, the first creates the
                # schema; the others wait for its lock and find it.
                try:
                    con.executescript(
                        f"BEGIN IMMEDIATE;{SCHEMA}"
                        f"INSERT OR IGNORE INTO settings VALUES ('layout', {LAYOUT_VERSION});"
                        f"PRAGMA user_version={SCHEMA_VERSION};COMMIT;"
                    )
                except BaseException:
                    if con.in_transaction:
                        con.execute("ROLLBACK")
                    raise
            if not existed or self.shared_gid is not None:
                self._fix_modes()
        except BaseException:
            con.close()
            raise
        return con

    def _create_file(self) -> None:
        """Create the empty index file with the cache's file mode whatever the umask: SQLite
        gives its ``-wal``/``-shm`` files that mode, and the process umask is never changed
        (other threads create files meanwhile)."""
        try:
            fd = os.open(self.path, NEW_FILE, self.files.file_mode)
        except FileExistsError:  # another process was first: its file, its mode
            return
        try:
            os.fchmod(fd, self.files.file_mode)
        finally:
            os.close(fd)

    def _fix_modes(self) -> None:
        """The index and its WAL/shm files: 0600 (0660 in a shared group)."""
        mode = self.files.file_mode
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                st = os.lstat(self.path + suffix)
                if st.st_uid == self.uid and stat.S_IMODE(st.st_mode) != mode:
                    os.chmod(self.path + suffix, mode)

    def _in_writer(self) -> bool:
        return self.writer_thread is not None and threading.current_thread() is self.writer_thread

    def con_lock(self) -> threading.RLock:
        """The lock of the calling thread's connection."""
        return self.wlock if self._in_writer() else self.lock

    def connection(self) -> sqlite3.Connection:
        """The calling thread's connection (call with :meth:`con_lock` held)."""
        if self.closed:
            raise Closed(f"index {self.path} is closed")
        if self._in_writer():
            if self._wcon is None:
                self._wcon = self._connect()
            return self._wcon
        if self._con is None or self._pid != os.getpid():
            if self._con is not None:
                self._inherited.append(self._con)  # never touched in the child
            self._con = self._connect()
            self._pid = os.getpid()
        return self._con

    def close_writer_connection(self) -> None:
        with self.wlock:
            if self._wcon is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._wcon.close()
            self._wcon = None

    def close(self) -> None:
        with self.lock:
            self.closed = True
            if self._con is not None and self._pid == os.getpid():
                with contextlib.suppress(sqlite3.Error):
                    self._con.close()
            self._con = None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (rolled back on an exception)."""
        with self.con_lock():
            try:
                con = self.connection()
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
                if corruption(e) and self.heals:
                    self.heal(e)
                raise

    def checkpoint(self) -> None:
        """Copy the WAL into the index and truncate it (best effort: readers may hold it)."""
        with self.con_lock():
            with contextlib.suppress(sqlite3.Error, OSError, Closed):
                self.connection().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def query(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self.con_lock():
            try:
                return self.connection().execute(sql, args).fetchall()
            except sqlite3.DatabaseError as e:
                if corruption(e) and self.heals:
                    self.heal(e)
                raise

    def open(self) -> None:
        """Connect and check the index: rebuild it if damaged, drop an older
        layout.  Raises :class:`NewerLayout` for a newer one."""
        try:
            with self.lock:
                con = self.connection()
                if os.path.getsize(self.path) <= CHECK_AT_OPEN:
                    result = con.execute("PRAGMA quick_check(1)").fetchone()
                else:  # the schema and the counters read; damage elsewhere heals when met
                    con.execute("SELECT value FROM meta WHERE name = 'count'").fetchone()
                    result = ("ok",)
            if result is None or result[0] != "ok":
                raise sqlite3.DatabaseError(f"database disk image is malformed: {result}")
        except OlderLayout as e:
            if not self.heals:
                raise
            self.drop_old_layout(e)
        except sqlite3.DatabaseError as e:
            if not corruption(e):
                raise
            if not self.heals:
                self.damaged = True
                raise
            self.heal(e)

    @contextlib.contextmanager
    def locked(self) -> Iterator[int]:
        """Hold ``columns.lock`` (flock) for a rebuild, a drop or a settings write."""
        fd = os.open(
            os.path.join(self.directory, LOCK_NAME),
            os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
            self.files.file_mode,
        )
        try:
            if self.shared_gid is not None and os.fstat(fd).st_uid == self.uid:
                os.fchmod(fd, 0o660)
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)

    def _forget_connection(self) -> None:
        if self._con is not None and self._pid == os.getpid():
            with contextlib.suppress(sqlite3.Error):
                self._con.close()
        self._con = None

    def drop_old_layout(self, why: BaseException) -> None:
        """Delete an older layout's index and data files; create a new index."""
        with self.lock, self.locked():
            self._forget_connection()
            try:
                self.connection()
                return  # another process dropped it while this one waited
            except OlderLayout:
                self._forget_connection()
            removed = self._remove_everything()
            logger.warning(
                "cacheaffinity: cache directory %s was written by an older cacheaffinity (%s); "
                "dropped its %d data files (never read) and started layout version %d; the "
                "node id is kept and the cache fills again from storage",
                self.directory, why, removed, LAYOUT_VERSION,
            )  # fmt: skip
            self.connection()

    def set_aside(self, why: str) -> None:
        """Move an unusable index to ``columns.sqlite3.corrupt``, delete the data files it
        indexed and start a new one (``cache clear``, ``verify --repair``; node id kept)."""
        with self.lock, self.locked():
            self._forget_connection()
            with contextlib.suppress(OSError):
                os.replace(self.path, self.path + CORRUPT_SUFFIX)
            removed = self._remove_everything()
            logger.warning(
                "cacheaffinity: index %s %s; set aside as %s, %d data files deleted, a new "
                "index started (node id kept)",
                self.path, why, self.path + CORRUPT_SUFFIX, removed,
            )  # fmt: skip
            self.connection()

    def _remove_everything(self) -> int:
        for suffix in ("-wal", "-shm", ""):
            _unlink(self.path + suffix)
        _unlink(os.path.join(self.directory, LEGACY_SETTINGS_NAME))
        return self.files.remove(list(self.files.all_names()))

    def settings(self) -> dict[str, int]:
        """``{name: value}`` of the ``settings`` table (``layout``, ``capacity``)."""
        return dict(self.query("SELECT name, value FROM settings"))

    def set_setting(self, name: str, value: int) -> None:
        with self.transaction() as con:
            con.execute("INSERT OR REPLACE INTO settings VALUES (?, ?)", (name, int(value)))

    def adopt_or_set(self, name: str, value: int, force: bool = False) -> tuple[int, bool]:
        """``(value, written)``: the directory's ``name`` setting, or ``value`` written if there is
        none (or ``force``), in one transaction so that processes agree."""
        row = self.query("SELECT value FROM settings WHERE name = ?", (name,))
        if row and not force:
            return int(row[0][0]), False
        with self.transaction() as con:
            row = con.execute("SELECT value FROM settings WHERE name = ?", (name,)).fetchone()
            if row is not None and not force:
                return int(row[0]), False
            con.execute("INSERT OR REPLACE INTO settings VALUES (?, ?)", (name, int(value)))
            return int(value), True

    def replace_setting(self, name: str, value: int) -> int | None:
        """Write the ``name`` setting (the last of concurrent writers wins); returns the value
        it replaced, or None."""
        with self.transaction() as con:
            row = con.execute("SELECT value FROM settings WHERE name = ?", (name,)).fetchone()
            con.execute("INSERT OR REPLACE INTO settings VALUES (?, ?)", (name, int(value)))
        return None if row is None else int(row[0])

    def salvage(self, con: sqlite3.Connection) -> list[tuple]:
        """The rows of a damaged index that can still be read, in FIFO order: a damaged page
        ends a scan, the next starts at a doubling distance past the last id read."""
        rows: list[tuple] = []
        start, jump = -(2**63), 0
        while jump <= 2**40:
            try:
                for row in con.execute(
                    f"SELECT {ROW} FROM entries WHERE id >= ? ORDER BY id", (start + jump,)
                ):
                    rows.append(row)
                    start, jump = row[0] + 1, 0
                return rows
            except sqlite3.Error:
                jump = max(1, 2 * jump)
            if start == -(2**63):
                start = 0
        return rows

    def usable_row(self, row: tuple) -> bool:
        """Whether a salvaged row's data file exists with the recorded size."""
        _, key, _, _, _, name, toc, nbytes, size, checksum, _, writer = row[:12]
        if not (isinstance(key, str) and isinstance(name, str) and FILE_NAME.match(name)):
            return False
        if not (isinstance(nbytes, int) and isinstance(size, int) and size == blocks(nbytes)):
            return False
        if not (isinstance(checksum, bytes) and len(checksum) == 8 and isinstance(toc, str)):
            return False
        try:
            st = os.lstat(self.files.path(name))
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size == nbytes and (
            writer is None or st.st_uid == writer
        )

    def heal(self, exc: BaseException) -> None:
        """Rebuild a damaged index in place, keeping the rows that still read.
        Never raises: an index that cannot be rebuilt calls ``on_unhealable``."""
        with self.lock:
            if self.closed or time.monotonic() < self._next_heal:
                return
            self._next_heal = time.monotonic() + HEAL_INTERVAL
            try:
                self._rebuild(exc)
            except (OSError, sqlite3.Error) as e:
                self._on_unhealable(
                    f"index {self.path} is damaged ({exc}) and could not be rebuilt ({e}); "
                    f"nothing is cached by this process. Run `cacheaffinity cache verify "
                    f"--repair {self.directory}` as the workers' user"
                )

    def _rebuild(self, exc: BaseException) -> None:
        with self.locked():
            self._forget_connection()
            raw = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT, isolation_level=None)
            try:
                try:  # another process may have rebuilt it while this one waited
                    ok = raw.execute("PRAGMA quick_check(1)").fetchone()
                    if ok is not None and ok[0] == "ok":
                        if raw.execute("PRAGMA user_version").fetchone()[0] in (0, SCHEMA_VERSION):
                            return
                except sqlite3.DatabaseError:
                    pass
                with contextlib.suppress(OSError):
                    shutil.copyfile(self.path, self.path + CORRUPT_SUFFIX)
                try:
                    page_size = int(raw.execute("PRAGMA page_size").fetchone()[0])
                except sqlite3.Error:
                    page_size = 4096
                try:
                    settings = dict(raw.execute("SELECT name, value FROM settings").fetchall())
                except sqlite3.Error:
                    settings = {}
                rows = self.salvage(raw)
                kept = [r for r in rows if self.usable_row(r)]
                fresh = sqlite3.connect(":memory:", isolation_level=None)
                try:
                    fresh.execute(f"PRAGMA page_size={page_size}")
                    fresh.executescript(f"BEGIN;{SCHEMA}PRAGMA user_version={SCHEMA_VERSION};COMMIT;")
                    fresh.execute("BEGIN")
                    fresh.executemany(
                        f"INSERT OR IGNORE INTO entries ({ROW}) VALUES ({', '.join('?' * ROW.count(','))}, ?)",
                        kept,
                    )
                    settings["layout"] = LAYOUT_VERSION
                    fresh.executemany(
                        "INSERT OR REPLACE INTO settings VALUES (?, ?)",
                        [(k, int(v)) for k, v in settings.items() if isinstance(v, int)],
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
                            _unlink(self.path + suffix)
                        raw = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT, isolation_level=None)
                        fresh.backup(raw)
                finally:
                    fresh.close()
            finally:
                raw.close()
            self._fix_modes()
            self._on_rebuilt()
            logger.warning(
                "cacheaffinity: index %s was damaged (%s); rebuilt it with %d of %d readable "
                "entries (a copy of the damaged file is %s; node id kept). Columns of the "
                "other entries are read from storage again.",
                self.path, exc, len(kept), len(rows), self.path + CORRUPT_SUFFIX,
            )  # fmt: skip

    def reachable_files(self, lo: str, hi: str) -> set[str]:
        """Data file names the index references in ``[lo, hi)``."""
        return {n for (n,) in self.query("SELECT file FROM entries WHERE file >= ? AND file < ?", (lo, hi))}


#: Every Index of this process (the fork hooks below).
_OPEN: weakref.WeakSet[Index] = weakref.WeakSet()
#: The locks the forking thread holds between ``before`` and ``after_in_parent``.
_HELD: list[threading.RLock] = []


def _before_fork() -> None:
    """Wait until no thread is inside SQLite through an Index, and hold it so."""
    for index in list(_OPEN):
        for lock in (index.wlock, index.lock):  # the writer thread may take lock inside wlock
            lock.acquire()
            _HELD.append(lock)


def _after_fork_in_parent() -> None:
    while _HELD:
        _HELD.pop().release()


def _after_fork_in_child() -> None:
    _HELD.clear()
    for index in list(_OPEN):
        index.reset_after_fork()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)


