"""cacheaffinity on dask-gateway: the administrator's configuration and the user's cluster.

Defines :func:`configure` and :func:`environment`, run by **dask-gateway-server**
while it reads its ``dask_gateway_config.py`` (they only set traitlets values:
no Dask cluster runs there), and :func:`new_cluster`, run in the **client**
(a Jupyter kernel) to get a gateway cluster with cacheaffinity.

What a gateway-managed cluster needs
    * The scheduler runs :class:`~cacheaffinity.scheduler.CacheAffinityPlugin`.
      dask-gateway appends its own click-configurable preload
      (``dask_gateway.scheduler_preload``) to every scheduler command, and
      distributed refuses a second click preload, so the scheduler loads the
      click-free ``--preload cacheaffinity.preload`` (:mod:`cacheaffinity.preload`),
      which takes its settings from the Dask config.
    * Workers run :class:`~cacheaffinity.worker._plugin.CacheWorkerPlugin` (the same
      preload) with a cache directory on node-local disk.  Gateway worker names
      are random per launch (32 hex digits), so the directory must not
      contain ``{name}``: the default (``~/.cache/cacheaffinity`` when local) or a
      path keyed by host (``/scratch/cacheaffinity-{host}``) keeps a node's cache,
      and its node id, across clusters.
    * Settings travel as ``DASK_CACHEAFFINITY__*`` environment variables in
      ``c.ClusterConfig.environment``, which the gateway passes to the scheduler
      and every worker.

``dask_gateway_config.py``::

    import cacheaffinity.gateway
    cacheaffinity.gateway.configure(c, directory="/scratch/cacheaffinity-{host}",
                                    capacity="200 GiB")

In a notebook::

    cluster = cacheaffinity.gateway.new_cluster(workers=4)
    client = cluster.get_client()

``dask_gateway`` (the client package, extra ``gateway``) is
imported only by :func:`new_cluster`; :func:`configure` needs nothing but the
gateway server's config object.
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
    """``DASK_CACHEAFFINITY__*`` environment variables for the given settings.

    Parameters
    ----------
    **settings
        ``directory``, ``capacity``, ``memory``, ``weight``, ``shared_group``
        (worker settings, resolved on each worker) and ``balance`` (scheduler);
        None or absent leaves the default.

    Returns
    -------
    dict
        Variable name -> value, e.g.
        ``{"DASK_CACHEAFFINITY__WORKER__CAPACITY": "200 GiB"}``.

    Raises
    ------
    ValueError
        For an unknown keyword or an invalid value, naming the setting, the
        value and what is allowed (raised while the gateway reads its config, so
        a bad value stops the gateway at start, not every cluster later).
    """
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

    Call in ``dask_gateway_config.py`` (``c`` is the config object the gateway
    gives that file).  Sets ``c.ClusterConfig.scheduler_cmd`` and
    ``worker_cmd`` (``dask scheduler`` / ``dask worker`` with ``--preload
    cacheaffinity.preload``) and adds the settings to
    ``c.ClusterConfig.environment`` (keeping variables already set there).

    Parameters
    ----------
    c : traitlets.config.Config
        The gateway's configuration.
    dask_command : sequence of str
        The ``dask`` command of the environment the clusters run in, e.g.
        ``["/opt/conda/envs/analysis/bin/dask"]``.
    scheduler_options, worker_options : sequence of str
        Further options of ``dask scheduler`` / ``dask worker`` (the gateway adds
        its own after them), e.g. ``["--host", "127.0.0.1"]``.
    **settings
        As for :func:`environment`.

    Notes
    -----
    The gateway's default ``scheduler_cmd`` is ``dask-scheduler``, a command
    that current distributed no longer installs; this sets ``dask scheduler``.
    """
    env = environment(**settings)
    cluster = c.ClusterConfig
    base = list(dask_command)
    cluster.scheduler_cmd = [*base, "scheduler", *scheduler_options, "--preload", PRELOAD]
    cluster.worker_cmd = [*base, "worker", *worker_options, "--preload", PRELOAD]
    current = cluster.environment if "environment" in cluster else {}
    cluster.environment = {**dict(current), **env}


def quiet_double_close() -> None:
    """Make ``dask_gateway.Gateway.close`` do nothing on a closed gateway (idempotent).

    A ``GatewayCluster`` closes its own ``Gateway`` when it is closed, and
    ``Gateway.__del__`` closes it again when it is garbage-collected; with
    distributed 2026.8 the second close reads the stopped loop and prints
    ``Exception ignored in: <function Gateway.__del__ ...>`` with a traceback
    (dask-gateway 2026.3).  Applied once per process, to the class, by
    :func:`new_cluster` and :func:`ensure_gateway_defaults`; a first close is
    unchanged.
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
    """Put dask-gateway's config defaults back if the Dask config lost them.

    dask-gateway adds its defaults (``gateway.*``) once, when ``dask_gateway`` is
    first imported; code that later replaces the Dask config wholesale (test
    harnesses such as ``distributed.utils_test``, ``dask.config.config = {...}``)
    drops them, and ``Gateway()`` then fails with ``KeyError: 'gateway'``.
    Values the user set are kept (``update_defaults``).
    """
    import dask

    try:
        quiet_double_close()
    except ImportError:  # no dask-gateway client here: nothing to fix
        return
    if dask.config.get("gateway.public-address", "missing") == "missing":
        import dask_gateway.config as gateway_config

        dask.config.update_defaults(gateway_config.defaults)


def new_cluster(workers: int = 2, *, gateway: Any = None, **cluster_options: Any):
    """A dask-gateway cluster with ``workers`` workers and cacheaffinity checked.

    Parameters
    ----------
    workers : int
        Workers to scale to (the call returns once they are connected).
    gateway : dask_gateway.Gateway, optional
        Default: ``Gateway()``, i.e. the ``gateway.address`` Dask config
        (``DASK_GATEWAY__ADDRESS``) a portal sets for its users.
    **cluster_options
        The site's cluster options (``gateway.cluster_options()``).

    Returns
    -------
    dask_gateway.GatewayCluster

    Raises
    ------
    ImportError
        Without the ``dask-gateway`` package (install hint in the message).
    RuntimeError
        If the cluster's scheduler has no cacheaffinity plugin (the gateway is not
        configured with :func:`configure`); the cluster is shut down.
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
