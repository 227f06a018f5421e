"""The on-disk format of a node cache directory, named in one place (imported by every
module that reads or writes it; runs in workers and in the ``cacheaffinity`` CLI).

Layout of a cache directory (entry names defined in ``cacheaffinity.worker._directory``;
other files in it are left alone)::

    node-id             the node's persistent id (``CacheDirectory.node_id``)
    columns.sqlite3     index (SQLite, WAL): one row per data file, FIFO order,
                        plus the ``settings`` every process agrees on
    columns.lock        taken (flock) while a damaged index is rebuilt, an old
                        layout is dropped or the settings are written
    columns/ab/<32 hex> data files: written once, never modified, deleted when evicted
    columns-tmp/        data files being written; renamed into ``columns/`` when complete
    forms/              per-file form documents (:mod:`cacheaffinity.worker._forms`)

A data file is a *pack*: the raw C-order bytes of one or more arrays, each
starting at a multiple of :data:`ALIGN` bytes.  Its index row holds the file
name, the pack's table of contents (``[[member, dtype, shape, offset], ...]``,
JSON), its byte count and the xxh3-64 digest of all its bytes.  Two kinds of
rows:

- a *plain entry* (``ColumnCache[key] = array``): one member named ``""``,
  no group; what coffea's buffer keys use (RNTuple, parquet, other schemas);
- a *chunk pack* (:meth:`ColumnCache.put_pack`): the columns one chunk task read
  from storage for its entry range ``[start, stop)`` of one tree of one file,
  members named by :func:`member` (branch, form digest, part); ``group`` is
  :func:`group` (identity of the file's bytes and tree).  A chunk finds every
  pack that overlaps its range with one index query.

Version history (``LAYOUT_VERSION``; a directory of another version has its
entries dropped when it is opened, never read):

1-2. one entry per coffea buffer key of a chunk's entry range;
3.   one entry per (branch, TTree cluster, part), cluster-aligned;
4.   packs per chunk entry range, one index row and one file per pack
     (this version).
"""

from __future__ import annotations

import re

import xxhash

#: What keys and values mean (see the module docstring).
LAYOUT_VERSION = 4
#: Version of the index schema (``PRAGMA user_version``).  Older schemas belong to
#: older layouts and are dropped; a newer one is refused (never overwritten).
SCHEMA_VERSION = 3

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
    (:attr:`cacheaffinity.coffea._identity.FileIdentity.token`)."""
    return f"{token}/{treepath}"


def member(branch: str, form_digest: str, part: str) -> str:
    """Member name of one part of one branch in a chunk pack.  ``form_digest``
    names the branch's interpretation (dtype, jaggedness), so a branch read
    another way is another member."""
    return f"{branch}/{form_digest}/{part}"


def pack_key(group_name: str, start: int, stop: int, members) -> str:
    """Index key of a chunk pack: the same members of the same range stored
    again replace the older pack."""
    digest = xxhash.xxh3_64_hexdigest("\0".join(sorted(members)).encode())
    return f"{group_name}@{int(start)}-{int(stop)}#{digest}"
