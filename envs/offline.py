"""The episode container shared by every offline data reader (Minari, DQN Replay).

An `Episode` holds the T observations at which actions were taken, the T actions and
rewards, and how it ended. `OfflineDataset` is a list of episodes plus the spaces and the
evaluation environment. Readers keep arrays as views where they can: a DQN Replay
checkpoint is 7 GB of uint8 frames, and its episodes are slices of that one array.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec

__all__ = [
    "DATASET_KINDS",
    "DatasetError",
    "Episode",
    "OfflineDataset",
    "detect_dataset_kind",
    "env_config_from_spec",
    "load_dataset",
    "make_eval_env_fn",
    "normalized_by_target",
    "normalized_score",
]

DatasetKind = Literal["auto", "minari", "dqn_replay"]
DATASET_KINDS = ("auto", "minari", "dqn_replay")


class DatasetError(ValueError):
    """A dataset's files hold something no reader may use (a NaN reward, an action outside
    the action space, a size the file cannot hold); the one-line message names the dataset,
    the file and the value."""


@dataclass
class Episode:
    """One episode: T steps of (observation, action, reward) and how it ended.

    Example:
        >>> ep = Episode(np.zeros((3, 4)), np.zeros(3, np.int64), np.ones(3), terminated=True)
        >>> len(ep), ep.episode_return
        (3, 3.0)
    """

    observations: (
        np.ndarray
    )  # (T, *obs_shape): obs at which each action was taken, not the final one
    actions: np.ndarray  # (T, *action_shape)
    rewards: np.ndarray  # (T,) float32
    terminated: bool = False  # the episode ended in a terminal state (no bootstrap)
    truncated: bool = False  # cut by a time limit or by the end of the data (bootstrap)
    final_observation: np.ndarray | None = None  # (*obs_shape) obs after the last action, if known

    def __post_init__(self) -> None:
        # np.asarray never copies an array that already has the right dtype, so uint8 frames
        # and slices of a large checkpoint stay views.
        self.observations = np.asarray(self.observations)
        self.actions = np.asarray(self.actions)
        self.rewards = np.asarray(self.rewards, dtype=np.float32)
        self.terminated = bool(self.terminated)
        self.truncated = bool(self.truncated)
        t = len(self.rewards)
        if self.rewards.ndim != 1 or len(self.observations) != t or len(self.actions) != t:
            raise ValueError(
                f"Episode arrays disagree on length: observations {self.observations.shape}, "
                f"actions {self.actions.shape}, rewards {self.rewards.shape} (want T, T, (T,))"
            )

    def __len__(self) -> int:
        """Number of steps T."""
        return len(self.rewards)

    @property
    def episode_return(self) -> float:
        """Undiscounted sum of rewards (summed in float64)."""
        return float(self.rewards.sum(dtype=np.float64))


@dataclass
class OfflineDataset:
    """Episodes plus what is needed to train on them and evaluate in an environment.

    `observation_space` describes one row of `Episode.observations`. When `frame_stack` > 1
    (Atari), a policy sees the last `frame_stack` rows stacked, built at sampling time with
    `rltrans.envs.dqn_replay.stack_frames`, and the evaluation env produces such stacks itself.
    `env_spec` is the evaluation environment: `gym.make(env_spec)` or
    `gym.make_vec(env_spec, n, vectorization_mode="sync")`, or `make_eval_env_fn(dataset)`.

    Example:
        >>> ds = load_minari("rltrans/cartpole-random-v0")  # doctest: +SKIP
        >>> ds.num_steps, ds.returns().mean(), ds.env_id  # doctest: +SKIP
    """

    episodes: list[Episode]
    observation_space: gym.Space
    action_space: gym.Space
    name: str = ""
    env_spec: EnvSpec | None = None
    frame_stack: int = 1
    info: dict[str, Any] = field(default_factory=dict)  # provenance, free form

    def __len__(self) -> int:
        """Number of episodes."""
        return len(self.episodes)

    def __iter__(self) -> Iterator[Episode]:
        """Iterate over episodes in stored order."""
        return iter(self.episodes)

    def __getitem__(self, index: int) -> Episode:
        """The episode at `index`."""
        return self.episodes[index]

    @property
    def num_steps(self) -> int:
        """Total number of steps over all episodes."""
        return sum(len(ep) for ep in self.episodes)

    @property
    def env_id(self) -> str | None:
        """Id of the evaluation environment, if known."""
        return None if self.env_spec is None else self.env_spec.id

    @property
    def env_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the evaluation environment (a copy)."""
        return {} if self.env_spec is None else dict(self.env_spec.kwargs)

    def returns(self) -> np.ndarray:
        """Undiscounted return per episode, (E,) float64."""
        return np.array([ep.episode_return for ep in self.episodes], dtype=np.float64)

    def lengths(self) -> np.ndarray:
        """Number of steps per episode, (E,) int64."""
        return np.array([len(ep) for ep in self.episodes], dtype=np.int64)

    def reference_scores(self) -> tuple[float, float] | None:
        """(ref_min_score, ref_max_score) of a Minari dataset's metadata (D4RL's random and
        expert returns), or None when it records not both."""
        metadata = self.info.get("metadata") or {}
        values = []
        for key in ("ref_min_score", "ref_max_score"):
            value = metadata.get(key)
            if value is None:
                return None
            number = np.asarray(value)
            if number.shape != () or number.dtype.kind not in "iuf" or not np.isfinite(number):
                raise DatasetError(
                    f"dataset {self.name!r}: metadata {key}={value!r}: expected a finite number"
                )
            values.append(float(number))
        if values[0] >= values[1]:
            raise DatasetError(
                f"dataset {self.name!r}: metadata ref_min_score={values[0]} is not below "
                f"ref_max_score={values[1]}"
            )
        return values[0], values[1]


def normalized_score(episode_return: float, reference: tuple[float, float]) -> float:
    """D4RL's normalised score: 100 * (return - random) / (expert - random).

    Example:
        >>> round(normalized_score(1627.3, (-20.27, 3234.3)), 1)  # Hopper's D4RL references
        50.6
    """
    low, high = reference
    return 100.0 * (episode_return - low) / (high - low)


def normalized_by_target(
    by_target: dict[str, float], data_info: dict[str, Any] | None
) -> dict[str, float] | None:
    """D4RL-normalised mean return per target, for data recording reference scores."""
    info = data_info or {}
    if info.get("ref_min_score") is None or info.get("ref_max_score") is None:
        return None
    reference = (float(info["ref_min_score"]), float(info["ref_max_score"]))
    return {t: round(normalized_score(r, reference), 2) for t, r in by_target.items()}


def make_eval_env_fn(dataset: OfflineDataset, **kwargs: Any) -> Callable[[], gym.Env]:
    """A thunk building the dataset's evaluation env, e.g. for `gym.vector.SyncVectorEnv`.

    `kwargs` override the spec's keyword arguments (e.g. `render_mode="rgb_array"`).

    Example:
        >>> fn = make_eval_env_fn(ds)  # doctest: +SKIP
        >>> envs = gym.vector.SyncVectorEnv([fn] * 8)  # doctest: +SKIP
    """
    spec = dataset.env_spec
    if spec is None:
        raise ValueError(
            f"dataset {dataset.name!r} records no environment spec; build the evaluation env "
            "yourself with gymnasium.make(<id>)"
        )
    return lambda: gym.make(spec, **kwargs)


# ---------------------------------------------------------------------------------------------
# One entry point for every reader, and the evaluation env as an env config


def detect_dataset_kind(name: str) -> str:
    """'minari' or 'dqn_replay' for a dataset id (the rule of ``dataset_kind=auto``).

    An id with a namespace (``rltrans/cartpole-mixed-v0``) or a Minari dataset present locally
    is Minari; a d4rl-atari id (``pong-mixed-v0``, ``breakout-epoch-3-v1``) is DQN Replay;
    anything else is Minari (whose missing-dataset error lists the local datasets).
    """
    from rltrans.envs.dqn_replay import parse_d4rl_atari_id

    if "/" in name:
        return "minari"
    from minari.storage.datasets_root_dir import get_dataset_path

    if (Path(get_dataset_path(name)) / "data").exists():
        return "minari"
    try:
        parse_d4rl_atari_id(name)
    except ValueError:
        return "minari"
    return "dqn_replay"


def load_dataset(
    name: str,
    kind: DatasetKind = "auto",
    *,
    download: bool = False,
    dqn_replay: Mapping[str, Any] | None = None,
    progress: bool = True,
) -> OfflineDataset:
    """Load an offline dataset by id: a Minari id or a d4rl-atari (DQN Replay) id.

    `dqn_replay` holds keyword arguments of `rltrans.envs.dqn_replay.dqn_replay_episodes` (root,
    check_size, padding, ...); `download` lets Minari fetch a dataset that is not local.

    Example:
        >>> ds = load_dataset("rltrans/cartpole-mixed-v0")  # doctest: +SKIP
        >>> ds = load_dataset("pong-mixed-v0", dqn_replay={"root": "/data/dqn"})  # doctest: +SKIP
    """
    if kind not in DATASET_KINDS:
        raise ValueError(f"dataset_kind={kind!r}; valid: {list(DATASET_KINDS)}")
    if kind == "auto":
        kind = detect_dataset_kind(name)  # type: ignore[assignment]
    if kind == "minari":
        from rltrans.envs.minari_data import load_minari

        return load_minari(name, download=download, progress=progress)
    from rltrans.envs.dqn_replay import dqn_replay_episodes

    return dqn_replay_episodes(name, progress=progress, **dict(dqn_replay or {}))


def _wrapper_path(entry_point: Any) -> str:
    """An import path ``module:Name`` for a WrapperSpec entry point (string or callable)."""
    if isinstance(entry_point, str):
        return entry_point
    return f"{entry_point.__module__}:{entry_point.__qualname__}"


def env_config_from_spec(spec: EnvSpec, num_envs: int = 1) -> dict[str, Any]:
    """The ``kind: gym`` env config (configs/env/gym.yaml) that rebuilds `spec` in a vector env.

    Keyword arguments, the step limit and the spec's additional wrappers (e.g. the Atari
    preprocessing and frame stacking of DQN Replay's evaluation env) are kept, so
    `envs.make_env` builds exactly the env a dataset records; ``atari: off`` because such a
    spec carries its own preprocessing. The id must be registered (``module:EnvId`` ids import
    their module first).

    Example:
        >>> env_config_from_spec(gym.spec("CartPole-v1"), 4)["kwargs"]
        {'max_episode_steps': 500}
    """
    if not re.fullmatch(r"[\w.:/-]+", spec.id or ""):
        raise ValueError(f"environment spec has no usable id: {spec!r}")
    kwargs = dict(spec.kwargs)
    if spec.max_episode_steps is not None:
        kwargs["max_episode_steps"] = int(spec.max_episode_steps)
    wrappers = [
        {"path": _wrapper_path(w.entry_point), "kwargs": dict(w.kwargs or {})}
        for w in spec.additional_wrappers
    ]
    return {
        "kind": "gym",
        "id": spec.id,
        "num_envs": int(num_envs),
        "vectorization": "sync",
        "atari": "off",
        "wrappers": wrappers,
        "kwargs": kwargs,
    }
