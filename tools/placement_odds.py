"""How often random node ids leave a cache node without a chunk.

A test (or a small deployment) whose outcome needs a given node to hold chunks fails when
placement gives that node none. Node ids are random (each cache directory's ``node-id``),
and so are the UUIDs of generated ROOT files, so this happens at a rate that depends only on
the node count and weights and on the number of placement stripes. This script draws both
at random ``--trials`` times, places the stripes with the configured placement
(:class:`cacheaffinity.placement.TorusPlacement` with ``cacheaffinity.scheduler``'s
dimensions, replicas, seed and balance) and prints how often node 0 got none, how often some node
did, and node 0's mean number of stripes. One process, no cluster::

    python tools/placement_odds.py --nodes 2 --files 4 --stripes-per-file 1
    python tools/placement_odds.py --nodes 4 --files 2 --stripes-per-file 8 --weights 3,1,1,1

A coffea file of E entries has ``ceil(E / S)`` stripes, S being
``cacheaffinity.client.stripe-entries`` or, if null, the file's default (at least 1,000
entries: a file of 1,000 events is one stripe; see docs/design.md).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cacheaffinity import config  # noqa: E402
from cacheaffinity.chunk_id import format_chunk_id  # noqa: E402
from cacheaffinity.placement import TorusPlacement  # noqa: E402


def odds(nodes: int, files: int, stripes_per_file: int, weights: list[float] | None = None,
         trials: int = 20_000, seed: int = 0) -> dict:  # fmt: skip
    """``{"node0_none", "some_none", "node0_mean"}`` over ``trials`` draws of node ids and
    file UUIDs (``random.Random(seed)``)."""
    if nodes < 1 or files < 1 or stripes_per_file < 1 or trials < 1:
        raise ValueError("nodes, files, stripes-per-file and trials must each be at least 1")
    weights = list(weights) if weights else [1.0] * nodes
    if len(weights) != nodes or min(weights) <= 0:
        raise ValueError(f"give {nodes} positive weights (got {weights}), e.g. --weights 3,1")
    rnd = random.Random(seed)
    cfg = config.settings("scheduler")  # validated, as the scheduler plugin reads it
    node0_none = some_none = node0_total = 0
    for _ in range(trials):
        ids = [f"node{i}-{rnd.getrandbits(48):012x}" for i in range(nodes)]
        placement = TorusPlacement(
            dimensions=cfg["dimensions"], replicas=cfg["replicas"], seed=cfg["seed"], balance=cfg["balance"]
        )
        placement.set_nodes(dict(zip(ids, weights)))
        chunks = []
        for _ in range(files):
            f = str(uuid.UUID(int=rnd.getrandbits(128)))
            chunks += [format_chunk_id(f, "Events", 1000, k) for k in range(stripes_per_file)]
        got = placement.assign(chunks)
        n0 = got.count(ids[0])
        node0_total += n0
        node0_none += n0 == 0
        some_none += len(set(got)) < nodes
    return {
        "node0_none": node0_none / trials,
        "some_none": some_none / trials,
        "node0_mean": node0_total / trials,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--stripes-per-file", type=int, default=1)
    ap.add_argument("--weights", default=None, help="comma-separated, node 0 first (default: all 1)")
    ap.add_argument("--trials", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        weights = [float(w) for w in args.weights.split(",")] if args.weights else None
        out = odds(args.nodes, args.files, args.stripes_per_file, weights, args.trials, args.seed)
    except ValueError as e:  # a weight that is not a number, or odds' own check
        ap.error(f"{e} (--weights takes numbers, node 0 first: --weights 3,1)")
    print(json.dumps({**vars(args), **out}))
    print(
        f"node 0 gets no stripe in {out['node0_none']:.2%} of draws, some node in "
        f"{out['some_none']:.2%}; node 0's mean: {out['node0_mean']:.2f} of "
        f"{args.files * args.stripes_per_file} stripes"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
