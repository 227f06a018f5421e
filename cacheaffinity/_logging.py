"""Logging once per condition: the project's one policy for repeated problems (runs anywhere).

Defines :class:`LogOnce`.  A cache problem is a miss plus a log line, never a
failed analysis (STYLE.md), and one line per *condition*, not per file or per
chunk: the first occurrence of a condition is logged at its level (WARNING by
default), every later one at DEBUG.  Imports nothing of the project, so every
part of it may use it.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any

__all__ = ["LogOnce"]


class LogOnce:
    """Log a message at its level the first time its condition occurs, at DEBUG after.

    A module-level object logs once per process (the coffea chunk tasks'
    conditions); an attribute of an object once per that object (each
    :class:`~cacheaffinity.worker._store.ColumnCache`, each
    :class:`~cacheaffinity.worker._forms.FormStore`).

    Parameters
    ----------
    logger : logging.Logger
        Where the lines go.

    Notes
    -----
    Thread-safe; the lock is replaced in a forked child (a thread of the parent
    may have held it at the fork).  Conditions are remembered for the object's
    lifetime: keep them few (an error class, never a file name).
    """

    def __init__(self, logger: logging.Logger):
        self.logger = logger
        #: Conditions logged so far.
        self.seen: set[str] = set()
        self._lock = threading.Lock()
        _INSTANCES.add(self)

    def __call__(self, condition: str, msg: str, *args: Any, level: int = logging.WARNING) -> bool:
        """Log ``msg % args`` at ``level`` if ``condition`` is new, else at DEBUG;
        returns whether it was new."""
        with self._lock:
            first = condition not in self.seen
            self.seen.add(condition)
        self.logger.log(level if first else logging.DEBUG, msg, *args)
        return first


_INSTANCES: weakref.WeakSet[LogOnce] = weakref.WeakSet()


def _reset_locks_after_fork() -> None:
    for log in list(_INSTANCES):
        log._lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_locks_after_fork)
