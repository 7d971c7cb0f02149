"""DQN Replay (Agarwal et al. 2020) checkpoints, read locally the way d4rl-atari reads them.

Facts taken from takuseno/d4rl-atari (039d1a9), google/dopamine's
circular replay buffer and google-research/batch_rl's logged replay buffer:

* One checkpoint = gzip-compressed `.npy` files (np.save, no pickle): observation (N,84,84)
  uint8, action (N,) int32, reward (N,) float32 (clipped to [-1,1]), terminal (N,) uint8,
  N = 1,000,000, plus `add_count` (0-d) used for the ring-buffer order.
* Layouts: the bucket's `{root}/{Game}/{run}/replay_logs/$store$_{name}_ckpt.{epoch}.gz` and
  d4rl-atari's renamed cache `{root}/{Game}/{run}/{epoch}/{name}.gz`.
* Dopamine writes 3 all-zero rows before each episode (frame-stack padding); d4rl-atari keeps
  them as ordinary rows.

`load_dqn_replay` returns exactly d4rl-atari's `get_dataset()` dict. `dqn_replay_episodes`
is the episode view with its deviations as named options. Nothing here downloads. Ids,
layouts and paths: :mod:`rltrans.envs.dqn_replay_files`.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec, WrapperSpec
from tqdm.auto import tqdm

from rltrans.envs.dataset_checks import (
    check_actions,
    check_finite,
    check_returns,
    first_line,
    read_npy_header,
)
from rltrans.envs.dqn_replay_files import (
    ALE_MAX_ACTIONS,
    DOPAMINE_MAX_EPISODE_STEPS,
    DTYPES,
    FRAME_SHAPE,
    NAMES,
    PADDING_ROWS,
    D4RLAtariId,
    Layout,
    capitalize_game_name,
    check_checkpoints,
    check_npy_header,
    checkpoint_paths,
    find_checkpoint,
    parse_d4rl_atari_id,
    resolve_dataset,
)
from rltrans.envs.offline import DatasetError, Episode, OfflineDataset

__all__ = [
    "D4RLAtariId",
    "atari_eval_spec",
    "capitalize_game_name",
    "d4rl_stack",
    "dopamine_rows",
    "dqn_replay_episodes",
    "dqn_replay_to_minari",
    "find_checkpoint",
    "load_dqn_replay",
    "parse_d4rl_atari_id",
    "stack_frames",
    "write_dqn_replay_shard",
]


def _load_array(path: Path, name: str, check_size: bool) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        shape, dtype = read_npy_header(f, path)
        check_npy_header(path, name, shape, dtype, check_size)
        f.seek(0)  # the header was only looked at: np.load reads it again, then the data
        try:
            array = np.load(f, allow_pickle=False)
        except (ValueError, EOFError, OSError, zlib.error) as err:  # a payload cut short
            raise DatasetError(f"{path}: {first_line(err)}") from None
    if array.shape != shape or array.dtype != dtype:  # a stream that changed under us
        raise DatasetError(f"{path}: read {array.dtype}{array.shape}, declared {dtype}{shape}")
    return array


def _check_values(
    arrays: list[np.ndarray], paths: dict[str, Path], num_actions: int | None
) -> None:
    """Refuse actions outside the action set and rewards that are not finite."""
    _, actions, rewards, _ = arrays
    if num_actions is None:  # the space is sized from the data, within ALE's action set
        check_actions(actions, gym.spaces.Discrete(ALE_MAX_ACTIONS), f"{paths['action']}")
    else:
        where = f"{paths['action']} (num_actions={num_actions})"
        check_actions(actions, gym.spaces.Discrete(num_actions), where)
    check_finite(rewards, str(paths["reward"]), "reward")
    check_returns(rewards, str(paths["reward"]))  # bounds every episode's return-to-go


def _load_checkpoint(
    paths: dict[str, Path], check_size: bool, bar: tqdm, num_actions: int | None = None
) -> list[np.ndarray]:
    arrays = []
    for name in NAMES:
        bar.set_postfix_str(str(paths[name].name))
        arrays.append(_load_array(paths[name], name, check_size))
        bar.update(1)
    _check_values(arrays, paths, num_actions)
    return arrays  # [observation (N,84,84), action (N,), reward (N,), terminal (N,)]


def d4rl_stack(observations: np.ndarray, terminals: np.ndarray, k: int = 4) -> list[np.ndarray]:
    """d4rl-atari's frame stacking: one (k, 84, 84) array per row, zero-padded after terminals.

    A counter t starts at 1; row i gets `obs[i-k+1:i+1]` (a view) when t >= k, else the t
    frames since the last terminal behind k-t zero frames (a new array); a terminal resets t.
    """
    stacks: list[np.ndarray] = []
    t = 1
    for i in range(len(observations)):
        if t < k:
            pad = np.zeros((k - t, *observations.shape[1:]), dtype=observations.dtype)
            stacks.append(np.concatenate([pad, observations[i - t + 1 : i + 1]]))
        else:
            stacks.append(observations[i - k + 1 : i + 1])  # view, no copy
        t = 1 if terminals[i] else t + 1
    return stacks


def stack_frames(frames: np.ndarray, index: int | np.ndarray, k: int = 4) -> np.ndarray:
    """Stack the k frames ending at `index` of one episode, zero-padded before its start.

    `frames` (T, H, W). An int index gives (k, H, W), a view when index >= k-1; an index
    array (...) gives (..., k, H, W). Same rule as d4rl-atari's padding after a terminal.
    """
    if np.ndim(index) == 0:
        i = int(index)
        if not 0 <= i < len(frames):
            raise IndexError(f"index {i} out of range for {len(frames)} frames")
        if i >= k - 1:
            return frames[i - k + 1 : i + 1]
        out = np.zeros((k, *frames.shape[1:]), dtype=frames.dtype)
        out[k - 1 - i :] = frames[: i + 1]
        return out
    index = np.asarray(index)
    if index.size and (index.min() < 0 or index.max() >= len(frames)):
        raise IndexError(f"indices out of range for {len(frames)} frames")
    rows = index[..., None] + np.arange(1 - k, 1)  # (..., k)
    out = frames[np.maximum(rows, 0)]  # (..., k, H, W), a copy
    out[rows < 0] = 0
    return out


def load_dqn_replay(
    game_or_id: str,
    *,
    run: int | None = None,
    epochs: int | Sequence[int] | None = None,
    root: str | os.PathLike[str] | None = None,
    stack: bool = False,
    check_size: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """d4rl-atari's `get_dataset()`: {'observations', 'actions', 'rewards', 'terminals'}.

    Observations are (N, 1, 84, 84) uint8 (a view), or with `stack=True` a list of N arrays
    (4, 84, 84) built by `d4rl_stack`. Several epochs are concatenated in the given order.

    Example:
        >>> data = load_dqn_replay("pong-mixed-v0")  # doctest: +SKIP
        >>> data["observations"].shape, data["actions"].dtype  # doctest: +SKIP
        ((1000000, 1, 84, 84), dtype('int32'))
    """
    (game, run, epoch_list), _ = resolve_dataset(game_or_id, run, epochs)
    found = [find_checkpoint(game, run, epoch, root) for epoch in epoch_list]
    check_checkpoints(found, check_size)
    shards = []
    with tqdm(total=4 * len(epoch_list), desc=f"loading {game}/{run}", disable=not progress) as bar:
        for paths in found:
            shards.append(_load_checkpoint(paths, check_size, bar))
    if len(shards) == 1:
        obs, actions, rewards, terminals = shards[0]  # no copy for the usual single epoch
    else:
        obs, actions, rewards, terminals = (
            np.concatenate(parts) for parts in zip(*shards, strict=True)
        )
    observations = d4rl_stack(obs, terminals) if stack else obs.reshape(-1, 1, *FRAME_SHAPE)
    return dict(observations=observations, actions=actions, rewards=rewards, terminals=terminals)


def atari_eval_spec(game: str, frame_stack: int = 4) -> EnvSpec:
    """`ALE/{Game}-v5` without sticky actions, preprocessed like the DQN Replay frames.

    Frameskip 4 with max-pooling, 84x84 grayscale, 30 no-op starts, no life-loss terminals
    (d4rl-atari's env); frames stacked oldest first with zero padding, like the dataset. Built
    by hand so loading data does not need ale-py; `gym.make(spec)` imports it.
    """
    ale_game = re.sub(r"(?<!^)(?=[A-Z])", "_", game).lower()  # 'UpNDown' -> 'up_n_down'
    wrappers = [
        WrapperSpec(
            "AtariPreprocessing",
            "gymnasium.wrappers:AtariPreprocessing",
            {"noop_max": 30, "frame_skip": 4, "screen_size": 84, "terminal_on_life_loss": False,
             "grayscale_obs": True, "scale_obs": False},
        )
    ]  # fmt: skip
    if frame_stack > 1:
        wrappers.append(
            WrapperSpec(
                "FrameStackObservation",
                "gymnasium.wrappers:FrameStackObservation",
                {"stack_size": frame_stack, "padding_type": "zero"},
            )
        )
    return EnvSpec(
        id=f"ALE/{game}-v5",
        entry_point="ale_py.env:AtariEnv",
        # frameskip=1 here because AtariPreprocessing skips; 108k frames = Dopamine's 27k steps.
        kwargs={"game": ale_game, "repeat_action_probability": 0.0, "full_action_space": False,
                "frameskip": 1, "max_num_frames_per_episode": 108_000},
        additional_wrappers=tuple(wrappers),
    )  # fmt: skip


Padding = Literal["drop", "keep"]
Order = Literal["index", "chronological"]
Partial = Literal["keep", "drop"]


def _rows(array: np.ndarray, start: int, stop: int, shift: int) -> np.ndarray:
    """Chronological rows [start, stop) of a ring buffer rotated by `shift`; view unless wrapped."""
    n = len(array)
    a, b = start + shift, stop + shift
    if b <= n:
        return array[a:b]
    if a >= n:
        return array[a - n : b - n]
    return np.concatenate([array[a:], array[: b - n]])


def _split_checkpoint(
    arrays: list[np.ndarray], shift: int, padding: Padding, partial: Partial, max_steps: int | None
) -> tuple[list[Episode], list[bool]]:
    """Episodes of one checkpoint and, per episode, whether its start lies before the data."""
    obs, actions, rewards, terminals = arrays
    n = len(terminals)

    def is_padding(j: int) -> bool:  # chronological row j is one of Dopamine's zero rows
        r = (j + shift) % n
        return not (obs[r].any() or actions[r] or rewards[r] or terminals[r])

    ends = np.flatnonzero(np.roll(terminals, -shift)) + 1  # chronological segment ends (exclusive)
    bounds = list(zip([0, *ends[:-1].tolist()], ends.tolist(), strict=True))
    if not bounds or bounds[-1][1] < n:
        bounds.append((bounds[-1][1] if bounds else 0, n))  # trailing segment with no terminal
    episodes, headless = [], []
    for start, stop in bounds:
        lead = 0
        while lead < PADDING_ROWS and start + lead < stop and is_padding(start + lead):
            lead += 1
        real = start + (lead if padding == "drop" else 0)
        no_start = start == 0 and lead == 0  # continues an episode from before this checkpoint
        terminated = bool(terminals[(stop - 1 + shift) % n])
        if real >= stop or (partial == "drop" and (no_start or not terminated)):
            continue
        truncated = not terminated
        if terminated and max_steps is not None and stop - start - lead == max_steps:
            # Dopamine ends an episode at the step limit with terminal=1 too; undo the conflation.
            terminated, truncated = False, True
        episodes.append(
            Episode(
                observations=_rows(obs, real, stop, shift),  # (T, 84, 84)
                actions=_rows(actions, real, stop, shift),  # (T,) int32
                rewards=_rows(rewards, real, stop, shift),  # (T,) float32
                terminated=terminated,
                truncated=truncated,
            )
        )
        headless.append(no_start)
    return episodes, headless


def dqn_replay_episodes(
    game_or_id: str,
    *,
    run: int | None = None,
    epochs: int | Sequence[int] | None = None,
    root: str | os.PathLike[str] | None = None,
    check_size: bool = True,
    padding: Padding = "drop",
    order: Order = "index",
    partial: Partial = "keep",
    max_episode_steps: int | None = DOPAMINE_MAX_EPISODE_STEPS,
    frame_stack: int = 4,
    num_actions: int | None = None,
    progress: bool = True,
) -> OfflineDataset:
    """DQN Replay checkpoints as episodes of single frames (T, 84, 84) uint8, mostly views.

    Deviations from d4rl-atari, each an option: `padding="drop"` removes Dopamine's 3 zero
    rows before each episode; `order="chronological"` undoes the ring-buffer rotation with
    add_count; each checkpoint is split at terminals on its own, its trailing unterminated
    segment is truncated and its leading one may lack its start (`partial="drop"` drops
    both); a terminal episode of exactly `max_episode_steps` steps is marked truncated.
    Frames are stacked at sampling time with `stack_frames(ep.observations, t, frame_stack)`.
    """
    for value, name, valid in (
        (padding, "padding", ("drop", "keep")),
        (order, "order", ("index", "chronological")),
        (partial, "partial", ("keep", "drop")),
    ):
        if value not in valid:
            raise ValueError(f"{name}={value!r}; valid: {list(valid)}")
    if num_actions is not None and not (
        isinstance(num_actions, int) and 1 <= num_actions <= ALE_MAX_ACTIONS
    ):
        raise ValueError(f"num_actions={num_actions!r}; valid: an integer in 1..{ALE_MAX_ACTIONS}")
    (game, run, epoch_list), name = resolve_dataset(game_or_id, run, epochs)
    episodes: list[Episode] = []
    headless: list[bool] = []
    found = [find_checkpoint(game, run, epoch, root) for epoch in epoch_list]
    # add_count and every header first: a missing file or a size no file holds should fail
    # before minutes of decompression.
    counts = [_read_add_count(p["add_count"]) if order == "chronological" else 0 for p in found]
    check_checkpoints(found, check_size)
    with tqdm(total=4 * len(epoch_list), desc=f"loading {game}/{run}", disable=not progress) as bar:
        for paths, add_count in zip(found, counts, strict=True):
            arrays = _load_checkpoint(paths, check_size, bar, num_actions)
            shift = add_count % len(arrays[0])  # storage row of the oldest transition
            eps, heads = _split_checkpoint(arrays, shift, padding, partial, max_episode_steps)
            episodes += eps
            headless += heads
    if num_actions is None:  # every action was checked at load: 0 <= a < num_actions
        num_actions = max((int(ep.actions.max()) for ep in episodes if len(ep)), default=0) + 1
    return OfflineDataset(
        episodes=episodes,
        observation_space=gym.spaces.Box(0, 255, FRAME_SHAPE, np.uint8),
        action_space=gym.spaces.Discrete(num_actions),
        name=name,
        env_spec=atari_eval_spec(game, frame_stack),
        frame_stack=frame_stack,
        info={"source": "dqn_replay", "game": game, "run": run, "epochs": epoch_list,
              "padding": padding, "order": order, "rewards": "clipped to [-1, 1]",
              "headless_episodes": [i for i, h in enumerate(headless) if h]},
    )  # fmt: skip


def _read_add_count(path: Path) -> int:
    if not path.is_file():
        raise FileNotFoundError(
            f"order='chronological' needs the checkpoint's add_count file: {path} is missing "
            f"(use order='index' for d4rl-atari's plain row order)"
        )
    with gzip.open(path, "rb") as f:
        shape, dtype = read_npy_header(f, path)
        if shape != () or dtype.kind not in "iu":
            raise DatasetError(f"{path}: {dtype}{shape}, expected one integer (add_count)")
        f.seek(0)
        return int(np.load(f, allow_pickle=False))


def dopamine_rows(
    episodes: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Episodes as the rows Dopamine's logged replay buffer holds, for
    :func:`write_dqn_replay_shard`: before each episode 3 all-zero rows (its frame-stack
    padding), then one row per step: the step's newest frame, its action, its reward clipped
    to [-1, 1], and terminal 1 on the episode's last step (Dopamine's Runner ends an episode
    at game over and at its step limit alike).

    Each episode is (frames (T, 84, 84) uint8, actions (T,), rewards (T,) as the game paid).
    """
    parts: list[list[np.ndarray]] = [[], [], [], []]
    for i, (frames, actions, rewards) in enumerate(episodes):
        frames, actions, rewards = np.asarray(frames), np.asarray(actions), np.asarray(rewards)
        t = len(frames)
        if t == 0 or frames.shape[1:] != FRAME_SHAPE or len(actions) != t or len(rewards) != t:
            raise ValueError(
                f"episode {i}: frames {frames.shape}, actions {actions.shape}, rewards "
                f"{rewards.shape}; expected (T, 84, 84), (T,), (T,) with T >= 1"
            )
        terminal = np.zeros(PADDING_ROWS + t, np.uint8)
        terminal[-1] = 1
        parts[0] += [np.zeros((PADDING_ROWS, *FRAME_SHAPE), np.uint8), frames.astype(np.uint8)]
        parts[1] += [np.zeros(PADDING_ROWS, np.int32), actions.astype(np.int32)]
        clipped = np.clip(rewards.astype(np.float32), -1.0, 1.0)
        parts[2] += [np.zeros(PADDING_ROWS, np.float32), clipped]
        parts[3].append(terminal)
    if not parts[3]:
        raise ValueError("no episodes to write")
    observations, actions, rewards, terminals = (np.concatenate(p) for p in parts)
    return observations, actions, rewards, terminals


def write_dqn_replay_shard(
    directory: str | os.PathLike[str],
    game: str,
    run: int,
    epoch: int,
    observations: np.ndarray,
    actions: np.ndarray,
    rewards: np.ndarray,
    terminals: np.ndarray,
    add_count: int | None = None,
    layout: Layout = "raw",
    compresslevel: int = 6,
) -> dict[str, Path]:
    """Write one checkpoint in the real format (gzip + np.save) under `directory`; returns paths.

    Arrays must already have (or safely cast to) uint8 / int32 / float32 / uint8.
    """
    paths = checkpoint_paths(Path(directory), game, run, epoch, layout)
    arrays = dict(zip(NAMES, (observations, actions, rewards, terminals), strict=True))
    for name, array in arrays.items():
        array = np.asarray(array)
        want = np.dtype(DTYPES[name])
        if not np.can_cast(array.dtype, want, casting="safe"):
            raise ValueError(f"{name}: dtype {array.dtype} does not cast safely to {want}")
        arrays[name] = array.astype(want, copy=False)
    shapes = {n: a.shape for n, a in arrays.items()}
    n_rows = len(arrays["observation"])
    if shapes["observation"][1:] != FRAME_SHAPE or any(shapes[n] != (n_rows,) for n in NAMES[1:]):
        raise ValueError(f"shapes {shapes}, expected (N, 84, 84) and (N,) for the rest")
    if add_count is not None:
        arrays["add_count"] = np.array(add_count, dtype=np.int64)
    written = {}
    for name, array in arrays.items():
        paths[name].parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(paths[name], "wb", compresslevel=compresslevel) as f:
            np.save(f, array, allow_pickle=False)
        written[name] = paths[name]
    return written


def dqn_replay_to_minari(
    dataset: OfflineDataset,
    dataset_id: str,
    *,
    author: str,
    description: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a `dqn_replay_episodes` dataset as a Minari dataset (lossless frames).

    DQN Replay never stores an episode's final observation; Minari needs T+1, so the last
    observation is stored again as the final one.
    """
    from rltrans.envs.minari_data import write_minari  # minari is only needed for this conversion

    text = description or (
        f"DQN Replay {dataset.name} ({dataset.info}). Single 84x84 grayscale frames; stack "
        f"{dataset.frame_stack} at sampling time. Rewards clipped to [-1, 1]. The final "
        f"observation of each episode repeats its last one (DQN Replay does not store it)."
    )
    return write_minari(
        dataset_id,
        dataset.episodes,
        env=None,
        eval_env=dataset.env_spec,
        observation_space=dataset.observation_space,
        action_space=dataset.action_space,
        algorithm_name="DQN (Dopamine) replay logs, DQN Replay dataset",
        author=author,
        description=text,
        jpeg_encoding=False,
        missing_final_observation="repeat_last",
        overwrite=overwrite,
    )
