"""The node's column store (runs in workers and in the ``cacheaffinity`` CLI).

Split by concern, one owner per piece of state (distributed's ``shuffle/`` and
diskcache's ``Disk``/``Cache`` are the models).  Modules import the sibling
modules they use, never this package:

- :mod:`.layout`: the on-disk format (versions, file names, key grammar);
- :mod:`.protocol`: what every column store offers (:class:`ColumnStore`) and
  :class:`Pack`;
- :mod:`.health`: counters, disabled and closed state, paused writes;
- :mod:`.files`: data files (write, publish, read and verify, orphans);
- :mod:`.index`: the SQLite index (schema, transactions, settings, healing,
  fork safety);
- :mod:`.capacity`: the capacity every process agrees on, the capacity in force
  (fitted to the file system) and eviction;
- :mod:`.admission` and :mod:`.admitter`: the admission policy and its state;
- :mod:`.writer`: writes behind (the background writer thread);
- :mod:`.reads`: the read path (verified reads of plain entries and chunk packs);
- :mod:`.writes`: the write path (checks, queue or store now, one transaction per
  batch, a full disk);
- :mod:`.maintenance`: orphans, verify, repair, info;
- :mod:`.cache`: :class:`ColumnCache`, the facade that composes them;
- :mod:`.front`: :class:`MemoryFront`, the per-chunk memory front of plain entries.
"""

from cacheaffinity.worker._store.cache import ColumnCache
from cacheaffinity.worker._store.front import MemoryFront
from cacheaffinity.worker._directory import DATA_DIR, INDEX_NAME, TMP_DIR
from cacheaffinity.worker._store.layout import BLOCK, LAYOUT_VERSION, SCHEMA_VERSION
from cacheaffinity.worker._store.protocol import ColumnStore, Pack

__all__ = [
    "BLOCK",
    "DATA_DIR",
    "INDEX_NAME",
    "LAYOUT_VERSION",
    "SCHEMA_VERSION",
    "TMP_DIR",
    "ColumnCache",
    "ColumnStore",
    "MemoryFront",
    "Pack",
]
