"""The notebooks run from top to bottom (executed with nbclient, so they cannot rot).

:func:`run_notebook` executes a notebook in a real Jupyter kernel (``python3``, which
jupyter_client starts with this interpreter, i.e. the venv's) in the notebook's own
directory, optionally with parameters injected after the cell tagged ``parameters``,
and returns the executed notebook.  A failing cell fails the test with the cell's
source and error.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

import nbclient  # noqa: E402  (test extras)
import nbformat  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def run_notebook(
    path: str | os.PathLike,
    timeout: float = 300,
    parameters: dict[str, Any] | None = None,
    kernel_name: str = "python3",
):
    """Execute the notebook at ``path`` and return it (an ``nbformat`` node).

    Parameters
    ----------
    path
        The ``.ipynb`` file; it runs with its own directory as working directory.
    timeout
        Seconds allowed per cell.
    parameters
        ``{name: value}`` assigned (``name = repr(value)``) in a cell inserted after the
        cell tagged ``parameters`` (papermill's convention), or first if there is none.
    kernel_name
        Jupyter kernel; ``python3`` is started with this interpreter (jupyter_client
        replaces its ``python`` by ``sys.executable``).
    """
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    if parameters:
        source = "# injected by run_notebook\n" + "\n".join(
            f"{k} = {v!r}" for k, v in parameters.items()
        )
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["tags"] = ["injected-parameters"]
        index = next(
            (i + 1 for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])),
            0,
        )
        nb.cells.insert(index, cell)
    env_path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    old = {k: os.environ.get(k) for k in ("PATH", "PYTHONPATH")}
    os.environ.update(PATH=env_path, PYTHONPATH=pythonpath)  # the kernel inherits them
    try:
        client = nbclient.NotebookClient(
            nb,
            timeout=timeout,
            kernel_name=kernel_name,
            resources={"metadata": {"path": str(path.parent)}},
        )
        try:
            client.execute()
        except nbclient.exceptions.CellExecutionError as e:
            pytest.fail(f"{path.name} failed:\n{e}", pytrace=False)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return nb


def outputs(nb, output_type: str | None = None) -> list:
    """Every output of every code cell (of one ``output_type`` if given)."""
    return [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if output_type is None or o.output_type == output_type
    ]


@pytest.mark.timeout(900)
def test_consecutive_runs_notebook(tmp_path):
    """The consecutive-run notebook at a small size: plot inline, qualitative asserts pass."""
    nb = run_notebook(
        REPO / "benchmarks" / "consecutive_runs.ipynb",
        timeout=600,
        # two runs are what the qualitative asserts compare (the notebook's default is 3)
        parameters={"DATA": str(tmp_path / "data"), "OUT": str(tmp_path / "out"), "RUNS": 2},
    )
    images = [o for o in outputs(nb, "display_data") if "image/png" in o.get("data", {})]
    assert images, "the notebook shows no plot"
    text = "".join(o.get("text", "") for o in outputs(nb, "stream"))
    assert "cacheaffinity" in text and "dask-default+cache" in text, text[-2000:]
    assert "qualitative result holds" in text, text[-2000:]
    assert (tmp_path / "out" / "consecutive_runs.json").exists()


@pytest.mark.timeout(900)
def test_portal_notebook():
    """The portal notebook starts a local cluster, runs the analysis twice, shows the tables."""
    nb = run_notebook(
        REPO / "examples" / "portal.ipynb",
        timeout=600,
        parameters={"SCHEDULER": "", "EVENTS": 6000, "WORKERS": 2},
    )
    # stdout only: stderr carries the cluster's log lines (e.g. at shutdown)
    text = "".join(o.get("text", "") for o in outputs(nb, "stream") if o.get("name") == "stdout")
    assert "results of run 1 and run 2 identical: True" in text, text[-2000:]
    assert "ok" in text.splitlines(), text[-2000:]  # the notebook's final asserts passed
    tables = [o for o in outputs(nb, "execute_result") if "text/html" in o.get("data", {})]
    assert len(tables) >= 3, "expected the runs, chunks and per-node tables"  # pandas HTML
    runs_table = tables[0]["data"]["text/plain"]
    assert "hit rate" in runs_table and "files opened" in runs_table
    images = [o for o in outputs(nb, "display_data") if "image/png" in o.get("data", {})]
    assert images, "the notebook shows no plot"
