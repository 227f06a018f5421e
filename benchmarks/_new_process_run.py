"""One run's client side in a new Python process (``consecutive_runs.py --processes new``).

A physicist re-runs an analysis as a new process (a batch script, a restarted kernel)
while the workers persist.  :func:`spawn` starts ``python benchmarks/_new_process_run.py
SPEC OUT`` with ``sys.executable`` (a fresh interpreter: no coffea metadata cache, client,
executor or Runner inherited from the parent's memory); :func:`main` connects to the
mode's scheduler, builds the mode's executor and ``Runner`` as a user's script does and
runs the analysis once through :func:`benchmarks._runs.client_run` (the code the
same-process path runs), then writes its figures as JSON to OUT.  The run's time is
the ``Runner`` call, as in the same process; the imports come before it (``import_s``), the
``dask.dataframe`` that coffea's ``DaskExecutor`` imports on its first call included (about
0.8 s here, paid by every mode in a new process), and ``process_s`` is the whole process.

No mode registers anything from its client: the worker and scheduler plugins are preloads
read when the cluster starts, coffea-native's BufferCache is built in each worker process
on its first chunk, ``worker_affinity`` is an executor argument; client-side settings
(``cacheaffinity.client.*``) are handed over in SPEC.

:func:`file_opens` (run in the workers with ``client.run``) counts the uproot files a
worker process opened: coffea's preprocessing, coffea's chunk tasks, cacheaffinity's
misses alike.  This module imports only the standard library at its top (workers import it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

_LOCK = threading.Lock()
_OPENS = [0]


def file_opens() -> int:
    """uproot files (``uproot.reading.ReadOnlyFile``) this process opened since the first
    call, which installs the counter."""
    import uproot.reading as reading

    cls = reading.ReadOnlyFile
    if "_benchmark_counted" not in cls.__dict__:
        init = cls.__init__

        def counted(self, *args, **kwargs):
            with _LOCK:
                _OPENS[0] += 1
            init(self, *args, **kwargs)

        cls.__init__ = counted
        cls._benchmark_counted = True
    return _OPENS[0]


def spawn(spec: dict, timeout: float = 7200.0) -> dict:
    """Run :func:`main` with ``spec`` in a new ``sys.executable`` process; its figures, with
    ``process_s`` (the whole process, interpreter start and imports included)."""
    with tempfile.TemporaryDirectory(prefix="cacheaffinity-new-process-") as d:
        spec_path, out_path, err_path = (Path(d) / n for n in ("spec.json", "out.json", "stderr"))
        spec_path.write_text(json.dumps(spec))
        t0 = time.perf_counter()
        with open(err_path, "w") as err:
            proc = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), str(spec_path), str(out_path)],
                stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT, timeout=timeout,
                env=dict(os.environ), cwd=str(Path(__file__).resolve().parent.parent),
            )  # fmt: skip
        process_s = time.perf_counter() - t0
        if proc.returncode != 0 or not out_path.exists():
            tail = err_path.read_text()[-4000:]
            raise RuntimeError(f"new-process run of {spec['mode']} failed (exit {proc.returncode}):\n{tail}")
        out = json.loads(out_path.read_text())
    out["child"]["process_s"] = process_s
    out["child"]["pid_differs"] = out["child"]["pid"] != os.getpid()
    return out


def main(argv: list[str] | None = None) -> int:
    """``SPEC OUT``: one run of ``spec["mode"]`` against ``spec["scheduler"]``."""
    t_start = time.perf_counter()
    spec_path, out_path = (argv or sys.argv[1:])[:2]
    root = Path(__file__).resolve().parent.parent
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    import dask
    import dask.dataframe  # noqa: F401  coffea's DaskExecutor imports it on its first call
    from distributed import Client

    from benchmarks import _runs

    spec = json.loads(Path(spec_path).read_text())
    cfg = _runs.Config(**spec["config"])
    imported = time.perf_counter() - t_start
    with dask.config.set(spec["dask_config"]):
        t0 = time.perf_counter()
        with Client(spec["scheduler"], timeout="60s") as client:
            connect = time.perf_counter() - t0
            executor = _runs.make_executor(spec["mode"], client)
            out = _runs.client_run(
                spec["mode"], cfg, executor, spec["fileset"], _runs.uproot_options(spec["xrootd"]),
                metadata_cache=None,  # coffea's default: its process-wide cache, empty here
            )  # fmt: skip
    out["summary"] = _runs.normalized(out["summary"])
    out["child"] = {"pid": os.getpid(), "import_s": imported, "connect_s": connect}
    Path(out_path).write_text(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
