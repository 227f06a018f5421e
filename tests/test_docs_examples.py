"""Every fenced Python example of README.md and docs/coffea.md runs as written against a real
cluster (``dask scheduler --preload cacheaffinity`` and ``dask worker --preload cacheaffinity``
processes on 127.0.0.1, working in a folder of their own), from a folder of its own with the
data file beside the script (README) or from the checkout (docs/coffea.md); each line it
prints is the one its comment shows.  Then the command-line samples of the docs
(``<!-- sample:NAME -->``, tools/cli_samples.py) are compared with the real output of their
command on that cluster: run ids, times, addresses, node ids and the directory masked, every
other cell equal.  ``CACHEAFFINITY_WRITE_SAMPLES=1`` writes the real output into the samples
instead (then review the diff)."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from distributed import Client

import cacheaffinity
from helpers import Processes, scheduler_address

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tools import cli_samples  # noqa: E402

BIN = Path(sys.executable).parent
WRITE = os.environ.get("CACHEAFFINITY_WRITE_SAMPLES") == "1"
#: The scheduler addresses the pages are written for (only these strings are replaced).
ADDRESSES = ("tcp://127.0.0.1:8786", "tcp://scheduler:8786")
#: The cache directory and the node id the samples show.
SAMPLE_DIRECTORY = "/scratch/$USER/cacheaffinity"
SAMPLE_NODE = "wn042-8c1f3a9d2e"


def python_blocks(page: Path) -> list[str]:
    """The fenced ```python blocks of a markdown page, in order."""
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)


def printed(script: str) -> list[str]:
    """What each ``print(...)  # shown`` line of ``script`` shows, in order (a comment may
    go on over the comment lines that follow it)."""
    out = []
    lines = script.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"\s*print\(.*\)\s+#\s?(.*)$", line)
        if not m:
            continue
        shown = m.group(1).strip()
        j = i + 1
        while j < len(lines) and re.match(r"\s*#", lines[j]) and not _literal(shown)[0]:
            shown += " " + lines[j].strip().lstrip("#").strip()
            j += 1
        out.append(shown)
    return out


def _literal(text: str):
    try:
        return True, ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return False, None


def same(shown: str, line: str) -> bool:
    ok, want = _literal(shown)
    if ok:
        got_ok, got = _literal(line.strip())
        return got_ok and got == want
    return line.strip() == shown


def check_printed(script: str, stdout: str) -> None:
    """Each shown line is printed, in order."""
    lines = stdout.splitlines()
    pos = 0
    for shown in printed(script):
        for k in range(pos, len(lines)):
            if same(shown, lines[k]):
                pos = k + 1
                break
        else:
            raise AssertionError(f"the example prints no line {shown!r} (after line {pos}):\n{stdout}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A scheduler and one worker (one cache node) as the README starts them, working in a
    folder that holds no data file."""
    tmp = tmp_path_factory.mktemp("docs-examples")
    elsewhere = tmp / "worker-cwd"
    elsewhere.mkdir()
    procs = Processes(tmp)
    try:
        scheduler_file = procs.scheduler("scheduler", "--preload", "cacheaffinity")
        address = scheduler_address(scheduler_file, tmp / "scheduler.log")
        cache = tmp / "cache"
        procs.start(
            "worker", address, "--name", "n1", "--nthreads", "1", "--no-nanny",
            "--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0",
            "--preload", "cacheaffinity", "--cache-directory", str(cache),
            log="worker.log", cwd=elsewhere,
        )  # fmt: skip
        with Client(address, timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
        yield {"address": address, "cache": cache, "tmp": tmp}
    finally:
        procs.close()


def run_script(script: str, address: str, cwd: Path) -> subprocess.CompletedProcess:
    for a in ADDRESSES:
        script = script.replace(a, address)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    proc = subprocess.run([sys.executable, "-"], input=script, cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "cacheaffinity"), *args], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def compare(sample: cli_samples.Sample, real: list[str], replace: dict[str, str],
            masked_columns: tuple[str, ...] = ()) -> None:
    """The sample's output equals ``real`` cell by cell, once normalised (``replace``: this
    cluster's directory, node id and address -> the ones the samples show)."""
    real = [cli_samples.normalise(x, replace, mask=False) for x in real]
    if WRITE:
        cli_samples.write(sample.path, sample.name, real)
        return
    want = [cli_samples.normalise(x) for x in sample.output]
    got = [cli_samples.normalise(x) for x in real]
    assert len(want) == len(got), (sample.path.name, sample.name, real)
    titles = cli_samples.cells(got[0])
    masked = {titles.index(c) for c in masked_columns}
    for w, g in zip(want, got):
        wc, gc = cli_samples.cells(w), cli_samples.cells(g)
        if masked and len(wc) == len(gc) == len(titles) and wc != titles:
            wc = [("<masked>" if i in masked else c) for i, c in enumerate(wc)]
            gc = [("<masked>" if i in masked else c) for i, c in enumerate(gc)]
        assert wc == gc, (
            f"{sample.path.relative_to(REPO)} sample {sample.name!r} differs from the real "
            f"output (CACHEAFFINITY_WRITE_SAMPLES=1 rewrites it):\n" + "\n".join(real)
        )


def test_readme_examples_run_as_written_and_the_samples_match(cluster, nanoaod_dir, tmp_path):
    """README's python blocks, one script, run from a folder with ``nano_dy.root`` beside it
    (the workers work elsewhere: the relative path is resolved on the client); then the
    stats, check and cache info samples of README and docs/operations.md."""
    folder = tmp_path / "analysis"
    folder.mkdir()
    shutil.copy(nanoaod_dir / "nano_dy.root", folder / "nano_dy.root")
    script = "\n".join(python_blocks(REPO / "README.md"))
    assert 'runner({"DY": ["nano_dy.root"]}' in script  # the relative path, as written
    proc = run_script(script, cluster["address"], folder)
    check_printed(script, proc.stdout)
    assert len(printed(script)) >= 3

    address = cluster["address"]
    node = (cluster["cache"] / "node-id").read_text().strip()
    replace = {str(cluster["cache"]): SAMPLE_DIRECTORY, node: SAMPLE_NODE, address: ADDRESSES[0]}
    found = [s for page in ("README.md", "docs/operations.md")
             for s in cli_samples.samples(REPO / page)]  # fmt: skip
    assert {s.name for s in found} >= {"stats", "check", "cache-info"}, [s.name for s in found]
    for sample in found:
        args = [a.replace(SAMPLE_DIRECTORY, str(cluster["cache"])) for a in sample.args]
        args = [address if a in ADDRESSES else a for a in args]
        real = cli(*args)
        assert real.returncode == 0, (args, real.stderr)
        if sample.name == "stats":
            rows = real.stdout.splitlines()[1:]
            assert [r.split()[3] for r in rows] == ["ok", "ok"], real.stdout
        compare(sample, real.stdout.splitlines(), replace,
                masked_columns=("preprocess s",) if sample.name == "stats" else ())  # fmt: skip


def test_coffea_page_example_runs_as_written(cluster):
    """docs/coffea.md's example from the checkout (its relative data/nanoaod/ path)."""
    (script,) = python_blocks(REPO / "docs" / "coffea.md")
    assert '"data/nanoaod/nano_dy.root"' in script
    proc = run_script(script, cluster["address"], REPO)
    check_printed(script, proc.stdout)
    assert printed(script)


def test_printed_lines_are_found():
    script = 'print(x)  # {"a": 1}\nprint(y)  # [1,\n#   2]\nprint(z)  # 0 0\n'
    assert printed(script) == ['{"a": 1}', "[1, 2]", "0 0"]
    check_printed(script, "noise\n{'a': 1}\n[1, 2]\n0 0\n")
    with pytest.raises(AssertionError, match="prints no line"):
        check_printed(script, "{'a': 2}\n[1, 2]\n0 0\n")


README_RUN = '''
import sys
import awkward as ak
import cacheaffinity
from coffea import processor
from coffea.nanoevents import NanoAODSchema
from distributed import Client

class Muons(processor.ProcessorABC):
    def process(self, events):
        return {"muons": int(ak.sum(ak.num(events.Muon)))}
    def postprocess(self, accumulator):
        return accumulator

client = Client(sys.argv[1])
runner = processor.Runner(executor=cacheaffinity.CacheAffinityExecutor(client=client, status=False),
                          schema=NanoAODSchema, chunksize=100_000)
print(runner({"DY": [sys.argv[2]]}, processor_instance=Muons(), treename="Events"))
'''


def _emptied(dask_scheduler=None):
    from cacheaffinity.scheduler._forecast import emptied_nodes

    p = dask_scheduler.plugins["cacheaffinity"]
    return sorted(emptied_nodes(p.membership.node_workers, p.membership.workers, p.forecast.stored))


def _stats_row(address: str) -> tuple[dict[str, str], str]:
    out = cli("stats", address, "--last", "1")
    assert out.returncode == 0, out.stderr
    titles, row, *rest = out.stdout.splitlines()
    return dict(zip(cli_samples.cells(titles), cli_samples.cells(row))), "\n".join(rest)


def test_failed_run_is_marked_and_a_cleared_cache_is_forecast_as_misses(cluster, nanoaod_dir, tmp_path):
    """A run whose file is missing is FAILED in ``stats`` with its error; after ``cache
    clear`` with the worker running, the next run's forecast is 0% (it gets no hit), not 100%."""
    import time

    address = cluster["address"]
    script = tmp_path / "run.py"
    script.write_text(README_RUN)
    shutil.copy(nanoaod_dir / "nano_dy.root", tmp_path / "nano_dy.root")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}

    def analysis(name):
        return subprocess.run([sys.executable, str(script), address, name], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)  # fmt: skip

    failed = analysis("missing.root")
    assert failed.returncode != 0 and "FileNotFoundError" in failed.stderr
    row, below = _stats_row(address)
    assert row["status"] == "FAILED", (row, below)
    assert "FAILED: 1 task erred; first: FileNotFoundError" in below, below

    ok = analysis("nano_dy.root")
    assert ok.returncode == 0, ok.stderr[-3000:]
    with Client(address, timeout=60) as client:
        cacheaffinity.cache_stats(client)  # waits for the worker's queued writes
        import cloudpickle  # the scheduler process cannot import this test module

        cloudpickle.register_pickle_by_value(sys.modules[__name__])
        cleared = cli("cache", "clear", "--yes", str(cluster["cache"]))
        assert cleared.returncode == 0, cleared.stderr
        deadline = time.monotonic() + 60
        while not client.run_on_scheduler(_emptied):  # the worker's heartbeats report it
            assert time.monotonic() < deadline, "the scheduler never saw the cleared cache"
            time.sleep(0.2)
    again = analysis("nano_dy.root")
    assert again.returncode == 0, again.stderr[-3000:]
    row, below = _stats_row(address)
    assert (row["status"], row["hits"], row["misses"]) == ("ok", "0", "1"), row
    assert row["forecast"] == "0%" and row["hit bytes"] == "0%", row
