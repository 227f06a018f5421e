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


@pytest.mark.timeout(1500)
def test_make_demo_prints_what_install_md_shows(tmp_path):
    """``make demo``'s command (the default size) from an empty work directory prints the
    lines of docs/install.md's sample, cell by cell: times, the dashboard port and run 1's
    "on node" masked (``CACHEAFFINITY_WRITE_SAMPLES=1`` writes the real output into it).
    The sample's cells say it: run 1 cold (hits below 100%), run 2 all from the caches, and
    results identical to coffea's DaskExecutor; the data's known schema warnings are
    silenced, so the table is the first thing one reads."""
    make = (REPO / "Makefile").read_text()
    assert "\t$(PY) -m examples.demo\n" in make  # what `make demo` runs, after the venv
    proc = subprocess.run(
        [sys.executable, "-m", "examples.demo", "--workdir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=1450,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Missing cross-reference" not in proc.stderr, proc.stderr[-3000:]
    assert "Warning" not in proc.stderr, proc.stderr[-3000:]
    assert "results identical to coffea's DaskExecutor: yes" in proc.stdout
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
