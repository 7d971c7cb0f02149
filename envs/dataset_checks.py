"""Checks every offline reader (Minari, DQN Replay) makes of the values and sizes in its files.

Values: rewards and float observations finite, Discrete actions whole numbers inside the
space, Box actions finite. Each check is a few vectorised NumPy passes over one array, so a
million-step file costs milliseconds. Sizes: what a file declares (an .npy header's shape, an
HDF5 dataset's shape) is compared with the bytes the file can hold and with this machine's
memory before anything of that size is allocated.

Every refusal is a :class:`rltrans.envs.offline.DatasetError` whose one line names the
dataset or file, the field, the position and the bad value.
"""

from __future__ import annotations

import os
import zlib
from typing import IO, Any

import gymnasium as gym
import numpy as np

from rltrans.envs.offline import DatasetError

__all__ = [
    "DEFLATE_MAX_RATIO",
    "check_actions",
    "check_finite",
    "check_fits_memory",
    "check_returns",
    "first_line",
    "gib",
    "read_npy_header",
]

# Deflate (gzip, zlib, HDF5's gzip filter) never expands a stream by more than 1032:1 (a
# 258-byte match per 2 bits), so a compressed file of S bytes holds at most this many x S.
DEFLATE_MAX_RATIO = 1032
# Headers, block overhead: what a tiny file may hold beyond the ratio.
SIZE_SLACK = 2**16
FLOAT32_MAX = float(np.finfo(np.float32).max)


def gib(n: float) -> str:
    """A byte count for people: 65.7 GiB, 32.0 KiB."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def first_line(err: BaseException) -> str:
    """An exception's first line of text (its type's name when it has none)."""
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else type(err).__name__


def _position(bad: np.ndarray) -> tuple[tuple[int, ...], int]:
    """The index of the first True of ``bad`` and how many there are."""
    flat = np.flatnonzero(bad.reshape(-1))
    return tuple(int(i) for i in np.unravel_index(int(flat[0]), bad.shape)), len(flat)


def _at(field: str, index: tuple[int, ...]) -> str:
    return f"{field}[{', '.join(map(str, index))}]"


def _refuse(where: str, field: str, array: np.ndarray, bad: np.ndarray, rule: str) -> None:
    index, count = _position(bad)
    more = f" (and {count - 1} more)" if count > 1 else ""
    value = array[index].item()  # a Python number: prints as -3 or nan, not np.int32(-3)
    raise DatasetError(f"{where}: {_at(field, index)} is {value!r}{more}; {rule}")


def check_finite(array: np.ndarray, where: str, field: str) -> None:
    """Refuse a NaN or infinite entry of a float array, or one float32 cannot hold (training
    works in float32); integer arrays always pass."""
    if array.dtype.kind not in "fc" or array.size == 0:
        return
    bad = ~(np.abs(array) <= FLOAT32_MAX)  # NaN compares False: one pass finds all three
    if bad.any():
        _refuse(where, field, array, bad, f"{field} must be finite float32 numbers")


def check_returns(rewards: np.ndarray, where: str) -> None:
    """Refuse rewards whose returns-to-go overflow float32 (each finite, their sum not)."""
    total = float(np.abs(rewards).sum(dtype=np.float64))
    if total > FLOAT32_MAX:
        raise DatasetError(
            f"{where}: rewards sum to {total:.3g} in absolute value; returns-to-go beyond "
            f"{FLOAT32_MAX:.3g} overflow float32"
        )


def check_actions(actions: np.ndarray, space: gym.Space, where: str) -> None:
    """Refuse actions the space does not hold: a Discrete action that is not a whole number
    in ``start .. start + n - 1``, a Box action that is NaN or infinite or of another shape.

    Box actions outside the bounds are kept: recorded data overshoots its bounds by rounding,
    and the action head's loss stays finite on them.
    """
    if actions.size == 0:
        return
    if isinstance(space, gym.spaces.Discrete):
        lo, hi = int(space.start), int(space.start) + int(space.n) - 1
        rule = f"{space} holds the whole numbers {lo}..{hi}"
        if actions.dtype.kind not in "biuf":
            raise DatasetError(f"{where}: actions have dtype {actions.dtype}; {rule}")
        if actions.ndim != 1:
            raise DatasetError(f"{where}: actions have shape {actions.shape}, expected (T,)")
        if actions.dtype.kind == "f":
            bad = ~np.isfinite(actions) | (actions != np.round(actions))
            if bad.any():
                _refuse(where, "actions", actions, bad, rule)
        bad = (actions < lo) | (actions > hi)
        if bad.any():
            _refuse(where, "actions", actions, bad, rule)
    elif isinstance(space, gym.spaces.Box):
        if actions.shape[1:] != space.shape:
            raise DatasetError(
                f"{where}: actions have shape {actions.shape}, expected (T, "
                f"{', '.join(map(str, space.shape))}) for {space}"
            )
        check_finite(actions, where, "actions")


def physical_memory() -> int | None:
    """This machine's RAM in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits_memory(declared: int, where: str) -> None:
    """Refuse data whose declared size exceeds this machine's RAM (readers hold it all)."""
    ram = physical_memory()
    if ram is not None and declared > ram:
        raise DatasetError(
            f"{where}: the files declare {gib(declared)} of arrays, more than this machine's "
            f"{gib(ram)} of memory; load fewer epochs or use a larger machine"
        )


def read_npy_header(f: IO[bytes], path: Any) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype an .npy stream declares, read without reading its data.

    The stream is left just after the header. A header np.load would refuse (a bad magic,
    a Python object it will not evaluate, a Fortran-ordered array) is a DatasetError.
    """
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(f)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = fmt.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy format version {version}")
    except (ValueError, SyntaxError, TypeError, EOFError, OSError, zlib.error) as err:
        raise DatasetError(f"{path}: not a readable .npy array ({first_line(err)})") from None
    if fortran and len(shape) > 1:
        raise DatasetError(f"{path}: a Fortran-ordered array, which np.save never writes here")
    return tuple(int(n) for n in shape), np.dtype(dtype)
