"""A real single-node Slurm for tests: ``munged``, ``slurmctld`` and ``slurmd`` on 127.0.0.1.

>>> with LocalSlurm() as slurm:                                   # doctest: +SKIP
...     os.environ.update(slurm.env)        # SLURM_CONF for sbatch/squeue/scancel
...     cluster = cacheaffinity.jobqueue.slurm_cluster(..., queue=slurm.partition)

:class:`LocalSlurm` writes its own ``slurm.conf`` and a fresh MUNGE key into a temporary
directory, starts the three daemons in the foreground as its child processes (each in its own
process group), waits until ``sinfo`` shows the node idle, and on :meth:`stop` cancels every
job, waits for the jobs to end, stops the daemons and kills anything still running with its
``SLURM_CONF`` (job steps outlive ``slurmd``).  Nothing touches ``/etc/slurm`` or the
system's munged.

* Everything listens on 127.0.0.1 only: ``CommunicationParameters=NoCtldInAddrAny,NoInAddrAny``
  (without them ``slurmctld`` binds every interface); ports are picked free.
* The node is the local host (``NodeName=<hostname> NodeAddr=127.0.0.1``) with at least
  ``cpus`` CPUs (``SlurmdParameters=config_overrides`` lets it claim more than the hardware
  has, so two 1-core jobs run side by side on a 1-core CI machine), ``select/cons_tres`` with
  ``CR_CPU`` (jobs share the node), ``proctrack/linuxproc``, ``task/none``: no cgroups.
* ``SlurmUser=root``: it must run as root (Slurm's ``slurmd`` launches jobs as their user).

System requirements (``.ci/install-system-deps``): Debian ``slurmctld slurmd slurm-client
munge`` (or the ``slurm-wlm`` meta package, which pulls in many plugins).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["LocalSlurm", "SlurmError", "free_port", "missing_requirements"]

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scancel", "sinfo")


class SlurmError(RuntimeError):
    """A Slurm daemon did not start or a Slurm command failed (message has the logs)."""


def missing_requirements() -> str | None:
    """Why a local Slurm cannot run here, or None if it can."""
    missing = [b for b in DAEMONS + CLIENTS + ("munge",) if shutil.which(b) is None]
    # the daemons live in /usr/sbin, which is not always on a user's PATH
    missing = [b for b in missing if not os.path.exists(f"/usr/sbin/{b}")]
    if missing:
        return (
            f"Slurm is not installed ({', '.join(missing)} not found): "
            "apt-get install slurmctld slurmd slurm-client munge"
        )
    if os.geteuid() != 0:
        return "a local Slurm (SlurmUser=root, slurmd launching jobs) needs root"
    return None


def _which(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _hardware() -> tuple[int, int]:
    """(CPUs, RealMemory in MB) as ``slurmd -C`` reports them."""
    out = subprocess.run(
        [_which("slurmd"), "-C"], check=False, capture_output=True, text=True, timeout=30
    ).stdout
    cpus = re.search(r"\bCPUs=(\d+)", out)
    mem = re.search(r"\bRealMemory=(\d+)", out)
    return (
        int(cpus.group(1)) if cpus else (os.cpu_count() or 1),
        int(mem.group(1)) if mem else 1024,
    )


class LocalSlurm:
    """A single-node Slurm cluster started by (and children of) this process.

    Parameters
    ----------
    root : path, optional
        Directory for configuration, state, spool and logs (default: a new temporary
        directory, removed by :meth:`stop` unless ``keep=True``).
    cpus : int
        The node has at least this many CPUs (more if the hardware has more).
    partition : str
        Name of the single (default) partition.
    timeout : float
        Seconds to wait for the node to become idle.
    """

    def __init__(self, root=None, *, cpus: int = 2, partition: str = "cacheaffinity",
                 timeout: float = 60.0, keep: bool = False):  # fmt: skip
        reason = missing_requirements()
        if reason:
            raise SlurmError(reason)
        self._own_root = root is None
        # short: the MUNGE socket path must fit in a sockaddr_un (108 bytes)
        self.root = Path(root or tempfile.mkdtemp(prefix="ca-slurm-"))
        self.cpus = cpus
        self.partition = partition
        self.timeout = timeout
        self.keep = keep
        self.node = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname().split(".")[0]) or "node"
        self.conf = self.root / "slurm.conf"
        self.procs: dict[str, subprocess.Popen] = {}
        self._logs: list = []

    # ------------------------------------------------------------------ env
    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm client commands (``sbatch`` ...): ``SLURM_CONF``."""
        return {"SLURM_CONF": str(self.conf)}

    def _env(self) -> dict[str, str]:
        return dict(os.environ, **self.env)

    # ------------------------------------------------------------------ setup
    def _write_config(self) -> None:
        r = self.root
        for d in ("munge", "state", "spool", "log", "jobs"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r, 0o755)
        os.chmod(r / "munge", 0o755)  # the socket must be reachable by clients
        key = r / "munge" / "munge.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))
        self.munge_socket = r / "munge" / "sock"
        hw_cpus, hw_mem = _hardware()
        cpus = max(self.cpus, hw_cpus)
        self.ctld_port, self.slurmd_port = free_port(), free_port()
        self.conf.write_text(
            "\n".join(
                [
                    "# written by testbed.slurm.LocalSlurm",
                    "ClusterName=cacheaffinity-test",
                    "SlurmctldHost=localhost(127.0.0.1)",
                    f"SlurmctldPort={self.ctld_port}",
                    f"SlurmdPort={self.slurmd_port}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny",
                    f"StateSaveLocation={r / 'state'}",
                    f"SlurmdSpoolDir={r / 'spool'}",
                    f"SlurmctldPidFile={r / 'slurmctld.pid'}",
                    f"SlurmdPidFile={r / 'slurmd.pid'}",
                    f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "SchedulerType=sched/builtin",
                    "SlurmdParameters=config_overrides",
                    "ReturnToService=2",
                    "MpiDefault=none",
                    "MailProg=/bin/true",
                    "KillWait=5",
                    "MinJobAge=10",
                    "SlurmctldDebug=info",
                    "SlurmdDebug=info",
                    f"NodeName={self.node} NodeAddr=127.0.0.1 NodeHostname={socket.gethostname()} "
                    f"CPUs={cpus} RealMemory={max(hw_mem - 256, 512)} State=UNKNOWN",
                    f"PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE "
                    "OverSubscribe=NO State=UP",
                    "",
                ]
            )
        )

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "w")
        self._logs.append(log)
        self.procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=self._env(),
            start_new_session=True, cwd=self.root,
        )  # fmt: skip

    def start(self) -> LocalSlurm:
        """Start munged, slurmctld and slurmd; return once the node is idle."""
        self._write_config()
        m = self.root / "munge"
        try:
            self._spawn("munged", [
                _which("munged"), "--foreground", "--force",
                f"--key-file={m / 'munge.key'}", f"--socket={self.munge_socket}",
                f"--pid-file={m / 'munged.pid'}", f"--seed-file={m / 'munged.seed'}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
            ])  # fmt: skip
            self._wait(lambda: self.munge_socket.exists(), "munged to create its socket", 20)
            self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            self._spawn("slurmd", [_which("slurmd"), "-D", "-N", self.node, "-f", str(self.conf)])
            self._wait(lambda: self.node_state() == "idle", "the node to be idle", self.timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait(self, predicate, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise SlurmError(f"{dead[0]} exited while waiting for {what}\n{self.logs()}")
            if predicate():
                return
            time.sleep(0.2)
        raise SlurmError(f"timed out after {timeout:.0f} s waiting for {what}\n{self.logs()}")

    # ------------------------------------------------------------------ commands
    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> str:
        """Run a Slurm client command against this cluster; return its stdout."""
        p = subprocess.run(
            [_which(argv[0]), *argv[1:]], check=False, capture_output=True, text=True, env=self._env(),
            timeout=timeout,
        )  # fmt: skip
        if check and p.returncode != 0:
            raise SlurmError(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()}")
        return p.stdout

    def node_state(self) -> str:
        """``sinfo``'s state of the node (``idle``, ``mixed``, ``allocated`` ...), or ''."""
        try:
            out = self.run("sinfo", "-h", "-N", "-o", "%T", check=False, timeout=10)
        except subprocess.TimeoutExpired:
            return ""
        return out.strip().split("\n")[0].rstrip("*~#") if out.strip() else ""

    def jobs(self) -> list[dict[str, str]]:
        """Jobs known to slurmctld: ``[{"id", "name", "state"}]``."""
        out = self.run("squeue", "-h", "-o", "%i|%j|%T")
        return [
            dict(zip(("id", "name", "state"), line.split("|")))
            for line in out.splitlines()
            if line.strip()
        ]

    def logs(self, lines: int = 30) -> str:
        """The last lines of every daemon log (for error messages)."""
        parts = []
        for f in sorted((self.root / "log").glob("*")):
            try:
                text = f.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            parts.append(f"--- {f.name}\n" + "\n".join(text))
        return "\n".join(parts)

    # ------------------------------------------------------------------ teardown
    def _our_stragglers(self) -> list[int]:
        """Pids of job processes (batch scripts, workers) and ``slurmstepd`` of this cluster:
        processes whose environment has our ``SLURM_CONF`` and a ``SLURM_JOB_ID``, or
        ``slurmstepd`` with our ``SLURM_CONF``."""
        needle = f"SLURM_CONF={self.conf}".encode()
        pids = []
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == os.getpid():
                continue
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if needle not in env:
                continue
            try:
                with open(f"/proc/{d}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                continue
            if comm == "slurmstepd" or any(e.startswith(b"SLURM_JOB_ID=") for e in env):
                pids.append(int(d))
        return pids

    def stop(self) -> None:
        """Cancel all jobs, stop the daemons, kill leftovers, remove the root if ours."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            try:
                self.run("scancel", f"--partition={self.partition}", check=False, timeout=15)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and self.jobs():
                    time.sleep(0.3)
            except (SlurmError, subprocess.TimeoutExpired):
                pass
        for name in reversed(DAEMONS):
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for _ in range(2):  # job steps outlive slurmd: end them by pid
            pids = self._our_stragglers()
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if not pids:
                break
            time.sleep(0.5)
        for log in self._logs:
            log.close()
        self._logs.clear()
        if self._own_root and not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
