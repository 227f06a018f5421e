"""Real XRootD storage for tests and benchmarks: origin server, XCache proxy, private network.

The consecutive-run benchmark compares cacheaffinity's node-local column cache with reading
NanoAOD over real XRootD storage, directly (:class:`XRootDServer`, the Debian ``xrootd``
daemon serving a directory read-only) and through XCache (:class:`XCacheServer`, the
XRootD proxy with the ``libXrdPfc`` file cache).  Clients read with uproot and the
``xrootd`` Python bindings: ``uproot.open(url, handler=uproot.XRootDSource)``
(:func:`read_tree` does that and digests every branch).

**Nothing may listen on anything but loopback.**  ``xrootd`` binds every interface (it has no
bind-address directive), so both servers and their clients run inside a private network
namespace in which only ``lo`` exists.  The servers refuse to start outside one
(``require_private_netns=False`` lifts that, for a machine where you know better).  Recipes:

- a whole command: ``unshare -n sh -c 'ip link set lo up && exec "$@"' sh CMD ARGS...``,
  i.e. ``subprocess.run(private_netns_argv([...]))`` or :func:`run_in_private_netns`;
- a script that should always run in one: call :func:`reexec_in_private_netns` first thing;
  it re-executes the interpreter with the same arguments under ``unshare -n`` (as root);
- a named namespace: ``ip netns add xrd && ip -n xrd link set lo up``, then
  ``ip netns exec xrd CMD``, and ``ip netns del xrd`` at the end.

An ``unshare -n`` namespace has its own ports, sockets and ``tc`` qdiscs and vanishes with its
last process.  The daemons are children of the process that starts them and are stopped by
the context managers (and by :func:`main` on SIGTERM); a SIGKILLed parent leaves them running
inside the namespace, unreachable but alive, until killed by pid.
:func:`limit_loopback_bandwidth` puts an HTB rate limit on that namespace's ``lo`` only
(never on a real interface).

``python -m testbed.xrootd check FILE.root`` runs the whole chain (origin,
XCache, uproot reads compared with local reads, cache directory contents) and prints JSON;
``tests/test_xrootd.py`` drives it.

System requirements (``.ci/install-system-deps``): Debian ``xrootd-server`` (pulls in
``xrootd-server-plugins`` with ``libXrdPss``/``libXrdPfc`` and creates the ``xrootd`` user),
``iproute2`` (``ip``, ``tc``, ``ss``), ``util-linux`` (``unshare``); Python: ``xrootd`` and
``fsspec-xrootd`` from PyPI.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import glob
import hashlib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "BOUNDED_CLIENT_ENV",
    "CachedFile",
    "TreeRead",
    "XCacheServer",
    "XRootDError",
    "XRootDServer",
    "compare_reads",
    "default_user",
    "free_port",
    "in_private_netns",
    "limit_loopback_bandwidth",
    "loopback_bandwidth_limit",
    "loopback_qdisc",
    "missing_requirements",
    "netns_available",
    "netns_unavailable_reason",
    "parse_cinfo",
    "popen_in_private_netns",
    "private_netns_argv",
    "read_tree",
    "reexec_in_private_netns",
    "remove_loopback_bandwidth_limit",
    "require_private_netns",
    "run_in_private_netns",
    "selfcheck",
    "xrootd_binary",
]

LOOPBACK = "127.0.0.1"
INSTALL_HINT = "install with `.ci/install-system-deps` (as root)"
PIP_HINT = "pip install xrootd fsspec-xrootd"
#: set in the environment of every process started through :func:`private_netns_argv`
NETNS_ENV = "CACHEAFFINITY_PRIVATE_NETNS"

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


def _which(name: str, *fallbacks: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for path in fallbacks:
        if os.access(path, os.X_OK):
            return path
    return None


def xrootd_binary() -> str | None:
    """Path of the ``xrootd`` daemon, or None."""
    return _which("xrootd", "/usr/bin/xrootd", "/usr/sbin/xrootd")


def _ip() -> str | None:
    return _which("ip", "/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip")


def _tc() -> str | None:
    return _which("tc", "/usr/sbin/tc", "/sbin/tc")


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


# --------------------------------------------------------------------------- network namespace


def _netns_inode(pid: int | str = "self") -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _interfaces() -> set[str]:
    # if_nameindex asks the kernel about *this* process's namespace (/sys/class/net shows the
    # namespace of whoever mounted sysfs, which unshare -n does not change)
    return {name for _, name in socket.if_nameindex()}


def in_private_netns() -> bool:
    """True if this process is in a network namespace other than the host's, with only ``lo``.

    Only ``lo`` is what makes binding every interface safe; the host's namespace is that of
    PID 1, compared where ``/proc/1/ns/net`` is readable (not inside ``ip netns exec``).
    """
    if _interfaces() != {"lo"}:
        return False
    ours, host = _netns_inode(), _netns_inode(1)
    return ours is None or host is None or ours != host


def _ensure_loopback_up() -> None:
    ip = _ip()
    if ip:
        subprocess.run([ip, "link", "set", "lo", "up"], check=False, capture_output=True)


def private_netns_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` wrapped to run in a new private network namespace with ``lo`` up.

    ``unshare -n`` (root or CAP_SYS_ADMIN) gives the command a namespace of its own with only a
    (down) loopback interface; the shell brings ``lo`` up, marks the environment
    (``CACHEAFFINITY_PRIVATE_NETNS=1``) and execs the command, which inherits the namespace
    together with all of its children.
    """
    unshare = _which("unshare", "/usr/bin/unshare", "/bin/unshare") or "unshare"
    ip = _ip() or "ip"
    script = f'{ip} link set lo up && export {NETNS_ENV}=1 && exec "$@"'
    return [unshare, "--net", "--", "sh", "-c", script, "cacheaffinity-netns", *map(str, argv)]


def run_in_private_netns(argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run`` of ``argv`` inside a new private network namespace."""
    check = kwargs.pop("check", False)
    return subprocess.run(private_netns_argv(argv), check=check, **kwargs)


def popen_in_private_netns(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen`` of ``argv`` inside a new private network namespace."""
    return subprocess.Popen(private_netns_argv(argv), **kwargs)


@functools.lru_cache(maxsize=1)
def netns_unavailable_reason() -> str | None:
    """None if ``unshare -n`` works here, else what is missing (for ``pytest.skip``)."""
    if _which("unshare", "/usr/bin/unshare", "/bin/unshare") is None:
        return f"`unshare` (Debian package util-linux; {INSTALL_HINT})"
    if _ip() is None:
        return f"`ip` (Debian package iproute2; {INSTALL_HINT})"
    try:
        proc = run_in_private_netns(["true"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"a private network namespace (`unshare -n` failed: {exc})"
    if proc.returncode != 0:
        err = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        return (
            "a private network namespace: `unshare -n` is not permitted here "
            f"({err[0]}; it needs root or CAP_SYS_ADMIN)"
        )
    return None


def netns_available() -> bool:
    """Whether ``unshare -n`` (with ``ip link set lo up``) works for this process."""
    return netns_unavailable_reason() is None


def require_private_netns(what: str = "this") -> None:
    """Raise :class:`XRootDError` unless this process is in a private network namespace."""
    if not in_private_netns():
        raise XRootDError(
            f"{what} must run inside a private network namespace with only `lo` "
            "(xrootd binds every interface): run the process under "
            "`unshare -n sh -c 'ip link set lo up && exec \"$@\"' sh CMD...` "
            "(testbed.xrootd.private_netns_argv) or call "
            "reexec_in_private_netns() first"
        )


def reexec_in_private_netns(argv: Sequence[str] | None = None) -> None:
    """Re-execute this process (or ``argv``) in a new private network namespace, once.

    Returns at once if the process already is in one; otherwise never returns.
    """
    if in_private_netns():
        _ensure_loopback_up()
        return
    if os.environ.get(NETNS_ENV) == "1":
        raise XRootDError(
            "re-executed under unshare -n but still not in a private namespace with only lo"
        )
    reason = netns_unavailable_reason()
    if reason:
        raise XRootDError(f"cannot enter a private network namespace: missing {reason}")
    argv = list(argv) if argv is not None else [sys.executable, *sys.orig_argv[1:]]
    sys.stdout.flush()
    sys.stderr.flush()
    wrapped = private_netns_argv(argv)
    os.execv(wrapped[0], wrapped)


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on ``host`` in this network namespace right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- bandwidth (tc)


def _run_tc(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    tc = _tc()
    if tc is None:
        raise XRootDError(f"`tc` not found (Debian package iproute2; {INSTALL_HINT})")
    proc = subprocess.run([tc, *args], check=False, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise XRootDError(f"tc {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def limit_loopback_bandwidth(
    rate: str = "1gbit", *, port: int | None = None, burst: str = "256k"
) -> None:
    """Rate-limit ``lo`` of this private network namespace with an HTB qdisc.

    ``port=None`` shapes all loopback traffic; with a ``port`` only the packets whose source
    port is ``port`` (what that server sends: the data of a read), so e.g. the origin can be
    slow while a local XCache is not.  ``rate``/``burst`` take tc units (``"1gbit"``,
    ``"500mbit"``, ``"256k"``).  Refuses to run outside a private namespace, so the host's
    interfaces are never touched.  Replaces any earlier limit.
    """
    require_private_netns("limit_loopback_bandwidth")
    remove_loopback_bandwidth_limit()
    if port is None:
        _run_tc("qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "10")
        _run_tc(
            "class", "add", "dev", "lo", "parent", "1:", "classid", "1:10", "htb",
            "rate", rate, "ceil", rate, "burst", burst, "cburst", burst,
        )  # fmt: skip
        return
    _run_tc("qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "20")
    _run_tc(
        "class", "add", "dev", "lo", "parent", "1:", "classid", "1:10", "htb",
        "rate", rate, "ceil", rate, "burst", burst, "cburst", burst,
    )  # fmt: skip
    _run_tc(
        "class", "add", "dev", "lo", "parent", "1:", "classid", "1:20", "htb",
        "rate", "100gbit", "ceil", "100gbit",
    )  # fmt: skip
    _run_tc(
        "filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1",
        "u32", "match", "ip", "sport", str(int(port)), "0xffff", "flowid", "1:10",
    )  # fmt: skip


def remove_loopback_bandwidth_limit() -> None:
    """Remove the root qdisc of this private namespace's ``lo`` (no error if there is none)."""
    require_private_netns("remove_loopback_bandwidth_limit")
    _run_tc("qdisc", "del", "dev", "lo", "root", check=False)


def loopback_qdisc() -> str:
    """``tc qdisc show dev lo`` of this process's namespace."""
    return _run_tc("qdisc", "show", "dev", "lo").stdout.strip()


@contextlib.contextmanager
def loopback_bandwidth_limit(
    rate: str = "1gbit", *, port: int | None = None, burst: str = "256k"
) -> Iterator[None]:
    """Context manager form of :func:`limit_loopback_bandwidth`."""
    limit_loopback_bandwidth(rate, port=port, burst=burst)
    try:
        yield
    finally:
        remove_loopback_bandwidth_limit()


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
        with XRootDServer(export_dir) as origin, XCacheServer(
            origin, tmp / "cache", blocksize=blocksize, prefetch=prefetch
        ) as cache:
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
        prog="python -m testbed.xrootd",
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
