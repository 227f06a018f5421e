"""The soak's probes: functions and a worker plugin that run in the scheduler and the
workers (:mod:`benchmarks.soak`).

They are sent by value (this module is registered with cloudpickle below), so that neither
the scheduler nor a worker imports this module: standard library only inside them.
"""

from __future__ import annotations

import sys
from typing import Any

import cloudpickle
from distributed.diagnostics.plugin import WorkerPlugin

# The probes run in the scheduler and the workers: sent by value, so that the scheduler
# never imports this module (nor, through it, coffea: ~100 MB of its RSS).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

LOGGERS = ("distributed", "cacheaffinity")


def _containers(obj: Any, prefix: str, out: dict, seen: set, roots: tuple = ("cacheaffinity",), depth: int = 0,
                types: dict | None = None) -> None:
    """``out[dotted name] = len(container)`` for every container attribute (a dict, list,
    set or deque, or a subclass: Counter, defaultdict, OrderedDict ...) of ``obj`` and,
    recursively, of the attributes that are objects of a module under ``roots``; a dict
    whose values are containers also gives ``name[*]`` (the sum of their lengths); a deque
    with a ``maxlen`` gives ``name.maxlen`` (its cap); ``types[name]``: the container's
    type name (of the values for ``name[*]``).  Other mappings (a ``ColumnCache``) are never
    iterated or sized (that would read the cache): their attributes are walked."""
    from collections import deque as _deque

    if types is None:
        types = {}
    builtin = (dict, list, set, frozenset, _deque)
    if id(obj) in seen or depth > 6:
        return
    seen.add(id(obj))
    attrs: dict = {}
    try:
        attrs = dict(vars(obj))
    except TypeError:
        pass
    for cls in type(obj).__mro__:
        for slot in getattr(cls, "__slots__", ()) or ():
            if isinstance(slot, str) and slot not in attrs and hasattr(obj, slot):
                attrs[slot] = getattr(obj, slot, None)
    for name, v in attrs.items():
        path = f"{prefix}.{name}"
        if isinstance(v, builtin):
            try:
                out[path] = len(v)
                types[path] = type(v).__name__
                maxlen = getattr(v, "maxlen", None)
                if maxlen is not None:
                    out[path + ".maxlen"] = maxlen
                if isinstance(v, dict):
                    values = [x for x in list(v.values()) if isinstance(x, builtin)]
                    if values:
                        out[path + "[*]"] = sum(len(x) for x in values)
                        types[path + "[*]"] = type(values[0]).__name__
            except RuntimeError:  # changed size during iteration (another thread)
                pass
            continue
        mod = type(v).__module__ or ""
        if any(mod == r or mod.startswith(r + ".") for r in roots):
            _containers(v, path, out, seen, roots, depth + 1, types)


#: Python thread names (digits dropped) of pools that start threads on demand, up to
#: their size: asyncio's default executor (the peer serving), ``concurrent.futures``
#: pools, Dask's offload and task executors
POOL_THREADS = ("asyncio_", "ThreadPoolExecutor-", "Dask-Offload", "Dask-Default-Threads", "Dask-Actor-Threads")


def _pools(server: Any) -> dict:
    """Of a scheduler or worker (in its process): its pooled connections (open sockets
    kept for reuse, ``rpc``: up to one or a few per peer) and the threads of on-demand
    thread pools (:data:`POOL_THREADS`), by name."""
    import re as _re
    import threading as _threading

    rpc = getattr(server, "rpc", None)
    pooled = []
    if rpc is not None:
        for table in (getattr(rpc, "available", {}), getattr(rpc, "occupied", {})):
            pooled += [c for v in list(table.values()) for c in list(v)]
    comms = len(pooled)
    names: dict = {}
    for t in _threading.enumerate():
        name = _re.sub(r"\d+", "N", t.name)
        names[name] = names.get(name, 0) + 1
    pool = sum(n for name, n in names.items() if name.startswith(POOL_THREADS))
    # the local ends of the pooled connections: the other end is a socket of the peer
    local = [getattr(c, "local_address", None) for c in pooled]
    return {"pooled_comms": comms, "pool_threads": pool, "threads_by_name": names,
            "pooled_local": sorted(a for a in local if isinstance(a, str))}  # fmt: skip


def _module_containers(out: dict, types: dict | None = None, roots: tuple = ("cacheaffinity",)) -> None:
    """``out["module.<module>.<name>"]``: the length of every module-level container (as
    :func:`_containers`, and weak sets and dicts) of the loaded modules under ``roots``,
    and the entries of every ``functools`` cache there (``<name>()``)."""
    import sys as _sys
    import weakref as _weakref
    from collections import deque as _deque

    builtin = (dict, list, set, _deque, _weakref.WeakSet, _weakref.WeakValueDictionary, _weakref.WeakKeyDictionary)
    for mod_name, mod in list(_sys.modules.items()):
        if mod is None or not any(mod_name == r or mod_name.startswith(r + ".") for r in roots):
            continue
        for name, v in list(vars(mod).items()):
            if name.startswith("__"):
                continue
            path = f"module.{mod_name}.{name}"
            if isinstance(v, builtin):
                try:
                    out[path] = len(v)
                except Exception:  # noqa: BLE001
                    continue
                if types is not None:
                    types[path] = type(v).__name__
                if getattr(v, "maxlen", None) is not None:
                    out[path + ".maxlen"] = v.maxlen
            elif callable(v) and hasattr(v, "cache_info") and getattr(v, "__module__", None) == mod_name:
                try:
                    info = v.cache_info()
                    out[path + "()"] = info.currsize
                    if info.maxsize is not None:
                        out[path + "().maxlen"] = info.maxsize
                except Exception:  # noqa: BLE001
                    pass


async def _scheduler_probe(dask_scheduler=None, wait: float = 10.0) -> dict:
    """In the scheduler: wait (up to ``wait`` s) until it holds no task, then its pid, the
    plugin's containers, some of Dask's, and the log records counted since the handler was
    installed."""
    import asyncio as _asyncio
    import os as _os
    import time as _time

    s = dask_scheduler
    deadline = _time.monotonic() + wait
    while s.tasks and _time.monotonic() < deadline:
        await _asyncio.sleep(0.05)
    plugin = s.plugins.get("cacheaffinity")
    state: dict = {}
    types: dict = {}
    if plugin is not None:
        _containers(plugin, "plugin", state, set(), types=types)
    _module_containers(state, types)
    dask_state: dict = {
        "dask.tasks": len(s.tasks),
        "dask.task_groups": len(s.task_groups),
        "dask.task_prefixes": len(s.task_prefixes),
        "dask.clients": len(s.clients),
        "dask.workers": len(s.workers),
        "dask.host_info": len(s.host_info),
        "dask.clients[*].wants_what": sum(len(c.wants_what) for c in s.clients.values()),
        "dask.plugins": len(s.plugins),
        "dask.worker_plugins": len(getattr(s, "worker_plugins", ())),
        "dask.periodic_callbacks": len(s.periodic_callbacks),
        "dask.handlers": len(s.handlers),
        "dask.stream_handlers": len(s.stream_handlers),
        "dask.replies": len(getattr(s, "replies", ()) or ()),
    }
    for name in ("transition_log", "_transition_log", "log"):
        v = getattr(s, name, None)
        if v is not None and hasattr(v, "maxlen"):
            dask_state[f"dask.{name}"] = len(v)
            if v.maxlen is not None:
                dask_state[f"dask.{name}.maxlen"] = v.maxlen
    # every other container attribute of the scheduler object (Dask's own, generically)
    generic: dict = {}
    _containers(s, "dask.scheduler", generic, set(), roots=())
    dask_state.update({k: v for k, v in generic.items() if k not in dask_state})
    rpc = getattr(s, "rpc", None)  # the scheduler's connection pool (to workers): open sockets
    if rpc is not None:
        dask_state["dask.rpc.available"] = len(getattr(rpc, "available", ()))
        dask_state["dask.rpc.available[*]"] = sum(len(v) for v in getattr(rpc, "available", {}).values())
        dask_state["dask.rpc.occupied[*]"] = sum(len(v) for v in getattr(rpc, "occupied", {}).values())
    stealing = s.extensions.get("stealing")
    if stealing is not None:
        _containers(stealing, "dask.stealing", dask_state, set(), roots=("distributed.stealing",))
    broker = getattr(s, "_broker", None)  # the event topics (one per worker address, client ...)
    if broker is not None:
        topics = getattr(broker, "_topics", {})
        dask_state["dask.event_topics"] = len(topics)
        dask_state["dask.event_topics[*].events"] = sum(len(getattr(t, "events", ())) for t in topics.values())
        dask_state["dask.event_topics[*].subscribers"] = sum(len(getattr(t, "subscribers", ())) for t in topics.values())
        for name, t in list(topics.items()):  # named topics (not a worker's or client's address)
            if "://" not in name and not name.startswith("Client-"):
                dask_state[f"dask.event_topics[{name}].events"] = len(t.events)
                if t.events.maxlen is not None:
                    dask_state[f"dask.event_topics[{name}].events.maxlen"] = t.events.maxlen
    counter = getattr(s, "_soak_log_counter", None)
    return {
        "pid": _os.getpid(),
        "tasks_left": len(s.tasks),
        "plugin": state,
        "plugin_types": types,
        "dask": dask_state,
        "log_records": dict(counter.counts) if counter is not None else None,
        "pools": _pools(s),
    }


def _worker_probe(dask_worker=None) -> dict:
    """In a worker: its name and pid, queued cache writes stored first, the plugin's
    containers and cache figures, log records counted in this process."""
    import os as _os

    plugin = dask_worker.plugins.get("cacheaffinity")
    state: dict = {}
    stats: dict = {}
    directory = None
    if plugin is not None:
        if hasattr(plugin, "flush"):
            plugin.flush(timeout=60.0)
        _containers(plugin, "worker_plugin", state, set())
        try:
            m = plugin.metric()
            stats = {k: v for k, v in (m.get("stats") or {}).items() if isinstance(v, (int, float))}
            directory = m.get("directory")
        except Exception:  # noqa: BLE001 - a figure, not worth failing the soak
            pass
    _module_containers(state)
    rpc = getattr(dask_worker, "rpc", None)  # connections to peers and the scheduler
    if rpc is not None:
        state["dask.rpc.available"] = len(getattr(rpc, "available", ()))
        state["dask.rpc.available[*]"] = sum(len(v) for v in getattr(rpc, "available", {}).values())
    for obj, prefix in ((dask_worker, "dask.worker"), (getattr(dask_worker, "state", None), "dask.worker.state")):
        if obj is not None:  # Dask's own worker structures, generically
            _containers(obj, prefix, state, set(), roots=())
    state["dask.data"] = len(getattr(dask_worker, "data", ()))
    state["dask.state.tasks"] = len(dask_worker.state.tasks)
    # Dask's statistical profiler: a profile per 1 s cycle, distributed.admin.low-level-log-length of them
    for name in ("profile_history", "profile_keys_history", "profile_keys"):
        v = getattr(dask_worker, name, None)
        if v is not None:
            state[f"dask.{name}"] = len(v)
            if getattr(v, "maxlen", None) is not None:
                state[f"dask.{name}.maxlen"] = v.maxlen
    counter = getattr(dask_worker, "_soak_log_counter", None)
    return {
        "name": str(dask_worker.name),
        "pid": _os.getpid(),
        "plugin": state,
        "stats": stats,
        "directory": directory,
        "log_records": dict(counter.counts) if counter is not None else None,
        "pools": _pools(dask_worker),
    }


def _install_log_counter(server: Any, loggers: tuple = LOGGERS) -> None:
    """Count the records the ``loggers`` emit in this process (by logger root and level),
    on ``server._soak_log_counter`` (idempotent)."""
    import logging as _logging

    if getattr(server, "_soak_log_counter", None) is not None:
        return

    class _Counter(_logging.Handler):
        def __init__(self):
            super().__init__(level=_logging.NOTSET)
            self.counts: dict = {}

        def emit(self, record):
            root = record.name.split(".", 1)[0]
            key = f"{root}:{'warning+' if record.levelno >= _logging.WARNING else 'info-'}"
            self.counts[key] = self.counts.get(key, 0) + 1

    h = _Counter()
    for name in loggers:
        _logging.getLogger(name).addHandler(h)
    server._soak_log_counter = h


def _install_on_scheduler(dask_scheduler=None) -> None:
    _install_log_counter(dask_scheduler)


class SoakWorkerPlugin(WorkerPlugin):
    """Worker plugin of the soak: counts the records the ``distributed`` and
    ``cacheaffinity`` loggers emit in the worker process (:func:`_install_log_counter`),
    and kills the process (``SIGKILL``) when it starts executing its n-th task after
    :func:`_arm_kill` (a crash in the middle of a run).  Registered once: every new
    worker process (restarted, scaled up) gets it, unarmed."""

    name = "soak"
    idempotent = True

    def setup(self, worker) -> None:
        self.worker = worker
        _install_log_counter(worker)
        _watch_event_loop(worker)

    def teardown(self, worker) -> None:
        import faulthandler

        faulthandler.cancel_dump_traceback_later()

    def transition(self, key, start, finish, **kwargs) -> None:
        n = getattr(self.worker, "_soak_kill_after", None)
        if n and finish == "executing":
            self.worker._soak_kill_after = n - 1
            if n == 1:
                import os as _os
                import signal as _signal

                _os.kill(_os.getpid(), _signal.SIGKILL)


#: Seconds a worker's event loop may stall before every thread's stack is printed.
STALL_S = 120.0


def _watch_event_loop(worker, stall_s: float = STALL_S, every_s: float = 5.0) -> None:
    """If the worker's event loop stops for ``stall_s`` (a deadlock, a blocking call: the
    scheduler drops the worker after ``worker-ttl`` without a cause), faulthandler's watchdog
    (a C thread, it needs no GIL) prints every thread's stack to the process's stderr, again
    every ``stall_s`` while it lasts.  The loop re-arms it every ``every_s``."""
    import faulthandler

    from tornado.ioloop import PeriodicCallback

    def rearm() -> None:
        faulthandler.dump_traceback_later(stall_s, repeat=True)

    rearm()
    pc = PeriodicCallback(rearm, every_s * 1000)
    worker.periodic_callbacks["soak-stall-watch"] = pc
    pc.start()


def _arm_kill(dask_worker=None, after: int = 1) -> int:
    """In a worker: die when starting the ``after``-th task from now (0: disarm); its pid."""
    import os as _os

    dask_worker._soak_kill_after = after
    return _os.getpid()
