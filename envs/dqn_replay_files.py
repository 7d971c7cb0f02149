"""Where a DQN Replay (Agarwal et al. 2020) dataset's files are: the d4rl-atari ids that name
a checkpoint (``pong-mixed-v0``, ``breakout-epoch-3-v1``), the bucket's and d4rl-atari's
folder layouts, the file format's constants, and what a file's header may declare.
:mod:`rltrans.envs.dqn_replay` reads them.
"""

from __future__ import annotations

import gzip
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np

from rltrans.envs.dataset_checks import (
    DEFLATE_MAX_RATIO,
    SIZE_SLACK,
    check_fits_memory,
    gib,
    read_npy_header,
)
from rltrans.envs.offline import DatasetError

NAMES = ("observation", "action", "reward", "terminal")
DTYPES = {"observation": np.uint8, "action": np.int32, "reward": np.float32, "terminal": np.uint8}
CHECKPOINT_SIZE = 1_000_000  # Dopamine replay capacity: rows per checkpoint
ALE_MAX_ACTIONS = 18  # ALE's full action set: every game's actions are 0..17
FRAME_SHAPE = (84, 84)
SPLIT_EPOCHS = {"mixed": 1, "medium": 10, "expert": 50}  # d4rl-atari's checkpoint suffixes
NUM_RUNS = 5  # runs 1..5 in the bucket; d4rl-atari's v0..v4
MAX_ID_EPOCH = 50  # d4rl-atari registers epoch-1 .. epoch-50
PADDING_ROWS = 3  # Dopamine: stack_size - 1 zero rows before each episode
DOPAMINE_MAX_EPISODE_STEPS = 27_000  # Dopamine Runner max_steps_per_episode (108k frames)
BUCKET = "gs://atari-replay-datasets/dqn"

Layout = Literal["raw", "d4rl"]


class D4RLAtariId(NamedTuple):
    """What a d4rl-atari id selects: bucket game directory, DQN run (1..5), checkpoints."""

    game: str
    run: int
    epochs: list[int]


def capitalize_game_name(game: str) -> str:
    """d4rl-atari's rule: 'ms-pacman' -> 'MsPacman', 'up-n-down' -> 'UpNDown'."""
    return "".join(part.capitalize() for part in game.replace("-", "_").split("_"))


def parse_d4rl_atari_id(dataset_id: str) -> D4RLAtariId:
    """Parse '{game}-{mixed|medium|expert|epoch-N}-v{0..4}' as d4rl-atari does.

    Example:
        >>> parse_d4rl_atari_id("ms-pacman-expert-v2")
        D4RLAtariId(game='MsPacman', run=3, epochs=[50])
    """
    valid = "mixed, medium, expert or epoch-N (N in 1..50)"
    m = re.fullmatch(r"([a-z0-9]+(?:-[a-z0-9]+)*)-v(\d+)", dataset_id)
    if m is None:
        raise ValueError(
            f"{dataset_id!r} is not a d4rl-atari id; expected lower-case "
            f"'{{game}}-{{split}}-v{{0..{NUM_RUNS - 1}}}' with split {valid}, "
            f"e.g. 'ms-pacman-mixed-v0'"
        )
    body, version = m.group(1), int(m.group(2))
    if not 0 <= version < NUM_RUNS:
        raise ValueError(
            f"{dataset_id!r}: version v{version} out of range v0..v{NUM_RUNS - 1} "
            f"(v_i selects DQN run i+1 of {NUM_RUNS})"
        )
    split = re.fullmatch(r"(.+)-(mixed|medium|expert)", body)
    by_epoch = re.fullmatch(r"(.+)-epoch-(\d+)", body)
    if split is not None:
        game, epoch = split.group(1), SPLIT_EPOCHS[split.group(2)]
    elif by_epoch is not None:
        game, epoch = by_epoch.group(1), int(by_epoch.group(2))
        if not 1 <= epoch <= MAX_ID_EPOCH:
            raise ValueError(f"{dataset_id!r}: epoch {epoch} out of range 1..{MAX_ID_EPOCH}")
    else:
        raise ValueError(f"{dataset_id!r}: no valid split; valid splits: {valid}")
    return D4RLAtariId(capitalize_game_name(game), version + 1, [epoch])


def resolve_dataset(
    game_or_id: str, run: int | None, epochs: int | Sequence[int] | None
) -> tuple[D4RLAtariId, str]:
    """(game, run, epochs) and a dataset name from either an id or a game plus run/epochs."""
    if re.search(r"-v\d+$", game_or_id):
        if run is not None or epochs is not None:
            raise ValueError(f"{game_or_id!r} is an id, which fixes run and epochs; omit them")
        return parse_d4rl_atari_id(game_or_id), game_or_id
    if epochs is None:
        raise ValueError(
            f"game {game_or_id!r} needs epochs=... (checkpoint numbers), or pass a d4rl-atari id "
            f"such as '{game_or_id.lower()}-mixed-v0'"
        )
    epoch_list = [int(epochs)] if isinstance(epochs, int) else [int(e) for e in epochs]
    if not epoch_list or min(epoch_list) < 0:
        raise ValueError(f"epochs={epochs!r} must be a non-empty list of checkpoint numbers >= 0")
    run = 1 if run is None else int(run)
    if not 1 <= run <= NUM_RUNS:
        raise ValueError(f"run={run} out of range 1..{NUM_RUNS}")
    # Bucket directories are CamelCase; lower-case hyphenated names use d4rl-atari's rule.
    game = game_or_id if game_or_id != game_or_id.lower() else capitalize_game_name(game_or_id)
    parsed = D4RLAtariId(game, run, epoch_list)
    return parsed, f"{game}/{run}/ckpt-{'-'.join(map(str, epoch_list))}"


def dataset_root(root: str | os.PathLike[str] | None = None) -> Path:
    """`root`, else $D4RL_DATASET_DIR, else ~/.d4rl/datasets (d4rl-atari's default)."""
    if root is not None:
        return Path(root).expanduser()
    return Path(os.environ.get("D4RL_DATASET_DIR", "~/.d4rl/datasets")).expanduser()


def checkpoint_paths(
    root: Path, game: str, run: int, epoch: int, layout: Layout
) -> dict[str, Path]:
    if layout == "raw":
        logs = root / game / str(run) / "replay_logs"
        paths = {n: logs / f"$store$_{n}_ckpt.{epoch}.gz" for n in NAMES}
        paths["add_count"] = logs / f"add_count_ckpt.{epoch}.gz"
    elif layout == "d4rl":
        folder = root / game / str(run) / str(epoch)
        paths = {n: folder / f"{n}.gz" for n in NAMES}
        # rltrans's own name: d4rl-atari never fetches add_count.
        paths["add_count"] = folder / "add_count.gz"
    else:
        raise ValueError(f"layout={layout!r}; valid: ['raw', 'd4rl']")
    return paths


def find_checkpoint(
    game: str, run: int, epoch: int, root: str | os.PathLike[str] | None = None
) -> dict[str, Path]:
    """Paths of one checkpoint's files in whichever layout holds all four arrays."""
    base = dataset_root(root)
    candidates = {lay: checkpoint_paths(base, game, run, epoch, lay) for lay in ("raw", "d4rl")}
    for paths in candidates.values():
        if all(paths[n].is_file() for n in NAMES):
            return paths
    lines = [
        f"  [{'found' if paths[n].is_file() else 'missing'}] {paths[n]}"
        for lay, paths in candidates.items()
        for n in NAMES
    ]
    raise FileNotFoundError(
        f"DQN Replay checkpoint {epoch} of {game} run {run} is not complete in either layout "
        f"(raw bucket layout, then d4rl-atari cache layout):\n" + "\n".join(lines) + "\n"
        f"rltrans never downloads it. Get it outside rltrans with gsutil, e.g.\n"
        f"  gsutil -m cp '{BUCKET}/{game}/{run}/replay_logs/*_ckpt.{epoch}.gz' "
        f"{base / game / str(run) / 'replay_logs'}/\n"
        f"and point root= or $D4RL_DATASET_DIR (default ~/.d4rl/datasets) at the folder "
        f"holding {game}/."
    )


# ---------------------------------------------------------------------------------------------
# What a checkpoint's headers may declare, checked before any data is read


def check_npy_header(
    path: Path, name: str, shape: tuple[int, ...], dtype: np.dtype, check_size: bool
) -> None:
    """Refuse a header whose dtype, shape or size is not a DQN Replay array's, or that
    declares more bytes than the compressed file can hold, before anything is allocated."""
    want = np.dtype(DTYPES[name])
    if dtype != want:
        raise DatasetError(f"{path}: dtype {dtype}, expected {want} for DQN Replay {name} files")
    tail = FRAME_SHAPE if name == "observation" else ()
    if len(shape) != 1 + len(tail) or shape[1:] != tail:
        raise DatasetError(f"{path}: shape {shape}, expected (N, {', '.join(map(str, tail))})")
    rows = shape[0]
    if rows < 0:
        raise DatasetError(f"{path}: the header declares {rows} rows")
    if check_size and rows != CHECKPOINT_SIZE:
        raise DatasetError(
            f"{path}: {rows} rows, a DQN Replay checkpoint has {CHECKPOINT_SIZE}; "
            f"pass check_size=False for small fixtures"
        )
    if rows > CHECKPOINT_SIZE:
        raise DatasetError(
            f"{path}: the header declares {rows} rows; a DQN Replay checkpoint holds at most "
            f"{CHECKPOINT_SIZE} (Dopamine's replay capacity)"
        )
    declared, size = int(np.prod(shape, dtype=np.int64)) * want.itemsize, path.stat().st_size
    if declared > DEFLATE_MAX_RATIO * size + SIZE_SLACK:
        raise DatasetError(
            f"{path}: the header declares shape {shape} ({gib(declared)}) but the file is "
            f"{gib(size)}, which decompresses to at most {gib(DEFLATE_MAX_RATIO * size)}"
        )


def _check_checkpoint(paths: dict[str, Path], check_size: bool) -> int:
    """Check every header of one checkpoint (no data read); the bytes its arrays declare."""
    headers = {}
    for name in NAMES:
        with gzip.open(paths[name], "rb") as f:
            headers[name] = read_npy_header(f, paths[name])
        check_npy_header(paths[name], name, *headers[name], check_size)
    lengths = {n: shape[0] for n, (shape, _) in headers.items()}
    if len(set(lengths.values())) != 1:
        raise DatasetError(
            f"checkpoint files disagree on length: {lengths} ({paths['observation'].parent})"
        )
    return sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in headers.values())


def check_checkpoints(found: list[dict[str, Path]], check_size: bool) -> None:
    """Every checkpoint's headers, then their sum against this machine's memory: a lying
    or oversized file fails before minutes of decompression."""
    declared = sum(_check_checkpoint(paths, check_size) for paths in found)
    folders = sorted({str(paths["observation"].parent) for paths in found})
    check_fits_memory(declared, ", ".join(folders))


__all__ = [
    "ALE_MAX_ACTIONS",
    "D4RLAtariId",
    "Layout",
    "capitalize_game_name",
    "check_checkpoints",
    "check_npy_header",
    "checkpoint_paths",
    "dataset_root",
    "find_checkpoint",
    "parse_d4rl_atari_id",
    "resolve_dataset",
]
