"""The persistent identity of a cache node (runs in worker processes).

A cache node is a cache directory on a node's local disk.  Its id lives in the
file ``node-id`` inside that directory, created on first use, and is shared by
every worker process that uses the directory, across restarts.  The scheduler
places chunks on node ids, never on worker addresses.

Notes
-----
Creation is atomic and race-free between processes: the id is written to a
temporary file and hard-linked to ``node-id``
(:func:`cacheaffinity.worker.store.files.atomic_write` with ``exclusive=True``);
whoever links first wins and everyone reads the winner's id.  A new directory is
created with mode 0700; ``node-id`` has mode 0600 (0640 in a shared-group cache:
the group's members read it, only its writer could change it, and nobody does),
whatever the umask, and is never read through a symbolic link
(``O_NOFOLLOW``); whether the
directory can be trusted at all is checked before, by
:func:`cacheaffinity.worker.directory.trusted_directory`.  Nothing here ever
changes or deletes an existing ``node-id``: a node keeps its identity through
every repair of its cache.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import uuid

from cacheaffinity.worker.store.files import atomic_write
from cacheaffinity.worker.store.layout import NODE_ID_FILE

__all__ = ["NODE_ID_FILE", "read_node_id", "read_or_create_node_id"]

_VALID = re.compile(r"^[A-Za-z0-9._:@-]{1,200}$")


def read_or_create_node_id(directory: str, shared_group: int | None = None) -> str:
    """Return the node id stored in ``directory``, creating it if needed (mode
    0600, or 0640 with ``shared_group``, the gid of a shared-group cache).

    Raises
    ------
    OSError
        If the directory cannot be created or the id cannot be written or read.
    ValueError
        If ``node-id`` exists but does not hold a valid id (the message names
        the file and how to fix it).
    """
    if not os.path.isdir(directory):
        os.makedirs(os.path.dirname(os.path.abspath(directory)), exist_ok=True)
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
    path = os.path.join(directory, NODE_ID_FILE)
    try:
        return read_node_id(path)
    except FileNotFoundError:
        pass
    host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:60] or "node"
    new_id = f"{host}-{uuid.uuid4().hex[:12]}"
    # hard-linked, never renamed: whoever links first wins, nobody replaces it
    mode = 0o600 if shared_group is None else 0o640
    atomic_write(path, new_id + "\n", mode=mode, chmod=mode, exclusive=True, fsync=True)
    return read_node_id(path)


def read_node_id(path: str) -> str:
    """The node id in the ``node-id`` file ``path`` (never creates one)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError(
                f"{path} is a symbolic link; a node id is never read through one. Remove "
                "the link to let the worker create a new id"
            ) from None
        raise
    with open(fd, errors="replace") as f:
        value = f.read(1024).strip()
    if not _VALID.match(value):
        raise ValueError(
            f"{path} holds {value[:80]!r}, which is not a cacheaffinity node id; "
            f"remove the file to let the worker create a new one"
        )
    return value
