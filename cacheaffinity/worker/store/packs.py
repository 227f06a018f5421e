"""Chunk packs in a node cache (runs in workers).

A chunk pack holds the columns one chunk task read from storage for its entry
range ``[start, stop)`` of one tree of one file: **one** data file, **one**
index row with the group (file identity and tree) and the range.  A chunk of
any range finds every pack that overlaps it with one index query
(:func:`get_packs`) and reads each with one verified read.  What goes into a
pack, and how coffea's buffers are cut from it, is coffea's side:
:mod:`cacheaffinity.coffea.packs`.

This module owns the store's side: :class:`Pack` (a pack read back),
:func:`pack_item` (a pack checked and made ready for the write path,
:mod:`.writes`) and :func:`get_packs`.  The cache's methods
(:meth:`~.cache.ColumnCache.put_pack`, :meth:`~.cache.ColumnCache.get_packs`,
:meth:`~.cache.ColumnCache.count_served`) are the API.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from cacheaffinity.exceptions import Closed
from cacheaffinity.worker.store.layout import pack_key
from cacheaffinity.worker.store.writes import Item, plain_array

if TYPE_CHECKING:
    from cacheaffinity.worker.store.cache import ColumnCache

__all__ = ["Pack", "get_packs", "pack_item"]


class Pack(NamedTuple):
    """A chunk pack read back: entry range, ``{member: array}`` (views of one buffer)
    and the bytes it takes in the cache (whole blocks; 0 when not known)."""

    start: int
    stop: int
    members: dict
    size: int = 0


def pack_item(grp: str, start: int, stop: int, arrays: dict[str, np.ndarray]) -> Item:
    """The write-path item of a pack (``TypeError`` for names that are not ``str``
    or arrays the store cannot keep)."""
    if not isinstance(grp, str) or not all(isinstance(k, str) for k in arrays):
        raise TypeError("chunk pack group and member names are str")
    arrays = {k: plain_array(k, v) for k, v in arrays.items()}
    return Item(pack_key(grp, start, stop, arrays), grp, int(start), int(stop), arrays)


def get_packs(cache: ColumnCache, grp: str, start: int, stop: int) -> list[Pack]:
    """Every readable pack of ``grp`` overlapping ``[start, stop)``, newest first
    (queued ones first of all; see :meth:`.ColumnCache.get_packs`)."""
    if cache._closed or cache._disabled:
        return []
    out = [
        Pack(it.start, it.stop, it.arrays, it.size)
        for it in cache.writer.pending_items()
        if it.grp == grp and it.start < stop and it.stop > start
    ]
    try:
        rows = cache.index.query(
            "SELECT key, start, stop, size, file, toc, nbytes, checksum, writer FROM entries "
            "WHERE grp = ? AND start < ? AND stop > ? ORDER BY id DESC",
            (grp, int(stop), int(start)),
        )
    except Closed:
        return out
    except (OSError, sqlite3.Error, ValueError) as e:
        cache._read_failed(grp, e)
        return out
    for key, a, b, size, *row in rows:
        members = cache._read(key, tuple(row))
        if members is not None:
            out.append(Pack(int(a), int(b), members, int(size)))
            cache._count(packs_read=1)
            cache.looked_up(key, size)
    return out
