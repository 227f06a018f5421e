"""A node's cache directory: where it is, whether it can be trusted, what is in it, and
the node id it holds (runs in workers and in the ``cacheaffinity`` command).

:class:`CacheDirectory` is the one owner of these: the path (``{name}``/``{host}``
templates, the default), the trust rules, the names of the entries the cache creates,
the ``node-id`` file and the one way a file of the directory is written
(:func:`atomic_write`).  The store (``ColumnCache``), the form documents and the
``cacheaffinity cache`` commands take a :class:`CacheDirectory` or a path.

Trust: everything read from a cache directory is used by the analysis as it is (a
buffer with a valid checksum is trusted, and the checksums live in the same
directory).  So a directory is used only when no one but the worker's user (and root)
can write it: a real directory (not a symbolic link), owned by the worker's effective
user, not writable by group or others, no ancestor writable by others without the
sticky bit, and its entries (:data:`ENTRIES`) neither links nor someone else's.
Shared-group mode (``cacheaffinity.worker.shared-group``, docs/deployment.md) relaxes
the owner rule for the members of one Unix group (setgid directory, group-writable,
nobody else).  The checks are a handful of ``lstat`` calls.

The node id is created once, atomically (hard-linked: the first writer wins), and
never changed or deleted: a node keeps its identity through every repair of its cache.
"""

from __future__ import annotations

import errno
import getpass
import grp
import os
import pwd
import re
import socket
import stat
import tempfile
import uuid
from collections.abc import Callable
from typing import Any

import dask.config

from cacheaffinity.exceptions import ReadOnlyDirectory, UntrustedDirectory

__all__ = [
    "DATA_DIR",
    "ENTRIES",
    "FORMS_DIR",
    "INDEX_NAME",
    "LOCK_NAME",
    "NEW_FILE",
    "NODE_ID_FILE",
    "TMP_DIR",
    "CacheDirectory",
    "ReadOnlyDirectory",
    "UntrustedDirectory",
    "atomic_write",
    "default_directory",
    "group_id",
    "read_node_id",
    "trusted_directory",
    "unlink",
    "user_name",
]

#: Names of the entries the cache creates in a directory (other files are left alone).
NODE_ID_FILE = "node-id"
INDEX_NAME = "columns.sqlite3"
LOCK_NAME = "columns.lock"
DATA_DIR = "columns"
TMP_DIR = "columns-tmp"
FORMS_DIR = "forms"
#: Every name the cache creates in a directory (checked by the trust rules).
ENTRIES = (
    NODE_ID_FILE,
    INDEX_NAME,
    INDEX_NAME + "-wal",
    INDEX_NAME + "-shm",
    LOCK_NAME,
    DATA_DIR,
    TMP_DIR,
    FORMS_DIR,
)
#: ``os.open`` flags of every file a cache creates: a new file (``O_EXCL``: never
#: an existing one, so never one planted in its place), never through a symbolic
#: link (``O_NOFOLLOW``), not inherited by child processes.
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
#: writev takes at most this many buffers per call (Linux IOV_MAX is 1024).
_IOV = 1000
#: What a node id may look like.
_VALID_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,200}$")


def user_name(uid: int) -> str:
    """``name (uid N)`` for a user id (just ``uid N`` if it has no name)."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _group_name(gid: int) -> str:
    try:
        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"


def group_id(group: str | int) -> int:
    """The id of a Unix group given by name or number.

    Raises
    ------
    ValueError
        If there is no such group (the message names the config key).
    """
    if isinstance(group, int) or (isinstance(group, str) and group.isdigit()):
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(
            f"cacheaffinity.worker.shared-group={group!r} is not a Unix group on this "
            "machine; give an existing group name or id (see `getent group`), or null"
        ) from None


def _is_member(uid: int, gid: int) -> bool:
    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        return False
    if user.pw_gid == gid:
        return True
    try:
        return user.pw_name in grp.getgrgid(gid).gr_mem
    except KeyError:
        return False


def _read_only(path: str) -> bool:
    """Whether the file system holding ``path`` is mounted read-only (``statvfs``)."""
    try:
        return bool(getattr(os.statvfs(path), "f_flag", 0) & os.ST_RDONLY)
    except OSError:
        return False


def _me() -> str:
    return user_name(os.geteuid())


def _refuse(path: str, problem: str, fix: str) -> UntrustedDirectory:
    return UntrustedDirectory(
        f"cache directory {path} {problem}; anyone who can write it can plant cached data "
        f"that analyses would read. {fix}"
    )


def _own_fix(path: str) -> str:
    return (
        "Use a directory of your own: pass --cache-directory DIR (or set "
        "cacheaffinity.worker.directory), e.g. "
        f"{os.path.join(os.path.expanduser('~'), '.cache', 'cacheaffinity')}"
        f" or /scratch/$USER/cacheaffinity, or let its owner remove {path}"
    )


def _check_mode(path: str, st: os.stat_result, gid: int | None, what: str) -> None:
    """Owner, group and mode rules for the directory (``what="cache directory"``)
    or one of its entries."""
    me = os.geteuid()
    mode = stat.S_IMODE(st.st_mode)
    if gid is None:
        if st.st_uid != me:
            raise _refuse(
                path,
                f"({what}) is owned by {user_name(st.st_uid)}, not by {_me()} who runs the worker",
                _own_fix(path),
            )
        if mode & 0o022:
            raise _refuse(
                path,
                f"({what}) is writable by {'group and others' if mode & 0o022 == 0o022 else ('group' if mode & 0o020 else 'others')} "
                f"(mode {mode:04o})",
                f"Run `chmod go-w {path}` (a private cache wants `chmod 700 {path}`), or set "
                "cacheaffinity.worker.shared-group to share it with one Unix group.",
            )
        return
    if st.st_gid != gid:
        raise _refuse(
            path,
            f"({what}) belongs to group {_group_name(st.st_gid)}, not to the shared group "
            f"{_group_name(gid)} of cacheaffinity.worker.shared-group",
            f"Run `chgrp -R {gid} {path}` as its owner, or use another directory.",
        )
    if mode & 0o002:
        raise _refuse(
            path,
            f"({what}) is writable by others (mode {mode:04o}), not only by group {_group_name(gid)}",
            f"Run `chmod o-w {path}`.",
        )
    if st.st_uid != me and not _is_member(st.st_uid, gid):
        raise _refuse(
            path,
            f"({what}) is owned by {user_name(st.st_uid)}, who is not in the shared group "
            f"{_group_name(gid)}",
            _own_fix(path),
        )


def _check_ancestors(path: str) -> None:
    parent = os.path.realpath(os.path.dirname(path))
    while True:
        st = os.stat(parent)
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o022 and not mode & stat.S_ISVTX:
            raise _refuse(
                path,
                f"is inside {parent}, which is writable by "
                f"{'others' if mode & 0o002 else 'group'} without the sticky bit "
                f"(mode {mode:04o}, owner {user_name(st.st_uid)}): others can rename the "
                "cache directory away and put their own in its place",
                f"Run `chmod +t {parent}` (as its owner), or put the cache elsewhere.",
            )
        up = os.path.dirname(parent)
        if up == parent:
            return
        parent = up


class CacheDirectory:
    """A node's cache directory.

    Parameters
    ----------
    path
        The directory (made absolute; :meth:`for_worker` expands templates).
    shared_group
        A Unix group (name or id) for a shared-group cache, or None (private).

    Raises
    ------
    ValueError
        If ``shared_group`` is not a group of this machine.
    """

    def __init__(self, path: str | os.PathLike, *, shared_group: str | int | None = None):
        #: Absolute path.
        self.path: str = os.path.abspath(os.fspath(path))
        #: Group id of a shared-group cache, None for a private one.
        self.gid: int | None = None if shared_group is None else group_id(shared_group)
        self._trusted = False

    @classmethod
    def for_worker(
        cls, template: str | os.PathLike | None, worker_name: Any, *, shared_group: str | int | None = None
    ) -> CacheDirectory:
        """The directory of a worker: ``template`` (``cacheaffinity.worker.directory``;
        ``{name}`` is the worker's name, ``{host}`` the host name) or, if None or empty,
        :func:`default_directory`."""
        path = os.path.expanduser(os.path.expandvars(str(template or default_directory())))
        path = path.replace("{host}", socket.gethostname()).replace("{name}", str(worker_name))
        return cls(path, shared_group=shared_group)

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"CacheDirectory({self.path!r}{'' if self.gid is None else f', gid={self.gid}'})"

    def entry(self, name: str) -> str:
        """The path of the entry ``name`` (one of :data:`ENTRIES`)."""
        if name not in ENTRIES:
            raise ValueError(f"{name!r} is not an entry of a cache directory ({', '.join(ENTRIES)})")
        return os.path.join(self.path, name)

    def trust(self, *, create: bool = True) -> str:
        """Create the directory or check that it can be trusted (once per object).

        Returns the path; raises as :func:`trusted_directory`.
        """
        if not self._trusted:
            trusted_directory(self.path, create=create, shared_group=self.gid)
            self._trusted = True
        return self.path

    def node_id(self, *, create: bool = True) -> str:
        """The node id in ``node-id``, created if missing and ``create``.

        Raises
        ------
        FileNotFoundError
            If there is none and not ``create``.
        ValueError
            If ``node-id`` does not hold a valid id or is a link (the message says the fix).
        """
        if create:
            return read_or_create_node_id(self.path, self.gid)
        return read_node_id(self.entry(NODE_ID_FILE))


def trusted_directory(
    path: str | os.PathLike, *, create: bool = True, shared_group: str | int | None = None
) -> str:
    """Create the cache directory ``path`` (mode 0700) or check that it can be trusted.

    Parameters
    ----------
    path
        The cache directory.
    create
        Create it (and missing parents) if it does not exist.
    shared_group
        A Unix group (name or id): the shared-group mode described in the module
        docstring.  A new directory is created group-owned with mode 2770.

    Returns
    -------
    str
        The absolute path.

    Raises
    ------
    UntrustedDirectory
        If the directory (or an entry in it, or an ancestor) fails a rule of
        the module docstring; the message names the path, the owner and the fix.
    FileNotFoundError, NotADirectoryError, PermissionError
        If it does not exist (``create=False``), is not a directory or cannot
        be created.
    ValueError
        If ``shared_group`` is not a group of this machine.
    """
    path = os.path.abspath(os.fspath(path))
    gid = None if shared_group is None else group_id(shared_group)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:
            raise
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.mkdir(path, 0o700 if gid is None else 0o770)
            if gid is not None:
                os.chown(path, -1, gid)
                os.chmod(path, 0o2770)
        except FileExistsError:  # another worker process of the node was first
            pass
        except OSError as e:
            if e.errno == errno.EROFS:
                raise ReadOnlyDirectory(path) from e
            raise
        st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        raise _refuse(
            path,
            f"is a symbolic link (to {target}, link owned by {user_name(st.st_uid)}); "
            "cache directories are never followed through links",
            "Pass --cache-directory DIR (or set cacheaffinity.worker.directory) with the "
            "real directory, if it is yours.",
        )
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(
            f"cache directory {path} is not a directory; pass --cache-directory DIR (or set "
            "cacheaffinity.worker.directory) naming a directory on node-local disk"
        )
    # On a read-only file system the mode is not what to fix (a read-only tmpfs shows
    # mode 1777; "run chmod go-w" cannot work there): say it is read-only.  A directory
    # whose mode passes is left to its users, which can read it (`cacheaffinity cache
    # info`) and report the read-only file system when they try to write.
    try:
        _check_mode(path, st, gid, "cache directory")
    except UntrustedDirectory as e:
        if _read_only(path):
            raise ReadOnlyDirectory(path) from e
        raise
    if gid is not None and not st.st_mode & stat.S_ISGID:
        raise _refuse(
            path,
            f"is a shared-group cache without the setgid bit (mode {stat.S_IMODE(st.st_mode):04o}): "
            "files would get their writers' primary groups and the others could not use them",
            f"Run `chmod g+s {path}` as its owner.",
        )
    _check_ancestors(path)
    for name in ENTRIES:
        entry = os.path.join(path, name)
        try:
            est = os.lstat(entry)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(est.st_mode):
            raise _refuse(
                path,
                f"holds {name} as a symbolic link (to {os.readlink(entry)}), which the "
                "cache never creates",
                f"Remove {entry} (the cache recreates it).",
            )
        if stat.S_ISDIR(est.st_mode) or gid is not None:
            _check_mode(entry, est, gid, f"{name} in the cache directory")
        elif est.st_uid != os.geteuid():
            raise _refuse(
                path,
                f"holds {name} owned by {user_name(est.st_uid)}, not by {_me()}",
                f"Remove {entry} (the cache recreates it) or use another directory.",
            )
    return path


def default_directory() -> str:
    """The cache directory when none is configured: a per-user private one.

    ``$XDG_CACHE_HOME/cacheaffinity`` (default ``~/.cache/cacheaffinity``) when
    that is on a local file system; otherwise (a home directory on NFS, Lustre
    ..., which SQLite's WAL mode and a node-local cache cannot use, or no home
    at all) ``<temporary-directory>/cacheaffinity-<user>``, which is checked
    like any other (owned by the user, mode 0700) before it is used.
    """
    from cacheaffinity.filesystems import filesystem_of

    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # unset or relative: the XDG spec says ~/.cache
        base = os.path.join(os.path.expanduser("~"), ".cache")
    if os.path.isabs(base):  # no home directory at all: "~" stays relative
        candidate = os.path.join(base, "cacheaffinity")
        if not filesystem_of(candidate)["shared"]:
            return candidate
    tmp = dask.config.get("temporary-directory", None) or tempfile.gettempdir()
    try:
        user = getpass.getuser()
    except Exception:  # no user name in some containers
        user = str(os.getuid())
    return os.path.join(tmp, f"cacheaffinity-{user}")


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
    if not _VALID_ID.match(value):
        raise ValueError(
            f"{path} holds {value[:80]!r}, which is not a cacheaffinity node id; "
            f"remove the file to let the worker create a new one"
        )
    return value


def atomic_write(
    path: str,
    data: bytes | str | list,
    *,
    mode: int = 0o600,
    chmod: int | None = None,
    temporary: str | None = None,
    exclusive: bool = False,
    fsync: bool = False,
    publish: Callable[[str, str], Any] = os.replace,
) -> bool:
    """Write ``data`` to ``path`` so that readers see the whole file or none.

    Parameters
    ----------
    path
        The file's name.
    data
        ``bytes``, ``str`` (written as UTF-8) or a list of buffers (written
        with ``os.writev``, no copy).
    mode
        Creation mode of the temporary (the umask applies).
    chmod
        If given, the file's exact mode (``fchmod``, whatever the umask).
    temporary
        The temporary's name; default ``<path>.<pid>.<random>.tmp`` beside it.
    exclusive
        False: rename the temporary over ``path`` (``publish``), replacing any
        file there.  True: hard-link it to ``path``, which is never replaced:
        the first writer wins and later ones return False.
    fsync
        ``fsync`` the file before it gets its name (survives a power loss).
    publish
        ``publish(temporary, path)`` renames (``os.replace``); the store passes
        its own (:meth:`DataFiles.write`).

    Returns
    -------
    bool
        Whether ``path`` now holds ``data`` (False only with ``exclusive``).

    Raises
    ------
    OSError
        Creating, writing or renaming failed; the temporary is removed.
    """
    tmp = temporary or f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    if isinstance(data, str):
        data = data.encode("utf-8")
    pieces = [memoryview(data)] if isinstance(data, (bytes, bytearray, memoryview)) else list(data)
    fd = os.open(tmp, NEW_FILE, mode)
    try:
        try:
            if chmod is not None:
                os.fchmod(fd, chmod)
            _writev_all(fd, pieces)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if not exclusive:
            publish(tmp, path)
            return True
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            unlink(tmp)
    except BaseException:
        unlink(tmp)
        raise


def unlink(path: str) -> bool:
    """Delete ``path``; False if it was not there (or could not be deleted)."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    except OSError:
        return False




def _writev_all(fd: int, pieces: list) -> None:
    """Write every buffer of ``pieces`` (partial writes resumed)."""
    i = 0
    while i < len(pieces):
        batch = pieces[i : i + _IOV]
        n = os.writev(fd, batch)
        # advance past what was written
        while batch and n >= len(batch[0]):
            n -= len(batch[0])
            batch = batch[1:]
            i += 1
        if n:
            pieces[i] = pieces[i][n:]
