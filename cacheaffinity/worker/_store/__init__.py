"""The node's column store (runs in workers and in the ``cacheaffinity`` CLI).

One module per concern, each the owner of its state: ``layout`` (on-disk format),
``protocol`` (``ColumnStore``, ``Pack``), ``health``, ``files``, ``index``, ``capacity``,
``admission`` and ``admitter``, ``writer``, ``reads``, ``writes``, ``maintenance``,
``cache`` (``ColumnCache``, the facade) and ``front`` (``MemoryFront``).  Modules
import their siblings, never this package."""

from cacheaffinity.worker._store.cache import ColumnCache
from cacheaffinity.worker._store.front import MemoryFront
from cacheaffinity.worker._directory import DATA_DIR, INDEX_NAME, TMP_DIR
from cacheaffinity.worker._store.layout import BLOCK, LAYOUT_VERSION
from cacheaffinity.worker._store.schema import SCHEMA_VERSION
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
