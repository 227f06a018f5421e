"""Identity of a file's bytes and of a coffea chunk (client and workers).

``FileIdentity`` is what proves a file's bytes unchanged (size; a storage
checksum, else the modification time; the ROOT UUID or parquet footer digest);
``file_identity`` takes it now, ``chunk_identity`` names a work item's
placement stripe, ``default_stripe_entries`` sizes the stripes.  Identities
are taken again in every run, never kept across runs, so a file replaced in
place gets new chunk identities and cache keys.  Imports no coffea (work items
are read by attribute).
"""

from __future__ import annotations

import logging
import os
import stat as statmod
import uuid as uuidlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import xxhash

from cacheaffinity._logging import LogOnce
from cacheaffinity.chunk_id import format_chunk_id
from cacheaffinity.exceptions import IdentityUnavailable
from cacheaffinity.protocol import PREPROCESS_PREFIX

logger = logging.getLogger("cacheaffinity.coffea")

__all__ = [
    "FileIdentity",
    "IdentityUnavailable",
    "chunk_identity",
    "default_stripe_entries",
    "file_identity",
    "file_identities",
    "parquet_footer_digest",
]

CHECKSUM_FIELDS = ("checksum", "ETag", "etag", "md5", "md5Hash", "crc32c", "sha256")
MTIME_FIELDS = ("mtime", "LastModified", "last_modified", "modified", "updated", "mtime_ns")



@dataclass(frozen=True)
class FileIdentity:
    """What proves a file's bytes unchanged.

    Attributes
    ----------
    size : int
        Size in bytes.
    stamp : str
        ``"checksum:<field>:<value>"`` or ``"mtime:<value>"``.
    content : str
        The ROOT UUID, a parquet footer digest, or ``""`` if not read.
    """

    size: int
    stamp: str
    content: str = ""

    def with_content(self, content: str) -> FileIdentity:
        return FileIdentity(self.size, self.stamp, content)

    @property
    def token(self) -> str:
        """Digest of all three parts, the prefix of cache keys, packs and forms (workers)."""
        return _token(self.content, self.size, self.stamp)

    @property
    def stamp_token(self) -> str:
        """Digest of ``size`` and ``stamp`` only (no file opened), the stamp in chunk identities."""
        return _token("", self.size, self.stamp)

    def as_dict(self) -> dict[str, Any]:
        return {"size": self.size, "stamp": self.stamp, "content": self.content}


def _token(content: str, size: int, stamp: str) -> str:
    """xxh3-64 hex digest of a file's identity parts (``FileIdentity.token``)."""
    return xxhash.xxh3_64_hexdigest(f"{content}|{size}|{stamp}".encode())


def _local_path(path: str) -> str | None:
    if "://" not in path:
        return path
    parsed = urlparse(path)
    if parsed.scheme == "file":
        return parsed.path
    return None


def file_identity(path: str, storage_options: dict | None = None) -> FileIdentity:
    """The :class:`FileIdentity` of ``path`` (a local path or an fsspec URL), now.

    Raises
    ------
    FileNotFoundError
        The file does not exist.
    cacheaffinity.exceptions.IdentityUnavailable
        Storage reports no size, no checksum or time, or has no fsspec implementation.
    """
    local = _local_path(path)
    if local is not None:
        st = os.stat(local)
        if not statmod.S_ISREG(st.st_mode):
            raise IdentityUnavailable(f"{path} is not a regular file")
        return FileIdentity(int(st.st_size), f"mtime:{st.st_mtime_ns}")
    try:
        import fsspec.core

        fs, fspath = fsspec.core.url_to_fs(path, **(storage_options or {}))
    except (ImportError, ValueError) as e:
        raise IdentityUnavailable(
            f"no fsspec file system for {path!r} ({e}); for root:// install fsspec-xrootd"
        ) from e
    info = fs.info(fspath)
    size = info.get("size")
    if size is None:
        raise IdentityUnavailable(f"storage reports no size for {path}")
    for field in CHECKSUM_FIELDS:
        if info.get(field):
            return FileIdentity(int(size), f"checksum:{field}:{info[field]}")
    for field in MTIME_FIELDS:
        if info.get(field) is not None:
            return FileIdentity(int(size), f"mtime:{info[field]}")
    raise IdentityUnavailable(
        f"storage reports neither a checksum nor a modification time for {path}"
    )


def parquet_footer_digest(path: str, storage_options: dict | None = None) -> str:
    """xxh3-128 digest of a parquet file's footer (metadata + length + magic)."""
    local = _local_path(path)
    if local is not None:
        f = open(local, "rb")
    else:
        import fsspec

        f = fsspec.open(path, "rb", **(storage_options or {})).open()
    with f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size < 12:
            raise IdentityUnavailable(f"{path} is too small to be parquet")
        f.seek(size - 8)
        tail = f.read(8)
        if tail[4:] != b"PAR1":
            raise IdentityUnavailable(f"{path} has no parquet footer")
        length = int.from_bytes(tail[:4], "little")
        if length + 12 > size:
            raise IdentityUnavailable(f"{path} has a truncated parquet footer")
        f.seek(size - 8 - length)
        footer = f.read(length)
    return xxhash.xxh3_128_hexdigest(footer + tail)


def file_identities(paths, storage_options: dict | None = None, threads: int = 16) -> dict:
    """``{path: FileIdentity or None (unavailable)}`` for many files, remote ones in parallel."""
    paths = list(dict.fromkeys(paths))

    def one(p):
        try:
            return file_identity(p, storage_options)
        except OSError:
            return None
        except Exception as e:  # a storage client failing oddly: placement only
            logger.debug("cacheaffinity: no identity for %s: %r", p, e)
            return None

    remote = [p for p in paths if _local_path(p) is None]
    out = {p: one(p) for p in paths if _local_path(p) is not None}
    if remote:
        with ThreadPoolExecutor(min(threads, len(remote))) as pool:
            out.update(zip(remote, pool.map(one, remote)))
    return out


#: ``warn_once(condition, msg, *args)``: a warning once per process and condition.
warn_once = LogOnce(logger)


def _uuid_text(fileuuid: Any) -> str:
    if isinstance(fileuuid, (bytes, bytearray)) and len(fileuuid) == 16:
        return str(uuidlib.UUID(bytes=bytes(fileuuid)))
    if fileuuid:
        return str(fileuuid)
    return ""


def stripe_of(start: int, stop: int, stripe_entries: int) -> int:
    """The stripe ``k`` (entries ``[k*S, (k+1)*S)``) holding most of ``[start, stop)``; lower on a tie."""
    start, stop = int(start), int(stop)
    if stop <= start:
        return max(start, 0) // stripe_entries
    best, most = start // stripe_entries, -1
    for k in range(start // stripe_entries, (stop - 1) // stripe_entries + 1):
        n = min(stop, (k + 1) * stripe_entries) - max(start, k * stripe_entries)
        if n > most:
            best, most = k, n
    return best


STRIPES_PER_FILE = 4
MIN_STRIPE_ENTRIES = 1_000
MAX_STRIPE_ENTRIES = 200_000


def _round_steps(n: int) -> list[int]:
    """The 1-2-5 series (1, 2, 5, 10, 20, 50, ...) up to beyond ``n``."""
    out, k = [], 1
    while True:
        for m in (1, 2, 5):
            out.append(m * k)
            if m * k >= n:
                return out
        k *= 10


def _round_floor(n: int) -> int:
    """Largest 1-2-5 number <= ``n`` (at least 1)."""
    n = max(int(n), 1)
    return max(x for x in _round_steps(n) if x <= n)


def _round_ceil(n: int) -> int:
    """Smallest 1-2-5 number >= ``n``."""
    return _round_steps(max(int(n), 1))[-1]


def default_stripe_entries(file_entries: int) -> int:
    """Entries per placement stripe of a file when ``client.stripe-entries`` is null.

    ``file_entries / STRIPES_PER_FILE`` rounded down in the 1-2-5 series, clipped to
    [``MIN_STRIPE_ENTRIES``, ``MAX_STRIPE_ENTRIES``]: the file alone decides it.
    """
    per_file = _round_floor(max(int(file_entries), 1) // STRIPES_PER_FILE)
    return int(min(MAX_STRIPE_ENTRIES, max(MIN_STRIPE_ENTRIES, per_file)))


def chunk_identity(
    item: Any, identities: dict | None = None, stripe_entries: int | dict | None = None
) -> str | None:
    """The placement identity of a coffea work item (or ``(item, heavy)`` pair).

    Parameters
    ----------
    item
        A coffea ``WorkItem`` or ``FileMeta``, or a tuple whose first element is one.
    identities
        ``{filename: FileIdentity or None}`` already taken; others are taken now.
    stripe_entries
        Entries per stripe, or ``{filename: entries}``; ``None`` (or a file not
        in the mapping) reads ``cacheaffinity.client.stripe-entries`` (null:
        ``MAX_STRIPE_ENTRIES``).

    Returns
    -------
    str or None
        ``<file uuid>.<stamp token>/<tree>/s<S>:<k>`` for a chunk (``k``: the
        stripe holding most of its entries, so every chunking of a stripe gets
        one node), ``file:<path>.<stamp token>/<tree>`` for preprocessing (no
        stamp where storage cannot tell one), ``None`` for anything else.
    """
    if isinstance(item, tuple) and item:
        item = item[0]
    filename = getattr(item, "filename", None)
    treename = getattr(item, "treename", None)
    if not isinstance(filename, str):
        return None
    if identities is not None and filename in identities:
        ident = identities[filename]
    else:
        ident = file_identities([filename]).get(filename)
    stamp = f".{ident.stamp_token}" if ident is not None else ""
    if hasattr(item, "entrystart") and hasattr(item, "fileuuid"):
        file_id = _uuid_text(item.fileuuid) or filename
        if isinstance(stripe_entries, dict):
            stripe_entries = stripe_entries.get(filename)
        if stripe_entries is None:
            from cacheaffinity import config

            configured = config.get("client.stripe-entries")
            stripe_entries = MAX_STRIPE_ENTRIES if configured is None else configured
        if isinstance(stripe_entries, bool) or not isinstance(stripe_entries, int) or stripe_entries < 1:
            raise ValueError(
                f"cacheaffinity.client.stripe-entries={stripe_entries!r} must be an integer "
                ">= 1 (entries per placement stripe), e.g. 200000"
            )
        k = stripe_of(item.entrystart, item.entrystop, stripe_entries)
        return format_chunk_id(f"{file_id}{stamp}", str(treename), stripe_entries, k)
    if hasattr(item, "metadata") and hasattr(item, "dataset"):
        return f"{PREPROCESS_PREFIX}{filename}{stamp}/{treename}"
    return None
