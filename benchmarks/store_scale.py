"""How a node cache's bookkeeping costs grow with what it holds and how many processes share it.

One node cache directory holds N chunk packs (1e3 to 1e6), built directly in the store's
on-disk format as a node's cache is after earlier work: full, each pack stored once, the
admission state as a few runs leave it (its window of 63 sampled reuse distances full; until
2026-11-30 it held 5, a state row a fifth of a working node's, which every insert transaction
writes and every process re-reads after another's).  The
data files are names of one small file (hard links, in ``/dev/shm`` by default): this
measures the index and the admission policy, not the disk.  P spawned
processes (1, 2, 4, 8: the worker processes of one node) open it together and run three
phases, each process ``--ops`` operations, the phases started together (a barrier):

- **hit**: ``get_packs`` of held packs in the order they were stored, each process its own
  stretch (a warm re-run's lookups: index query, verified read, the admission policy's
  bookkeeping, saved every 64 lookups as a worker does);
- **hit_random**: the same for held packs drawn at random (no two lookups near each other
  in the index: the worst case of the bookkeeping's page writes);
- **miss**: ``get_packs`` of a pack the cache does not hold;
- **insert**: ``put_pack`` of a new pack into the full cache (a first run: admission,
  eviction, the row; inline, each a transaction).

Reported per (N, policy, P): CPU per operation summed over the P processes (2 cores here:
CPU, not speed-up) and the part of it the admission policy spent saving the lookups
(``Admitter.save_cpu_s``: its transactions), each process's RSS after the phases, a
worker's open time of the cache (``ColumnCache(...)``), and per N the time of
``cacheaffinity cache info`` (the command, a new process) and of ``verify`` (in process).
``--looked-up`` builds the caches as a warm run leaves them (every pack looked up once since
stored), so that the lookup phases are re-lookups.  ``--pack-mb M`` measures what a facility
node's insert costs: every row records the size of an M MiB pack (the data files stay small:
the lookups are the same) and each insert stores a real pack of M MiB, evicting one row, as a
node of 5-50 MB chunk packs does; the whole-cache operations are not timed then.
``--write-queue 256MiB`` stores through the background writer, as workers do by default
(``cacheaffinity.worker.write-queue``: batches, one transaction each; its thread's CPU counts,
the phase ends when the queue is written); the default, 0, stores inline.  ``rank`` (the default) and
``fifo`` side by side, on caches built alike, both built before either is measured and
measured in alternating order (whichever ran first after its build ran up to ~20% slower
here).  After the build one short untimed case runs on each cache, and the process counts
rotate from one repeat to the next (the 1-process column, always measured first after the
build and ``verify``, came out disturbed at 10^6 packs in 3 of 4 grids; the first grid in
this order still had high 1- and 2-process lookups there, so the order does not explain all
of it); each case inserts packs of its own.  Medians of ``--repeats``.

    python benchmarks/store_scale.py            # 1e3 .. 1e6 packs, 1/2/4/8 processes
    python benchmarks/store_scale.py --quick    # 1e3 and 1e4 packs, 1 and 2 processes
"""

from __future__ import annotations

import heapq
import json
import multiprocessing
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402
import xxhash  # noqa: E402

from benchmarks._common import counts, parser, print_table, pyplot, save_png, write_json  # noqa: E402

POLICIES = ("rank", "fifo")
PHASES = ("hit", "hit_random", "miss", "insert")
#: Rows per pack group (one file's tree): chunk packs of 1,000 entries each.
PER_GROUP = 100
#: Member arrays of a pack (int64 each): small data files.
MEMBER_LEN = 16
#: Where the node caches are built: memory (a million data file names are built and
#: removed in seconds there, in many minutes on this machine's disk); CPU, not I/O, is measured.
#: Data files sharing one inode (hard links) in :func:`build`
LINKS_PER_FILE = 50_000
WORK = "/dev/shm" if os.path.isdir("/dev/shm") else None
#: The rank policy's stale factor (1 + its initial jitter) for rows built looked up.
LIVE = 1.25
#: The rank policy's window of sampled reuse distances (``StableRank(window=...)``): full on a
#: node that has run a few times, as each cache here is built (its median is the demand).
WINDOW = 63


def _arrays(i: int, nbytes: int = 0) -> dict[str, np.ndarray]:
    """Pack ``i``'s members (``nbytes``: one member of that many bytes instead)."""
    return {"Muon_pt/f0/data": np.full(nbytes // 8 if nbytes else MEMBER_LEN, i, np.int64)}


def _where(i: int, prefix: str = "f") -> tuple[str, int, int]:
    """(group, start, stop) of pack ``i``."""
    return f"{prefix}{i // PER_GROUP:07d}/Events", (i % PER_GROUP) * 1000, (i % PER_GROUP) * 1000 + 1000


def build(directory: str, n: int, looked_up: bool = False, capacity: int | None = None, pack_bytes: int = 0,
          moved: bool = True) -> dict:
    """A full node cache of ``n`` packs in the store's format (index rows with the rank
    policy's columns and its bottom-k sample, as if each pack was stored once in order;
    ``looked_up``: and then looked up once more in that order, a warm run, as the rank
    policy's lookups leave the rows), capacity = their size (``capacity``: that many bytes
    recorded instead, which a worker opening the directory adopts; ``pack_bytes``: each
    row records the size a pack of :func:`_arrays` with that many bytes takes, its data
    file stays small; ``moved`` False: the looked-up rows' records of when they go stale wait
    in the inbox and the fresh watermark is at the first row, as a warm run leaves a cache that
    no eviction touched since)."""
    import cacheaffinity.config  # noqa: F401
    from cacheaffinity.worker._store import ColumnCache
    from cacheaffinity.worker._store.admission import StableRank, key_hash, rank
    from cacheaffinity.worker._store.admitter import IndexEntries
    from cacheaffinity.worker._store.files import DataFiles, toc_of
    from cacheaffinity.worker._store.schema import UNSET, stored
    from cacheaffinity.worker._store.layout import blocks, pack_key

    t0 = time.perf_counter()
    arrays = _arrays(0)
    with ColumnCache(directory, capacity=1 << 40, admission="fifo") as cache:
        files: DataFiles = cache.files
        name, toc, nbytes, digest = files.write(arrays)
        template = files.path(name)
        with open(template, "rb") as f:
            content = f.read()
        files.remove([name])
        size = blocks(nbytes)
        if pack_bytes:  # the size a stored pack of that many bytes is accounted
            big = files.write(_arrays(0, pack_bytes))
            files.remove([big[0]])
            size = blocks(big[2])
    toc_json = json.dumps(toc, separators=(",", ":"))
    members = sorted(arrays)
    uid = os.geteuid()
    rows = []
    templates = []
    for i in range(n):
        if i % LINKS_PER_FILE == 0:  # a new inode: file systems bound the links to one (ext4: 65,000)
            source = os.path.join(directory, f"pack-template-{len(templates)}")
            with open(source, "wb") as f:
                f.write(content)
            templates.append(source)
        grp, start, stop = _where(i)
        name = xxhash.xxh3_128_hexdigest(b"%d" % i)  # spread over the 256 subdirectories, as uuid4 names are
        path = files.path(name)
        try:  # a few inodes, a name per pack: the reads verify each as its own data file
            os.link(source, path)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.link(source, path)
        key = pack_key(grp, start, stop, members)
        if looked_up:  # stored at i x size, looked up at (n + i + 1) x size: a reuse distance of n + 1 packs
            used, dist = float((n + i + 1) * size), float((n + 1) * size)
            clocks = (stored(used), stored(used + LIVE * dist), stored(dist))
        else:
            clocks = (stored(float(i * size)), UNSET, UNSET)
        rows.append((key, grp, start, stop, name, toc_json, nbytes, size, digest, time.time(), uid,
                     rank(key), *clocks))  # fmt: skip
    from cacheaffinity.worker._directory import INDEX_NAME

    con = sqlite3.connect(os.path.join(directory, INDEX_NAME), isolation_level=None)
    con.execute("BEGIN")
    con.executemany(
        "INSERT INTO entries (key, grp, start, stop, file, toc, nbytes, size, checksum, stored, writer, "
        "rank, last_used, stale_from, reuse_dist) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    # the policy's bottom-k sample of the hashes looked up, as storing each pack left it
    # (without it every lookup of the measured phases would be a sample's first sight)
    sample = heapq.nsmallest(StableRank(1).sample_size, ((key_hash(r[0]), r[12]) for r in rows))
    con.executemany("INSERT INTO admission_sample VALUES (?, ?)", [(h - 2**63, t) for h, t in sample])
    demand = float(n * size)  # a run looks every pack up once
    capacity = n * size if capacity is None else int(capacity)
    state = {"policy": "rank", "capacity": capacity, "clock": float((2 if looked_up else 1) * n * size), "params": {},
             "demand": demand, "reuses": window(demand), "jitter": 0.25, "sampled": 0}  # fmt: skip
    con.execute("INSERT OR REPLACE INTO admission_state VALUES ('state', ?)", (json.dumps(state),))
    con.execute("INSERT OR REPLACE INTO admission_state VALUES ('version', '1')")
    if looked_up and moved:  # no row is fresh (not looked up since stored)
        con.execute("INSERT OR REPLACE INTO admission_state VALUES ('fresh_from', ?)", (str(n + 1),))
        # the rows' records (their insert trigger appended them to the inbox) in the log, as
        # an eviction since leaves them: the insert phase then measures inserts, not that move
        IndexEntries(con, writing=True).take_inbox()
    con.execute("INSERT OR REPLACE INTO settings VALUES ('capacity', ?)", (capacity,))
    con.execute("COMMIT")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for source in templates:
        os.unlink(source)
    index_bytes = os.path.getsize(os.path.join(directory, INDEX_NAME))
    con.close()
    return {"packs": n, "pack_bytes": size, "capacity": capacity, "build_s": time.perf_counter() - t0,
            "index_bytes": index_bytes}  # fmt: skip


def window(demand: float, n: int = WINDOW) -> list[float]:
    """A full window of ``n`` sampled reuse distances around ``demand`` (its median), whole
    bytes as the clocks are: within 10% of it, each a different value."""
    return [float(int(demand * (1.0 + 0.1 * (i - n // 2) / (n // 2)))) for i in range(n)]


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _process(directory: str, policy: str, capacity: int, plan: dict, barrier, queue, pack_bytes: int = 0,
             write_queue: int = 0) -> None:
    """One worker process of the node: open, then the phases (each started with the others;
    ``pack_bytes``: each insert a pack of that many bytes, the same arrays every time;
    ``write_queue``: the cache's, 0 inline)."""
    import cacheaffinity.config  # noqa: F401
    from cacheaffinity.worker._store import ColumnCache

    rss_start = _rss_kb()
    barrier.wait(600)
    w0, c0 = time.perf_counter(), time.process_time()
    cache = ColumnCache(directory, capacity=capacity, admission=policy, write_queue=write_queue)
    open_wall, open_cpu = time.perf_counter() - w0, time.process_time() - c0
    rss_open = _rss_kb()
    out = {"open_wall_s": open_wall, "open_cpu_s": open_cpu, "rss_start_kb": rss_start, "rss_open_kb": rss_open}
    adm = cache.admission  # None for fifo
    big = _arrays(0, pack_bytes) if pack_bytes else None  # made once: not the store's cost
    for phase in [ph for ph in PHASES if ph in plan]:
        barrier.wait(600)
        ops = plan[phase]
        saving0 = adm.save_cpu_s if adm is not None else 0.0
        c0, w0 = time.process_time(), time.perf_counter()
        done = 0
        if phase == "insert":
            writes = cache.stats()["writes"]
            for grp, start, stop, i in ops:
                cache.put_pack(grp, start, stop, big if big is not None else _arrays(i))
            cache.flush()  # the writer's batches (none inline)
            done = cache.stats()["writes"] - writes  # stored: a queued pack may still be refused
        else:
            for grp, start, stop in ops:
                done += bool(cache.get_packs(grp, start, stop))
        cache.save_admission(force=True)  # what the worker's heartbeat does
        out[phase] = {"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - w0, "ops": len(ops),
                      "done": done, "save_cpu_s": (adm.save_cpu_s if adm is not None else 0.0) - saving0}  # fmt: skip
    out["rss_end_kb"] = _rss_kb()
    out["stats"] = {k: v for k, v in cache.stats().items() if k in ("evictions", "not_admitted", "writes")}
    cache.close()
    queue.put(out)


def held_sample(directory: str, k: int, seed: int) -> list[tuple[str, int, int]]:
    """``k`` packs the cache holds now (random, by row id)."""
    from cacheaffinity.worker._directory import INDEX_NAME

    con = sqlite3.connect(os.path.join(directory, INDEX_NAME))
    lo, hi = con.execute("SELECT min(id), max(id) FROM entries").fetchone()
    rng = np.random.default_rng(seed)
    out: list[tuple[str, int, int]] = []
    while len(out) < k:
        ids = [int(x) for x in rng.integers(lo, hi + 1, 4 * k)]
        for i in range(0, len(ids), 500):
            marks = ",".join("?" * len(ids[i : i + 500]))
            out += con.execute(f"SELECT grp, start, stop FROM entries WHERE id IN ({marks})", ids[i : i + 500]).fetchall()
    con.close()
    return out[:k]


def held_run(directory: str, k: int, seed: int) -> list[tuple[str, int, int]]:
    """``k`` packs the cache holds now, consecutive in storing order from a random one."""
    from cacheaffinity.worker._directory import INDEX_NAME

    con = sqlite3.connect(os.path.join(directory, INDEX_NAME))
    lo, hi = con.execute("SELECT min(id), max(id) FROM entries").fetchone()
    first = int(np.random.default_rng(seed).integers(lo, max(lo, hi - k) + 1))
    out = con.execute("SELECT grp, start, stop FROM entries WHERE id >= ? ORDER BY id LIMIT ?", (first, k)).fetchall()
    con.close()
    return (out * (k // max(1, len(out)) + 1))[:k]


def run_case(directory: str, policy: str, capacity: int, procs: int, ops: int, seed: int, pack_bytes: int = 0,
             insert_ops: int | None = None, phases: tuple = PHASES, write_queue: int = 0) -> dict:
    """P processes on one node cache: per-phase CPU per operation summed over processes
    (``insert_ops``: inserts per process, if not ``ops``; ``phases``: those of :data:`PHASES`)."""
    k = ops if insert_ops is None else insert_ops
    hits = held_sample(directory, ops * procs, seed)
    runs = held_run(directory, ops * procs, seed + 1000)
    plans = []
    for p in range(procs):
        plans.append({
            "hit": runs[p * ops : (p + 1) * ops],
            "hit_random": hits[p * ops : (p + 1) * ops],
            "miss": [_where(i, "m") for i in range(seed * 10**7 + p * ops, seed * 10**7 + (p + 1) * ops)],
            "insert": [(*_where(i, "n"), i) for i in range(seed * 10**7 + p * k, seed * 10**7 + (p + 1) * k)],
        })  # fmt: skip
        plans[-1] = {ph: plans[-1][ph] for ph in phases}
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_process, args=(directory, policy, capacity, plans[p], barrier, queue, pack_bytes, write_queue))
               for p in range(procs)]
    for w in workers:
        w.start()
    outs = [queue.get(timeout=1800) for _ in workers]
    for w in workers:
        w.join(60)
        if w.exitcode != 0:
            raise RuntimeError(f"a node process exited with {w.exitcode}")
    res = {"procs": procs, "policy": policy}
    for phase in phases:
        n = sum(o[phase]["ops"] for o in outs)
        res[f"{phase}_cpu_us"] = 1e6 * sum(o[phase]["cpu_s"] for o in outs) / n
        # of it, the admission policy's saves of the lookups (its transactions), per operation
        res[f"{phase}_save_cpu_us"] = 1e6 * sum(o[phase]["save_cpu_s"] for o in outs) / n
        res[f"{phase}_done"] = sum(o[phase]["done"] for o in outs) / n
    res["open_s"] = max(o["open_wall_s"] for o in outs)
    res["rss_end_mb"] = max(o["rss_end_kb"] for o in outs) / 1024
    res["rss_growth_mb"] = max(o["rss_end_kb"] - o["rss_start_kb"] for o in outs) / 1024
    res["evictions"] = sum(o["stats"].get("evictions", 0) for o in outs)
    return res


def empty_inserted(directory: str) -> int:
    """Truncate the data files of the packs the insert phases stored (their rows stay, as
    full as before): ``--pack-mb`` cases one after the other on one cache would otherwise
    pile up gigabytes in ``/dev/shm`` (8 processes then spent ~3.5x the CPU per insert,
    both policies).  Returns the files emptied."""
    from cacheaffinity.worker._directory import DATA_DIR, INDEX_NAME

    con = sqlite3.connect(os.path.join(directory, INDEX_NAME))
    names = [name for (name,) in con.execute("SELECT file FROM entries WHERE grp LIKE 'n%'")]
    con.close()
    for name in names:
        os.truncate(os.path.join(directory, DATA_DIR, name[:2], name), 0)
    return len(names)


def cli_info_seconds(directory: str) -> float:
    """Wall time of ``cacheaffinity cache info DIR`` (a new process, as an operator runs it)."""
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "cacheaffinity.cli", "cache", "info", directory],
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"cache info failed: {r.stderr}")
    return time.perf_counter() - t0


def verify_seconds(directory: str) -> float:
    import cacheaffinity.config  # noqa: F401
    from cacheaffinity.worker._store import ColumnCache

    with ColumnCache(directory) as cache:
        t0 = time.perf_counter()
        cache.verify()
        return time.perf_counter() - t0


def due_rebuild_seconds(directory: str) -> float:
    """Wall time of making ``admission_due`` again from the rows (what a save does once
    superseded records pass 4 per row, about every third warm run of the whole cache), in a
    transaction rolled back: the cache is left as it was."""
    from cacheaffinity.worker._directory import INDEX_NAME
    from cacheaffinity.worker._store.admitter import IndexEntries

    con = sqlite3.connect(os.path.join(directory, INDEX_NAME), isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")
        t0 = time.perf_counter()
        IndexEntries(con, writing=True).rebuild_due()
        return time.perf_counter() - t0
    finally:
        if con.in_transaction:
            con.execute("ROLLBACK")
        con.close()


def _median_case(cases: list[dict]) -> dict:
    out = dict(cases[0])
    for k, v in cases[0].items():
        if isinstance(v, float):
            out[k] = statistics.median(c[k] for c in cases)
    out["repeats"] = len(cases)
    return out


#: An insert phase is compared with its own cost at the smallest cache where the default
#: policy stored at least this share of its inserts (see :func:`checks`).
STORED_ALIKE = 0.95


def checks(rows: list[dict]) -> dict:
    """The issue's bounds at the largest N, for the default policy."""
    sizes = sorted({r["packs"] for r in rows})
    lo, hi = sizes[0], sizes[-1]
    find = {(r["packs"], r["policy"], r["procs"]): r for r in rows}
    out = {}
    for procs in sorted({r["procs"] for r in rows}):
        big, small, fifo = find.get((hi, "rank", procs)), find.get((lo, "rank", procs)), find.get((hi, "fifo", procs))
        if not (big and small and fifo):
            continue
        for phase in [ph for ph in PHASES if f"{ph}_cpu_us" in big]:
            base = small
            if phase == "insert":
                # the same work: an insert stored with an eviction.  Where P x ops inserts
                # overrun a small cache many times, rank refuses most (1e3 packs, 8
                # processes: 34% stored) and, pre-checked, a refusal writes no file: not the same operation
                stored = [find.get((n, "rank", procs)) for n in sizes]
                base = next((r for r in stored if r and r["insert_done"] >= STORED_ALIKE), small)
            own = big[f"{phase}_cpu_us"] / base[f"{phase}_cpu_us"]
            vs_fifo = big[f"{phase}_cpu_us"] / fifo[f"{phase}_cpu_us"]
            out[f"{phase}_vs_own_{base['packs']}_p{procs}"] = {"ratio": round(own, 3), "bound": 1.5, "met": own <= 1.5}
            out[f"{phase}_vs_fifo_p{procs}"] = {"ratio": round(vs_fifo, 3), "bound": 1.5, "met": vs_fifo <= 1.5}
        growth = big["rss_end_mb"] - small["rss_end_mb"]
        out[f"rss_growth_mb_p{procs}"] = {"value": round(growth, 1), "bound": 16, "met": growth <= 16}
        out[f"open_s_p{procs}"] = {"value": round(big["open_s"], 3), "bound": 1.0, "met": big["open_s"] <= 1.0}
    return out


def plot(rows: list[dict], path: str, sizes: list[dict] = ()) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 6, figsize=(26, 4.2))
    titles = {"hit": "lookup hit (storing order)", "hit_random": "lookup hit (random order)",
              "miss": "lookup miss", "insert": "insert with eviction"}  # fmt: skip
    for ax, phase in zip(axes[:4], PHASES):
        for policy, style in (("rank", "-"), ("fifo", "--")):
            for procs in sorted({r["procs"] for r in rows}):
                pts = sorted((r["packs"], r[f"{phase}_cpu_us"]) for r in rows
                             if r["policy"] == policy and r["procs"] == procs and f"{phase}_cpu_us" in r)
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", label=f"{policy}, {procs} proc")
        ax.set(xscale="log", yscale="log", xlabel="packs in the node cache", ylabel="CPU µs per operation (all processes)",
               title=titles[phase])  # fmt: skip
        ax.grid(True, which="both", alpha=0.3)
        if not ax.lines:  # --pack-mb: the inserts alone
            ax.text(0.5, 0.5, "not measured here", ha="center", va="center", transform=ax.transAxes)
    next(ax for ax in axes[:4] if ax.lines).legend(fontsize=7)
    ax = axes[4]
    for policy, style in (("rank", "-"), ("fifo", "--")):
        for procs in sorted({r["procs"] for r in rows}):
            pts = sorted((r["packs"], r["rss_end_mb"]) for r in rows if r["policy"] == policy and r["procs"] == procs)
            if pts:
                ax.plot(*zip(*pts), style, marker="o", label=f"{policy}, {procs} proc")
    ax.set(xscale="log", xlabel="packs in the node cache", ylabel="RSS per process after the phases (MB)", title="memory")
    ax.grid(True, which="both", alpha=0.3)
    ax = axes[5]
    for key, label in (("cache_info_s", "`cache info` (a new process)"), ("verify_s", "`verify`"),
                       ("due_rebuild_s", "admission_due made again")):  # fmt: skip
        pts = sorted((s["packs"], s[key]) for s in sizes if key in s)
        if pts:
            ax.plot(*zip(*pts), marker="o", label=label)
    ax.set(xscale="log", yscale="log", xlabel="packs in the node cache", ylabel="seconds", title="whole-cache operations")
    ax.grid(True, which="both", alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    else:  # --pack-mb: not timed (its rows record sizes their data files have not)
        ax.text(0.5, 0.5, "not timed here", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle("Node cache bookkeeping against what it holds (store_scale.py)")
    fig.tight_layout()
    save_png(fig, path)


def render(results: str, name: str = "store_scale") -> str:
    """The docs' table (docs/operations.md, ``<!-- table:store_scale -->``) from ``<name>.json``."""
    from benchmarks._common import not_measured, read_results, table_end

    doc = read_results(results, name)
    if doc is None:
        return not_measured("store_scale.py", name)
    rows = doc["results"]
    procs = sorted({r["procs"] for r in rows})
    lines = [
        "| packs | processes | hit µs rank (saving) / fifo | random-order hit µs rank (saving) / fifo "
        "| miss µs rank / fifo | insert µs rank / fifo | RSS MB rank / fifo | open s rank |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    find = {(r["packs"], r["policy"], r["procs"]): r for r in rows}
    for n in sorted({r["packs"] for r in rows}):
        for p in procs:
            a, b = find.get((n, "rank", p)), find.get((n, "fifo", p))
            if not (a and b):
                continue
            cell = [f"{a[k]:.0f} / {b[k]:.0f}" if k in a else "-"
                    for k in ("hit_cpu_us", "hit_random_cpu_us", "miss_cpu_us", "insert_cpu_us", "rss_end_mb")]
            for i, phase in enumerate(("hit", "hit_random")):
                if f"{phase}_save_cpu_us" in a:  # results before the split have none
                    cell[i] = f"{a[f'{phase}_cpu_us']:.0f} ({a[f'{phase}_save_cpu_us']:.0f}) / {b[f'{phase}_cpu_us']:.0f}"
            if a.get("insert_done", 1.0) < STORED_ALIKE:  # rank refused most: cheaper, not the same work
                cell[3] = f"{a['insert_cpu_us']:.0f} ({a['insert_done']:.0%} stored) / {b['insert_cpu_us']:.0f}"
            lines.append(f"| {n:,} | {p} | " + " | ".join(cell) + f" | {a['open_s']:.2f} |")
    sizes = ", ".join(
        f"{s['packs']:,} packs: index {s['index_bytes'] / 2**20:.0f} MiB"
        if "cache_info_s" not in s else
        f"{s['packs']:,} packs: index {s['index_bytes'] / 2**20:.0f} MiB, `cache info` {s['cache_info_s']:.2f} s, "
        f"`verify` {s['verify_s']:.1f} s"
        + (f", `admission_due` made again {s['due_rebuild_s']:.2f} s" if "due_rebuild_s" in s else "")
        for s in doc.get("sizes", [])
    )  # fmt: skip
    c = doc["config"]
    inserts = f", {c['insert_ops']} inserts" if c.get("insert_ops", c["ops"]) != c["ops"] else ""
    packs = (f"Every row records the size of a {c['pack_mb']:g} MiB pack and each insert stores one, evicting "
             "one row (the rows' data files are small; the lookups are in the tables above). " if c.get("pack_mb") else "")
    if c.get("write_queue"):
        packs += (f"Stored through the background writer (a {c['write_queue'] // 2**20} MiB write queue, as workers "
                  "store by default: batches of one transaction each), its thread's CPU counted. ")
    command = f"python benchmarks/store_scale.py --repeats {c['repeats']}"
    if c.get("sizes") and c["sizes"] != [1000, 10_000, 100_000, 1_000_000]:
        command += " --sizes " + ",".join(f"{n:.0e}".replace("+0", "") for n in c["sizes"])
    if c.get("procs") and c["procs"] != [1, 2, 4, 8]:
        command += " --procs " + ",".join(str(p) for p in c["procs"])
    if c.get("looked_up"):
        command += " --looked-up"
    if c["ops"] != 1000:
        command += f" --ops {c['ops']}"
    if c.get("pack_mb"):
        command += f" --pack-mb {c['pack_mb']:g}"
    if c.get("insert_ops", c["ops"]) != c["ops"]:
        command += f" --insert-ops {c['insert_ops']}"
    if c.get("write_queue"):
        command += f" --write-queue {c['write_queue'] // 2**20}MiB"
    if c.get("name"):
        command += f" --name {c['name']}"
    return table_end(
        lines,
        f"CPU per operation summed over the node's processes (medians of {c['repeats']}; " + (
            f"{c['insert_ops']} inserts per process). " if c.get("pack_mb") else
            f"{c['ops']} operations per process and phase{inserts}; in parentheses, the part spent saving the "
            "lookups: the `rank` policy's transactions, which write each looked-up row's clocks). "
        ) + f"{packs}{sizes}. An insert's own-cost bound compares it with the smallest cache "
        f"where `rank` stored >= {STORED_ALIKE:.0%} of the inserts (where P x {c.get('insert_ops') or c['ops']} inserts overrun a "
        "small cache, it refuses most, and while most are refused each pack is pre-checked: a refusal writes no file).",
        doc.get("checks", {}),
        doc,
        command,
    )


def main(argv=None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--sizes", type=counts, default=None,
                   help="packs per node cache, comma separated (default 1e3,1e4,1e5,1e6)")  # fmt: skip
    p.add_argument("--procs", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   help="processes sharing the node cache (default 1,2,4,8)")  # fmt: skip
    p.add_argument("--ops", type=int, default=None, help="operations per process and phase (default 1000)")
    p.add_argument("--insert-ops", type=int, default=None,
                   help="inserts per process, if not --ops (with --pack-mb: each writes that pack)")  # fmt: skip
    p.add_argument("--repeats", type=int, default=None, help="repeats of each case (median; default 3)")
    p.add_argument("--work", default=WORK, help=f"where the caches are built (default: {WORK})")
    p.add_argument("--looked-up", action="store_true",
                   help="build every pack looked up once since stored (a warm run's rows): the lookup phases are "
                        "re-lookups; results in store_scale_looked_up.json")  # fmt: skip
    p.add_argument("--pack-mb", type=float, default=0.0,
                   help="rows record packs of this many MiB and each insert stores one (a facility node's "
                        "inserts); results in store_scale_pack<M>mb.json")  # fmt: skip
    p.add_argument("--write-queue", default="0",
                   help="the caches' write queue (workers: 256MiB, the background writer); default 0: inline")  # fmt: skip
    p.add_argument("--name", default=None,
                   help="results file name without .json (default store_scale, or store_scale_looked_up)")  # fmt: skip
    args = p.parse_args(argv)
    if args.pack_mb < 0:
        p.error(f"--pack-mb {args.pack_mb:g}: a pack has 0 (the default: small packs) or more MiB")
    pack_bytes = int(args.pack_mb * 2**20) // 8 * 8
    from cacheaffinity.worker._store.writes import queue_bytes

    try:
        write_queue = queue_bytes(args.write_queue)
    except ValueError as e:
        p.error(f"--write-queue: {e}")
    sizes = args.sizes or ([1000, 10_000] if args.quick else [1000, 10_000, 100_000, 1_000_000])
    procs_list = args.procs or ([1, 2] if args.quick else [1, 2, 4, 8])
    ops = args.ops or (100 if args.quick else 1000)
    insert_ops = args.insert_ops or ops
    phases = ("insert",) if pack_bytes else PHASES  # the lookups would read the packs inserted before
    repeats = args.repeats or (1 if args.quick else 3)
    work = tempfile.mkdtemp(prefix="store-scale-", dir=args.work)
    config = {"sizes": sizes, "procs": procs_list, "ops": ops, "insert_ops": insert_ops, "repeats": repeats, "quick": args.quick,
              "member_len": MEMBER_LEN, "per_group": PER_GROUP, "looked_up": args.looked_up, "name": args.name,
              "pack_mb": args.pack_mb, "write_queue": write_queue}  # fmt: skip
    rows: list[dict] = []
    per_size: list[dict] = []
    try:
        for n in sizes:
            dirs, infos = {}, {}
            for policy in POLICIES:  # both built before either is measured
                dirs[policy] = os.path.join(work, f"{policy}-{n}")
                infos[policy] = info = build(dirs[policy], n, looked_up=args.looked_up, pack_bytes=pack_bytes)
                print(f"built {n} packs in {info['build_s']:.1f} s (index {info['index_bytes'] / 2**20:.1f} MiB)", flush=True)
            info = infos["rank"]
            if not pack_bytes:  # rows that record a size their data file has not: not for verify
                info["cache_info_s"] = statistics.median(cli_info_seconds(dirs["rank"]) for _ in range(repeats))
                info["verify_s"] = verify_seconds(dirs["rank"])
                info["due_rebuild_s"] = statistics.median(due_rebuild_seconds(dirs["rank"]) for _ in range(repeats))
            per_size.append(info)
            for policy in POLICIES:  # untimed: the first case after the build is not anyone's
                run_case(dirs[policy], policy, infos[policy]["capacity"], 1, max(1, ops // 10), seed=0,
                         pack_bytes=pack_bytes, insert_ops=max(1, insert_ops // 10), phases=phases,
                         write_queue=write_queue)  # fmt: skip
                if pack_bytes:
                    empty_inserted(dirs[policy])
            cases: dict[tuple, list[dict]] = {(procs, policy): [] for procs in procs_list for policy in POLICIES}
            for r in range(repeats):
                # the process counts rotate and the policies alternate from one repeat to the
                # next: no column and neither policy is always measured first; each case
                # inserts packs of its own (its seed)
                for procs in procs_list[r % len(procs_list):] + procs_list[:r % len(procs_list)]:
                    seed = 1 + r * len(procs_list) + procs_list.index(procs)
                    for policy in POLICIES if r % 2 == 0 else POLICIES[::-1]:
                        cases[procs, policy].append(run_case(dirs[policy], policy, infos[policy]["capacity"], procs, ops,
                                                             seed=seed, pack_bytes=pack_bytes, insert_ops=insert_ops,
                                                             phases=phases, write_queue=write_queue))  # fmt: skip
                        if pack_bytes:
                            empty_inserted(dirs[policy])
            for procs in procs_list:
                for policy in POLICIES:
                    row = {"packs": n, **_median_case(cases[procs, policy])}
                    rows.append(row)
                    print(f"  {policy:4s} {procs} proc: " + ", ".join(f"{ph} {row[f'{ph}_cpu_us']:.0f} µs" for ph in phases)
                          + f", open {row['open_s']:.3f} s, RSS {row['rss_end_mb']:.0f} MB", flush=True)  # fmt: skip
            for directory in dirs.values():
                shutil.rmtree(directory, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    verdict = checks(rows)
    print_table(
        [{"packs": r["packs"], "policy": r["policy"], "procs": r["procs"],
          **{f"{ph} µs": round(r[f"{ph}_cpu_us"]) for ph in phases},
          "open s": round(r["open_s"], 3), "RSS MB": round(r["rss_end_mb"])} for r in rows]
    )  # fmt: skip
    for k, v in verdict.items():
        print(f"{k}: {v}")
    name = "store_scale_quick" if args.quick else "store_scale"
    if args.looked_up:
        name += "_looked_up"
    if pack_bytes:
        name += f"_pack{args.pack_mb:g}mb"
    if write_queue:
        name += "_behind"
    name = args.name or name
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, f"{name}.json"), config, rows, sizes=per_size, checks=verdict)
    plot(rows, os.path.join(args.out, f"{name}.png"), per_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
