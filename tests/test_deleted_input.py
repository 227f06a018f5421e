"""A deleted input file: the user sees coffea's own error, with no block of ours in its chain.

The chunk task takes the file's identity (``os.stat``) before coffea opens it; when the
file is gone, coffea's error used to be raised while our ``FileNotFoundError`` was being
handled, so the traceback a user saw began with our stat and "During handling of the above
exception, another exception occurred".  Run as a real process (a script with a
``LocalCluster`` whose scheduler and worker load the preload); its stderr is what a user sees.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

SCRIPT = """
import os, shutil, sys
import dask
from coffea import processor
from coffea.nanoevents import NanoAODSchema
from distributed import Client, LocalCluster
import cacheaffinity
from examples.analysis import DimuonJetProcessor

src, work = sys.argv[1], sys.argv[2]
path = os.path.join(work, "dy.root")
shutil.copy(src, path)
config = {
    "distributed.scheduler.preload": ["cacheaffinity"],
    "distributed.worker.preload": ["cacheaffinity"],
    "cacheaffinity.worker.directory": os.path.join(work, "cache-{name}"),
}
with dask.config.set(config), LocalCluster(
    n_workers=1, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0"
) as cluster, Client(cluster) as client:
    metadata = {}  # run 2 reuses run 1's preprocessing: the chunk tasks meet the missing file

    def run():
        executor = cacheaffinity.CacheAffinityExecutor(client=client, status=False, retries=0)
        runner = processor.Runner(
            executor=executor, schema=NanoAODSchema, chunksize=20, metadata_cache=metadata
        )
        return runner({"dy": [path]}, processor_instance=DimuonJetProcessor(), treename="Events")

    run()
    print("run 1 ok", flush=True)
    os.unlink(path)
    run()
"""


@pytest.mark.timeout(300)
def test_deleted_input_file_traceback_has_no_block_of_ours(tmp_path, nanoaod_dir):
    script = tmp_path / "analysis.py"
    script.write_text(SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    r = subprocess.run(
        [sys.executable, str(script), str(nanoaod_dir / "nano_dy.root"), str(tmp_path)],
        capture_output=True, text=True, timeout=280, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert "run 1 ok" in r.stdout, r.stderr[-3000:]
    assert r.returncode != 0
    # the uncaught exception's traceback: the last "Traceback (most recent call last)" chain
    shown = r.stderr[r.stderr.index("Traceback (most recent call last)") :]
    assert "FileNotFoundError" in shown and "dy.root" in shown, shown[-3000:]
    assert "Failed to open file" in shown  # coffea's own error ...
    assert "identity.py" not in shown, shown  # ... with no block from our os.stat
    assert "During handling of the above exception" not in shown, shown
