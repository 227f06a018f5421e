"""``cacheaffinity cache info|verify|clear [DIR]``: a node's cache directory, opened directly.

A path holding neither a ``node-id`` nor a column index is refused before anything
is opened: a wrong path never becomes a cache.  ``info`` changes nothing and reads a
directory it cannot write read-only; ``verify`` and ``clear`` need write access.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
import urllib.parse
from typing import Any

import click
from dask.utils import format_bytes, parse_bytes

from cacheaffinity import config
from cacheaffinity.cli._common import JSON, CommandError, echo_json, logger, when
from cacheaffinity.worker._directory import (
    NODE_ID_FILE,
    CacheDirectory,
    ReadOnlyDirectory,
    UntrustedDirectory,
    user_name,
)
from cacheaffinity.worker._forms import FormStore
from cacheaffinity.worker._store import INDEX_NAME, ColumnCache
from cacheaffinity.worker._store.schema import MIGRATES_FROM, SCHEMA_VERSION
from cacheaffinity.worker._store.layout import LAYOUT_VERSION

__all__ = ["cache", "read_only_reason"]

_DIR = click.argument("directory", metavar="DIR", type=click.Path(file_okay=True, dir_okay=True))
_OPTIONAL_DIR = click.argument(
    "directory", metavar="[DIR]", required=False, type=click.Path(file_okay=True, dir_okay=True)
)


def _cache_directory(path: str) -> str:
    """``path`` as an absolute cache directory, or a ``CommandError`` saying why not."""
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
            # as the workers check it (cacheaffinity.worker.shared-group)
            CacheDirectory(directory, shared_group=config.get("worker.shared-group")).trust(create=False)
        except (UntrustedDirectory, ReadOnlyDirectory, ValueError) as e:
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


def _configured_directory() -> str:
    """This machine's ``cacheaffinity.worker.directory`` (or the default)."""
    try:
        return CacheDirectory.for_worker(config.get("worker.directory"), None).path
    except ValueError as e:  # one directory per worker: the command needs DIR
        raise CommandError(str(e)) from None


def read_only_reason(directory: str) -> str | None:
    """``"read-only file system"``, ``"no write permission"`` or None (this process can write)."""
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return "read-only file system"
    except OSError:
        pass
    if not os.access(directory, os.W_OK | os.X_OK):
        return "no write permission"
    return None


def _node_id(directory: str) -> tuple[str | None, str | None]:
    """(node id, None), or (None, why there is none); never creates one."""
    try:
        return CacheDirectory(directory).node_id(create=False), None
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


def _cannot_write(directory: str, why: str, what: str) -> CommandError:
    """The error for a directory this process cannot change, with the fix that applies."""
    reason = read_only_reason(directory)
    if reason == "read-only file system":
        return CommandError(
            f"cannot {what} {directory}: it is on a read-only file system ({why}); "
            "`cacheaffinity cache info` reads it as it is, this command needs it mounted "
            "read-write"
        )
    owner = user_name(os.stat(directory).st_uid)
    if reason == "no write permission":
        return CommandError(
            f"cannot {what} {directory}: no write permission ({why}); run the command as "
            f"the user the workers run as ({owner}, the directory's owner)"
        )
    return CommandError(f"cannot {what} {directory}: {why}")


def _open(directory: str, capacity: int, *, heal: bool = False, what: str = "open") -> ColumnCache | None:
    """The directory's column cache, None without an index; ``heal=False`` refuses a damaged one."""
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
        return cache
    cache.close()
    if cache.damaged:
        raise CommandError(
            f"the index of {directory} is damaged ({cache.disabled}); run "
            f"`cacheaffinity cache verify --repair {directory}` as the workers' user to "
            "rebuild it (entries that still read and the node id are kept)"
        )
    if isinstance(cache.untrusted, str):
        raise CommandError(cache.untrusted)
    if cache.unreadable_index or "older cacheaffinity" in cache.disabled:
        raise CommandError(f"{directory}: {cache.disabled}")  # names the fix itself
    raise _cannot_write(directory, cache.disabled, what)


def _index_read_only(directory: str) -> dict[str, Any] | None:
    """Entries, size, store times and capacity from the index opened read-only; None without one
    (``immutable=1`` where SQLite cannot even create its shared-memory file)."""
    path = os.path.join(directory, INDEX_NAME)
    if not os.path.lexists(path):
        return None
    uri = "file:" + urllib.parse.quote(path)
    last: sqlite3.Error | None = None
    for mode in ("mode=ro", "immutable=1"):
        try:
            con = sqlite3.connect(f"{uri}?{mode}", uri=True)
        except sqlite3.Error as e:
            last = e
            continue
        try:
            version = con.execute("PRAGMA user_version").fetchone()[0]
            if version != SCHEMA_VERSION:
                return {"version": version}
            meta = dict(con.execute("SELECT name, value FROM meta").fetchall())
            settings = dict(con.execute("SELECT name, value FROM settings").fetchall())
            oldest = con.execute("SELECT stored FROM entries ORDER BY id LIMIT 1").fetchone()
            newest = con.execute("SELECT stored FROM entries ORDER BY id DESC LIMIT 1").fetchone()
        except sqlite3.Error as e:
            last = e
            continue
        finally:
            con.close()
        return {
            "version": version,
            "entries": int(meta.get("count", 0)),
            "size": int(meta.get("size", 0)),
            "oldest": oldest[0] if oldest else None,
            "newest": newest[0] if newest else None,
            "capacity": settings.get("capacity"),
        }
    raise CommandError(f"cannot read the index of {directory} read-only: {last}")


def _summary_read_only(directory: str) -> tuple[dict[str, Any], int | None]:
    """``info``'s figures without writing anything, and the recorded capacity."""
    index = _index_read_only(directory)
    if index is None:
        return {"size": 0, "entries": 0, "oldest": None, "newest": None}, None
    version = index["version"]
    if version > SCHEMA_VERSION:
        raise CommandError(
            f"the index of {directory} has schema version {version}; this cacheaffinity "
            f"reads version {SCHEMA_VERSION} (layout {LAYOUT_VERSION}). Upgrade cacheaffinity "
            "on this node (`cacheaffinity cache clear` sets such an index aside, keeping the "
            "node id, where the directory can be written)"
        )
    if version != SCHEMA_VERSION:
        fate = ("upgraded in place (entries kept)" if MIGRATES_FROM <= version
                else "dropped")  # fmt: skip
        raise CommandError(
            f"the index of {directory} has schema version {version}: written by an older "
            f"cacheaffinity; its entries are {fate} when a worker opens the directory"
        )
    return index, index["capacity"]


@click.group()
def cache() -> None:
    """A node's cache directory (run these on the node: the directory is local)."""


@cache.command()
@_OPTIONAL_DIR
@JSON
@click.option(
    "--capacity",
    metavar="SIZE",
    help="The workers' cache capacity, e.g. '200 GiB' (default: the capacity recorded in the "
    "directory, else cacheaffinity.worker.capacity of this machine's Dask config).",
)
def info(directory: str | None, as_json: bool, capacity: str | None) -> None:
    """Node id, entries, size, capacity, entry ages and form documents of cache directory DIR.

    Without DIR: the directory this machine's Dask config gives the workers
    (``cacheaffinity.worker.directory``, else the default one).  Changes
    nothing; a directory this process cannot write (read-only file system,
    another user's) is read read-only.
    """
    directory = _cache_directory(directory or _configured_directory())
    cap, cap_source = _capacity(capacity)
    node, node_problem = _node_id(directory)
    read_only = read_only_reason(directory)
    recorded: int | None = None
    if read_only is not None:
        summary, recorded = _summary_read_only(directory)
    else:
        store = _open(directory, cap)
        if store is None:
            summary = {"size": 0, "entries": 0, "oldest": None, "newest": None}
        else:
            with store:
                summary = store.info()
                if store.capacity_source == "directory":
                    recorded = store.capacity
    if capacity is None and recorded is not None:
        cap, cap_source = int(recorded), "the cache directory's settings"
    forms = FormStore(directory)
    form_count, form_size = forms.usage()
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
        "forms": form_count,
        "forms_size": form_size,
        # the form store's own bound (not part of the capacity): first written removed first
        "forms_max": {"documents": forms.max_documents, "bytes": forms.max_bytes},
        "read_only": read_only,
    }
    if as_json:
        echo_json(out)
        return
    used = f" ({out['size'] / cap:.1%} of capacity)" if cap else ""
    rows = [
        ("directory", directory),
        ("node id", node if node is not None else f"none: {node_problem}"),
        ("entries", f"{out['entries']:,}"),
        ("size", f"{format_bytes(out['size'])}{used}"),
        ("capacity", f"{format_bytes(cap)} (from {cap_source})"),
        ("oldest entry", when(out["oldest"])),
        ("newest entry", when(out["newest"])),
        ("forms", f"{form_count:,}, {format_bytes(form_size)} (at most {forms.max_documents:,} and "
                  f"{format_bytes(forms.max_bytes)}, outside the capacity)"),
    ]
    if read_only is not None:
        rows.append(("opened", f"read-only ({read_only})"))
    for name, value in rows:
        click.echo(f"{name:<13} {value}")


@cache.command()
@_DIR
@JSON
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
    store = _open(directory, _capacity(None)[0], heal=repair, what="verify")
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
        echo_json(dict(result, directory=directory))
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
@click.option(
    "--yes", "-y", is_flag=True,
    help="Do not ask for confirmation (needed without a terminal: scripts, cron, ssh without -t).",
)  # fmt: skip
def clear(directory: str, yes: bool) -> None:
    """Remove all cached columns and forms from DIR; keep the node id.

    The node keeps its identity, so the scheduler keeps sending it the same
    chunks; their next run reads them from storage and caches them again.  Safe
    while workers use the directory.  Asks for confirmation on the terminal;
    without one (stdin not a terminal) it refuses unless given --yes.
    """
    directory = _cache_directory(directory)
    if not yes and not (sys.stdin is not None and sys.stdin.isatty()):
        # nobody can answer the question: say what to do instead of "Aborted!"
        click.echo(
            f"cacheaffinity cache clear: no terminal to confirm on; add --yes to clear {directory}",
            err=True,
        )
        sys.exit(1)
    node, _ = _node_id(directory)
    forms = FormStore(directory)
    store = _open(directory, _capacity(None)[0], heal=True, what="clear")
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
