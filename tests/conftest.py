"""Shared test set-up: the real NanoAOD samples (``nanoaod_dir``) and the test tiers.

Tiers (markers, see ``pyproject.toml``; ``make test`` runs every tier, timed):

- the default tier, ``python -m pytest``: no root, no system service, no network
  namespace, nothing outside the repository and the temporary directory; a few minutes;
- ``slow``: long runs of the same kind (whole benchmark scripts, notebooks, many runs);
- ``xrootd``, ``slurm``, ``browser``: a Debian service or program the test starts itself
  (``bash .ci/install-system-deps`` installs them, as root);
- ``root``: a second Unix user, a tmpfs mount, network namespaces (``testbed/hosts.py``);
- ``hosts``: the fault tests of the cluster in a box (``make test-hosts``);
- ``upstream``, ``soak``: coffea's own executor tests, the CI-sized soak.

Which test is in which tier is listed here (:data:`TIERS`), with the fixtures that imply
one (:data:`FIXTURE_TIERS`), so that the tiers are read in one place.

Layout: ``tests/unit/`` holds the fast tests (no Dask cluster: placement, config,
locator bookkeeping, forms, the column store; ``pytest tests/unit`` or ``pytest -m
unit`` runs them in well under a minute); every other ``tests/test_*.py`` runs
real clusters, processes or servers.  Helpers several modules share (cluster
client, coffea runs, cache-total deltas, ``dask`` processes) are in
``tests/helpers.py`` (``from helpers import ...``: this directory is on
``sys.path`` while the tests run).
"""

from __future__ import annotations

import faulthandler
import os
from pathlib import Path

import pytest

from testbed.samples import REL_SAMPLES, samples_dir

REPO = Path(__file__).resolve().parent.parent
#: the real NanoAOD samples: the repository's data/nanoaod/ or $CACHEAFFINITY_NANOAOD_DIR
NANOAOD = samples_dir()


@pytest.fixture(scope="session")
def nanoaod_dir() -> Path:
    if not (NANOAOD / "nano_dy.root").exists():
        pytest.fail(
            f"real NanoAOD samples not found in {NANOAOD}; the repository carries them in "
            f"{REL_SAMPLES} (or set CACHEAFFINITY_NANOAOD_DIR to a folder holding them)"
        )
    return NANOAOD


UNIT = Path(__file__).resolve().parent / "unit"

#: marker -> the tests it marks: ``"file.py"`` (every test of the file) or
#: ``"file.py::test_name"`` (every parametrization of that test).
TIERS: dict[str, tuple[str, ...]] = {
    "xrootd": ("test_xrootd.py", "test_consecutive_runs.py::test_xrootd_storage"),
    "slurm": ("test_slurm.py",),
    "browser": (
        "test_dashboard.py::test_page_in_headless_chromium",
        "test_operators.py::test_page_with_an_uncached_node_in_headless_chromium",
    ),
    "root": (
        "test_hosts.py",  # network namespaces
        "test_disk_faults.py",  # a tmpfs of a given size
        "test_file_modes.py::test_a_read_only_file_system_is_named_as_such",  # a read-only tmpfs
        "test_worker_plugin.py::test_a_read_only_directory_warns_once_naming_its_fix_once",  # same
    ),
    "slow": (
        "test_consecutive_runs.py",
        "test_notebooks.py",
        "test_beyond_capacity.py",
        "test_beyond_capacity_script.py",
        "test_realistic.py",
        "test_gateway.py",
        "test_new_process.py",
        "test_demo.py",
        "test_packaging.py",
        "test_operators.py::test_scheduler_commands_never_hang",
        "test_operators.py::test_per_run_figures_and_no_placement_on_the_uncached_node",
        "test_executor.py::test_cached_rerun_of_every_shared_nanoaod_file_opens_no_file",
        "test_executor.py::test_worker_killed_mid_run_still_gives_correct_result",
        "test_executor.py::test_gc_setting_freezes_once_after_the_first_chunk",
        "test_packs.py::test_chunksize_changes_hit_the_cache_and_match_coffea",
        "test_peers.py::test_rechunked_run_reads_the_neighbour_stripe_from_its_node",
        "test_coffea_inputs.py::test_file_replaced_in_place_between_runs",
        "test_coffea_inputs.py::test_processor_opens_another_tree_through_file_handle",
        "test_coffea_inputs.py::test_use_dataframes",
        "test_benchmarks_scripts.py::test_scheduler_overhead_tiny",
        "test_benchmarks_scripts.py::test_store_scale_tiny",
        "test_adversarial.py::test_orphans_of_killed_writers_are_collected",
        "test_adversarial.py::test_cli_on_a_damaged_index_then_repair",
        "test_synthetic.py::test_all_branches_by_default",
        "test_cli.py::test_where_file_lists_the_chunk_ids_the_executor_gives",
        "test_coffea_inputs.py::test_cachestrategy_with_coffea_executor_caches_root_files",
        "test_synthetic.py::test_coffea_reads_full_file",
        "test_preload_subprocess.py",
        "test_packs.py::test_entries_processed_off_their_stripe_are_found_next_run",
        "test_peers.py::test_a_peer_that_does_not_answer_is_a_miss",
    ),
}
#: fixtures whose tests are in a tier: a second Unix user and mounts need root.
FIXTURE_TIERS = {"adversary": "root", "small_disk": "root", "tiny_tmpfs": "root", "read_only_view": "root"}


def _names_a_missing_test(entry: str, modules: dict) -> bool:
    file, _, test = entry.partition("::")
    if file not in modules:
        return False  # the file was not collected: nothing to check against
    module = modules[file]
    return module is None or not test or not callable(getattr(module, test, None))


def pytest_collection_modifyitems(config, items):
    seen: set[tuple[str, str]] = set()
    modules = {Path(str(item.path)).name: getattr(item, "module", None) for item in items}
    for item in items:
        path = Path(str(item.path))
        if UNIT in path.parents:
            item.add_marker(pytest.mark.unit)
        name = item.originalname if hasattr(item, "originalname") else item.name
        tiers = {m.name for m in item.iter_markers()} & (set(TIERS) | {"hosts", "upstream", "soak"})
        for marker, tests in TIERS.items():
            for entry in tests:
                file, _, test = entry.partition("::")
                if path.name == file and (not test or test == name):
                    tiers.add(marker)
                    seen.add((marker, entry))
        for fixture, marker in FIXTURE_TIERS.items():
            if fixture in getattr(item, "fixturenames", ()):
                tiers.add(marker)
        if len(tiers) > 1:
            tiers.discard("slow")  # a test that needs a service or root runs in that tier only
        if "hosts" in tiers:
            tiers.discard("root")  # make test-hosts runs them
        for marker in tiers:
            item.add_marker(getattr(pytest.mark, marker))
    # an entry naming a test that no longer exists would silently move nothing (checked against
    # the module, so that selecting one test of a file does not make its other entries look stale)
    stale = [
        f"{m}: {e}" for m, entries in TIERS.items() for e in entries
        if (m, e) not in seen and _names_a_missing_test(e, modules)
    ]  # fmt: skip
    if stale:
        raise pytest.UsageError("tests/conftest.py TIERS names tests that do not exist: " + "; ".join(stale))


#: stderr as it was when pytest configured (a test's output is captured; this is not)
_STDERR: list[int] = []


def pytest_configure(config):
    _STDERR.append(os.dup(2))


def _limit(item) -> float:
    """The test's pytest-timeout in seconds (its marker, else the ini's; 0: none)."""
    marker = item.get_closest_marker("timeout")
    value = (marker.args[0] if marker.args else marker.kwargs.get("timeout")) if marker else None
    if value is None:
        value = item.config.getini("timeout") or 0
    return float(value or 0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test still running at twice its timeout plus a minute prints every thread's stack and
    ends the run.  pytest-timeout's signal cannot end a process whose threads all wait for the
    GIL (a deadlock like CPython gh-106883: a default-tier run hung 15 minutes, CI would have
    hung to its limit); faulthandler's watchdog is a C thread and needs no GIL."""
    limit = _limit(item)
    if limit > 0 and _STDERR:
        faulthandler.dump_traceback_later(2 * limit + 60, exit=True, file=_STDERR[0])
    try:
        yield
    finally:
        if limit > 0 and _STDERR:
            faulthandler.cancel_dump_traceback_later()
