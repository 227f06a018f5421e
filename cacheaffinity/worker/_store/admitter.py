"""The node's admission policy inside the store: :class:`Admitter` (workers and the CLI).

One per ``ColumnCache`` running ``rank`` (``fifo`` has none).  Its state lives in the
index beside the rows (``admission_state``: the policy's JSON state and a ``version``;
``admission``: each entry's metadata, deleted with its row by a trigger).  Every insert
transaction runs :meth:`Admitter.deciding`: reload if another process saved or rows
changed, replay this process's unsaved lookups, decide, save; so a crash loses at most
unsaved lookups.  A state that does not parse is replaced by a fresh one."""

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

from cacheaffinity.worker._store.admission import POLICIES, Policy, StableRank, make_policy

__all__ = ["STORE_POLICIES", "UNSAVED", "Admitter", "SAVE_EVERY"]

logger = logging.getLogger("cacheaffinity.worker")

#: Policies the store runs through an :class:`Admitter` (``fifo`` evicts by row id).
STORE_POLICIES = ("rank",)
#: Lookups kept in memory until saved, at most (the oldest are dropped).
UNSAVED = 8192
#: Unsaved lookups are saved once there are this many (by the thread that made the last
#: one), or when older than :data:`SAVE_AFTER` seconds (workers: with each heartbeat).
SAVE_EVERY = 64
SAVE_AFTER = 1.0
#: Processes of the node that saved within this many demands (a run's lookups) count in
#: the grace (see :meth:`Admitter.grace`); at most :data:`WRITERS_KEPT` are remembered.
WRITERS_WITHIN = 2.0
WRITERS_KEPT = 64

_TABLES = (
    "CREATE TABLE IF NOT EXISTS admission (key TEXT PRIMARY KEY, meta TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS admission_state (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TRIGGER IF NOT EXISTS entries_delete_admission AFTER DELETE ON entries BEGIN "
    "DELETE FROM admission WHERE key = OLD.key; END",
)


class Admitter:
    """Owner of a node cache's admission policy ``name`` (one of :data:`STORE_POLICIES`)
    for ``capacity`` bytes (updated by every :meth:`deciding`)."""

    def __init__(self, name: str, capacity: int):
        if name not in STORE_POLICIES:
            known = ", ".join(("fifo", *STORE_POLICIES))
            raise ValueError(f"cacheaffinity.worker.admission={name!r} is not a store policy; use one of {known}")
        self.name = name
        self._lock = threading.RLock()
        self._policy: StableRank = make_policy(name, capacity)  # type: ignore[assignment]
        #: ``admission_state.version`` as this process last read or wrote it (None: never)
        self._version: int | None = None
        self._seq = itertools.count(1)
        #: (sequence number, key, size) of lookups not saved yet
        self._unsaved: deque[tuple[int, str, int]] = deque(maxlen=UNSAVED)
        self._saving_upto = 0
        self._dirty: set[str] = set()
        self._last_save = time.monotonic()
        #: Times the policy was read again from the index.
        self.reloads = 0
        self._warned = False
        #: writer -> the clock at its last save, of the node's caches that save here
        self._writers: dict[str, float] = {}
        self._token = f"{os.getpid()}-{id(self):x}"

    def reset_after_fork(self) -> None:
        """A fresh lock, and the next transaction reloads (a forked child)."""
        self._lock = threading.RLock()
        self._version = None
        self._token = f"{os.getpid()}-{id(self):x}"

    def looked_up(self, key: str, size: int) -> bool:
        """A lookup of ``key`` (``size`` bytes): a hit, or a miss whose value is offered.
        Returns whether :data:`SAVE_EVERY` lookups wait to be saved (the caller saves)."""
        with self._lock:
            if self._policy.lookup(key, size):
                self._dirty.add(key)
            self._unsaved.append((next(self._seq), key, int(size)))
            return len(self._unsaved) >= SAVE_EVERY

    def admits(self, key: str, size: int) -> bool:
        """Whether the policy would store ``key`` now (no index access: this process's
        view; the insert transaction decides)."""
        with self._lock:
            return key in self._policy or self._policy.admit(key, size)

    def save_due(self) -> bool:
        """Whether unsaved lookups should be saved now (many, or old)."""
        with self._lock:
            n = len(self._unsaved)
            return n >= SAVE_EVERY or (n > 0 and time.monotonic() - self._last_save > SAVE_AFTER)

    @contextlib.contextmanager
    def deciding(self, con: sqlite3.Connection, capacity: int) -> Iterator[Admitter]:
        """Inside the caller's write transaction: sync, let it :meth:`place` inserts, save; then
        the caller calls :meth:`committed` or :meth:`rolled_back`."""
        with self._lock:
            self._sync(con)
            self._policy.capacity = capacity
            yield self
            self._save(con)

    def place(self, key: str, size: int) -> list[str] | None:
        """Offer ``key`` (inside :meth:`deciding`): the keys to evict for it, or None
        if it is not admitted.  A held ``key`` (a value replaced) is offered anew."""
        p = self._policy
        p.remove(key)
        victims = p.offer(key, size)
        if victims is not None:
            self._dirty.add(key)
            self._dirty.difference_update(victims)
        return victims

    def committed(self) -> None:
        """The transaction of the last :meth:`deciding` committed."""
        with self._lock:
            upto = self._saving_upto
            while self._unsaved and self._unsaved[0][0] <= upto:
                self._unsaved.popleft()
            self._last_save = time.monotonic()

    def rolled_back(self) -> None:
        """The transaction of the last :meth:`deciding` failed: reload next time."""
        with self._lock:
            self._version = None

    def save(self, index) -> None:
        """Save unsaved lookups in a transaction of their own (best effort: a cache
        problem only delays them)."""
        with self._lock:
            if not self._unsaved and not self._dirty:
                return
        try:
            with index.transaction() as con, self.deciding(con, self._policy.capacity):
                pass
        except Exception as e:  # sqlite3.Error, OSError, Closed: a miss later, never an error
            self.rolled_back()
            logger.debug("cacheaffinity: admission state not saved: %r", e)
            return
        self.committed()

    def _sync(self, con: sqlite3.Connection) -> None:
        for sql in _TABLES:
            con.execute(sql)
        row = con.execute("SELECT value FROM admission_state WHERE name = 'version'").fetchone()
        version = int(row[0]) if row else 0
        row = con.execute("SELECT value FROM admission_state WHERE name = 'writers'").fetchone()
        try:
            writers = json.loads(row[0]) if row else {}
            self._writers = {str(k): float(v) for k, v in writers.items()}
        except (TypeError, ValueError, AttributeError):
            self._writers = {}
        size, count = (
            int(v)
            for (v,) in con.execute("SELECT value FROM meta WHERE name IN ('size', 'count') ORDER BY name DESC")
        )
        p = self._policy
        if version != self._version or size != p.used or count != len(p):
            self._reload(con, version)
        self._policy.grace = self.grace()

    def grace(self) -> float:
        """Bytes of lookups the node's other recent savers may not have saved yet (:data:`SAVE_EVERY`
        mean entries each): an entry is stale only beyond it."""
        p = self._policy
        others = sum(1 for w in self._writers if w != self._token)
        if not others or not len(p):
            return 0.0
        return float(others * SAVE_EVERY * p.used / len(p))

    def _reload(self, con: sqlite3.Connection, version: int) -> None:
        capacity = self._policy.capacity
        row = con.execute("SELECT value FROM admission_state WHERE name = 'state'").fetchone()
        state = None
        if row is not None:
            try:
                state = json.loads(row[0])
                if not isinstance(state, dict) or POLICIES.get(state.get("policy")) is not type(self._policy):
                    raise ValueError(f"a {state.get('policy') if isinstance(state, dict) else '?'} state")
            except (TypeError, ValueError, AttributeError) as e:
                if not self._warned:
                    logger.info(
                        "cacheaffinity: admission state of this cache replaced by a fresh %r "
                        "one (%s); entries are kept", self.name, e,
                    )  # fmt: skip
                    self._warned = True
                state = None
        entries = []
        for key, size, meta in con.execute(
            "SELECT e.key, e.size, a.meta FROM entries e LEFT JOIN admission a ON a.key = e.key ORDER BY e.id"
        ):
            extra: list = []
            if state is not None and meta is not None:
                try:
                    extra = json.loads(meta)
                except ValueError:
                    extra = []
                if not isinstance(extra, list) or len(extra) != 3:
                    extra = []
            entries.append([key, int(size), *extra])
        if state is None:
            fresh: Policy = make_policy(self.name, capacity)
            fresh._restore({}, [[k, s] for k, s, *_ in entries])
            self._policy = fresh  # type: ignore[assignment]
        else:
            state["capacity"] = capacity
            self._policy = Policy.from_state(state, entries)  # type: ignore[assignment]
        self._version = version
        self.reloads += 1
        self._dirty = {e[0] for e in self._policy.entries()} if state is None else set()
        for _, key, size in self._unsaved:  # this process's lookups the index lacks
            if self._policy.lookup(key, size):
                self._dirty.add(key)

    def _save(self, con: sqlite3.Connection) -> None:
        p = self._policy
        rows = []
        for key in self._dirty:
            m = p.meta(key)
            if m is not None:
                rows.append((key, json.dumps(m)))
        con.executemany("INSERT OR REPLACE INTO admission VALUES (?, ?)", rows)
        con.execute(
            "INSERT OR REPLACE INTO admission_state VALUES ('state', ?)",
            (json.dumps(p.state(), separators=(",", ":")),),
        )
        version = (self._version or 0) + 1
        con.execute("INSERT OR REPLACE INTO admission_state VALUES ('version', ?)", (str(version),))
        # the processes that save here (bounded: recent ones, at most WRITERS_KEPT)
        writers = dict(self._writers)
        writers[self._token] = float(p.clock)
        horizon = p.clock - WRITERS_WITHIN * (p.demand or float("inf"))
        recent = sorted(((c, w) for w, c in writers.items() if c >= horizon), reverse=True)[:WRITERS_KEPT]
        self._writers = {w: c for c, w in recent}
        con.execute(
            "INSERT OR REPLACE INTO admission_state VALUES ('writers', ?)", (json.dumps(self._writers),)
        )
        self._version = version
        self._dirty.clear()
        self._saving_upto = self._unsaved[-1][0] if self._unsaved else 0

    def describe(self) -> dict:
        """``{"policy", "entries", "bytes", "demand", "theta", "reloads"}`` (this process's view)."""
        with self._lock:
            p = self._policy
            return {
                "policy": self.name,
                "entries": len(p),
                "bytes": int(p.used),
                "demand": None if p.demand is None else int(p.demand),
                "theta": round(p.theta, 4),
                "reloads": self.reloads,
            }
