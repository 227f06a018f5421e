"""Logging once per condition: the project's one policy for repeated problems (any process).

A cache problem is a miss plus one log line per *condition*, not per file or chunk: the first
occurrence at its level (WARNING by default), later ones at DEBUG. Imports nothing of the project.
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

    A module-level object logs once per process, an attribute once per object (each
    ``ColumnCache``, each ``FormStore``). Thread-safe; the lock is replaced in a forked child.
    Conditions are kept for the object's lifetime: keep them few (an error class, never a file).
    """

    def __init__(self, logger: logging.Logger):
        self.logger = logger
        self.seen: set[str] = set()
        self._lock = threading.Lock()
        _INSTANCES.add(self)

    def __call__(self, condition: str, msg: str, *args: Any, level: int = logging.WARNING) -> bool:
        """Log ``msg % args`` at ``level`` if ``condition`` is new, else at DEBUG; True if new."""
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
