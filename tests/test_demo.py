"""The README's demo command runs end to end (at a small size), and ``make demo`` (its
default size) prints the output docs/install.md shows (``<!-- sample:demo -->``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tools import cli_samples  # noqa: E402

WRITE = os.environ.get("CACHEAFFINITY_WRITE_SAMPLES") == "1"
#: Table cells that differ between two real runs: every row's time and speedup, and run 1's
#: "on node" (idle workers steal some of run 1's chunks, as many as the timing allows).
TIMED = ("wall [s]", "speedup")
STOLEN = {("cacheaffinity run 1", "on node")}


def demo_sample() -> cli_samples.Sample:
    (sample,) = [s for s in cli_samples.samples(REPO / "docs" / "install.md") if s.name == "demo"]
    assert (sample.program, sample.args) == ("make", ["demo"])
    return sample


def table_cells(lines: list[str]) -> list[list[str]]:
    """Each line's cells, normalised (cli_samples), with the cells of a real run masked."""
    lines = [cli_samples.normalise(line) for line in lines]
    header = next(line for line in lines if line.startswith("mode "))
    titles = cli_samples.cells(header)
    out = []
    for line in lines:
        cells = cli_samples.cells(line)
        if len(cells) == len(titles) and line != header:
            cells = [
                "<masked>" if t in TIMED or (cells[0], t) in STOLEN else c
                for t, c in zip(titles, cells)
            ]
        out.append(cells)
    return out


@pytest.mark.timeout(400)
def test_demo_runs_and_second_run_comes_from_the_caches(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "examples.demo", "--events", "2000", "--files", "1",
         "--chunksize", "1000", "--runs", "2", "--workers", "2",
         "--workdir", str(tmp_path), "--check"],
        cwd=REPO, capture_output=True, text=True, timeout=380,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the data's known coffea schema warnings are silenced: the table is
    # the first thing one reads
    assert "Missing cross-reference" not in proc.stderr, proc.stderr[-3000:]
    assert "Warning" not in proc.stderr, proc.stderr[-3000:]
    out = proc.stdout
    assert "results identical to coffea's DaskExecutor: yes" in out
    run1 = next(line for line in out.splitlines() if line.startswith("cacheaffinity run 1"))
    # cold caches: run 1 misses (its hits are clusters that two chunks of one
    # stripe share: read by the first chunk, found by the second)
    assert float(run1.split()[5].rstrip("%")) < 100.0
    # the table as docs/install.md shows it, but for the size: the same header, legend and
    # closing lines; the cached run's cells as the sample's cached runs show them
    want, got = table_cells(demo_sample().output), table_cells(out.splitlines())
    assert got[3:5] == want[3:5]  # the blank line and the header
    assert got[-5:] == want[-5:]  # the legend and the results line
    assert [row[0] for row in got[4:-5]] == ["mode", "dask (no cache)", "cacheaffinity run 1",
                                             "cacheaffinity run 2"]  # fmt: skip
    assert got[7][3:] == want[7][3:] == ["100.0%", "0.0", "0", "100.0%"]


@pytest.mark.timeout(1500)
def test_make_demo_prints_what_install_md_shows(tmp_path):
    """``make demo``'s command (the default size) from an empty work directory prints the
    lines of docs/install.md's sample, cell by cell: times, the dashboard port and run 1's
    "on node" masked (``CACHEAFFINITY_WRITE_SAMPLES=1`` writes the real output into it)."""
    make = (REPO / "Makefile").read_text()
    assert "\t$(PY) -m examples.demo\n" in make  # what `make demo` runs, after the venv
    proc = subprocess.run(
        [sys.executable, "-m", "examples.demo", "--workdir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=1450,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    real = proc.stdout.splitlines()
    sample = demo_sample()
    if WRITE:
        cli_samples.write(sample.path, sample.name, real)
        return
    assert table_cells(real) == table_cells(sample.output), (
        "docs/install.md's demo sample differs from the real output "
        "(CACHEAFFINITY_WRITE_SAMPLES=1 rewrites it):\n" + proc.stdout
    )


def test_only_the_known_schema_warnings_are_silenced(nanoaod_dir):
    """coffea's schema warnings on the bundled samples are all known and silenced; another
    warning of the same module, or the same message from elsewhere, still shows."""
    import warnings

    from coffea.nanoevents import NanoAODSchema, NanoEventsFactory

    from examples.analysis import quiet_known_schema_warnings

    def schema_warnings(path):
        NanoEventsFactory.from_root(
            {str(path): "Events"}, schemaclass=NanoAODSchema, mode="virtual"
        ).events()

    for name in ("nano_dy.root", "nano_dimuon.root", "nanoAOD_2015_CMS_Open_Data_ttbar.root"):
        with warnings.catch_warnings(record=True) as loud:
            warnings.simplefilter("always")
            schema_warnings(nanoaod_dir / name)
        assert any("Missing cross-reference" in str(w.message) for w in loud), name
        with warnings.catch_warnings(record=True) as quiet:
            warnings.simplefilter("always")
            quiet_known_schema_warnings()
            schema_warnings(nanoaod_dir / name)
        assert [str(w.message) for w in quiet] == [], name
    with warnings.catch_warnings(record=True) as other:
        warnings.simplefilter("always")
        quiet_known_schema_warnings()
        for message, module in (
            ("Missing cross-reference index for Muon_jetIdx => Jet", "coffea.nanoevents.schemas.nanoaod"),
            ("Missing cross-reference index for FatJet_subJetIdx1 => SubJetX", "coffea.nanoevents.schemas.nanoaod"),
            ("Missing cross-reference index for FatJet_subJetIdx1 => SubJet", "somewhere.else"),
        ):
            warnings.warn_explicit(message, RuntimeWarning, "x.py", 1, module=module)
    assert len(other) == 3, [str(w.message) for w in other]
