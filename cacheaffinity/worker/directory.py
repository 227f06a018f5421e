"""Which cache directory a worker may trust, and where it goes by default (runs in workers
and in the ``cacheaffinity`` command).

Defines :func:`trusted_directory`, which creates a cache directory with mode 0700
or checks an existing one, :class:`UntrustedDirectory`, the error naming the
path, its owner and the fix, :class:`ReadOnlyDirectory`, the error for a cache
directory on a read-only file system, and :func:`default_directory`.

Everything read from a cache directory is trusted by the analysis: a column
buffer with a valid checksum is used as it is, and the checksums live in the
same directory.  So a directory is used only when no one but the worker's user
(and root) can write it:

- it is a real directory, not a symbolic link (``lstat``);
- it is owned by the worker's effective user;
- it is not writable by group or others;
- no directory above it lets others replace it: an ancestor writable by group
  or others must have the sticky bit (as ``/tmp`` has);
- the entries the cache uses (``node-id``, ``columns.sqlite3`` and its ``-wal``
  and ``-shm``, ``columns/``, ``columns-tmp/``, ``forms/``) are not links and
  belong to the same user (nobody planted them while the directory was open).

Shared-group mode (``cacheaffinity.worker.shared-group``) relaxes the owner rule
for the users of one Unix group who share a cache (see docs/deployment.md): the
directory and its entries must belong to that group, the directory must have
the setgid bit, be writable by the group and by nobody else, and its owner must
be a member of the group.  Members of the group trust each other: any of them
can store any data under any key.

Notes
-----
The checks are ``lstat`` calls on a handful of paths: cheap enough for every
worker start and every ``cacheaffinity cache`` command.  Files inside the
directory are opened with ``O_NOFOLLOW`` by the store; once the directory is
known to be writable by its user alone, nobody else can swap a file in it.
"""

from __future__ import annotations

import errno
import getpass
import grp
import os
import pwd
import stat
import tempfile

import dask.config

from cacheaffinity.exceptions import ReadOnlyDirectory, UntrustedDirectory

__all__ = [
    "ReadOnlyDirectory",
    "UntrustedDirectory",
    "default_directory",
    "group_id",
    "trusted_directory",
    "user_name",
]

#: Entries of a cache directory the store and the worker use.
ENTRIES = (
    "node-id",
    "columns.sqlite3",
    "columns.sqlite3-wal",
    "columns.sqlite3-shm",
    "columns.lock",
    "columns",
    "columns-tmp",
    "forms",
)



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



    def __reduce__(self):
        return (type(self), (self.filename,))


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
