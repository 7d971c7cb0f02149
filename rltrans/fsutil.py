"""Low-level file access that never leaves a folder and never blocks on a special file.

Writes go through a descriptor of the folder they belong to: a sub-folder is opened with
``O_DIRECTORY | O_NOFOLLOW`` relative to its parent's descriptor, a new file is created
exclusively under a unique temporary name and renamed into place, so a symbolic link swapped
in for a folder or a file is refused (:class:`UnsafePathError`) instead of followed. Reads
open a file with ``O_NONBLOCK`` and require a regular file, so a FIFO, socket or device where
a checkpoint or a config is expected is refused instead of blocking the reader forever.

A write the file system refuses (a full disk, a quota, a read-only or unwritable folder)
raises :class:`StorageError`, one line naming the file; the temporary file is removed and the
file it was to replace is left as it was.

Example:
    >>> fd = open_dir("runs/x", create=True)
    >>> write_atomic("config.yaml", b"seed: 1\\n", dir_fd=fd)
    >>> data = read_bytes("runs/x/config.yaml")
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
DIR_FLAGS = os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC
# What a file system answers to a write it refuses: full, over quota, read-only, not allowed,
# too large. Not a fault of rltrans's nor of the data: the user frees space or picks a place.
STORAGE_ERRNOS = frozenset(
    getattr(errno, name)
    for name in ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM", "EFBIG")
    if hasattr(errno, name)
)


class UnsafePathError(OSError):
    """A path rltrans reads or writes is a symbolic link, a special file (FIFO, socket,
    device) or otherwise not the plain file or folder expected; the message is one line."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


class StorageError(OSError):
    """The file system refused a write rltrans needs (a full disk, a quota, a read-only or
    unwritable folder); the message is one line naming the file and what stayed intact."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


def storage_cause(err: BaseException | None) -> OSError | None:
    """The refused write (an OSError of :data:`STORAGE_ERRNOS`) that ``err`` is or was raised
    while handling: torch.save reports a failed write as a RuntimeError raised from it."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, StorageError):
            return err
        is_os = isinstance(err, OSError) and not isinstance(err, UnsafePathError)
        if is_os and err.errno in STORAGE_ERRNOS:
            return err
        err = err.__cause__ or err.__context__
    return None


def refused_write(what: str, err: BaseException) -> StorageError | None:
    """A StorageError saying that ``what`` (a file, in words) cannot be written, when ``err``
    comes from a refused write; None for any other error."""
    cause = storage_cause(err)
    if cause is None:
        return None
    if isinstance(cause, StorageError):
        return cause
    return StorageError(cause.errno, f"cannot write {what}: {os.strerror(cause.errno)}")


def loop_error(path: str | os.PathLike[str]) -> UnsafePathError:
    """The one-line error for a path that crosses a symbolic link loop (ELOOP)."""
    return UnsafePathError(
        errno.ELOOP,
        f"{path} is or passes through a symbolic link loop (links that point at each other, "
        "or more links in a row than the system follows); rltrans reads and writes only real "
        "files and folders: remove the links or choose another path",
    )


def kind(mode: int) -> str:
    """What a file of ``mode`` is, in words (``a FIFO``, ``a symbolic link``, ...)."""
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISREG, "a regular file"),
    ):
        if test(mode):
            return name
    return "a special file"


def open_dir(
    path: str | os.PathLike[str], *, dir_fd: int | None = None, create: bool = False
) -> int:
    """A descriptor of the folder ``path`` (relative to ``dir_fd`` when given), opened without
    following a link at its last component; created first (mode 0o755) with ``create``.
    Raises UnsafePathError for a link or anything else that is not a folder."""
    if create:
        try:
            os.mkdir(path, 0o755, dir_fd=dir_fd)
        except FileExistsError:
            pass
        except OSError as err:  # a full disk (a new folder needs a block) or a read-only one
            raise refused_write(f"the folder {path}", err) or err from None
    try:
        return os.open(path, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            raise
        try:
            info = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
        except OSError as inner:  # a loop above it: nothing to name but the path
            if inner.errno == errno.ELOOP:
                raise loop_error(path) from None
            raise
        raise UnsafePathError(
            err.errno,
            f"{path} is {kind(info.st_mode)}, not a folder; rltrans writes only into real "
            "folders, never through links: remove it or choose another path",
        ) from None


def same_dir(fd: int, name: str, *, dir_fd: int) -> bool:
    """True when ``name`` in ``dir_fd`` is still the very folder open as ``fd`` (not a link,
    nor a folder swapped in for it)."""
    try:
        entry = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return stat.S_ISDIR(entry.st_mode) and (entry.st_dev, entry.st_ino) == (
        mine.st_dev,
        mine.st_ino,
    )


def open_regular(
    path: str | os.PathLike[str], *, dir_fd: int | None = None, follow: bool = True
) -> int:
    """A read-only descriptor of ``path``, which must be a regular file: a FIFO, socket or
    device is refused (UnsafePathError) without a blocking open, as is a link when ``follow``
    is False. FileNotFoundError when it does not exist."""
    try:
        info = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise loop_error(path) from None
        raise
    if not stat.S_ISREG(info.st_mode):
        raise UnsafePathError(
            errno.EINVAL, f"{path} is {kind(info.st_mode)}, not a regular file; rltrans reads "
            "checkpoints, configs and event files only from regular files"
        )  # fmt: skip
    flags = os.O_RDONLY | _NONBLOCK | _CLOEXEC | (0 if follow else _NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as err:  # swapped for a link (loop) since the stat above
        if err.errno == errno.ELOOP:
            raise loop_error(path) from None
        raise
    info = os.fstat(fd)  # swapped since the stat above: check what was opened
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UnsafePathError(errno.EINVAL, f"{path} is {kind(info.st_mode)}, not a regular file")
    return fd


def read_bytes(
    path: str | os.PathLike[str], *, dir_fd: int | None = None, limit: int | None = None
) -> bytes:
    """The contents of the regular file ``path`` (see :func:`open_regular`); a file larger
    than ``limit`` bytes is refused (UnsafePathError) before any of it is read."""
    with os.fdopen(open_regular(path, dir_fd=dir_fd), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if limit is not None and size > limit:
            raise UnsafePathError(
                errno.EFBIG, f"{path} holds {size} bytes, more than the {limit} rltrans reads"
            )
        return f.read() if limit is None else f.read(limit + 1)


def read_text(path: str | os.PathLike[str], *, limit: int | None = None) -> str:
    """The UTF-8 text of the regular file ``path`` (see :func:`read_bytes`)."""
    return read_bytes(path, limit=limit).decode()


def create_new(name: str, *, dir_fd: int | None, mode: int = 0o644) -> int:
    """A write descriptor of a file created anew (never an existing file or a link)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    return os.open(name, flags | getattr(os, "O_BINARY", 0), mode, dir_fd=dir_fd)


def temp_name(target: str) -> str:
    """A unique hidden temporary name for ``target`` that embeds this process's id."""
    return f".{target}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def refuse_special(name: str, *, dir_fd: int | None) -> None:
    """UnsafePathError when ``name`` exists and is not a regular file (a link, a folder, a
    FIFO): a write must not replace what the user put there."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(info.st_mode):
        raise UnsafePathError(
            errno.EEXIST, f"{name} is {kind(info.st_mode)}; rltrans replaces only a regular "
            "file it wrote, never a link or a special file: remove it or choose another name"
        )  # fmt: skip


def fsync_dir(fd: int) -> None:
    """Make renames in the folder open as ``fd`` durable (POSIX)."""
    with contextlib.suppress(OSError):  # some filesystems refuse fsync on folders
        os.fsync(fd)


@contextlib.contextmanager
def writing(
    name: str, *, dir_fd: int, mode: int = 0o644, label: str | None = None
) -> Iterator[IO[bytes]]:
    """A binary file for the block to fill, then atomically renamed onto ``name`` in the
    folder ``dir_fd`` (a reader sees the old or the new file, never half of one). The data
    goes to a new file of a unique name; ``name`` may not be a link or a special file. A write
    the file system refuses raises StorageError naming ``label`` (default ``name``), with
    the temporary file removed and ``name`` as it was."""
    refuse_special(name, dir_fd=dir_fd)
    temp = temp_name(name)
    try:
        fd = create_new(temp, dir_fd=dir_fd, mode=mode)
    except OSError as err:
        raise refused_write(label or name, err) or err from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException as err:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=dir_fd)
        refused = refused_write(label or name, err)
        if refused is None:
            raise
        raise refused from None
    fsync_dir(dir_fd)


def write_atomic(name: str, data: bytes, *, dir_fd: int, mode: int = 0o644) -> None:
    """Write ``data`` to ``name`` in the folder ``dir_fd`` atomically (see :func:`writing`)."""
    with writing(name, dir_fd=dir_fd, mode=mode) as f:
        f.write(data)


def write_file(path: Path, fill: Callable[[IO[bytes]], None], *, folder_link: bool = True) -> None:
    """Write an output file (a plot, a table, a video): its folder is created when missing;
    the file is written atomically through the folder's descriptor and may not be a link or a
    special file. ``folder_link=False``: the folder itself may not be a link either (its
    ancestors may: they are the user's layout, e.g. ``runs -> /scratch/runs``)."""
    try:
        with contextlib.suppress(FileExistsError):  # a link or a file there: refused below
            path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise loop_error(path.parent) from None
        raise refused_write(f"{path} (its folder could not be created)", err) or err from None
    if folder_link:
        fd = os.open(path.parent, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    else:
        fd = open_dir(path.parent)
    try:
        with writing(path.name, dir_fd=fd, label=str(path)) as f:
            fill(f)
    finally:
        os.close(fd)


def _existing_ancestor(folder: Path) -> Path:
    """``folder`` or its nearest ancestor that exists; UnsafePathError for a symbolic link
    loop on the way (the loop itself named) or a file where a folder is expected."""
    found = folder
    for candidate in reversed((folder, *folder.parents)):  # outermost first
        try:
            os.stat(candidate)
        except FileNotFoundError:
            break
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise loop_error(candidate) from None
            if err.errno == errno.ENOTDIR:
                raise UnsafePathError(
                    err.errno, f"{folder} cannot be made: {candidate.parent} is not a folder"
                ) from None
            raise
        found = candidate
    return found


def check_output(path: Path, *, folder_link: bool = True) -> None:
    """Raise now for what :func:`write_file` would refuse at the end of a long command: a link
    or special file at ``path``, a link at its folder (UnsafePathError), a folder this process
    may not write in (StorageError, e.g. a read-only file system)."""
    if not folder_link and os.path.lexists(path.parent):
        os.close(open_dir(path.parent))
    if os.path.isdir(path.parent):
        refuse_special(str(path), dir_fd=None)
    check_writable(path.parent, str(path))


def check_writable(folder: Path, what: str) -> Path:
    """Raise StorageError when ``folder`` (or, while it does not exist, its nearest existing
    ancestor, where it would be created) is not writable by this process, e.g. on a read-only
    file system; ``what`` names what was to be written there. Returns that existing folder."""
    where = _existing_ancestor(folder)
    if os.path.isdir(where) and not os.access(where, os.W_OK):
        code = errno.EROFS if _read_only(where) else errno.EACCES
        raise StorageError(
            code, f"{what} cannot be written: {where} is not writable ({os.strerror(code)}); "
            "choose another place for it"
        )  # fmt: skip
    return where


def free_bytes(folder: Path) -> int | None:
    """Bytes this process may still write on the file system of ``folder`` (None: unknown)."""
    try:
        info = os.statvfs(folder)
    except (OSError, AttributeError):
        return None
    return info.f_bavail * info.f_frsize


def _read_only(folder: Path) -> bool:
    """Whether ``folder`` is on a file system mounted read-only."""
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False
