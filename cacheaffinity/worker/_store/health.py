"""Counters and health of one node cache: :class:`Health` (runs in workers and in the CLI):
the counters, why the cache cannot be used, paused writes, one warning per condition."""

from __future__ import annotations

import logging
import threading
import time

from cacheaffinity._logging import LogOnce
from cacheaffinity.exceptions import Closed

__all__ = ["COUNTERS", "Health"]

logger = logging.getLogger("cacheaffinity.worker")

#: The counters of ``ColumnCache.stats()``.
COUNTERS = (
    "hits", "misses", "bytes_served", "bytes_written", "writes", "evictions",
    "bytes_evicted", "errors", "corrupt", "skipped", "temporaries_removed",
    "orphans_removed", "index_rebuilt", "dropped", "packs_read", "packs_written", "bytes_read",
    "bytes_mapped", "not_admitted",
)  # fmt: skip


class Health:
    """Counters and usability of one cache (thread-safe); ``directory`` is named in messages."""

    def __init__(self, directory: str):
        self.directory = directory
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNTERS, 0)
        #: Each problem logged once per cache (then at debug level).
        self.warn_once = LogOnce(logger)
        #: Why the cache cannot be used (None: usable).
        self.disabled: str | None = None
        #: After close, reads miss, writes do nothing, the rest raises ``Closed``.
        self.closed = False
        self._pause_until = 0.0

    def reset_after_fork(self) -> None:
        """A fresh lock in a forked child (a thread of the parent may have held it)."""
        self._lock = threading.Lock()

    def count(self, **deltas: int) -> None:
        """Add ``deltas`` to the counters named."""
        with self._lock:
            for name, delta in deltas.items():
                self._counts[name] += delta

    def counts(self) -> dict[str, int]:
        """A copy of the counters."""
        with self._lock:
            return dict(self._counts)

    @property
    def usable(self) -> bool:
        """Neither closed nor disabled."""
        return not (self.closed or self.disabled)

    def check_open(self) -> None:
        """Raise :class:`Closed` after :attr:`closed` was set."""
        if self.closed:
            raise Closed(f"cache {self.directory} is closed")

    def pause_writes(self, seconds: float) -> None:
        """Refuse writes for ``seconds`` (a full disk)."""
        self._pause_until = time.monotonic() + seconds

    def writes_paused(self) -> bool:
        """Whether writes pause now (:meth:`pause_writes`)."""
        return time.monotonic() < self._pause_until
