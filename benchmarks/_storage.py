"""Where a benchmark's files come from: a local directory, or an XRootD origin (+ XCache).

:class:`Storage` (a context manager) serves the generated files of a run's mode: from the
local directory, or from a real ``xrootd`` origin over ``root://`` with its traffic counted
(and shaped) by an HTB class on ``lo``, and an XCache proxy in front of it for the ``xcache``
mode (see consecutive_runs.py's docstring).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from benchmarks._runs import Config, uproot_options

__all__ = ["Storage"]


class Storage:
    """Where the files come from: a local directory, or an XRootD origin (+ XCache).

    With XRootD (inside a private network namespace), :meth:`origin_bytes` is the byte
    counter of the HTB class that carries what the origin sends (installed even without a
    ``rate``, at 100gbit, so that every mode's origin traffic is measured the same way).
    """

    def __init__(self, cfg: Config, files: list[str], workdir: Path):
        self.cfg, self.files, self.workdir = cfg, files, workdir
        self.origin = self.xcache = None
        self._stack = contextlib.ExitStack()
        self._xcache_stack: contextlib.ExitStack | None = None
        self._xcache_gen = 0

    def __enter__(self) -> Storage:
        if self.cfg.storage == "local":
            return self
        from testbed import xrootd as xrd

        for k, v in xrd.BOUNDED_CLIENT_ENV.items():
            os.environ.setdefault(k, v)
        export = Path(self.files[0]).parent
        self.origin = self._stack.enter_context(xrd.XRootDServer(export))
        if "xcache" in (*self.cfg.modes, *self.cfg.membership_modes):
            os.chmod(self.workdir, 0o755)
            self.fresh_xcache()
        xrd.limit_loopback_bandwidth(self.cfg.rate or "100gbit", port=self.origin.port)
        self._stack.callback(xrd.remove_loopback_bandwidth_limit)
        return self

    def fresh_xcache(self) -> None:
        """(Re)start XCache with a new, empty cache directory (before every repeat, so
        that each repeat's run 1 starts cold for the xcache mode as for the others)."""
        if self.origin is None or "xcache" not in (*self.cfg.modes, *self.cfg.membership_modes):
            return
        from testbed import xrootd as xrd

        if self._xcache_stack is not None:
            self._xcache_stack.close()
        self._xcache_gen += 1
        self._xcache_stack = contextlib.ExitStack()
        cache_dir = self.workdir / f"xcache-{self._xcache_gen}"
        self.xcache = self._xcache_stack.enter_context(
            xrd.XCacheServer(self.origin, cache_dir, blocksize=self.cfg.xcache_blocksize, prefetch=0)
        )

    def __exit__(self, *exc) -> None:
        if self._xcache_stack is not None:
            self._xcache_stack.close()
        self._stack.close()

    def fileset(self, mode: str) -> dict[str, list[str]]:
        if self.origin is None:
            return {"synthetic": list(self.files)}
        server = self.xcache if mode == "xcache" else self.origin
        return {"synthetic": [server.file_url(Path(f).name) for f in self.files]}

    def uproot_options(self) -> dict:
        return uproot_options(self.origin is not None)

    def origin_bytes(self) -> int | None:
        """Bytes the origin has sent so far (tc class 1:10), None without XRootD."""
        if self.origin is None:
            return None
        out = subprocess.run(
            [shutil.which("tc") or "/usr/sbin/tc", "-s", "class", "show", "dev", "lo"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        m = re.search(r"class htb 1:10 .*?\n\s*Sent (\d+) bytes", out, re.S)
        if not m:
            raise RuntimeError(f"no byte counter of tc class 1:10 in:\n{out}")
        return int(m.group(1))

    def describe(self) -> dict:
        if self.origin is None:
            return {"kind": "local", "directory": str(Path(self.files[0]).parent)}
        from testbed import xrootd as xrd

        return {
            "kind": "xrootd",
            "origin": self.origin.url,
            "xcache": self.xcache.url if self.xcache else None,
            "xcache_blocksize": self.cfg.xcache_blocksize,
            "xcache_prefetch": 0,
            "origin_rate_limit": self.cfg.rate,
            "qdisc": xrd.loopback_qdisc(),
        }
