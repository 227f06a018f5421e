"""The scheduler plugin's components on their own (no cluster): inherited nodes
(:class:`Inheritance`), per-node counters (:class:`NodeCounters`), the holders query
(:class:`Queries`) and the steal preference as they use inherited nodes.

Real ``WorkerState``/``TaskState`` objects, a real :class:`Membership`,
:class:`TorusPlacement` and :class:`Locator`.
"""

from __future__ import annotations

import logging
from collections import Counter, deque

from distributed.core import Status
from distributed.scheduler import TaskGroup, TaskPrefix, TaskState, WorkerState

from cacheaffinity.placement import TorusPlacement
from cacheaffinity.protocol import WORKER_METRIC
from cacheaffinity.scheduler._counters import NodeCounters
from cacheaffinity.scheduler._forecast import Forecast
from cacheaffinity.scheduler._inheritance import INHERITED_ASKED, Inheritance
from cacheaffinity.scheduler._locator import Locator
from cacheaffinity.scheduler._membership import Membership
from cacheaffinity.scheduler._queries import Queries
from cacheaffinity.scheduler._stealing import steal_preference

NODES = 6


class Parts:
    """The components as the plugin wires them, over ``NODES`` one-worker nodes."""

    def __init__(self):
        self.ws = [
            WorkerState(
                address=f"tcp://127.0.0.1:{9200 + i}", status=Status.running, pid=i, name=i,
                nthreads=1, memory_limit=0, local_directory="/tmp", nanny=None, server_id=str(i),
            )
            for i in range(NODES)
        ]  # fmt: skip
        self.m = Membership()
        self.m.bind({w.address: w for w in self.ws})
        for i, w in enumerate(self.ws):
            self.m.learn(w.address, f"n{i}", 1.0, reported=True)
        self.placement = TorusPlacement()
        self.placement.set_nodes(self.m.weights())
        self.locator = Locator(self.m, self.placement, size=1000)
        self.node_counters = NodeCounters(self.m)
        self.inheritance = Inheritance(
            self.m, self.placement, self.node_counters, self.locator.node_tasks
        )
        self.counters: Counter[str] = Counter()
        self.queries = Queries(
            self.m, self.placement, self.locator, self.inheritance, self.counters,
            self.node_counters, Forecast(), deque(maxlen=10),
        )  # fmt: skip

    def report(self, i: int, entries) -> None:
        """Worker ``i``'s heartbeat carries ``entries`` cache entries."""
        self.ws[i].metrics = {WORKER_METRIC: {"node": f"n{i}", "stats": {"entries": entries}}}


def test_a_node_with_entries_and_no_work_here_is_inherited_once(caplog):
    p = Parts()
    inh = p.inheritance
    with caplog.at_level(logging.INFO, logger="cacheaffinity.scheduler"):
        assert inh.note("n0", 12)
        assert not inh.note("n0", 12)  # looked at once
    assert "n0" in inh and list(inh) == ["n0"] and len(inh) == 1
    assert sum("joined with 12 cache entries" in r.message for r in caplog.records) == 1
    assert not inh.note("n1", 0) and not inh.note("n2", None) and not inh.note("n3", "many")
    assert inh.seen == {"n0", "n1", "n2", "n3"} and inh.nodes == {"n0"}
    # this scheduler placed work there (counters) or has tasks meant for it: not inherited
    p.node_counters.add("n4", "failovers")  # not work sent to it
    p.node_counters.add("n5", "steals")
    assert inh.note("n4", 3) and not inh.note("n5", 3)
    p2 = Parts()
    p2.locator.track("k", "f/Events/s10:0")
    p2.locator.set_target("k", "n1")
    assert not p2.inheritance.note("n1", 3) and "n1" in p2.inheritance.seen


def test_a_worker_is_looked_at_once_its_metrics_carry_cache_statistics():
    p = Parts()
    inh = p.inheritance
    inh.note_worker(p.ws[0].address)
    assert inh.seen == set()  # no report yet: looked at again later
    p.report(0, 7)
    p.report(1, 0)
    inh.note_worker(p.ws[0].address)
    inh.note_worker("tcp://unknown:1")
    assert inh.seen == {"n0"} and inh.nodes == {"n0"}
    inh.note_pending()  # the others: n1 reports an empty cache, n2.. nothing yet
    assert inh.seen == {"n0", "n1"} and inh.nodes == {"n0"}


def test_holders_name_inherited_runner_ups_for_chunks_of_unknown_holder():
    p = Parts()
    chunk = "f.root/Events/s100:3"
    home, *rest = p.placement.ranking(chunk, 1 + INHERITED_ASKED)
    asker = p.ws[int(home[1:])].address
    worker_of = {f"n{i}": w.address for i, w in enumerate(p.ws)}
    assert p.queries.holders(chunk, 0, 100, asker) == []  # its own node only: nobody else
    assert p.counters["holder-queries"] == 1
    for node in rest[::2]:
        p.inheritance.note(node, 5)
    assert p.inheritance.runner_ups(chunk) == rest[::2]
    assert p.queries.holders(chunk, 0, 100, asker) == [worker_of[n] for n in rest[::2]]
    # a recorded holder: only the record and the placement's node
    p.locator.set_located(chunk, rest[1])
    assert p.queries.holders(chunk, None, None, asker) == [worker_of[rest[1]]]
    assert p.queries.holders(None) == [] and p.counters["holder-queries"] == 3


def test_steal_preference_counts_unknown_chunks_on_an_inherited_victim_as_held():
    p = Parts()
    group = TaskGroup("t", TaskPrefix("t"))
    ts = TaskState("k", None, "processing", group, False)
    ts.priority = (0,)
    p.locator.track("k", "f/Events/s10:0")
    victim, thief = p.ws[0], p.ws[1]
    assert steal_preference(p.locator, [ts], victim, thief, take_warm=False) is ts  # cold
    p.inheritance.note("n0", 5)
    got = steal_preference(p.locator, [ts], victim, thief, take_warm=False, inherited=p.inheritance)
    assert got is None  # held by the victim: taken only when warm chunks may be
    assert steal_preference(p.locator, [ts], victim, thief, inherited=p.inheritance) is ts


def test_node_counters_count_read_and_prune(monkeypatch):
    from cacheaffinity.scheduler import _membership as membership_mod

    monkeypatch.setattr(membership_mod, "MAX_DEPARTED", 2)
    p = Parts()
    c = p.node_counters
    c.add("n0", "placements", 3)
    c.add("n0", "on-target")
    c.add("gone", "failovers")
    assert c.get("n0") == {"placements": 3, "on-target": 1} and c.get("nobody") == {}
    assert c.worked_on("n0") and not c.worked_on("gone") and not c.worked_on("nobody")
    assert c.to_dict() == {"n0": {"placements": 3, "on-target": 1}, "gone": {"failovers": 1}}
    assert "gone" in c and set(c) == {"n0", "gone"} and len(c) == 2
    assert c.prune() == 0  # within the bound: nothing forgotten yet
    for i in range(NODES + 2):
        c.add(f"old-{i}", "placements")
    assert c.prune() == NODES + 3 and set(c) == {"n0"}
