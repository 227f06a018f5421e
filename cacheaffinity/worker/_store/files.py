"""Data files of a node cache: write, publish, read and verify, tidy (runs in workers).

:class:`DataFiles` knows file names, temporaries, modes and the pack format, never the
index.  A pack is written to ``columns-tmp/<name>.tmp`` and renamed to
``columns/<ab>/<name>``; the caller commits its row after that and deletes replaced or
evicted files after its commit, so a killed writer leaves a stale temporary or an
orphan, never a row pointing at a partial file.  Nothing is fsync'ed: the digest
checked on every read turns torn bytes into a miss.  Files of :data:`MAP_AT_LEAST`
bytes or more may be mapped copy-on-write (no copy, but a file truncated in place by a
foreign process kills the worker with SIGBUS: shared-group caches copy)."""

from __future__ import annotations

import errno
import logging
import math
import mmap
import os
import stat
import time
import uuid
from typing import Any

import numpy as np
import xxhash

from cacheaffinity.exceptions import Corrupt, Lost, UntrustedDirectory
from cacheaffinity.worker._directory import DATA_DIR, NEW_FILE, TMP_DIR, atomic_write, unlink
from cacheaffinity.worker._store.layout import ALIGN, FILE_NAME, aligned

__all__ = ["MAP_AT_LEAST", "NEW_FILE", "DataFiles", "as_bytes", "atomic_write", "unlink"]

logger = logging.getLogger("cacheaffinity.worker")

_PAD = bytes(ALIGN)
#: Smaller files are copied even by a mapping reader: a copy costs less there
#: (``benchmarks/cache_read.py``).
MAP_AT_LEAST = 1 << 20


def as_bytes(arr: np.ndarray) -> np.ndarray:
    """A C-contiguous array's data as a flat uint8 view (works for datetimes too)."""
    return arr.reshape(-1).view(np.uint8)


def toc_of(arrays: dict[str, np.ndarray]) -> tuple[list, int, list[str]]:
    """``(toc, nbytes, written)`` of a pack of ``arrays``: ``[[member, dtype, shape, offset],
    ...]``, its byte count and the members whose bytes are written.  A member that is a
    view into another member's bytes is stored once; the others start at multiples of
    :data:`ALIGN`."""
    spans = sorted(
        ((a.ctypes.data, -a.nbytes, i) for i, a in enumerate(arrays.values()) if a.nbytes),
    )
    parent: dict[int, tuple[int, int]] = {}  # index -> (root index, byte offset in it)
    root = end = None
    root_ptr = 0
    for ptr, neg, i in spans:
        if root is not None and ptr + -neg <= end:
            parent[i] = (root, ptr - root_ptr)
        else:
            root, root_ptr, end = i, ptr, ptr + -neg
    names = list(arrays)
    values = list(arrays.values())
    offsets: dict[int, int] = {}
    written: list[str] = []
    offset = 0
    for i, arr in enumerate(values):
        if i in parent:
            continue
        offset = aligned(offset)
        offsets[i] = offset
        written.append(names[i])
        offset += arr.nbytes
    toc = []
    for i, arr in enumerate(values):
        if i in parent:
            r, delta = parent[i]
            if (offsets[r] + delta) % max(arr.dtype.alignment, 1):
                raise ValueError(f"member {names[i]!r} is a misaligned view of {names[r]!r}")
            start = offsets[r] + delta
        else:
            start = offsets[i]
        toc.append([names[i], arr.dtype.str, list(arr.shape), start])
    return toc, offset, written


def members_of(buffer: np.ndarray, toc: Any, nbytes: int) -> dict[str, np.ndarray]:
    """The arrays of a verified pack buffer, as views of it (:class:`Corrupt` if the toc does not fit)."""
    out: dict[str, np.ndarray] = {}
    try:
        for name, dtype_str, shape, offset in toc:
            dtype = np.dtype(dtype_str)
            shape = tuple(shape)
            if (
                not isinstance(name, str)
                or dtype.hasobject
                or dtype.fields is not None
                or len(shape) > 64
                or not all(type(n) is int and n >= 0 for n in shape)
                or type(offset) is not int
                or offset < 0
                or offset % max(dtype.alignment, 1)
            ):
                raise ValueError("not a plain array")
            size = math.prod(shape) * dtype.itemsize
            if offset + size > nbytes:
                raise ValueError("beyond the end of the pack")
            out[name] = buffer[offset : offset + size].view(dtype).reshape(shape)
    except (TypeError, ValueError) as e:
        raise Corrupt(f"unreadable table of contents ({e})", "toc") from None
    return out


class DataFiles:
    """The data files of one cache directory.

    ``uid``: this process's effective uid (files of others are not trusted);
    ``shared_gid``: the group of a shared-group cache, or None; ``mapped``: map files of
    at least :data:`MAP_AT_LEAST` bytes instead of copying them."""

    def __init__(self, directory: str, uid: int, shared_gid: int | None, mapped: bool = False):
        self.directory = directory
        self.mapped = bool(mapped)
        self.data = os.path.join(directory, DATA_DIR)
        self.tmp = os.path.join(directory, TMP_DIR)
        self.uid = uid
        self.shared_gid = shared_gid
        #: Data subdirectory (two hex digits) the next orphan pass starts at.
        self.orphan_cursor = 0

    def maps(self, nbytes: int) -> bool:
        """Whether :meth:`read` maps a file of ``nbytes`` bytes (else copies it)."""
        return self.mapped and nbytes >= MAP_AT_LEAST

    @property
    def file_mode(self) -> int:
        return 0o600 if self.shared_gid is None else 0o660

    def path(self, name: str) -> str:
        return os.path.join(self.data, name[:2], name)

    def mkdir(self, path: str) -> None:
        """Create a directory of the cache (mode 0700, or 2770 in a shared group)."""
        try:
            os.mkdir(path, 0o700 if self.shared_gid is None else 0o770)
        except FileExistsError:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode):
                raise UntrustedDirectory(
                    f"{path} in cache directory {self.directory} is not a directory; "
                    f"remove it (the cache recreates it)"
                ) from None
            return
        if self.shared_gid is not None:
            os.chmod(path, 0o2770)

    def setup(self) -> None:
        """Create ``columns/`` and ``columns-tmp/`` and check that they can be written."""
        self.mkdir(self.data)
        self.mkdir(self.tmp)
        path = os.path.join(self.tmp, f"{uuid.uuid4().hex}.tmp")
        fd = os.open(path, NEW_FILE, 0o600)
        os.close(fd)
        os.unlink(path)

    def write(
        self, arrays: dict[str, np.ndarray], layout: tuple[list, int, list[str]] | None = None
    ) -> tuple[str, list, int, bytes]:
        """Write a pack of C-contiguous ``arrays`` to a new data file, straight from their
        buffers (``layout``: their :func:`toc_of` if the caller has it).  Returns ``(name,
        toc, nbytes, digest)``; the index is not touched."""
        toc, nbytes, written = toc_of(arrays) if layout is None else layout
        where = {entry[0]: entry[3] for entry in toc}
        pieces: list = []
        h = xxhash.xxh3_64()
        offset = 0
        for member in written:
            start, arr = where[member], arrays[member]
            if start > offset:
                pad = memoryview(_PAD)[: start - offset]
                pieces.append(pad)
                h.update(pad)
            view = memoryview(as_bytes(arr))
            pieces.append(view)
            h.update(view)
            offset = start + arr.nbytes
        name = uuid.uuid4().hex
        atomic_write(
            self.path(name),
            pieces,
            # group-readable whatever the umask; only its writer may change it
            chmod=None if self.shared_gid is None else 0o640,
            # in columns-tmp/, where stale temporaries of dead writers are collected
            temporary=os.path.join(self.tmp, name + ".tmp"),
            publish=self._publish,
        )
        return name, toc, nbytes, h.digest()

    def _publish(self, tmp: str, final: str) -> None:
        """Rename a complete temporary to its data file name (creating the subdirectory if needed)."""
        try:
            os.rename(tmp, final)
        except FileNotFoundError:
            if not os.path.exists(tmp):
                if os.path.isdir(self.tmp):
                    raise Lost(f"temporary {tmp} was removed as stale") from None
                raise
            self.mkdir(os.path.dirname(final))
            os.rename(tmp, final)

    def read(self, name: Any, nbytes: int, digest: bytes, writer: int | None) -> np.ndarray | None:
        """The verified bytes of a data file (a uint8 buffer, copied or mapped), or None if it
        is gone.  Raises :class:`Corrupt` if it is not exactly the ``nbytes`` with ``digest``
        of the row, or is a link or someone else's; ``OSError`` for other I/O errors."""
        if not (isinstance(name, str) and FILE_NAME.match(name)):
            raise Corrupt(f"invalid file name {name!r} in the index", "name")
        if not isinstance(nbytes, int) or nbytes < 0:
            raise Corrupt(f"invalid byte count {nbytes!r} in the index", "name")
        try:
            fd = os.open(self.path(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None  # evicted or replaced by another process after the lookup
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise Corrupt("the data file is a symbolic link", "link") from None
            raise
        try:
            st = os.fstat(fd)
            owner = self.uid if writer is None and self.shared_gid is None else writer
            if not stat.S_ISREG(st.st_mode) or (owner is not None and st.st_uid != owner):
                raise Corrupt(
                    f"the data file belongs to uid {st.st_uid}, the entry was written by uid {owner}",
                    "owner",
                )
            if st.st_size > nbytes:
                raise Corrupt(f"file is longer than the {nbytes} bytes in the index", "size")
            if st.st_size < nbytes:
                raise Corrupt(f"file holds {st.st_size} bytes, the index says {nbytes}", "size")
            buffer = self._map(fd, nbytes) if self.maps(nbytes) else None
            if buffer is not None:
                view = memoryview(buffer)
                done = nbytes
            else:
                buffer = np.empty(nbytes, np.uint8)
                view = memoryview(buffer)
                done = 0
                while done < nbytes:
                    n = os.readv(fd, [view[done:]])
                    if not n:
                        break
                    done += n
        finally:
            os.close(fd)
        if done != nbytes:
            raise Corrupt(f"file holds {done} bytes, the index says {nbytes}", "size")
        if xxhash.xxh3_64_digest(view) != digest:
            raise Corrupt("xxh3 checksum mismatch", "checksum")
        return buffer

    def _map(self, fd: int, nbytes: int) -> np.ndarray | None:
        """A copy-on-write mapping of ``nbytes`` of ``fd``, or None if this file
        system cannot map files (then this cache copies from now on, logged once)."""
        try:
            return np.frombuffer(mmap.mmap(fd, nbytes, access=mmap.ACCESS_COPY), np.uint8)
        except (OSError, ValueError) as e:
            self.mapped = False
            logger.warning(
                "cacheaffinity: cannot mmap cache files in %s (%s); reading them into memory "
                "instead (cacheaffinity.worker.read: copy)", self.directory, e,
            )  # fmt: skip
            return None

    def remove(self, names) -> int:
        """Delete the data files ``names`` (after their rows are gone); returns how many."""
        return sum(unlink(self.path(n)) for n in names if isinstance(n, str) and FILE_NAME.match(n))

    def remove_stale_temporaries(self, stale_after: float) -> int:
        """Delete temporaries older than ``stale_after`` seconds (left by dead writers)."""
        removed = 0
        cutoff = time.time() - stale_after
        try:
            it = os.scandir(self.tmp)
        except FileNotFoundError:
            return 0
        with it:
            for entry in it:
                if not entry.name.endswith(".tmp"):
                    continue
                try:
                    if entry.stat(follow_symlinks=False).st_mtime <= cutoff:
                        removed += unlink(entry.path)
                except FileNotFoundError:
                    pass
        return removed

    def orphan_candidates(self, max_files: int, older_than: float):
        """Yield ``(prefix, names)`` per data subdirectory: files older than ``older_than``
        seconds, looking at ``max_files`` at most, from where the previous pass stopped."""
        cutoff = time.time() - older_than
        seen = 0
        for _ in range(256):
            if seen >= max_files:
                break
            prefix = f"{self.orphan_cursor:02x}"
            self.orphan_cursor = (self.orphan_cursor + 1) % 256
            sub = os.path.join(self.data, prefix)
            names = []
            try:
                with os.scandir(sub) as it:
                    for f in it:
                        seen += 1
                        if not FILE_NAME.match(f.name) or not f.name.startswith(prefix):
                            continue
                        try:
                            if f.stat(follow_symlinks=False).st_mtime > cutoff:
                                continue
                        except FileNotFoundError:
                            continue
                        names.append(f.name)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if names:
                yield prefix, names

    def all_names(self):
        """Every data file name in the directory (for ``verify`` and ``clear``)."""
        try:
            subdirs = os.scandir(self.data)
        except FileNotFoundError:
            return
        with subdirs:
            for sub in subdirs:
                if not sub.is_dir(follow_symlinks=False):
                    continue
                with os.scandir(sub.path) as files:
                    for f in files:
                        if FILE_NAME.match(f.name):
                            yield f.name
