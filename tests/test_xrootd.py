"""Real XRootD storage: an origin server and an XCache proxy, read with uproot.

CI runs the suite as root but in the host's network namespace, and ``xrootd`` binds every
interface: so the test runs ``python -m testbed.xrootd_check check`` under
``unshare -n`` (only ``lo``, brought up), which starts both servers there, reads a real NanoAOD
file locally, via the origin and via XCache (cold, warm, and with the origin stopped), and
prints JSON.  While the servers run, the test checks from the host that they are invisible
there.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from testbed import skip_or_fail

from testbed import xrootd as xrd

REPO = Path(__file__).resolve().parent.parent
SAMPLE = "nano_dy.root"  # 1499 branches, LZMA NanoAOD
DEADLINE = 150  # seconds for the whole subprocess (it takes ~20 s)
REMOTE_READS = ("origin", "xcache_first", "xcache_second", "xcache_origin_stopped")


def _skip_unless_available() -> None:
    missing = xrd.missing_requirements()
    if missing:
        skip_or_fail("XRootD test needs " + "; ".join(missing))


def _host(tool: str, *args: str) -> str:
    """Output of an iproute2 tool run in the host's (this process's) namespace."""
    candidates = (f"/usr/sbin/{tool}", f"/sbin/{tool}", f"/usr/bin/{tool}")
    path = shutil.which(tool) or next((p for p in candidates if os.path.exists(p)), tool)
    return subprocess.run([path, *args], capture_output=True, text=True, check=True).stdout


def _next_line(lines: queue.Queue, prefix: str, deadline: float, seen: list[str]) -> dict:
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no {prefix!r} line in time; output so far:\n" + "\n".join(seen))
        try:
            line = lines.get(timeout=remaining)
        except queue.Empty:
            continue
        if line is None:
            raise AssertionError(f"check exited before {prefix!r}; output:\n" + "\n".join(seen))
        seen.append(line.rstrip("\n"))
        if line.startswith(prefix):
            return json.loads(line[len(prefix) :])


def _is_xrootd(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "xrootd"
    except OSError:
        return False


@pytest.fixture
def export_dir(nanoaod_dir):
    """A copy of the sample in a directory the unprivileged ``xrootd`` user can read."""
    d = Path(tempfile.mkdtemp(prefix="cacheaffinity-test-export-"))
    try:
        os.chmod(d, 0o755)
        shutil.copy(nanoaod_dir / SAMPLE, d / SAMPLE)
        os.chmod(d / SAMPLE, 0o644)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


class _DiedBeforeReady(AssertionError):
    """The check process ended before announcing its servers, without a word."""


@pytest.mark.timeout(2 * DEADLINE + 60)
def test_origin_and_xcache_read_like_local(export_dir, tmp_path):
    """In full-suite runs of this session (not alone, not after test_hosts alone) the check
    process twice ended before READY with empty stdout and stderr, as if killed from
    outside; its exit status is now reported, and such a silent death is retried once."""
    _skip_unless_available()
    try:
        _origin_and_xcache(export_dir, tmp_path / "try1")
    except _DiedBeforeReady as e:
        print(f"retrying once: {e}")
        _origin_and_xcache(export_dir, tmp_path / "try2")


def _origin_and_xcache(export_dir, tmp_path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    host_netns = os.stat("/proc/self/ns/net").st_ino
    host_qdisc = _host("tc", "qdisc", "show", "dev", "lo")
    argv = xrd.private_netns_argv(
        [
            sys.executable, "-m", "testbed.xrootd_check", "check",
            "--pause", "--blocksize", "64k", "--prefetch", "0", "--rate", "1gbit",
            str(export_dir / SAMPLE),
        ]
    )  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO), **xrd.BOUNDED_CLIENT_ENV)
    stderr_path = tmp_path / "check.stderr"
    start = time.monotonic()
    deadline = start + DEADLINE
    seen: list[str] = []
    ready: dict = {}
    with open(stderr_path, "w") as stderr:
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
            text=True, cwd=REPO, env=env,
        )  # fmt: skip
    lines: queue.Queue = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    pumper = threading.Thread(target=pump, daemon=True)
    pumper.start()
    try:
        try:
            try:
                ready = _next_line(lines, "READY ", deadline, seen)
            except AssertionError:
                code = proc.wait(10)
                if not seen and not stderr_path.read_text(errors="replace").strip():
                    raise _DiedBeforeReady(f"check exited with status {code} before READY, silently") from None
                raise

            # -- while both servers run: they are in their own namespace, invisible on the host
            assert ready["interfaces"] == ["lo"]
            pids = [ready["origin"]["pid"], ready["xcache"]["pid"]]
            ports = [ready["origin"]["port"], ready["xcache"]["port"]]
            inside = "\n".join(ready["listening_in_netns"])
            for port in ports:  # seen listening from inside, so the host check means something
                assert f":{port} " in inside, inside
            assert ready["netns_inode"] != host_netns
            for pid in pids:
                assert _is_xrootd(pid)
                assert os.stat(f"/proc/{pid}/ns/net").st_ino == ready["netns_inode"]
            host_listeners = _host("ss", "-ltnpH")
            for line in host_listeners.splitlines():
                assert not any(f"pid={pid}," in line for pid in pids), line
                if any(f":{port} " in line for port in ports):
                    assert "xrootd" not in line, line
            # the bandwidth limit is on the namespace's lo, not the host's
            assert _host("tc", "qdisc", "show", "dev", "lo") == host_qdisc

            proc.stdin.write("\n")
            proc.stdin.flush()
            result = _next_line(lines, "RESULT ", deadline, seen)
            assert proc.wait(max(1.0, deadline - time.monotonic())) == 0
        except BaseException:
            print("check stdout:\n" + "\n".join(seen))
            print("check stderr:\n" + stderr_path.read_text(errors="replace")[-5000:])
            raise
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # its handler stops both daemons
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for key in ("origin", "xcache"):  # daemons left behind by a killed check process
            pid = ready.get(key, {}).get("pid")
            if pid and _is_xrootd(pid):
                os.kill(pid, signal.SIGKILL)
        pumper.join(10)  # EOF once the process (and the namespace with it) is gone
        for stream in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
    elapsed = time.monotonic() - start

    # -- the daemons are gone with the check process
    for pid in pids:
        assert not _is_xrootd(pid)

    # -- bandwidth limit lived in the namespace and was removed
    assert "htb" in result["qdisc"]
    assert "htb" not in result["qdisc_after"]

    # -- every read gives exactly the local arrays
    entry = result["files"][SAMPLE]
    local = entry["local"]
    assert local["n_branches"] > 1000 and local["num_entries"] > 0
    for label in REMOTE_READS:
        read = entry[label]
        assert read["source"].startswith("root://127.0.0.1:"), read["source"]
        assert read["mismatched"] == [], (label, read["mismatched"][:10])
        assert read["n_branches"] == local["n_branches"], label
        assert read["num_entries"] == local["num_entries"], label
        assert read["bytes_read"] > 0, label

    # -- the first XCache read filled the cache directory (block by block, .cinfo beside)
    (first,) = entry["xcache_first"]["cache"]
    assert first["path"] == SAMPLE
    assert first["allocated"] > 0
    info = first["cinfo"]
    assert info is not None, "no readable .cinfo beside the cached data"
    assert info["block_size_kB"] == 64
    assert 0 < info["n_downloaded"] <= info["n_blocks"]
    assert len(info["accesses"]) == 1

    # -- the second read came from the cache: no new block, the new access missed nothing
    (second,) = entry["xcache_second"]["cache"]
    assert second["allocated"] == first["allocated"]
    assert second["cinfo"]["n_downloaded"] == info["n_downloaded"]
    assert len(second["cinfo"]["accesses"]) == 2
    last = second["cinfo"]["accesses"][-1]
    assert last["miss_kB"] == 0 and last["hit_kB"] > 0, last

    # -- and with the origin stopped, XCache still served identical data from disk
    (third,) = entry["xcache_origin_stopped"]["cache"]
    assert third["cinfo"]["n_downloaded"] == info["n_downloaded"]

    assert elapsed < DEADLINE
