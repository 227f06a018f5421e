# Two commands set everything up on a fresh machine:
#   make demo   - the end-to-end demo (local cluster, generated NanoAOD-like data, consecutive runs)
#   make test   - the test suite (it builds the docs too: tests/test_docs.py)
#   make docs   - the documentation site (Sphinx, warnings as errors) into docs/_build/html
# Both create .venv with the pinned dependencies (requirements/constraints.txt) first.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo docs test test-slow test-hosts test-matrix bench bench-dry bench-quick venv clean system-deps

venv: $(STAMP)

$(STAMP): pyproject.toml requirements/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c requirements/constraints.txt -e ".[test,bench]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m examples.demo

# The documentation site (docs/): user guide, configuration reference generated from
# cacheaffinity/cacheaffinity.yaml and its schema, API reference, design, benchmarks.
docs: $(STAMP)
	$(PY) -m sphinx -n -W --keep-going -b html docs docs/_build/html

# What CI runs (.ci/run), as root. Steps, each timed (tools/timed), the times printed at the end:
#   venv, system-deps   the pinned venv and the Debian packages the service tiers need
#   default             python -m pytest: no root, no services (what a contributor runs)
#   slow                long runs, no services (pytest -m slow)
#   xrootd, slurm, browser, root
#                       tests that start a Debian service or need root (pytest -m <tier>);
#                       tests/conftest.py lists which test is in which tier
#   coffea-upstream     coffea's own executor tests with CacheAffinityExecutor vs DaskExecutor
#   soak                a CI-sized soak (~30 runs on one cluster with churn; nothing may grow)
#   matrix-oldest       core tests at the oldest supported releases (tools/matrix.py oldest;
#                       the newest end is what the steps before ran)
TIERS := slow xrootd slurm browser root
test:
	@rm -f .test-times; rc=0; \
	tools/timed .test-times venv $(MAKE) --no-print-directory venv || exit $$?; \
	tools/timed .test-times system-deps $(MAKE) --no-print-directory system-deps; \
	tools/timed .test-times default $(PY) -m pytest -q --durations=15 || rc=$$?; \
	for tier in $(TIERS); do \
	  tools/timed .test-times $$tier $(PY) -m pytest -q -m $$tier --durations=5 || rc=$$?; \
	done; \
	tools/timed .test-times coffea-upstream $(PY) -m pytest -q -m upstream || rc=$$?; \
	tools/timed .test-times soak $(PY) -m pytest -q -m soak || rc=$$?; \
	tools/timed .test-times matrix-oldest $(PYTHON) tools/matrix.py oldest || rc=$$?; \
	tools/timed .test-times --report; exit $$rc

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# Fault tests on the cluster in a box (testbed/hosts.py: hosts as network namespaces, shaped
# links, tmpfs disks; needs root): slow peer link, host replaced, scheduler restart, disk
# full. The steady-state and partition tests of tests/test_hosts.py run in the default suite.
test-hosts: $(STAMP)
	$(PY) -m pytest -q -s -m hosts tests/test_hosts.py

# Core tests (executor, coffea inputs, coffea's own executor tests, scheduler plugin,
# stealing) at the oldest (requirements/oldest.txt) and newest (requirements/constraints.txt)
# ends of the declared dependency ranges, each in its own venv (.venv-oldest, .venv-newest).
# The selection is CORE_TESTS in tools/matrix.py.
test-matrix:
	$(PYTHON) tools/matrix.py

# Every benchmark in order with repeats, each step timed (benchmarks/run_all.py), then the
# README and docs/benchmarks.md tables rendered from the new JSON (tools/render_readme.py). Run it ALONE on a quiet
# machine: needs root (private network namespace for XRootD); ~4-5 h on 2 cores.
#   make bench-dry   the commands only;  make bench-quick   every script at a tiny size (~15 min)
bench: $(STAMP) system-deps
	$(PY) benchmarks/run_all.py

bench-dry:
	$(PY) benchmarks/run_all.py --dry-run

bench-quick: $(STAMP) system-deps
	$(PY) benchmarks/run_all.py --quick

# XRootD server and network-namespace tools for the storage tests (needs root; the
# tests that need them skip with the reason when they are missing).
system-deps:
	@bash .ci/install-system-deps || echo "warning: system packages missing (run as root: bash .ci/install-system-deps)"

clean:
	rm -rf $(VENV) .venv-oldest .venv-newest .pytest_cache .hypothesis docs/_build
