"""dask-jobqueue recipes: batch-system workers that are cacheaffinity cache nodes (client side).

:func:`slurm_cluster`, :func:`htcondor_cluster` and :func:`jobqueue_cluster` (other classes)
return dask-jobqueue clusters whose scheduler (in the client process) loads the plugin and whose
workers run ``dask worker ... --preload cacheaffinity --cache-directory DIR``. DIR must be on
node-local disk, outlive the job and not depend on it: relative, home and per-job paths, and
paths on a network file system where the cluster object is created, raise ``ValueError``;
:func:`cache_filesystems` asks the running workers. Needs ``dask-jobqueue``.
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Mapping
from typing import Any

import dask.config
from dask.utils import parse_bytes

from cacheaffinity.filesystems import NETWORK_FILESYSTEMS, filesystem_of

__all__ = [
    "NETWORK_FILESYSTEMS",
    "cache_filesystems",
    "cluster_kwargs",
    "default_cache_directory",
    "filesystem_of",
    "htcondor_cluster",
    "jobqueue_cluster",
    "scheduler_options",
    "slurm_cluster",
    "worker_extra_args",
]

_INSTALL = (
    "cacheaffinity.jobqueue needs dask-jobqueue: pip install dask-jobqueue "
    "(or, from a cacheaffinity checkout, pip install \".[jobqueue]\")"
)
# Our own worker options: refused in worker_extra_args (pass them as arguments instead).
_OURS = ("--preload", "--cache-directory", "--cache-capacity", "--cache-memory", "--node-weight")
# Characters that break out of the job script's double quotes or run commands.
_FORBIDDEN = ('"', "`", "\\", "\n", "\r", "$(")
#: Variables batch systems set per job, step or array task: a new, empty cache node per job.
_PER_JOB = re.compile(
    r"\$\{?(SLURM_JOB_?ID|SLURM_ARRAY_JOB_ID|SLURM_ARRAY_TASK_ID|SLURM_STEP_ID|SLURM_PROCID"
    r"|SLURM_TMPDIR|PBS_JOBID|PBS_ARRAYID|PBS_JOBDIR|LSB_JOBID|LSB_JOBINDEX|JOB_ID|SGE_TASK_ID"
    r"|_CONDOR_SCRATCH_DIR|CONDOR_JOB_ID|FLUX_JOB_ID)\b"
)


def default_cache_directory() -> str:
    """``/tmp/cacheaffinity-<user>``: node-local, persistent across jobs on plain nodes."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name in some containers
        user = str(os.getuid())
    return f"/tmp/cacheaffinity-{user}"


def _import_jobqueue():
    try:
        import dask_jobqueue
    except ImportError as e:
        raise ImportError(_INSTALL) from e
    return dask_jobqueue


def _quote(value: str) -> str:
    # Double quotes: the job's shell still expands $VARS, spaces stay in one argument.
    return f'"{value}"'


def _check_directory(directory: Any, allow_shared_filesystem: bool) -> str:
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(
            f"cache_directory must be a path string, got {type(directory).__name__}; "
            'e.g. cache_directory="/scratch/$USER/cacheaffinity"'
        )
    d = os.fspath(directory).strip()
    if not d:
        raise ValueError(
            'cache_directory is empty; give an absolute node-local path such as '
            '"/scratch/$USER/cacheaffinity"'
        )
    bad = [c for c in _FORBIDDEN if c in d]
    if bad:
        raise ValueError(
            f"cache_directory {d!r} contains {bad[0]!r}, which cannot be passed safely through "
            "a job script; use a plain path (shell variables as $NAME or ${NAME} are fine)"
        )
    if d.startswith("~"):
        raise ValueError(
            f"cache_directory {d!r} is in a home directory, which batch clusters keep on the "
            "shared file system: every node would share one cache over the network. Use "
            'node-local disk, e.g. "/scratch/$USER/cacheaffinity" or "/tmp/cacheaffinity-$USER"'
        )
    if not d.startswith(("/", "$")):
        raise ValueError(
            f"cache_directory {d!r} is relative: the worker would resolve it against its job's "
            "working directory, usually on the shared file system. Give an absolute node-local "
            'path, e.g. "/scratch/$USER/cacheaffinity" (or one starting with a variable such '
            'as "$LOCAL_SCRATCH/cacheaffinity" that holds an absolute path on the node)'
        )
    per_job = _PER_JOB.search(d)
    if per_job:
        raise ValueError(
            f"cache_directory {d!r} contains ${per_job.group(1)}, which changes with every "
            "job: each job would be a new cache node with an empty cache (and the directory "
            "is often deleted when the job ends). Use a path that depends only on the node "
            'and the user, e.g. "/scratch/$USER/cacheaffinity"'
        )
    if not allow_shared_filesystem and "$" not in d:
        fs = filesystem_of(d.replace("{name}", "x"))
        if fs["shared"]:
            raise ValueError(
                f"cache_directory {d!r} is on a {fs['fstype']} file system (mounted at "
                f"{fs['mount']}) here, i.e. shared between machines: one cache would serve "
                "every node over the network. Use node-local disk, or pass "
                "allow_shared_filesystem=True if the worker nodes mount it locally"
            )
    return d


def worker_extra_args(
    cache_directory: str | os.PathLike | None = None,
    *,
    cache_capacity: str | int | None = None,
    cache_memory: str | int | None = None,
    node_weight: float | None = None,
    allow_shared_filesystem: bool = False,
) -> list[str]:
    """The ``dask worker`` arguments that make a job's workers cache nodes:
    ``["--preload", "cacheaffinity", "--cache-directory", '"DIR"', ...]``, to come last on the
    command line (the preload takes the options after it)."""
    d = _check_directory(
        default_cache_directory() if cache_directory is None else cache_directory,
        allow_shared_filesystem,
    )
    args = ["--preload", "cacheaffinity", "--cache-directory", _quote(d)]
    for option, value in (("--cache-capacity", cache_capacity), ("--cache-memory", cache_memory)):
        if value is None:
            continue
        try:
            n = parse_bytes(value)
        except (ValueError, TypeError) as e:
            raise ValueError(
                f"{option.lstrip('-').replace('-', '_')}={value!r} is not a size; "
                'give bytes or a string such as "200 GiB"'
            ) from e
        if n <= 0:
            raise ValueError(f"{option.lstrip('-').replace('-', '_')}={value!r} must be > 0")
        args += [option, str(n)]
    if node_weight is not None:
        w = float(node_weight)
        if not w > 0 or w == float("inf"):
            raise ValueError(f"node_weight={node_weight!r} must be a finite number > 0")
        args += ["--node-weight", repr(w)]
    return args


def scheduler_options(
    options: Mapping[str, Any] | None = None, *, balance: float | None = None
) -> dict[str, Any]:
    """``scheduler_options`` with the cacheaffinity preload added (others kept)."""
    out = dict(options or {})
    preload = out.get("preload") or []
    preload = [preload] if isinstance(preload, str) else list(preload)
    argv = out.get("preload_argv") or []
    if argv and isinstance(argv[0], str):  # one argv for every preload
        argv = [list(argv)] * len(preload)
    argv = [list(a) for a in argv] or [[] for _ in preload]
    if len(argv) != len(preload):
        raise ValueError(
            f"scheduler_options has {len(preload)} preloads but {len(argv)} preload_argv lists"
        )
    if balance is not None:
        if isinstance(balance, bool) or not isinstance(balance, (int, float)) or not (
            1.0 < balance < float("inf")
        ):
            raise ValueError(
                f"balance={balance!r} must be a number > 1 (a node's cap in fair shares of a "
                "batch, e.g. 1.05); a failing scheduler preload would only be logged"
            )
    ours = [] if balance is None else ["--balance", repr(float(balance))]
    if "cacheaffinity" in preload:
        argv[preload.index("cacheaffinity")] = ours or argv[preload.index("cacheaffinity")]
    else:
        preload.append("cacheaffinity")
        argv.append(ours)
    out["preload"] = preload
    out["preload_argv"] = argv
    return out


def cluster_kwargs(
    *,
    cache_directory: str | os.PathLike | None = None,
    cache_capacity: str | int | None = None,
    cache_memory: str | int | None = None,
    node_weight: float | None = None,
    balance: float | None = None,
    allow_shared_filesystem: bool = False,
    jobqueue_config: str | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Keyword arguments for any ``dask_jobqueue`` cluster class, with cacheaffinity added.

    ``kwargs`` are the cluster's own (``worker_extra_args`` kept, before ours);
    ``jobqueue_config`` (``"slurm"`` ...) names the ``jobqueue.<name>`` section whose
    ``worker-extra-args`` and ``scheduler-options`` apply when those arguments are not given
    (passing ours explicitly would otherwise hide the user's dask-jobqueue config).
    """
    if jobqueue_config:
        for arg, key in (
            ("worker_extra_args", "worker-extra-args"),
            ("scheduler_options", "scheduler-options"),
        ):
            if kwargs.get(arg) is None:
                kwargs[arg] = dask.config.get(f"jobqueue.{jobqueue_config}.{key}", None)
    extra = list(kwargs.pop("worker_extra_args", None) or [])
    clash = [a for a in extra if str(a).split("=")[0] in _OURS]
    if clash:
        raise ValueError(
            f"worker_extra_args contains {clash[0]!r}: cacheaffinity adds the preload and its "
            "options itself; pass cache_directory=, cache_capacity=, cache_memory=, "
            "node_weight= instead"
        )
    extra += worker_extra_args(
        cache_directory,
        cache_capacity=cache_capacity,
        cache_memory=cache_memory,
        node_weight=node_weight,
        allow_shared_filesystem=allow_shared_filesystem,
    )
    kwargs["worker_extra_args"] = extra
    kwargs["scheduler_options"] = scheduler_options(kwargs.get("scheduler_options"), balance=balance)
    return kwargs


def jobqueue_cluster(cluster_cls, **kwargs: Any):
    """A ``dask_jobqueue`` cluster of class ``cluster_cls`` (``PBSCluster`` ...) whose scheduler
    runs the cacheaffinity plugin and whose workers are cache nodes; see :func:`cluster_kwargs`."""
    config = kwargs.get("config_name") or getattr(
        getattr(cluster_cls, "job_cls", None), "config_name", None
    )
    _ensure_jobqueue_defaults(config)
    return cluster_cls(**cluster_kwargs(jobqueue_config=config, **kwargs))


def _ensure_jobqueue_defaults(config_name: str | None) -> None:
    """Put dask-jobqueue's defaults (added once, at import) back where code that replaced the
    Dask config wholesale dropped them (clusters then fail with ``KeyError: 'jobqueue'``)."""
    if config_name and dask.config.get(f"jobqueue.{config_name}.cores", None) is None:
        from dask_jobqueue.config import reconfigure

        reconfigure()  # update_defaults: keeps values the user set


def slurm_cluster(**kwargs: Any):
    """``dask_jobqueue.SLURMCluster`` with cacheaffinity (arguments: :func:`cluster_kwargs`)."""
    return jobqueue_cluster(_import_jobqueue().SLURMCluster, **kwargs)


def htcondor_cluster(**kwargs: Any):
    """``dask_jobqueue.HTCondorCluster`` with cacheaffinity (arguments: :func:`cluster_kwargs`);
    refuses ``$TMPDIR`` (``$_CONDOR_SCRATCH_DIR``), which HTCondor deletes with the job."""
    d = kwargs.get("cache_directory")
    if d is not None and re.search(r"\$\{?(TMPDIR|_CONDOR_SCRATCH_DIR)\b", os.fspath(d)):
        raise ValueError(
            f"cache_directory {os.fspath(d)!r} is inside the HTCondor job's scratch directory, "
            "which HTCondor deletes when the job ends: the node would lose its cache and its "
            "identity with every job. Use a persistent node-local path such as "
            '"/scratch/<user>/cacheaffinity"'
        )
    return jobqueue_cluster(_import_jobqueue().HTCondorCluster, **kwargs)


def _worker_filesystem(dask_worker=None) -> dict | None:
    from cacheaffinity.protocol import PLUGIN_NAME

    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    directory = getattr(plugin, "directory", None)
    if not directory:
        return None
    out = filesystem_of(directory)
    out["node"] = getattr(plugin, "node_id", None)
    return out


def cache_filesystems(client) -> dict[str, dict]:
    """Ask every worker with the plugin where its cache directory is:
    ``{worker address: {"path", "node", "mount", "fstype", "shared"}}``."""
    return {a: v for a, v in client.run(_worker_filesystem).items() if v is not None}
