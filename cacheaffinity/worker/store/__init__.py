"""The node's column store (runs in workers and in the ``cacheaffinity`` CLI).

Split by concern (distributed's ``shuffle/`` and diskcache's ``Disk``/``Cache``
are the models):

- :mod:`.layout`: the on-disk format (versions, file names, key grammar);
- :mod:`.files`: data files (write, publish, read and verify, orphans);
- :mod:`.index`: the SQLite index (schema, transactions, settings, healing);
- :mod:`.capacity`: the capacity every process agrees on, the capacity in force
  (fitted to the file system) and eviction;
- :mod:`.writes`: the write path (checks, queue or store now, one transaction per
  batch, a full disk);
- :mod:`.writer`: writes behind (the background writer thread);
- :mod:`.packs`: chunk packs (one file and one row per chunk's columns);
- :mod:`.maintenance`: orphans, verify, repair, info;
- :mod:`.cache`: :class:`ColumnCache`, the facade (opens the directory, reads,
  the mapping API, counters);
- :mod:`.front`: :class:`MemoryFront`, the per-chunk memory front of plain entries;
- :mod:`.protocol`: what every store offers, with its defaults.
"""

from cacheaffinity.worker.store.cache import ColumnCache, Pack
from cacheaffinity.worker.store.front import MemoryFront
from cacheaffinity.worker.store.layout import (
    BLOCK,
    DATA_DIR,
    INDEX_NAME,
    LAYOUT_VERSION,
    SCHEMA_VERSION,
    TMP_DIR,
)

__all__ = [
    "BLOCK",
    "DATA_DIR",
    "INDEX_NAME",
    "LAYOUT_VERSION",
    "SCHEMA_VERSION",
    "TMP_DIR",
    "ColumnCache",
    "MemoryFront",
    "Pack",
]
