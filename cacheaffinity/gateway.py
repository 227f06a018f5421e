"""cacheaffinity on dask-gateway: the administrator's configuration and the user's cluster.

:func:`configure` and :func:`environment` run in dask-gateway-server while it reads its
``dask_gateway_config.py`` (they only set traitlets values); :func:`new_cluster` runs in the
client. Clusters load the click-free ``--preload cacheaffinity.preload`` (the gateway adds a click
preload of its own) with settings as ``DASK_CACHEAFFINITY__*`` variables. Only :func:`new_cluster`
and its two helpers import ``dask_gateway``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from cacheaffinity import config

__all__ = [
    "PRELOAD",
    "configure",
    "ensure_gateway_defaults",
    "environment",
    "new_cluster",
    "quiet_double_close",
]

#: The click-free preload module (composes with dask-gateway's scheduler preload).
PRELOAD = "cacheaffinity.preload"

#: Keyword arguments of :func:`environment` -> cacheaffinity config key.
_SETTINGS = {
    "directory": "worker.directory",
    "capacity": "worker.capacity",
    "memory": "worker.memory",
    "weight": "worker.weight",
    "shared_group": "worker.shared-group",
    "balance": "scheduler.balance",
}


def environment(**settings: Any) -> dict[str, str]:
    """``DASK_CACHEAFFINITY__*`` variables for ``directory``, ``capacity``, ``memory``, ``weight``,
    ``shared_group`` and ``balance`` (None: the default); ``ValueError`` for an unknown keyword or
    an invalid value, raised while the gateway reads its config, i.e. at its start."""
    env: dict[str, str] = {}
    for name, value in settings.items():
        if name not in _SETTINGS:
            raise ValueError(
                f"cacheaffinity.gateway: unknown setting {name}={value!r}; the settings "
                f"are {', '.join(sorted(_SETTINGS))}, e.g. "
                'configure(c, directory="/scratch/cacheaffinity-{host}", capacity="200 GiB")'
            )
        if value is None:
            continue
        key = _SETTINGS[name]
        config.check(key, value, source="argument")
        if name == "directory" and not str(value).strip().startswith(("/", "~", "$")):
            raise ValueError(
                f"cacheaffinity.gateway: directory={value!r} is relative: each worker would "
                "resolve it against its own working directory (a per-cluster directory of "
                "the gateway, often on a shared file system). Give an absolute node-local "
                'path, e.g. directory="/scratch/cacheaffinity-{host}"'
            )
        if name == "directory" and "{name}" in str(value):
            raise ValueError(
                f"cacheaffinity.gateway: directory={value!r} contains {{name}}, but "
                "dask-gateway names its workers at random at every launch, so every "
                "cluster would start with empty caches; key it by host instead, e.g. "
                'directory="/scratch/cacheaffinity-{host}"'
            )
        section, leaf = key.split(".")
        variable = f"DASK_CACHEAFFINITY__{section.upper()}__{leaf.upper().replace('-', '_')}"
        env[variable] = str(value)
    return env


def configure(
    c: Any,
    *,
    dask_command: Sequence[str] = ("dask",),
    scheduler_options: Sequence[str] = (),
    worker_options: Sequence[str] = (),
    **settings: Any,
) -> None:
    """Configure dask-gateway-server so every cluster it starts runs cacheaffinity.

    Call in ``dask_gateway_config.py`` with its config object ``c``. Sets
    ``c.ClusterConfig.scheduler_cmd``/``worker_cmd`` to ``dask_command`` (the clusters' ``dask``),
    ``scheduler``/``worker``, the ``*_options`` and the preload (the gateway's default
    ``dask-scheduler`` is gone from current distributed), and merges :func:`environment` into
    ``c.ClusterConfig.environment``.
    """
    env = environment(**settings)
    cluster = c.ClusterConfig
    base = list(dask_command)
    cluster.scheduler_cmd = [*base, "scheduler", *scheduler_options, "--preload", PRELOAD]
    cluster.worker_cmd = [*base, "worker", *worker_options, "--preload", PRELOAD]
    current = cluster.environment if "environment" in cluster else {}
    cluster.environment = {**dict(current), **env}


def quiet_double_close() -> None:
    """Make ``dask_gateway.Gateway.close`` do nothing on a closed gateway (once per process):
    ``Gateway.__del__`` closes a gateway its ``GatewayCluster`` closed, and with distributed 2026.8
    and dask-gateway 2026.3 that reads the stopped loop and prints ``Exception ignored in: ...``.
    """
    from dask_gateway import Gateway

    original = Gateway.close
    if getattr(original, "_cacheaffinity_idempotent", False):
        return

    @functools.wraps(original)
    def close(self):
        if not getattr(self, "_asynchronous", True):
            runner = getattr(self, "_loop_runner", None)
            if runner is None or not runner.is_started():
                return None  # closed already (or never started)
            try:
                self.loop  # noqa: B018  (raises once the loop it shares has stopped)
            except RuntimeError:
                runner.stop()
                return None
        return original(self)

    close._cacheaffinity_idempotent = True  # type: ignore[attr-defined]
    Gateway.close = close


def ensure_gateway_defaults() -> None:
    """Put dask-gateway's config defaults back (user values kept) where code that replaced the
    Dask config wholesale dropped them (``Gateway()`` then fails with ``KeyError: 'gateway'``)."""
    import dask

    try:
        quiet_double_close()
    except ImportError:  # no dask-gateway client here: nothing to fix
        return
    if dask.config.get("gateway.public-address", "missing") == "missing":
        import dask_gateway.config as gateway_config

        dask.config.update_defaults(gateway_config.defaults)


def new_cluster(workers: int = 2, *, gateway: Any = None, **cluster_options: Any):
    """A dask-gateway cluster scaled to ``workers`` connected workers, cacheaffinity checked.

    ``gateway`` defaults to ``Gateway()`` (the ``gateway.address`` a portal sets). Raises
    ``ImportError`` without dask-gateway, ``RuntimeError`` (the cluster shut down) if its
    scheduler has no cacheaffinity plugin.
    """
    try:
        from dask_gateway import Gateway
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "cacheaffinity.gateway.new_cluster needs the dask-gateway client: "
            "pip install dask-gateway (or, from a cacheaffinity checkout, pip install \".[gateway]\")"
        ) from e
    from cacheaffinity.client import check

    quiet_double_close()
    if gateway is None:
        ensure_gateway_defaults()
        gateway = Gateway()
    options = gateway.cluster_options() if cluster_options else None
    if options is not None:
        options.update(cluster_options)
    cluster = gateway.new_cluster(options)
    try:
        cluster.scale(workers)
        client = cluster.get_client(set_as_default=False)
        try:
            client.wait_for_workers(workers)
            check(client)
        finally:
            client.close()
    except BaseException:
        cluster.shutdown()
        raise
    return cluster
