"""Chunk packs from another node's cache instead of storage (runs in workers).

On a chunk's first miss that its local packs do not cover, :class:`PeerStore` asks the
scheduler once which nodes processed the task's entries, then each of them once for
its packs overlapping the chunk's range (:func:`serve_packs`), and stores them locally.
A peer that is gone, slow, busy or malformed is a miss, never an error.  Distributed
internals used (``tests/test_peers.py`` fails when one changes): ``Worker.get_current_task``,
``Worker.state.tasks[key].annotations``, ``Worker.handlers``, ``Worker.rpc``,
``Worker.scheduler``, ``distributed.utils.sync``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import MutableMapping
from typing import Any

import numpy as np

from cacheaffinity.protocol import (
    ANNOTATION,
    ENTRIES_ANNOTATION,
    FORM_HANDLER,
    HOLDERS_HANDLER,
    PACKS_HANDLER,
)
from cacheaffinity.worker._store.protocol import ColumnStore, Pack, column_store

logger = logging.getLogger("cacheaffinity.worker")

__all__ = ["PeerStore", "serve_packs", "task_annotations"]
#: Bytes of column data in one reply at most (the rest are misses for the asker).
MAX_REPLY_BYTES = 256 * 2**20
_MISSING = object()


def task_annotations(worker) -> dict:
    """Annotations of the task running in this thread of ``worker`` ({} if none)."""
    try:
        key = worker.get_current_task()
        ts = worker.state.tasks.get(key)
    except Exception:  # not inside a task
        return {}
    return dict(getattr(ts, "annotations", None) or {})


async def serve_packs(plugin, group: str, start: int, stop: int) -> list:
    """Handler ``cacheaffinity_packs``: ``[[start, stop, [[member, dtype, shape, bytes], ...]],
    ...]`` of the verified packs of ``group`` overlapping ``[start, stop)`` held here (not
    counted as this node's hits)."""
    cache = plugin.cache
    if cache is None or not isinstance(group, str) or not all(isinstance(x, int) for x in (start, stop)):
        return []
    limit = plugin.peer_serve_limit
    if limit and plugin.serving >= limit:
        # the asker reads storage rather than queue on this busy disk
        plugin.count_peer(busy=1)
        return []
    loop = asyncio.get_running_loop()
    plugin.serving += 1
    try:
        packs = await loop.run_in_executor(None, cache.get_packs, group, start, stop)
    except Exception as e:  # a cache problem: nothing to serve
        logger.debug("cacheaffinity: peer request not served: %r", e)
        return []
    finally:
        plugin.serving -= 1
    out: list = []
    total = 0
    for p in packs:
        size = sum(v.nbytes for v in p.members.values())
        if total + size > MAX_REPLY_BYTES:
            break
        total += size
        out.append([p.start, p.stop, [[k, v.dtype.str, list(v.shape), v.tobytes()] for k, v in p.members.items()]])
    plugin.count_peer(served=sum(len(p[2]) for p in out), served_bytes=total)
    return out


#: Schedulers that answered the holders request with an error (no cacheaffinity
#: plugin): not asked again by this process.
_NO_HOLDERS: set[str] = set()
#: Peers that did not answer: address -> monotonic time until which they are skipped
#: (expired ones dropped on every insert: restarted workers have new addresses).
_DOWN: dict[str, float] = {}
#: Seconds a peer that did not answer is skipped by this process's tasks.
DOWN_SECONDS = 60.0


def _mark_down(addr: str, now: float | None = None) -> None:
    """Skip peer ``addr`` for :data:`DOWN_SECONDS`; forget the peers whose time is up."""
    now = time.monotonic() if now is None else now
    for a, until in list(_DOWN.items()):  # tasks of several threads: pop, never del
        if until <= now:
            _DOWN.pop(a, None)
    _DOWN[addr] = now + DOWN_SECONDS


async def serve_form(plugin, name: str, identity: str) -> str | None:
    """Handler ``cacheaffinity_form``: the JSON text of the form document stored
    under ``name`` with the file identity ``identity`` (JSON text), or None."""
    forms = plugin.forms
    if forms is None or not isinstance(name, str) or not isinstance(identity, str):
        return None
    try:
        expect = json.loads(identity)
        loop = asyncio.get_running_loop()
        doc = await loop.run_in_executor(None, lambda: forms.get(name, identity=expect))
    except Exception as e:  # a cache problem: nothing to serve
        logger.debug("cacheaffinity: form request not served: %r", e)
        return None
    if doc is None:
        return None
    plugin.count_peer(served_forms=1)
    return json.dumps(doc, separators=(",", ":"))


class PeerStore(MutableMapping, ColumnStore):
    """The chunk's store, with missing chunk packs fetched from the nodes that hold them.

    ``store``: the local store (any column store or mapping); ``worker``: the worker
    running the task; ``plugin``: its ``CacheWorkerPlugin`` (counters, timeout);
    ``annotations``: the running task's (chunk id and entry range)."""

    def __init__(self, store: ColumnStore | MutableMapping, worker, plugin, annotations: dict):
        self.store = store
        self._worker = worker
        self._plugin = plugin
        self._chunk = annotations.get(ANNOTATION)
        self._entries = annotations.get(ENTRIES_ANNOTATION)
        self._peers: list[str] | None = None if self._chunk is not None else []

    def __getitem__(self, key):
        return self.store[key]

    def get(self, key, default=None):
        return self.store.get(key, default)

    def __setitem__(self, key, value) -> None:
        self.store[key] = value

    def __delitem__(self, key) -> None:
        del self.store[key]

    def __iter__(self):
        return iter(self.store)

    def __len__(self) -> int:
        return len(self.store)

    def get_many(self, keys: list[str]) -> dict:
        return column_store(self.store).get_many(keys)

    def get_packs(self, grp: str, start: int, stop: int) -> list[Pack]:
        return column_store(self.store).get_packs(grp, start, stop)

    def put_pack(self, grp: str, start: int, stop: int, arrays: dict) -> None:
        column_store(self.store).put_pack(grp, start, stop, arrays)

    def count_served(self, hits: int = 0, misses: int = 0, nbytes: int = 0, peer_hits: int = 0) -> None:
        if peer_hits:  # lookups the packs fetched by :meth:`fetch_packs` answered
            self._plugin.count_peer(hits=peer_hits)
        column_store(self.store).count_served(hits=hits, misses=misses, nbytes=nbytes)

    def _sync(self, coro_fn, *args, **kwargs):
        from distributed.utils import sync

        timeout = self._plugin.peer_timeout

        async def bounded():
            return await asyncio.wait_for(coro_fn(*args, **kwargs), timeout)

        return sync(self._worker.loop, bounded)

    def peers(self) -> list[str]:
        """Addresses of workers on other nodes that processed this task's
        entries (asked once per task)."""
        if self._peers is None:
            self._peers = []
            entries = self._entries
            ok = isinstance(entries, (list, tuple)) and len(entries) == 2
            start, stop = entries if ok else (None, None)
            scheduler = self._worker.scheduler.address
            if scheduler in _NO_HOLDERS:
                return self._peers
            try:
                got = self._sync(
                    getattr(self._worker.scheduler, HOLDERS_HANDLER),
                    chunk=self._chunk,
                    start=start,
                    stop=stop,
                    worker=self._worker.address,
                )
            except (asyncio.TimeoutError, OSError) as e:  # slow, closing: a miss
                logger.debug("cacheaffinity: holders of %s unknown: %r", self._chunk, e)
                got = []
            except Exception as e:  # no scheduler plugin: not asked again
                _NO_HOLDERS.add(scheduler)
                logger.info(
                    "cacheaffinity: the scheduler at %s does not name column holders (%r; "
                    "no cacheaffinity scheduler plugin?): missing columns are read from storage",
                    scheduler, e,
                )  # fmt: skip
                got = []
            if isinstance(got, (list, tuple)):  # a list arrives as a tuple over TCP
                now = time.monotonic()
                self._peers = [
                    a for a in got
                    if isinstance(a, str) and a != self._worker.address and _DOWN.get(a, 0) <= now
                ]  # fmt: skip
        return self._peers

    def form(self, name: str, identity: Any) -> dict | None:
        """The form document ``name`` of the file with ``identity`` from the
        first peer that has it (the peer checks the identity), or None."""
        text = json.dumps(identity, sort_keys=True)
        for addr in list(self.peers()):
            try:
                reply = self._sync(getattr(self._worker.rpc(addr), FORM_HANDLER), name=name, identity=text)
            except Exception as e:  # gone, slow, no plugin
                self._down(addr, e)
                continue
            if not isinstance(reply, str):
                continue
            try:
                doc = json.loads(reply)
            except ValueError:
                continue
            if isinstance(doc, dict):
                self._plugin.count_peer(forms=1)
                return doc
        return None

    def _down(self, addr: str, e: BaseException) -> None:
        logger.info(
            "cacheaffinity: peer %s did not answer (%r); its columns are read from "
            "storage, and it is not asked for %.0f s", addr, e, DOWN_SECONDS,
        )  # fmt: skip
        _mark_down(addr)
        self._peers = [a for a in self._peers or () if a != addr]
        self._plugin.count_peer(failed=1)

    def fetch_packs(self, grp: str, start: int, stop: int) -> list[Pack]:
        """The packs of ``grp`` overlapping ``[start, stop)`` held by the holders of this task's
        entries (one request each: a straddling chunk may find them on two nodes), stored
        locally too."""
        out: list[Pack] = []
        for addr in list(self.peers()):
            try:
                reply = self._sync(
                    getattr(self._worker.rpc(addr), PACKS_HANDLER), group=grp, start=int(start), stop=int(stop)
                )
            except Exception as e:  # gone, slow, no plugin: a miss, and not asked again soon
                self._down(addr, e)
                continue
            got = _packs_of(reply)
            # the lookups they answer are counted by the chunk (``count_served``'s peer_hits)
            self._plugin.count_peer(nbytes=sum(v.nbytes for p in got for v in p.members.values()), requests=1)
            if not got:  # it has none of these: nor, most likely, the rest of this task's
                self._peers = [a for a in self._peers or () if a != addr]
                continue
            for p in got:
                try:
                    column_store(self.store).put_pack(grp, p.start, p.stop, p.members)
                except Exception as e:  # a cache problem: used, not stored
                    logger.debug("cacheaffinity: peer pack not stored: %r", e)
            out.extend(got)
        return out


def _packs_of(reply: Any) -> list[Pack]:
    """The well-formed packs of a peer's reply (anything malformed is dropped)."""
    out = []
    if not isinstance(reply, (list, tuple)):
        return out
    for entry in reply:
        try:
            start, stop, members = entry
            arrays = {}
            for name, dtype, shape, data in members:
                dt = np.dtype(dtype)
                if dt.hasobject or dt.fields is not None or not isinstance(name, str):
                    raise ValueError("not a plain array")
                arrays[name] = np.frombuffer(data, dtype=dt).reshape(tuple(shape))
            if not isinstance(start, int) or not isinstance(stop, int) or start >= stop:
                raise ValueError("bad range")
            out.append(Pack(start, stop, arrays))
        except Exception as e:
            logger.debug("cacheaffinity: malformed peer pack dropped: %r", e)
    return out
