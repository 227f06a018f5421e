"""What keeping the admission policy's node-wide state costs per transaction, against the processes it lists and its window.

Every write transaction of a node cache running ``rank`` reads the state rows
(``admission_state``: the scalars as JSON, the node's processes that save, a version) and,
when another process saved since, parses them again; then it writes them. What they hold
grows as the node works: the window of sampled reuse distances fills up to 63 after a few
runs, and the processes listed (each worker process that saved within two runs' lookups, at
most 64) grow with the processes per node and their restarts.

Here two caches open one directory (two processes of a node, each its own token) and take
turns saving one lookup each, so every transaction reads what the other one wrote, as on a
node of several busy processes. The state is set to a window of R distances and W processes
listed (the two included), then both ways are timed side by side, in alternating rounds:

- **kept** (the store since 4ed35d8): the window and the parameters re-encoded and parsed
  only when they changed (``StateRows``), the processes row written when its processes
  change or this process's clock lags half a run (``WRITERS_LAG``);
- **every time** (the store until then): each row encoded and parsed in full by every
  transaction, the processes row written by every transaction.

Reported: CPU µs per transaction (the whole transaction: the lookup's row, the state rows,
the commit), medians of ``--repeats`` rounds; every case's rounds interleaved, so that the
machine's drift (here +-15% from one minute to the next) is spread over all of them. The bound: ``kept`` costs at most
:data:`FLAT` x as much with the largest window and list as with the smallest.

    python benchmarks/state_rows.py [--writers 2,16,64] [--windows 0,16,63] [--repeats 15]
    python benchmarks/state_rows.py --quick
"""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

from benchmarks._common import (  # noqa: E402
    counts, not_measured, parser, pyplot, read_results, save_png, save_results, table_end,
)  # fmt: skip

WRITERS = (2, 16, 64)
WINDOWS = (0, 16, 63)
MODES = ("kept", "every time")
#: ``kept`` at the largest window and list, at most this many times its cost at the smallest.
FLAT = 1.25
#: Values in the cache (one block each): twice the policy's bottom-k sample (1024 hashes), so
#: that the keys looked up can be ones outside it, whose lookups leave the window and the
#: demand as they were set (a sampled key looked up again adds a reuse distance).
VALUES = 2048
#: The state's demand (bytes looked up per run): large, so no process listed is pruned and no
#: clock lags during a measurement (what ``kept`` writes then is the state and the version).
DEMAND = 1e13


def _rows_every_time():
    """A ``StateRows`` that encodes and parses every row in full (as the store did until 4ed35d8)."""
    from cacheaffinity.worker._store.state_rows import SEPARATORS, StateRows

    class EveryTime(StateRows):
        def encode(self, scalars):
            return json.dumps(scalars, separators=SEPARATORS)

        def decode(self, raw):
            return json.loads(raw)

        def writers(self, raw):
            return {str(k): float(v) for k, v in json.loads(raw).items()}

    return EveryTime()


def _seed(directory: str, writers: int, window: int) -> None:
    """The state as a node's: ``window`` sampled reuse distances, ``writers`` - 2 other
    processes listed (the two measured add themselves)."""
    from cacheaffinity.worker._directory import INDEX_NAME

    from benchmarks.store_scale import window as distances

    con = sqlite3.connect(os.path.join(directory, INDEX_NAME), isolation_level=None)
    try:
        rows = dict(con.execute("SELECT name, value FROM admission_state"))
        state = json.loads(rows["state"])
        state["demand"] = DEMAND
        state["reuses"] = distances(DEMAND, window) if window else []
        listed = {f"{90000 + i}-listed": float(state["clock"]) for i in range(max(0, writers - 2))}
        con.execute("BEGIN IMMEDIATE")
        con.execute("INSERT OR REPLACE INTO admission_state VALUES ('state', ?)", (json.dumps(state, separators=(",", ":")),))
        con.execute("INSERT OR REPLACE INTO admission_state VALUES ('writers', ?)", (json.dumps(listed),))
        con.execute("INSERT OR REPLACE INTO admission_state VALUES ('version', ?)", (str(int(rows["version"]) + 1),))
        con.execute("COMMIT")
    finally:
        con.close()


def _unsampled(directory: str) -> list[str]:
    """The cache's keys whose hashes are above its sample's largest: looked up, they change
    no sampled reuse distance."""
    from cacheaffinity.worker._directory import INDEX_NAME
    from cacheaffinity.worker._store.admission import key_hash

    con = sqlite3.connect(os.path.join(directory, INDEX_NAME))
    try:
        top = con.execute("SELECT max(h) FROM admission_sample").fetchone()[0] + 2**63
    finally:
        con.close()
    keys = [f"v{i}" for i in range(VALUES) if key_hash(f"v{i}") > top]
    if len(keys) < VALUES // 4:
        raise RuntimeError(f"only {len(keys)} of {VALUES} keys outside the sample")
    return keys


class Case:
    """One directory of ``writers`` processes listed and a window of ``window`` distances,
    its two caches open, timed both ways in rounds (:meth:`round`)."""

    def __init__(self, work: str, writers: int, window: int):
        import cacheaffinity.config  # noqa: F401
        from cacheaffinity.worker._store import BLOCK, ColumnCache

        self.writers, self.window = writers, window
        directory = tempfile.mkdtemp(prefix=f"state-rows-{writers}-{window}-", dir=work)
        value = np.zeros(BLOCK // 8, np.int64)
        with ColumnCache(directory, capacity=4 * VALUES * BLOCK, admission="rank", write_queue=0) as cache:
            for i in range(VALUES):
                cache[f"v{i}"] = value
        _seed(directory, writers, window)
        self.keys = _unsampled(directory)
        self.caches = [ColumnCache(directory, capacity=4 * VALUES * BLOCK, admission="rank", write_queue=0)
                       for _ in range(2)]  # fmt: skip
        self.rounds: dict[str, list[float]] = {m: [] for m in MODES}
        self.step = 0

    def round(self, mode: str, calls: int, timed: bool = True) -> None:
        """``calls`` transactions ``mode``'s way, the two caches taking turns (CPU of the saves)."""
        from cacheaffinity.worker._store import admitter
        from cacheaffinity.worker._store.state_rows import StateRows

        lag = admitter.WRITERS_LAG
        admitter.WRITERS_LAG = lag if mode == "kept" else 0.0
        try:
            for cache in self.caches:
                cache.admission._rows = StateRows() if mode == "kept" else _rows_every_time()
            spent = 0.0
            for _ in range(calls):
                cache = self.caches[self.step % 2]
                assert cache.get(self.keys[self.step % len(self.keys)]) is not None
                self.step += 1
                c0 = time.process_time()
                cache.save_admission(force=True)
                spent += time.process_time() - c0
        finally:
            admitter.WRITERS_LAG = lag
        if timed:
            self.rounds[mode].append(spent / calls * 1e6)

    def close(self) -> dict:
        adm = self.caches[0].admission
        state = adm._policy.scalars()
        row = {"writers": self.writers, "window": self.window, "listed": len(adm._writers), "reloads": adm.reloads,
               "window_after": len(state["reuses"]), "demand_after": state["demand"]}  # fmt: skip
        for cache in self.caches:
            cache.close()
        kept, every = statistics.median(self.rounds["kept"]), statistics.median(self.rounds["every time"])
        return {**row, "kept_us": round(kept, 2), "every_time_us": round(every, 2), "ratio": round(kept / every, 3),
                "rounds": self.rounds}  # fmt: skip


def measure(work: str, writers: list[int], windows: list[int], calls: int, repeats: int) -> list[dict]:
    """CPU µs per transaction, both ways, per (processes listed, window): every case's rounds
    interleaved (the machine's drift spread over all), the two ways alternating; medians of
    ``repeats`` rounds of ``calls`` after an untimed one."""
    cases = [Case(work, w, r) for w in writers for r in windows]
    try:
        for r in range(repeats + 1):
            for case in cases if r % 2 == 0 else cases[::-1]:
                for mode in MODES if r % 2 == 0 else MODES[::-1]:
                    case.round(mode, calls, timed=r > 0)
    finally:
        rows = [case.close() for case in cases]
    return rows


def checks(rows: list[dict]) -> dict:
    small = min(rows, key=lambda r: (r["writers"], r["window"]))
    large = max(rows, key=lambda r: (r["writers"], r["window"]))
    ratio = round(large["kept_us"] / small["kept_us"], 3)
    name = f"kept: {large['writers']} processes listed, window {large['window']} / {small['writers']}, {small['window']}"
    return {name: {"ratio": ratio, "bound": FLAT, "met": ratio <= FLAT}}


def plot(doc: dict, path: str) -> None:
    plt = pyplot()
    rows = doc["results"]["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    windows = sorted({r["window"] for r in rows})
    writers = sorted({r["writers"] for r in rows})
    for mode, key, color in (("kept", "kept_us", "tab:blue"), ("every time", "every_time_us", "tab:red")):
        for w, style in ((windows[0], ":"), (windows[-1], "-")):
            sel = sorted((r for r in rows if r["window"] == w), key=lambda r: r["writers"])
            axes[0].plot([r["writers"] for r in sel], [r[key] for r in sel], style, color=color, marker="o",
                         label=f"{mode}, window {w}")  # fmt: skip
        sel = sorted((r for r in rows if r["writers"] == writers[-1]), key=lambda r: r["window"])
        axes[1].plot([r["window"] for r in sel], [r[key] for r in sel], "-", color=color, marker="o", label=mode)
    axes[0].set(xscale="log", xlabel="processes listed in the state", ylabel="CPU µs per transaction",
                title="against the processes listed")  # fmt: skip
    axes[0].minorticks_off()
    axes[0].set_xticks(writers, [str(w) for w in writers])
    axes[1].set(xlabel="sampled reuse distances in the window", ylabel="CPU µs per transaction",
                title=f"against the window ({writers[-1]} processes listed)")  # fmt: skip
    for ax in axes:
        ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("A transaction's admission state rows, two processes taking turns (state_rows.py)")
    fig.tight_layout()
    save_png(fig, path)


def render(results: str, name: str = "state_rows") -> str:
    """The docs' table (docs/benchmarks.md, ``<!-- table:state_rows -->``)."""
    doc = read_results(results, name)
    if doc is None:
        return not_measured("state_rows.py", name)
    c = doc["config"]
    lines = ["| processes listed | window | kept µs | every time µs | kept / every time |",
             "| ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for r in doc["results"]["rows"]:
        lines.append(f"| {r['writers']} | {r['window']} | {r['kept_us']:.1f} | {r['every_time_us']:.1f} | "
                     f"{r['ratio']:.2f}x |")  # fmt: skip
    command = f"python benchmarks/state_rows.py --repeats {c['repeats']}"
    if c["writers"] != list(WRITERS):
        command += " --writers " + ",".join(map(str, c["writers"]))
    if c["windows"] != list(WINDOWS):
        command += " --windows " + ",".join(map(str, c["windows"]))
    return table_end(
        lines,
        f"CPU per transaction (one lookup saved, the state rows read and written, the commit), two caches on "
        f"one directory taking turns; medians of {c['repeats']} alternating rounds of {c['calls']:,} "
        "transactions. *Every time*: each row encoded and parsed in full and the processes row written by "
        "every transaction, as the store did until 4ed35d8.",
        doc["results"]["checks"],
        doc,
        command,
    )


def main(argv=None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--writers", type=counts, default=None, help="processes listed, at least 2 (default 2,16,64)")
    p.add_argument("--windows", type=counts, default=None, help="reuse distances in the window (default 0,16,63)")
    p.add_argument("--calls", type=int, default=None, help="transactions per round (default 150; --quick 40)")
    p.add_argument("--repeats", type=int, default=None, help="alternating rounds (median; default 15)")
    p.add_argument("--work", default=None, help="where the caches are made (default: a temporary directory)")
    a = p.parse_args(argv)
    writers = a.writers or ([2, 64] if a.quick else list(WRITERS))
    windows = a.windows or ([0, 63] if a.quick else list(WINDOWS))
    if min(writers) < 2:
        p.error(f"--writers {min(writers)}: the two caches measured are listed themselves; give 2 or more")
    calls = a.calls or (40 if a.quick else 150)
    repeats = a.repeats or (3 if a.quick else 15)
    config = {"writers": writers, "windows": windows, "calls": calls, "repeats": repeats, "quick": a.quick}
    tic = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="state-rows-", dir=a.work) as work:
        rows = measure(work, writers, windows, calls, repeats)
    results = {"rows": rows, "checks": checks(rows)}
    save_results(a.out, "state_rows_quick" if a.quick else "state_rows", config, results, tic, plot, rows,
                 ["writers", "window", "listed", "kept_us", "every_time_us", "ratio"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
