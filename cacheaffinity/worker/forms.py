"""Node-local store of per-file metadata: NanoEvents base forms (runs in workers).

coffea rebuilds the NanoEvents form of a file for every chunk, which reads the
file's streamers and branch list from storage (about 1.4 s per chunk on a real
1500-branch NanoAOD file).  :class:`FormStore` keeps that form, and what else a
chunk needs to build its events without opening the file, as one JSON document
per (file UUID, tree, reading options) in ``<cache directory>/forms/``.

Notes
-----
JSON only: nothing in a shared cache directory is ever unpickled.  A document is
written under a temporary name and renamed into place, so readers see a whole
document or none; a document that does not parse or lacks its fields is a miss,
removed and logged.  Forms are small (tens to hundreds of kB) and few (one per
file), so they are not counted against the column capacity; ``clear()`` of the
column cache does not remove them, :meth:`FormStore.clear` does.
"""

from __future__ import annotations

import json
import logging
import os
import uuid as uuidlib
from typing import Any

import xxhash

logger = logging.getLogger("cacheaffinity.worker")

__all__ = ["FormStore"]

_REQUIRED = ("base_form", "object_path", "num_entries", "file_uuid")


class FormStore:
    """JSON documents keyed by (file UUID, tree path, reading options).

    Parameters
    ----------
    directory
        The node's cache directory; documents live in ``directory/forms``.
    """

    def __init__(self, directory: str):
        self.directory = os.path.join(directory, "forms")
        self._warned = False
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(file_uuid: str, treename: str, options: Any = None) -> str:
        """A file name for the document of this file, tree and options."""
        token = xxhash.xxh3_128_hexdigest(repr((file_uuid, treename, options)).encode())
        return f"{file_uuid}-{token}.json"

    def get(self, name: str) -> dict | None:
        path = os.path.join(self.directory, name)
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except FileNotFoundError:
            self.misses += 1
            return None
        except (OSError, ValueError) as e:
            logger.warning("cacheaffinity: unreadable form %s (%s); removed, rebuilding", path, e)
            self._remove(path)
            self.misses += 1
            return None
        if not isinstance(doc, dict) or any(k not in doc for k in _REQUIRED):
            logger.warning("cacheaffinity: incomplete form %s; removed, rebuilding", path)
            self._remove(path)
            self.misses += 1
            return None
        self.hits += 1
        return doc

    def put(self, name: str, doc: dict) -> bool:
        """Store ``doc`` (JSON-serialisable); a failure is logged once, never raised."""
        path = os.path.join(self.directory, name)
        tmp = f"{path}.{os.getpid()}.{uuidlib.uuid4().hex[:8]}.tmp"
        try:
            os.makedirs(self.directory, exist_ok=True)
            data = json.dumps(doc, separators=(",", ":"))
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(data)
            os.replace(tmp, path)
            return True
        except (OSError, TypeError, ValueError) as e:
            if not self._warned:
                self._warned = True
                logger.warning(
                    "cacheaffinity: cannot store file metadata in %s (%s); chunks of "
                    "this file will reopen it",
                    self.directory,
                    e,
                )
            self._remove(tmp)
            return False

    def clear(self) -> int:
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
