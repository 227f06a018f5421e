"""The ``cacheaffinity`` command line (entry point ``cacheaffinity.cli:main``).

Runs as its own process, started by an operator:

- ``cacheaffinity cache info|verify|clear DIR`` on a cache node: a cache
  directory is node-local, so these open it directly (no cluster needed);
- ``cacheaffinity where SCHEDULER CHUNK...`` (or ``--file F --chunksize N``),
  ``cacheaffinity check SCHEDULER`` and ``cacheaffinity stats SCHEDULER``
  anywhere a Dask client can reach the scheduler: a client that asks the
  scheduler plugin.  Each gives up after its ``--timeout`` against any address
  (a closed port, a port that speaks HTTP, one that accepts and never answers):
  the connection and the question run under ``asyncio.wait_for``, and a
  watchdog ends the process shortly after the deadline should anything still
  hang.

Exit status: 0 on success; 1 when ``cache verify`` found (and removed) corrupt
entries, a confirmation was declined, or ``check`` found nodes that cache nothing; 2 for usage errors, a path that is not a
cache directory, a directory that cannot be trusted or read, a damaged index
(``info`` and ``verify`` without ``--repair`` leave it as it is), and a
scheduler that cannot be reached or has no plugin.  Every error is one line
(``Error: ...``) on stderr, never a traceback.

Notes
-----
A wrong path is never turned into a cache: ``info``, ``verify`` and ``clear``
refuse a path that does not exist, is not a directory, or holds neither a
``node-id`` nor a column index, before anything is opened.  The commands are
safe while workers use the directory (see :class:`~cacheaffinity.ColumnCache`):
``verify`` removes only entries it read as corrupt, ``clear`` turns the workers'
next reads into misses, and the node id is never touched, so the node keeps its
place (and its chunks) in the scheduler's placement.  ``verify --repair`` and
``clear`` rebuild a damaged index (as workers do when they open it), keeping
the entries that still read and the node id.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import os
import sqlite3
import re
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import click
from dask.utils import format_bytes, format_time, parse_bytes, parse_timedelta

from cacheaffinity import __version__, config
from cacheaffinity.worker.directory import UntrustedDirectory, trusted_directory
from cacheaffinity.worker.forms import FormStore
from cacheaffinity.worker.node import NODE_ID_FILE, read_node_id
from cacheaffinity.worker.store import INDEX_NAME, ColumnCache

__all__ = ["main"]

logger = logging.getLogger("cacheaffinity")


class CommandError(click.ClickException):
    """An error the user can fix (exit status 2), printed as ``Error: <message>``."""

    exit_code = 2


# ====================================================================== helpers
def _cache_directory(path: str) -> str:
    """``path`` as an absolute cache directory, or a :class:`CommandError` saying why not."""
    directory = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(directory):
        raise CommandError(
            f"{directory} does not exist; give the cache directory of a node (the "
            "workers' --cache-directory or cacheaffinity.worker.directory)"
        )
    if not os.path.isdir(directory):
        raise CommandError(
            f"{directory} is not a directory; give the cache directory of a node (the "
            "workers' --cache-directory or cacheaffinity.worker.directory), not a file in it"
        )
    if _is_cache(directory):
        try:
            # a shared-group cache is checked as such when this machine's config says so
            # (as for its workers: cacheaffinity.worker.shared-group)
            trusted_directory(
                directory, create=False, shared_group=config.get("worker.shared-group")
            )
        except (UntrustedDirectory, ValueError) as e:
            raise CommandError(str(e)) from e
        return directory
    hint = "give the directory a worker caches in (its --cache-directory)"
    try:
        inside = sorted(e.name for e in os.scandir(directory) if e.is_dir() and _is_cache(e.path))
    except OSError:
        inside = []
    if inside:
        shown = ", ".join(os.path.join(directory, n) for n in inside[:5])
        more = f" and {len(inside) - 5} more" if len(inside) > 5 else ""
        hint = f"it holds cache directories, give one of them: {shown}{more}"
    raise CommandError(
        f"{directory} is not a cacheaffinity cache directory (it has neither "
        f"{NODE_ID_FILE} nor {INDEX_NAME}); {hint}"
    )


def _is_cache(directory: str) -> bool:
    return any(os.path.isfile(os.path.join(directory, n)) for n in (NODE_ID_FILE, INDEX_NAME))


def _node_id(directory: str) -> tuple[str | None, str | None]:
    """(node id, None), or (None, why there is none); never creates one."""
    try:
        return read_node_id(os.path.join(directory, NODE_ID_FILE)), None
    except FileNotFoundError:
        return (
            None,
            f"no {NODE_ID_FILE} file (a worker creates it when it first uses the directory)",
        )
    except (OSError, ValueError) as e:
        return None, str(e)


def _capacity(capacity: str | None) -> tuple[int, str]:
    """The capacity to report, and where it comes from."""
    if capacity is not None:
        try:
            return parse_bytes(capacity), "--capacity"
        except (TypeError, ValueError) as e:
            raise CommandError(f'--capacity {capacity!r} is not a size; use e.g. "200 GiB"') from e
    try:
        return config.get_bytes("worker.capacity"), "this machine's cacheaffinity.worker.capacity"
    except ValueError as e:
        raise CommandError(f"{e}; or pass --capacity") from e


def _open(directory: str, capacity: int, *, heal: bool = False) -> ColumnCache | None:
    """The directory's column cache; None if it has no index yet (nothing cached).

    ``heal=False`` refuses a damaged index (with the command that repairs it)
    instead of rebuilding it.
    """
    if not os.path.lexists(os.path.join(directory, INDEX_NAME)):
        return None
    # The store's own warning about an unusable directory would repeat the
    # error below: hold its records back and let them through only if it opened.
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        held.append(record)
        return False

    store_logger = logging.getLogger("cacheaffinity.worker")
    store_logger.addFilter(hold)
    try:
        cache = ColumnCache(directory, capacity=capacity, heal=heal)
    finally:
        store_logger.removeFilter(hold)
    if not cache.disabled:
        for record in held:
            store_logger.handle(record)
    if cache.disabled:
        cache.close()
        if cache.damaged:
            raise CommandError(
                f"the index of {directory} is damaged ({cache.disabled}); run "
                f"`cacheaffinity cache verify --repair {directory}` as the workers' user to "
                "rebuild it (entries that still read and the node id are kept)"
            )
        if isinstance(cache.untrusted, str):
            raise CommandError(cache.untrusted)
        raise CommandError(
            f"cannot open the column cache in {directory}: {cache.disabled}; run the command "
            "as the user the workers run as (it needs write access to the directory)"
        )
    return cache


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    stamp = datetime.datetime.fromtimestamp(t).astimezone().isoformat(sep=" ", timespec="seconds")
    age = time.time() - t
    return f"{stamp} ({format_time(age)} ago)" if age >= 0 else stamp


def _echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True))


# ====================================================================== commands
@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cacheaffinity")
def cli() -> None:
    """Inspect and maintain cacheaffinity cache directories; ask where chunks go."""


@cli.group()
def cache() -> None:
    """A node's cache directory (run these on the node: the directory is local)."""


_DIR = click.argument("directory", metavar="DIR", type=click.Path(file_okay=True, dir_okay=True))
_OPTIONAL_DIR = click.argument(
    "directory", metavar="[DIR]", required=False, type=click.Path(file_okay=True, dir_okay=True)
)


def _configured_directory() -> str:
    """This machine's ``cacheaffinity.worker.directory`` (or the default), for a command
    given no DIR."""
    from cacheaffinity.worker.directory import default_directory

    configured = config.get("worker.directory")
    directory = os.path.expanduser(os.path.expandvars(str(configured or default_directory())))
    directory = directory.replace("{host}", socket.gethostname())
    if "{name}" in directory:
        raise CommandError(
            f"cacheaffinity.worker.directory={configured!r} names one directory per worker "
            "({name}); give DIR, e.g. " + directory.replace("{name}", "<worker name>")
        )
    return directory
_JSON = click.option("--json", "as_json", is_flag=True, help="Machine-readable output (JSON).")


@cache.command()
@_OPTIONAL_DIR
@_JSON
@click.option(
    "--capacity",
    metavar="SIZE",
    help="The workers' cache capacity, e.g. '200 GiB' (default: the capacity recorded in the "
    "directory's settings.json, else cacheaffinity.worker.capacity of this machine's Dask "
    "config).",
)
def info(directory: str | None, as_json: bool, capacity: str | None) -> None:
    """Node id, entries, size, capacity, entry ages and forms of cache directory DIR.

    Without DIR: the directory this machine's Dask config gives the workers
    (``cacheaffinity.worker.directory``, else the default one).
    """
    directory = _cache_directory(directory or _configured_directory())
    cap, cap_source = _capacity(capacity)
    node, node_problem = _node_id(directory)
    store = _open(directory, cap)
    if store is None:
        summary = {"size": 0, "entries": 0, "oldest": None, "newest": None}
    else:
        with store:
            summary = store.info()
            if capacity is None and store.capacity_source == "directory":
                cap, cap_source = store.capacity, "the cache directory's settings.json"
    out = {
        "directory": directory,
        "node": node,
        "node_problem": node_problem,
        "entries": summary["entries"],
        "size": summary["size"],
        "capacity": cap,
        "capacity_source": cap_source,
        "oldest": summary["oldest"],
        "newest": summary["newest"],
        "forms": len(FormStore(directory)),
    }
    if as_json:
        _echo_json(out)
        return
    used = f" ({out['size'] / cap:.1%} of capacity)" if cap else ""
    rows = [
        ("directory", directory),
        ("node id", node if node is not None else f"none: {node_problem}"),
        ("entries", f"{out['entries']:,}"),
        ("size", f"{format_bytes(out['size'])}{used}"),
        ("capacity", f"{format_bytes(cap)} (from {cap_source})"),
        ("oldest entry", _when(out["oldest"])),
        ("newest entry", _when(out["newest"])),
        ("forms", f"{out['forms']:,}"),
    ]
    for name, value in rows:
        click.echo(f"{name:<13} {value}")


@cache.command()
@_DIR
@_JSON
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Show a progress bar (default: when stderr is a terminal).",
)
@click.option(
    "--repair",
    is_flag=True,
    help="Rebuild a damaged index (checked in full), keeping the entries that still "
    "read and the node id.",
)
def verify(directory: str, as_json: bool, progress: bool | None, repair: bool) -> None:
    """Check every entry of DIR against its checksum; remove corrupt ones.

    Also deletes data files no entry refers to and abandoned temporaries.  Exit
    status 1 if corrupt entries were found (they were removed: the next run
    reads those columns from storage again).  A damaged index is an error (exit
    status 2) unless ``--repair`` is given, which rebuilds it first.
    """
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    directory = _cache_directory(directory)
    store = _open(directory, _capacity(None)[0], heal=repair)
    rebuilt = False
    if store is None:
        result = dict.fromkeys(("checked", "ok", "corrupt", "missing", "orphans", "temporaries"), 0)
    else:
        with store:
            if repair:
                try:
                    rebuilt = store.repair() or store.stats()["index_rebuilt"] > 0
                except ValueError as e:
                    raise CommandError(str(e)) from e
            bar = tqdm(
                total=len(store),
                unit="entries",
                desc="verify",
                disable=None if progress is None else not progress,
                file=sys.stderr,
            )
            with bar, logging_redirect_tqdm(loggers=[logger]):
                result = store.verify(on_entry=bar.update)
    result["index_rebuilt"] = bool(rebuilt)
    if as_json:
        _echo_json(dict(result, directory=directory))
    else:
        if rebuilt:
            click.echo(f"{directory}: the damaged index was rebuilt; node id kept")
        click.echo(
            f"{directory}: checked {result['checked']:,} entries: {result['ok']:,} good, "
            f"{result['corrupt']:,} corrupt (removed), {result['missing']:,} missing "
            f"(removed); deleted {result['orphans']:,} unreferenced data files and "
            f"{result['temporaries']:,} abandoned temporaries"
        )
    if result["corrupt"]:
        sys.exit(1)


@cache.command()
@_DIR
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def clear(directory: str, yes: bool) -> None:
    """Remove all cached columns and forms from DIR; keep the node id.

    The node keeps its identity, so the scheduler keeps sending it the same
    chunks; their next run reads them from storage and caches them again.  Safe
    while workers use the directory.
    """
    directory = _cache_directory(directory)
    node, _ = _node_id(directory)
    forms = FormStore(directory)
    store = _open(directory, _capacity(None)[0], heal=True)
    try:
        entries = 0 if store is None else len(store)
        size = 0 if store is None else store.volume()
        if not yes:
            click.confirm(
                f"Remove {entries:,} entries ({format_bytes(size)}) and {len(forms):,} forms "
                f"from {directory}? (node id {node or '-'} is kept)",
                abort=True,
                err=True,
            )
        if store is not None:
            store.clear()
        removed_forms = forms.clear()
    finally:
        if store is not None:
            store.close()
    click.echo(
        f"{directory}: removed {entries:,} entries ({format_bytes(size)}) and "
        f"{removed_forms:,} forms; node id {node or '-'} kept"
    )


# ====================================================================== scheduler commands
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
    one that accepts and never answers, waits past its timeout: connecting and
    asking each run under ``asyncio.wait_for``, and a watchdog thread ends the
    process (exit status 2, one line) :data:`WATCHDOG_GRACE` seconds after the
    deadline if anything still hangs.
    """
    from distributed import Client

    seconds = _seconds(timeout)
    target = _target(scheduler)
    deadline = time.monotonic() + seconds

    def too_late() -> None:
        click.echo(
            f"Error: no answer from a Dask scheduler at {scheduler} within {timeout}; give "
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
                why = str(e) or f"no Dask scheduler answered within {timeout}"
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
                    f"the Dask scheduler at {scheduler} did not answer within {timeout}"
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
    """``(start, stop, chunk id)`` of the coffea chunks of ``path`` at ``chunksize``,
    as :class:`~cacheaffinity.coffea.CacheAffinityExecutor` names them (no
    cluster alignment, the ``Runner``'s default)."""
    try:
        import uproot
        from coffea.processor.executor import FileMeta
    except ImportError as e:
        raise CommandError(f"--file needs coffea and uproot installed here ({e})") from e
    from cacheaffinity.coffea.identity import (
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


@cli.command()
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
@_JSON
@_TIMEOUT
def where(
    scheduler: str,
    chunks: tuple[str, ...],
    path: str | None,
    chunksize: int | None,
    treename: str,
    as_json: bool,
    timeout: str,
) -> None:
    """Cache node and workers each CHUNK goes to now.

    SCHEDULER is the scheduler's address (tcp://host:8786) or its scheduler
    file.  The answer is each chunk's nearest live cache node (what a task of
    that chunk submitted now gets, bounded loads aside).  With ``--file F
    --chunksize N`` the chunks are those of coffea's Runner for that file.
    """
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
    _target(scheduler)  # a bad address is refused before anything is imported or asked
    homes = _ask(scheduler, timeout, lambda client: cacheaffinity.where(client, chunks))
    if ranges:
        for cid, home in homes.items():
            home["entries"] = ranges.get(cid, [])
    if as_json:
        _echo_json(homes)
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


@cli.command()
@click.argument("scheduler")
@_JSON
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
        _echo_json(info)
    else:
        p = info.get("placement") or {}
        click.echo(
            f"cacheaffinity {info.get('version')} on {scheduler}: {len(nodes)} cache nodes; "
            f"torus D={p.get('dimensions')}, {p.get('replicas')} replicas, seed {p.get('seed')}"
        )
        for name, e in sorted(nodes.items()):
            stats = e.get("stats") or {}
            cap = stats.get("capacity")
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


#: Columns of ``stats``: (figure, title, bytes?).
_STATS_COLUMNS = (
    ("tasks", "tasks", False),
    ("chunks", "chunks", False),
    ("hits", "hits", False),
    ("peer_hits", "peer hits", False),
    ("misses", "misses", False),
    ("bytes_served", "served", True),
    ("storage_bytes", "storage", True),
    ("storage_opens", "files", False),
    ("steals", "steals", False),
    ("uncached_chunks", "uncached", False),
)


@cli.command()
@click.argument("scheduler")
@click.option("--last", type=click.IntRange(min=1), default=1, show_default=True,
              help="How many of the last runs to show (the scheduler keeps 20).")
@click.option("--run", "run", metavar="ID", help="One run, by its id.")
@_JSON
@_TIMEOUT
def stats(scheduler: str, last: int, run: str | None, as_json: bool, timeout: str) -> None:
    """Figures of the last run(s) the scheduler saw, counted by their own chunk tasks.

    One row per run (the chunk tasks of one coffea ``Runner`` call, or of one
    submitted graph): tasks submitted, chunk tasks that reported (a task run
    twice counts twice), column-cache hits, peer hits, misses, bytes served
    from caches, bytes and files read from storage, steals, chunks that ran
    uncached.
    """  # fmt: skip
    import cacheaffinity

    runs = _ask(
        scheduler, timeout, lambda client: cacheaffinity.run_stats(client, run=run, last=last)
    )
    if as_json:
        _echo_json(runs)
        return
    if not runs:
        click.echo("no run of chunk tasks yet" if run is None else f"no run {run!r} kept")
        return
    cells = []
    for r in runs:
        row = [r["run"][:32], _when(r.get("started")).split(" (")[0]]
        for name, _, is_bytes in _STATS_COLUMNS:
            v = int(r.get(name, 0))
            row.append(format_bytes(v) if is_bytes else f"{v:,}")
        cells.append(row)
    titles = ["run", "started"] + [t for _, t, _ in _STATS_COLUMNS]
    widths = [max(len(t), *(len(c[i]) for c in cells)) for i, t in enumerate(titles)]
    click.echo("  ".join(t.ljust(w) if i < 2 else t.rjust(w) for i, (t, w) in enumerate(zip(titles, widths))))
    for c in cells:
        click.echo("  ".join(x.ljust(w) if i < 2 else x.rjust(w) for i, (x, w) in enumerate(zip(c, widths))))


def main(argv: list[str] | None = None) -> None:
    """Run the command line (``argv`` defaults to ``sys.argv[1:]``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    try:
        status = cli.main(args=argv, prog_name="cacheaffinity", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted!", err=True)
        sys.exit(1)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except (OSError, sqlite3.Error, ValueError) as e:
        # A disk or index problem the commands did not foresee: one line, no traceback.
        click.echo(f"Error: {type(e).__name__}: {e}", err=True)
        sys.exit(2)
    if isinstance(status, int) and status:
        sys.exit(status)


if __name__ == "__main__":
    main()
