"""The node cache's admission and eviction policies (cacheaffinity.worker._store.admission):
pure, on synthetic lookup sequences (repeated scans of chunk keys)."""

from __future__ import annotations

import json
import random

import pytest

from cacheaffinity.worker._store import admission
from cacheaffinity.worker._store.admission import POLICIES, make_policy

ALL = sorted(POLICIES)


def dataset(tag: str, n: int = 600, seed: int = 1) -> list[tuple[str, float]]:
    """``n`` chunk keys of one dataset, sizes 0.8-1.2 (mean 1)."""
    rng = random.Random(seed)
    return [(f"{tag}/file-{i // 50:05d}/Events/{(i % 50) * 100000}", rng.uniform(0.8, 1.2)) for i in range(n)]


def scan(keys, seed: int):
    """One run: the keys in order, a few swapped with a near neighbour (tasks finish out of order)."""
    out = list(keys)
    rng = random.Random(seed)
    for _ in range(len(out) // 20):
        a = rng.randrange(len(out))
        b = min(len(out) - 1, a + rng.randrange(20))
        out[a], out[b] = out[b], out[a]
    return out


def play(policy, runs):
    """Hit rate per run and bytes stored per run."""
    rates, written = [], []
    for run in runs:
        hits = stored = 0
        for key, size in run:
            if policy.lookup(key, size):
                hits += 1
            elif policy.offer(key, size) is not None:
                stored += size
        rates.append(hits / len(run))
        written.append(stored)
    return rates, written


def test_a_repeated_scan_larger_than_the_cache_keeps_a_stable_part():
    keys = dataset("A")
    total = sum(s for _, s in keys)
    for ratio in (1.25, 2.0, 4.0):
        runs = [scan(keys, r) for r in range(6)]
        rank = make_policy("rank", total / ratio)
        fifo = make_policy("fifo", total / ratio)
        hits, written = play(rank, runs)
        fhits, fwritten = play(fifo, runs)
        assert max(fhits) < 0.05, (ratio, fhits)  # FIFO evicts what the next run needs first
        assert all(h >= 0.9 / ratio for h in hits[1:]), (ratio, hits)  # about capacity / working set
        assert all(w <= 0.2 * fw for w, fw in zip(written[2:], fwritten[2:])), (ratio, written)
        held = set(k for k, *_ in rank.entries())
        hits_again, _ = play(rank, [scan(keys, 99)])
        assert hits_again[0] >= 0.9 / ratio
        assert len(held & set(k for k, *_ in rank.entries())) >= 0.95 * len(held)  # the same part


def test_keep_never_evicts_and_random_evicts_at_random():
    keys = dataset("A", 200)
    keep = make_policy("keep", 50.0)
    hits, _ = play(keep, [keys, keys])
    assert keep.used <= 50.0 and hits[1] == len(keep) / len(keys)
    rnd = make_policy("random", 50.0, seed=3)
    play(rnd, [keys])
    assert rnd.used <= 50.0 and len(rnd) > 0


def test_rank_adapts_when_a_new_dataset_replaces_the_old_one():
    a, b = dataset("A"), dataset("B", seed=2)
    cap = sum(s for _, s in a) / 2
    p = make_policy("rank", cap)
    hits, _ = play(p, [scan(a, r) for r in range(3)] + [scan(b, r) for r in range(3, 6)])
    assert hits[3] == 0  # B is new
    assert hits[4] >= 0.8 * 0.5 and hits[5] >= 0.9 * 0.5, hits  # by its second run
    assert not any(k.startswith("A/") for k, *_ in p.entries())  # A is gone by B's third run
    again, _ = play(p, [scan(a, 6), scan(a, 7)])
    assert again[1] >= 0.8 * 0.5, again  # A again


def test_two_analyses_alternating_share_the_cache():
    x = dataset("X")
    y = [(k + "#y", 0.6 * s) for k, s in x]
    cap = (sum(s for _, s in x) + sum(s for _, s in y)) / 2
    hits, _ = play(make_policy("rank", cap), [scan(x if r % 2 == 0 else y, r) for r in range(6)])
    fifo, _ = play(make_policy("fifo", cap), [scan(x if r % 2 == 0 else y, r) for r in range(6)])
    assert max(fifo) == 0
    assert min(hits[2:]) >= 0.4, hits


@pytest.mark.parametrize("name", ALL)
def test_every_policy_is_deterministic_and_its_state_round_trips_through_json(name):
    a, b = dataset("A", 300), dataset("B", 300, seed=2)
    seq = [scan(a, 0), scan(a, 1), scan(b, 2)]
    first, second = make_policy(name, 120.0), make_policy(name, 120.0)
    assert play(first, seq) == play(second, seq)
    assert first.state() == second.state() and first.entries() == second.entries()
    # stop half way, persist, restore, go on: the same decisions as without the stop
    whole = make_policy(name, 120.0)
    rest = [scan(b, 3), scan(a, 4)]
    play(whole, seq)
    saved = json.loads(json.dumps(whole.state())), json.loads(json.dumps(whole.entries()))
    restored = admission.Policy.from_state(*saved)
    assert type(restored) is type(whole) and restored.used == pytest.approx(whole.used)
    assert play(restored, rest) == play(whole, rest)
    assert restored.entries() == whole.entries()


@pytest.mark.parametrize("name", ALL)
def test_every_policy_stays_within_capacity_and_its_state_is_bounded(name):
    keys = dataset("A", 3000)
    p = make_policy(name, 300.0)
    for run in range(3):
        for key, size in scan(keys, run):
            if not p.lookup(key, size):
                p.offer(key, size)
            assert p.used <= 300.0 + 1e-9
    st = p.state()
    assert len(st.get("sample", ())) <= 1024
    assert len(st.get("ghost", ())) <= max(16, len(p))
    assert len(json.dumps(st)) < 100_000
    assert len(p.entries()) == len(p)


def test_rank_is_a_stable_hash_and_unknown_policies_are_refused():
    assert admission.rank("file-00001/Events/0") == admission.rank("file-00001/Events/0")
    assert 0 <= admission.rank("x") < 1 and admission.rank("x") != admission.rank("x", seed=1)
    with pytest.raises(ValueError, match="unknown cache policy"):
        make_policy("lru", 1.0)
    p = make_policy("rank", 10.0)
    assert p.offer("big", 11.0) is None and len(p) == 0  # larger than the cache
    p.offer("a", 1.0)
    p.remove("a")
    assert "a" not in p and p.used == 0


def test_rank_sample_heap_stays_bounded_when_sampled_keys_are_forgotten():
    from cacheaffinity.worker._store.admission import StableRank

    p = StableRank(capacity=100, sample=16)
    for i in range(20000):  # ever new keys, and the sample forgets the stale ones
        p.lookup(f"k{i}", 1)
        p.lookup(f"k{i // 2}", 1)
    assert len(p.sample) <= 16
    assert len(p.sample._heap) <= 2 * len(p.sample) + 64


def test_rank_never_displaces_a_live_entry_of_lower_rank():
    """Where a missed key needs two victims of higher rank but only one ranks above it, it is
    refused: before, the second victim was the next highest rank, one the run still needed,
    and a few boundary packs cycled through the cache every run (16 keys, half fit)."""
    writes = hits = 0.0
    for t in range(60):
        rng = random.Random(t)
        keys = [(f"f{t}/Events/{i * 1500}", rng.uniform(0.8, 1.2)) for i in range(16)]
        p = make_policy("rank", sum(s for _, s in keys) / 2)
        rates, written = play(p, [keys] * 6)
        writes += sum(1 for w in written[2:] if w)
        hits += sum(rates[2:]) / 4
        held = {k for k, *_ in p.entries()}
        top = max(admission.rank(k) for k in held)
        for k, s in keys:  # a key left out that ranks below a held one did not fit into the free room
            if k not in held and admission.rank(k) < top:
                assert p.used + s > p.capacity, (t, k)
    assert writes == 0, writes  # steady runs store nothing (the old rule: ~1 pack per run in 1 case of 4)
    assert hits / 60 >= 0.44, hits / 60


def test_rank_takes_one_lookup_recorded_twice_for_one():
    """The store records a miss when its value is put, so a value put twice (or a put whose
    insert answers the next record) is two lookups of one key with nothing between them.
    Before, that reuse distance of one entry made the demand one entry and the entry stale
    within a few lookups: a run's own low-ranked packs were evicted for high-ranked ones
    and missed the next run (16 keys a node, half fit)."""
    writes = hits = 0.0
    for t in range(40):
        rng = random.Random(t)
        keys = [(f"f{t}/Events/{i * 1500}", rng.uniform(0.8, 1.2)) for i in range(16)]
        p = make_policy("rank", sum(s for _, s in keys) / 2)
        rates, written = [], []
        for run in range(6):
            h = stored = 0
            for key, size in scan(keys, 100 * t + run):
                if p.lookup(key, size):
                    h += 1
                elif p.offer(key, size) is not None:
                    stored += size
                    p.lookup(key, size)  # the same lookup recorded again
            rates.append(h / len(keys))
            written.append(stored)
        writes += sum(1 for w in written[2:] if w)
        hits += sum(rates[2:]) / 4
        assert p.demand is None or p.demand > 4 * max(s for _, s in keys), (t, p.demand)
    assert writes == 0, writes  # steady runs store nothing (before: every node, every run)
    assert hits / 40 >= 0.48, hits / 40  # as without the second record (before: 0)


def test_rank_keeps_a_key_whose_place_in_the_run_moves_from_last_to_first_and_back():
    """A node's chunk order is not the same every run: in the beyond-capacity benchmark, a
    node's last chunk of one run was the first of the next and the last again after that.
    Its reuse distances were ~0 then ~2 runs; due after 1.25 x the demand, it went stale
    before its lookup and was evicted for a high-ranked key every other run."""
    writes = hits = 0.0
    for t in range(40):
        rng = random.Random(t)
        keys = [(f"f{t}/Events/{i * 1500}", rng.uniform(0.8, 1.2)) for i in range(16)]
        p = make_policy("rank", sum(s for _, s in keys) / 2)
        low = min(keys, key=lambda k: admission.rank(k[0]))  # a key every run keeps
        rest = [k for k in keys if k != low]
        rates, written = play(p, [rest + [low] if run % 2 == 0 else [low] + rest for run in range(8)])
        writes += sum(1 for w in written[4:] if w)  # runs 1-4 learn the demand
        hits += sum(rates[4:]) / 4
        assert low[0] in p, t
    assert writes == 0, writes  # (before: 96 of 160 runs wrote)
    assert hits / 40 >= 0.48, hits / 40
