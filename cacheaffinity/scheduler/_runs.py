"""Per-run figures of chunk tasks (runs in the scheduler).

``RunFigures`` adds up, per run (the tasks of one coffea ``Runner`` call, named by
the ``cacheaffinity-run`` annotation; else one per submitted graph), the figures
(:data:`~cacheaffinity.protocol.RUN_FIGURES`) each task reported when it ended and
the run's steals, and the tasks that failed (a failed run). Sums of the run's own reports
never go negative when a worker restarts; a task run twice counts twice. Memory: the last ``keep`` runs and an
entry per chunk task the scheduler has. Event-loop only.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Hashable, Mapping
from itertools import repeat
from typing import Any

from cacheaffinity.protocol import RUN_FIGURES

__all__ = ["RunFigures"]


class RunFigures:
    """Figures of the last ``keep`` runs, from their chunk tasks' own reports."""

    def __init__(self, keep: int = 20):
        self.keep = int(keep)
        self.runs: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.task_run: dict[Hashable, str] = {}

    def _record(self, run: str) -> dict[str, Any]:
        rec = self.runs.get(run)
        if rec is None:
            rec = self.runs[run] = {
                "run": run,
                "started": time.time(),
                "updated": time.time(),
                "tasks": 0,
                "failed_tasks": 0,
                "error": None,
                "figures": Counter(),
            }
            while len(self.runs) > self.keep:
                self.runs.popitem(last=False)
        return rec

    def submitted(self, keys_runs: Mapping[Hashable, str]) -> None:
        """Chunk tasks ``{key: run}`` were submitted."""
        task_run = self.task_run
        if task_run.keys().isdisjoint(keys_runs.keys()):  # all new: no per-task loop
            task_run.update(keys_runs)
            per_run: Counter[str] = Counter(keys_runs.values())
        else:
            per_run = Counter()
            for key, run in keys_runs.items():
                if task_run.get(key) != run:
                    task_run[key] = run
                    per_run[run] += 1
        for run, n in per_run.items():
            self._record(run)["tasks"] += n

    def submitted_keys(self, keys: list[Hashable], run: str) -> None:
        """Chunk tasks ``keys``, all of ``run``, were submitted (:meth:`submitted` without
        a dict of them)."""
        task_run = self.task_run
        if task_run.keys().isdisjoint(keys):  # all new: no per-task loop
            task_run.update(zip(keys, repeat(run)))
            n = len(keys)
        else:
            n = 0
            for key in keys:
                if task_run.get(key) != run:
                    task_run[key] = run
                    n += 1
        if n:
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

    def erred(self, key: Hashable, run: str | None, error: Any = None) -> None:
        """Task ``key`` of ``run`` (a chunk or preprocessing task) failed: the run is marked
        failed, with the first error's text."""
        run = run or self.task_run.get(key)
        if not run:
            return
        rec = self._record(str(run))
        rec["failed_tasks"] = rec.get("failed_tasks", 0) + 1
        if not rec.get("error"):
            text = " ".join(str(error or "").split())
            rec["error"] = text[:300] or "a task failed"
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
        """Records ``{"run", "started", "updated", "tasks", "failed_tasks", "error", <figure>: n}``
        of run ``run`` (``[]``: unknown), or of the ``last`` runs, newest last; a run with
        ``failed_tasks`` failed (``error``: the first task error's text)."""
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
