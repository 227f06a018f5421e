"""The working-set forecast of a run (runs in the scheduler).

``Forecast`` keeps the bytes each chunk task reported (``chunk_bytes``) and the
chunks each run placed per node, and estimates per node and run ``need_bytes``,
``hit_rate`` and ``capacity_hit_rate`` (the rate without first-run misses) against
the capacities the workers report. It ignores other users' entries.

Each size remembers the node whose cache last read or stored the chunk (its holder): a
chunk placed on another node counts as new there, as after a node left (its chunks go to
other nodes), joined (it takes chunks over) or stole the chunk in an earlier run. A chunk
some other node's cache still holds as well is then counted as a miss although it hits.
A node that stored chunks but reports an empty cache since (``cacheaffinity cache clear``
with its workers running) holds none of them: its chunks count as new in the runs
placed after that report. Event-loop only; memory: the last ``SIZES_KEPT`` sizes (a holder
shares its size's integer: at most 4 bytes more), ``RUNS_KEPT`` runs and ``NODES_KEPT`` node
names.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import Any

import numpy as np
import xxhash

from cacheaffinity.protocol import WORKER_METRIC

__all__ = ["EMPTY_AFTER", "NODES_KEPT", "RUNS_KEPT", "SIZES_KEPT", "Forecast", "emptied_nodes", "size_key"]

#: Chunk sizes kept at most (about 100 bytes each).
SIZES_KEPT = 500_000
#: Runs whose forecast is kept at most.
RUNS_KEPT = 20
#: Node names a forecast codes holders with at most; one more forgets every holder (its
#: sizes' chunks count as held by the node they are placed on, as before any report).
NODES_KEPT = 65_535
#: Low bits of a size entry that hold its holder's code (0: none known).
_HOLDER_BITS = 16
_HOLDER_MASK = (1 << _HOLDER_BITS) - 1
#: Bytes a size entry holds at most (2^47: 128 TiB a chunk).
_MOST_BYTES = (1 << (63 - _HOLDER_BITS)) - 1
#: Seconds between a node's last stored chunk and a report of an empty cache that counts as
#: emptied (a report computed before the chunk's write was queued is not).
EMPTY_AFTER = 1.0


def emptied_nodes(node_workers: Mapping[str, Iterable[str]], workers: Mapping[str, Any],
                  stored: Mapping[str, float]) -> set[str]:
    """Nodes whose every reporting worker says, in a heartbeat received more than
    ``EMPTY_AFTER`` s after the node last stored a chunk (``stored``: scheduler time), that
    the cache holds no entry and has no queued write."""
    out = set()
    for node, addrs in node_workers.items():
        last = stored.get(node)
        if last is None:
            continue
        seen = []
        for a in addrs:
            ws = workers.get(a)
            m = (getattr(ws, "metrics", None) or {}).get(WORKER_METRIC) if ws is not None else None
            stats = m.get("stats") if isinstance(m, dict) else None
            if not isinstance(stats, dict) or "entries" not in stats:
                continue
            seen.append(stats.get("entries") == 0 and not stats.get("pending")
                        and (getattr(ws, "last_seen", 0) or 0) > last + EMPTY_AFTER)  # fmt: skip
        if seen and all(seen):
            out.add(node)
    return out


def size_key(chunk: str, entries: Any = None) -> int:
    """The key of a chunk's size: its id and, when given, its entry range."""
    text = chunk if entries is None else f"{chunk}|{entries[0]}-{entries[1]}"
    return xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass"))


def size_keys(chunks: Iterable[str]) -> Iterator[int]:
    """:func:`size_key` of chunks without entry ranges, without a call per chunk."""
    return map(xxhash.xxh3_64_intdigest, map(_encode, chunks, repeat("utf-8"), repeat("surrogatepass")))


_encode = str.encode


class Forecast:
    """Chunk sizes and per-run, per-node working sets."""

    def __init__(self, sizes_kept: int = SIZES_KEPT, runs_kept: int = RUNS_KEPT):
        self.sizes_kept = int(sizes_kept)
        self.runs_kept = int(runs_kept)
        #: size key -> ``bytes << 16 | holder code`` (:meth:`size`, :meth:`holder`)
        self.sizes: OrderedDict[int, int] = OrderedDict()
        self._total = 0
        # holder codes: node -> code, code -> node (code 0: no holder known)
        self._codes: dict[str, int] = {}
        self._names: list[str | None] = [None]
        # run -> node -> [chunks, bytes of known chunks, chunks of unknown size]
        self.runs: OrderedDict[str, dict[str, list[int]]] = OrderedDict()
        #: node -> scheduler time of the last chunk it reported stored
        self.stored: dict[str, float] = {}

    def submitted(self, run: str, placed: Iterable[tuple[int, str]], empty: Iterable[str] = ()) -> None:
        """Chunk tasks ``(size key, node)`` of ``run`` were placed; the nodes ``empty``
        hold none of the chunks they stored (their chunks count as new)."""
        pairs = list(placed)
        self.submitted_columns(run, [p[0] for p in pairs], [p[1] for p in pairs], empty)

    def submitted_columns(
        self,
        run: str,
        sks: Iterable[int],
        nodes: Sequence[str],
        empty: Iterable[str] = (),
        coded: tuple[np.ndarray, Sequence[str]] | None = None,
    ) -> None:
        """:meth:`submitted` of parallel columns: size keys ``sks`` and ``nodes``, counted
        per node with numpy (10^6 chunk tasks: no Python step per task). ``coded``: the
        same nodes as ``(codes, names)``, ``nodes[i] == names[codes[i]]`` (the placement's
        node indices), which saves looking every node up."""
        rec = self.runs.get(run)
        if rec is None:
            rec = self.runs[run] = {}
            while len(self.runs) > self.runs_kept:
                self.runs.popitem(last=False)
        m = len(nodes)
        if not m:
            return
        if coded is not None:
            idx, names = np.asarray(coded[0], dtype=np.int64), list(coded[1])
            index = {n: i for i, n in enumerate(names)}
        else:
            names = list(dict.fromkeys(nodes))
            index = {n: i for i, n in enumerate(names)}
            idx = np.fromiter(map(index.__getitem__, nodes), dtype=np.int64, count=m)
        # an unknown size reads as -1 bytes held by code 0
        v = np.fromiter(map(self.sizes.get, sks, repeat(-1 << _HOLDER_BITS)), dtype=np.int64, count=m)
        b = v >> _HOLDER_BITS
        held = v & _HOLDER_MASK
        # a chunk whose holder is known and is not the node placed: new to that node
        here = np.array([self._codes.get(n, -1) for n in names], dtype=np.int64)
        b[(held != 0) & (held != here[idx])] = -1
        gone = [index[n] for n in set(empty) if n in index]
        if gone:  # an emptied node's chunks are new to it
            b[np.isin(idx, gone)] = -1
        known = b >= 0
        k = len(names)
        chunks = np.bincount(idx, minlength=k).tolist()
        unknown = np.bincount(idx[~known], minlength=k).tolist()
        # bytes as float64 sums: exact below 2^53 (8 PiB per node and run)
        nbytes = np.bincount(idx[known], weights=b[known], minlength=k).tolist()
        for i, name in enumerate(names):
            if not chunks[i]:
                continue
            n = rec.get(name)
            if n is None:
                n = rec[name] = [0, 0, 0]
            n[0] += chunks[i]
            n[1] += int(nbytes[i])
            n[2] += unknown[i]

    def reported(self, sk: int, nbytes: Any, node: str | None = None, kept: bool = True) -> None:
        """A chunk task of size key ``sk`` reported the bytes of its columns (on ``node``,
        which ``kept`` them: read them from its cache or stored them there; then ``node``
        is the chunk's holder, else the holder stays the one known)."""
        if not isinstance(nbytes, int) or nbytes <= 0:
            return
        if nbytes > _MOST_BYTES:
            nbytes = _MOST_BYTES
        sizes = self.sizes
        old = sizes.pop(sk, None)
        if node is not None and kept:
            self.stored[node] = time.time()
            code = self._codes.get(node) or self._code(node)
        else:
            code = 0 if old is None else old & _HOLDER_MASK
        if old is not None:
            self._total -= old >> _HOLDER_BITS
        sizes[sk] = nbytes << _HOLDER_BITS | code
        self._total += nbytes
        while len(sizes) > self.sizes_kept:
            self._total -= sizes.popitem(last=False)[1] >> _HOLDER_BITS

    def _code(self, node: str) -> int:
        """``node``'s holder code, a new one if it has none (past :data:`NODES_KEPT`
        names, every holder is forgotten first)."""
        code = self._codes.get(node)
        if code is None:
            if len(self._names) > min(NODES_KEPT, _HOLDER_MASK):
                self.forget_holders()
            code = len(self._names)
            self._names.append(node)
            self._codes[node] = code
        return code

    def forget_holders(self) -> None:
        """No chunk's holder known any more (its chunks count as held where placed)."""
        for sk, v in self.sizes.items():
            self.sizes[sk] = v & ~_HOLDER_MASK
        self._codes.clear()
        del self._names[1:]

    def size(self, sk: int) -> int | None:
        """The bytes size key ``sk`` reported last (None: unknown)."""
        v = self.sizes.get(sk)
        return None if v is None else v >> _HOLDER_BITS

    def holder(self, sk: int) -> str | None:
        """The node that last read or stored size key ``sk``'s chunk (None: unknown)."""
        v = self.sizes.get(sk)
        return None if v is None else self._names[v & _HOLDER_MASK]

    @property
    def mean_size(self) -> float | None:
        """Mean bytes of the chunks whose size is known (None: none is)."""
        return self._total / len(self.sizes) if self.sizes else None

    def get(
        self, run: str, capacity: Mapping[str, Any], policy: Mapping[str, Any] | None = None
    ) -> dict | None:
        """The forecast of ``run`` (None: unknown) given each node's ``capacity`` (bytes)
        and admission ``policy`` (default ``"rank"``); rates and ``need_bytes`` are
        None while no chunk size is known. A chunk of unknown size counts at the mean.
        """
        rec = self.runs.get(run)
        if rec is None:
            return None
        mean = self.mean_size
        nodes: dict[str, dict] = {}
        for node, (chunks, known, unknown) in sorted(rec.items()):
            cap = capacity.get(node)
            pol = (policy or {}).get(node) or "rank"
            entry: dict[str, Any] = {
                "chunks": chunks, "new_chunks": unknown, "capacity": cap, "policy": pol,
                "need_bytes": None, "hit_rate": None, "capacity_hit_rate": None,
            }  # fmt: skip
            nodes[node] = entry
            if mean is None or not isinstance(cap, (int, float)):
                continue
            need = known + unknown * mean
            entry["need_bytes"] = int(need)
            if need <= 0:
                continue
            if need <= cap:
                fits = 1.0
            elif pol == "fifo":
                fits = 0.0
            else:  # rank keeps whole chunks: as many of the node's mean chunk as fit
                per_chunk = need / chunks
                fits = min(1.0, (cap // per_chunk) * per_chunk / need)
            entry["capacity_hit_rate"] = fits
            entry["hit_rate"] = fits * known / need
        weighed = [e for e in nodes.values() if e["need_bytes"]]
        total = sum(e["need_bytes"] for e in weighed)

        def avg(name):
            if not weighed or not total:
                return None
            return sum(e[name] * e["need_bytes"] for e in weighed) / total

        return {
            "hit_rate": avg("hit_rate"),
            "capacity_hit_rate": avg("capacity_hit_rate"),
            "need_bytes": int(total) if weighed else None,
            "chunks": sum(e["chunks"] for e in nodes.values()),
            "new_chunks": sum(e["new_chunks"] for e in nodes.values()),
            "nodes": nodes,
        }
