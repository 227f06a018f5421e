"""pytest plugin: coffea's own executor tests with CacheAffinityExecutor in place of coffea's executors.

Loaded by ``tests/test_coffea_upstream.py`` into a pytest run over coffea's
source-distribution tests (``-p coffea_upstream_plugin --ca-executors=dask,cacheaffinity``,
working directory = the unpacked sdist, because coffea's tests name their
samples ``tests/samples/...``).  Nothing of coffea's tests is copied; this
plugin only changes which executor they construct:

- a test parametrized over ``executor`` (``test_nanoevents_analysis``,
  ``test_use_result_type_*``: ``[IterativeExecutor, FuturesExecutor]``) gets,
  instead, one executor factory per kind in ``--ca-executors``: ``dask`` builds
  ``coffea.processor.DaskExecutor``, ``cacheaffinity`` builds
  ``CacheAffinityExecutor``, both on the same cluster.  The hook runs before
  pytest's own ``pytest_generate_tests`` and swaps the ``parametrize`` mark on
  the test's definition, so test ids read ``...-dask-...`` / ``...-cacheaffinity-...``;
- a test in :data:`BODY_TESTS` (it builds ``processor.IterativeExecutor()`` in
  its body) gets a ``ca_kind`` parameter and, for its duration, a stand-in for
  the name ``processor`` in its module whose ``IterativeExecutor`` and
  ``FuturesExecutor`` build the selected executor (all else is coffea.processor);
- all other tests are deselected;
- the cluster: one ``LocalCluster`` (2 workers, threads) with the cacheaffinity
  scheduler and worker plugins (``distributed.*.preload``), column caches in a
  temporary directory kept for the whole session (later cases hit caches that
  earlier ones filled, as in real use);
- before every test coffea's process-wide metadata cache is cleared and
  checkpoint directories left by ``test_checkpointing`` are removed.

Private coffea name used here (test support only): ``coffea.processor.executor.DEFAULT_METADATA_CACHE``.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import types

import pytest

#: Tests that construct their executor in the body: test function names.
BODY_TESTS = {"test_preload_executor", "test_checkpointing"}

_STATE: dict = {}


def pytest_addoption(parser):
    parser.addoption(
        "--ca-executors",
        default="dask,cacheaffinity",
        help="comma-separated executor kinds: dask, cacheaffinity",
    )


def _client():
    if "client" not in _STATE:
        import dask
        from distributed import Client, LocalCluster

        root = tempfile.mkdtemp(prefix="ca-upstream-")
        _STATE["root"] = root
        cfg = dask.config.set(
            {
                "distributed.scheduler.preload": ["cacheaffinity"],
                "distributed.worker.preload": ["cacheaffinity"],
                "cacheaffinity.worker.directory": os.path.join(root, "node-{name}"),
            }
        )
        cfg.__enter__()
        cluster = LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        )
        _STATE["cluster"] = cluster
        _STATE["client"] = Client(cluster, set_as_default=False)
    return _STATE["client"]


def pytest_unconfigure(config):
    if "client" in _STATE:
        _STATE["client"].close()
        _STATE["cluster"].close()
        shutil.rmtree(_STATE["root"], ignore_errors=True)
        _STATE.clear()


class ExecutorFactory:
    """Builds the executor of one kind on the session cluster; called like a
    coffea executor class (``executor(compression=...)``)."""

    def __init__(self, kind: str):
        if kind not in ("dask", "cacheaffinity"):
            raise ValueError(f"--ca-executors: unknown kind {kind!r}; allowed: dask, cacheaffinity")
        self.kind = kind

    def __call__(self, **kwargs):
        from coffea.processor import DaskExecutor

        from cacheaffinity import CacheAffinityExecutor

        cls = DaskExecutor if self.kind == "dask" else CacheAffinityExecutor
        kwargs.setdefault("status", False)
        return cls(client=_client(), **kwargs)

    def __repr__(self) -> str:
        return self.kind


def _kinds(config) -> list[str]:
    return [k for k in config.getoption("ca_executors").split(",") if k]


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc):
    kinds = _kinds(metafunc.config)
    definition = metafunc.definition
    swapped = False
    marks = []
    for mark in definition.own_markers:
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames")
        if mark.name == "parametrize" and names in ("executor", ["executor"], ("executor",)):
            mark = pytest.mark.parametrize(
                "executor", [ExecutorFactory(k) for k in kinds], ids=kinds
            ).mark
            swapped = True
        marks.append(mark)
    definition.own_markers[:] = marks
    if not swapped and metafunc.function.__name__ in BODY_TESTS:
        metafunc.fixturenames.append("ca_kind")
        metafunc.parametrize("ca_kind", kinds)


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if isinstance(params.get("executor"), ExecutorFactory) or "ca_kind" in params:
            keep.append(item)
        else:
            drop.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(autouse=True)
def _fresh_coffea_state(request):
    from coffea.processor import executor as coffea_executor

    coffea_executor.DEFAULT_METADATA_CACHE.clear()
    for d in glob.glob(os.path.join(os.getcwd(), "tests", "test_checkpointing_*")):
        shutil.rmtree(d, ignore_errors=True)
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    kind = params.get("ca_kind")
    if kind is None:
        yield
        return
    import coffea.processor as real

    factory = ExecutorFactory(kind)
    standin = types.SimpleNamespace(
        **{n: getattr(real, n) for n in dir(real) if not n.startswith("__")}
    )
    standin.IterativeExecutor = factory
    standin.FuturesExecutor = factory
    module = request.module
    original = module.processor
    module.processor = standin
    try:
        yield
    finally:
        module.processor = original
