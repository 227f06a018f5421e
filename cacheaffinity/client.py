"""Client-side API: give tasks a chunk identity, ask where chunks go, check the plugin.

Runs in the client process. A *chunk identity* is a stable string naming the data a task reads
(e.g. ``"<file uuid>/Events/0-100000"``); it travels as the task annotation ``cacheaffinity``
(:mod:`cacheaffinity.protocol`) to the scheduler plugin, which places the task on the chunk's
cache node. Identities are checked when tasks are created: a non-empty ``str`` (``None`` is not
turned into ``"None"``) of at most ``cacheaffinity.client.max-chunk-id-length`` UTF-8 bytes.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import dask
from dask.base import tokenize
from dask.utils import funcname

from cacheaffinity import config
from cacheaffinity.protocol import (
    ANNOTATION,
    DIRECTORY_WIDE,
    ENTRIES_ANNOTATION,
    HOST_NODE_PREFIX,
    NO_WORKER_PLUGIN,
    PLUGIN_NAME,
)

logger = logging.getLogger("cacheaffinity.client")

__all__ = [
    "ChunkIds",
    "cache_stats",
    "cache_totals",
    "check",
    "check_chunk_ids",
    "chunk",
    "chunks",
    "forecast",
    "forecast_message",
    "FORECAST_WARN_BELOW",
    "map_chunks",
    "max_chunk_id_length",
    "run_stats",
    "uncached_message",
    "where",
]

_EXAMPLE = 'e.g. f"{file_uuid}/Events/{start}-{stop}"'


def max_chunk_id_length() -> int:
    """``cacheaffinity.client.max-chunk-id-length`` in bytes (validated)."""
    return config.get_bytes("client.max-chunk-id-length")


def _refuse(chunk_id: Any, where: str, limit: int) -> Exception:
    if not isinstance(chunk_id, str):
        return TypeError(
            f"chunk identity {where}must be a non-empty string, got "
            f"{type(chunk_id).__name__} {chunk_id!r:.80}; {_EXAMPLE}. (A missing id is "
            "not turned into the string 'None': that would make every such task one chunk.)"
        )
    if not chunk_id:
        return ValueError(f"chunk identity {where}is an empty string; {_EXAMPLE}")
    size = len(chunk_id.encode("utf-8", "surrogatepass"))
    return ValueError(
        f"chunk identity {where}is {size:,} bytes long ({chunk_id[:60]!r}...), more than "
        f"cacheaffinity.client.max-chunk-id-length={limit:,}: the scheduler keeps every "
        "id it places. Use a short stable name (a file UUID and an entry range, or a hash "
        'of a long name), or raise the limit: dask.config.set({"cacheaffinity.client.'
        'max-chunk-id-length": "4 KiB"})'
    )


def check_chunk_ids(chunk_ids: Iterable[Any], what: str = "") -> list[str]:
    """The chunk identities as a list; ``TypeError`` for an id that is not a ``str``,
    ``ValueError`` for an empty one or one over ``cacheaffinity.client.max-chunk-id-length``."""
    limit = max_chunk_id_length()
    quick = limit // 4  # UTF-8 takes at most 4 bytes per character
    out = list(chunk_ids)
    for i, c in enumerate(out):
        if type(c) is str and 0 < len(c) and (
            len(c) <= quick or (c.isascii() and len(c) <= limit)  # isascii() is O(1)
        ):
            continue
        if isinstance(c, str) and c and len(c.encode("utf-8", "surrogatepass")) <= limit:
            continue
        where = f"{what}[{i}] " if what else (f"#{i} " if len(out) > 1 else "")
        raise _refuse(c, where, limit)
    return out


def chunk(chunk_id: str) -> contextlib.AbstractContextManager:
    """Context manager: tasks created inside (``client.submit``, ``client.map``, ``dask.delayed``)
    carry ``chunk_id`` (``TypeError``/``ValueError`` if invalid, see :mod:`cacheaffinity.client`);
    :func:`cacheaffinity.map_chunks` gives one id per task."""
    check_chunk_ids([chunk_id])
    return dask.annotate(**{ANNOTATION: chunk_id})


class ChunkIds(dict):
    """Annotation value mapping task keys to chunk identities (``None``: not a chunk task).
    Its call is ``dict.get``: the scheduler calls it for every task of a graph, and no Python
    frame runs per call. Picklable."""

    __slots__ = ()
    __call__ = dict.get

    @property
    def mapping(self) -> dict:
        """The mapping itself (kept for callers of earlier versions)."""
        return self

    def __repr__(self) -> str:
        return f"ChunkIds(<{len(self)} keys>)"


def _check_entries(entries: Iterable[Any], n: int) -> list[tuple[int, int] | None]:
    out = []
    for i, e in enumerate(entries):
        if e is None:
            out.append(None)
            continue
        ok = isinstance(e, (tuple, list)) and len(e) == 2
        if ok:
            a, b = e
            ok = all(isinstance(x, int) and not isinstance(x, bool) for x in e) and 0 <= a <= b
        if not ok:
            raise ValueError(
                f"map_chunks entries[{i}]={e!r:.80} must be None or a (start, stop) pair of "
                "ints with 0 <= start <= stop (the task's entry range within its chunk id), "
                "e.g. (0, 100000)"
            )
        out.append((int(e[0]), int(e[1])))
    if len(out) != n:
        raise ValueError(
            f"map_chunks got {len(out)} entries for {n} chunk_ids; give one (start, stop) "
            "or None per task, or leave entries out"
        )
    return out


def chunks(
    mapping: Mapping[Any, str], entries: Mapping[Any, tuple[int, int]] | None = None
) -> contextlib.AbstractContextManager:
    """Context manager: the tasks with these keys carry these chunk identities (and
    ``entries``, see :func:`cacheaffinity.map_chunks`); errors name the refused key."""
    keys = list(mapping)
    try:
        check_chunk_ids(mapping.values())
    except (TypeError, ValueError):
        for k in keys:  # name the key (the slow path runs only on an error)
            try:
                check_chunk_ids([mapping[k]])
            except (TypeError, ValueError) as e:
                raise type(e)(f"task {k!r}: {e}") from None
        raise
    if entries:
        return dask.annotate(**{ANNOTATION: ChunkIds(mapping), ENTRIES_ANNOTATION: ChunkIds(entries)})
    return dask.annotate(**{ANNOTATION: ChunkIds(mapping)})


def map_chunks(
    client,
    func,
    *iterables: Iterable,
    chunk_ids: Iterable[str],
    key: str | None = None,
    pure: bool = True,
    entries: Iterable[tuple[int, int] | None] | None = None,
    **kwargs: Any,
) -> list:
    """``client.map`` with one chunk identity per task (``chunk_ids``, in the order of the
    iterables); returns the futures.

    ``key`` is the key prefix (default: the function name); the other arguments are as for
    ``client.map``. ``entries`` (optional, one per task: its ``(start, stop)`` range within
    its chunk id, or None) is for ids several tasks share: the scheduler then sends a later
    task where most of its entries ran.
    """
    columns = [list(it) for it in iterables]
    ids = check_chunk_ids(chunk_ids, what="chunk_ids")
    n = len(ids)
    if any(len(c) != n for c in columns):
        raise ValueError(
            f"map_chunks got {n} chunk_ids but iterables of lengths "
            f"{[len(c) for c in columns]}; give exactly one chunk id per task"
        )
    prefix = key or funcname(func)
    fn_token = tokenize(func, kwargs)
    keys = [
        f"{prefix}-{tokenize(fn_token, args) if pure else uuid.uuid4().hex}"
        for args in zip(*columns)
    ]
    ranges = None
    if entries is not None:
        ranges = {k: e for k, e in zip(keys, _check_entries(entries, n)) if e is not None}
    with chunks(dict(zip(keys, ids)), ranges):
        return client.map(func, *columns, key=keys, pure=pure, **kwargs)


def _scheduler_info(dask_scheduler=None) -> dict | None:
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    if plugin is None or not hasattr(plugin, "info"):
        return None
    return plugin.info()


def _scheduler_run_stats(dask_scheduler=None, run=None, last=1) -> list | None:
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    if plugin is None or not hasattr(plugin, "run_stats"):
        return None
    return plugin.run_stats(run, last)


async def _scheduler_forecast(dask_scheduler=None, run=None, wait=2.0) -> dict | None:
    import asyncio

    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    if plugin is None or not hasattr(plugin, "forecast_of"):
        return None
    deadline = asyncio.get_running_loop().time() + float(wait)
    # the run's graph reaches the scheduler on the client's batched stream, this
    # request on another connection: wait a little for it
    while run not in plugin.forecast.runs and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)
    return {"forecast": plugin.forecast_of(run)}


def _scheduler_latest_forecast(dask_scheduler=None) -> dict | None:
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    if plugin is None or not hasattr(plugin, "latest_forecast"):
        return None
    return plugin.latest_forecast()


def _scheduler_where(dask_scheduler=None, chunk_ids=()) -> dict | None:
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    if plugin is None or not hasattr(plugin, "where"):
        return None
    return plugin.where(chunk_ids)


_MISSING = (
    "the Dask scheduler at {address} has no cacheaffinity plugin, so chunks would be "
    "placed at random and caches would miss. Start it with "
    "`dask scheduler --preload cacheaffinity`, set distributed.scheduler.preload: "
    "[cacheaffinity] in its Dask config, or call "
    "client.register_plugin(cacheaffinity.CacheAffinityPlugin()). A failing preload is "
    "only logged: check the scheduler log for 'cacheaffinity'."
)


def uncached_message(info: dict) -> str | None:
    """One line naming the uncached nodes of a plugin's ``info()`` and why, or None."""
    nodes = {n: e for n, e in (info.get("nodes") or {}).items() if e.get("uncached")}
    if not nodes:
        return None
    cached = len(info["nodes"]) - len(nodes)
    parts = [
        f"{n} (workers {', '.join(e.get('workers') or ()) or '-'}): {e['uncached']}"
        for n, e in sorted(nodes.items())
    ]
    return (
        f"cacheaffinity: {len(nodes)} of {len(info['nodes'])} cache nodes cache nothing"
        + (
            ", so they get no chunks (they may steal some, which then run uncached)"
            if cached
            else ": no node caches, every chunk runs uncached"
        )
        + ": "
        + "; ".join(parts)
    )


def check(client, warn: bool = True) -> dict:
    """Raise a clear ``RuntimeError`` unless the scheduler runs the plugin.

    Returns the plugin's :meth:`~cacheaffinity.CacheAffinityPlugin.info` (a coroutine with an
    asynchronous client); with ``warn``, logs :func:`cacheaffinity.client.uncached_message`."""

    def warned(info):
        msg = uncached_message(info) if warn else None
        if msg:
            logger.warning(msg)
        return info

    return _call(client, _scheduler_info, {}, then=warned)


def run_stats(client, run: str | None = None, last: int = 1) -> list[dict]:
    """Figures of run ``run``, or of the ``last`` runs the scheduler kept (newest last): ``run``,
    ``started``, ``updated``, ``tasks``, ``forecast`` and :data:`cacheaffinity.protocol.RUN_FIGURES`
    as the run's chunk tasks reported them. A coroutine with an asynchronous client."""
    return _call(client, _scheduler_run_stats, {"run": run, "last": int(last)})


def forecast(client, run: str, wait: float = 2.0) -> dict | None:
    """The working-set forecast of run ``run`` (``hit_rate``, ``capacity_hit_rate``, ``need_bytes``,
    ``nodes`` ...), or None after waiting ``wait`` seconds for it. A coroutine if asynchronous."""
    return _call(
        client, _scheduler_forecast, {"run": run, "wait": float(wait)}, then=lambda out: out["forecast"]
    )


#: :func:`forecast_message` warns when a run's ``capacity_hit_rate`` is below this.
FORECAST_WARN_BELOW = 0.9


def forecast_message(forecast: Mapping[str, Any], run: str | None = None) -> str | None:
    """One warning naming the nodes whose caches are too small for ``forecast``,
    or None when its ``capacity_hit_rate`` is at least :data:`FORECAST_WARN_BELOW` (or unknown)."""
    from dask.utils import format_bytes

    rate = forecast.get("capacity_hit_rate")
    if rate is None or rate >= FORECAST_WARN_BELOW:
        return None
    short = []
    for node, e in sorted(forecast.get("nodes", {}).items()):
        if e.get("capacity_hit_rate") is not None and e["capacity_hit_rate"] < FORECAST_WARN_BELOW:
            short.append(
                f"this run needs ~{format_bytes(e['need_bytes'])} on node {node}, which holds "
                f"{format_bytes(e['capacity'])}: expect ~{100 * e['capacity_hit_rate']:.0f}% hits"
                + (" (fifo admission: raise the capacity or use admission rank)" if e["policy"] == "fifo" else "")
            )
    return (
        "cacheaffinity: the node caches are smaller than this run's data"
        + (f" (run {run})" if run else "")
        + f": expect ~{100 * rate:.0f}% cache hits once every chunk was read. "
        + "; ".join(short)
        + ". Raise cacheaffinity.worker.capacity (--cache-capacity) or add cache nodes "
        "(docs/design.md, 'Beyond capacity')."
    )


def where(client, chunk_ids: Iterable[str]) -> dict[str, dict]:
    """Each chunk's cache node under the current membership (bounded loads aside):
    ``{chunk: {"node": id, "workers": [...]}}``. A coroutine with an asynchronous client."""
    return _call(client, _scheduler_where, {"chunk_ids": [str(c) for c in chunk_ids]})


def _call(client, func, kwargs, then=None):
    address = client.scheduler.address

    def finish(out):
        if out is None:
            raise RuntimeError(_MISSING.format(address=address))
        return out if then is None else then(out)

    def failed(e):
        return RuntimeError(
            _MISSING.format(address=address)
            + f" (asking the scheduler failed: {e!r}; is cacheaffinity installed there?)"
        )

    if client.asynchronous:

        async def run():
            try:
                out = await client.run_on_scheduler(func, **kwargs)
            except Exception as e:
                raise failed(e) from e
            return finish(out)

        return run()
    try:
        out = client.run_on_scheduler(func, **kwargs)
    except Exception as e:
        raise failed(e) from e
    return finish(out)


def _worker_stats(dask_worker=None) -> dict | None:
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    if plugin is None or not hasattr(plugin, "metric"):
        return None
    if hasattr(plugin, "flush"):
        plugin.flush(timeout=60.0)  # counters and entries include queued writes
    return plugin.metric()


def cache_stats(client) -> dict[str, dict]:
    """Cache statistics per cache node, asked from every worker now (each first stores its
    queued writes, at most 60 s): ``{node_id: {"workers", "directory", "uncached", <counters>}}``.

    Per-process counters are summed over the node's workers; directory-wide values (bytes,
    entries, capacity in force) are the node's; ``forecast_*`` come from the newest run's
    :func:`cacheaffinity.forecast`. ``uncached``: None, or why no worker of the node caches.
    """
    from distributed.comm import get_address_host

    per_worker = client.run(_worker_stats)
    nodes: dict[str, dict] = {}
    reasons: dict[str, list] = {}
    for addr, m in sorted(per_worker.items()):
        m = m or {}
        reason = NO_WORKER_PLUGIN if not m else m.get("uncached")
        name = m.get("node")
        if not name:
            name = HOST_NODE_PREFIX + get_address_host(addr)
            reason = reason or "no cache node reported"
        node = nodes.setdefault(name, {"workers": [], "directory": m.get("directory")})
        node["workers"].append(addr)
        reasons.setdefault(name, []).append(reason)
        for k, v in (m.get("stats") or {}).items():
            if not isinstance(v, (int, float)):
                continue
            node[k] = max(node.get(k, 0), v) if k in DIRECTORY_WIDE else node.get(k, 0) + v
    for name, node in nodes.items():
        rs = reasons[name]
        node["uncached"] = "; ".join(sorted(set(rs))) if all(rs) else None
    try:
        latest = client.run_on_scheduler(_scheduler_latest_forecast)
    except Exception as e:  # the counters stand on their own
        logger.debug("cacheaffinity: forecast unavailable: %r", e)
        latest = None
    for name, f in ((latest or {}).get("nodes") or {}).items():
        if name in nodes:
            nodes[name]["forecast_run"] = latest["run"]
            nodes[name]["forecast_need_bytes"] = f.get("need_bytes")
            nodes[name]["forecast_hit_rate"] = f.get("capacity_hit_rate")
    return nodes


def cache_totals(client) -> dict[str, int]:
    """Per-process cache counters since the workers started, summed over every node
    (:func:`cacheaffinity.cache_stats`); a run's figures are the difference of two calls."""
    out: dict[str, int] = {}
    for node in cache_stats(client).values():
        for k, v in node.items():
            if isinstance(v, (int, float)) and k not in DIRECTORY_WIDE and not k.startswith("forecast_"):
                out[k] = out.get(k, 0) + v
    return out
