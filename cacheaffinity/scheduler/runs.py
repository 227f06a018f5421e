"""Per-run figures of chunk tasks (runs in the scheduler).

Defines :class:`RunFigures`, which the placement plugin
(:mod:`cacheaffinity.scheduler.plugin`) keeps: for each *run* (the chunk tasks
the coffea executor submitted for one ``Runner`` call, named by the task
annotation ``cacheaffinity-run``; tasks without it form a run per submitted
graph) it adds up the figures each chunk task reported about itself when it
ended (topic ``cacheaffinity-task``, see :func:`cacheaffinity.coffea.work.report_task`)
and the steals of its tasks.  The names are :data:`~cacheaffinity.protocol.RUN_FIGURES`.

Figures come from the run's own tasks, never from differences of node totals:
they cannot go negative when a worker restarts.  A task that ran twice (its
worker died after it ended) reports twice: the figures say what the run did.

Notes
-----
Event-loop only (no locking).  Memory: the last :attr:`RunFigures.keep` runs,
and one entry per chunk task the scheduler still has.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Hashable, Mapping
from typing import Any

from cacheaffinity.protocol import RUN_FIGURES

__all__ = ["RunFigures"]


class RunFigures:
    """Figures of the last runs, from their chunk tasks' own reports.

    Parameters
    ----------
    keep
        Runs kept at most (the oldest go first).
    """

    def __init__(self, keep: int = 20):
        #: Runs kept at most.
        self.keep = int(keep)
        #: run id -> its record (oldest first): see :meth:`get`.
        self.runs: OrderedDict[str, dict[str, Any]] = OrderedDict()
        #: task key -> run id, for the chunk tasks the scheduler still has
        self.task_run: dict[Hashable, str] = {}

    def _record(self, run: str) -> dict[str, Any]:
        rec = self.runs.get(run)
        if rec is None:
            rec = self.runs[run] = {
                "run": run,
                "started": time.time(),
                "updated": time.time(),
                "tasks": 0,
                "figures": Counter(),
            }
            while len(self.runs) > self.keep:
                self.runs.popitem(last=False)
        return rec

    def submitted(self, keys_runs: Mapping[Hashable, str]) -> None:
        """Chunk tasks ``{key: run}`` were submitted."""
        per_run: Counter[str] = Counter()
        for key, run in keys_runs.items():
            if self.task_run.get(key) != run:
                self.task_run[key] = run
                per_run[run] += 1
        for run, n in per_run.items():
            self._record(run)["tasks"] += n

    def report(self, msg: Mapping[str, Any]) -> None:
        """A chunk task's report: ``{"key", "run", <figure>: n, ...}``."""
        run = msg.get("run") or self.task_run.get(msg.get("key"))
        if not run:
            return
        rec = self._record(str(run))
        figures = rec["figures"]
        for name in RUN_FIGURES:
            v = msg.get(name)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                figures[name] += v
        rec["updated"] = time.time()

    def steal(self, key: Hashable) -> None:
        """The stealing policy moved chunk task ``key``."""
        run = self.task_run.get(key)
        if run is not None and run in self.runs:
            self.runs[run]["figures"]["steals"] += 1

    def forget(self, key: Hashable) -> None:
        """The scheduler forgot task ``key``."""
        self.task_run.pop(key, None)

    def get(self, run: str | None = None, last: int = 1) -> list[dict[str, Any]]:
        """The records of run ``run`` (``[]`` if unknown), or of the ``last``
        runs (newest last): ``{"run", "started", "updated", "tasks", <figure>: n}``
        with every figure of :data:`~cacheaffinity.protocol.RUN_FIGURES`."""
        if run is not None:
            recs = [self.runs[run]] if run in self.runs else []
        else:
            recs = list(self.runs.values())[-max(0, int(last)) :] if last else []
        out = []
        for rec in recs:
            row = {k: v for k, v in rec.items() if k != "figures"}
            row.update({name: int(rec["figures"].get(name, 0)) for name in RUN_FIGURES})
            out.append(row)
        return out
