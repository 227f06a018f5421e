"""The facility node shape for the benchmarks' clusters: N cache nodes x P worker processes.

On an analysis facility several worker processes of one node (``dask worker --nworkers P``,
dask-jobqueue's ``processes=``) share the node's cache directory.  :func:`node_cluster`
builds that on this machine: a ``SpecCluster`` of a scheduler and N x P nannies named
``"<node>-<process>"``, each started with its node's directory
(``cacheaffinity.worker.directory``, as ``--cache-directory`` gives it); everything else is
the Dask config in force, as ``LocalCluster`` gives it.  :func:`parse_shape` reads
``NxP`` from a command line."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from distributed import Nanny, Scheduler, SpecCluster

__all__ = ["node_cluster", "node_names", "parse_shape"]


def parse_shape(text: str) -> tuple[int, int]:
    """``"2x2"`` -> ``(2, 2)``: cache nodes x worker processes per node."""
    try:
        nodes, per_node = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"node shape {text!r}: give NODESxPROCESSES, e.g. 2x2 or 4x1") from None
    if nodes < 1 or per_node < 1:
        raise ValueError(f"node shape {text!r}: both numbers must be >= 1")
    return nodes, per_node


def node_names(nodes: int, per_node: int) -> list[str]:
    """The workers' names, node by node."""
    return [f"{n}-{p}" for n in range(nodes) for p in range(per_node)]


def node_cluster(nodes: int, per_node: int, directory: Callable[[int], Path], *,
                 local_directory: str | None = None, name: str = "nodes") -> SpecCluster:  # fmt: skip
    """A started cluster of ``nodes`` x ``per_node`` single-threaded worker processes on
    127.0.0.1; node ``n``'s processes share ``directory(n)``."""
    from distributed.worker_memory import parse_memory_limit

    total = nodes * per_node
    memory = parse_memory_limit("auto", 1, total, logger=logging.getLogger(__name__))
    workers = {}
    for n in range(nodes):
        for p in range(per_node):
            options = {
                "nthreads": 1, "host": "127.0.0.1", "memory_limit": memory, "silence_logs": logging.WARNING,
                "config": {"cacheaffinity.worker.directory": str(directory(n))},
            }  # fmt: skip
            if local_directory is not None:
                options["local_directory"] = local_directory
            workers[f"{n}-{p}"] = {"cls": Nanny, "options": options}
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"}}
    return SpecCluster(scheduler=scheduler, workers=workers, silence_logs=logging.WARNING, name=name)
