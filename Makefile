# Two commands set everything up on a fresh machine:
#   make demo   - the end-to-end demo (local cluster, generated NanoAOD-like data, consecutive runs)
#   make test   - the test suite
# Both create .venv with the pinned dependencies (requirements/constraints.txt) first.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow test-matrix bench venv clean system-deps

venv: $(STAMP)

$(STAMP): pyproject.toml requirements/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c requirements/constraints.txt -e ".[test,bench]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m examples.demo

test: $(STAMP) system-deps
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# Core tests (executor, coffea inputs, coffea's own executor tests, scheduler plugin,
# stealing) at the oldest (requirements/oldest.txt) and newest (requirements/constraints.txt)
# ends of the declared dependency ranges, each in its own venv (.venv-oldest, .venv-newest).
# The selection is CORE_TESTS in tools/matrix.py.
test-matrix:
	$(PYTHON) tools/matrix.py

# Full size: the consecutive-run benchmark needs root (private network namespace for
# XRootD) and takes ~30 min on 2 cores; add --storage local where XRootD is missing.
bench: $(STAMP) system-deps
	$(PY) benchmarks/consecutive_runs.py --events 80000 --files 4 --chunksize 1250 --workers 4 --runs 5
	$(PY) benchmarks/simulate.py
	$(PY) benchmarks/scheduler_scale.py
	$(PY) benchmarks/placement.py
	$(PY) benchmarks/cache_read.py
	$(PY) benchmarks/scheduler_overhead.py
	$(PY) benchmarks/executor_runs.py
	$(PY) benchmarks/stealing_slow_node.py

# XRootD server and network-namespace tools for the storage tests (needs root; the
# tests that need them skip with the reason when they are missing).
system-deps:
	@bash .ci/install-system-deps || echo "warning: system packages missing (run as root: bash .ci/install-system-deps)"

clean:
	rm -rf $(VENV) .venv-oldest .venv-newest .pytest_cache .hypothesis
