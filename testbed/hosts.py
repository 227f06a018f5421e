"""A cluster in a box: hosts as network namespaces, shaped links, sized disks (needs root).

:class:`ClusterBox` builds, on one machine, what a facility looks like to cacheaffinity:

- a **switch**: a network namespace ``cabox-<id>-sw`` holding a Linux bridge ``br0``; every
  other namespace is linked to it by a veth pair (``eth0`` inside the host, ``v-<name>`` on
  the switch).  Addresses are ``10.213.0.0/24`` and exist only inside the box's namespaces:
  the host's own namespace gets no interface, no address and no route, so nothing the box
  runs can reach, or be reached from, anything outside it;
- **hosts** ``h1``, ``h2``, ... (namespace ``cabox-<id>-h1``, address ``10.213.0.11`` ...),
  each with its own host name (every process is started in a new UTS namespace whose
  ``hostname`` is the host's name), its own **disk** (a sized tmpfs mounted at
  ``<root>/disks/<host>``) and a **link** shaped with ``tc`` on both ends of its veth pair
  (an HTB class for the rate; a netem qdisc below it for delay and loss where the kernel has
  netem, :func:`netem_unavailable_reason`), changeable while things run
  (:meth:`ClusterBox.shape`); :meth:`ClusterBox.cut` partitions a member silently (its switch
  port stops forwarding) and :meth:`ClusterBox.restore` reconnects it;
- ``sched`` (``10.213.0.2``): ``dask scheduler --preload cacheaffinity`` on ``:8786``;
- ``origin`` (``10.213.0.3``): optionally a real XRootD origin (:class:`testbed.xrootd.XRootDServer`)
  serving a data directory on ``:1094``; without it workers read the files at their shared path;
- ``portal`` (``10.213.0.4``): where the client runs (:meth:`ClusterBox.portal`: a command,
  typically ``python -m testbed.portal ...``, that prints JSON).

Workers are started as a facility starts them: ``dask worker tcp://10.213.0.2:8786 --host
<address> --preload cacheaffinity --cache-directory <root>/disks/{host}/cache`` (the ``{host}``
placeholder resolved by the worker from its own host name), under a supervisor that starts
the command again when it exits (what systemd's ``Restart=always`` or a batch system does):
a worker that Dask closed after a partition comes back by itself, with its cache directory.

Every object is named with the prefix ``cabox-<id>-`` (namespaces, and their ``hosts`` files
in ``/etc/netns/``, which ``ip netns exec`` mounts on ``/etc/hosts`` so that box host names
resolve inside the box) or lives under ``/tmp/cabox-<id>/`` (mounts, logs); ``<root>/owner``
holds the pid of the process that made the box.  Leaving the context manager (also on an
exception) stops every process the box started (by process group id), deletes its namespaces
(which removes the veths, the bridge and their qdiscs) and unmounts its disks.
:func:`cleanup_stale` removes what an earlier run left behind after being killed: boxes
whose owner is no longer alive; :func:`leftovers` lists what of the box's objects exist
(empty after a clean teardown).

Runs in the test or benchmark process (as root); every command goes through ``ip``, ``tc``,
``mount`` and ``unshare`` (Debian iproute2, util-linux).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from testbed.netns import INSTALL_HINT, _ip, _tc, _which
from testbed.xrootd import BOUNDED_CLIENT_ENV

__all__ = [
    "PREFIX",
    "BoxError",
    "ClusterBox",
    "HostSpec",
    "Link",
    "Service",
    "cleanup_stale",
    "leftovers",
    "netem_unavailable_reason",
    "unavailable_reason",
]

PREFIX = "cabox-"
#: where every box keeps its mounts, logs and owner file: ``/tmp/cabox-<id>``
BASE = Path("/tmp")
#: per-namespace files that ``ip netns exec`` mounts over /etc (the box's ``hosts``)
ETC_NETNS = Path("/etc/netns")
SUBNET = "10.213.0"
SCHEDULER_PORT = 8786
ORIGIN_PORT = 1094
REPO = Path(__file__).resolve().parent.parent

#: the fixed members of a box: name -> last byte of the address
FIXED = {"sched": 2, "origin": 3, "portal": 4}
FIRST_HOST = 11


class BoxError(RuntimeError):
    """The box could not be built, a command failed, or a process did not start."""


# --------------------------------------------------------------------------- commands


def _cmd(argv: Sequence[str], *, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(map(str, argv)), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise BoxError(f"`{' '.join(map(str, argv))}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _bridge() -> str:
    return _which("bridge", "/usr/sbin/bridge", "/sbin/bridge") or "bridge"


@functools.lru_cache(maxsize=1)
def netem_unavailable_reason() -> str | None:
    """None if this kernel has the netem qdisc (link delay and loss), else what is missing.

    Some kernels (e.g. minimal VM kernels without modules) have HTB but neither netem nor
    any tc classifier or action: there links have a rate, and a cut, but no delay or loss.
    """
    name = f"{PREFIX}probe-netem-{os.getpid()}"
    try:
        _cmd([_ip(), "netns", "add", name])
        proc = _cmd([_ip(), "netns", "exec", name, _tc(), "qdisc", "add", "dev", "lo", "root", "netem",
                     "delay", "1ms"], check=False)  # fmt: skip
    finally:
        _cmd([_ip(), "netns", "del", name], check=False)
    if proc.returncode:
        return f"the kernel's netem qdisc (sch_netem; tc says: {proc.stderr.strip()})"
    return None


def unavailable_reason() -> str | None:
    """None if a box can be built here, else why not (for ``pytest.skip``)."""
    if os.geteuid() != 0:
        return "the cluster box needs root (network namespaces, tc, tmpfs mounts)"
    for tool, finder in (("ip", _ip), ("tc", _tc)):
        if finder() is None:
            return f"`{tool}` (Debian package iproute2; {INSTALL_HINT})"
    if _which("bridge", "/usr/sbin/bridge", "/sbin/bridge") is None:
        return f"`bridge` (Debian package iproute2; {INSTALL_HINT})"
    for tool in ("unshare", "mount", "umount"):
        if _which(tool, f"/usr/bin/{tool}", f"/bin/{tool}") is None:
            return f"`{tool}` (Debian package util-linux; {INSTALL_HINT})"
    name = f"{PREFIX}probe-{os.getpid()}"
    try:
        _cmd([_ip(), "netns", "add", name])
    except (BoxError, OSError) as exc:
        return f"`ip netns add` does not work here: {exc}"
    finally:
        _cmd([_ip(), "netns", "del", name], check=False)
    return None


def _netns_list() -> list[str]:
    out = _cmd([_ip(), "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _mounts() -> list[str]:
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_netns_pids(ns: str) -> None:
    """SIGKILL every process inside namespace ``ns`` (only ever one of the box's own)."""
    out = _cmd([_ip(), "netns", "pids", ns], check=False).stdout
    for pid in (int(p) for p in out.split() if p.isdigit()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _remove(box_id: str) -> list[str]:
    """Remove every object of box ``box_id``; returns what could not be removed."""
    problems = []
    for ns in _netns_list():
        if ns.startswith(f"{PREFIX}{box_id}-"):
            _kill_netns_pids(ns)
    for ns in _netns_list():
        if ns.startswith(f"{PREFIX}{box_id}-"):
            proc = _cmd([_ip(), "netns", "del", ns], check=False)
            if proc.returncode:
                problems.append(f"netns {ns}: {proc.stderr.strip()}")
    root = BASE / f"{PREFIX}{box_id}"
    for mnt in sorted((m for m in _mounts() if m.startswith(f"{root}/")), reverse=True):
        proc = _cmd(["umount", mnt], check=False)
        if proc.returncode:  # still busy (a process outside the box holds it): detach
            proc = _cmd(["umount", "-l", mnt], check=False)
        if proc.returncode:
            problems.append(f"mount {mnt}: {proc.stderr.strip()}")
    if not any(m.startswith(f"{root}/") for m in _mounts()):
        shutil.rmtree(root, ignore_errors=True)
    for etc in ETC_NETNS.glob(f"{PREFIX}{box_id}-*"):
        shutil.rmtree(etc, ignore_errors=True)
    with contextlib.suppress(OSError):  # only if empty: another user's entries stay
        ETC_NETNS.rmdir()
    return problems


def _box_ids() -> set[str]:
    ids = set()
    for ns in _netns_list():
        m = re.match(rf"{PREFIX}([0-9a-f]+)-", ns)
        if m:
            ids.add(m.group(1))
    for mnt in _mounts():
        m = re.match(rf"{BASE}/{PREFIX}([0-9a-f]+)/", mnt)
        if m:
            ids.add(m.group(1))
    for d in BASE.glob(f"{PREFIX}*"):
        m = re.fullmatch(rf"{PREFIX}([0-9a-f]+)", d.name)
        if m:
            ids.add(m.group(1))
    for d in ETC_NETNS.glob(f"{PREFIX}*"):
        m = re.match(rf"{PREFIX}([0-9a-f]+)-", d.name)
        if m:
            ids.add(m.group(1))
    return ids


def _owner_alive(box_id: str) -> bool:
    try:
        pid = int((BASE / f"{PREFIX}{box_id}" / "owner").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    return _pid_alive(pid)


def cleanup_stale() -> list[str]:
    """Remove the objects of boxes whose owner process is gone (an earlier crashed run).

    Boxes of a live process (a test running in parallel) are left alone.  Returns the ids
    removed.
    """
    removed = []
    for box_id in sorted(_box_ids()):
        if not _owner_alive(box_id):
            _remove(box_id)
            removed.append(box_id)
    return removed


def leftovers(box_id: str | None = None) -> dict[str, list[str]]:
    """The box objects that exist now: ``{"netns": [...], "mounts": [...], "dirs": [...]}``
    (``dirs``: its directory under /tmp and its /etc/netns entries).

    ``box_id=None``: of every box.
    """
    pre = f"{PREFIX}{box_id}-" if box_id else PREFIX
    root = f"{BASE}/{PREFIX}{box_id}/" if box_id else f"{BASE}/{PREFIX}"
    dirs = [str(BASE / f"{PREFIX}{box_id}")] if box_id else [str(d) for d in BASE.glob(f"{PREFIX}*")]
    dirs += [str(d) for d in ETC_NETNS.glob(f"{pre}*")]
    return {
        "netns": [ns for ns in _netns_list() if ns.startswith(pre)],
        "mounts": [m for m in _mounts() if m.startswith(root)],
        "dirs": [d for d in dirs if os.path.exists(d)],
    }


# --------------------------------------------------------------------------- processes


class Service:
    """A command running inside one of the box's namespaces, with its own host name.

    Started in a new session (its process group id is its pid: :meth:`stop` signals the
    whole group, e.g. ``dask worker``'s nanny and worker processes).  With ``supervise``, a
    thread starts the command again ``restart_delay`` seconds after it exits by itself, as
    a facility's service manager would; ``starts`` records every start (``time.time()``) and
    ``exits`` every exit (time, code).  Output goes to ``log``.
    """

    def __init__(self, name: str, ns: str, hostname: str, argv: Sequence[str], log: Path, *,
                 env: Mapping[str, str], supervise: bool = False, restart_delay: float = 1.0):  # fmt: skip
        self.name, self.ns, self.hostname = name, ns, hostname
        self.argv = [str(a) for a in argv]
        self.log, self.env = log, dict(env)
        self.supervise, self.restart_delay = supervise, restart_delay
        self.proc: subprocess.Popen | None = None
        self.starts: list[float] = []
        self.exits: list[tuple[float, int]] = []
        self._wanted = False
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None

    def _spawn(self) -> None:
        script = 'hostname "$0" && exec "$@"'
        argv = [_ip(), "netns", "exec", self.ns, "unshare", "--uts", "--", "sh", "-c", script,
                self.hostname, *self.argv]  # fmt: skip
        with open(self.log, "ab") as out:
            out.write(f"\n=== {time.strftime('%H:%M:%S')} start: {' '.join(self.argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, env=self.env, cwd=REPO,
                                         start_new_session=True)  # fmt: skip
        self.starts.append(time.time())

    def _watch(self) -> None:
        while True:
            proc = self.proc
            if proc is None:
                return
            code = proc.wait()
            with self._lock:
                if proc is not self.proc:  # restarted by start()/stop() meanwhile
                    continue
                self.exits.append((time.time(), code))
                if not (self._wanted and self.supervise):
                    return
            time.sleep(self.restart_delay)
            with self._lock:
                if not self._wanted or self.proc is not proc:
                    return
                self._spawn()

    def start(self) -> Service:
        with self._lock:
            if self.running:
                return self
            self._wanted = True
            self._spawn()
        self._watcher = threading.Thread(target=self._watch, name=f"cabox-{self.name}", daemon=True)
        self._watcher.start()
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the service's process group (no restart is prevented)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL after ``timeout``; no restart."""
        with self._lock:
            self._wanted = False
            proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group (a worker process)
        proc.wait()
        if self._watcher is not None:
            self._watcher.join(timeout=5)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


# --------------------------------------------------------------------------- the box


@dataclasses.dataclass
class Link:
    """A host's link to the switch, shaped in both directions (tc units)."""

    rate: str = "10gbit"  #: HTB rate and ceiling
    #: netem delay, e.g. "20ms" or "20ms 5ms" (jitter); needs the kernel's sch_netem
    delay: str | None = None
    #: netem random loss, e.g. "1%"; needs the kernel's sch_netem
    loss: str | None = None


@dataclasses.dataclass
class HostSpec:
    """One worker host."""

    name: str
    nthreads: int = 1
    disk: str = "64m"  #: tmpfs size of its local disk (the cache's file system)
    link: Link = dataclasses.field(default_factory=Link)
    weight: float | None = None  #: its cache node's placement weight (None: its threads)


class ClusterBox:
    """N worker hosts, a scheduler, an optional XRootD origin and a portal, as root.

    Parameters
    ----------
    hosts : int or sequence of HostSpec
        ``4`` is ``h1`` .. ``h4``, one thread each, 64 MB disks, unshaped 10 Gbit/s links.
    dask_config : mapping
        Dask settings for every process of the box (scheduler, workers, portal), e.g.
        ``{"distributed.scheduler.worker-ttl": "10s"}``; passed as ``DASK_*`` variables.
    origin_dir : path, optional
        Serve this directory with a real XRootD origin in the ``origin`` namespace
        (``root://10.213.0.3:1094//<name>``, :meth:`url`).  Without it workers read files
        at their path on the shared file system.
    origin_link : Link
        The origin's link (its rate is what all hosts share when reading from storage).
    worker_args : sequence of str
        More ``dask worker`` arguments for every worker.
    start : bool
        Start the scheduler and the workers on entry (else :meth:`start_scheduler`,
        :meth:`start_worker`).
    """

    def __init__(self, hosts: int | Sequence[HostSpec] = 4, *, dask_config: Mapping[str, Any] | None = None,
                 origin_dir: str | os.PathLike | None = None, origin_link: Link | None = None,
                 worker_args: Sequence[str] = (), start: bool = True, restart_delay: float = 1.0):  # fmt: skip
        specs = [HostSpec(f"h{i + 1}") for i in range(hosts)] if isinstance(hosts, int) else list(hosts)
        if not specs or len({s.name for s in specs}) != len(specs):
            raise ValueError(f"hosts must be a positive count or distinct HostSpecs, got {hosts!r}")
        for s in specs:
            if s.name in FIXED or not re.fullmatch(r"[a-z][a-z0-9]{0,9}", s.name):
                raise ValueError(f"host name {s.name!r}: lower-case letters and digits, 1-10, not {sorted(FIXED)}")
        self.specs = {s.name: s for s in specs}
        self.dask_config = dict(dask_config or {})
        self.origin_dir = Path(origin_dir).resolve() if origin_dir is not None else None
        self.origin_link = origin_link or Link()
        self.worker_args = list(worker_args)
        self.autostart = start
        self.restart_delay = restart_delay
        self.id = secrets.token_hex(3)
        self.root = BASE / f"{PREFIX}{self.id}"
        self.addresses = {n: f"{SUBNET}.{b}" for n, b in FIXED.items()}
        for i, name in enumerate(self.specs):
            self.addresses[name] = f"{SUBNET}.{FIRST_HOST + i}"
        self.services: dict[str, Service] = {}
        self.links: dict[str, Link] = {n: dataclasses.replace(s.link) for n, s in self.specs.items()}
        self.links["origin"] = dataclasses.replace(self.origin_link)
        self.links.update({"sched": Link(), "portal": Link()})
        self.cuts: dict[str, float] = {}  #: host -> time.time() of its last cut
        self._netem: set[str] = set()  #: members whose links have a netem qdisc
        self._built = False

    # ------------------------------------------------------------------ names
    def ns(self, member: str) -> str:
        """Namespace name of a member (``"sw"`` is the switch)."""
        return f"{PREFIX}{self.id}-{member}"

    @property
    def scheduler_address(self) -> str:
        return f"tcp://{self.addresses['sched']}:{SCHEDULER_PORT}"

    @property
    def hosts(self) -> list[str]:
        return list(self.specs)

    def disk(self, host: str) -> Path:
        """Mount point of ``host``'s local disk."""
        return self.root / "disks" / host

    def cache_directory(self, host: str) -> Path:
        """The cache directory of ``host``'s workers (``<disk>/cache``)."""
        return self.disk(host) / "cache"

    def url(self, path: str | os.PathLike) -> str:
        """Where workers read ``path`` (a file in ``origin_dir``, or any path without origin)."""
        if self.origin_dir is None:
            return str(Path(path).resolve())
        rel = Path(path).resolve().relative_to(self.origin_dir).as_posix()
        return f"root://{self.addresses['origin']}:{ORIGIN_PORT}//{rel}"

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> ClusterBox:
        reason = unavailable_reason()
        if reason:
            raise BoxError(reason)
        cleanup_stale()
        try:
            self._build()
            if self.origin_dir is not None:
                self.start_origin()
            if self.autostart:
                self.start_scheduler()
                for h in self.hosts:
                    self.start_worker(h)
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def _build(self) -> None:
        self.root.mkdir(mode=0o755)
        (self.root / "owner").write_text(f"{os.getpid()}\n")
        (self.root / "logs").mkdir()
        self._built = True
        ip = _ip()
        sw = self.ns("sw")
        _cmd([ip, "netns", "add", sw])
        _cmd([ip, "-n", sw, "link", "set", "lo", "up"])
        _cmd([ip, "-n", sw, "link", "add", "br0", "type", "bridge"])
        _cmd([ip, "-n", sw, "link", "set", "br0", "up"])
        for member in [*FIXED, *self.specs]:
            ns = self.ns(member)
            _cmd([ip, "netns", "add", ns])
            _cmd([ip, "-n", ns, "link", "set", "lo", "up"])
            port = f"v-{member}"
            # made inside the switch, its peer straight into the member: the host's own
            # namespace never holds either end
            _cmd([ip, "-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns])
            _cmd([ip, "-n", sw, "link", "set", port, "master", "br0"])
            _cmd([ip, "-n", sw, "link", "set", port, "up"])
            _cmd([ip, "-n", ns, "addr", "add", f"{self.addresses[member]}/24", "dev", "eth0"])
            _cmd([ip, "-n", ns, "link", "set", "eth0", "up"])
            self._qdisc(member, self.links[member], "add")
        # name resolution inside the box: `ip netns exec NS` mounts /etc/netns/NS/hosts on
        # /etc/hosts, so every member resolves every box host name (xrootd needs its own)
        hosts_text = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in self.addresses.items())
        for member in [*FIXED, *self.specs]:
            etc = ETC_NETNS / self.ns(member)
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_text)
        for host, spec in self.specs.items():
            d = self.disk(host)
            d.mkdir(parents=True)
            _cmd(["mount", "-t", "tmpfs", "-o", f"size={spec.disk},mode=0755", f"{PREFIX}{self.id}-{host}", d])

    def teardown(self) -> None:
        """Stop every process, delete every namespace, unmount every disk (idempotent)."""
        for svc in reversed(list(self.services.values())):
            with contextlib.suppress(Exception):
                svc.stop(timeout=5)
        if self._built or self.root.exists():
            problems = _remove(self.id)
            if problems:
                raise BoxError("teardown left: " + "; ".join(problems))
        self._built = False

    # ------------------------------------------------------------------ links
    def _ends(self, member: str) -> list[tuple[str, str]]:
        """(namespace, device) of both ends of a member's link."""
        return [(self.ns(member), "eth0"), (self.ns("sw"), f"v-{member}")]

    def _qdisc(self, member: str, link: Link, verb: str) -> None:
        """HTB rate on both ends; a netem qdisc below it only for delay or loss."""
        tc = _tc()
        for ns, dev in self._ends(member):
            run = [_ip(), "netns", "exec", ns, tc]
            if verb == "add":
                _cmd([*run, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10"])
            _cmd([*run, "class", verb, "dev", dev, "parent", "1:", "classid", "1:10",
                  "htb", "rate", link.rate, "ceil", link.rate, "burst", "256k", "cburst", "256k"])  # fmt: skip
            if link.delay or link.loss or member in self._netem:
                reason = netem_unavailable_reason()
                if reason:
                    raise BoxError(f"{member}: delay={link.delay!r} loss={link.loss!r} need {reason}")
                netem = ["netem", "limit", "100000", "delay", *(link.delay or "0ms").split(),
                         "loss", link.loss or "0%"]  # fmt: skip
                _cmd([*run, "qdisc", "replace", "dev", dev, "parent", "1:10", "handle", "10:", *netem])
                self._netem.add(member)

    def shape(self, member: str, *, rate: str | None = None, delay: str | None = None,
              loss: str | None = None) -> Link:  # fmt: skip
        """Change a member's link now, both directions (tc units: ``rate="1gbit"``; delay and
        loss need netem); returns the new :class:`Link`."""
        changes = {k: v for k, v in (("rate", rate), ("delay", delay), ("loss", loss)) if v is not None}
        link = self.links[member] = dataclasses.replace(self.links[member], **changes)
        self._qdisc(member, link, "change")
        return link

    def qdiscs(self, member: str) -> str:
        """``tc qdisc show`` and ``tc class show`` of both ends of a member's link."""
        return "\n".join(
            _cmd([_ip(), "netns", "exec", ns, _tc(), what, "show", "dev", dev]).stdout.strip()
            for ns, dev in self._ends(member)
            for what in ("qdisc", "class")
        )

    def cut(self, member: str, how: str = "block") -> float:
        """Partition a member from everything; returns the ``time.time()`` of the cut.

        ``"block"``: the switch port stops forwarding (bridge port state ``disabled``): every
        frame to or from the member is dropped silently while both ends keep their carrier,
        as when a switch or a router in between fails; only timeouts tell.  ``"down"``: the
        switch port is taken down (the member sees no carrier).
        """
        if how == "block":
            _cmd([_ip(), "netns", "exec", self.ns("sw"), _bridge(), "link", "set", "dev", f"v-{member}",
                  "state", "0"])  # fmt: skip
        elif how == "down":
            _cmd([_ip(), "-n", self.ns("sw"), "link", "set", f"v-{member}", "down"])
        else:
            raise ValueError(f"cut(how={how!r}): 'block' or 'down'")
        self.cuts[member] = time.time()
        return self.cuts[member]

    def restore(self, member: str) -> float:
        """Undo :meth:`cut`: the switch port up and forwarding again."""
        _cmd([_ip(), "-n", self.ns("sw"), "link", "set", f"v-{member}", "up"])
        _cmd([_ip(), "netns", "exec", self.ns("sw"), _bridge(), "link", "set", "dev", f"v-{member}",
              "state", "3"])  # fmt: skip
        return time.time()

    def port_state(self, member: str) -> str:
        """The switch port's line of ``bridge link show`` (forwarding, disabled, ...)."""
        out = _cmd([_ip(), "netns", "exec", self.ns("sw"), _bridge(), "link", "show", "dev", f"v-{member}"])
        return out.stdout.strip()

    # ------------------------------------------------------------------ disks
    def disk_usage(self, host: str) -> dict[str, int]:
        st = os.statvfs(self.disk(host))
        return {"size": st.f_blocks * st.f_frsize, "free": st.f_bavail * st.f_frsize}

    def replace_host(self, host: str) -> None:
        """The host is lost and replaced by an empty one at the same address: its worker
        stopped, its disk emptied (a new, empty file system), its worker started again."""
        self.stop_worker(host)
        _cmd(["umount", self.disk(host)])
        _cmd(["mount", "-t", "tmpfs", "-o", f"size={self.specs[host].disk},mode=0755",
              f"{PREFIX}{self.id}-{host}", self.disk(host)])  # fmt: skip
        self.start_worker(host)

    # ------------------------------------------------------------------ processes
    def env(self, **extra: str) -> dict[str, str]:
        """Environment of the box's processes: this one's, PYTHONPATH with the repository,
        the box's Dask settings as ``DASK_*`` variables."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        env.update(BOUNDED_CLIENT_ENV)  # XRootD clients: a lost origin is an error in seconds
        for key, value in self.dask_config.items():
            env["DASK_" + "__".join(part.upper().replace("-", "_") for part in key.split("."))] = (
                value if isinstance(value, str) else json.dumps(value)
            )
        env.update(extra)
        return env

    def _service(self, name: str, member: str, argv: Sequence[str], *, supervise: bool,
                 env: Mapping[str, str] | None = None) -> Service:  # fmt: skip
        old = self.services.get(name)
        if old is not None and old.running:
            return old
        svc = old or Service(name, self.ns(member), member, argv, self.root / "logs" / f"{name}.log",
                             env=self.env(**(env or {})), supervise=supervise,
                             restart_delay=self.restart_delay)  # fmt: skip
        self.services[name] = svc
        return svc.start()

    def _dask(self) -> str:
        return str(Path(sys.executable).parent / "dask")

    def start_scheduler(self, *, wait: float = 60.0) -> Service:
        """``dask scheduler --preload cacheaffinity`` on ``10.213.0.2:8786`` (dashboard on the
        scheduler's loopback only); waits until it accepts connections."""
        argv = [self._dask(), "scheduler", "--host", self.addresses["sched"], "--port", SCHEDULER_PORT,
                "--dashboard-address", "127.0.0.1:8787", "--preload", "cacheaffinity"]  # fmt: skip
        svc = self._service("scheduler", "sched", argv, supervise=False)
        self.wait_listening("sched", SCHEDULER_PORT, wait, svc)
        return svc

    def stop_scheduler(self) -> None:
        if "scheduler" in self.services:
            self.services["scheduler"].stop()

    def start_worker(self, host: str) -> Service:
        """``dask worker`` on ``host``: its address, its threads, its cache directory
        (``<root>/disks/{host}/cache``), supervised (restarted when it exits)."""
        spec = self.specs[host]
        argv = [self._dask(), "worker", self.scheduler_address, "--host", self.addresses[host],
                "--nthreads", spec.nthreads, "--nworkers", 1, "--name", host,
                "--dashboard-address", "127.0.0.1:0", *self.worker_args,
                "--preload", "cacheaffinity",
                f"--cache-directory={self.root}/disks/{{host}}/cache"]  # fmt: skip
        env = {} if spec.weight is None else {"DASK_CACHEAFFINITY__WORKER__WEIGHT": str(spec.weight)}
        return self._service(f"worker-{host}", host, argv, supervise=True, env=env)

    def stop_worker(self, host: str) -> None:
        if f"worker-{host}" in self.services:
            self.services[f"worker-{host}"].stop()

    def start_origin(self, wait: float = 60.0) -> Service:
        """A real XRootD origin (:class:`testbed.xrootd.XRootDServer`) exporting
        ``origin_dir`` on ``10.213.0.3:1094``, in the origin's namespace."""
        if self.origin_dir is None:
            raise BoxError("no origin_dir: the box has no origin")
        argv = [sys.executable, "-m", "testbed.hosts", "origin", str(self.origin_dir),
                "--port", ORIGIN_PORT, "--workdir", self.root / "origin"]  # fmt: skip
        svc = self._service("origin", "origin", argv, supervise=False)
        self.wait_listening("origin", ORIGIN_PORT, wait, svc)
        return svc

    def wait_listening(self, member: str, port: int, timeout: float, svc: Service | None = None) -> None:
        """Wait until something listens on ``port`` in ``member``'s namespace."""
        deadline = time.monotonic() + timeout
        while True:
            out = _cmd([_ip(), "netns", "exec", self.ns(member), "ss", "-ltnH"], check=False).stdout
            if re.search(rf":{port}\s", out):
                return
            if svc is not None and not svc.running and not svc.supervise:
                raise BoxError(f"{svc.name} exited ({svc.exits}); log:\n{svc.log_tail()}")
            if time.monotonic() > deadline:
                tail = svc.log_tail() if svc else ""
                raise BoxError(f"nothing listens on {member}:{port} after {timeout:.0f} s; log:\n{tail}")
            time.sleep(0.2)

    def listening(self) -> dict[str, list[str]]:
        """``ss -ltnH`` local addresses per member: what each namespace listens on."""
        out = {}
        for member in [*FIXED, *self.specs]:
            text = _cmd([_ip(), "netns", "exec", self.ns(member), "ss", "-ltnH"], check=False).stdout
            out[member] = sorted(line.split()[3] for line in text.splitlines() if line.strip())
        return out

    def portal(self, argv: Sequence[str], *, timeout: float = 300, env: Mapping[str, str] | None = None,
               popen: bool = False) -> Any:  # fmt: skip
        """Run ``argv`` in the portal namespace (host name ``portal``).

        Returns the parsed JSON of the last stdout line starting with ``RESULT `` (raises
        :class:`BoxError` with the output tail if the command fails); ``popen=True`` returns
        the running ``subprocess.Popen`` (stdout a pipe of text lines) instead.
        """
        script = 'hostname "$0" && exec "$@"'
        full = [_ip(), "netns", "exec", self.ns("portal"), "unshare", "--uts", "--", "sh", "-c", script,
                "portal", *map(str, argv)]  # fmt: skip
        e = self.env(CABOX_SCHEDULER=self.scheduler_address, **(env or {}))
        if popen:
            return subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=e, cwd=REPO, start_new_session=True)  # fmt: skip
        try:
            proc = subprocess.run(full, capture_output=True, text=True, env=e, cwd=REPO, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise BoxError(f"portal command {argv} did not finish in {timeout} s: {exc.stderr!r}"[-4000:]) from exc
        return parse_result(proc.stdout, proc.stderr, proc.returncode, argv)

    def python(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`portal` of ``python -m testbed.portal ARGS`` (the client side's commands)."""
        return self.portal([sys.executable, "-m", "testbed.portal", *map(str, args)], **kwargs)

    def logs(self, lines: int = 20) -> str:
        """The tails of every service's log (for a failing test's message)."""
        return "\n".join(f"--- {n}\n{s.log_tail(lines)}" for n, s in self.services.items())


def parse_result(stdout: str, stderr: str, returncode: int, argv: Sequence[Any] = ()) -> Any:
    """The JSON of the last ``RESULT `` line of a portal command's output."""
    results = [line[len("RESULT "):] for line in stdout.splitlines() if line.startswith("RESULT ")]
    if returncode != 0 or not results:
        raise BoxError(f"portal command {list(map(str, argv))} exited {returncode}:\n"
                       f"{stdout[-2000:]}\n{stderr[-4000:]}")  # fmt: skip
    return json.loads(results[-1])


# --------------------------------------------------------------------------- origin process


def _serve_origin(export_dir: str, port: int, workdir: str) -> int:
    """Run an XRootD origin in this (box) namespace until SIGTERM."""
    from testbed.xrootd import XRootDServer

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # the origin's namespace has lo and the box's eth0 only: binding every interface is safe
    with XRootDServer(export_dir, port=port, workdir=workdir, require_private_netns=False):
        print(f"origin serving {export_dir} on port {port}", flush=True)
        stop.wait()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m testbed.hosts")
    sub = parser.add_subparsers(dest="command", required=True)
    o = sub.add_parser("origin", help="(inside a box) serve a directory with XRootD until SIGTERM")
    o.add_argument("export_dir")
    o.add_argument("--port", type=int, default=ORIGIN_PORT)
    o.add_argument("--workdir", required=True)
    sub.add_parser("cleanup", help="remove the objects of boxes whose owner is gone; print what is left")
    args = parser.parse_args(argv)
    if args.command == "origin":
        return _serve_origin(args.export_dir, args.port, args.workdir)
    print(json.dumps({"removed": cleanup_stale(), "left": leftovers()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
