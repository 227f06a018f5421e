"""Node-local store of per-file metadata, e.g. NanoEvents base forms (runs in workers).

:class:`FormStore` keeps what a chunk needs to build its events without opening the
file (coffea rebuilds the form per chunk from the file's streamers) as one JSON
document per (file identity, tree, reading options) in ``<cache directory>/forms/``.
A document is returned only if its xxh3-64 checksum and the file identity it was built
from match; anything else is a miss and the document is removed.  Documents are
written atomically, never unpickled, not counted against the column capacity (nor
removed by ``ColumnCache.clear``; at most :data:`MAX_DOCUMENTS`, the oldest removed
first), and every failure is a miss logged once per condition."""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
from typing import Any

import xxhash

from cacheaffinity._logging import LogOnce
from cacheaffinity.worker._directory import FORMS_DIR, atomic_write

logger = logging.getLogger("cacheaffinity.worker")

__all__ = ["FormStore"]

#: Layout version of a stored document; other versions are misses.
LAYOUT = 2
#: Documents a store keeps at most: at tens to hundreds of kB each, 0.1-1 GB.
MAX_DOCUMENTS = 4096


def _checksum(body: str) -> str:
    return xxhash.xxh3_64_hexdigest(body.encode())


class FormStore:
    """JSON documents keyed by (file identity, tree path, reading options) in ``directory/forms``;
    beyond ``max_documents`` (0: no bound) a :meth:`put` removes the oldest down to 7/8 of it.
    ``hits`` and ``misses`` count this object's lookups.
    """

    def __init__(self, directory: str, max_documents: int | None = None):
        self.directory = os.path.join(os.fspath(directory), FORMS_DIR)
        #: Documents kept at most (0: no bound).
        self.max_documents = MAX_DOCUMENTS if max_documents is None else int(max_documents)
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
        except FileNotFoundError:
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
            self._bound()
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

    def _bound(self) -> int:
        """Beyond :attr:`max_documents` documents, remove the oldest (first written)
        down to 7/8 of it; returns how many were removed."""
        limit = self.max_documents
        if limit <= 0:
            return 0
        try:
            names = [n for n in os.listdir(self.directory) if n.endswith(".json")]
        except OSError:
            return 0
        if len(names) <= limit:
            return 0
        aged = []
        for name in names:
            path = os.path.join(self.directory, name)
            try:
                aged.append((os.stat(path).st_mtime_ns, path))
            except OSError:  # removed meanwhile (another process of the node)
                continue
        aged.sort()
        return sum(self._remove(path) for _, path in aged[: len(aged) - (limit - limit // 8)])

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
