"""Checkpoints: atomic save, safe load, rotation, RNG capture and compatibility checks.

A checkpoint is a plain dict that `torch.load(weights_only=True)` can read back:
tensors, state_dicts and Python containers of str/int/float/bool/None. Nothing
is ever unpickled beyond that, so loading a downloaded checkpoint cannot run code.

Example:
    >>> manager = CheckpointManager("runs/x/checkpoints", keep_last=3)
    >>> manager.save(step, {"model": model.state_dict(), "rng": rng_state()})  # rltrans.run.rng
    >>> payload = manager.load_latest()  # None on a fresh run
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import shutil
import warnings
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from rltrans import fsutil
from rltrans.fsutil import StorageError, UnsafePathError
from rltrans.spaces import SpaceMismatchError
from rltrans.version import __version__

# Bump when the payload layout changes incompatibly; load refuses newer versions.
FORMAT_VERSION = 2  # 2: spaces stored once, as exact JSON (format 1 checkpoints still load)

_STEP_RE = re.compile(r"^step_(\d+)\.pt$")
# Temp names embed the writer's pid so a cleanup never deletes a live writer's file.
_TEMP_RE = re.compile(r"^\.(?P<target>.+)\.(?P<pid>\d+)\.[^.]+\.tmp$")
# Exact types that torch's weights_only unpickler accepts (checked against torch 2.x).
_PLAIN_TYPES = (type(None), bool, int, float, complex, str, bytes, bytearray)
_LEAF_TYPES = (*_PLAIN_TYPES, torch.dtype, torch.device, torch.Size)
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


class CheckpointError(RuntimeError):
    """A checkpoint file is missing parts, corrupt, unsafe or not an rltrans checkpoint."""


class CheckpointVersionError(CheckpointError):
    """A checkpoint was written by a newer, incompatible checkpoint format."""


# A checkpoint trained on other spaces than the env at hand (the name callers catch).
CheckpointMismatchError = SpaceMismatchError


# ----------------------------------------------------------------------------- validation


def _fix_hint(value: Any) -> str:
    """Say how to turn a value that weights_only refuses into one it accepts."""
    module = type(value).__module__ or ""
    if module.startswith("omegaconf"):
        return "convert it with OmegaConf.to_container(cfg, resolve=True)"
    if isinstance(value, np.ndarray):
        return "convert it with torch.from_numpy(x) or x.tolist()"
    if isinstance(value, np.generic):
        return "convert it with float(x), int(x) or x.item()"
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return "convert the namedtuple with ._asdict()"
    if isinstance(value, os.PathLike):
        return "store str(path)"
    if isinstance(value, torch.Tensor):
        return "store a plain tensor (x.as_subclass(torch.Tensor))"
    return "store tensors, state_dicts or plain str/int/float/bool/None containers"


def _find_unsafe(value: Any, path: str, on_path: set[int], found: list[str]) -> None:
    """Append 'path: problem' for every value below `value` that weights_only would refuse."""
    kind = type(value)
    if kind in _LEAF_TYPES or kind in _TENSOR_TYPES:
        return
    if kind not in (dict, OrderedDict, list, tuple, set):
        found.append(f"{path}: {kind.__module__}.{kind.__qualname__} ({_fix_hint(value)})")
        return
    if id(value) in on_path:
        found.append(f"{path}: refers to itself (cyclic container)")
        return
    on_path.add(id(value))
    if kind in (dict, OrderedDict):
        for key, item in value.items():
            key_path = f"{path}[{key!r}]"
            if type(key) not in _LEAF_TYPES and type(key) is not tuple:
                found.append(f"{key_path}: key of type {type(key).__qualname__} ({_fix_hint(key)})")
            _find_unsafe(item, key_path, on_path, found)
    else:
        for index, item in enumerate(value):
            _find_unsafe(item, f"{path}[{index}]", on_path, found)
    on_path.discard(id(value))


def validate_payload(payload: dict[str, Any]) -> None:
    """Raise TypeError naming each key path that `torch.load(weights_only=True)` would refuse."""
    if not isinstance(payload, dict):
        raise TypeError(f"checkpoint payload must be a dict, got {type(payload).__qualname__}")
    found: list[str] = []
    _find_unsafe(payload, "payload", set(), found)
    if found:
        shown = "\n  ".join(found[:10])
        more = f"\n  ... and {len(found) - 10} more" if len(found) > 10 else ""
        raise TypeError(
            "checkpoint payload holds values that torch.load(weights_only=True) cannot read "
            f"back:\n  {shown}{more}"
        )


def check_finite_weights(model: Any, source: str) -> None:
    """Refuse a state dict holding a NaN or infinite value, naming the first such tensor (a
    policy of NaN weights acts, but every action it takes is the same meaningless one)."""
    if not isinstance(model, dict):
        return  # the loader names a missing or malformed state dict
    for name, tensor in model.items():
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            continue
        if not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise CheckpointError(
                f"{source}: weight {name!r} holds {bad} non-finite value(s) (NaN or inf); "
                f"the run that wrote it diverged: use an earlier checkpoint"
            )


# ----------------------------------------------------------------------------- atomic save


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0 only checks existence
    except ProcessLookupError:
        return False
    except OSError:
        pass  # exists but is not ours, or we cannot tell: leave its files alone
    return True


def _remove_stale_temps(dir_fd: int) -> None:
    """Delete temp files left by writers that were killed mid-save (their pid is gone)."""
    for name in os.listdir(dir_fd):
        match = _TEMP_RE.match(name)
        if match and not _pid_alive(int(match["pid"])):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dir_fd)


def _unsafe(err: UnsafePathError) -> CheckpointError:
    """The one-line CheckpointError for a link or a special file in a checkpoint's place."""
    return CheckpointError(str(err))


def _save_into(dir_fd: int, name: str, payload: dict[str, Any], label: str) -> None:
    """Validate ``payload`` and write it with the format keys to ``name`` in the folder
    ``dir_fd``, atomically, never through a link (see :func:`rltrans.fsutil.writing`); a
    refused write (a full disk) is a StorageError naming ``label``, the old file intact."""
    validate_payload(payload)
    full = {**payload, "format_version": FORMAT_VERSION, "rltrans_version": __version__}
    try:
        # os.replace is atomic on POSIX and Windows: readers see the old or the new file.
        with fsutil.writing(name, dir_fd=dir_fd, mode=0o600, label=f"checkpoint {label}") as f:
            torch.save(full, f)
    except UnsafePathError as err:
        raise _unsafe(err) from None


def save_checkpoint(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Atomically write `payload` plus `format_version` and `rltrans_version` keys to `path`.

    A crash or SIGKILL at any moment leaves either the previous file or the new
    complete one. Raises TypeError naming the key path of anything that
    `torch.load(weights_only=True)` could not read back, and CheckpointError when `path`
    is a link or a special file (it is never written through); StorageError (an OSError) when
    the file system refuses the write (a full disk), leaving the file at ``path`` as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        _save_into(fd, path.name, payload, str(path))
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- safe load


def _missing_message(path: Path) -> str:
    if not path.parent.is_dir():
        return f"checkpoint {path} does not exist (directory {path.parent} does not exist either)"
    found = sorted(p.name for p in path.parent.glob("*.pt"))
    if not found:
        return f"checkpoint {path} does not exist (no *.pt files in {path.parent})"
    shown = ", ".join(found[-10:])
    more = f" (newest 10 of {len(found)})" if len(found) > 10 else ""
    return f"checkpoint {path} does not exist; checkpoints in {path.parent}{more}: {shown}"


def _open_checkpoint(path: Path) -> BinaryIO:
    """The checkpoint file, opened for reading after the structural checks of
    :func:`verify_checkpoint_file` (positioned at its start)."""
    if not os.path.lexists(path):
        raise FileNotFoundError(_missing_message(path))
    if path.is_dir():
        raise IsADirectoryError(
            f"{path} is a directory; pass a checkpoint file such as {path / 'last.pt'} "
            f"or use CheckpointManager({str(path)!r}).load_latest()"
        )
    try:
        f = os.fdopen(fsutil.open_regular(path), "rb")
    except FileNotFoundError:  # a dangling link, or pruned meanwhile
        raise FileNotFoundError(_missing_message(path)) from None
    except UnsafePathError as err:
        raise _unsafe(err) from None
    try:
        _check_archive(f, path)
        f.seek(0)
    except BaseException:
        f.close()
        raise
    return f


def _check_archive(f: BinaryIO, path: Path) -> None:
    """A torch zip archive with a pickle record whose members are stored as torch.save
    stores them: uncompressed, together no larger than the file (a compressed member could
    expand a small file into gigabytes in memory)."""
    size = os.fstat(f.fileno()).st_size
    try:
        with zipfile.ZipFile(f) as archive:
            members = archive.infolist()
    except PermissionError:
        raise  # unreadable is not corrupt
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise CheckpointError(
            f"{path} is corrupt or truncated, or not an rltrans checkpoint "
            f"(not a readable torch zip archive: {e})"
        ) from e
    if not any(m.filename.endswith("/data.pkl") for m in members):
        raise CheckpointError(f"{path} is a zip file but not an rltrans checkpoint (no data.pkl)")
    packed = [m.filename for m in members if m.compress_type != zipfile.ZIP_STORED]
    if packed:
        raise CheckpointError(
            f"refusing to load {path}: member {packed[0]} is compressed, which torch.save never "
            f"writes (it stores members uncompressed); not an rltrans checkpoint"
        )
    total = sum(m.file_size for m in members)
    if total > size:
        raise CheckpointError(
            f"refusing to load {path}: its members claim {total} bytes in a file of {size} "
            f"bytes; corrupt, or not an rltrans checkpoint"
        )


def verify_checkpoint_file(path: str | os.PathLike[str]) -> None:
    """Cheap structural check (torch zip archive with a pickle record) without loading tensors.

    Raises FileNotFoundError or CheckpointError. A truncated file fails here because
    the zip central directory is written last; a FIFO, socket or device in the checkpoint's
    place is refused without being opened for a blocking read.
    """
    _open_checkpoint(Path(path)).close()


def _mmap_name(f: BinaryIO, path: Path) -> str:
    """A name torch.load(mmap=True) opens as the very file ``f`` (Linux: /proc/self/fd)."""
    own = f"/proc/self/fd/{f.fileno()}"
    return own if os.path.exists(own) else str(path)


def load_checkpoint(
    path: str | os.PathLike[str],
    map_location: str | torch.device | None = "cpu",
    mmap: bool = False,
) -> dict[str, Any]:
    """Load a checkpoint with `torch.load(weights_only=True)`; never unpickles arbitrary objects.
    ``mmap``: map the tensors from the file instead of reading them (for a look at its config).

    Raises FileNotFoundError (listing the checkpoints next to `path`), CheckpointError
    for corrupt, truncated, unsafe or foreign files (and special files: a FIFO never blocks
    the load), and CheckpointVersionError for a checkpoint written by a newer format.
    """
    path = Path(path)
    with _open_checkpoint(path) as f:
        source: Any = _mmap_name(f, path) if mmap else f
        try:
            payload = torch.load(source, map_location=map_location, weights_only=True, mmap=mmap)
        except pickle.UnpicklingError as e:
            unsafe = re.search(r"GLOBAL ([\w.]+)", str(e))
            if unsafe:
                raise CheckpointError(
                    f"refusing to load {path}: it contains a pickled object of type {unsafe[1]}, "
                    "which torch.load(weights_only=True) does not allow. rltrans never unpickles "
                    "arbitrary objects (that could run code); it is not an rltrans checkpoint."
                ) from None
            raise CheckpointError(f"{path} is corrupt (unreadable pickle data: {e})") from e
        except PermissionError:
            raise
        except (RuntimeError, EOFError, ValueError, OSError, KeyError) as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise CheckpointError(f"{path} is corrupt or truncated ({first})") from e
    if not isinstance(payload, dict) or "format_version" not in payload:
        raise CheckpointError(
            f"{path} is a torch file but not an rltrans checkpoint (no format_version field)"
        )
    version = payload["format_version"]
    if not isinstance(version, int) or version < 1:
        raise CheckpointError(f"{path} has an invalid format_version {version!r}")
    if version > FORMAT_VERSION:
        raise CheckpointVersionError(
            f"{path} uses checkpoint format version {version} (written by rltrans "
            f"{payload.get('rltrans_version', 'unknown')}); this rltrans ({__version__}) "
            f"reads versions up to {FORMAT_VERSION}. Upgrade rltrans to load it."
        )
    return payload


# ----------------------------------------------------------------------------- rotation


def _steps(names: list[str]) -> list[tuple[int, str]]:
    """(step, name) of the step checkpoints among ``names``, oldest step first."""
    return sorted((int(m[1]), name) for name in names if (m := _STEP_RE.match(name)))


class CheckpointManager:
    """Rotating checkpoints `step_{step:012d}.pt` plus `last.pt` in one directory.

    `last.pt` is a hard link (a copy where links are unsupported) swapped in
    atomically, so it is always a complete checkpoint. One writer per directory;
    readers (e.g. an evaluator polling `latest()`) may run alongside it.

    Example:
        >>> manager = CheckpointManager(run_dir / "checkpoints", keep_last=3)
        >>> manager.save(global_step, payload)
        >>> resumed = manager.load_latest()
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        keep_last: int = 3,
        *,
        parent_fd: int | None = None,
    ) -> None:
        """``parent_fd``: a descriptor of the folder holding ``directory`` (a run folder); every
        save then reaches ``directory`` through it, so no link anywhere on the path is followed.
        Without it only ``directory`` itself may not be a link."""
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.parent_fd = parent_fd
        self._warned_future = False

    @property
    def last_path(self) -> Path:
        """Path of the `last.pt` pointer file."""
        return self.directory / "last.pt"

    def step_path(self, step: int) -> Path:
        """Path of the checkpoint file for `step`."""
        return self.directory / f"step_{step:012d}.pt"

    def checkpoints(self) -> list[tuple[int, Path]]:
        """All step checkpoints as (step, path), oldest step first."""
        if not self.directory.is_dir():
            return []
        return [(step, self.directory / name) for step, name in _steps(os.listdir(self.directory))]

    def _open(self) -> int:
        """The checkpoint folder, created when missing, opened anew for each save without
        following links: a folder swapped for a link mid-run is refused, not written through."""
        try:
            if self.parent_fd is not None:
                return fsutil.open_dir(self.directory.name, dir_fd=self.parent_fd, create=True)
            self.directory.parent.mkdir(parents=True, exist_ok=True)
            return fsutil.open_dir(self.directory, create=True)
        except UnsafePathError as err:
            raise CheckpointError(f"checkpoint folder {self.directory}: {err.strerror}") from None

    def save(self, step: int, payload: dict[str, Any]) -> Path:
        """Write the step checkpoint, point `last.pt` at it, prune old ones; return its path.
        A write the file system refuses (a full disk) raises StorageError; the checkpoints saved
        before stay intact (nothing is pruned)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        path = self.step_path(step)
        try:
            fd = self._open()
            try:
                _remove_stale_temps(fd)
                _save_into(fd, path.name, payload, str(path))
                self._point_last_at(fd, path.name)
                self._prune(fd, keep=path.name, step=step)
            finally:
                os.close(fd)
        except OSError as err:  # the folder, the step file, or last.pt's link or copy
            refused = fsutil.refused_write(f"checkpoint {path}", err)
            if refused is None:
                raise
            raise StorageError(
                refused.errno, f"{refused} (those saved before are intact)"
            ) from None
        return path

    def _point_last_at(self, fd: int, name: str) -> None:
        temp = fsutil.temp_name(self.last_path.name)
        try:
            os.link(name, temp, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
        except OSError:
            # Filesystems without hard links (some FUSE/SMB mounts): copy instead.
            with (
                fsutil.writing(temp, dir_fd=fd, mode=0o600) as dst,  # a failed copy: removed
                os.fdopen(fsutil.open_regular(name, dir_fd=fd, follow=False), "rb") as src,
            ):
                shutil.copyfileobj(src, dst)
        try:
            # Replaces a link at last.pt itself; never writes into what it points to.
            os.replace(temp, self.last_path.name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp, dir_fd=fd)
            raise
        fsutil.fsync_dir(fd)

    def _prune(self, fd: int, keep: str, step: int) -> None:
        existing = _steps(os.listdir(fd))
        newer = [name for s, name in existing if s > step]
        if newer and not self._warned_future:
            # Resuming from an older checkpoint leaves the abandoned later ones behind.
            warnings.warn(
                f"{self.directory} holds checkpoints from later steps than the one just saved "
                f"({keep}), e.g. {newer[-1]}; last.pt points at the new one",
                stacklevel=3,
            )
            self._warned_future = True
        # Keep the newest `keep_last` by step, and always the file just written.
        for _, old in existing[: max(len(existing) - self.keep_last, 0)]:
            if old != keep:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(old, dir_fd=fd)

    def _candidates(self) -> list[Path]:
        # last.pt is the explicit pointer to the most recent save; step files are fallbacks.
        step_files = [p for _, p in reversed(self.checkpoints())]
        return [self.last_path, *step_files] if self.last_path.exists() else step_files

    def latest(self) -> Path | None:
        """The newest complete checkpoint (`last.pt`, else the newest intact step file), or None."""
        for candidate in self._candidates():
            try:
                verify_checkpoint_file(candidate)
            except (CheckpointError, FileNotFoundError):
                continue
            return candidate
        return None

    def newest_in_words(self) -> str | None:
        """The newest complete checkpoint in words: its step file (``= last.pt`` when that is
        the same file), else :meth:`latest`; None when there is none."""
        latest = self.latest()
        if latest is not None and latest == self.last_path:  # a hard link to a step file
            with contextlib.suppress(OSError):
                mine = os.stat(latest)
                for _, path in reversed(self.checkpoints()):
                    if os.path.samestat(mine, os.stat(path)):
                        return f"{path} (= last.pt)"
        return None if latest is None else str(latest)

    def load_latest(self, map_location: str | torch.device | None = "cpu") -> dict[str, Any] | None:
        """Load the newest loadable checkpoint (damaged ones skipped with a warning), or None."""
        for candidate in self._candidates():
            try:
                return load_checkpoint(candidate, map_location=map_location)
            except FileNotFoundError:
                continue  # pruned by a concurrent writer between listing and loading
            except CheckpointVersionError:
                raise  # a newer format will not get better by falling back silently
            except CheckpointError as e:
                warnings.warn(f"skipping damaged checkpoint: {e}", stacklevel=2)
        return None
