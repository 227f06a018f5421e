"""benchmarks/beyond_capacity.py: its figures, targets and docs table from a made-up results
document, and the whole script at a tiny size (real local clusters, generated LZMA files, real
node caches at half the working set).  Timings are not asserted, only what must hold at any
load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import _beyond_capacity_figures as figures  # noqa: E402
from benchmarks import beyond_capacity as bc  # noqa: E402


def _row(run: int, wall: float, hit: float, written: float, forecast: float | None = None) -> dict:
    return {"run": run, "wall_s": wall, "hit_rate": hit, "served_share": min(1.0, hit * 1.2),
            "peer_hits": 0, "bytes_written": written, "evictions": 3, "storage_bytes": 10**6,
            "storage_opens": 4, "identical": True,
            "forecast": None if forecast is None else {"hit_rate": forecast, "nodes": {}}}  # fmt: skip


def _doc(rank_hits=(0.0, 0.4, 0.5, 0.5, 0.5), forecast=True) -> dict:
    repeats = []
    for k in range(2):
        fifo = [_row(i + 1, 20.0 + k, 0.0, 100e6) for i in range(5)]
        rank = [_row(i + 1, 20.0 - 8 * h, h, 10e6, (h + 0.05) if forecast else None)
                for i, h in enumerate(rank_hits)]  # fmt: skip
        repeats.append({"order": ["fifo", "rank"][:: 1 - 2 * k], "runs": {"fifo": fifo, "rank": rank}})
    doc = {
        "admission_supported": True, "admission_key": figures.ADMISSION_KEY, "repeats": repeats,
        "identical_results": True, "chunks": 96, "elapsed_s": 600.0,
        "dataset": {"events": 120000, "branches": 1499},
        "calibration": {"floor_s": 6.0, "warm_all_hits_s": 7.0, "capacity_bytes": 50 * 10**6,
                        "need_mean_bytes": 100 * 10**6, "need_max_bytes": 120 * 10**6,
                        "capacity_fraction": 0.5, "capacity_basis": "mean"},
        "load_average_before": [1.0, 1.0, 1.0], "load_average_after": [2.0, 1.0, 1.0],
    }  # fmt: skip
    doc["summary"] = figures.summarize(doc)
    doc["targets"] = figures.evaluate_targets(doc)
    return doc


def test_targets_from_a_document():
    doc = _doc()
    s = doc["summary"]
    assert [x["hit_rate"]["median"] for x in s["modes"]["rank"]] == [0.0, 0.4, 0.5, 0.5, 0.5]
    assert s["modes"]["fifo"][0]["wall_s"]["n"] == 2
    g = s["run3"]
    # rank run 3: 20 - 8 x 0.5 = 16 s against FIFO's 20 / 21 s; expected: 0.6 x (FIFO - 6 s)
    assert g["gain_s"]["values"] == [4.0, 5.0]
    assert g["expected_gain_s"]["values"] == pytest.approx([0.6 * 14, 0.6 * 15])
    t = doc["targets"]
    by_start = {name.split(",")[0]: v for name, v in t.items()}
    assert by_start["rank own-node hit rate (hits / lookups"]["pass"] is True
    assert by_start["rank own-node hit rate (hits / lookups"]["value"] == 0.5
    gain = next(v for n, v in t.items() if n.startswith("rank run 3 faster"))
    assert gain["pass"] is False  # 4.5 s measured < 8.7 s expected
    assert next(v for n, v in t.items() if n.startswith("results identical"))["pass"] is True
    fc = next(v for n, v in t.items() if n.startswith("rank: forecast"))
    assert fc["pass"] is True and fc["value"] == pytest.approx(0.05)
    assert next(v for n, v in t.items() if n.startswith("fifo: forecast"))["pass"] is None  # none reported
    low = _doc(rank_hits=(0.0, 0.1, 0.1, 0.6, 0.6), forecast=False)["targets"]
    assert next(v for n, v in low.items() if n.startswith("rank own-node hit rate"))["pass"] is False
    assert all(v["pass"] is None for n, v in low.items() if "forecast" in n)


def test_render_from_results(tmp_path):
    assert "Not measured yet" in figures.render(str(tmp_path))
    doc = _doc()
    cfg = bc.Config(events=120000, files=6, chunksize=1250, repeats=2)
    j, png = bc.write_results(doc, cfg, tmp_path)
    assert json.loads(Path(j).read_text())["results"]["targets"] == doc["targets"]
    assert Path(png).read_bytes()[:4] == b"\x89PNG"
    text = figures.render(str(tmp_path))
    assert "| `rank` | 3 | 50.0% | 60.0% | 55.0% | 16 |" in text
    assert "| `fifo` | 1 | 0.0% | 0.0% | - | 20.5 [20, 21] | 100.0 |" in text
    assert "(target >= 0.45: met)" in text and "**missed**" in text
    assert "`python benchmarks/beyond_capacity.py --events 120000 --files 6 --chunksize 1250" in text


@pytest.mark.timeout(420)
def test_tiny_run(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "beyond_capacity.py"), "--quick", "--events", "800",
         "--files", "1", "--chunksize", "200", "--workers", "2", "--runs", "3", "--floor-runs", "1",
         "--data", str(tmp_path / "data"), "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=400, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "beyond_capacity.json").read_text())
    assert len(doc["commit"]) == 40
    r = doc["results"]
    assert r["identical_results"] is True and r["chunks"] == 4
    cal = r["calibration"]
    assert cal["run2"]["hit_rate"] == 1.0 and cal["capacity_bytes"] == int(0.5 * cal["need_mean_bytes"])
    for rp in r["repeats"]:
        assert set(rp["runs"]) == {"fifo", "rank"}
        for rows in rp["runs"].values():
            assert [x["run"] for x in rows] == [1, 2, 3]
            assert rows[0]["hit_rate"] == 0.0 and rows[0]["bytes_written"] > 0  # cold caches
            assert all(x["identical"] for x in rows)
            for x in rows:  # every node's cache within the capacity given
                assert all(n["bytes"] <= cal["capacity_bytes"] for n in x["nodes"].values())
        if r["admission_supported"]:
            assert rp["worker_admission"] == {"fifo": ["fifo"], "rank": ["rank"]}
    assert any(n.startswith("rank own-node hit rate") for n in r["targets"])
    assert (tmp_path / "beyond_capacity.png").read_bytes()[:4] == b"\x89PNG"
    assert "PASS  results identical" in proc.stdout
    assert "| `rank` | 3 |" in figures.render(str(tmp_path))
