"""The coffea executor: cache-affine analysis runs (client).

``CacheAffinityExecutor`` changes only how ``DaskExecutor`` submits tasks:
chunk and preprocessing tasks carry their chunk identity, so the scheduler
plugin sends them to their cache node run after run, and run as ``ChunkTask``
/ ``MetadataTask`` behind the identity-checked node caches.  It refuses a
client whose scheduler lacks the cacheaffinity plugin, warns once per run about
nodes that cache nothing, and keeps the figures its chunk tasks reported.  Retries, tree reduction, compression,
``skipbadfiles`` and the rest are ``DaskExecutor``'s own code.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import uuid
from dataclasses import dataclass, field, fields

import dask

from coffea.processor import DaskExecutor

from cacheaffinity import client as ca_client
from cacheaffinity.coffea import _adapter as adapter
from cacheaffinity import config
from cacheaffinity.coffea._identity import (
    chunk_identity,
    default_stripe_entries,
    file_identities,
    warn_once,
)
from cacheaffinity.coffea._preprocess import MetadataTask
from cacheaffinity.coffea._work import ChunkTask
from cacheaffinity.protocol import RUN_ANNOTATION, RUN_FIGURES

logger = logging.getLogger("cacheaffinity.coffea")

__all__ = ["CacheAffinityExecutor", "chunk_identity"]


@dataclass
class CacheAffinityExecutor(DaskExecutor):
    """coffea ``DaskExecutor`` that places chunks on their cache node.

    Made with a client, it checks the ``cacheaffinity`` settings of this process and
    that the client's scheduler runs the plugin, and refuses (``InvalidSetting``,
    ``RuntimeError``) before any run.  A relative path in a fileset is resolved
    against this process's working directory before tasks are sent, as coffea's
    local executors read it (``events.metadata["filename"]`` is then absolute).

    Parameters
    ----------
    client : distributed.Client
        A client of a scheduler running the cacheaffinity plugin.
    node_cache : bool, optional
        Run chunks through the identity-checked node cache (default True);
        False keeps coffea's own work function.
    place_preprocessing : bool, optional
        Place preprocessing tasks by file as well (default True).
    **kwargs
        ``DaskExecutor``'s other parameters; ``worker_affinity`` (coffea's
        ``hash % n_workers`` placement) is refused.

    Attributes
    ----------
    last_run_stats : dict or None
        Figures of the last run (also ``metrics["cacheaffinity"]`` with
        ``Runner(savemetrics=True)``): ``run`` (its id), ``tasks`` and
        :data:`~cacheaffinity.protocol.RUN_FIGURES`.
    """

    node_cache: bool = True
    place_preprocessing: bool = True
    #: ``{"last": figures}``, shared with the copies coffea's ``Runner`` makes.
    run_log: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()
        config.validate()  # a misspelled setting is refused here, as a worker refuses it
        client = self.client
        # coffea's Runner copies the executor (``type(self)(**self.__dict__)``) for every
        # call: the copies share ``run_log``, so a client is asked once
        if client is not None and not getattr(client, "asynchronous", False):
            if self.run_log.get("checked") is not client:
                try:
                    ca_client.check(client, warn=False)
                except RuntimeError as e:
                    raise RuntimeError(f"CacheAffinityExecutor(client=...): {e}") from None
                self.run_log["checked"] = client

    @property
    def last_run_stats(self) -> dict | None:
        """Figures of the last run, or None before one."""
        return self.run_log.get("last")

    def __call__(self, items, function, accumulator):
        if len(items) == 0:
            return accumulator
        items, relative = _absolute_paths(items)
        if self.worker_affinity:
            raise ValueError(
                "CacheAffinityExecutor(worker_affinity=True): worker_affinity is coffea's "
                "hash % n_workers placement, which CacheAffinityExecutor replaces; "
                "drop worker_affinity=True"
            )
        if self.client is None:
            raise ValueError(
                "CacheAffinityExecutor needs a client of a scheduler running cacheaffinity: "
                "CacheAffinityExecutor(client=Client(scheduler_address))"
            )
        preprocessing = self.function_name == "get_metadata"
        ca_client.check(self.client, warn=not preprocessing)  # once per run
        if self.node_cache and preprocessing and adapter.unwrap_metadata(function) is not None:
            function = MetadataTask(function)
        elif self.node_cache and not preprocessing:
            if adapter.unwrap(function) is None:
                warn_once(
                    "function-shape",
                    "cacheaffinity: the function coffea's Runner handed the executor has an "
                    "unexpected shape (another caller or coffea version); chunks run with "
                    "coffea's own function, uncached by cacheaffinity",
                )
            else:
                function = ChunkTask(function)
        place = self.place_preprocessing or not preprocessing
        base = DaskExecutor(
            **{f.name: getattr(self, f.name) for f in fields(DaskExecutor) if f.init}
        )
        # One run id for a Runner call: its preprocessing (if any) and its chunks.
        if preprocessing:
            run = self.run_log["pending"] = uuid.uuid4().hex
        else:
            run = self.run_log.pop("pending", None) or uuid.uuid4().hex
        base.client = _ChunkClient(self.client, run) if place else self.client
        result = DaskExecutor.__call__(base, items, function, accumulator)
        if relative and preprocessing:
            _relative_paths(result, relative)
        if not preprocessing:
            stats = self._run_stats(run)
            self.run_log["last"] = stats
            out = result[0] if isinstance(result, tuple) and result else None
            if isinstance(out, dict) and isinstance(out.get("metrics"), dict):
                out["metrics"]["cacheaffinity"] = dict(stats)
        return result

    def _run_stats(self, run: str) -> dict:
        """The scheduler's figures of ``run`` (zeros if it has none, logged)."""
        try:
            found = ca_client.run_stats(self.client, run=run)
        except Exception as e:  # the analysis ran: figures are not worth failing it
            logger.warning("cacheaffinity: figures of run %s unavailable: %s", run, e)
            found = []
        stats = found[0] if found else {"run": run, "tasks": 0}
        return {
            "run": run,
            "tasks": int(stats.get("tasks", 0)),
            **{name: int(stats.get(name, 0)) for name in RUN_FIGURES},
            "forecast": stats.get("forecast"),
        }


def _local_relative(name) -> bool:
    """Whether ``name`` is a relative path of the local file system (no URL scheme)."""
    return isinstance(name, str) and bool(name) and "://" not in name and not os.path.isabs(name)


def _absolute_paths(items) -> tuple[list, dict[str, str]]:
    """``items`` with each relative file path made absolute against this process's working
    directory (workers have their own), and ``{absolute: relative}`` of those changed."""
    changed: dict[str, str] = {}

    def fix(x):
        if isinstance(x, tuple) and x:  # (item, heavy input)
            return (fix(x[0]), *x[1:])
        name = getattr(x, "filename", None)
        if not _local_relative(name) or not isinstance(x, (adapter.WorkItem, adapter.FileMeta)):
            return x
        absolute = os.path.abspath(name)
        changed[absolute] = name
        if isinstance(x, adapter.WorkItem):
            return dataclasses.replace(x, filename=absolute)
        return adapter.FileMeta(x.dataset, absolute, x.treename, x.metadata, x.preload)

    out = [fix(x) for x in items]
    return out, changed


def _relative_paths(result, relative: dict[str, str]) -> None:
    """Give preprocessing's ``FileMeta`` results their fileset paths back (the Runner
    matches them with its fileset and keys its metadata cache by them)."""
    out = result[0] if isinstance(result, tuple) and result else result
    if not isinstance(out, set):
        return
    metas = list(out)
    out.clear()
    for m in metas:
        if isinstance(m, adapter.FileMeta) and m.filename in relative:
            m = adapter.FileMeta(m.dataset, relative[m.filename], m.treename, m.metadata, m.preload)
        out.add(m)


class _ChunkClient:
    """The executor's client; a ``map`` over coffea items (not the tree reduction) gets chunk identities."""

    def __init__(self, client, run: str | None = None):
        self._client = client
        self._run = run

    def __getattr__(self, name):
        return getattr(self._client, name)

    def map(self, func, *iterables, **kwargs):
        if len(iterables) == 1:
            items = list(iterables[0])
            firsts = [x[0] if isinstance(x, tuple) and x else x for x in items]
            if items and all(isinstance(x, (adapter.WorkItem, adapter.FileMeta)) for x in firsts):
                identities = file_identities(x.filename for x in firsts)
                stripe = self._stripe_entries(firsts)
                ids = [chunk_identity(x, identities, stripe) for x in firsts]
                entries = [
                    (int(x.entrystart), int(x.entrystop))
                    if isinstance(x, adapter.WorkItem) and 0 <= x.entrystart <= x.entrystop
                    else None
                    for x in firsts
                ]
                with dask.annotate(**({RUN_ANNOTATION: self._run} if self._run else {})):
                    futures = ca_client.map_chunks(
                        self._client, func, items, chunk_ids=ids, entries=entries, **kwargs
                    )
                if self._run and isinstance(firsts[0], adapter.WorkItem):
                    self._warn_capacity()
                return futures
        return self._client.map(func, *iterables, **kwargs)

    def _warn_capacity(self) -> None:
        """Warn (once per run) when the node caches are too small for the run's chunks."""
        try:
            found = ca_client.forecast(self._client, self._run)
        except Exception as e:  # the analysis runs: a forecast is not worth failing it
            logger.debug("cacheaffinity: forecast of run %s unavailable: %r", self._run, e)
            return
        msg = None if not found else ca_client.forecast_message(found, self._run)
        if msg:
            logger.warning(msg)

    def _stripe_entries(self, items) -> int | dict[str, int] | None:
        """``client.stripe-entries``, or if null each file's default ``{filename: S}``."""
        configured = config.get("client.stripe-entries")
        chunks = [x for x in items if hasattr(x, "entrystart")]
        if configured is not None or not chunks:
            return configured
        ends: dict[str, int] = {}
        for x in chunks:
            ends[x.filename] = max(ends.get(x.filename, 0), int(x.entrystop))
        stripes = {f: default_stripe_entries(n) for f, n in ends.items()}
        logger.info(
            "cacheaffinity: placement stripes of %s entries for %d files (set "
            "cacheaffinity.client.stripe-entries to fix one size)",
            "/".join(str(s) for s in sorted(set(stripes.values()))), len(stripes),
        )  # fmt: skip
        return stripes
