"""What ``benchmarks/soak.py`` runs: its :class:`Config` (the command-line options)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT / ".bench-data" / "soak"


# ----------------------------------------------------------------------------- config


@dataclasses.dataclass
class Config:
    """What to run (the command-line options, see ``--help``)."""

    runs: int = 300
    #: cache nodes (with ``per_node`` 1, the default: worker processes)
    workers: int = 4
    #: worker processes per cache node, sharing its directory (the facility node shape,
    #: :func:`benchmarks._clusters.node_cluster`; names ``"<node>-<process>"``)
    per_node: int = 1
    seed: int = 36
    #: dataset name -> (events, files, generator seed)
    datasets: dict = dataclasses.field(
        default_factory=lambda: {"dy": [6000, 3, 101], "tt": [4000, 2, 202]}
    )
    basket_events: int = 250
    chunksize: int = 500
    chunksize_after: int = 300
    #: the run before which the chunksize changes (None: half way)
    chunksize_change_at: int | None = None
    #: node cache capacity (each node)
    capacity: str = "16 MiB"
    kill_every: int = 25
    scale_every: int = 40
    scaled_down_runs: int = 5
    new_process_every: int = 10
    #: share of steps in which both users run at once
    concurrent_share: float = 0.15
    #: seconds a run may take before it counts as hung
    timeout: float = 240.0
    warmup: int = 20
    #: runs a new worker process (killed and restarted, scaled up) lives before it counts
    restart_warmup: int = 10
    #: Dask's statistical profiler in the workers (``distributed.worker.profile.enabled``,
    #: on by default: a profile per second, ``profile_history`` of them, tens of MB per
    #: worker here)
    profiler: bool = True
    #: profiles (1 s cycles) a worker keeps, ``distributed.admin.low-level-log-length``
    #: (Dask's default 1000: ~17 min, longer than a worker lives in the soak, so its RSS
    #: would grow all its life; None: Dask's default)
    profile_history: int | None = 60
    data: str = str(DEFAULT_DATA)
    workdir: str | None = None
    progress: bool = True
    #: steps between two samples (1: after every step); the first and the last step,
    #: and every step with an event (a kill, a scale), are sampled too.  A long soak
    #: samples every 10th step: its runs, not its measurements, fill the hours
    sample_every: int = 1

    def change_at(self) -> int:
        return self.chunksize_change_at if self.chunksize_change_at is not None else self.runs // 2 + 1

    def processes(self) -> int:
        return self.workers * self.per_node

    def check(self) -> None:
        if self.per_node < 1:
            raise ValueError(f"per_node={self.per_node}: need >= 1 worker process per node")
        if self.per_node > 1 and self.scale_every:
            raise ValueError(f"per_node={self.per_node}: scaling removes and adds single worker processes "
                             "of no node; give --scale-every 0 with --per-node")
        if self.workers < 2 and self.scale_every:
            raise ValueError(f"workers={self.workers}: need >= 2 (one is scaled away)")
        if self.sample_every < 1:
            raise ValueError(f"sample_every={self.sample_every}: need >= 1")
        if self.runs < 2:
            raise ValueError(f"runs={self.runs}: need >= 2")
        if not 0 <= self.concurrent_share <= 1:
            raise ValueError(f"concurrent_share={self.concurrent_share}: a share in [0, 1]")
        if len(self.datasets) < 1:
            raise ValueError("no dataset")
