"""Chunk packs: cache hits that survive a chunksize change and a different analysis.

Generated LZMA data with small baskets (many clusters per file), four cache
nodes, coffea's ``IterativeExecutor`` as the reference: chunk packs assembled
for other chunkings, stripe placement and sharing between processors, on a real
cluster; the pack mapping against coffea's own mapping for random ranges.
"""

from __future__ import annotations

import awkward as ak
import dask
import numpy as np
import pytest
import uproot
from coffea import processor
from distributed import Client, LocalCluster

import cacheaffinity
from cacheaffinity.coffea._identity import chunk_identity, stripe_of
from helpers import cache_client, counted, run_coffea
from testbed.synthetic import make_dataset

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")

C = 600  # chunksize of the first run
BASKET = 200  # entries per cluster in the generated files
STRIPE = 6000  # placement stripe (>> C, as the default is above common chunksizes)
PER_FILE = 3 * STRIPE
BRANCHES = ["Muon_pt", "Muon_eta", "Muon_phi", "Muon_mass", "Muon_charge",
            "Jet_pt", "Jet_eta", "Jet_phi", "Jet_mass"]  # fmt: skip
#: In-process workers share one GIL on a loaded machine: their learned speeds are
#: noise here (0.4-1.6 of the median measured), and a node learned slower than
#: 1/locator-slack sheds chunks it holds (the damping for really slow nodes, tested
#: in test_simulate.py and test_stealing.py).  These tests are about cluster
#: packs and stripes, so the damping is off.
NO_DAMPING = {"cacheaffinity.scheduler.locator-slack": 1e9}


class ColumnSums(processor.ProcessorABC):
    """Exact (integer) digests of every value of some columns, per dataset."""

    def __init__(self, collections=("Muon", "Jet")):
        self.collections = collections

    def process(self, events):
        out = {"entries": len(events), "event": int(ak.sum(events.event))}
        out["event_order"] = int(np.sum(ak.to_numpy(events.event) * np.arange(1, len(events) + 1)))
        for name in self.collections:
            coll = events[name]
            out[f"n{name}"] = ak.to_numpy(ak.num(coll)).tolist()
            for field in ("pt", "eta"):
                vals = ak.to_numpy(ak.flatten(coll[field])).astype(np.float64)
                out[f"{name}_{field}"] = int(np.sum(np.round(vals * 1e4).astype(np.int64)))
        return {events.metadata["dataset"]: out}

    def postprocess(self, accumulator):
        return accumulator


def canonical(out):
    # lists are concatenated in chunk order, which may differ between executors
    return {
        ds: {k: (sorted(v) if isinstance(v, list) else v) for k, v in d.items()}
        for ds, d in out.items()
    }


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("lzma")
    return make_dataset(
        d, events=2 * PER_FILE, files=2, codec="lzma", level=9,
        branches=BRANCHES, basket_events=BASKET, seed=3,
    )  # fmt: skip


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    settings = {
        "cacheaffinity.scheduler.stealing.enabled": False,
        "cacheaffinity.client.stripe-entries": STRIPE,
        **NO_DAMPING,
    }
    with cache_client(tmp_path_factory.mktemp("caches"), 4, **settings) as c:
        yield c


def run(executor, files, chunksize, proc=None):
    return run_coffea(executor, {"gen": files}, proc or ColumnSums(), chunksize, metadata_cache={})


def test_stripe_of():
    assert stripe_of(0, 100, 1000) == 0
    assert stripe_of(900, 1200, 1000) == 1  # 200 of 300 entries in stripe 1
    assert stripe_of(800, 1200, 1000) == 0  # tie: the lower stripe
    assert stripe_of(999, 3001, 1000) == 1
    with pytest.raises(ValueError, match="stripe-entries"):
        from coffea.processor.executor import WorkItem

        chunk_identity(WorkItem("d", "f.root", "Events", 0, 10, b"\0" * 16), {"f.root": None}, 0)


def test_chunksize_changes_hit_the_cache_and_match_coffea(client, files):
    """Runs with C, C, C/2, 0.4*C (not cluster aligned), 1.5*C: identical to
    IterativeExecutor, the later runs read (almost) nothing from storage."""
    ours = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
    rates = {}
    for i, chunksize in enumerate([C, C, C // 2, int(0.4 * C), int(1.5 * C)]):
        expected = run(processor.IterativeExecutor(), files, chunksize)
        got, d = counted(client, lambda: run(ours, files, chunksize))
        assert canonical(got) == canonical(expected), f"run {i + 1}, chunksize {chunksize}"
        rates[i] = d["hits"] / max(1, d["hits"] + d["misses"])
        if i == 0:
            assert d["misses"] > 0 and d["storage_opens"] > 0
        elif i == 1:
            assert d["misses"] == 0 and d["storage_opens"] == 0, d
        else:
            # a chunk crossing a stripe boundary was placed by its majority stripe
            # in run 1; clusters of its minority part are then on that node only:
            # a later chunk of the other stripe misses them.  At most the chunks on
            # both sides of each of the 2 boundaries per file open their file.
            assert rates[i] >= 0.95, (chunksize, d)
            assert d["storage_opens"] <= 2 * 2 * len(files), (chunksize, d)
    assert rates[1] == 1.0


def test_second_processor_hits_on_shared_columns(client, files, tmp_path):
    """A processor reading Muon only, then one reading Muon + Jet (superset):
    every Muon column of the second run is a hit, only Jet columns miss."""
    fresh = make_dataset(
        tmp_path, events=3000, files=1, codec="lzma", level=9,
        branches=BRANCHES, basket_events=BASKET, seed=5,
    )  # fmt: skip
    ours = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
    _, first = counted(client, lambda: run(ours, fresh, C, ColumnSums(("Muon",))))
    assert first["misses"] > 0
    got, second = counted(client, lambda: run(ours, fresh, C, ColumnSums(("Muon", "Jet"))))
    assert canonical(got) == canonical(run(processor.IterativeExecutor(), fresh, C, ColumnSums(("Muon", "Jet"))))
    # the same chunks look up the same Muon keys again (same keys, whoever asked):
    # >= 99% of the first run's lookups are hits now; only the Jet columns
    # (nJet, Jet_pt, Jet_eta: as many keys as the Muon ones) can miss
    assert second["hits"] >= 0.99 * (first["hits"] + first["misses"]), (first, second)
    assert 0 < second["misses"] <= first["misses"], (first, second)
    # and a subset afterwards is all hits
    _, third = counted(client, lambda: run(ours, fresh, C // 2, ColumnSums(("Jet",))))
    assert third["misses"] == 0 and third["storage_opens"] == 0, third


def _located_and_homes(client, ids):
    def get(dask_scheduler=None, ids=()):
        p = dask_scheduler.plugins["cacheaffinity"]
        return p.counters.get("located", 0), p.where(ids)

    located, where = client.run_on_scheduler(get, ids=list(ids))
    return located, {c: w["node"] for c, w in where.items()}


def test_entries_processed_off_their_stripe_are_found_next_run(tmp_path):
    """A chunk crossing a stripe boundary is placed by its majority stripe, so
    its node holds clusters of the neighbour stripe.  With the locator (holders
    per entry range), a later run's chunks of those entries go to that node:
    an unchanged rerun is all hits, and a finer chunking misses no more than
    with the locator off, where each chunk goes to its stripe's node (and fetches
    the packs it lacks from their holder)."""
    stripe, c1, c2 = 1200, 900, 300  # 900-chunks cross 6 of the 8 stripe boundaries
    fresh = make_dataset(
        tmp_path / "data", events=12 * c1, files=1, codec="lzma", level=9,
        branches=BRANCHES, basket_events=BASKET, seed=11,
    )  # fmt: skip
    expected = {cs: canonical(run(processor.IterativeExecutor(), fresh, cs)) for cs in (c1, c2)}
    misses, moved, differ = {}, {}, []
    for locator in (False, True):
        settings = {
            "distributed.scheduler.preload": ["cacheaffinity"],
            "distributed.worker.preload": ["cacheaffinity"],
            "cacheaffinity.worker.directory": str(tmp_path / f"caches-{locator}" / "node-{name}"),
            "cacheaffinity.scheduler.stealing.enabled": False,
            "cacheaffinity.scheduler.locator": locator,
            "cacheaffinity.client.stripe-entries": stripe,
            **NO_DAMPING,
        }
        with dask.config.set(settings), LocalCluster(
            n_workers=4, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster, Client(cluster) as c:
            ours = cacheaffinity.CacheAffinityExecutor(client=c, status=False)
            got, first = counted(c, lambda: run(ours, fresh, c1))
            assert canonical(got) == expected[c1] and first["misses"] > 0
            got, again = counted(c, lambda: run(ours, fresh, c1))
            assert canonical(got) == expected[c1]
            assert again["misses"] == 0 and again["storage_opens"] == 0, (locator, again)
            before, _ = _located_and_homes(c, [])
            got, finer = counted(c, lambda: run(ours, fresh, c2))
            assert canonical(got) == expected[c2]
            after, _ = _located_and_homes(c, [])
            misses[locator], moved[locator] = finer["misses"], after - before
            if locator:  # the homes of this cluster's nodes (each cluster has its own ids)
                from coffea.processor.executor import WorkItem

                uuid = str(uproot.open(fresh[0])["Events"].file.uuid)
                items = [WorkItem("gen", fresh[0], "Events", k * stripe, (k + 1) * stripe, uuid)
                         for k in range(9)]  # fmt: skip
                ids = [chunk_identity(x, stripe_entries=stripe) for x in items]
                _, homes = _located_and_homes(c, ids)
                # boundaries inside a 900-chunk between stripes of different nodes
                crossed = [k for k in range(1, 9) if (k * stripe) % c1 != 0]
                differ = [k for k in crossed if homes[ids[k - 1]] != homes[ids[k]]]
    assert moved[False] == 0
    assert misses[True] <= misses[False], misses
    if differ:  # entries processed off their stripe's node exist: the locator sends
        # their later chunks there (without it, peer fetch of the packs covers them)
        assert moved[True] > 0 and misses[True] == 0, (misses, moved, differ)


def test_mapping_buffers_equal_coffeas_for_any_range(files, tmp_path):
    """PackSourceMapping gives the very buffers coffea's UprootSourceMapping
    gives, for random ranges: cold (read and packed), warm (one pack covers the
    range: views; or assembled from several packs), and from coffea's final
    buffers stored for exactly that range; an empty range opens no file."""
    import random

    from coffea.nanoevents.mapping import UprootSourceMapping
    from coffea.nanoevents.util import tuple_to_key

    from cacheaffinity.coffea import _adapter as adapter
    from cacheaffinity.coffea._packs import PackSourceMapping, branch_kinds
    from cacheaffinity.coffea._work import _Opener
    from cacheaffinity.worker._store import ColumnCache

    tree = uproot.open(files[1])["Events"]
    uuid = str(tree.file.uuid)
    n = int(tree.num_entries)
    base_form = adapter.extract_base_form(tree, {})
    kinds = branch_kinds(base_form)
    assert kinds["Muon_pt"][0] == "jagged" and kinds["nMuon"][0] == "flat"
    keys = [
        ("nMuon,!load", None), ("nMuon,!load,!counts2offsets", None), ("Muon_pt,!load", "offsets"),
        ("Muon_pt,!load,!content", "data"), ("Jet_eta,!load,!content", "data"), ("event,!load", "data"),
    ]  # fmt: skip
    rng = random.Random(7)
    cold = [(0, n // 3), (n // 3, 2 * n // 3), (2 * n // 3, n)]
    ranges = [(0, n), (0, 1), (n - 1, n)] + [tuple(sorted(rng.sample(range(n + 1), 2))) for _ in range(12)]
    with ColumnCache(tmp_path / "cache", capacity="1 GiB") as store:

        def check(a, b):
            opener = _Opener({uuid: files[1]}, None, {})
            ours = PackSourceMapping(
                opener, a, b, store=store, token="tok", treepath="Events", kinds=kinds,
                cache={}, use_ak_forth=True,
            )  # fmt: skip
            theirs = UprootSourceMapping(opener, a, b, cache={}, use_ak_forth=True)
            for form_key, attr in keys:
                parts = (uuid, "Events", f"{a}-{b}", "0", form_key) + ((attr,) if attr else ())
                key = tuple_to_key(parts)
                x, y = ours[key], theirs[key]
                assert x.dtype == y.dtype and np.array_equal(x, y), (a, b, form_key)
            ours.finish()
            opener.close()
            return ours

        for a, b in cold:  # cold: every range read from the file and packed
            assert check(a, b).misses > 0
        assert store.info()["packs"] == len(cold)
        seen = set()
        for a, b in ranges + cold:  # warm: any range is served by the packs, nothing read
            read0 = store.stats()["bytes_read"] + store.stats()["bytes_mapped"]
            mapping = check(a, b)
            assert mapping.misses == 0 and mapping.hits > 0, (a, b)
            assert 0 <= mapping.bytes_copied <= mapping.bytes_served, (a, b)
            if (a, b) in cold:  # the pack's own range: views only, nothing copied
                assert mapping.bytes_copied == 0
                assert store.stats()["bytes_read"] + store.stats()["bytes_mapped"] > read0
            elif (a, b) not in seen and not any(x <= a and b <= y for x, y in cold):
                assert mapping.bytes_copied > 0, (a, b)  # assembled across packs: copied
            seen.add((a, b))
        # coffea's final buffers of each new range were stored with a pack of that range
        ranges = sorted(set(ranges + cold))
        assert store.info()["packs"] == len(ranges)
        for a, b in ranges:  # now every buffer comes straight from a pack: one hit per key
            mapping = check(a, b)
            assert (mapping.misses, mapping.hits) == (0, len(keys)), (a, b)
        # coffea 2026.7 asks ``key in buffer_cache`` and then ``buffer_cache[key]``
        a, b = ranges[0]
        opener = _Opener({uuid: files[1]}, None, {})
        mapping = PackSourceMapping(opener, a, b, store=store, token="tok", treepath="Events",
                                    kinds=kinds, cache={}, use_ak_forth=True)  # fmt: skip
        key = tuple_to_key((uuid, "Events", f"{a}-{b}", "0", "event,!load", "data"))
        cache = mapping._buffer_cache
        assert key in cache and "no/such/0-1/key" not in cache
        assert np.array_equal(cache[key], UprootSourceMapping(opener, a, b, cache={})[key])
        assert mapping.hits == 1  # ``in`` does not count
        with pytest.raises(KeyError):
            cache["no/such/0-1/key"]
        opener.close()
        assert store.info()["packs"] == len(ranges)
        # an empty range (a file of 0 entries) is answered from the form: no file opened
        opener = _Opener({uuid: files[1]}, None, {})
        forms = dict(zip(base_form["fields"], base_form["contents"]))
        empty = PackSourceMapping(
            opener, n, n, store=store, token="tok", treepath="Events", kinds=kinds, forms=forms,
            cache={}, use_ak_forth=True,
        )  # fmt: skip
        for form_key, attr in keys:
            parts = (uuid, "Events", f"{n}-{n}", "0", form_key) + ((attr,) if attr else ())
            assert len(empty[tuple_to_key(parts)]) in (0, 1)  # offsets of 0 lists: [0]
        assert opener.close() == (0, 0)


def test_a_lookup_a_peers_pack_answers_is_one_hit_and_one_peer_hit(files, tmp_path):
    """A chunk whose node lacks its pack gets it from the holder (``fetch_packs``): each of
    its lookups is a hit and a peer hit, once, whatever else the pack holds (before, the
    peer hits counted the pack's members, which benchmarks added to the hits: 113%); once
    stored on its node, the same lookups are plain hits."""
    from coffea.nanoevents.util import tuple_to_key

    from cacheaffinity.coffea import _adapter as adapter
    from cacheaffinity.coffea._packs import PackSourceMapping, branch_kinds, group
    from cacheaffinity.coffea._work import _Opener
    from cacheaffinity.worker._store import ColumnCache
    from cacheaffinity.worker._store.protocol import ColumnStore

    tree = uproot.open(files[1])["Events"]
    uuid, n = str(tree.file.uuid), int(tree.num_entries)
    kinds = branch_kinds(adapter.extract_base_form(tree, {}))
    keys = [("nMuon,!load", None), ("Muon_pt,!load", "offsets"), ("Muon_pt,!load,!content", "data"),
            ("Jet_eta,!load,!content", "data")]  # fmt: skip
    wide = keys + [("Jet_pt,!load,!content", "data"), ("event,!load", "data")]

    class Asker(ColumnStore):
        """A node's store whose missing packs another node's cache holds (PeerStore's
        contract without the network: fetched packs are stored here too)."""

        def __init__(self, local, holder):
            self.local, self.holder, self.fetches = local, holder, 0

        def get(self, key, default=None):
            return self.local.get(key, default)

        def get_many(self, keys):
            return self.local.get_many(keys)

        def get_packs(self, grp, start, stop):
            return self.local.get_packs(grp, start, stop)

        def put_pack(self, grp, start, stop, arrays):
            return self.local.put_pack(grp, start, stop, arrays)

        def count_served(self, hits=0, misses=0, nbytes=0, peer_hits=0):
            self.local.count_served(hits=hits, misses=misses, nbytes=nbytes, peer_hits=peer_hits)

        def fetch_packs(self, grp, start, stop):
            self.fetches += 1
            got = self.holder.get_packs(grp, start, stop)
            for p in got:
                self.local.put_pack(grp, p.start, p.stop, p.members)
            return got

    def read(store, which):
        opener = _Opener({uuid: files[1]}, None, {})
        m = PackSourceMapping(opener, 0, n, store=store, token="tok", treepath="Events", kinds=kinds,
                              cache={}, use_ak_forth=True)  # fmt: skip
        for form_key, attr in which:
            m[tuple_to_key((uuid, "Events", f"0-{n}", "0", form_key) + ((attr,) if attr else ()))]
        m.finish()
        opener.close()
        return m

    with ColumnCache(tmp_path / "holder", capacity="1 GiB", write_queue=0) as holder, \
            ColumnCache(tmp_path / "asker", capacity="1 GiB", write_queue=0) as local:  # fmt: skip
        assert read(holder, wide).misses > 0  # the holder read the file and packed more columns
        members = sum(len(p.members) for p in holder.get_packs(group("tok", "Events"), 0, n))
        assert members > 0
        asker = Asker(local, holder)
        fetched = read(asker, keys)
        assert asker.fetches == 1 and fetched.misses == 0
        assert fetched.hits == fetched.peer_hits > 0 and fetched.peer_hits < members, (fetched.hits, members)
        again = read(asker, keys)  # stored on the asker's node when fetched
        assert asker.fetches == 1 and (again.hits, again.peer_hits, again.misses) == (fetched.hits, 0, 0)
