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
    out = proc.stdout
    assert "results identical to coffea's DaskExecutor: yes" in out
    run1 = next(line for line in out.splitlines() if line.startswith("cacheaffinity run 1"))
    # cold caches: run 1 misses (its hits are clusters that two chunks of one
    # stripe share: read by the first chunk, found by the second; issue 13)
    assert float(run1.split()[5].rstrip("%")) < 100.0
