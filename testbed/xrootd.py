"""Real XRootD storage for tests and benchmarks: origin server, XCache proxy, private network.

The consecutive-run benchmark compares cacheaffinity's node-local column cache with reading
NanoAOD over real XRootD storage, directly (:class:`XRootDServer`, the Debian ``xrootd``
daemon serving a directory read-only) and through XCache (:class:`XCacheServer`, the
XRootD proxy with the ``libXrdPfc`` file cache).  Clients read with uproot and the
``xrootd`` Python bindings: ``uproot.open(url, handler=uproot.XRootDSource)``
(:func:`testbed.xrootd_check.read_tree` does that and digests every branch).

**Nothing may listen on anything but loopback.**  ``xrootd`` binds every interface (it has no
bind-address directive), so both servers and their clients run inside a private network
namespace in which only ``lo`` exists (:mod:`testbed.netns`: recipes, ``unshare -n``, and
loopback rate limits).  The servers refuse to start outside one
(``require_private_netns=False`` lifts that, for a machine where you know better).  The
daemons are children of the process that starts them and are stopped by the context managers
(and by :func:`testbed.xrootd_check.main` on SIGTERM); a SIGKILLed parent leaves them running
inside the namespace, unreachable but alive, until killed by pid.

``python -m testbed.xrootd_check check FILE.root`` runs the whole chain (origin,
XCache, uproot reads compared with local reads, cache directory contents) and prints JSON;
``tests/test_xrootd.py`` drives it.

System requirements (``.ci/install-system-deps``): Debian ``xrootd-server`` (pulls in
``xrootd-server-plugins`` with ``libXrdPss``/``libXrdPfc`` and creates the ``xrootd`` user),
``iproute2`` (``ip``, ``tc``, ``ss``), ``util-linux`` (``unshare``); Python: ``xrootd`` and
``fsspec-xrootd`` from PyPI.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

# the network-namespace and loopback-shaping helpers live in testbed.netns; their names are
# re-exported here, where the XRootD servers' users have always found them
from testbed.netns import (  # noqa: F401
    INSTALL_HINT,
    LOOPBACK,
    NETNS_ENV,
    _ensure_loopback_up,
    _ip,
    _tc,
    _which,
    free_port,
    in_private_netns,
    limit_loopback_bandwidth,
    loopback_bandwidth_limit,
    loopback_qdisc,
    netns_available,
    netns_unavailable_reason,
    popen_in_private_netns,
    private_netns_argv,
    reexec_in_private_netns,
    remove_loopback_bandwidth_limit,
    require_private_netns,
    run_in_private_netns,
)

#: this module's own names; the testbed.netns names imported above are re-exported too
__all__ = [
    "BOUNDED_CLIENT_ENV",
    "CachedFile",
    "XCacheServer",
    "XRootDError",
    "XRootDServer",
    "default_user",
    "missing_requirements",
    "parse_cinfo",
    "xrootd_binary",
]

PIP_HINT = "pip install xrootd fsspec-xrootd"

#: XrdCl client settings that turn a dead or missing server into an error within seconds
#: instead of the defaults' minutes of reconnecting (set before ``XRootD`` is imported; the
#: servers' own XrdCl, the proxy's connection to its origin, gets them too).
BOUNDED_CLIENT_ENV = {
    "XRD_CONNECTIONWINDOW": "5",
    "XRD_CONNECTIONRETRY": "2",
    "XRD_REQUESTTIMEOUT": "60",
    "XRD_STREAMTIMEOUT": "60",
}


class XRootDError(RuntimeError):
    """An XRootD server could not be configured, started or reached."""


# --------------------------------------------------------------------------- discovery


def xrootd_binary() -> str | None:
    """Path of the ``xrootd`` daemon, or None."""
    return _which("xrootd", "/usr/bin/xrootd", "/usr/sbin/xrootd")


_LIB_DIRS = ("/usr/lib/*-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib64", "/usr/local/lib")


def _find_plugin(stem: str) -> str | None:
    for pattern in _LIB_DIRS:
        for d in glob.glob(pattern):
            for name in (f"{stem}-5.so", f"{stem}.so"):
                if os.path.exists(os.path.join(d, name)):
                    return os.path.join(d, name)
    return None


def _python_client_missing() -> str | None:
    try:
        import fsspec_xrootd  # noqa: F401
        from XRootD import client  # noqa: F401
    except ImportError as exc:
        return f"the XRootD Python bindings ({exc}; `{PIP_HINT}`)"
    return None


def missing_requirements(*, netns: bool = True, python_client: bool = True) -> list[str]:
    """What this machine lacks to run the servers and read from them (empty if nothing).

    Each entry names the missing piece and how to install it, ready for ``pytest.skip``.
    """
    missing = []
    if xrootd_binary() is None:
        missing.append(f"the `xrootd` daemon (Debian package xrootd-server; {INSTALL_HINT})")
    else:
        for stem in ("libXrdPss", "libXrdPfc"):
            if _find_plugin(stem) is None:
                missing.append(
                    f"the XCache plugin {stem}.so (Debian package xrootd-server-plugins; "
                    f"{INSTALL_HINT})"
                )
    if netns:
        reason = netns_unavailable_reason()
        if reason:
            missing.append(reason)
    if python_client:
        reason = _python_client_missing()
        if reason:
            missing.append(reason)
    return missing


def default_user() -> str:
    """The unprivileged account the daemons switch to when started as root."""
    for name in ("xrootd", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            pass
    raise XRootDError(f"neither an `xrootd` nor a `nobody` user exists; {INSTALL_HINT}")


# --------------------------------------------------------------------------- servers


def _as_user_ok(user: str, test_args: Sequence[str]) -> bool:
    """Whether ``test ARGS`` succeeds as ``user`` (only meaningful when we are root)."""
    if os.geteuid() != 0:
        return True
    pw = pwd.getpwnam(user)
    proc = subprocess.run(
        ["test", *test_args],
        check=False,
        user=pw.pw_uid,
        group=pw.pw_gid,
        extra_groups=[],
        capture_output=True,
    )
    return proc.returncode == 0


_LOG_PROBLEM = re.compile(r"error|unable|invalid|denied|not be less|failed", re.IGNORECASE)


class _XRootDDaemon:
    """Lifecycle shared by the origin and the cache: config file, process, readiness, logs."""

    kind = "xrootd"

    def __init__(
        self,
        *,
        port: int | None,
        user: str | None,
        workdir: str | os.PathLike | None,
        startup_timeout: float,
        stop_timeout: float,
        keep_workdir: bool,
        require_netns: bool,
        extra_config: str,
        env: dict[str, str] | None,
    ):
        self.port: int | None = port
        if user is None:
            user = default_user() if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        self.user = user
        self._workdir_arg = Path(workdir) if workdir is not None else None
        self.workdir: Path | None = None
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.keep_workdir = keep_workdir
        self.require_netns = require_netns
        self.extra_config = extra_config
        self.env = env
        self.proc: subprocess.Popen | None = None
        self._log_file = None
        self._made_workdir = False
        self._log_start = 0
        #: the end of the log, kept when the work directory is removed
        self.last_log_tail = ""

    # -- to be provided by subclasses
    def _check_dirs(self) -> None:
        raise NotImplementedError

    def config_text(self) -> str:
        raise NotImplementedError

    # -- paths and URLs
    @property
    def config_path(self) -> Path:
        assert self.workdir is not None, "not started"
        return self.workdir / f"{self.kind}.cfg"

    @property
    def log_path(self) -> Path:
        assert self.workdir is not None, "not started"
        return self.workdir / f"{self.kind}.log"

    @property
    def url(self) -> str:
        """``root://127.0.0.1:PORT/``"""
        if self.port is None:
            raise XRootDError(f"{self.kind} has no port yet (not started)")
        return f"root://{LOOPBACK}:{self.port}/"

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT`` (what ``pss.origin`` wants)."""
        return f"{LOOPBACK}:{self.port}"

    def file_url(self, path: str | os.PurePath) -> str:
        """``root://127.0.0.1:PORT//path`` for a path relative to the exported namespace."""
        rel = PurePosixPath(str(path)).as_posix().lstrip("/")
        return f"{self.url}/{rel}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except (OSError, AssertionError):
            return self.last_log_tail
        return "\n".join(text.splitlines()[-lines:])

    # -- lifecycle
    def _make_workdir(self) -> None:
        if self.workdir is not None:
            return
        if self._workdir_arg is not None:
            self._workdir_arg.mkdir(parents=True, exist_ok=True)
            self.workdir = self._workdir_arg
        else:
            self.workdir = Path(tempfile.mkdtemp(prefix=f"cacheaffinity-{self.kind}-"))
            self._made_workdir = True
        os.chmod(self.workdir, 0o755)
        for sub in ("admin", "run"):
            (self.workdir / sub).mkdir(exist_ok=True)
            self._give_to_user(self.workdir / sub)
        self._give_to_user(self.workdir)

    def _give_to_user(self, path: Path) -> None:
        if os.geteuid() == 0:
            pw = pwd.getpwnam(self.user)
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def start(self) -> _XRootDDaemon:
        """Write the config, start ``xrootd`` and wait until it accepts connections."""
        if self.running:
            return self
        binary = xrootd_binary()
        if binary is None:
            raise XRootDError(f"`xrootd` not found (Debian package xrootd-server; {INSTALL_HINT})")
        if self.require_netns:
            require_private_netns(f"the {self.kind} server")
            _ensure_loopback_up()
        self._check_dirs()
        self._make_workdir()
        if self.port is None:  # a restart keeps its port
            self.port = free_port()
        self.config_path.write_text(self.config_text())
        argv = [binary, "-I", "v4", "-n", self.kind, "-c", str(self.config_path)]
        if os.geteuid() == 0:
            argv += ["-R", self.user]
        env = dict(os.environ)
        env.update(BOUNDED_CLIENT_ENV)
        env.update(self.env or {})
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log_start = self._log_file.tell()  # a restart appends: look only past here
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            env=env,
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while True:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_start)
                log = f.read().decode(errors="replace")
            if "initialization failed" in log or self.proc.poll() is not None:
                problems = [line for line in log.splitlines() if _LOG_PROBLEM.search(line)]
                raise XRootDError(
                    f"{self.kind} (xrootd, port {self.port}) failed to start "
                    f"(exit code {self.proc.poll()}); problems in its log:\n"
                    + "\n".join(problems[:20])
                    + f"\nlog tail:\n{self.log_tail(15)}"
                )
            if "initialization completed" in log:
                try:
                    with socket.create_connection((LOOPBACK, self.port), timeout=0.5):
                        return
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise XRootDError(
                    f"{self.kind} (xrootd, port {self.port}) did not accept connections within "
                    f"{self.startup_timeout:.0f} s; log tail:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def _terminate(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(self.stop_timeout)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def stop(self) -> None:
        """SIGTERM (then SIGKILL) the daemon and remove the work directory (unless kept)."""
        self._terminate()
        if self.workdir is not None:
            self.last_log_tail = self.log_tail()
            if self._made_workdir and not self.keep_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)
                self.workdir = None
                self._made_workdir = False

    def restart(self) -> None:
        """Stop and start again on the same port, keeping the work directory."""
        self._terminate()
        self.proc = None
        self.start()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<{type(self).__name__} {self.url if self.port else '?'} {state}>"


def _common_config(d: _XRootDDaemon) -> str:
    assert d.workdir is not None
    return (
        f"# written by testbed.xrootd ({type(d).__name__})\n"
        f"xrd.port {d.port}\n"
        "# no reverse DNS look-ups of clients\n"
        "xrd.network nodnr\n"
        f"all.adminpath {d.workdir / 'admin'}\n"
        f"all.pidpath {d.workdir / 'run'}\n"
    )


class XRootDServer(_XRootDDaemon):
    """A standalone ``xrootd`` data server exporting ``export_dir`` read-only on 127.0.0.1.

    ``root://127.0.0.1:PORT//name.root`` is ``export_dir/name.root`` (``oss.localroot``).
    As root the daemon runs as ``user`` (default ``xrootd``, else ``nobody``), which must be
    able to read ``export_dir``.  Use as a context manager, or ``start()``/``stop()``.
    """

    kind = "origin"

    def __init__(
        self,
        export_dir: str | os.PathLike,
        *,
        port: int | None = None,
        user: str | None = None,
        workdir: str | os.PathLike | None = None,
        startup_timeout: float = 30.0,
        stop_timeout: float = 5.0,
        keep_workdir: bool = False,
        require_private_netns: bool = True,
        trace: bool = False,
        extra_config: str = "",
        env: dict[str, str] | None = None,
    ):
        super().__init__(
            port=port,
            user=user,
            workdir=workdir,
            startup_timeout=startup_timeout,
            stop_timeout=stop_timeout,
            keep_workdir=keep_workdir,
            require_netns=require_private_netns,
            extra_config=extra_config,
            env=env,
        )
        self.export_dir = Path(export_dir).resolve()
        self.trace = trace

    def _check_dirs(self) -> None:
        if not self.export_dir.is_dir():
            raise XRootDError(f"export_dir {self.export_dir} is not a directory")
        d = str(self.export_dir)
        if not _as_user_ok(self.user, ["-r", d, "-a", "-x", d]):
            raise XRootDError(
                f"user {self.user!r} cannot read {self.export_dir} (every parent directory needs "
                "o+x and the directory o+rx); export a copy under a readable directory"
            )

    def config_text(self) -> str:
        text = _common_config(self) + (
            "# serve export_dir as the root of the namespace, read-only\n"
            f"oss.localroot {self.export_dir}\n"
            "all.export / r/o\n"
        )
        if self.trace:
            text += "xrootd.trace all\nofs.trace all\n"
        return text + self.extra_config

    def file_url(self, path: str | os.PathLike) -> str:
        """URL of ``path``: relative to ``export_dir``, or an absolute path inside it."""
        p = Path(path)
        if p.is_absolute():
            try:
                p = p.resolve().relative_to(self.export_dir)
            except ValueError as exc:
                raise XRootDError(f"{path} is not inside {self.export_dir}") from exc
        return super().file_url(p.as_posix())


@dataclasses.dataclass
class CachedFile:
    """One file in an XCache cache directory."""

    path: str  #: relative to the cache directory (= path in the origin's namespace)
    size: int  #: apparent size (the data file is sparse: blocks land at their offsets)
    allocated: int  #: bytes on disk (st_blocks * 512): what has really been cached
    cinfo: dict | None  #: :func:`parse_cinfo` of its ``.cinfo`` file, if readable


class XCacheServer(_XRootDDaemon):
    """An XRootD caching proxy (XCache: ``libXrdPss`` + ``libXrdPfc``) on 127.0.0.1.

    ``origin`` is an :class:`XRootDServer`, a ``root://host:port/`` URL or ``host:port``.
    ``root://127.0.0.1:PORT//name.root`` fetches ``name.root`` from the origin block by block
    (``blocksize``), stores the blocks in ``cache_dir/name.root`` (sparse) with the block
    bitmap and access statistics in ``cache_dir/name.root.cinfo``, and serves later reads of
    cached blocks from disk.  ``prefetch`` is the number of blocks XCache reads ahead per open
    file (0 = only what clients ask for).  ``ram`` bounds the RAM for blocks in flight
    (XRootD refuses less than 1g; it is a bound, not an allocation).
    """

    kind = "xcache"

    def __init__(
        self,
        origin: str | XRootDServer,
        cache_dir: str | os.PathLike,
        *,
        port: int | None = None,
        user: str | None = None,
        blocksize: str = "1m",
        prefetch: int = 0,
        ram: str = "1g",
        diskusage: tuple[float, float] = (0.90, 0.95),
        workdir: str | os.PathLike | None = None,
        startup_timeout: float = 30.0,
        stop_timeout: float = 5.0,
        keep_workdir: bool = False,
        require_private_netns: bool = True,
        trace: str | None = None,
        extra_config: str = "",
        env: dict[str, str] | None = None,
    ):
        super().__init__(
            port=port,
            user=user,
            workdir=workdir,
            startup_timeout=startup_timeout,
            stop_timeout=stop_timeout,
            keep_workdir=keep_workdir,
            require_netns=require_private_netns,
            extra_config=extra_config,
            env=env,
        )
        self.origin = origin
        self.cache_dir = Path(cache_dir).resolve()
        self.blocksize = blocksize
        self.prefetch = int(prefetch)
        self.ram = ram
        self.diskusage = diskusage
        self.trace = trace

    @property
    def origin_address(self) -> str:
        """``host:port`` of the origin (``pss.origin``)."""
        return _host_port(self.origin)

    def _check_dirs(self) -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._give_to_user(self.cache_dir)
        d = str(self.cache_dir)
        if not _as_user_ok(self.user, ["-w", d, "-a", "-x", d]):
            raise XRootDError(
                f"user {self.user!r} cannot write {self.cache_dir} (its parents need o+x)"
            )

    def config_text(self) -> str:
        low, high = self.diskusage
        text = _common_config(self) + (
            "all.export /\n"
            "# proxy storage plugin, forwarding to the origin, with the proxy file cache\n"
            "ofs.osslib libXrdPss.so\n"
            f"pss.origin {self.origin_address}\n"
            "pss.cachelib libXrdPfc.so\n"
            "# cached data and .cinfo files live here, at their namespace paths\n"
            f"oss.localroot {self.cache_dir}\n"
            f"pfc.blocksize {self.blocksize}\n"
            f"pfc.prefetch {self.prefetch}\n"
            f"pfc.ram {self.ram}\n"
            f"pfc.diskusage {low} {high}\n"
        )
        if self.trace:
            text += f"pfc.trace {self.trace}\n"
        return text + self.extra_config

    def cache_path(self, path: str | os.PurePath) -> Path:
        """Where the data of origin path ``path`` is cached."""
        return self.cache_dir / PurePosixPath(str(path)).as_posix().lstrip("/")

    def cached_files(self) -> list[CachedFile]:
        """Data files in the cache directory, with bytes on disk and parsed ``.cinfo``."""
        out = []
        for root, _dirs, files in os.walk(self.cache_dir):
            for name in sorted(files):
                if name.endswith(".cinfo"):
                    continue
                full = Path(root) / name
                st = full.stat()
                cinfo_path = full.with_name(name + ".cinfo")
                out.append(
                    CachedFile(
                        path=full.relative_to(self.cache_dir).as_posix(),
                        size=st.st_size,
                        allocated=st.st_blocks * 512,
                        cinfo=parse_cinfo(cinfo_path) if cinfo_path.exists() else None,
                    )
                )
        return out

    def wait_for_accesses(self, path: str | os.PurePath, count: int, timeout: float = 10.0) -> dict:
        """The ``.cinfo`` of ``path`` once it records ``count`` closed accesses.

        XCache writes an access record when the client's close reaches it and syncs the file
        in the background, so look at the cache only after this (or give it a moment).
        """
        cinfo_path = self.cache_path(path).with_name(PurePosixPath(str(path)).name + ".cinfo")
        deadline = time.monotonic() + timeout
        info = None
        while time.monotonic() < deadline:
            info = parse_cinfo(cinfo_path) if cinfo_path.exists() else None
            if info is not None and len(info["accesses"]) >= count:
                return info
            time.sleep(0.1)
        raise XRootDError(f"{cinfo_path} has not recorded {count} accesses in {timeout} s: {info}")

    def cached_bytes(self) -> int:
        """Bytes on disk in cached data files."""
        return sum(f.allocated for f in self.cached_files())

    def clear_cache(self, *, restart: bool = True) -> None:
        """Empty the cache directory.

        XCache keeps state about open files and blocks in RAM, so a running server is stopped,
        the directory emptied and the server started again on the same port (``restart=False``
        leaves it stopped).  A stopped server's directory is just emptied.
        """
        was_running = self.running
        if was_running:
            self._terminate()
            self.proc = None
        for entry in self.cache_dir.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        if was_running and restart:
            self.start()


def _host_port(origin: str | XRootDServer) -> str:
    if isinstance(origin, _XRootDDaemon):
        return origin.address
    if "://" in origin:
        parts = urlsplit(origin)
        if not parts.hostname:
            raise XRootDError(f"no host in origin URL {origin!r}")
        return f"{parts.hostname}:{parts.port or 1094}"
    return origin if ":" in origin else f"{origin}:1094"


_CINFO_HEAD = re.compile(
    r"file_size\s+(\d+)\s*kB,\s*buffer_size\s+(\d+)\s*kB,\s*n_blocks\s+(\d+),\s*"
    r"n_downloaded\s+(\d+),\s*state\s+(\w+)"
)


def parse_cinfo(path: str | os.PathLike) -> dict | None:
    """The state of one cached file from its ``.cinfo`` (via ``xrdpfc_print``), or None.

    Returns ``file_size_kB``, ``block_size_kB``, ``n_blocks``, ``n_downloaded``,
    ``complete`` and ``accesses``: one dict per closed access (``n_ios``, ``hit_kB`` served
    from the cache, ``miss_kB`` fetched from the origin, ``bypass_kB``).  Access records
    are written when a client closes the file.  ``xrdpfc_print`` rounds to kB.
    """
    tool = _which("xrdpfc_print", "/usr/bin/xrdpfc_print")
    if tool is None:
        return None
    proc = subprocess.run(
        [tool, str(path)], check=False, capture_output=True, text=True, timeout=30
    )
    head = _CINFO_HEAD.search(proc.stdout)
    if head is None:
        return None
    info: dict[str, Any] = {
        "file_size_kB": int(head.group(1)),
        "block_size_kB": int(head.group(2)),
        "n_blocks": int(head.group(3)),
        "n_downloaded": int(head.group(4)),
        "complete": head.group(5) == "complete",
        "accesses": [],
    }
    in_records = False
    for line in proc.stdout.splitlines():
        if line.startswith("Record"):
            in_records = True
            continue
        fields = line.split()
        if in_records and len(fields) >= 9 and fields[0].isdigit():
            n_ios, n_mrg, hit, miss, bypass = (int(x) for x in fields[-5:])
            info["accesses"].append(
                {
                    "n_ios": n_ios,
                    "n_merged": n_mrg,
                    "hit_kB": hit,
                    "miss_kB": miss,
                    "bypass_kB": bypass,
                }
            )
    return info


if __name__ == "__main__":
    raise SystemExit("the self-check moved: python -m testbed.xrootd_check check FILE.root")
