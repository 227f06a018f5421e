"""Which file system holds a path, and whether it is shared between machines (runs anywhere).

Defines :func:`filesystem_of` and :data:`NETWORK_FILESYSTEMS`, read from this
machine's ``/proc/mounts``.  Used where a cache directory is chosen or checked:
by workers (:func:`cacheaffinity.worker._directory.default_directory`, the
plugin's start-up line) and by the client-side dask-jobqueue recipes
(:mod:`cacheaffinity.jobqueue`), which is why it belongs to neither: the
worker side never imports ``jobqueue`` and ``jobqueue`` never imports the
worker side (``tests/test_import_graph.py``).  Imports nothing of the project.

Notes
-----
Whether a path is on a shared file system can only be known on the machine
that mounts it; a missing ``/proc/mounts`` gives ``fstype`` ``"unknown"``
(not shared).
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
    """The file system holding ``path`` (or its nearest existing ancestor) on this machine.

    Returns ``{"path", "mount", "fstype", "shared"}``; ``shared`` is True for the network file
    systems in :data:`NETWORK_FILESYSTEMS`.  ``mounts`` (``(mount point, type)`` pairs, later
    entries winning as in ``/proc/mounts``) defaults to this machine's.
    """
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
