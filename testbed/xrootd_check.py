"""The XRootD testbed's self-check: uproot reads through a real origin and XCache, compared.

``python -m testbed.xrootd_check check FILE.root`` serves the files from an
:class:`~testbed.xrootd.XRootDServer` origin and an :class:`~testbed.xrootd.XCacheServer` in a
private network namespace (:mod:`testbed.netns`), reads each one locally, via the origin and
twice via XCache, digests every branch (:func:`read_tree`), compares the digests
(:func:`compare_reads`) and prints JSON, including the cache directory after each XCache read;
``tests/test_xrootd.py`` drives it.  ``python -m testbed.xrootd_check requirements`` prints what
this machine lacks.

Clients read with uproot and the ``xrootd`` Python bindings:
``uproot.open(url, handler=uproot.XRootDSource)``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.netns import (
    _interfaces,
    _netns_inode,
    _which,
    limit_loopback_bandwidth,
    loopback_qdisc,
    reexec_in_private_netns,
    remove_loopback_bandwidth_limit,
    require_private_netns,
)
from testbed.xrootd import (
    BOUNDED_CLIENT_ENV,
    XCacheServer,
    XRootDError,
    XRootDServer,
    missing_requirements,
)

__all__ = ["TreeRead", "compare_reads", "main", "read_tree", "selfcheck"]


# --------------------------------------------------------------------------- reading with uproot


@dataclasses.dataclass
class TreeRead:
    """What :func:`read_tree` read."""

    source: str
    num_entries: int
    digests: dict[str, str]  #: branch name -> digest of its awkward buffers and form
    bytes_read: int  #: bytes uproot requested from the source
    requests: int
    seconds: float

    def summary(self) -> dict:
        d = dataclasses.asdict(self)
        d["n_branches"] = len(d.pop("digests"))
        return d


def _digest(array: Any) -> str:
    import awkward as ak
    import numpy as np

    form, length, buffers = ak.to_buffers(ak.to_packed(array))
    h = hashlib.blake2b(digest_size=16)
    h.update(form.to_json().encode())
    h.update(str(length).encode())
    for key in sorted(buffers):
        h.update(key.encode())
        h.update(memoryview(np.ascontiguousarray(buffers[key])).cast("B"))
    return h.hexdigest()


def read_tree(
    path_or_url: str | os.PathLike,
    *,
    tree: str = "Events",
    filter_name: Any = None,
    **options: Any,
) -> TreeRead:
    """Read every (or ``filter_name``'s) branch of ``tree`` with uproot and digest each one.

    ``root://`` URLs are read with ``handler=uproot.XRootDSource`` (the ``xrootd``
    bindings; uproot's default fsspec handler is far slower).  The file is closed before
    returning, which is when XCache records the access in its ``.cinfo``.
    """
    import uproot

    src = str(path_or_url)
    if src.startswith(("root://", "roots://")):
        options.setdefault("handler", uproot.XRootDSource)
    start = time.perf_counter()
    with uproot.open(src, **options) as f:
        t = f[tree]
        arrays = t.arrays(filter_name=filter_name) if filter_name else t.arrays()
        digests = {name: _digest(arrays[name]) for name in arrays.fields}
        source = f.file.source
        nbytes, nreq = int(source.num_requested_bytes), int(source.num_requests)
        n = int(t.num_entries)
    return TreeRead(src, n, digests, nbytes, nreq, time.perf_counter() - start)


def compare_reads(reference: TreeRead, other: TreeRead) -> list[str]:
    """Branches whose content differs (or that only one read has); empty if identical."""
    names = set(reference.digests) | set(other.digests)
    return sorted(n for n in names if reference.digests.get(n) != other.digests.get(n))


# --------------------------------------------------------------------------- self-check


def _listening(pids: Sequence[int]) -> list[str]:
    """``ss -ltnp`` lines (this namespace) of sockets owned by ``pids``."""
    ss = _which("ss", "/usr/bin/ss", "/bin/ss", "/usr/sbin/ss")
    if ss is None:
        return []
    out = subprocess.run([ss, "-ltnpH"], check=False, capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if any(f"pid={p}," in line for p in pids)]


def _snapshot(cache: XCacheServer) -> list[dict]:
    return [dataclasses.asdict(f) for f in cache.cached_files()]


def selfcheck(
    files: Sequence[str | os.PathLike],
    *,
    tree: str = "Events",
    pause: bool = False,
    rate: str | None = None,
    blocksize: str = "1m",
    prefetch: int = 0,
    emit=print,
) -> dict:
    """Serve ``files`` (all in one directory) from an origin and an XCache, read them.

    Must run inside a private network namespace.  For each file: read it locally, via the
    origin and twice via XCache (cache emptied first), digest every branch, and record the
    cache directory after each XCache read (the first XCache read finds it empty).
    ``emit("READY " + json)`` announces the servers;
    with ``pause`` it then waits for a line on stdin (a test looks at the host meanwhile).
    ``rate`` rate-limits what the origin sends (:func:`limit_loopback_bandwidth`).  Last,
    the origin is stopped and every file read once more through XCache: that read can only
    be served from the cache directory.
    """
    require_private_netns("selfcheck")
    paths = [Path(f).resolve() for f in files]
    export_dir = paths[0].parent
    if any(p.parent != export_dir for p in paths):
        raise XRootDError("all files must be in one directory")
    result: dict[str, Any] = {"files": {}}
    tmp = Path(tempfile.mkdtemp(prefix="cacheaffinity-selfcheck-"))
    os.chmod(tmp, 0o755)
    try:
        with (
            XRootDServer(export_dir) as origin,
            XCacheServer(origin, tmp / "cache", blocksize=blocksize, prefetch=prefetch) as cache,
        ):
            if rate:
                limit_loopback_bandwidth(rate, port=origin.port)
                result["qdisc"] = loopback_qdisc()
            ready = {
                "origin": {"url": origin.url, "port": origin.port, "pid": origin.pid},
                "xcache": {"url": cache.url, "port": cache.port, "pid": cache.pid},
                "netns_inode": _netns_inode(),
                "listening_in_netns": _listening([origin.pid, cache.pid]),
                "interfaces": sorted(_interfaces()),
            }
            result["servers"] = ready
            emit("READY " + json.dumps(ready))
            if pause:
                sys.stdin.readline()
            local_reads = {}
            for path in paths:
                name = path.name
                local = local_reads[name] = read_tree(path, tree=tree)
                entry: dict[str, Any] = {"local": local.summary()}
                for label, url in (
                    ("origin", origin.file_url(name)),
                    ("xcache_first", cache.file_url(name)),
                    ("xcache_second", cache.file_url(name)),
                ):
                    remote = read_tree(url, tree=tree)
                    entry[label] = remote.summary()
                    entry[label]["mismatched"] = compare_reads(local, remote)
                    if label.startswith("xcache"):
                        cache.wait_for_accesses(name, 1 if label == "xcache_first" else 2)
                        entry[label]["cache"] = _snapshot(cache)
                result["files"][name] = entry
            # with the origin gone, XCache can only answer from its cache directory (a cached
            # file's open is deferred: the origin is contacted only for a missing block)
            origin.stop()
            for path in paths:
                name = path.name
                remote = read_tree(cache.file_url(name), tree=tree)
                entry = result["files"][name]["xcache_origin_stopped"] = remote.summary()
                entry["mismatched"] = compare_reads(local_reads[name], remote)
                cache.wait_for_accesses(name, 3)
                entry["cache"] = _snapshot(cache)
            if rate:
                remove_loopback_bandwidth_limit()
                result["qdisc_after"] = loopback_qdisc()
            result["xcache_config"] = cache.config_text()
            result["origin_log_tail"] = origin.log_tail(5)
            result["xcache_log_tail"] = cache.log_tail(5)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.xrootd_check",
        description="Serve ROOT files from a real XRootD origin and XCache in a private "
        "network namespace and check that uproot reads them identically.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="origin + XCache round trip, JSON on stdout")
    check.add_argument("files", nargs="+")
    check.add_argument("--tree", default="Events")
    check.add_argument("--pause", action="store_true", help="wait for a stdin line after READY")
    check.add_argument("--rate", help="rate-limit the origin, e.g. 1gbit")
    check.add_argument("--blocksize", default="1m")
    check.add_argument("--prefetch", type=int, default=0)
    sub.add_parser("requirements", help="print what is missing (exit 1 if anything)")
    args = parser.parse_args(argv)
    if args.command == "requirements":
        missing = missing_requirements()
        print("\n".join(missing) or "all requirements present")
        return 1 if missing else 0
    for key, value in BOUNDED_CLIENT_ENV.items():
        os.environ.setdefault(key, value)
    reexec_in_private_netns()
    # a SIGTERM unwinds the context managers, so the daemons are stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    result = selfcheck(
        args.files,
        tree=args.tree,
        pause=args.pause,
        rate=args.rate,
        blocksize=args.blocksize,
        prefetch=args.prefetch,
        emit=lambda line: print(line, flush=True),
    )
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
