"""What a local Minari dataset's files declare, checked before Minari reads them.

``minari.load_dataset`` allocates from the metadata before it reads any episode: an index
array of ``total_episodes`` entries (10^9 of them are 8 GB); reading an episode then
allocates every HDF5 array at the shape its header declares, whatever the file stores. So
the metadata's episode count is compared with the data file first, and each episode's
arrays with the bytes the file holds for them, then their sum with this machine's memory.
Each check reads headers only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import h5py

from rltrans.envs.dataset_checks import (
    DEFLATE_MAX_RATIO,
    SIZE_SLACK,
    check_fits_memory,
    gib,
)
from rltrans.envs.offline import DatasetError

__all__ = ["HDF5_FILE", "check_minari_files"]

HDF5_FILE = "main_data.hdf5"  # Minari's HDF5 storage keeps every episode in this one file
STEP_FIELDS = ("actions", "rewards", "terminations", "truncations")  # T rows each


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_metadata(meta: Any, path: Path) -> int:
    """The metadata's episode count, after checking its counts."""
    if not isinstance(meta, dict):
        raise DatasetError(f"{path}: holds {type(meta).__name__}, expected a JSON object")
    for key in ("total_episodes", "total_steps"):
        value = meta.get(key)
        if not _whole(value):
            raise DatasetError(f"{path}: {key}={value!r}; expected a whole number >= 0")
    return meta["total_episodes"]


def _stored_bytes(name: str, ds: Any, file_size: int, where: str) -> int:
    """The bytes dataset ``ds`` (a low-level DatasetID) will take in memory, after checking
    that the file can hold them."""
    declared = math.prod(ds.shape) * ds.dtype.itemsize
    if ds.dtype.kind == "O":  # variable-length (JPEG frames): decoded sizes follow the space
        return declared
    stored = ds.get_storage_size()
    filtered = ds.get_create_plist().get_nfilters() > 0  # compressed chunks
    most = stored * (DEFLATE_MAX_RATIO if filtered else 1) + SIZE_SLACK
    if stored > file_size or declared > most:
        raise DatasetError(
            f"{where}: {name} declares shape {ds.shape} ({gib(declared)}) but the file "
            f"stores {gib(min(stored, file_size))} of it"
        )
    return declared


def _datasets(group: Any) -> dict[str, Any]:
    """Every dataset under an HDF5 group, by path relative to it (low-level ids: opening
    thousands of episodes through h5py's objects would cost more than reading them)."""
    found: dict[str, Any] = {}

    def visit(path: bytes) -> None:
        obj = h5py.h5o.open(group, path)
        if isinstance(obj, h5py.h5d.DatasetID):
            found[path.decode()] = obj

    h5py.h5o.visit(group, visit)
    return found


def _check_episode(f: h5py.File, name: str, file_size: int, where: str) -> int:
    """One episode group: arrays the file can hold, rows that agree; the bytes it needs."""
    group = h5py.h5o.open(f.id, name.encode())
    if not isinstance(group, h5py.h5g.GroupID):
        raise DatasetError(f"{where}: {name} is not an episode group")
    arrays = _datasets(group)
    total = sum(_stored_bytes(f"{name}/{k}", ds, file_size, where) for k, ds in arrays.items())
    rows = {key: arrays[key].shape for key in STEP_FIELDS if key in arrays}
    lengths = {shape[0] if shape else None for shape in rows.values()}
    if len(lengths) > 1 or None in lengths:
        raise DatasetError(f"{where}: {name}'s arrays disagree on its length: {rows}")
    t = lengths.pop() if lengths else None
    if t == 0:
        raise DatasetError(f"{where}: {name} has no steps")
    obs = arrays.get("observations")
    if t is not None and obs is not None and obs.shape[:1] != (t + 1,):
        raise DatasetError(
            f"{where}: {name}/observations has shape {obs.shape}; an episode of {t} steps "
            f"stores {t + 1} observations (the last is the final one)"
        )
    return total


def _check_hdf5(path: Path, count: int, meta_path: Path) -> int:
    """The episode groups of Minari's HDF5 file against ``count``; the bytes they need."""
    file_size = path.stat().st_size
    with h5py.File(path, "r") as f:
        names = set(f.keys())
        held = len(names)
        odd = sorted(names - {f"episode_{i}" for i in range(held)})
        if odd:
            raise DatasetError(
                f"{path}: group {odd[0]!r} is not an episode (expected episode_0 .. "
                f"episode_{held - 1})"
            )
        if held != count:
            raise DatasetError(
                f"{meta_path}: total_episodes={count} but {path} holds {held} episodes"
            )
        return sum(_check_episode(f, f"episode_{i}", file_size, str(path)) for i in range(count))


def _check_arrow(data: Path, count: int, meta_path: Path) -> None:
    """Minari's Arrow storage: one folder per episode, named by its index."""
    held = sum(1 for p in data.iterdir() if p.is_dir() and p.name.isdigit())
    if held != count:
        raise DatasetError(
            f"{meta_path}: total_episodes={count} but {data} holds {held} episode folders"
        )


def check_minari_files(folder: Path) -> None:
    """Check a local Minari dataset's metadata and data file against each other and against
    this machine's memory; raises DatasetError naming the file and the value."""
    data = folder / "data"
    meta_path = data / "metadata.json"
    with open(meta_path, "rb") as f:
        meta = json.load(f)
    count = _check_metadata(meta, meta_path)
    storage = meta.get("data_format")
    if storage == "hdf5" and (data / HDF5_FILE).is_file():
        check_fits_memory(_check_hdf5(data / HDF5_FILE, count, meta_path), str(data / HDF5_FILE))
    elif storage == "arrow":
        _check_arrow(data, count, meta_path)
    # any other format, or a missing file: Minari's own reader names what is missing
