"""The forecast follows where each chunk is held: a chunk placed on another node than the one
whose cache last read or stored it is new there (a node left, joined, or stole it)."""

from __future__ import annotations

import pytest

from cacheaffinity.scheduler import _forecast
from cacheaffinity.scheduler._forecast import Forecast

CAP = {n: 10**12 for n in ("a", "b", "c", "d")}


def _run(f: Forecast, run: str, placed: dict[int, str]) -> dict:
    f.submitted(run, placed.items())
    return f.get(run, CAP)


def test_a_removed_nodes_chunks_are_new_where_they_go():
    f = Forecast()
    homes = {sk: "abcd"[sk % 4] for sk in range(40)}
    for sk, node in homes.items():
        f.reported(sk, 1000, node)
    assert _run(f, "run-2", homes)["hit_rate"] == 1.0  # every chunk where it is held
    # node d left: its 10 chunks go to a, b and c, which hold none of them
    moved = {sk: ("abc"[sk % 3] if node == "d" else node) for sk, node in homes.items()}
    fc = _run(f, "run-3", moved)
    assert fc["new_chunks"] == 10
    assert fc["hit_rate"] == pytest.approx(0.75)
    # the run stores them where they went: the next run hits everywhere
    for sk, node in moved.items():
        if homes[sk] == "d":
            f.reported(sk, 1000, node)
    assert _run(f, "run-4", moved)["hit_rate"] == 1.0


def test_the_holder_moves_only_with_a_kept_report():
    f = Forecast()
    f.reported(7, 500, "a")
    assert f.holder(7) == "a" and f.size(7) == 500
    f.reported(7, 600, "b", kept=False)  # b's cache refused it: a still holds it
    assert (f.holder(7), f.size(7)) == ("a", 600)
    f.reported(7, 600, None)  # no node known for the report
    assert f.holder(7) == "a"
    assert _run(f, "r1", {7: "b"})["new_chunks"] == 1
    f.reported(7, 600, "b")  # b read it from its cache or stored it
    assert f.holder(7) == "b"
    assert _run(f, "r2", {7: "b"})["new_chunks"] == 0
    assert _run(f, "r3", {7: "a"})["new_chunks"] == 1


def test_a_chunk_without_a_holder_counts_as_held_where_placed():
    f = Forecast()
    f.reported(1, 100)
    assert f.holder(1) is None
    assert _run(f, "r", {1: "c"})["new_chunks"] == 0


def test_sizes_and_their_mean_are_the_bytes_reported(monkeypatch):
    f = Forecast(sizes_kept=3)
    for sk, (n, node) in enumerate([(10, "a"), (3 * 10**12, "b"), (30, None), (50, "a")]):
        f.reported(sk, n, node)
    assert [f.size(sk) for sk in range(4)] == [None, 3 * 10**12, 30, 50]  # the oldest dropped
    assert f.mean_size == pytest.approx((3 * 10**12 + 80) / 3)
    f.reported(1, 20, "c")  # replaced: the total follows
    assert f.mean_size == pytest.approx(100 / 3)
    assert (f.holder(1), f.holder(2), f.holder(3)) == ("c", None, "a")


def test_past_the_node_names_kept_every_holder_is_forgotten(monkeypatch):
    monkeypatch.setattr(_forecast, "NODES_KEPT", 2)
    f = Forecast()
    f.reported(1, 100, "a")
    f.reported(2, 100, "b")
    assert _run(f, "r1", {1: "b", 2: "b"})["new_chunks"] == 1
    f.reported(3, 100, "c")  # a third name: a's and b's chunks lose their holder
    assert (f.holder(1), f.holder(2), f.holder(3)) == (None, None, "c")
    assert [f.size(sk) for sk in (1, 2, 3)] == [100, 100, 100]
    fc = _run(f, "r2", {1: "b", 2: "c", 3: "a"})
    assert fc["new_chunks"] == 1  # only chunk 3, held by c, placed on a
    f.reported(1, 100, "a")  # names are coded anew from here
    assert f.holder(1) == "a" and f.holder(3) == "c"
