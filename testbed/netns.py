"""Private network namespaces and loopback bandwidth limits for the testbed's servers.

``xrootd`` binds every interface (it has no bind-address directive), so the testbed's servers
and their clients run inside a private network namespace in which only ``lo`` exists
(:mod:`testbed.xrootd`, :mod:`testbed.hosts`).  Recipes:

- a whole command: ``unshare -n sh -c 'ip link set lo up && exec "$@"' sh CMD ARGS...``,
  i.e. ``subprocess.run(private_netns_argv([...]))`` or :func:`run_in_private_netns`;
- a script that should always run in one: call :func:`reexec_in_private_netns` first thing;
  it re-executes the interpreter with the same arguments under ``unshare -n`` (as root);
- a named namespace: ``ip netns add xrd && ip -n xrd link set lo up``, then
  ``ip netns exec xrd CMD``, and ``ip netns del xrd`` at the end.

An ``unshare -n`` namespace has its own ports, sockets and ``tc`` qdiscs and vanishes with its
last process.  :func:`limit_loopback_bandwidth` puts an HTB rate limit on that namespace's
``lo`` only (never on a real interface).

System requirements (``.ci/install-system-deps``): ``iproute2`` (``ip``, ``tc``, ``ss``) and
``util-linux`` (``unshare``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = [
    "NetnsError",
    "free_port",
    "in_private_netns",
    "limit_loopback_bandwidth",
    "loopback_bandwidth_limit",
    "loopback_qdisc",
    "netns_available",
    "netns_unavailable_reason",
    "popen_in_private_netns",
    "private_netns_argv",
    "reexec_in_private_netns",
    "remove_loopback_bandwidth_limit",
    "require_private_netns",
    "run_in_private_netns",
]

LOOPBACK = "127.0.0.1"
INSTALL_HINT = "install with `.ci/install-system-deps` (as root)"
#: set in the environment of every process started through :func:`private_netns_argv`
NETNS_ENV = "CACHEAFFINITY_PRIVATE_NETNS"


class NetnsError(RuntimeError):
    """A private network namespace or a loopback rate limit could not be set up."""


# --------------------------------------------------------------------------- discovery


def _which(name: str, *fallbacks: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for path in fallbacks:
        if os.access(path, os.X_OK):
            return path
    return None


def _ip() -> str | None:
    return _which("ip", "/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip")


def _tc() -> str | None:
    return _which("tc", "/usr/sbin/tc", "/sbin/tc")


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
    """Raise :class:`NetnsError` unless this process is in a private network namespace."""
    if not in_private_netns():
        raise NetnsError(
            f"{what} must run inside a private network namespace with only `lo` "
            "(xrootd binds every interface): run the process under "
            "`unshare -n sh -c 'ip link set lo up && exec \"$@\"' sh CMD...` "
            "(testbed.netns.private_netns_argv) or call "
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
        raise NetnsError("re-executed under unshare -n but still not in a private namespace with only lo")
    reason = netns_unavailable_reason()
    if reason:
        raise NetnsError(f"cannot enter a private network namespace: missing {reason}")
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
        raise NetnsError(f"`tc` not found (Debian package iproute2; {INSTALL_HINT})")
    proc = subprocess.run([tc, *args], check=False, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise NetnsError(f"tc {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def limit_loopback_bandwidth(rate: str = "1gbit", *, port: int | None = None, burst: str = "256k") -> None:
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
def loopback_bandwidth_limit(rate: str = "1gbit", *, port: int | None = None, burst: str = "256k") -> Iterator[None]:
    """Context manager form of :func:`limit_loopback_bandwidth`."""
    limit_loopback_bandwidth(rate, port=port, burst=burst)
    try:
        yield
    finally:
        remove_loopback_bandwidth_limit()
