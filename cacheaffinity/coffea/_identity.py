"""Identity of a file's bytes and of a coffea chunk (runs in the client and in workers).

A column cache entry must never outlive the bytes it came from, and a chunk must
be placed by what it reads.  This module defines

- :class:`FileIdentity`: what proves a file's bytes unchanged, as storage offers
  it: the size plus a checksum when the storage reports one without reading the
  file (an S3/HTTP ``ETag``, a ``checksum`` field), else the modification time;
  plus what the file says about itself (the ROOT file UUID; for parquet a digest
  of the footer, which holds the schema, row-group offsets, sizes and
  statistics);
- :func:`file_identity`: the :class:`FileIdentity` of a path or URL, now
  (``os.stat`` for local files, ``fsspec`` ``info`` for URLs such as
  ``root://``); :class:`IdentityUnavailable` when storage cannot tell;
- :func:`chunk_identity`: the placement identity of a coffea work item,
  ``<file uuid>.<stamp>/<tree>/s<S>:<stripe>``;
- :func:`default_stripe_entries`: the stripe size ``S`` used when
  ``cacheaffinity.client.stripe-entries`` is null (the default).

Nothing here imports coffea: work items are read by attribute.

Notes
-----
The identity is taken again for every run (client: once per file and run;
worker: once per chunk), never kept across runs: a file replaced in place
between two runs of one client session has a new size or modification time
(or checksum), hence new chunk identities and new cache keys.  A replacement
that keeps size *and* modification time to the nanosecond *and* the ROOT UUID
is not detected; for parquet the footer digest covers that case too.

One digest function, two names: :attr:`FileIdentity.token` (all three parts:
the cache-key prefix, taken by workers after reading the file's UUID or footer)
and :attr:`FileIdentity.stamp_token` (size and stamp only: the placement
identity's stamp, taken by the client from storage metadata without opening the
file).  They differ on purpose: the client must not open every file of a run,
and a cache key must cover what the file says about itself.
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

#: fsspec ``info`` fields that carry a content checksum reported by the storage.
CHECKSUM_FIELDS = ("checksum", "ETag", "etag", "md5", "md5Hash", "crc32c", "sha256")
#: fsspec ``info`` fields that carry a modification time.
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
        What the file says about itself: the ROOT UUID, a parquet footer
        digest, or ``""`` if not read.
    """

    size: int
    stamp: str
    content: str = ""

    def with_content(self, content: str) -> FileIdentity:
        return FileIdentity(self.size, self.stamp, content)

    @property
    def token(self) -> str:
        """A short hex digest of all three parts: the cache-key prefix (workers).

        The column cache, the chunk packs and the stored forms are keyed by it,
        so an entry never outlives the bytes it came from; workers take it with
        the ``content`` read from the file (:func:`cacheaffinity.coffea._work`).
        """
        return _token(self.content, self.size, self.stamp)

    @property
    def stamp_token(self) -> str:
        """The digest of ``size`` and ``stamp`` only: the placement identity's
        stamp part (client, :func:`chunk_identity`).

        Storage metadata alone, so the client takes it for every file of a run
        without opening one; the file's UUID is a readable part of the chunk
        identity beside it.  The same function as :attr:`token` without the
        content (equal to the ``token`` of an identity whose ``content`` is
        ``""``: chunk identities are those of earlier releases).
        """
        return _token("", self.size, self.stamp)

    def as_dict(self) -> dict[str, Any]:
        return {"size": self.size, "stamp": self.stamp, "content": self.content}


def _token(content: str, size: int, stamp: str) -> str:
    """xxh3-64 hex digest of a file's identity parts (:attr:`FileIdentity.token`)."""
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
    IdentityUnavailable
        Storage reports no size, or neither a checksum nor a modification
        time, or no fsspec implementation handles the URL's protocol.
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
    """xxh3-128 digest of a parquet file's footer (metadata + length + magic).

    The footer describes every column chunk (offsets, sizes, encodings,
    statistics) and the schema with its key-value metadata, so two files with
    different data have different footers in practice; the cache key adds
    size and modification time.
    """
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
    """``{path: FileIdentity or None}`` for many files, remote ones in parallel.

    ``None`` where the identity is unavailable (missing file, storage that
    cannot tell): such chunks are placed by UUID only and run uncached.
    """
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


#: ``warn_once(condition, msg, *args)``: ``msg`` at warning level once per process
#: and ``condition`` (at debug level after), for every module of the chunk tasks.
warn_once = LogOnce(logger)


def _uuid_text(fileuuid: Any) -> str:
    if isinstance(fileuuid, (bytes, bytearray)) and len(fileuuid) == 16:
        return str(uuidlib.UUID(bytes=bytes(fileuuid)))
    if fileuuid:
        return str(fileuuid)
    return ""


def stripe_of(start: int, stop: int, stripe_entries: int) -> int:
    """The stripe (``[k*S, (k+1)*S)``, ``S = stripe_entries``) holding most of
    the entries ``[start, stop)``; the lower one on a tie."""
    start, stop = int(start), int(stop)
    if stop <= start:
        return max(start, 0) // stripe_entries
    best, most = start // stripe_entries, -1
    for k in range(start // stripe_entries, (stop - 1) // stripe_entries + 1):
        n = min(stop, (k + 1) * stripe_entries) - max(start, k * stripe_entries)
        if n > most:
            best, most = k, n
    return best


#: Stripes the default stripe size aims for per file (placement balance).
STRIPES_PER_FILE = 4
#: Smallest default stripe (entries).
MIN_STRIPE_ENTRIES = 1_000
#: Largest default stripe (entries): above common chunksizes.
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

    ``S = min(MAX_STRIPE_ENTRIES, max(MIN_STRIPE_ENTRIES, floor125(file_entries /
    STRIPES_PER_FILE)))``, rounded down in the 1-2-5 series (1,000, 2,000, 5,000,
    10,000, ...): files of 800,000 entries or more get 200,000-entry stripes,
    smaller files about :data:`STRIPES_PER_FILE` stripes each, so that a small
    dataset still has several placement units per node.

    ``S`` depends on the file alone: not on the chunksize, the number of
    workers, or which other files a run reads, so every analysis and every
    chunking of a file places its stripes alike, and a node joining or leaving
    moves only the stripes consistent hashing moves.  Round numbers keep stripe
    boundaries on the boundaries of the round chunksizes people use (a chunk
    crossing a stripe boundary caches part of the other stripe's clusters on
    its own node, which a re-chunked run then misses).  A chunk larger than a
    stripe goes to the stripe holding most of its entries.

    Parameters
    ----------
    file_entries : int
        Entries of the file's tree (the executor takes the largest chunk end
        of the run's chunks of that file).
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
        A ``coffea.processor.executor.WorkItem`` (chunk task) or ``FileMeta``
        (preprocessing task), or a tuple whose first element is one.
    identities
        ``{filename: FileIdentity or None}`` already taken for this run (the
        executor passes them); files not in it are looked up now.
    stripe_entries
        Entries per placement stripe, or ``{filename: entries}`` (the executor
        passes :func:`default_stripe_entries` of each file of its run when the
        setting is null); ``None`` (or a file missing from the mapping) reads
        ``cacheaffinity.client.stripe-entries`` (null there:
        :data:`MAX_STRIPE_ENTRIES`).

    Returns
    -------
    str or None
        ``<file uuid>.<stamp token>/<tree>/s<S>:<k>`` for a chunk
        (:func:`cacheaffinity.chunk_id.format_chunk_id`), where ``k``
        is the stripe of ``S`` entries holding most of the chunk's entries
        (:func:`stripe_of`): chunks of any chunksize that fall in one stripe
        get one identity, hence one node, whose cache holds the stripe's
        clusters;
        ``file:<path>.<stamp token>/<tree>`` for preprocessing; the stamp part
        is left out when the storage cannot tell it; ``None`` for anything else.
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
