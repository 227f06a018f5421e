"""Missing columns fetched from the node that holds them (cacheaffinity.worker._peers).

Real clusters (worker processes, so requests go over TCP as between nodes),
generated LZMA data with small clusters and small placement stripes, coffea's
``IterativeExecutor`` as the reference.
"""

from __future__ import annotations

import dask
import pytest
import uproot
from coffea import processor
from coffea.processor.executor import WorkItem
from distributed import Client, LocalCluster, get_task_stream, get_worker

import cacheaffinity
from cacheaffinity.coffea._identity import chunk_identity
from cacheaffinity.protocol import HOLDERS_HANDLER, PACKS_HANDLER
from cacheaffinity.worker._peers import task_annotations
from helpers import counted
from test_packs import BASKET, BRANCHES, NO_DAMPING, ColumnSums, canonical, run
from testbed.synthetic import make_dataset

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")

C = 600
STRIPE = 1500  # many stripes: a 1.5*C chunk crosses a boundary between two nodes' stripes


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return make_dataset(
        tmp_path_factory.mktemp("lzma"), events=2 * 12 * STRIPE, files=2, codec="lzma",
        level=9, branches=BRANCHES, basket_events=BASKET, seed=21,
    )  # fmt: skip


#: A peer or holders request on a loaded machine (these clusters' workers share one process
#: and its event loop) may take longer than the default 5 s ``worker.peer-timeout``; a test
#: that counts served requests must not turn such a wait into a storage read.  Tests of the
#: timeout itself set their own.
NO_RACE = {"cacheaffinity.worker.peer-timeout": "60 s"}


def settings(root, **extra):
    return {
        "distributed.scheduler.preload": ["cacheaffinity"],
        "distributed.worker.preload": ["cacheaffinity"],
        "cacheaffinity.worker.directory": str(root / "node-{name}"),
        "cacheaffinity.scheduler.stealing.enabled": False,
        "cacheaffinity.client.stripe-entries": STRIPE,
        **NO_DAMPING,
        **extra,
    }


def test_rechunked_run_reads_the_neighbour_stripe_from_its_node(files, tmp_path):
    """Run 1 at C caches every stripe on its node; run 2 at 1.5*C has chunks
    straddling stripe boundaries: the part on another node's stripe comes from
    that node's cache (over TCP), not from storage.  The serving node does not
    count those reads as its own hits; run 3 (again 1.5*C) finds them locally."""
    expected = {cs: canonical(run(processor.IterativeExecutor(), files, cs)) for cs in (C, 3 * C // 2)}
    with dask.config.set(settings(tmp_path)), LocalCluster(
        n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0",
        host="127.0.0.1",
    ) as cluster, Client(cluster) as client:  # fmt: skip
        ours = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
        got, first = counted(client, lambda: run(ours, files, C))
        assert canonical(got) == expected[C]
        assert first["misses"] > 0 and first["peer_hits"] == 0  # nothing cached anywhere yet
        got, second = counted(client, lambda: run(ours, files, 3 * C // 2))
        assert canonical(got) == expected[3 * C // 2]
        # straddling chunks exist (24 stripes, 3 nodes): what their node lacked came
        # from the holders' packs, nothing from storage
        assert second["peer_hits"] > 0 and second["misses"] == 0, second
        assert second["peer_hits"] <= second["hits"], second  # the hits peers' packs answered
        # peer hits are the lookups the fetched packs answered: at most the members sent
        assert 0 < second["peer_hits"] <= second["peer_served"] and second["peer_bytes"] > 0
        assert second["storage_opens"] == 0 and second["peer_failed"] == 0, second
        got, third = counted(client, lambda: run(ours, files, 3 * C // 2))
        assert canonical(got) == expected[3 * C // 2]
        # stored where they were used; and the serving side's reads were not
        # counted as lookups: the same lookups are now exactly the hits
        assert third["misses"] == 0 and third["storage_opens"] == 0, third
        # found locally now (coffea's buffers of these chunks were packed in run 2)
        assert third["peer_hits"] == 0 and third["hits"] > 0, (second, third)


def test_peer_fetch_off_reads_storage(files, tmp_path):
    with dask.config.set(settings(tmp_path, **{"cacheaffinity.worker.peer-fetch": False})), LocalCluster(
        n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        ours = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
        run(ours, files, C)
        got, d = counted(client, lambda: run(ours, files, 3 * C // 2))
        assert canonical(got) == canonical(run(processor.IterativeExecutor(), files, 3 * C // 2))
        assert d["misses"] > 0 and d["peer_hits"] == 0 and d["storage_opens"] > 0, d

        def holder_queries(dask_scheduler=None):
            return dask_scheduler.plugins["cacheaffinity"].counters["holder-queries"]

        assert client.run_on_scheduler(holder_queries) == 0


def test_a_peer_that_does_not_answer_is_a_miss(files, tmp_path):
    """The scheduler names a holder that is gone: the task reads storage,
    the result is right, the failure is counted, the address is not retried
    by every column."""
    with dask.config.set(
        settings(tmp_path, **{"cacheaffinity.worker.peer-timeout": "2 s"})
    ), LocalCluster(
        n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        ours = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
        run(ours, files, C)

        def dead_holder(dask_scheduler=None):
            dask_scheduler.handlers[HOLDERS_HANDLER] = lambda **kw: ["tcp://127.0.0.1:9"]

        client.run_on_scheduler(dead_holder)
        got, d = counted(client, lambda: run(ours, files, 3 * C // 2))
        assert canonical(got) == canonical(run(processor.IterativeExecutor(), files, 3 * C // 2))
        assert d["peer_hits"] == 0 and d["storage_opens"] > 0, d
        # then the address is skipped: at most the tasks that asked at once failed
        assert 1 <= d["peer_failed"] <= 3, d  # one process, 3 worker threads


def test_a_holder_busy_serving_answers_nothing_and_the_asker_reads_storage(files, tmp_path):
    """Every worker already serves ``worker.peer-serve-limit`` (1) requests: the
    straddling chunks' requests are declined at once (``peer_busy``), their columns
    are read from storage, the result is right; once the holders are free, a
    request is served again."""
    with dask.config.set(
        settings(tmp_path, **{"cacheaffinity.worker.peer-serve-limit": 1}, **NO_RACE)
    ), LocalCluster(
        n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        ours = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
        run(ours, files, C)

        def set_serving(n, dask_worker=None):
            plugin = dask_worker.plugins["cacheaffinity"]
            assert plugin.peer_serve_limit == 1
            plugin.serving = n
            return plugin.peer["peer_busy"]

        # the first run may itself have declined a request (a chunk stolen while its
        # stripe's holder served another): count from here
        before = sum(client.run(set_serving, 1).values())
        got, d = counted(client, lambda: run(ours, files, 3 * C // 2))
        assert canonical(got) == canonical(run(processor.IterativeExecutor(), files, 3 * C // 2))
        busy = sum(client.run(set_serving, 0).values()) - before
        assert d["misses"] > 0 and d["peer_hits"] == 0 and d["storage_opens"] > 0, d
        assert busy > 0 and d["peer_failed"] == 0, (busy, d)

    # with the default limit (2) and 3 single-threaded workers, at most 2 requests reach
    # a holder at once: every miss is served, nothing declined, no slot left taken
    with dask.config.set(settings(tmp_path / "free", **NO_RACE)), LocalCluster(
        n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        ours = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
        run(ours, files, C)
        got, d = counted(client, lambda: run(ours, files, 3 * C // 2))
        assert d["peer_hits"] > 0 and d["misses"] == 0, d

        def slots(dask_worker=None):
            plugin = dask_worker.plugins["cacheaffinity"]
            return plugin.serving, plugin.peer["peer_busy"], plugin.peer_serve_limit

        assert set(client.run(slots).values()) == {(0, 0, 2)}


def test_holders_handler_names_other_nodes_only(files, tmp_path):
    with dask.config.set(settings(tmp_path)), LocalCluster(
        n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        ours = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
        run(ours, files, C)
        plugin = cluster.scheduler.plugins["cacheaffinity"]
        assert cluster.scheduler.handlers[HOLDERS_HANDLER] == plugin.holders
        assert plugin.holders(chunk=None) == [] and plugin.holders(chunk=12) == []
        workers = sorted(cluster.scheduler.workers)
        node_of = {w: plugin.membership.worker_node[w] for w in workers}
        # every stripe of the run: the asking worker's node is never named,
        # only live workers are, and some stripe's holder is named to the others
        uuid = str(uproot.open(files[0])["Events"].file.uuid)
        seen = set()
        for k in range(12):
            item = WorkItem("gen", str(files[0]), "Events", k * STRIPE, (k + 1) * STRIPE, uuid)
            chunk = chunk_identity(item, stripe_entries=STRIPE)
            for w in workers:
                named = plugin.holders(chunk=chunk, start=k * STRIPE, stop=(k + 1) * STRIPE, worker=w)
                assert all(node_of[a] != node_of[w] for a in named), (chunk, w, named)
                assert set(named) <= set(workers)
                seen.update(named)
        assert seen, "some stripe's holder is named to the other nodes"


def test_a_restarted_scheduler_names_runner_up_nodes_for_chunks_of_unknown_holder(files, tmp_path):
    """A scheduler plugin that starts while the nodes' caches hold entries (a scheduler
    restart) has no holder records: for such a chunk it names the chunk's runner-up nodes
    among those (where the stealing policy puts a stolen chunk first).  A plugin that saw the
    caches fill names nobody of the sort (no extra peer request in a first run)."""
    from cacheaffinity import CacheAffinityPlugin

    with dask.config.set(settings(tmp_path)), LocalCluster(
        n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        first = cluster.scheduler.plugins["cacheaffinity"]
        assert first.inheritance.nodes == set()  # empty caches when it met the nodes
        run(cacheaffinity.CacheAffinityExecutor(client=client, status=False), files, C)
        client.run(lambda: None)  # metrics: the next heartbeats carry the entries
        nodes = set(first.membership.node_workers)
        assert len(nodes) == 3 and first.inheritance.nodes == set()
        uuid = str(uproot.open(files[0])["Events"].file.uuid)
        item = WorkItem("gen", str(files[0]), "Events", 0, STRIPE, uuid)
        chunk = chunk_identity(item, stripe_entries=STRIPE)
        home, *runner_ups = first.placement.ranking(chunk, 3)  # 3 nodes: both others
        worker_of = {n: min(ws) for n, ws in first.membership.node_workers.items()}
        asker = worker_of[home]
        # the first plugin knows where the chunk was processed: no runner-up named
        assert first.holders(chunk=chunk, start=0, stop=STRIPE, worker=asker) == [
            worker_of[n] for n in first.locator.holders_of_range(chunk, 0, STRIPE) if n != home
        ]
        # "restart": a new plugin on the same scheduler, no records, caches full
        import time

        deadline = time.monotonic() + 120  # a wait on the condition, not a time budget
        while not all(
            (ws.metrics.get("cacheaffinity") or {}).get("stats", {}).get("entries", 0) > 0
            for ws in cluster.scheduler.workers.values()
        ):  # fmt: skip
            assert time.monotonic() < deadline, "no heartbeat with the caches' entries"
            time.sleep(0.1)
        async def replace(dask_scheduler=None):
            await dask_scheduler.register_scheduler_plugin(CacheAffinityPlugin(), idempotent=False)

        with pytest.warns(UserWarning, match="overwriting"):
            client.run_on_scheduler(replace)
        second = cluster.scheduler.plugins["cacheaffinity"]
        assert second is not first and second.inheritance.nodes == nodes
        assert not second.locator.recorded(chunk, 0, STRIPE)
        named = second.holders(chunk=chunk, start=0, stop=STRIPE, worker=asker)
        assert named == [worker_of[n] for n in runner_ups], (named, runner_ups)
        # its own runner-up asks too: the others of the ranking, never itself
        named = second.holders(chunk=chunk, start=0, stop=STRIPE, worker=worker_of[runner_ups[0]])
        assert worker_of[runner_ups[0]] not in named and worker_of[home] in named


def test_distributed_names_the_peers_module_uses(tmp_path):
    """Fails when distributed changes what cacheaffinity.worker._peers relies on:
    ``Worker.get_current_task``, ``Worker.state.tasks[key].annotations``,
    ``Worker.handlers`` / ``Scheduler.handlers``, ``distributed.utils.sync``."""
    from distributed.utils import sync  # noqa: F401

    def inside():
        w = get_worker()
        return task_annotations(w), PACKS_HANDLER in w.handlers

    with dask.config.set(settings(tmp_path)), LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        with dask.annotate(cacheaffinity="f/Events/s10:0", **{"cacheaffinity-entries": (0, 10)}):
            fut = client.submit(inside, pure=False)
        annotations, registered = fut.result()
        assert annotations.get("cacheaffinity") == "f/Events/s10:0"
        assert tuple(annotations.get("cacheaffinity-entries")) == (0, 10)
        assert registered
        assert HOLDERS_HANDLER in cluster.scheduler.handlers
        w = next(iter(cluster.workers.values()))
        assert task_annotations(w) == {}  # outside a task: nothing
        # the worker handler answers a request as a peer sends it (a tuple over TCP)
        assert client.sync(w.handlers[PACKS_HANDLER], group="no-such-tree", start=0, stop=10) == []


def test_a_node_without_the_files_form_gets_it_from_a_peer(files, tmp_path):
    """A chunk on a node that has no NanoEvents form of its file (a stolen chunk
    of a file that node never ran; here: the node's forms removed) takes the
    form from a peer instead of opening the file; a wrong identity gets nothing.

    Independent of placement (chunk ids carry the generated files' random UUIDs and
    modification times, so fixed node ids would not fix it): the node stripped of its
    forms is one whose every form another node also holds, and the wrong-identity probe
    (which removes the document it names, as any mismatch does) names one of those
    forms, never a preprocessing document (one removed was opened again: a 1 in 5 failure
    while the probe took the first document by name)."""
    import json
    import os

    from cacheaffinity.protocol import FORM_HANDLER

    expected = canonical(run(processor.IterativeExecutor(), files, C))
    # a loaded machine must not turn a slow or declined peer answer into a storage open
    # (that case has tests of its own above)
    slack = {**NO_RACE, "cacheaffinity.worker.peer-serve-limit": 8}
    with dask.config.set(settings(tmp_path, **slack)), LocalCluster(
        n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        ours = cacheaffinity.CacheAffinityExecutor(client=client, status=False)
        run(ours, files, C)
        workers = list(cluster.workers.values())
        plugins = [w.plugins["cacheaffinity"] for w in workers]

        def kinds(plugin) -> dict[str, bool]:
            """Document name -> whether it is a NanoEvents form (else: preprocessing)."""
            out = {}
            for n in sorted(os.listdir(plugin.forms.directory)):
                doc = plugin.forms.get(n) if n.endswith(".json") else None
                if doc is not None:
                    out[n] = "kind" in doc
            return out

        held = [kinds(p) for p in plugins]
        form_names = [{n for n, is_form in h.items() if is_form} for h in held]
        # the node to strip: it holds forms, and each of them is on another node too
        candidates = [
            i for i in range(3)
            if form_names[i] and form_names[i] <= set().union(*(form_names[j] for j in range(3) if j != i))
        ]  # fmt: skip
        assert candidates, held
        strip = candidates[0]
        worker, forms = workers[strip], plugins[strip].forms
        name = min(form_names[strip])
        with open(os.path.join(forms.directory, name)) as f:
            identity = json.loads(json.loads(f.read())["body"])["identity"]
        serve = worker.handlers[FORM_HANDLER]
        text = client.sync(serve, name=name, identity=json.dumps(identity))
        assert json.loads(text) == forms.get(name)
        assert client.sync(serve, name=name, identity=json.dumps({"size": -1})) is None
        assert not os.path.exists(os.path.join(forms.directory, name))  # a mismatch removes it
        assert client.sync(serve, name="no-such.json", identity="{}") is None

        # the node loses its NanoEvents forms (not its files' preprocessing documents, which
        # the preprocessing tasks placed on it read); the scheduler names the other
        # workers as holders
        for n in form_names[strip] - {name}:
            os.remove(os.path.join(forms.directory, n))
        assert sorted(n for n, is_form in kinds(plugins[strip]).items() if is_form) == []
        preprocessing = {n for n, is_form in held[strip].items() if not is_form}
        assert set(kinds(plugins[strip])) == preprocessing  # untouched
        # ... and what its process read of them (as a new worker process would)
        from cacheaffinity.coffea import _work as work

        work._DOCS.clear()
        others = [w.address for i, w in enumerate(workers) if i != strip]

        def name_others(dask_scheduler=None, others=()):
            dask_scheduler.handlers[HOLDERS_HANDLER] = lambda **kw: list(others)

        client.run_on_scheduler(name_others, others=others)
        def per_worker():
            return [(p.storage["storage_opens"], p.forms.misses, p.peer["peer_forms"]) for p in plugins]

        before = per_worker()
        with get_task_stream(client) as stream:
            got, d = counted(client, lambda: run(ours, files, C))
        assert canonical(got) == expected
        # the whole record on failure: per worker (opens, form misses, forms from peers) and
        # where each task of run 2 ran (an open under load was seen here once more)
        addresses = [w.address for w in workers]
        tasks = sorted((str(t["key"])[:24], addresses.index(t["worker"])) for t in stream.data)
        record = {"run 2": d, "stripped": strip, "before": before, "after": per_worker(), "tasks": tasks}
        assert d["misses"] == 0 and d["storage_opens"] == 0, json.dumps(record, default=str)
        assert plugins[strip].peer["peer_forms"] >= 1, plugins[strip].peer
        assert form_names[strip] <= set(kinds(plugins[strip]))  # stored locally again
