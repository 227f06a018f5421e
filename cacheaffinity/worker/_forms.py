"""Node-local store of per-file metadata, e.g. NanoEvents base forms (runs in workers).

:class:`FormStore` keeps what a chunk needs to build its events without opening the
file (coffea rebuilds the form per chunk from the file's streamers) as one JSON
document per (file identity, tree, reading options) in ``<cache directory>/forms/``.
A document is returned only if its xxh3-64 checksum and the file identity it was built
from match; anything else is a miss and the document is removed.  Documents are
written atomically, never unpickled, and every failure is a miss logged once per
condition.

Bound: a cap of its own, not the column capacity.  At most :data:`MAX_DOCUMENTS`
documents and :data:`MAX_BYTES` bytes; a :meth:`FormStore.put` beyond either removes
the first written (oldest modification time) down to 7/8 of both.  Why its own cap:
one document serves every chunk of its file, on every stripe, so there is no single
entry of the column index to evict it with; a removed document costs one file open,
which writes it again; and the column capacity stays what the operator set.  Why
first written rather than least recently read: reads never write (a hit is one
``open``, and a shared cache's documents of other users cannot be touched), as for
the column store.  A real NanoAOD document is 0.2-1 MB (650-2,700 branches), so the
byte cap is the one that binds with real forms."""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
import time
from typing import Any

import xxhash

from cacheaffinity._logging import LogOnce
from cacheaffinity.worker._directory import FORMS_DIR, atomic_write

logger = logging.getLogger("cacheaffinity.worker")

__all__ = ["FormStore"]

#: Layout version of a stored document; other versions are misses.
LAYOUT = 2
#: Documents a store keeps at most (one per file, tree and reading options).
MAX_DOCUMENTS = 4096
#: Bytes of documents a store keeps at most: about 1,000-5,000 real NanoAOD forms.
MAX_BYTES = 2**30
#: Seconds after which a temporary file left in ``forms/`` (a writer killed mid-write) is removed.
ORPHAN_SECONDS = 3600


def _checksum(body: str) -> str:
    return xxhash.xxh3_64_hexdigest(body.encode())


class FormStore:
    """JSON documents keyed by (file identity, tree path, reading options) in ``directory/forms``;
    beyond ``max_documents`` documents or ``max_bytes`` bytes (0: no bound) a :meth:`put`
    removes the first written down to 7/8 of both.  ``hits`` and ``misses`` count this
    object's lookups.
    """

    def __init__(self, directory: str, max_documents: int | None = None, max_bytes: int | None = None):
        self.directory = os.path.join(os.fspath(directory), FORMS_DIR)
        #: Documents kept at most (0: no bound).
        self.max_documents = MAX_DOCUMENTS if max_documents is None else int(max_documents)
        #: Bytes of documents kept at most (0: no bound).
        self.max_bytes = MAX_BYTES if max_bytes is None else int(max_bytes)
        #: Documents this object removed to keep the bound.
        self.evicted = 0
        #: Each condition logged once per store (then at debug level).
        self._log_once = LogOnce(logger)
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(file_identity: str, treename: str, options: Any = None) -> str:
        """The file name of the document of ``file_identity`` (changes with the file's bytes), tree and options."""
        token = xxhash.xxh3_128_hexdigest(repr((file_identity, treename, options)).encode())
        return f"{token}.json"

    def _miss(self) -> None:
        with self._lock:
            self.misses += 1

    def get(self, name: str, identity: Any = None) -> dict | None:
        """The document stored under ``name`` (from :meth:`key`) with ``identity`` (None: any), or None."""
        path = os.path.join(self.directory, name)
        try:
            with open(path, encoding="utf-8") as f:
                outer = json.load(f)
        except FileNotFoundError:  # never written, or removed by the bound: rebuilt
            logger.debug("cacheaffinity: no form %s", path)
            self._miss()
            return None
        except (OSError, ValueError) as e:
            self._log_once(
                "unreadable",
                "cacheaffinity: unreadable form %s (%s); removed, rebuilding from the file "
                "(further unreadable forms are logged at debug level)", path, e,
            )  # fmt: skip
            self._remove(path)
            self._miss()
            return None
        problem = self._check(outer, identity)
        if problem is not None:
            level = logging.INFO if problem == "identity" else logging.WARNING
            self._log_once(
                problem,
                "cacheaffinity: form %s: %s mismatch; removed, rebuilding from the file "
                "(further %s mismatches are logged at debug level)", path, problem, problem,
                level=level,
            )  # fmt: skip
            self._remove(path)
            self._miss()
            return None
        with self._lock:
            self.hits += 1
        return outer["doc"]

    @staticmethod
    def _check(outer: Any, identity: Any) -> str | None:
        if not isinstance(outer, dict) or outer.get("layout") != LAYOUT:
            return "layout"
        body = outer.get("body")
        if not isinstance(body, str) or outer.get("checksum") != _checksum(body):
            return "checksum"
        try:
            inner = json.loads(body)
        except ValueError:
            return "checksum"
        if not isinstance(inner, dict) or not isinstance(inner.get("doc"), dict):
            return "layout"
        if identity is not None and inner.get("identity") != identity:
            return "identity"
        outer["doc"] = inner["doc"]
        return None

    def put(self, name: str, doc: dict, identity: Any = None) -> bool:
        """Store ``doc`` (JSON-serialisable) with the file ``identity`` it was
        built from; a failure is logged once per condition, never raised."""
        path = os.path.join(self.directory, name)
        try:
            body = json.dumps({"identity": identity, "doc": doc}, separators=(",", ":"))
            data = json.dumps(
                {"layout": LAYOUT, "checksum": _checksum(body), "body": body},
                separators=(",", ":"),
            )
            os.makedirs(self.directory, exist_ok=True)
            # mode 0o666 less the umask: what open(path, "w") gives
            atomic_write(path, data, mode=0o666)
            self._bound(keep=path)
            return True
        except (OSError, TypeError, ValueError) as e:
            code = getattr(e, "errno", None)
            condition = f"write:{errno.errorcode.get(code, type(e).__name__)}"
            self._log_once(
                condition,
                "cacheaffinity: cannot store file metadata in %s (%s); chunks of such files "
                "reopen them (logged once; further %s failures at debug level)",
                self.directory, e, condition,
            )  # fmt: skip
            return False

    def _scan(self) -> tuple[list[tuple[int, int, str]], list[tuple[int, str]]]:
        """``(documents, temporaries)``: ``(mtime_ns, size, path)`` of each document and
        ``(mtime_ns, path)`` of each temporary file (a write in progress or left by a killed
        writer); files removed meanwhile (another process of the node) are skipped."""
        docs: list[tuple[int, int, str]] = []
        temps: list[tuple[int, str]] = []
        try:
            with os.scandir(self.directory) as it:
                for entry in it:
                    try:
                        if entry.name.endswith(".json"):
                            st = entry.stat(follow_symlinks=False)
                            docs.append((st.st_mtime_ns, st.st_size, entry.path))
                        elif entry.name.endswith(".tmp"):
                            temps.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.path))
                    except OSError:
                        continue
        except OSError:
            pass
        return docs, temps

    def usage(self) -> tuple[int, int]:
        """``(documents, bytes)`` in the store now."""
        docs, _ = self._scan()
        return len(docs), sum(size for _, size, _ in docs)

    def _bound(self, keep: str | None = None) -> int:
        """Beyond :attr:`max_documents` documents or :attr:`max_bytes` bytes, remove the
        first written down to 7/8 of both (never ``keep``, the document just written);
        temporaries older than :data:`ORPHAN_SECONDS` go too.  Returns the documents removed."""
        docs, temps = self._scan()
        too_old = time.time_ns() - ORPHAN_SECONDS * 10**9
        for mtime, path in temps:
            if mtime < too_old:
                self._remove(path)
        count, total = len(docs), sum(size for _, size, _ in docs)
        max_docs, max_bytes = self.max_documents, self.max_bytes
        if not ((max_docs > 0 and count > max_docs) or (max_bytes > 0 and total > max_bytes)):
            return 0
        target_docs = max_docs - max_docs // 8 if max_docs > 0 else count
        target_bytes = max_bytes - max_bytes // 8 if max_bytes > 0 else total
        removed = 0
        for _, size, path in sorted(docs):
            if count <= target_docs and total <= target_bytes:
                break
            if path == keep:
                continue
            if self._remove(path):
                removed += 1
            count -= 1  # gone either way (another process may have removed it)
            total -= size
        with self._lock:
            self.evicted += removed
        if removed:
            self._log_once(
                "bound",
                "cacheaffinity: form store %s beyond its bound (%d documents, %d bytes at most): "
                "removed the %d first written; their files' next chunks open them once "
                "(logged once; later removals at debug level)",
                self.directory, max_docs, max_bytes, removed, level=logging.INFO,
            )  # fmt: skip
        return removed

    def clear(self) -> int:
        """Remove every document; returns how many."""
        n = 0
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return 0
        for name in names:
            n += self._remove(os.path.join(self.directory, name))
        return n

    def __len__(self) -> int:
        try:
            return sum(1 for n in os.listdir(self.directory) if n.endswith(".json"))
        except FileNotFoundError:
            return 0

    @staticmethod
    def _remove(path: str) -> bool:
        try:
            os.unlink(path)
            return True
        except OSError:
            return False
