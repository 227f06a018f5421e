"""Bounds of in-memory state that once grew without bound in a long-lived scheduler or
worker (found by benchmarks/soak.py and by reading what it measures).

* ``cacheaffinity.worker._peers._DOWN`` (each worker process): every peer address that
  once failed to answer stayed for the life of the process, and a killed or restarted
  worker comes back at a new address: now only the peers that failed in the last
  ``DOWN_SECONDS``.
* The form documents of a node cache (``FormStore``, one per file, tree and reading
  options ever processed, outside the column capacity): now at most
  ``MAX_DOCUMENTS``, the first written removed first.
* Per-node state in the scheduler (the locator's learned node speeds, the inherited
  nodes, the stealing policy's warm-steal costs): every node id ever seen stayed,
  and nodes come and go (batch jobs on new hosts, new cache directories): now the live
  nodes and the last ``MAX_DEPARTED`` that left (``Membership.departed``), so a node
  back after a restart or a scale-down keeps what was learned of it.

Real ``WorkerState`` objects, a real ``Membership``, ``Locator`` and ``LocalityStealing``
(no cluster: a thousand nodes come and go in milliseconds).
"""

from __future__ import annotations

import os

import pytest
from distributed.core import Status
from distributed.scheduler import WorkerState

from cacheaffinity.placement import TorusPlacement
from cacheaffinity.scheduler import _membership as membership_mod
from cacheaffinity.scheduler._counters import NodeCounters
from cacheaffinity.scheduler._inheritance import Inheritance
from cacheaffinity.scheduler._locator import Locator
from cacheaffinity.scheduler._membership import MAX_DEPARTED, Membership
from cacheaffinity.scheduler._stealing import LocalityStealing
from cacheaffinity.worker import _forms as forms, _peers as peers
from cacheaffinity.worker._forms import FormStore

LIVE = 4


def worker(i: int) -> WorkerState:
    return WorkerState(
        address=f"tcp://10.0.{i // 250}.{i % 250}:{9000 + i}", status=Status.running, pid=i, name=i,
        nthreads=1, memory_limit=0, local_directory="/tmp", nanny=None, server_id=str(i),
    )  # fmt: skip


class Churn:
    """A scheduler's view of a cluster whose nodes come and go: ``LIVE`` nodes at a time,
    each new one with a node id never seen before (a new host or cache directory)."""

    def __init__(self):
        self.workers: dict[str, WorkerState] = {}
        self.m = Membership()
        self.m.bind(self.workers)
        self.locator = Locator(self.m, TorusPlacement(), size=1000)
        self.stealing = LocalityStealing(None, self.locator, enabled=True)
        self.n = 0
        self.live: list[WorkerState] = []

    def join(self, node: str | None = None) -> str:
        ws = worker(self.n)
        self.n += 1
        node = node or f"node-{self.n}"
        self.workers[ws.address] = ws
        assert self.m.learn(ws.address, node, 1.0, reported=True)
        self.live.append(ws)
        # what a run teaches the scheduler about the node: its speed, a warm steal's cost
        for _ in range(12):
            self.locator.speed.observe(node, 0.2)
        key = f"stolen-{self.n}"
        self.stealing.warm_stolen[key] = (ws.address, node)
        self.stealing.finished(key, ws.address, 2.0, 0.2)
        self.locator.relocate([], [], [])  # a submitted graph
        return node

    def leave(self) -> str:
        ws = self.live.pop(0)
        del self.workers[ws.address]
        return self.m.forget(ws.address)


def test_peers_that_failed_are_remembered_for_a_minute_only(monkeypatch):
    monkeypatch.setattr(peers, "_DOWN", {})
    # a thousand peer addresses fail, one a second (killed workers come back at new ones)
    for i in range(1000):
        peers._mark_down(f"tcp://10.0.0.1:{40000 + i}", now=float(i))
        assert len(peers._DOWN) <= peers.DOWN_SECONDS + 1
    assert len(peers._DOWN) == peers.DOWN_SECONDS
    assert f"tcp://10.0.0.1:{40000 + 999}" in peers._DOWN  # the newest is skipped
    assert f"tcp://10.0.0.1:{40000 + 900}" not in peers._DOWN  # the old ones forgotten


def test_a_peer_that_does_not_answer_is_skipped_then_forgotten(monkeypatch):
    """Through ``PeerStore._down``, as a chunk task marks a peer."""
    monkeypatch.setattr(peers, "_DOWN", {})
    clock = [1000.0]
    monkeypatch.setattr(peers.time, "monotonic", lambda: clock[0])

    class Plugin:
        failed = 0

        def count_peer(self, failed=0, **kwargs):
            self.failed += failed

    store = peers.PeerStore.__new__(peers.PeerStore)
    store._plugin = Plugin()
    for i in range(200):
        store._peers = [f"tcp://h:{i}", "tcp://other:1"]
        store._down(f"tcp://h:{i}", OSError("gone"))
        assert store._peers == ["tcp://other:1"]
        clock[0] += 10.0
    assert store._plugin.failed == 200
    assert len(peers._DOWN) == peers.DOWN_SECONDS / 10  # the peers of the last minute


def test_per_node_state_is_bounded_when_nodes_come_and_go():
    c = Churn()
    first = [c.join() for _ in range(LIVE)]
    for _ in range(1000):
        c.leave()
        c.join()
        known = c.m.known_limit()
        assert len(c.m.departed) <= MAX_DEPARTED
        assert len(c.locator.speed.count) <= known + 1  # + the node observed since the last graph
        assert len(c.locator.speed.smoothed) <= known + 1 and len(c.locator.speed.published) <= known + 1
        assert len(c.stealing.warm_cost.learned) <= known + 1
    assert c.m.known_limit() == LIVE + MAX_DEPARTED
    # the oldest nodes are forgotten, the live ones and the recent leavers are not
    assert not set(first) & set(c.locator.speed.count)
    live = {c.m.node_of(ws.address) for ws in c.live}
    recent = list(c.m.departed)[-10:]
    assert live | set(recent) <= set(c.locator.speed.count)
    assert live <= set(c.stealing.warm_cost.learned)
    assert c.locator.speed.speed(recent[0]) == pytest.approx(1.0)


def test_a_node_that_comes_back_keeps_what_was_learned_of_it():
    c = Churn()
    for _ in range(LIVE):
        c.join()
    gone = c.leave()
    assert list(c.m.departed) == [gone]
    for _ in range(50):  # others come and go meanwhile (fewer than MAX_DEPARTED)
        c.leave()
        c.join()
    assert gone in c.locator.speed.count
    c.join(gone)  # the same cache directory again (a restart, a scale-down and up)
    assert gone not in c.m.departed and gone in c.m.node_workers
    assert c.locator.speed.count[gone] >= 12


def test_inherited_marks_are_bounded_too(monkeypatch):
    monkeypatch.setattr(membership_mod, "MAX_DEPARTED", 8)
    c = Churn()
    inheritance = Inheritance(c.m, c.locator.placement, NodeCounters(c.m), c.locator.node_tasks)
    for _ in range(LIVE):
        assert inheritance.note(c.join(), 5)  # joined with 5 cache entries, no work sent here
    for _ in range(100):
        c.leave()
        assert inheritance.note(c.join(), 5)
        assert len(inheritance.seen) <= LIVE + 8 + 1 and len(inheritance) <= LIVE + 8 + 1
        inheritance.prune()  # as the plugin does every second
        assert len(inheritance.seen) <= LIVE + 8 and len(inheritance) <= LIVE + 8
    assert len(c.m.departed) == 8
    live = {c.m.node_of(ws.address) for ws in c.live}
    assert live <= inheritance.nodes and set(c.m.departed) <= inheritance.nodes


def test_form_documents_are_bounded_oldest_first(tmp_path):
    store = FormStore(str(tmp_path), max_documents=16)
    doc = {"kind": "TTree", "num_entries": 1}
    names = []
    for i in range(100):  # a hundred input files, each its own document
        name = FormStore.key(f"file-{i}", "Events")
        names.append(name)
        assert store.put(name, doc, identity={"i": i})
        t = 1_000_000 + i  # distinct modification times, in the order written
        os.utime(os.path.join(store.directory, name), (t, t))
        assert len(store) <= 16
    kept = {n for n in names if store.get(n) is not None}
    assert kept == set(names[-len(kept):]) and 14 <= len(kept) <= 16  # the newest
    assert store.get(names[0]) is None  # the first written was removed: rebuilt when needed
    assert FormStore(str(tmp_path)).max_documents == forms.MAX_DOCUMENTS
    unbounded = FormStore(str(tmp_path / "u"), max_documents=0)
    for i in range(40):
        unbounded.put(FormStore.key(f"f{i}", "Events"), doc)
    assert len(unbounded) == 40


def test_the_plugins_per_node_counters_are_bounded_too(monkeypatch):
    """``plugin.node_counters`` and the nodes ``plugin.inheritance`` saw keep the live
    nodes and the last ``MAX_DEPARTED`` that left, as the locator does."""
    from cacheaffinity.scheduler._plugin import CacheAffinityPlugin

    monkeypatch.setattr(membership_mod, "MAX_DEPARTED", 8)
    plugin = CacheAffinityPlugin()
    workers: dict[str, WorkerState] = {}
    plugin.membership.bind(workers)
    live: list[WorkerState] = []
    for i in range(200):
        ws = worker(i)
        workers[ws.address] = ws
        plugin.membership.learn(ws.address, f"node-{i}", 1.0, reported=True)
        plugin.node_counters.add(f"node-{i}", "placements")
        plugin.inheritance.note(f"node-{i}", 0)  # seen, with an empty cache
        live.append(ws)
        if len(live) > LIVE:
            gone = live.pop(0)
            del workers[gone.address]
            plugin.membership.forget(gone.address)
        plugin._prune_nodes()
        assert len(plugin.node_counters) <= LIVE + 8 and len(plugin.inheritance.seen) <= LIVE + 8
    kept = set(plugin.node_counters)
    assert {f"node-{i}" for i in range(192, 200)} <= kept  # the live and the recent leavers
    assert "node-0" not in kept and "node-0" not in plugin.inheritance.seen
