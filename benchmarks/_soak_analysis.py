"""The soak's figures from its samples and runs (:mod:`benchmarks.soak`): slopes and growths
per process and structure (worker processes cut into segments at every restart), hit rates
per phase, the bounds a soak must hold (:func:`check_bounds`), the series as the JSON keeps
them (:func:`columnar`) and the terminal tables."""

from __future__ import annotations

import math
from typing import Any

def _per_entry(c: dict) -> float | None:
    """Index database bytes per entry the cache holds: its pages as SQLite counts them
    (those still in the WAL included, free ones included)."""
    return round(c["db_pages_bytes"] / c["entries"], 1) if c.get("entries") and c.get("db_pages_bytes") else None


def mean(values) -> float | None:
    v = [x for x in values if x is not None]
    return round(sum(v) / len(v), 4) if v else None


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ``ys`` over ``xs`` (None with fewer than 2 distinct xs)."""
    pts = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in pts) / sxx


def pooled_slope(segments: list[list[tuple[float, float]]]) -> float | None:
    """One slope through several segments, each with its own intercept (within-segment
    least squares): a restart's drop is neither shrinking nor growth."""
    sxy = sxx = 0.0
    for seg in segments:
        if len(seg) < 2:
            continue
        mx = sum(x for x, _ in seg) / len(seg)
        my = sum(y for _, y in seg) / len(seg)
        sxx += sum((x - mx) ** 2 for x, _ in seg)
        sxy += sum((x - mx) * (y - my) for x, y in seg)
    return sxy / sxx if sxx else None


def worker_segments(samples: list[dict], key, warmup: int, restart_warmup: int) -> dict[str, list[list[tuple[float, float]]]]:
    """Per worker slot (name), ``(run, key(worker sample))`` of its samples after the
    ``warmup`` runs, cut into segments at every new worker process (a kill, a scale-down
    and up); a process that started after the first sample counts only once it has lived
    ``restart_warmup`` runs (its first sample's run + ``restart_warmup``)."""
    out: dict[str, list[list[tuple[float, float]]]] = {}
    first_pid: dict[str, Any] = {}
    born: dict[str, tuple[Any, int]] = {}  # slot -> (pid, run of its first sample)
    for s in samples:
        for slot, w in s.get("workers", {}).items():
            pid = w.get("pid")
            first_pid.setdefault(slot, pid)
            segs = out.setdefault(slot, [])
            if born.get(slot, (None,))[0] != pid:
                born[slot] = (pid, s["run"])
                segs.append([])
            y = key(w)
            if y is None or s["run"] <= warmup:
                continue
            if pid != first_pid[slot] and s["run"] - born[slot][1] < restart_warmup:
                continue
            segs[-1].append((s["run"], y))
        for slot in list(born):  # scaled down: its next process is a new one
            if slot not in s.get("workers", {}):
                born[slot] = (None, s["run"])
    return {k: [seg for seg in v if seg] for k, v in out.items()}


def late_fd_kinds(samples: list[dict], warmup: int, restart_warmup: int) -> list[str]:
    """Per worker slot whose descriptors (net of the pools) grew late
    (:func:`_late_growth`): the kinds of descriptor its last sample has more of than the
    sample before the last third that had the most (``slot: kind +n``), to name a late
    growth."""
    out = []
    segs = worker_segments(samples, lambda x: x.get("fds_net"), warmup, restart_warmup)
    by_run = {(slot, s["run"]): w for s in samples for slot, w in s.get("workers", {}).items()}
    for slot, v in sorted(segs.items()):
        points = [p for seg in v for p in seg]
        late = _late_kinds(points, lambda run, slot=slot: by_run[(slot, run)].get("fd_kinds"))
        if late:
            top, more = late
            out.append(f"worker {slot}: run {top:g} -> {points[-1][0]:g}: {more}")
    return out


def _late_kinds(points: list[tuple[float, float]], kinds_at) -> tuple[float, str] | None:
    """If ``points`` grew late (:func:`_late_growth`): the run of the sample before the last
    third that had the most (the latest of them), and the kinds (``kinds_at(run)``: a
    ``{kind: count}``) the last sample has more or fewer of than it (``kind +n, ...``)."""
    if (_late_growth(points) or 0) <= 0:
        return None
    cut = points[0][0] + (points[-1][0] - points[0][0]) * 2 / 3
    top = max((p for p in points if p[0] <= cut), key=lambda p: (p[1], p[0]))[0]
    then, now = kinds_at(top) or {}, kinds_at(points[-1][0]) or {}
    diff = {k: now.get(k, 0) - then.get(k, 0) for k in set(now) | set(then)}
    return top, ", ".join(f"{k} {d:+d}" for k, d in sorted(diff.items()) if d) or "no kind changed"


def late_scheduler_fd_kinds(after: list[dict]) -> list[str]:
    """When the scheduler's descriptors net of the pools grew late (:func:`_late_growth`
    over ``after``, the samples after the warm-up): its kinds of descriptor the last
    sample has more of than the sample before the last third that had the most, and the
    terms of the net figure at both (``scheduler: ...``), to name a late growth."""
    by_run = {s["run"]: s for s in after if s.get("scheduler_fds_net") is not None}
    late = _late_kinds([(run, s["scheduler_fds_net"]) for run, s in by_run.items()],
                       lambda run: by_run[run].get("scheduler_fd_kinds"))  # fmt: skip
    if not late:
        return []
    (top, more), last = late, max(by_run)
    terms = ("scheduler_fds", "scheduler_pooled_comms", "scheduler_harness_comms", "scheduler_pooled_by_workers")
    both = "; ".join(f"{k[len('scheduler_'):]} {by_run[top].get(k)} -> {by_run[last].get(k)}" for k in terms)
    return [f"scheduler: run {top:g} -> {last:g}: {more} ({both})"]


def _per_100(x: float | None) -> float | None:
    return None if x is None else round(100 * x, 2)


def _max_growth(segs: dict) -> float | None:
    """The largest :func:`_growth_of_segments` over the slots of :func:`worker_segments`."""
    got = [g for g in (_growth_of_segments(v) for v in segs.values()) if g is not None]
    return max(got) if got else None


def _max_slope(segs: dict) -> float | None:
    """The largest pooled slope per 100 runs over the slots of :func:`worker_segments`."""
    got = [x for x in (pooled_slope(v) for v in segs.values()) if x is not None]
    return _per_100(max(got)) if got else None


def _growth_of_segments(segs: list[list[tuple[float, float]]]) -> float | None:
    return sum(seg[-1][1] - seg[0][1] for seg in segs) if segs else None


def _late_growth(points: list[tuple[float, float]]) -> float | None:
    """How much the last value exceeds every value before the last third of ``points``
    (``(run, value)``, after the warm-up): > 0 while a structure still grows at the end."""
    if len(points) < 3:
        return None
    cut = points[0][0] + (points[-1][0] - points[0][0]) * 2 / 3
    before = [y for x, y in points if x <= cut]
    return points[-1][1] - max(before) if before else None


def structure_growth(samples: list[dict], field: str, warmup: int) -> dict[str, dict]:
    """Per structure of ``samples[i][field]`` (scheduler side), after the warm-up: first,
    last, max, growth (last - first), slope per 100 runs, late growth
    (:func:`_late_growth`), cap (a deque's maxlen)."""
    after = [s for s in samples if s["run"] > warmup and s.get(field)]
    if not after:
        after = [s for s in samples if s.get(field)][-1:]
    names = sorted({k for s in after for k in s[field] if not k.endswith(".maxlen")})
    out = {}
    for name in names:
        pts = [(s["run"], s[field][name]) for s in after if name in s[field]]
        if not pts:
            continue
        ys = [y for _, y in pts]
        sl = slope([x for x, _ in pts], ys)
        out[name] = {"first": ys[0], "last": ys[-1], "max": max(ys), "growth": ys[-1] - ys[0],
                     "per_100_runs": None if sl is None else round(100 * sl, 3),
                     "late_growth": _late_growth(pts), "cap": after[-1][field].get(name + ".maxlen")}  # fmt: skip
        if name.endswith("[*]"):  # the contents of a dict's containers: per entry
            parent = name[:-3]
            cut = pts[0][0] + (pts[-1][0] - pts[0][0]) * 2 / 3
            ratios = [s[field][name] / s[field][parent] for s in after
                      if s["run"] <= cut and s[field].get(parent) and name in s[field]]  # fmt: skip
            out[name]["per_entry_max_before"] = round(max(ratios), 3) if ratios else None
            out[name]["parent_last"] = after[-1][field].get(parent)
    return out


def worker_structure_growth(samples: list[dict], warmup: int, restart_warmup: int) -> dict[str, dict]:
    """Per structure of the worker plugins: growth summed over each slot's segments (as
    the fds), maximum over slots; pooled slope per 100 runs and the last value, maximum
    over slots; late growth of each slot's last segment, maximum over slots."""
    names = sorted({k for s in samples for w in s.get("workers", {}).values() for k in (w.get("plugin") or {})
                    if not k.endswith(".maxlen")})  # fmt: skip
    out = {}
    for name in names:
        segs = worker_segments(samples, lambda w, n=name: (w.get("plugin") or {}).get(n), warmup, restart_warmup)
        growth = [g for g in (_growth_of_segments(v) for v in segs.values()) if g is not None]
        slopes = [x for x in (pooled_slope(v) for v in segs.values()) if x is not None]
        late = [g for g in (_late_growth(v[-1]) for v in segs.values() if v) if g is not None]
        last = [v[-1][-1][1] for v in segs.values() if v]
        caps = [w["plugin"][name + ".maxlen"] for smp in samples[-1:] for w in smp.get("workers", {}).values()
                if name + ".maxlen" in (w.get("plugin") or {})]  # fmt: skip
        out[name] = {"cap": max(caps) if caps else None, "growth": max(growth) if growth else None,
                     "per_100_runs": round(100 * max(slopes), 3) if slopes else None,
                     "late_growth": max(late) if late else None,
                     "last": max(last) if last else None}  # fmt: skip
    return out


def phases(runs: list[dict], events: list[dict]) -> list[dict]:
    """Hit rates between events: a phase starts at the run of each event (a kill, a
    scaling, the chunksize change) and ends before the next."""
    starts = sorted({e["run"] for e in events} | {1})
    out = []
    for i, a in enumerate(starts):
        b = starts[i + 1] if i + 1 < len(starts) else math.inf
        rs = [r for r in runs if a <= r["run"] < b]
        if not rs:
            continue
        f = [r["figures"] or {} for r in rs]
        hits = sum(x.get("hits", 0) for x in f)
        peer = sum(x.get("peer_hits", 0) for x in f)
        lookups = hits + sum(x.get("misses", 0) for x in f)
        walls = sorted(r["wall_s"] for r in rs if r["wall_s"] is not None)
        evs = [e["event"] + (f" worker {e['worker']}" if e.get("worker") else "") for e in events if e["run"] == a]
        out.append({
            "from_run": a, "to_run": max(r["run"] for r in rs), "after": ", ".join(evs) or "start",
            "runs": len(rs), "hit_rate": round(hits / lookups, 4) if lookups else None,
            "peer_hits": peer,
            "first_run_hit_rate": rs[0].get("hit_rate"),
            "median_wall_s": walls[len(walls) // 2] if walls else None,
        })  # fmt: skip
    return out


def analyse(doc: dict, cfg) -> dict:
    """The soak's figures (the JSON's top level): counts, slopes, growths, phases."""
    samples, runs = doc["samples"], doc["runs"]
    w, skip = cfg.warmup, cfg.restart_warmup
    after = [s for s in samples if s["run"] > w]
    sched_slope = slope([s["run"] for s in after], [s["scheduler_rss_mb"] for s in after])
    rss = worker_segments(samples, lambda x: x.get("rss_mb"), w, skip)
    fds = worker_segments(samples, lambda x: x.get("fds"), w, skip)
    thr = worker_segments(samples, lambda x: x.get("threads"), w, skip)
    fds_net = worker_segments(samples, lambda x: x.get("fds_net"), w, skip)
    thr_net = worker_segments(samples, lambda x: x.get("threads_net"), w, skip)
    by_slot = {k: (None if pooled_slope(v) is None else round(100 * pooled_slope(v), 2)) for k, v in rss.items()}
    fd_by_slot = {k: _growth_of_segments(v) for k, v in fds.items()}
    thr_by_slot = {k: _growth_of_segments(v) for k, v in thr.items()}

    def late(segs: dict) -> int | None:  # per slot, its processes one after the other
        got = [g for g in (_late_growth([p for seg in v for p in seg]) for v in segs.values()) if g is not None]
        return max(got) if got else None

    def sched_late(key):
        return _late_growth([(s["run"], s[key]) for s in after if s.get(key) is not None])
    plugin = structure_growth(samples, "plugin", w)
    dask_state = structure_growth(samples, "dask", w)
    workers_state = worker_structure_growth(samples, w, skip)
    over = [(s["step"], slot) for s in samples for slot, c in s.get("caches", {}).items()
            if c["data_bytes"] > doc["capacity_bytes"]]  # fmt: skip
    valid = [v for v in by_slot.values() if v is not None]

    def first_last(key):
        xs = [s[key] for s in after if s.get(key) is not None]
        return (xs[-1] - xs[0]) if len(xs) >= 2 else None

    index_growth = {}
    for slot in sorted({k for s in after for k in s.get("caches", {})}):
        cs = [s["caches"][slot] for s in after if slot in s.get("caches", {})]
        xs = [c["index_bytes"] for c in cs]
        index_growth[slot] = {"first": xs[0], "last": xs[-1], "max": max(xs)} if xs else None
        if xs and cs[0].get("db_bytes") is not None:  # the database and its WAL apart
            index_growth[slot].update(
                db_first=cs[0]["db_bytes"], db_last=cs[-1]["db_bytes"], db_max=max(c["db_bytes"] for c in cs),
                wal_max=max(c.get("wal_bytes") or 0 for c in cs),
                free_max=max(c.get("db_free_bytes") or 0 for c in cs),
                entries_first=cs[0].get("entries"), entries_last=cs[-1].get("entries"),
                per_entry_first=_per_entry(cs[0]), per_entry_last=_per_entry(cs[-1]),
                forms_max=max(c.get("forms") or 0 for c in cs),
                forms_bytes_max=max(c.get("forms_bytes") or 0 for c in cs),
            )  # fmt: skip
    ratios = [g["per_entry_last"] / g["per_entry_first"] for g in index_growth.values()
              if g and g.get("per_entry_first") and g.get("per_entry_last")]  # fmt: skip
    forms_max = max((g.get("forms_max") or 0 for g in index_growth.values() if g), default=None)
    forms_bytes_max = max((g.get("forms_bytes_max") or 0 for g in index_growth.values() if g), default=None)
    half = [s for s in samples if s["run"] > max(w, len(runs) // 2)]
    half_rss = worker_segments(samples, lambda x: x.get("rss_mb"), max(w, len(runs) // 2), skip)
    walls = [r["wall_s"] for r in runs if r["wall_s"] is not None]
    evictions: dict[tuple, int] = {}  # (slot, pid) -> its process's evictions (a counter per process)
    for smp in samples:
        for slot, wk in smp.get("workers", {}).items():
            if wk.get("evictions") is not None:
                evictions[(slot, wk["pid"])] = max(evictions.get((slot, wk["pid"]), 0), wk["evictions"])
    per_analysis = {}
    for a in sorted({r["analysis"] for r in runs}):
        ws = sorted(r["wall_s"] for r in runs if r["analysis"] == a and r["wall_s"] is not None)
        per_analysis[a] = {"runs": len(ws), "median": ws[len(ws) // 2] if ws else None,
                           "max": ws[-1] if ws else None}  # fmt: skip
    # per step: a sample counts the records since the one before it (--sample-every)
    first = samples.index(after[0]) if after else 0
    steps_after = (after[-1]["step"] - samples[first - 1]["step"]) if after and first else len(after)
    log_per_run = {k: round(sum(s.get(k) or 0 for s in after) / max(1, steps_after), 2)
                   for k in ("scheduler_log_lines", "worker_log_records", "worker_log_warnings", "client_log_records")}
    return {
        "runs": len(runs),
        "wrong_results": sum(1 for r in runs if r["correct"] is False),
        "hung_runs": sum(1 for r in runs if r["hung"]),
        "failed_runs": sum(1 for r in runs if r["error"] and not r["hung"]),
        "warmup_runs": w,
        "scheduler_rss_mb_per_100_runs": None if sched_slope is None else round(100 * sched_slope, 2),
        "worker_rss_mb_per_100_runs": max(valid) if valid else None,
        "worker_rss_mb_per_100_runs_by_slot": by_slot,
        "fd_growth": max((v for v in fd_by_slot.values() if v is not None), default=None),
        "fd_growth_by_slot": fd_by_slot,
        "thread_growth": max((v for v in thr_by_slot.values() if v is not None), default=None),
        "thread_growth_by_slot": thr_by_slot,
        "scheduler_fd_growth": first_last("scheduler_fds"),
        "scheduler_thread_growth": first_last("scheduler_threads"),
        # the same net of the pools (pooled connections, threads of on-demand pools)
        "fd_net_growth": _max_growth(fds_net),
        "thread_net_growth": _max_growth(thr_net),
        # still growing at the end: the last sample above every one before the last third
        "fd_late_growth": late(fds),
        "thread_late_growth": late(thr),
        "fd_net_late_growth": late(fds_net),
        "fd_net_late_kinds": late_fd_kinds(samples, w, skip) + late_scheduler_fd_kinds(after),
        "thread_net_late_growth": late(thr_net),
        "scheduler_fd_late_growth": sched_late("scheduler_fds"),
        "scheduler_thread_late_growth": sched_late("scheduler_threads"),
        "scheduler_fd_net_late_growth": sched_late("scheduler_fds_net"),
        "scheduler_thread_net_late_growth": sched_late("scheduler_threads_net"),
        "pool_threads_max": max((w.get("pool_threads") or 0 for s in samples for w in s.get("workers", {}).values()), default=None),
        "mapped_fds_max": max((w.get("mapped_fds") or 0 for s in samples for w in s.get("workers", {}).values()), default=None),
        "pooled_comms_max": max((w.get("pooled_comms") or 0 for s in samples for w in s.get("workers", {}).values()), default=None),
        "worker_anon_mb_per_100_runs": _max_slope(worker_segments(samples, lambda x: x.get("anon_mb"), w, skip)),
        "worker_file_mb_per_100_runs": _max_slope(worker_segments(samples, lambda x: x.get("file_mb"), w, skip)),
        "scheduler_anon_mb_per_100_runs": _per_100(slope([s["run"] for s in after], [s.get("scheduler_anon_mb") for s in after])),
        "plugin_state_growth": max((v["growth"] for v in plugin.values()), default=None),
        "plugin_state_growth_by_structure": plugin,
        "worker_plugin_state_growth": max((v["growth"] for v in workers_state.values() if v["growth"] is not None), default=None),
        "worker_plugin_state_growth_by_structure": workers_state,
        "dask_state_growth_by_structure": dask_state,
        "cache_over_capacity": len(over),
        "cache_over_capacity_samples": over[:50],
        "index_bytes": index_growth,
        # index database bytes per entry held, at the end over the start (the worst node)
        "index_bytes_per_entry_ratio": round(max(ratios), 3) if ratios else None,
        "forms_max": forms_max,
        "forms_bytes_max": forms_bytes_max,
        # the same slopes over the second half of the runs alone
        "worker_rss_mb_per_100_runs_second_half": _max_slope(half_rss),
        "scheduler_rss_mb_per_100_runs_second_half": _per_100(
            slope([s["run"] for s in half], [s["scheduler_rss_mb"] for s in half])),
        "log_per_step": log_per_run,
        "hit_rate": mean([r["hit_rate"] for r in runs]),
        "wall_s_median": sorted(walls)[len(walls) // 2] if walls else None,
        "wall_s_mean": mean(walls),
        "wall_s_by_analysis": per_analysis,
        "evictions": sum(evictions.values()),
        "phases": phases(runs, doc["events"]),
        "events": doc["events"],
    }


def check_bounds(figures: dict, cfg, chunk_ids: int | None = None, types: dict | None = None) -> list[str]:
    """What is wrong with a soak's figures (empty: every bound held):

    * a wrong, hung or failed run;
    * descriptors or threads still growing at the end, net of the pools: a worker slot's
      last sample above every one of its samples (any of its processes) before the last
      third of the runs after the warm-up (``fd_net_late_growth``, ``thread_net_late_growth``),
      or the scheduler's (``scheduler_fd_net_late_growth``,
      ``scheduler_thread_net_late_growth``; its descriptors also net of its connections
      with this process, the nannies' and clients' pools, and of those the workers keep
      in their pools to it, ``scheduler_pooled_by_workers``: a worker's heartbeats and
      holder queries open a second one when two of its threads ask at once).  Net of the pools
      (:func:`_pools`), at both ends: a worker
      keeps a pooled connection or two per peer, opened when it first fetches from it
      (here: after the chunksize change) and again after a peer restarts; the peer's end
      of it is an open socket too (``pooled_by_others``); a mapped read of a cache data
      file holds a descriptor until its array is freed (``mapped_fds``, at most
      ``mapped_fds_max``); and asyncio's
      executor starts its threads (up to its size) as peer requests come in at once, which
      move the raw counts by a few either way (``fd_growth``, ``fd_late_growth`` ... report
      them; ``pooled_comms_max``, ``pool_threads_max`` what the pools held at most);
    * a cache directory over its capacity (``cache_over_capacity``);
    * a scheduler plugin structure beyond its bound: a capped deque beyond its ``maxlen``;
      ``plugin.locator.holder`` beyond ``chunk_ids`` (the chunk ids the datasets have,
      :func:`chunk_ids`); any other structure still growing at the end: its last value
      above every value it had before the last third of the runs after the warm-up
      (``late_growth`` > 0), unless it holds at most as many entries as there are
      workers (per node or per worker: a node's first steal may come late) or it is a
      ``Counter`` (keys: counter names; ``types``: the structures' type names, see
      :func:`_containers`); the contents of a dict's containers (``name[*]``) while
      they hold at most as many per entry of the dict as there are workers, or as they
      held at most before (a run's record per node).  The structures are sampled with no task in the scheduler:
      one per task must be empty; the schedule places every chunk of the workload in its
      first runs and right after the chunksize change (:func:`make_schedule`), so one per
      chunk is full by then; one per run is full at its cap (20 runs) by run 20.
    """
    bad = []
    types = types or {}
    for k in ("wrong_results", "hung_runs", "failed_runs", "cache_over_capacity"):
        if figures.get(k):
            bad.append(f"{k} = {figures[k]}")
    for k in ("fd_net_late_growth", "thread_net_late_growth", "scheduler_fd_net_late_growth",
              "scheduler_thread_net_late_growth"):  # fmt: skip
        v = figures.get(k)
        if v is not None and v > 0:
            bad.append(f"{k} = {v}")
    for name, g in (figures.get("plugin_state_growth_by_structure") or {}).items():
        if g.get("cap") is not None:
            if g["last"] > g["cap"]:
                bad.append(f"{name}: {g['last']} > its cap {g['cap']}")
        elif name == "plugin.locator.holder" and chunk_ids is not None:
            if g["last"] > chunk_ids:
                bad.append(f"{name}: {g['last']} > {chunk_ids} chunk ids")
        elif name.endswith("[*]") and g.get("parent_last") is not None:
            # the containers of a dict's entries: at most as long as the workers (per node,
            # per worker) or as the longest before, each
            per_entry = max(cfg.processes(), g.get("per_entry_max_before") or 0)
            if (g.get("late_growth") or 0) > 0 and g["last"] > g["parent_last"] * per_entry and types.get(name) != "Counter":
                bad.append(f"{name}: still growing, {g['last']} at the end for {g['parent_last']} entries "
                           f"(> {per_entry} each)")  # fmt: skip
        elif (g.get("late_growth") or 0) > 0 and g["last"] > cfg.processes() and types.get(name) != "Counter":
            bad.append(f"{name}: still growing, {g['last']} at the end, {g['last'] - g['late_growth']} at most "
                       f"before the last third ({g['first']} after the warm-up)")  # fmt: skip
    return bad


def columnar(samples: list[dict]) -> dict:
    """The samples as the JSON keeps them (``series``): one list per figure, an entry per
    sample (None where a sample lacks it: a slot scaled away): ``{"run": [...], "step":
    [...], "scheduler_rss_mb": [...], ..., "plugin": {structure: [...]}, "dask":
    {structure: [...]}, "workers": {slot: {"rss_mb": [...], ..., "plugin": {structure:
    [...]}}}, "caches": {slot: {"index_bytes": [...], ...}}}``; per-name thread counts
    and log records by logger of the last sample only (``last``)."""
    n = len(samples)
    out: dict[str, Any] = {"plugin": {}, "dask": {}, "workers": {}, "caches": {}, "last": {}}

    def col(d: dict, key: str, i: int, value: Any) -> None:
        d.setdefault(key, [None] * n)[i] = value

    for i, smp in enumerate(samples):
        for k, v in smp.items():
            if k in ("plugin", "dask"):
                for name, x in v.items():
                    col(out[k], name, i, x)
            elif k in ("workers", "caches"):
                for slot, fields in v.items():
                    d = out[k].setdefault(slot, {})
                    for f, x in fields.items():
                        if f == "plugin":
                            for name, y in x.items():
                                col(d.setdefault("plugin", {}), name, i, y)
                        elif not isinstance(x, dict):
                            col(d, f, i, x)
            elif isinstance(v, dict):
                out["last"][k] = v
            else:
                col(out, k, i, v)
    if samples:
        out["last"]["threads_by_name"] = {slot: w.get("threads_by_name") for slot, w in samples[-1].get("workers", {}).items()}
        out["last"]["fd_kinds"] = {slot: w.get("fd_kinds") for slot, w in samples[-1].get("workers", {}).items()}
    return out


def summary_rows(fig: dict) -> list[dict]:
    """The summary table: one row per figure."""
    rows = [
        ("runs", fig["runs"]), ("wrong results", fig["wrong_results"]), ("hung runs", fig["hung_runs"]),
        ("failed runs", fig["failed_runs"]),
        ("scheduler RSS MB / 100 runs", fig["scheduler_rss_mb_per_100_runs"]),
        ("worker RSS MB / 100 runs (max over slots)", fig["worker_rss_mb_per_100_runs"]),
        ("worker fd growth (max)", fig["fd_growth"]), ("worker thread growth (max)", fig["thread_growth"]),
        ("worker fd / thread late growth (max)", f"{fig['fd_late_growth']} / {fig['thread_late_growth']}"),
        ("worker anon / file MB / 100 runs (max)", f"{fig['worker_anon_mb_per_100_runs']} / {fig['worker_file_mb_per_100_runs']}"),
        ("scheduler fd growth", fig["scheduler_fd_growth"]),
        ("scheduler thread growth", fig["scheduler_thread_growth"]),
        ("plugin state growth (max)", fig["plugin_state_growth"]),
        ("worker plugin state growth (max)", fig["worker_plugin_state_growth"]),
        ("cache over capacity (samples)", fig["cache_over_capacity"]),
        ("cache evictions", fig["evictions"]),
        ("hit rate (mean of runs)", fig["hit_rate"]), ("wall s (median run)", fig["wall_s_median"]),
        ("bounds violated", len(fig["bounds"])),
    ]  # fmt: skip
    return [{"figure": k, "value": v} for k, v in rows]


def growing_rows(fig: dict, top: int = 12) -> list[dict]:
    """Structures that grew after the warm-up, largest growth first."""
    rows = []
    for side, key in (("scheduler", "plugin_state_growth_by_structure"),
                      ("worker", "worker_plugin_state_growth_by_structure"),
                      ("dask", "dask_state_growth_by_structure")):  # fmt: skip
        for name, g in (fig.get(key) or {}).items():
            if g.get("growth"):
                rows.append({"structure": name, "side": side, "growth": g["growth"],
                             "per_100_runs": g.get("per_100_runs"), "last": g.get("last", g.get("last_max")),
                             "cap": g.get("cap")})  # fmt: skip
    rows.sort(key=lambda r: -abs(r["growth"]))
    return rows[:top]


def progress_line(rows: list[dict], s: dict) -> str:
    runs = "; ".join(
        f"run {r['run']} {r['user']} {r['analysis']}/{r['dataset']}/{r['chunksize']}"
        + (" new-process" if r["process"] == "new" else "")
        + (" HUNG" if r["hung"] else " FAILED" if r["error"] else "" if r["correct"] else " WRONG")
        + (f" {r['wall_s']:.1f}s hit {r['hit_rate']}" if r["wall_s"] is not None else "")
        for r in rows
    )
    ev = f" [{s['event']}]" if s.get("event") else ""
    rss = " ".join(f"{w['rss_mb']:.0f}" for _, w in sorted(s["workers"].items()) if w.get("rss_mb"))
    return f"step {s['step']}{ev}: {runs} | scheduler {s['scheduler_rss_mb']} MB, workers {rss} MB"


def shape(cfg) -> str:
    if cfg.per_node == 1:
        return f"{cfg.workers} workers"
    return f"{cfg.workers} nodes x {cfg.per_node} worker processes"
