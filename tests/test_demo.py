"""The README's demo command runs end to end (at a small size)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


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
