"""Exceptions of the node store (:mod:`cacheaffinity.worker.store`; runs in workers).

Only :class:`NewerLayout` and :class:`~cacheaffinity.worker.directory.UntrustedDirectory`
reach users (as the reason a cache is disabled, in its one warning and in
``cacheaffinity cache info``); the others are internal: each is turned into a miss
or a skipped write where it is caught.
"""

from __future__ import annotations

from cacheaffinity.worker.directory import UntrustedDirectory

__all__ = ["Closed", "Corrupt", "Lost", "NewerLayout", "OlderLayout", "UntrustedDirectory"]


class Corrupt(Exception):
    """A data file that does not read back as its index row says (a miss; the
    row is removed).  ``kind`` names the damage (``"name"``, ``"size"``,
    ``"link"``, ``"owner"``, ``"checksum"``, ``"toc"``): one warning per kind
    and cache, the rest at debug level."""

    def __init__(self, message: str, kind: str = "other"):
        super().__init__(message)
        self.kind = kind


class Lost(Exception):
    """A temporary removed by another process (as stale) before its rename."""


class Closed(ValueError):
    """The cache was closed (possibly by another thread, during a call)."""


class OlderLayout(Exception):
    """The index was written by an older layout: its entries are dropped."""


class NewerLayout(Exception):
    """The index was written by a newer cacheaffinity: refused, never changed.

    The message names both versions and the fix (upgrade, or ``cacheaffinity
    cache clear DIR``, which sets the index aside and keeps the node id)."""
