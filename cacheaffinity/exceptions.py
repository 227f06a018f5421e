"""Every exception cacheaffinity raises (any process); all derive from :class:`CacheAffinityError`
and from the built-in exception a caller would catch without knowing cacheaffinity.

Users meet :class:`InvalidSetting`, :class:`UntrustedDirectory` and :class:`ReadOnlyDirectory`
(the worker's cache is disabled with one warning) and :class:`NewerLayout`; the others become a
cache miss or a skipped write inside the worker's store.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CacheAffinityError",
    "Closed",
    "Corrupt",
    "IdentityUnavailable",
    "InvalidSetting",
    "Lost",
    "NewerLayout",
    "OlderLayout",
    "ReadOnlyDirectory",
    "SettingProblem",
    "UntrustedDirectory",
]


class CacheAffinityError(Exception):
    """Base of cacheaffinity's exceptions."""


@dataclass(frozen=True)
class SettingProblem:
    """One invalid value: ``cacheaffinity.<key>`` is ``value``, which ``reason`` (e.g. "must be
    one of rank, fifo"); ``example``: a valid value to copy, or None; ``argument``: the keyword
    argument or option the value came from, None for the Dask config."""

    key: str
    value: Any
    reason: str
    example: Any = None
    argument: str | None = None

    @property
    def environment_variable(self) -> str:
        return "DASK_CACHEAFFINITY__" + self.key.upper().replace(".", "__").replace("-", "_")

    def __str__(self) -> str:
        if self.argument is None:
            line = f"cacheaffinity.{self.key}={self.value!r} {self.reason}"
        else:
            line = f"{self.argument}={self.value!r} (cacheaffinity.{self.key}) {self.reason}"
        if self.example is not None:
            line += (
                f'; e.g. "cacheaffinity.{self.key}: {self.example}" in a Dask config file, '
                f'or {self.environment_variable}="{self.example}"'
            )
        return line


class InvalidSetting(CacheAffinityError, ValueError):
    """Settings that are not valid, each a :class:`SettingProblem`; ``str()`` is one line (the
    prefix and :attr:`detail`); ``key``, ``value`` and ``example`` are the first problem's."""

    PREFIX = "invalid cacheaffinity setting: "

    def __init__(self, problems: list[SettingProblem] | SettingProblem):
        self.problems: tuple[SettingProblem, ...] = (
            (problems,) if isinstance(problems, SettingProblem) else tuple(problems)
        )
        if not self.problems:
            raise TypeError("InvalidSetting needs at least one problem")
        super().__init__(self.PREFIX + self.detail)

    @property
    def detail(self) -> str:
        """The problems, without the prefix (for an option's own error line)."""
        return "; ".join(str(p) for p in self.problems)

    @property
    def key(self) -> str:
        return self.problems[0].key

    @property
    def value(self) -> Any:
        return self.problems[0].value

    @property
    def example(self) -> Any:
        return self.problems[0].example


class UntrustedDirectory(CacheAffinityError, PermissionError):
    """A cache directory others could have written: not used (the message says what to do)."""


class ReadOnlyDirectory(CacheAffinityError, OSError):
    """A cache directory on a read-only file system (``errno`` ``EROFS``): a worker
    cannot cache in it, whatever its mode says (a read-only tmpfs shows mode 1777)."""

    def __init__(self, path: str):
        super().__init__(
            errno.EROFS,
            f"cache directory {path} is on a read-only file system; give a writable "
            "node-local directory with --cache-directory (or set "
            "cacheaffinity.worker.directory)",
        )
        self.filename = path

    def __str__(self) -> str:
        return self.strerror


class Corrupt(CacheAffinityError):
    """A data file that does not read back as its index row says (a miss; the row is removed);
    ``kind`` names the damage (``"size"``, ``"checksum"``, ``"toc"`` ...): one warning per kind."""

    def __init__(self, message: str, kind: str = "other"):
        super().__init__(message)
        self.kind = kind


class Lost(CacheAffinityError):
    """A temporary removed by another process (as stale) before its rename."""


class Closed(CacheAffinityError, ValueError):
    """The cache was closed (possibly by another thread, during a call)."""


class OlderLayout(CacheAffinityError):
    """The index was written by an older layout: its entries are dropped."""


class NewerLayout(CacheAffinityError):
    """The index was written by a newer cacheaffinity: refused, never changed (the message
    names both versions and the fix: upgrade, or ``cacheaffinity cache clear DIR``)."""


class IdentityUnavailable(CacheAffinityError, OSError):
    """Storage cannot prove a file's bytes unchanged (no size, or neither a
    modification time nor a checksum); the file is then read uncached."""
