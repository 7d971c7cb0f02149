"""The run folder on disk: which folder a run may take, its lock, and how it is written.

Rules (what ``run_dir=`` may be):

- a new path (created, with a marker file :data:`MARKER_FILE`), an empty folder, or a folder
  rltrans created before (it holds the marker; older runs without one are recognised by
  holding nothing but rltrans's own entries, with ``checkpoints/`` beside any
  ``config.yaml``). Any other folder is refused with the entry that is not rltrans's, and is
  left exactly as it was: no lock file, no config written;
- ``run_dir`` itself may not be a symbolic link, nor may anything rltrans writes inside it
  (``.lock``, ``config.yaml``, ``checkpoints/``, ``tb/``, ``videos/``). Its ancestors may be:
  they are the user's own layout (``runs -> /scratch/runs``, ``/tmp`` on macOS), chosen
  before the run, and the run folder is opened once, so a link swapped in above it later
  changes nothing;
- every write goes through a descriptor of the run folder, opened without following links
  (:mod:`rltrans.fsutil`): a link swapped in for a sub-folder mid-run is refused, never
  followed, and a FIFO or a device where a file is expected is refused, never opened for a
  blocking read.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rltrans import fsutil
from rltrans.config import ConfigError
from rltrans.config.frozen import thaw
from rltrans.fsutil import UnsafePathError

CONFIG_FILE = "config.yaml"
LOCK_FILE = ".lock"
MARKER_FILE = ".rltrans-run"
# What a run writes in its folder: none of them may be a link (a write would leave the folder).
RUN_ENTRIES = (LOCK_FILE, CONFIG_FILE, "checkpoints", "tb", "videos")
FOLDERS = ("checkpoints", "tb", "videos")
# Temp files of an interrupted config write: this version's and older versions' fixed name.
_OWN_TEMP = re.compile(r"^(\.config\.yaml\.\d+\.[0-9a-f]+\.tmp|config\.yaml\.tmp)$")


def _refused(run_dir: Path, what: str) -> ConfigError:
    return ConfigError(
        f"run folder {run_dir}: {what}; rltrans writes only inside its run folder and never "
        f"through links: remove it or choose another run_dir"
    )


def open_run_dir(run_dir: Path) -> int:
    """A descriptor of the existing run folder, which may not be a link (ConfigError)."""
    try:
        return fsutil.open_dir(run_dir)
    except UnsafePathError:
        raise _refused(run_dir, "run_dir is a symbolic link (or not a folder)") from None


def check_entries(run_dir: Path, dir_fd: int) -> None:
    """Raise ConfigError when an entry a run writes in its folder is a symbolic link, or is not
    the kind of file expected there (a FIFO for config.yaml, a file for checkpoints/)."""
    for name in (*RUN_ENTRIES, MARKER_FILE):
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(mode):
            raise _refused(run_dir, f"{name} is a symbolic link")
        expect = stat.S_ISDIR if name in FOLDERS else stat.S_ISREG
        if not expect(mode):
            wanted = "a folder" if name in FOLDERS else "a regular file"
            raise _refused(run_dir, f"{name} is {fsutil.kind(mode)}, not {wanted}")


def refuse_links(run_dir: Path) -> None:
    """Raise ConfigError when the run folder, or an entry a run writes in it, is a link or a
    special file (nothing to check while the folder does not exist)."""
    if not os.path.lexists(run_dir):
        return
    fd = open_run_dir(run_dir)
    try:
        check_entries(run_dir, fd)
    finally:
        os.close(fd)


def check_claimable(run_dir: Path, dir_fd: int) -> None:
    """Raise ConfigError unless the existing folder is empty or one rltrans created: it holds
    the marker, or (a run of an older rltrans) only rltrans's own entries, with checkpoints/
    beside a config.yaml (a config.yaml alone is the user's, and is never overwritten)."""
    names = sorted(os.listdir(dir_fd))
    if MARKER_FILE in names:
        return
    own = (*RUN_ENTRIES, MARKER_FILE)
    foreign = [n for n in names if n not in own and not _OWN_TEMP.match(n)]
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise ConfigError(
            f"run_dir={run_dir} is a folder rltrans did not create: it holds {foreign[0]!r}"
            f"{more}; a run folder must be new, empty, or a run folder of rltrans (nothing in "
            f"it was changed): choose another run_dir"
        )
    if CONFIG_FILE in names and "checkpoints" not in names:
        raise ConfigError(
            f"run_dir={run_dir} holds a config.yaml but no checkpoints/ and no {MARKER_FILE} "
            f"marker: not a run folder of rltrans, and rltrans never overwrites a config.yaml "
            f"it did not write (nothing in it was changed): choose another run_dir"
        )


def make_run_dir(run_dir: Path) -> bool:
    """Create the run folder (and its parents); True when this call created the folder
    itself, so that only then is it ever removed again."""
    if os.path.islink(run_dir):
        raise _refused(run_dir, "run_dir is a symbolic link")
    try:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        why = _blocked(run_dir, err)
        raise ConfigError(f"run_dir={run_dir}: cannot create it ({why})") from None
    try:
        os.mkdir(run_dir)
        return True
    except FileExistsError:
        if os.path.islink(run_dir):
            raise _refused(run_dir, "run_dir is a symbolic link") from None
        if not run_dir.is_dir():
            raise ConfigError(f"run_dir={run_dir} is a file, not a folder") from None
        return False
    except OSError as err:
        why = _blocked(run_dir, err)
        raise ConfigError(f"run_dir={run_dir}: cannot create it ({why})") from None


def _blocked(run_dir: Path, err: OSError) -> str:
    """Why a folder could not be made: an ancestor that is a link loop, a link to nothing or
    a file is named (mkdir says only "File exists"), else the OS's reason."""
    for parent in reversed(run_dir.parents):  # outermost first
        if os.path.lexists(parent) and not parent.is_dir():
            if os.path.islink(parent):
                return f"{parent} is a symbolic link to no folder (a loop or a dangling link)"
            return f"{parent} is {fsutil.kind(os.lstat(parent).st_mode)}, not a folder"
    return err.strerror or str(err)


def missing_parents(run_dir: Path) -> list[Path]:
    """The ancestors of ``run_dir`` that do not exist yet, deepest first (what
    :func:`make_run_dir` creates besides the folder)."""
    return [p for p in run_dir.parents if not os.path.lexists(p)]


def remove_empty(folders: list[Path]) -> None:
    """Remove each folder that is empty, in order (deepest first): what a failed start made."""
    for folder in folders:
        with contextlib.suppress(OSError):  # not empty: another process wrote there meanwhile
            os.rmdir(folder)


def mark(dir_fd: int) -> None:
    """Write the marker that says rltrans created this run folder (kept when present)."""
    with contextlib.suppress(FileExistsError):
        os.close(fsutil.create_new(MARKER_FILE, dir_fd=dir_fd))


class RunFolderLock:
    """One writer per run folder: an exclusive ``flock`` on ``<run_dir>/.lock``, held for the
    run's lifetime. The OS drops it when the holder exits or is killed, so a dead owner's lock
    is taken over without any stale-lock cleanup."""

    def __init__(self, run_dir: Path, dir_fd: int | None = None) -> None:
        """``dir_fd``: a descriptor of ``run_dir`` to open the lock file through."""
        self.path = run_dir / LOCK_FILE
        self._dir_fd = dir_fd
        self._fd: int | None = None
        self.created = False  # this process created the lock file (a refusal removes it)

    def _name(self) -> str:
        return LOCK_FILE if self._dir_fd is not None else str(self.path)

    def acquire(self) -> None:
        """Take the lock or raise ConfigError naming the process that holds it. The lock file
        is opened without following links and must be a plain file of this folder alone (a
        link to a file elsewhere would be truncated)."""
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            try:
                fd = os.open(self._name(), flags | os.O_EXCL, 0o644, dir_fd=self._dir_fd)
                self.created = True
            except FileExistsError:
                fd = os.open(self._name(), flags, 0o644, dir_fd=self._dir_fd)
        except OSError as err:
            if err.errno in fsutil.STORAGE_ERRNOS:  # read-only, not permitted, full
                raise fsutil.StorageError(
                    err.errno,
                    f"run folder {self.path.parent} is not writable: cannot create "
                    f"its lock file {self.path} ({err.strerror}); a run writes its lock, config "
                    f"and checkpoints there: make it writable or choose another run_dir",
                ) from None
            raise ConfigError(
                f"run folder {self.path.parent}: cannot open {self.path} "
                f"({err.strerror}); it must be a plain file, not a link"
            ) from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            os.close(fd)
            raise ConfigError(
                f"run folder {self.path.parent}: {self.path} is not a plain file of its own "
                f"(a link or a special file); remove it or choose another run_dir"
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ConfigError(
                f"run folder {self.path.parent} is in use by a running process (pid {holder}); "
                f"wait for it to finish or choose another run_dir"
            ) from None
        if not self._still_ours(fd):  # removed or replaced between the open and the flock
            os.close(fd)
            raise ConfigError(
                f"run folder {self.path.parent} is in use: its lock file changed while this "
                f"process took it; wait for the other run to finish or choose another run_dir"
            )
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError as err:  # a full disk: no lock file of this process stays behind
            self._fd = fd
            self.release(remove=self.created)
            refused = fsutil.refused_write(f"the lock file {self.path} of the run folder", err)
            raise refused or err from None
        self._fd = fd

    def _still_ours(self, fd: int) -> bool:
        try:
            entry = os.stat(self._name(), dir_fd=self._dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (entry.st_dev, entry.st_ino) == (mine.st_dev, mine.st_ino)

    def release(self, remove: bool = False) -> None:
        """Drop the lock (also dropped by the OS at exit); ``remove``: delete the lock file
        first, while still holding it (a refused folder is left as it was found)."""
        if self._fd is None:
            return
        if remove and self._still_ours(self._fd):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._name(), dir_fd=self._dir_fd)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def remove_created(run_dir: Path, dir_fd: int, lock: RunFolderLock) -> None:
    """Delete a folder this process created, while still holding its lock (so no other run
    can have started in it), then release the lock and remove the folder itself."""
    for name in os.listdir(dir_fd):
        if name == LOCK_FILE:
            continue
        if stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            shutil.rmtree(run_dir / name, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dir_fd)
    lock.release(remove=True)
    with contextlib.suppress(OSError):  # not empty: another process wrote there meanwhile
        os.rmdir(run_dir)


def save_config(config: Mapping[str, Any], dir_fd: int) -> None:
    """Write the run's config.yaml atomically (a reader never sees half a file) through a temp
    file of a unique name created anew (never an existing file or link)."""
    text = OmegaConf.to_yaml(OmegaConf.create(thaw(config))).encode()
    label = str(Path(config["run_dir"]) / CONFIG_FILE) if config.get("run_dir") else CONFIG_FILE
    try:
        with fsutil.writing(CONFIG_FILE, dir_fd=dir_fd, mode=0o600, label=label) as f:
            f.write(text)
    except UnsafePathError as err:
        raise ConfigError(f"run folder: {err.strerror}") from None


def remove_for_overwrite(run_dir: Path, dir_fd: int) -> None:
    """overwrite=true: delete the old run's checkpoints, events and config (checked first to
    be real folders and files of this folder, not links)."""
    check_entries(run_dir, dir_fd)
    for name in ("checkpoints", "tb", CONFIG_FILE):
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(mode):
            shutil.rmtree(run_dir / name)
        else:
            os.unlink(name, dir_fd=dir_fd)
