"""A node's cache directory: :class:`CacheDirectory` (runs in workers and in the CLI).

The one owner of the directory's path (``{name}``/``{host}`` templates, the default),
trust rules, entry names, ``node-id`` and atomic writes (:func:`atomic_write`).

Trust rules, a security contract (cached data is used as it is and its checksums live
beside it): a directory is used only if nobody but its user (and root) can write it:
a real directory, not a symbolic link, owned by the worker's effective user, not
writable by group or others, no ancestor writable by others without the sticky bit,
and none of its :data:`ENTRIES` a link or someone else's.  Shared-group mode
(``cacheaffinity.worker.shared-group``) admits one Unix group instead (setgid,
group-writable, nobody else).  The node id is created once (hard link: the first
writer wins) and never changed or deleted."""

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
#: ``os.open`` flags of every file a cache creates: never an existing (planted) file,
#: never through a link, not inherited by children.
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
#: writev takes at most this many buffers per call (Linux IOV_MAX is 1024).
_IOV = 1000
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
    """The id of a Unix group given by name or number (``ValueError`` naming the config key if none)."""
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
    """A node's cache directory (``path`` made absolute; ``shared_group``: a Unix group name
    or id for a shared-group cache, None for a private one).

    Raises ``ValueError`` if ``shared_group`` is not a group of this machine."""

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
        :func:`default_directory`.

        Raises
        ------
        ValueError
            If ``worker_name`` is None (a command run outside a worker) and the template
            names one directory per worker.
        """
        path = os.path.expanduser(os.path.expandvars(str(template or default_directory())))
        path = path.replace("{host}", socket.gethostname())
        if "{name}" in path and worker_name is None:
            raise ValueError(
                f"cacheaffinity.worker.directory={template!r} names one directory per worker "
                "({name}); give DIR, e.g. " + path.replace("{name}", "<worker name>")
            )
        return cls(path.replace("{name}", str(worker_name)), shared_group=shared_group)

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
        """Create the directory or check that it can be trusted (once per object); returns the path."""
        if not self._trusted:
            trusted_directory(self.path, create=create, shared_group=self.gid)
            self._trusted = True
        return self.path

    def node_id(self, *, create: bool = True) -> str:
        """The node id in ``node-id``, created if missing and ``create``.

        Raises ``FileNotFoundError`` if there is none and not ``create``, ``ValueError`` if the
        file is a link or holds no valid id (the message says the fix)."""
        if create:
            return read_or_create_node_id(self.path, self.gid)
        return read_node_id(self.entry(NODE_ID_FILE))


def trusted_directory(
    path: str | os.PathLike, *, create: bool = True, shared_group: str | int | None = None
) -> str:
    """Create the cache directory ``path`` (mode 0700; 2770 with ``shared_group``) or check
    that it can be trusted; returns the absolute path.

    Raises
    ------
    UntrustedDirectory
        If it, an entry or an ancestor breaks a trust rule (the message names the path,
        the owner and the fix).
    ReadOnlyDirectory
        If it is on a read-only file system and cannot be created or fails the mode rules.
    FileNotFoundError, NotADirectoryError, PermissionError
        If it is missing (``create=False``), not a directory, or cannot be created.
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
    # On a read-only file system (a read-only tmpfs shows 1777) chmod cannot help: say so.
    # A mode that passes is left to its users (`cache info` reads, writers report EROFS).
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
    """The per-user private cache directory used when none is configured:
    ``$XDG_CACHE_HOME/cacheaffinity`` (``~/.cache/cacheaffinity``) on a local file system,
    else (home on NFS, Lustre ..., or no home) ``<temporary-directory>/cacheaffinity-<user>``."""
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
    """The node id stored in ``directory``, created if needed (mode 0600; 0640 with
    ``shared_group``).  Raises ``OSError`` if it cannot be written or read, ``ValueError``
    if ``node-id`` holds no valid id."""
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

    ``data`` is ``bytes``, ``str`` (UTF-8) or a list of buffers (``os.writev``, no copy),
    written to a new temporary (``NEW_FILE``; default ``<path>.<pid>.<random>.tmp``) that is
    removed on any failure, created with ``mode`` less the umask (``chmod``: an exact mode)
    and ``fsync``-ed if asked.  Then ``publish(temporary, path)`` (``os.replace``) replaces
    any file there, or with ``exclusive`` a hard link makes it ``path`` only if there is
    none: the first writer wins, later ones get False."""
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
        while batch and n >= len(batch[0]):
            n -= len(batch[0])
            batch = batch[1:]
            i += 1
        if n:
            pieces[i] = pieces[i][n:]
