"""The simulator (benchmarks/simulate.py): :class:`Simulation`, consecutive runs of one
policy on a cluster of nodes, with the scheduler's own placement, stealing and locator
functions (``cacheaffinity.scheduler``) and the store's admission policies."""

from __future__ import annotations

import heapq

import numpy as np

from benchmarks._sim_model import MB, PEER_POLICIES, POLICIES, Node, NodeCache, make_placement
from cacheaffinity.scheduler._locator import NodeSpeed, follow_holders
from cacheaffinity.scheduler._stealing import (
    COLD,
    THIEF_HOLDS,
    VICTIM_HOLDS,
    WarmStealCost,
    choose_steal,
    plan_steals,
    track_idle,
    warm_threshold,
)

__all__ = ["Simulation"]


class Simulation:
    """Consecutive runs of one policy on one cluster; caches persist between runs."""

    def __init__(self, cfg, cluster, n_chunks, policy, *, cache_capacity=None,
                 cache_policy="fifo", slow=None, churn=None, burst=None, seed=1):  # fmt: skip
        self.cfg = cfg
        self.policy = policy
        self.placement_kind, self.stealing, self.locator = POLICIES[policy]
        self.peers = policy in PEER_POLICIES and self.locator is True
        self.peer_bw = cfg.get("peer_link_MBps", 1250.0) * MB
        self.peer_serve_limit = cfg.get("peer_serve_limit")
        self.peer_timeout = cfg.get("peer_timeout_s")
        self.rng = np.random.default_rng(seed)
        rates = cfg["rates"]
        # chunks: coffea-like ids, events per chunk varying +- spread
        self.chunk_ids = [f"file-{i // 50:05d}/Events/{(i % 50) * 100000}" for i in range(n_chunks)]
        ev_rng = np.random.default_rng(seed + 1000)
        spread = cfg["events_spread"]
        events = cfg["events_per_chunk"] * ev_rng.uniform(1 - spread, 1 + spread, n_chunks)
        self.chunk_events = events
        #: cache keys of the chunks' columns (the chunk ids unless an analysis is set)
        self.keys = self.chunk_ids
        self._set_sizes(1.0)
        self.t_compute = events / rates["compute_events_per_s_per_core"]
        self.storage_bw = cluster["storage_MBps"] * MB
        self.ssd_bw = cluster["ssd_MBps"] * MB
        # per-chunk fixed cost (task dispatch, NanoEvents form, result transfer: seconds on
        # one core), 0 unless the config gives it
        self.t_overhead = float(rates.get("chunk_overhead_s", 0.0))
        # per-chunk cost of reading from storage beyond decompression (opening the file
        # over the network, reading its metadata): on the miss path only
        self.t_open = float(rates.get("open_overhead_s", 0.0))
        # bytes a chunk read from storage reads beyond its columns: the file's metadata
        # (header, directory, the TTree with its branches' basket tables), which coffea
        # reads again in every chunk task it opens the file in; 0 unless the config gives it
        self.b_open = float(rates.get("open_bytes", 0.0))
        #: cores the nodes' threads share (a cluster in a box on one machine); None: a core
        #: per thread
        self.cpu_cores = cluster.get("cpu_cores")
        # nodes (a pool; churn may add machines that start inactive)
        self.nodes: dict[str, Node] = {}
        sp_rng = np.random.default_rng(seed + 2000)
        sigma = cluster.get("speed_sigma", 0.0)
        for prefix, count, threads, *opt in cluster["groups"]:
            o = opt[0] if opt else {}
            for i in range(count):
                name = f"{prefix}-{i:04d}"
                slow_f = float(np.clip(sp_rng.lognormal(0.0, sigma), 0.5, 2.0)) if sigma else 1.0
                self.nodes[name] = Node(name, threads, slow_f, o.get("ssd_MBps", cluster["ssd_MBps"]) * MB,
                                        o["link_MBps"] * MB if "link_MBps" in o else None)  # fmt: skip
        initial = list(self.nodes)
        self.churn = churn
        if churn:
            extra = round(churn["pool_extra"] * len(initial))
            prefix, _, threads = cluster["groups"][-1][:3]
            for i in range(extra):
                name = f"{prefix}-x{i:04d}"
                self.nodes[name] = Node(name, threads, 1.0, self.ssd_bw)
        #: adaptive burst (``FULL["burst"]``): pool nodes that join at once during a run
        self.burst = burst
        if burst:
            prefix, _, threads = cluster["groups"][-1][:3]
            for i in range(burst["nodes"]):
                name = f"{prefix}-b{i:04d}"
                self.nodes[name] = Node(name, threads, 1.0, self.ssd_bw)
        for n in initial:
            self.nodes[n].alive = True
        if slow:
            self.nodes[slow[0]].slow = slow[1]
        #: coffea without a column cache (``direct``): every chunk reads and decompresses
        self.no_cache = cache_capacity == 0
        self.caches = {n: NodeCache(cache_capacity, cache_policy, seed=seed) for n in self.nodes}
        self.placement = make_placement(self.placement_kind, cfg)
        self.located: dict[int, tuple[str, str]] = {}
        #: learned seconds per task of each node (Locator.speed)
        self.speed = NodeSpeed()
        self.slack = cfg.get("locator_slack", 1.5)
        self.runs: list[dict] = []
        sc = cfg["stealing"]
        self.idle_time, self.backlog = sc["idle_time"], sc["backlog"]
        self.warm_backlog = sc.get("warm_backlog", float("inf"))
        #: LocalityStealing.warm_cost: what a stolen warm chunk costs each thief
        self.warm_cost = WarmStealCost(self.warm_backlog)
        #: chunk -> thief, for chunks its victim held when stolen (until they finish)
        self.warm_stolen: dict[int, str] = {}
        #: simulated seconds of the runs before this one (the learned cost's clock)
        self.clock = 0.0
        #: chunk -> node that processed it last (CacheAffinityPlugin.holder)
        self.holder: dict[int, str] = {}
        self.interval, self.max_moves = sc["interval"], sc["max_moves"]

    # ------------------------------------------------------------ workload
    def _set_sizes(self, factor: float) -> None:
        """Bytes and times of each chunk's columns, ``factor`` x the rates' bytes per event."""
        rates = self.cfg["rates"]
        self.bd = self.chunk_events * rates["bytes_per_event"] * factor  # decompressed bytes
        self.bc = self.bd / rates["compression_ratio"]  # compressed bytes
        self.t_decomp = self.bd / (rates["decompress_MBps_per_core"] * MB)
        self.t_cache_thread = self.bd / (rates["cache_read_MBps_per_core"] * MB)

    def set_workload(self, dataset: str | None = None, analysis: str | None = None, factor: float = 1.0):
        """The next runs read ``dataset`` (other chunk ids: other files) with ``analysis``
        (other columns of the same chunks: other cache keys, ``factor`` x the bytes)."""
        n = len(self.chunk_ids)
        prefix = f"{dataset}/" if dataset else ""
        ids = [f"{prefix}file-{i // 50:05d}/Events/{(i % 50) * 100000}" for i in range(n)]
        if ids != self.chunk_ids:  # other chunks: nothing is known about them
            self.chunk_ids = ids
            self.holder.clear()
            self.located.clear()
            self._runner_up_valid = False
        self.keys = [f"{c}#{analysis}" for c in ids] if analysis else ids
        self._set_sizes(factor)

    def record(self) -> None:
        """Record every node's lookups (``NodeCache.log``) from now on, for the optimum."""
        for cache in self.caches.values():
            cache.log = []

    # ------------------------------------------------------------ helpers
    def live(self):
        return [n for n in self.nodes.values() if n.alive]

    def weights(self):
        return {n.name: float(n.threads) for n in self.live()}

    def _set_nodes(self):
        if self.placement is not None:
            self.placement.set_nodes(self.weights())
        if self.stealing == "locality":
            self._runner_up_valid = False

    def runner_up(self, c: int):
        if not self._runner_up_valid:
            self._runner_up = self.placement.runner_up(self.chunk_ids)
            self._runner_up_valid = True
        return self._runner_up[c]

    def _enqueue(self, node: Node, c: int):
        heapq.heappush(node.queue, c)
        node.qcount += 1
        self.where[c] = node.name

    def _dequeue(self, node: Node, c: int):
        """Remove queued chunk ``c`` from ``node`` (lazily: the heap entry is skipped)."""
        node.qcount -= 1
        self.where[c] = None

    def _pop(self, node: Node):
        while node.queue:
            c = heapq.heappop(node.queue)
            if self.where.get(c) == node.name and c not in self.started:
                node.qcount -= 1
                return c
        return None

    # ------------------------------------------------------------ one run
    def run(self) -> dict:
        C = len(self.chunk_ids)
        self.where: dict[int, str | None] = {}
        self.started: set[int] = set()
        self.target: dict[int, str] = {}
        self.hashed: dict[int, str] = {}
        self.stolen: set[int] = set()
        self.idle_since: dict[str, float] = {}
        run_no = len(self.runs) + 1
        if self.churn and run_no > 1:
            self._churn(self.churn["between_runs"])
        self._set_nodes()
        for n in self.nodes.values():
            n.busy, n.queue, n.qcount, n.running, n.ssd_free, n.link_free = 0, [], 0, set(), 0.0, 0.0
        self.started_at: dict[int, float] = {}
        self.storage_free = 0.0
        self.t = 0.0
        self.events: list = []
        self.seq = 0
        self.hits = self.misses = self.steals = self.lost = self.peer_hits = 0
        self.peer_timeouts = self.warm_steals = 0
        self.warm_stolen.clear()
        self.peer_served: set[int] = set()
        self.storage_bytes = 0.0
        written0 = sum(x.written for x in self.caches.values())
        # per-run jitter of decompress and compute times (lognormal): real runs vary
        self.jitter = self.rng.lognormal(0.0, self.cfg["duration_jitter_sigma"], C)
        self.done = 0
        self.dur_sum = 0.0
        self.global_queue: list[int] = []
        live = self.live()
        if self.placement_kind == "dynamic":
            self.global_queue = list(range(C - 1, -1, -1))  # pop() from the end = priority order
        else:
            homes = self.placement.assign(self.chunk_ids)
            if self.locator is True:  # Locator.relocate: follow_holders, the real function
                alive = {n.name: n.threads * self.speed.speed(n.name) for n in live}
                placed = list(homes)
                follow_holders(homes, [self.holder.get(c) for c in range(C)], alive, self.slack,
                               runner_up=self.runner_up,
                               speed={n.name: self.speed.speed(n.name) for n in live})
                for c, (h, node) in enumerate(zip(placed, homes)):
                    if h != node:
                        self.hashed[c] = h
                    self.target[c] = node
                    self._enqueue(self.nodes[node], c)
                homes = []
            for c, node in enumerate(homes):
                if self.locator:
                    loc = self.located.get(c)
                    if loc is not None and loc[1] == node and loc[0] != node and self.nodes[loc[0]].alive:
                        self.hashed[c] = node
                        node = loc[0]
                self.target[c] = node
                self._enqueue(self.nodes[node], c)
        if self.churn:
            est = self.runs[-1]["makespan_s"] if self.runs else self._estimate()
            self._push(est * self.churn["at"], "churn", None, None)
        if self.burst and run_no == self.burst["run"]:
            est = self.runs[-1]["makespan_s"] if self.runs else self._estimate()
            self._push(est * self.burst["at"], "burst", None, None)
        for n in live:
            self._dispatch(n)
        if self.stealing != "none":
            self._push(self.interval, "tick", None, None)
        while self.done < C:
            t, _, kind, name, c = heapq.heappop(self.events)
            self.t = t
            if kind == "finish":
                self._finish(self.nodes[name], c)
            elif kind == "tick":
                if self.stealing == "locality":
                    self._steal_locality()
                else:
                    self._steal_stock()
                self._push(t + self.interval, "tick", None, None)
            elif kind == "churn":
                self._churn(self.churn["during_run"], during=True)
            elif kind == "burst":
                self._join_burst()
        out = {
            "run": run_no,
            "makespan_s": self.t,
            "hit_rate": self.hits / max(1, self.hits + self.misses),
            # own node's cache + another node's (peer fetch): not decompressed
            "served_rate": (self.hits + self.peer_hits) / max(1, self.hits + self.misses),
            "peer_hits": self.peer_hits,
            "peer_timeouts": self.peer_timeouts,
            "steals": self.steals,
            # steals of chunks the victim's node held (a hit turned into a transfer)
            "warm_steals": self.warm_steals,
            "storage_GB": self.storage_bytes / 1e9,
            # bytes stored in the node caches (SSD writes)
            "written_GB": (sum(x.written for x in self.caches.values()) - written0) / 1e9,
            "nodes": len(self.live()),
            "lost_tasks": self.lost,
        }
        self.runs.append(out)
        self.clock += self.t
        return out

    def _estimate(self):
        threads = sum(n.threads for n in self.live())
        work = float(np.sum(self.t_decomp + self.t_compute))
        return max(work / threads, (float(np.sum(self.bc)) + len(self.bc) * self.b_open) / self.storage_bw)

    def _push(self, t, kind, name, c):
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, name, c))

    def _dispatch(self, node: Node):
        while node.alive and node.busy < node.threads:
            if self.placement_kind == "dynamic":
                if not self.global_queue:
                    return
                c = self.global_queue.pop()
            else:
                c = self._pop(node)
                if c is None:
                    return
                self.where[c] = None
            self._start(node, c)

    def _start(self, node: Node, c: int):
        t = self.t
        self.started.add(c)
        node.busy += 1
        node.running.add(c)
        cpu = 1.0
        if self.cpu_cores:  # the threads busy now (this one included) share the cores
            cpu = max(1.0, sum(n.busy for n in self.nodes.values() if n.alive) / self.cpu_cores)
        f = node.slow * self.jitter[c] * cpu
        self.started_at[c] = t
        h = self.holder.get(c) if self.peers else None
        key = self.keys[c]
        if key in self.caches[node.name]:
            s = max(t, node.ssd_free)
            node.ssd_free = s + self.bd[c] / node.ssd_bw
            end = max(node.ssd_free, t + self.t_cache_thread[c] * cpu) + (self.t_compute[c] + self.t_overhead) * f
        elif (h is not None and h != node.name and self.nodes[h].alive and key in self.caches[h]
              and self._may_serve(self.nodes[h])):  # fmt: skip
            # peer fetch: the holder reads it from its SSD, sends the decompressed
            # bytes over the receiver's link, the receiver stores and computes
            src = self.nodes[h]
            s = max(t, src.ssd_free)
            src.ssd_free = s + self.bd[c] / src.ssd_bw
            bw = node.link_bw or self.peer_bw
            r = max(src.ssd_free, node.link_free)
            arrived = r + self.bd[c] / bw
            if self.peer_timeout is not None and arrived - t > self.peer_timeout:
                # worker.peer-timeout: the asker gives up, its link was busy until
                # then, and it reads storage (peer_failed in the real counters)
                give_up = t + self.peer_timeout
                node.link_free = max(node.link_free, give_up)
                heapq.heappush(src.serves, give_up)
                self.peer_timeouts += 1
                end = self._from_storage(node, c, give_up, f)
            else:
                node.link_free = arrived
                w = max(node.link_free, node.ssd_free)
                node.ssd_free = w + self.bd[c] / node.ssd_bw
                end = node.ssd_free + (self.t_compute[c] + self.t_overhead) * f
                self.peer_served.add(c)
                heapq.heappush(src.serves, node.link_free)
        else:
            end = self._from_storage(node, c, t, f)
        self._push(end, "finish", node.name, c)

    def _from_storage(self, node: Node, c: int, t: float, f: float) -> float:
        """A miss read from storage from time ``t`` on: its end time."""
        nbytes = self.bc[c] + self.b_open
        if node.link_bw is None:
            s = max(t, self.storage_free)
            self.storage_free = s + nbytes / self.storage_bw
            read_end = self.storage_free
        else:  # the node's link and the shared server, each FIFO
            s = max(t, self.storage_free, node.link_free)
            self.storage_free = s + nbytes / self.storage_bw
            node.link_free = s + nbytes / node.link_bw
            read_end = max(self.storage_free, node.link_free)
        decomp_end = read_end + (self.t_decomp[c] + self.t_open) * f
        if self.no_cache:  # no column cache: nothing written
            return decomp_end + (self.t_compute[c] + self.t_overhead) * f
        w = max(decomp_end, node.ssd_free)
        node.ssd_free = w + self.bd[c] / node.ssd_bw
        return node.ssd_free + (self.t_compute[c] + self.t_overhead) * f

    def _may_serve(self, src: Node) -> bool:
        """Whether holder ``src`` takes one more peer request (``worker.peer-serve-limit``
        requests in flight at most; a busy holder answers nothing and the asker reads
        storage)."""
        lim = self.peer_serve_limit
        if lim is None:
            return True
        ends = src.serves
        while ends and ends[0] <= self.t:
            heapq.heappop(ends)
        return len(ends) < lim

    def _finish(self, node: Node, c: int):
        if c not in node.running:  # the node left while this ran: lost
            return
        node.running.discard(c)
        node.busy -= 1
        self.done += 1
        cache = self.caches[node.name]
        if cache.lookup(self.keys[c], self.bd[c]):
            self.hits += 1
        else:
            self.misses += 1
            if c in self.peer_served:
                self.peer_hits += 1
            else:
                self.storage_bytes += self.bc[c] + self.b_open
            cache.add(self.keys[c], self.bd[c])
        self.peer_served.discard(c)
        # mean task duration (Dask's prefix duration estimate) for the stock model
        self.dur_sum += self.t_compute[c]
        if self.locator:  # CacheAffinityPlugin.transition, processing -> memory
            self.holder[c] = node.name
            seconds = self.t - self.started_at[c]
            if self.warm_stolen.pop(c, None) == node.name:  # LocalityStealing.finished
                # a warm steal's seconds are the thief's links, not its speed
                self.warm_cost.observe(node.name, seconds, self.speed.smoothed.get(node.name),
                                       self.clock + self.t)  # fmt: skip
            else:
                self.speed.observe(node.name, seconds)
            meant = self.hashed.pop(c, None)
            target = self.target.get(c)
            if meant is not None:
                self.located[c] = (node.name, meant)
            elif c in self.stolen and target is not None:
                self.located[c] = (node.name, target)
            else:
                self.located.pop(c, None)
        self.stolen.discard(c)
        self._dispatch(node)

    # ------------------------------------------------------------ stealing
    def _candidates(self, victim: Node):
        name = victim.name
        where, started = self.where, self.started
        return [c for c in set(victim.queue) if where.get(c) == name and c not in started]

    def _move(self, c: int, victim: Node, thief: Node) -> bool:
        if self.where.get(c) != victim.name or c in self.started:
            return False
        self._dequeue(victim, c)
        self._enqueue(thief, c)
        self.stolen.add(c)
        self.steals += 1
        if self.locator is True and self.holder.get(c) == victim.name:
            self.warm_stolen[c] = thief.name
            self.warm_steals += 1
        self._dispatch(thief)
        return True

    def _steal_locality(self):
        """One round of LocalityStealing.balance, with the real policy functions."""
        live = self.live()
        idle = [n.name for n in live if n.processing() < n.threads]
        names = track_idle(self.idle_since, idle, self.t, self.idle_time)
        if not names:
            return
        thieves = [self.nodes[a] for a in names]
        tset = set(names)
        victims = [
            n for n in live
            if n.name not in tset and n.processing() - n.threads > self.backlog * n.threads
        ]  # fmt: skip
        if not victims:
            return
        located, holder = self.located, self.holder
        multi = len(live) > 1

        def choose(victim, thief):
            cands = self._candidates(victim)
            if not cands:
                return None
            tn, vn = thief.name, victim.name
            thief_holds = (lambda c: holder.get(c) == tn) if self.locator is True \
                else (lambda c: located.get(c, ("",))[0] == tn)  # fmt: skip

            def where(c):
                if thief_holds(c):
                    return THIEF_HOLDS
                return VICTIM_HOLDS if holder.get(c) == vn else COLD

            return choose_steal(
                cands,
                where=where,
                priority=lambda c: (c,),
                runner_up_is_thief=(lambda cs: [self.runner_up(c) == tn for c in cs])
                if multi else None,
                take_warm=victim.processing() - victim.threads > victim.threads * (
                    warm_threshold(self.warm_cost.cost(tn, self.clock + self.t), self.speed.speed(vn),
                                   self.speed.speed(tn))
                    if self.locator is True else self.warm_backlog),
            )  # fmt: skip

        plan_steals(
            thieves,
            victims,
            nthreads=lambda n: n.threads,
            queued=lambda n: n.processing() - n.threads,
            wanted=lambda n: n.threads + 1 - n.processing(),
            choose=choose,
            move=self._move,
            backlog=self.backlog,
            max_moves=self.max_moves,
        )

    def _steal_stock(self):
        """Model of Dask's WorkStealing.balance for dependency-free tasks (see module doc)."""
        live = self.live()
        thieves = {n.name: n for n in live if n.processing() < n.threads}
        if not thieves or len(thieves) == len(live):
            return
        d = self.dur_sum / self.done if self.done else float(np.mean(self.t_compute))
        victims = sorted((n for n in live if n.processing() > n.threads),
                         key=lambda n: n.processing(), reverse=True)  # fmt: skip
        for victim in victims:
            if not thieves:
                break
            cands = self._candidates(victim)
            self.rng.shuffle(cands)
            for c in cands:
                if not thieves:
                    break
                thief = min(thieves.values(), key=lambda n: (n.processing() / n.threads, n.name))
                if thief.processing() * d + d <= victim.processing() * d - d / 2:
                    self._move(c, victim, thief)
                    if thief.processing() >= thief.threads:
                        del thieves[thief.name]
                else:
                    break

    # ------------------------------------------------------------ membership
    def _churn(self, fraction: float, during: bool = False):
        """adapt(): ``fraction`` of the live nodes leave, as many pool machines join."""
        live = [n for n in self.nodes.values() if n.alive]
        idle = [n for n in self.nodes.values() if not n.alive]
        k = max(1, round(fraction * len(live)))
        k = min(k, len(idle), len(live) - 1)
        leave = self.rng.choice(len(live), size=k, replace=False)
        join = self.rng.choice(len(idle), size=k, replace=False)
        gone = [live[i] for i in sorted(leave)]
        new = [idle[i] for i in sorted(join)]
        for n in gone:
            n.alive = False
        for n in new:
            n.alive = True
        if not during:
            return
        self._rehome(gone, new)

    def _join_burst(self):
        """``burst["nodes"]`` pool machines join at once, during the run."""
        idle = [n for n in self.nodes.values() if not n.alive]
        new = idle[: self.burst["nodes"]]
        for n in new:
            n.alive = True
        self._rehome([], new)

    def _rehome(self, gone: list, new: list):
        """During a run, after ``gone`` left and ``new`` joined: pending tasks of departed
        nodes fail over (running ones are lost); queued tasks move to a joined node that is
        now their home."""
        orphans = []
        for n in gone:
            orphans += [c for c in set(n.queue) if self.where.get(c) == n.name and c not in self.started]
            for c in n.running:
                self.started.discard(c)
                orphans.append(c)
                self.lost += 1
            n.running, n.queue, n.qcount, n.busy = set(), [], 0, 0
        for c in orphans:
            self.where[c] = None
        self._set_nodes()
        live = self.live()
        if self.placement_kind == "dynamic":
            self.global_queue.extend(sorted(orphans, reverse=True))
        elif self.placement_kind == "mod":  # strict restrictions: generous model, see doc
            for c in orphans:
                self._enqueue(live[int(self.rng.integers(len(live)))], c)
        else:
            # like CacheAffinityPlugin._retarget: orphans go to their new home; queued
            # tasks whose home is a joined node move there (not started ones only)
            joined = {n.name for n in new}
            pending = sorted(set(orphans) | {
                c for n in live for c in n.queue if self.where.get(c) == n.name and c not in self.started
            })  # fmt: skip
            homes = self.placement.assign([self.chunk_ids[c] for c in pending])
            orphan_set = set(orphans)
            for c, home in zip(pending, homes):
                if c in orphan_set:
                    self.target[c] = home
                    self.hashed.pop(c, None)
                    self._enqueue(self.nodes[home], c)
                elif home in joined and self.where.get(c) != home:
                    self._dequeue(self.nodes[self.where[c]], c)
                    self.target[c] = home
                    self.hashed.pop(c, None)
                    self._enqueue(self.nodes[home], c)
        for n in live:
            self._dispatch(n)
