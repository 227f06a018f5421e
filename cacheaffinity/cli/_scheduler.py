"""``cacheaffinity where|check|stats SCHEDULER``: questions to a scheduler's cacheaffinity plugin.

Each gives up after its ``--timeout`` whatever answers at the address (see ``_ask``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import click
from dask.utils import format_bytes, parse_timedelta

from cacheaffinity import config
from cacheaffinity.chunk_id import parse_chunk_id
from cacheaffinity.cli._common import JSON, CommandError, echo_json, when
from cacheaffinity.protocol import PREPROCESS_PREFIX

__all__ = ["check", "stats", "where"]

_TIMEOUT = click.option(
    "--timeout",
    metavar="DURATION",
    default="10s",
    show_default=True,
    help="Give up after this long (connecting and asking), against any address.",
)
#: Seconds past ``--timeout`` after which the watchdog ends a command that still hangs.
WATCHDOG_GRACE = 1.5
#: What an address looks like: ``proto://...`` or ``host:port``.
_ADDRESS = re.compile(r"^([a-z][a-z0-9+.-]*://\S+|[^\s/:]+:\d+|\[[0-9a-fA-F:.]+\]:\d+)$")


def _seconds(timeout: str) -> float:
    try:
        seconds = parse_timedelta(timeout, default="s")
    except (TypeError, ValueError, KeyError) as e:
        raise CommandError(f"--timeout {timeout!r} is not a duration; use e.g. 10s") from e
    if seconds is None or not seconds > 0:
        raise CommandError(f"--timeout {timeout!r} must be more than 0; use e.g. 10s")
    return float(seconds)


def _target(scheduler: str) -> dict[str, Any]:
    """Client arguments for SCHEDULER (a scheduler file or an address), or a CommandError."""
    if os.path.isfile(scheduler):
        return {"scheduler_file": scheduler}
    if _ADDRESS.match(scheduler):
        return {"address": scheduler}
    raise CommandError(
        f"SCHEDULER {scheduler!r} is neither a scheduler file nor an address; give "
        "tcp://host:8786 (the scheduler's address) or the path of its --scheduler-file"
    )


def _ask(scheduler: str, timeout: str, question: Callable[[Any], Awaitable[Any]]) -> Any:
    """The answer of ``question(client)`` from the scheduler at SCHEDULER, within ``--timeout``.

    ``distributed.Client(address, timeout=...)`` to a port that speaks HTTP, or
    that never answers, waits past its timeout: hence ``asyncio.wait_for`` and a
    watchdog ending the process (status 2) ``WATCHDOG_GRACE`` s after the deadline.
    """
    from distributed import Client

    seconds = _seconds(timeout)
    target = _target(scheduler)
    deadline = time.monotonic() + seconds

    def too_late() -> None:
        click.echo(
            f"Error: no answer from a Dask scheduler at {scheduler} within {seconds:g} s; give "
            "its address (e.g. tcp://scheduler:8786, not the dashboard's port) or its "
            "--scheduler-file",
            err=True,
        )
        sys.stderr.flush()
        os._exit(2)

    watchdog = threading.Timer(seconds + WATCHDOG_GRACE, too_late)
    watchdog.daemon = True

    async def run() -> Any:
        # An asynchronous client: a failed connection is closed here, not by
        # Client.__del__ later (which stalls and prints a traceback).
        client = Client(**target, timeout=seconds, set_as_default=False, asynchronous=True)
        try:
            try:
                await asyncio.wait_for(client, max(0.1, deadline - time.monotonic()))
            except (OSError, asyncio.TimeoutError, TimeoutError, ValueError) as e:
                why = str(e) or f"no Dask scheduler answered within {seconds:g} s"
                raise CommandError(
                    f"cannot connect to a Dask scheduler at {scheduler} ({why}); give its "
                    "address (e.g. tcp://scheduler:8786, not the dashboard's port) or its "
                    "--scheduler-file"
                ) from e
            try:
                return await asyncio.wait_for(
                    question(client), max(0.1, deadline - time.monotonic())
                )
            except (asyncio.TimeoutError, TimeoutError) as e:
                raise CommandError(
                    f"the Dask scheduler at {scheduler} did not answer within {seconds:g} s"
                ) from e
            except RuntimeError as e:
                raise CommandError(str(e)) from e
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(timeout=1), 1)

    watchdog.start()
    try:
        return asyncio.run(run())
    finally:
        watchdog.cancel()


def _chunks_of_file(path: str, chunksize: int, treename: str) -> list[tuple[int, int, str]]:
    """``(start, stop, chunk id)`` of coffea's chunks of ``path``, as the executor names
    them (no cluster alignment, the ``Runner``'s default)."""
    try:
        import uproot
        from coffea.processor.executor import FileMeta
    except ImportError as e:
        raise CommandError(f"--file needs coffea and uproot installed here ({e})") from e
    from cacheaffinity.coffea._identity import (
        chunk_identity,
        default_stripe_entries,
        file_identities,
    )

    try:
        with uproot.open(path) as f:
            tree = f[treename]
            numentries = int(tree.num_entries)
            uuid = f.file.fUUID
    except FileNotFoundError as e:
        raise CommandError(f"--file {path}: no such file") from e
    except KeyError as e:
        raise CommandError(f"--file {path} has no tree {treename!r}; give --treename") from e
    except Exception as e:  # not a ROOT file, unreadable ...
        raise CommandError(f"--file {path} cannot be read as a ROOT file: {e}") from e
    meta = FileMeta("dataset", path, treename, {"numentries": numentries, "uuid": uuid})
    items = list(meta.chunks(chunksize, align_clusters=False))
    stripe = config.get("client.stripe-entries")
    if stripe is None:
        ends = max((int(x.entrystop) for x in items), default=0)
        stripe = {path: default_stripe_entries(ends)}
    identities = file_identities([path])
    return [
        (int(x.entrystart), int(x.entrystop), chunk_identity(x, identities, stripe))
        for x in items
    ]


@click.command()
@click.argument("scheduler")
@click.argument("chunks", metavar="[CHUNK...]", nargs=-1)
@click.option(
    "--file",
    "path",
    metavar="FILE",
    help="A ROOT file: show the chunk ids coffea's Runner with the cacheaffinity "
    "executor gives its chunks, and where each goes (with --chunksize).",
)
@click.option("--chunksize", type=click.IntRange(min=1), help="The Runner's chunksize.")
@click.option("--treename", default="Events", show_default=True, help="Tree of --file.")
@click.option(
    "--any-id",
    is_flag=True,
    help="Take each CHUNK as an identity of your own (plain Dask, cacheaffinity.chunk), "
    "not a coffea chunk id: any non-empty string.",
)
@JSON
@_TIMEOUT
def where(
    scheduler: str,
    chunks: tuple[str, ...],
    path: str | None,
    chunksize: int | None,
    treename: str,
    any_id: bool,
    as_json: bool,
    timeout: str,
) -> None:
    """Cache node and workers each CHUNK goes to now.

    SCHEDULER is the scheduler's address (tcp://host:8786) or its scheduler
    file.  The answer is each chunk's nearest live cache node (what a task of
    that chunk submitted now gets, bounded loads aside).  With ``--file F
    --chunksize N`` the chunks are those of coffea's Runner for that file.
    A CHUNK must be a coffea chunk id (``<file>/<tree>/s<S>:<k>``) or a
    preprocessing id (``file:<path>/<tree>``), unless ``--any-id`` is given.
    """
    _target(scheduler)  # a bad address is refused first, before anything is imported or asked
    import cacheaffinity
    from cacheaffinity.client import check_chunk_ids

    ranges: dict[str, list[str]] = {}
    if path is not None:
        if chunks:
            raise CommandError("give either CHUNK ids or --file, not both")
        if chunksize is None:
            raise CommandError("--file needs --chunksize (the Runner's chunksize), e.g. 100000")
        for start, stop, cid in _chunks_of_file(path, chunksize, treename):
            ranges.setdefault(cid, []).append(f"{start}-{stop}")
        chunks = tuple(ranges)
    elif chunksize is not None:
        raise CommandError("--chunksize goes with --file FILE")
    if not chunks:
        raise CommandError("give CHUNK ids, or --file FILE --chunksize N")
    try:
        check_chunk_ids(chunks, what="CHUNK")
    except (TypeError, ValueError) as e:
        raise CommandError(str(e)) from e
    if not any_id:
        for c in chunks:
            if parse_chunk_id(c) is None and not c.startswith(PREPROCESS_PREFIX):
                raise CommandError(
                    f"CHUNK {c!r} is not a coffea chunk id (<file>/<tree>/s<S>:<k>, as "
                    "`cacheaffinity where SCHEDULER --file F.root --chunksize N` lists them); "
                    "for an identity of your own (plain Dask), add --any-id"
                )
    homes = _ask(scheduler, timeout, lambda client: cacheaffinity.where(client, chunks))
    if ranges:
        for cid, home in homes.items():
            home["entries"] = ranges.get(cid, [])
    if as_json:
        echo_json(homes)
        return
    width = max(len("chunk"), *(len(c) for c in homes))
    node_width = max(len("node"), *(len(h["node"] or "-") for h in homes.values()))
    entries = "entries  " if ranges else ""
    click.echo(f"{'chunk':<{width}}  {'node':<{node_width}}  {entries}workers")
    for chunk, home in homes.items():
        workers = " ".join(home["workers"]) or "-"
        span = f"{','.join(home['entries'])}  " if ranges else ""
        click.echo(f"{chunk:<{width}}  {home['node'] or '-':<{node_width}}  {span}{workers}")
    if any(h["node"] is None for h in homes.values()):
        click.echo("no cache node is connected yet: chunks wait for one", err=True)


@click.command()
@click.argument("scheduler")
@JSON
@_TIMEOUT
def check(scheduler: str, as_json: bool, timeout: str) -> None:
    """Whether the scheduler runs cacheaffinity, and its cache nodes.

    One line per node: workers, hosts, capacity in force, and whether it
    caches (an *uncached* node: why).  Exit status 1 if some node caches nothing.
    """
    import cacheaffinity
    from cacheaffinity.client import uncached_message

    info = _ask(scheduler, timeout, lambda client: cacheaffinity.check(client, warn=False))
    nodes = info.get("nodes") or {}
    if as_json:
        echo_json(info)
    else:
        p = info.get("placement") or {}
        click.echo(
            f"cacheaffinity {info.get('version')} on {scheduler}: {len(nodes)} cache "
            f"{'node' if len(nodes) == 1 else 'nodes'}; "
            f"torus D={p.get('dimensions')}, {p.get('replicas')} replicas, seed {p.get('seed')}"
        )
        for name, e in sorted(nodes.items()):
            stats = e.get("stats") or {}
            # an uncached node holds nothing: no capacity to show
            cap = None if e.get("uncached") else stats.get("capacity")
            state = f"UNCACHED: {e['uncached']}" if e.get("uncached") else "cached"
            click.echo(
                f"  {name}  workers {len(e.get('workers') or ())} on "
                f"{','.join(e.get('hosts') or ()) or '-'}  capacity "
                f"{format_bytes(cap) if isinstance(cap, (int, float)) else '-'}  {state}"
            )
    msg = uncached_message(info)
    if msg:
        click.echo(msg, err=True)
        sys.exit(1)


def _count(v: int) -> str:
    return f"{v:,}"


def _ms(v: int) -> str:
    return f"{v / 1000:.1f}"


#: ``cacheaffinity stats`` columns: (figure, title, how it is shown).
_STATS_COLUMNS = (
    ("tasks", "tasks", _count),
    ("chunks", "chunks", _count),
    ("hits", "hits", _count),
    ("peer_hits", "peer hits", _count),
    ("misses", "misses", _count),
    ("bytes_served", "served", format_bytes),
    ("storage_bytes", "storage", format_bytes),
    ("storage_opens", "files", _count),
    ("steals", "steals", _count),
    ("uncached_chunks", "uncached", _count),
    ("files_preprocessed", "preprocessed", _count),
    ("metadata_hits", "metadata hits", _count),
    ("preprocess_ms", "preprocess s", _ms),
    ("chunk_bytes", "chunk bytes", format_bytes),
)


def _percent(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _forecast_lines(r: dict) -> list[str]:
    """One line per node whose cache is smaller than run ``r``'s share of it."""
    f = r.get("forecast") or {}
    out = []
    for node, e in sorted((f.get("nodes") or {}).items()):
        if e.get("need_bytes") is None or e.get("capacity_hit_rate") is None or e["capacity_hit_rate"] >= 1:
            continue
        out.append(
            f"  run {r['run'][:12]} needs ~{format_bytes(e['need_bytes'])} on node {node}, which "
            f"holds {format_bytes(e['capacity'])} ({e['policy']}): expect ~"
            f"{_percent(e['capacity_hit_rate'])} hits once every chunk was read"
            + (f"; {e['new_chunks']} of its {e['chunks']} chunks new" if e.get("new_chunks") else "")
        )
    return out


@click.command()
@click.argument("scheduler")
@click.option("--last", type=click.IntRange(min=1), default=1, show_default=True,
              help="How many of the last runs to show (the scheduler keeps 20).")
@click.option("--run", "run", metavar="ID", help="One run, by its id.")
@JSON
@_TIMEOUT
def stats(scheduler: str, last: int, run: str | None, as_json: bool, timeout: str) -> None:
    """Figures of the last run(s) the scheduler saw, counted by their own chunk tasks.

    One row per run (one coffea ``Runner`` call, its preprocessing included,
    or one submitted graph): its status (FAILED when a chunk or preprocessing
    task erred, with a line naming the first error below the table), chunk tasks submitted, chunk tasks that reported
    (a task run twice counts twice), column-cache hits, peer hits, misses,
    bytes served from caches, bytes read from storage, files opened (by chunk
    and preprocessing tasks), steals, chunks that ran uncached, files
    preprocessed, of which answered from the node cache, the
    preprocessing tasks' seconds, the bytes of the chunks' packs, the forecast
    hit rate (from the chunk sizes earlier runs reported and the nodes'
    capacities; chunks not seen before count as misses) and the share of chunk
    bytes read from the nodes' own caches.  Then, per node whose cache is too small
    for its share of a run, what the run needs there against what the cache holds.
    """  # fmt: skip
    import cacheaffinity

    runs = _ask(
        scheduler, timeout, lambda client: cacheaffinity.run_stats(client, run=run, last=last)
    )
    if as_json:
        echo_json(runs)
        return
    if not runs:
        click.echo("no run of chunk tasks yet" if run is None else f"no run {run!r} kept")
        return
    cells = []
    for r in runs:
        row = [r["run"][:32], when(r.get("started")).split(" (")[0],
               "FAILED" if r.get("failed_tasks") else "ok"]  # fmt: skip
        for name, _, show in _STATS_COLUMNS:
            row.append(show(int(r.get(name, 0))))
        f = r.get("forecast") or {}
        hit_bytes = r.get("chunk_bytes_hit", 0) / r["chunk_bytes"] if r.get("chunk_bytes") else None
        row += [_percent(f.get("hit_rate")), _percent(hit_bytes)]
        cells.append(row)
    titles = ["run", "started", "status"] + [t for _, t, _ in _STATS_COLUMNS] + ["forecast", "hit bytes"]
    widths = [max(len(t), *(len(c[i]) for c in cells)) for i, t in enumerate(titles)]

    def line(values: list[str]) -> str:  # run, start time and status left-aligned, figures right
        return "  ".join(
            v.ljust(w) if i < 3 else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths))
        )

    click.echo(line(titles))
    for c in cells:
        click.echo(line(c))
    for r in runs:
        if r.get("failed_tasks"):
            n = r["failed_tasks"]
            click.echo(f"  run {r['run'][:12]} FAILED: {n} task{'s' if n != 1 else ''} erred; "
                       f"first: {r.get('error') or '-'}")  # fmt: skip
    for r in runs:
        for text in _forecast_lines(r):
            click.echo(text)
