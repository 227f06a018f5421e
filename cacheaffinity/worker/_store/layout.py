"""The on-disk format of a node cache directory, named in one place (workers and the CLI).

Layout (entry names in ``cacheaffinity.worker._directory``; other files are left alone)::

    node-id             the node's persistent id
    columns.sqlite3     index (SQLite, WAL): one row per data file, FIFO order; settings
    columns.lock        flock while the index is rebuilt, an old layout dropped or settings written
    columns/ab/<32 hex> data files: written once, never modified, deleted when evicted
    columns-tmp/        data files being written, renamed into columns/ when complete
    forms/              per-file form documents

A data file is a *pack*: the raw C-order bytes of one or more arrays, each at a
multiple of :data:`ALIGN`; its row holds the name, the table of contents (``[[member,
dtype, shape, offset], ...]``, JSON), the byte count and the xxh3-64 digest.  A *plain
entry* has one member named ``""`` and no group; a *chunk pack* holds the columns a
chunk read for ``[start, stop)`` of one tree, members named by :func:`member`, grouped
by :func:`group`.

Versions (:data:`LAYOUT_VERSION`; another version's entries are dropped, never read):
1-2 one entry per coffea buffer key of a chunk's range; 3 one entry per (branch, TTree
cluster, part); 4 one pack per chunk's entry range.
"""

from __future__ import annotations

import re

import xxhash

#: What keys and values mean (the module docstring).
LAYOUT_VERSION = 4

#: Written by layouts 1-3 (settings are in the index since layout 4); removed on upgrade.
LEGACY_SETTINGS_NAME = "settings.json"
#: Where a damaged or unreadable index is set aside (replacing an older one).
CORRUPT_SUFFIX = ".corrupt"

#: Sizes are accounted in whole file-system blocks (a 10-byte array uses 4 KiB).
BLOCK = 4096
#: Members of a pack start at multiples of this many bytes (any dtype is aligned).
ALIGN = 64
#: Data file names: 32 hex digits (a random UUID).
FILE_NAME = re.compile(r"^[0-9a-f]{32}$")
#: Name of the only member of a plain entry.
PLAIN = ""
#: Part names of a cached branch: a flat branch has ``data``, a jagged one
#: ``offsets`` (int64, starting at 0) and ``content``.
FLAT_PARTS = ("data",)
JAGGED_PARTS = ("offsets", "content")


def blocks(nbytes: int) -> int:
    """Bytes a file of ``nbytes`` occupies on disk, in whole blocks."""
    return -(-nbytes // BLOCK) * BLOCK


def aligned(offset: int) -> int:
    """``offset`` rounded up to a multiple of :data:`ALIGN`."""
    return -(-offset // ALIGN) * ALIGN


def group(token: str, treepath: str) -> str:
    """Group of the chunk packs of one tree of one file's bytes
    (``FileIdentity.token``)."""
    return f"{token}/{treepath}"


def member(branch: str, form_digest: str, part: str) -> str:
    """Member name of a branch's part; ``form_digest`` names its interpretation (another is another member)."""
    return f"{branch}/{form_digest}/{part}"


def pack_key(group_name: str, start: int, stop: int, members) -> str:
    """Index key of a chunk pack: the same members of the same range stored again replace it."""
    digest = xxhash.xxh3_64_hexdigest("\0".join(sorted(members)).encode())
    return f"{group_name}@{int(start)}-{int(stop)}#{digest}"
