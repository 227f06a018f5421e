"""tools/placement_odds.py: how often random node ids leave a node without a stripe (the
odds behind the tests that choose their node from a run, weigh it, or use more stripes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.placement_odds import main, odds  # noqa: E402


def test_one_stripe_per_file_leaves_a_node_empty_as_often_as_the_flaky_tests_did():
    # the Slurm restart test's shape: 4 one-stripe files on 2 nodes (CI failed on it once)
    slurm = odds(nodes=2, files=4, stripes_per_file=1, trials=4000, seed=1)
    assert 0.035 < slurm["node0_none"] < 0.09, slurm
    assert slurm["node0_none"] < slurm["some_none"] < 2.2 * slurm["node0_none"], slurm
    assert 1.8 < slurm["node0_mean"] < 2.2, slurm  # fair share on average
    # more stripes: the membership test went from 6 to 12 chunks
    six = odds(nodes=2, files=1, stripes_per_file=6, trials=4000, seed=1)
    twelve = odds(nodes=2, files=1, stripes_per_file=12, trials=4000, seed=1)
    assert twelve["some_none"] < 0.005 < six["some_none"], (six, twelve)
    # weight: a node of weight 3 among 4 takes ~half of 16 stripes, never none here
    heavy = odds(nodes=4, files=2, stripes_per_file=8, weights=[3, 1, 1, 1], trials=2000, seed=1)
    assert heavy["node0_none"] == 0 and 6.5 < heavy["node0_mean"] < 9.5, heavy


def test_the_same_seed_gives_the_same_odds_and_bad_input_is_named(capsys):
    assert odds(2, 2, 2, trials=300, seed=5) == odds(2, 2, 2, trials=300, seed=5)
    with pytest.raises(ValueError, match="give 2 positive weights"):
        odds(2, 1, 1, weights=[1.0])
    with pytest.raises(SystemExit):
        main(["--nodes", "0"])
    assert "must each be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--weights", "3,x"])
    assert "--weights takes numbers" in capsys.readouterr().err
    assert main(["--nodes", "3", "--files", "1", "--stripes-per-file", "3", "--trials", "200"]) == 0
    assert "node 0 gets no stripe in" in capsys.readouterr().out
