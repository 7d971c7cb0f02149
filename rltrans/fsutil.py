"""Low-level file access that never leaves a folder and never blocks on a special file.

Writes go through a descriptor of the folder they belong to: a sub-folder is opened with
``O_DIRECTORY | O_NOFOLLOW`` relative to its parent's descriptor, a new file is created
exclusively under a unique temporary name and renamed into place, so a symbolic link swapped
in for a folder or a file is refused (:class:`UnsafePathError`) instead of followed. Reads
open a file with ``O_NONBLOCK`` and require a regular file, so a FIFO, socket or device where
a checkpoint or a config is expected is refused instead of blocking the reader forever.

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


class UnsafePathError(OSError):
    """A path rltrans reads or writes is a symbolic link, a special file (FIFO, socket,
    device) or otherwise not the plain file or folder expected; the message is one line."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


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
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o755, dir_fd=dir_fd)
    try:
        return os.open(path, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            raise
        info = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
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
    info = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow)
    if not stat.S_ISREG(info.st_mode):
        raise UnsafePathError(
            errno.EINVAL, f"{path} is {kind(info.st_mode)}, not a regular file; rltrans reads "
            "checkpoints, configs and event files only from regular files"
        )  # fmt: skip
    flags = os.O_RDONLY | _NONBLOCK | _CLOEXEC | (0 if follow else _NOFOLLOW)
    fd = os.open(path, flags, dir_fd=dir_fd)
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
def writing(name: str, *, dir_fd: int, mode: int = 0o644) -> Iterator[IO[bytes]]:
    """A binary file for the block to fill, then atomically renamed onto ``name`` in the
    folder ``dir_fd`` (a reader sees the old or the new file, never half of one). The data
    goes to a new file of a unique name; ``name`` may not be a link or a special file."""
    refuse_special(name, dir_fd=dir_fd)
    temp = temp_name(name)
    fd = create_new(temp, dir_fd=dir_fd, mode=mode)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=dir_fd)
        raise
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
    with contextlib.suppress(FileExistsError):  # a link or a file there: refused below
        path.parent.mkdir(parents=True, exist_ok=True)
    if folder_link:
        fd = os.open(path.parent, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    else:
        fd = open_dir(path.parent)
    try:
        with writing(path.name, dir_fd=fd) as f:
            fill(f)
    finally:
        os.close(fd)


def check_output(path: Path, *, folder_link: bool = True) -> None:
    """Raise UnsafePathError now for what :func:`write_file` would refuse at the end of a long
    command (a link or special file at ``path``, a link at its folder)."""
    if not folder_link and os.path.lexists(path.parent):
        os.close(open_dir(path.parent))
    if os.path.isdir(path.parent):
        refuse_special(str(path), dir_fd=None)
