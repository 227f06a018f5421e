"""The rank policy's bottom-k sample of looked-up key hashes as the index's
``admission_sample`` table: :class:`IndexSample` (an :class:`~cacheaffinity.worker._store.admitter.Admitter`
binds one to each transaction)."""

from __future__ import annotations

import sqlite3

__all__ = ["IndexSample"]

#: Sample hashes are unsigned 64-bit, SQLite's integers signed: stored shifted by this.
_SHIFT = 2**63


class IndexSample:
    """:class:`~cacheaffinity.worker._store.rank_tables.RankSample` as the ``admission_sample``
    table (at most the sample size of rows), through ``con``: the hashes of a batch of
    lookups read in one query (:meth:`prefetch`), changes written by :meth:`flush`, the
    largest hash read once and followed."""

    _UNKNOWN = object()

    def __init__(self, con: sqlite3.Connection):
        self.con = con
        self._t: dict[int, float | None] = {}  # read or written here (None: not in the sample)
        self._set: set[int] = set()
        self._gone: set[int] = set()
        self._n: int | None = None
        self._max: object = self._UNKNOWN

    def prefetch(self, hashes) -> None:
        todo = [h for h in dict.fromkeys(hashes) if h not in self._t]
        if not todo:
            return
        # a hash above the sample's largest is not in it: only the few below are read
        top = self.largest()
        self._t.update(dict.fromkeys(todo))
        todo = [] if top is None else [h for h in todo if h <= top]
        for i in range(0, len(todo), 500):
            part = todo[i : i + 500]
            for h, t in self.con.execute(
                f"SELECT h, t FROM admission_sample WHERE h IN ({','.join('?' * len(part))})",
                [h - _SHIFT for h in part],
            ):
                self._t[h + _SHIFT] = t

    def known(self, n: int | None, largest: object) -> None:
        """Size and largest hash as :meth:`saved` gave them (the table unchanged since)."""
        self._n, self._max = n, largest

    def saved(self) -> tuple:
        """``(size, largest hash)`` as known here (None / unknown: not read), after :meth:`flush`."""
        self.flush()
        return self._n, self._max

    def __len__(self) -> int:
        if self._n is None:
            self.flush()
            self._n = int(self.con.execute("SELECT count(*) FROM admission_sample").fetchone()[0])
        return self._n

    def get(self, h: int) -> float | None:
        if h not in self._t:
            self.prefetch([h])
        return self._t[h]

    def set(self, h: int, t: float) -> None:
        if self.get(h) is None:
            len(self)
            self._n += 1  # type: ignore[operator]
            if self._max is not self._UNKNOWN and (self._max is None or h > self._max):  # type: ignore[operator]
                self._max = h
        self._t[h] = t
        self._set.add(h)
        self._gone.discard(h)

    def largest(self) -> int | None:
        if self._max is self._UNKNOWN:
            self.flush()
            top = self.con.execute("SELECT max(h) FROM admission_sample").fetchone()[0]
            self._max = None if top is None else top + _SHIFT
        return self._max  # type: ignore[return-value]

    def remove(self, h: int) -> None:
        if self.get(h) is None:
            return
        len(self)
        self._n -= 1  # type: ignore[operator]
        self._t[h] = None
        self._gone.add(h)
        self._set.discard(h)
        if h == self._max:
            self._max = self._UNKNOWN

    def forget_before(self, cut: float) -> None:
        self.flush()
        self.con.execute("DELETE FROM admission_sample WHERE t < ?", (cut,))
        self._t.clear()
        self._n, self._max = None, self._UNKNOWN

    def items(self) -> list[tuple[int, float]]:
        self.flush()
        return [(h + _SHIFT, t) for h, t in self.con.execute("SELECT h, t FROM admission_sample ORDER BY h")]

    def flush(self) -> None:
        if self._gone:
            self.con.executemany("DELETE FROM admission_sample WHERE h = ?", [(h - _SHIFT,) for h in self._gone])
        if self._set:
            self.con.executemany(
                "INSERT OR REPLACE INTO admission_sample VALUES (?, ?)", [(h - _SHIFT, self._t[h]) for h in self._set]
            )
        self._set.clear()
        self._gone.clear()
