"""What a lone writer of a node cache saves by continuing its last transaction's table, against the packs it holds.

Every write transaction of a ``rank`` cache reads the node's scalars, marks the rows a
``fifo`` process stored, and opens the three orders it takes victims from (stale, fresh, by
rank). A process that inserts one pack per transaction (``write_queue=0``, or a writer's batch
of one) did all of that again for every pack, although nothing else had written the index
since its own last transaction. Since this benchmark's commit the store keeps that
transaction's table, its orders read ahead, for the next one of the same connection when
nothing else wrote in between (``read_ahead.Kept``: SQLite's ``PRAGMA data_version`` for the
other connections, the connection's ``total_changes`` for its own other writes).

One process stores new packs inline into a full node cache of N packs (built as
``store_scale.py`` builds it: each pack stored once, the admission state as a few runs leave
it), each insert evicting one pack; side by side, in alternating rounds on caches built alike:

- **kept** (the store now): a transaction continues the last one's table when nothing else
  wrote since;
- **anew**: every transaction reads the scalars and opens its orders again (the store before
  this change; what a process pays after another process's commit, so on a node of several
  busy writers), the same code with keeping switched off (``KEPT_MOST`` = -1);
- **fifo**: the same inserts with ``fifo`` admission (no policy).

Reported: CPU µs per insert (the data file, the transaction, the commit), medians of
``--repeats`` rounds of ``--calls`` inserts after an untimed one, and the share of ``kept``'s
transactions that continued. Bounds: ``kept`` at the largest N costs at most
:data:`OWN` x its cost at the smallest and at most :data:`FIFO` x ``fifo``'s (the issue's
bounds for one process).

    python benchmarks/kept_table.py [--sizes 1e3,1e4,1e5,1e6] [--calls 200] [--repeats 15]
    python benchmarks/kept_table.py --quick
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks._common import (  # noqa: E402
    counts, not_measured, parser, pyplot, read_results, save_png, save_results, table_end,
)  # fmt: skip

SIZES = (1000, 10_000, 100_000, 1_000_000)
MODES = ("kept", "anew", "fifo")
#: ``kept`` at the largest size, at most this many times its cost at the smallest ...
OWN = 1.5
#: ... and at most this many times ``fifo``'s there.
FIFO = 1.5


def _link_data(src: str, dst: str) -> None:
    """A copy of a built cache: its data files linked (a cache never changes one in place,
    and a million copies would fill memory), everything else copied (the index)."""
    from cacheaffinity.worker._directory import DATA_DIR

    if os.path.basename(os.path.dirname(os.path.dirname(src))) == DATA_DIR and not src.endswith(".sqlite3"):
        os.link(src, dst)
    else:
        shutil.copy2(src, dst)


class Size:
    """One size's two caches (``rank``: kept and anew take turns on it; ``fifo``: a copy),
    open, timed in rounds (:meth:`round`)."""

    def __init__(self, work: str, n: int):
        import cacheaffinity.config  # noqa: F401
        from cacheaffinity.worker._store import ColumnCache

        from benchmarks.store_scale import build

        self.n = n
        base = tempfile.mkdtemp(prefix=f"kept-table-{n}-", dir=work)
        info = build(base, n)
        copy = base + "-fifo"
        shutil.copytree(base, copy, copy_function=_link_data)
        self.dirs = [base, copy]
        cap = info["capacity"]
        rank = ColumnCache(base, capacity=cap, admission="rank", write_queue=0)
        self.caches = {"kept": rank, "anew": rank,
                       "fifo": ColumnCache(copy, capacity=cap, admission="fifo", write_queue=0)}  # fmt: skip
        self.rounds: dict[str, list[float]] = {m: [] for m in MODES}
        self.next = 0
        self.kept_transactions = self.continued = 0
        self.evictions = {m: 0 for m in MODES}
        self.stored = {m: 0 for m in MODES}

    def round(self, mode: str, calls: int, timed: bool = True) -> None:
        """``calls`` new packs stored inline ``mode``'s way (CPU of the inserts)."""
        from benchmarks.store_scale import _arrays, _where
        from cacheaffinity.worker._store import read_ahead

        cache = self.caches[mode]
        packs = [(_where(10**8 + self.next + i, "n"), _arrays(i)) for i in range(calls)]
        self.next += calls
        most = read_ahead.KEPT_MOST
        read_ahead.KEPT_MOST = -1 if mode == "anew" else most
        adm = cache.admission
        before = adm.continued if adm is not None else 0
        stats = cache.stats()
        try:
            c0 = time.process_time()
            for (grp, start, stop), arrays in packs:
                cache.put_pack(grp, start, stop, arrays)
            spent = time.process_time() - c0
        finally:
            read_ahead.KEPT_MOST = most
        after = cache.stats()
        if timed:
            self.rounds[mode].append(spent / calls * 1e6)
            self.evictions[mode] += after["evictions"] - stats["evictions"]
            self.stored[mode] += after["writes"] - stats["writes"]
            if mode == "kept":
                self.kept_transactions += calls
                self.continued += adm.continued - before

    def close(self) -> dict:
        for cache in {id(c): c for c in self.caches.values()}.values():
            cache.close()
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
        med = {m: statistics.median(self.rounds[m]) for m in MODES}
        return {
            "packs": self.n,
            **{f"{m}_us": round(med[m], 1) for m in MODES},
            "kept_vs_anew": round(med["kept"] / med["anew"], 3),
            "kept_vs_fifo": round(med["kept"] / med["fifo"], 3),
            "anew_vs_fifo": round(med["anew"] / med["fifo"], 3),
            "continued_share": round(self.continued / max(1, self.kept_transactions), 3),
            "evictions": self.evictions,
            "stored": self.stored,
            "rounds": self.rounds,
        }


def measure(work: str, sizes: list[int], calls: int, repeats: int) -> list[dict]:
    """Per size (built, measured and removed in turn: a 10^6 cache and its copy hold 2 million
    names): the three ways in alternating order, medians of ``repeats`` rounds of ``calls``
    after an untimed one."""
    rows = []
    for n in sizes:
        size = Size(work, n)
        try:
            for r in range(repeats + 1):
                for mode in MODES if r % 2 == 0 else MODES[::-1]:
                    size.round(mode, calls, timed=r > 0)
        finally:
            rows.append(size.close())
    return rows


def checks(rows: list[dict]) -> dict:
    small, large = rows[0], rows[-1]
    own = round(large["kept_us"] / small["kept_us"], 3)
    return {
        f"kept: {large['packs']:,} packs / {small['packs']:,}": {"ratio": own, "bound": OWN, "met": own <= OWN},
        f"kept / fifo at {large['packs']:,} packs": {"ratio": large["kept_vs_fifo"], "bound": FIFO,
                                                     "met": large["kept_vs_fifo"] <= FIFO},
    }  # fmt: skip


def plot(doc: dict, path: str) -> None:
    plt = pyplot()
    rows = doc["results"]["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    packs = [r["packs"] for r in rows]
    for mode, color in (("kept", "tab:blue"), ("anew", "tab:red"), ("fifo", "tab:gray")):
        axes[0].plot(packs, [r[f"{mode}_us"] for r in rows], "-", color=color, marker="o", label=mode)
    for key, label, color in (("kept_vs_fifo", "kept / fifo", "tab:blue"), ("anew_vs_fifo", "anew / fifo", "tab:red")):
        axes[1].plot(packs, [r[key] for r in rows], "-", color=color, marker="o", label=label)
    axes[1].axhline(FIFO, color="black", linestyle=":", label=f"bound {FIFO}x")
    axes[0].set(xscale="log", xlabel="packs in the node cache", ylabel="CPU µs per insert",
                title="one process, inline inserts, one eviction each")  # fmt: skip
    axes[1].set(xscale="log", xlabel="packs in the node cache", ylabel="against fifo", title="rank / fifo")
    for ax in axes:
        ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("A lone writer continuing its last transaction's table (kept_table.py)")
    fig.tight_layout()
    save_png(fig, path)


def render(results: str, name: str = "kept_table") -> str:
    """The docs' table (docs/benchmarks.md, ``<!-- table:kept_table -->``)."""
    doc = read_results(results, name)
    if doc is None:
        return not_measured("kept_table.py", name)
    c = doc["config"]
    lines = ["| packs | kept µs | anew µs | fifo µs | kept / anew | kept / fifo | anew / fifo | continued |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for r in doc["results"]["rows"]:
        lines.append(f"| {r['packs']:,} | {r['kept_us']:.0f} | {r['anew_us']:.0f} | {r['fifo_us']:.0f} | "
                     f"{r['kept_vs_anew']:.2f}x | {r['kept_vs_fifo']:.2f}x | {r['anew_vs_fifo']:.2f}x | "
                     f"{100 * r['continued_share']:.0f}% |")  # fmt: skip
    command = f"python benchmarks/kept_table.py --repeats {c['repeats']}"
    if c["sizes"] != list(SIZES):
        command += " --sizes " + ",".join(f"{n:.0e}".replace("+0", "") for n in c["sizes"])
    if c["calls"] != 200:
        command += f" --calls {c['calls']}"
    return table_end(
        lines,
        f"CPU per insert of one process storing new packs inline into a full node cache (each insert one "
        f"transaction evicting one pack); medians of {c['repeats']} alternating rounds of {c['calls']:,} inserts. "
        "*Anew*: every transaction reads the scalars and opens its victim orders again, as the store did "
        "before and as a process does after another process's commit. *Continued*: the share of *kept*'s "
        "transactions that continued the last one's table.",
        doc["results"]["checks"],
        doc,
        command,
    )


def main(argv=None) -> int:
    from benchmarks.store_scale import WORK

    p = parser(__doc__.splitlines()[0])
    p.add_argument("--sizes", type=counts, default=None, help="packs in the node cache (default 1e3,1e4,1e5,1e6)")
    p.add_argument("--calls", type=int, default=None, help="inserts per round (default 200; --quick 40)")
    p.add_argument("--repeats", type=int, default=None, help="alternating rounds (median; default 15)")
    p.add_argument("--work", default=None, help="where the caches are built (default /dev/shm: see store_scale.py)")
    a = p.parse_args(argv)
    sizes = sorted(a.sizes or ([1000, 10_000] if a.quick else list(SIZES)))
    if len(sizes) < 2 or sizes[0] < 100:
        p.error("--sizes: give two or more sizes of at least 100 packs")
    calls = a.calls or (40 if a.quick else 200)
    repeats = a.repeats or (3 if a.quick else 15)
    config = {"sizes": sizes, "calls": calls, "repeats": repeats, "quick": a.quick}
    tic = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kept-table-", dir=a.work or WORK) as work:
        rows = measure(work, sizes, calls, repeats)
    results = {"rows": rows, "checks": checks(rows)}
    save_results(a.out, "kept_table_quick" if a.quick else "kept_table", config, results, tic, plot, rows,
                 ["packs", "kept_us", "anew_us", "fifo_us", "kept_vs_anew", "kept_vs_fifo", "continued_share"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
