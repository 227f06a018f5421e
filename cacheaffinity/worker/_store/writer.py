"""Writes behind: a background thread stores what tasks hand the cache (runs in workers).

With ``write_queue > 0`` a store only queues the value, so a chunk task never waits
for the disk or SQLite's write lock.  :class:`WriteBehind` gathers items for up to
:data:`WRITE_COALESCE` seconds (at most :data:`WRITE_BATCH`) into one ``write`` call;
queued items are served by reads; an item that would overflow the bound is dropped
(not cached) instead of blocking.  Items must not be modified once queued."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("cacheaffinity.worker")

__all__ = ["DROPPED", "WRITE_BATCH", "WRITE_COALESCE", "WriteBehind"]

#: Items the background writer stores in one index transaction at most.
WRITE_BATCH = 256
#: Seconds a first queued item waits for others to join its batch (not on flush or close).
WRITE_COALESCE = 0.05
#: Stands for an item whose write was dropped (full queue): a miss.
DROPPED = object()


class WriteBehind:
    """The write queue of one cache and its thread: at most ``limit`` bytes; ``write(batch)``
    stores items (in the thread); ``on_thread(thread)`` is called when a thread starts."""

    def __init__(self, limit: int, name: str, write: Callable[[list], None],
                 on_thread: Callable[[threading.Thread], None]):  # fmt: skip
        self.limit = limit
        self._name = name
        self._write = write
        self._on_thread = on_thread
        self.reset()

    def reset(self) -> None:
        """Empty queue, no thread (also in a forked child: the parent's thread is not there)."""
        self.cond = threading.Condition(threading.Lock())
        self._queue: deque = deque()
        #: Items queued or being written, by key.
        self.pending: dict[str, Any] = {}
        self.queued_bytes = 0
        self._writing = 0
        self._stopping = False
        self._flushing = 0
        self._thread: threading.Thread | None = None

    def put(self, key: str, item: Any, nbytes: int) -> bool | None:
        """Queue ``item``.  Returns False if queued, True if dropped (full), None
        if the queue is closed."""
        with self.cond:
            if self._stopping:
                return None
            if self.queued_bytes + nbytes > self.limit and self.queued_bytes > 0:
                # an item larger than the whole queue is still taken when it is empty
                dropped = True
                self.pending[key] = DROPPED
                self._queue.append((key, None, 0))  # removes an older value of key
            else:
                dropped = False
                self.pending[key] = item
                self._queue.append((key, item, nbytes))
                self.queued_bytes += nbytes
            idle = len(self._queue) == 1  # the thread waits only on an empty queue
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._on_thread(self._thread)
                self._thread.start()
            elif idle:
                self.cond.notify_all()
        return dropped

    def pending_item(self, key: str, default: Any) -> Any:
        if not self.pending:
            return default
        with self.cond:
            return self.pending.get(key, default)

    def pending_items(self) -> list:
        """Items queued or being written now (a snapshot)."""
        if not self.pending:
            return []
        with self.cond:
            return [v for v in self.pending.values() if v is not DROPPED]

    def busy(self) -> bool:
        return bool(self._queue or self._writing)

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self._queue and not self._stopping:
                    self.cond.wait()
                if not self._queue:
                    return
                gather = time.monotonic() + WRITE_COALESCE
                while len(self._queue) < WRITE_BATCH and not (self._stopping or self._flushing):
                    left = gather - time.monotonic()
                    if left <= 0:
                        break
                    self.cond.wait(left)
                batch = [self._queue.popleft() for _ in range(min(WRITE_BATCH, len(self._queue)))]
                self._writing += 1
            try:
                self._write(batch)
            except BaseException as e:  # never lose the thread to a bug
                logger.warning("cacheaffinity: background cache write failed: %r", e)
            finally:
                with self.cond:
                    self._writing -= 1
                    for key, item, nbytes in batch:
                        if self.pending.get(key) is (DROPPED if item is None else item):
                            del self.pending[key]
                        self.queued_bytes -= nbytes
                    self.cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued item is stored; True if nothing is left."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            self._flushing += 1
            self.cond.notify_all()  # a thread gathering a batch writes it now
            try:
                while self._queue or self._writing:
                    if self._thread is None or not self._thread.is_alive():
                        break  # no thread (e.g. after fork): nothing will drain it
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self.cond.wait(left)
                return not self._queue and not self._writing
            finally:
                self._flushing -= 1

    def stop(self) -> int:
        """Stop taking items; returns how many queued items are left unwritten."""
        with self.cond:
            self._stopping = True
            left = len(self._queue)
            self._queue.clear()
            self.pending.clear()
            self.cond.notify_all()
        return left
