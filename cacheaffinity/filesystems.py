"""Which file system holds a path, and whether it is shared between machines (any process).

Read from this machine's ``/proc/mounts`` (missing: ``fstype`` ``"unknown"``, not shared): only
the machine that mounts a path can tell. Used by workers and by the client-side
:mod:`cacheaffinity.jobqueue`, hence a module of its own: neither side imports the other
(``tests/test_import_graph.py``). Imports nothing of the project.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = ["NETWORK_FILESYSTEMS", "filesystem_of"]

#: File system types (``/proc/mounts``) that are shared between machines.
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "ceph", "fuse.ceph",
        "fuse.ceph-fuse", "afs", "beegfs", "glusterfs", "fuse.glusterfs", "panfs", "9p",
        "fuse.eosxd", "fuse.cvmfs2", "fuse.sshfs", "fuse.gcsfuse", "fuse.s3fs", "orangefs",
        "pvfs2", "ocfs2", "gfs2", "fuse.dcache",
    }
)  # fmt: skip


def _mounts() -> list[tuple[str, str]]:
    out = []
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    mount = parts[1].replace("\\040", " ")
                    out.append((mount, parts[2]))
    except OSError:
        pass
    return out


def filesystem_of(path: str | os.PathLike, mounts: Sequence[tuple[str, str]] | None = None) -> dict:
    """``{"path", "mount", "fstype", "shared"}`` of ``path`` (or its nearest existing ancestor) on this
    machine, or in ``mounts`` (``(mount point, type)`` pairs, later ones winning as in /proc/mounts)."""
    p = os.path.abspath(os.fspath(path))
    # resolve symbolic links in the part that exists, keep the rest as written
    head, rest = p, ""
    while not os.path.exists(head) and head != os.path.dirname(head):
        head, tail = os.path.split(head)
        rest = os.path.join(tail, rest) if rest else tail
    real = os.path.join(os.path.realpath(head), rest) if rest else os.path.realpath(head)
    best, fstype = "", "unknown"
    for mount, kind in _mounts() if mounts is None else mounts:
        m = mount.rstrip("/") or "/"
        if (real == m or real.startswith(m.rstrip("/") + "/")) and len(m) >= len(best):
            best, fstype = m, kind
    return {
        "path": os.fspath(path),
        "mount": best or "/",
        "fstype": fstype,
        "shared": fstype in NETWORK_FILESYSTEMS,
    }
