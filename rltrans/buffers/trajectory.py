"""Offline K-step windows for the Decision Transformer (Chen et al. 2021, section 3).

`TrajectoryBuffer` turns an offline dataset (episodes of observations, actions, rewards, as
`rltrans.envs.offline.OfflineDataset` holds them) into batches of windows of K consecutive steps:
returns-to-go, states, actions, timesteps and a mask of real steps.

Everything that does not change is computed once: the undiscounted return-to-go of every step,
the state mean and standard deviation, the return scale, and flat arrays of all steps with the
offset of each episode, so that a batch is a handful of NumPy gathers of shape (B, K).

Sampling follows the DT reference code: an episode with probability proportional to its
length, then a start uniform over its steps; a window cut by the episode end is LEFT-padded
(real steps at the end, mask False in front). Drawing one step uniformly over all steps gives
exactly that distribution in one draw: its episode is picked in proportion to length and its
offset inside the episode is uniform.

Scaling is the model's job, not the batch's: states and returns-to-go come out raw, and the
statistics (`stats()`) go into the model, which stores them in its own state dict so that a
checkpoint always carries the normalisation it was trained with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from rltrans.returns import returns_to_go_segments
from rltrans.spaces import normalizes_states
from rltrans.types import TrajectoryBatch, TrajectoryStats

if TYPE_CHECKING:  # annotations only: rltrans does not import envs at run time
    from rltrans.envs.offline import OfflineDataset

__all__ = [
    "TrajectoryBatch",
    "TrajectoryBuffer",
    "TrajectoryStats",
    "normalizes_states",
    "policy_observation_space",
]

SUPPORTED_SPACES = (gym.spaces.Box, gym.spaces.Discrete)
STD_EPS = 1e-6  # added to the state std, as the DT reference code does


def policy_observation_space(dataset: OfflineDataset) -> gym.Space:
    """The observation space a policy sees: one dataset row, or a stack of `frame_stack` rows."""
    space = dataset.observation_space
    k = dataset.frame_stack
    if k <= 1:
        return space
    if not isinstance(space, gym.spaces.Box):
        raise ValueError(f"frame_stack={k} needs a Box observation space, got {space!r}")
    low = np.broadcast_to(space.low, (k, *space.shape))
    high = np.broadcast_to(space.high, (k, *space.shape))
    return gym.spaces.Box(low, high, (k, *space.shape), space.dtype)


def _check_space(space: gym.Space, what: str) -> None:
    if not isinstance(space, SUPPORTED_SPACES):
        raise ValueError(
            f"unsupported {what} space {space!r}; supported: "
            f"{[s.__name__ for s in SUPPORTED_SPACES]}"
        )


def _top_episodes(lengths: np.ndarray, returns: np.ndarray, fraction: float) -> np.ndarray:
    """Highest-return episodes, best first, while their steps stay within `fraction` of all.

    Percentile behaviour cloning (%BC, Chen et al. 2021, section 5): the best episode always,
    then the next best while the total is at most fraction x total steps. (The reference
    code compares with a strict '<', which at fraction 1 drops the worst episode; here
    fraction 1 keeps every episode.)
    """
    order = np.argsort(-returns, kind="stable")  # best first
    target = max(int(fraction * lengths.sum()), 1)
    keep = np.cumsum(lengths[order]) <= target
    keep[0] = True
    return np.sort(order[keep])


class TrajectoryBuffer:
    """Samples `TrajectoryBatch`es of K-step windows from an offline dataset.

    `return_scale`: returns-to-go are divided by it inside the model; None takes the largest
    |episode return| in the data (1 if every return is 0). The DT paper fixes it per domain
    instead (1000 for MuJoCo locomotion, 10 for Reacher): pass such a value to compare.
    `max_timestep`: size of the timestep embedding; None takes the longest episode of the
    data (timesteps never seen in training would have untrained embeddings anyway).
    `top_fraction` < 1 samples only the highest-return episodes covering that fraction of the
    steps (%BC); statistics are always computed over all episodes.

    Example:
        >>> dataset = load_minari("rltrans/cartpole-mixed-v0")  # doctest: +SKIP
        >>> buffer = TrajectoryBuffer(dataset, context=20)  # doctest: +SKIP
        >>> batch = buffer.sample(64)  # doctest: +SKIP
        >>> batch.states.shape, batch.returns_to_go.shape  # doctest: +SKIP
        (torch.Size([64, 20, 4]), torch.Size([64, 20, 1]))
    """

    def __init__(
        self,
        dataset: OfflineDataset,
        context: int = 20,
        *,
        return_scale: float | None = None,
        max_timestep: int | None = None,
        top_fraction: float = 1.0,
        seed: int = 0,
    ) -> None:
        if context < 1:
            raise ValueError(f"context must be >= 1, got {context}")
        if not 0.0 < top_fraction <= 1.0:
            raise ValueError(f"top_fraction must be in (0, 1], got {top_fraction}")
        if len(dataset) == 0 or dataset.num_steps == 0:
            raise ValueError(f"dataset {dataset.name!r} holds no steps")
        _check_space(dataset.observation_space, "observation")
        _check_space(dataset.action_space, "action")
        self.context = context
        self.frame_stack = int(dataset.frame_stack)
        self.observation_space = policy_observation_space(dataset)
        self.action_space = dataset.action_space
        self._rng = np.random.default_rng(seed)
        episodes = [ep for ep in dataset.episodes if len(ep) > 0]

        # Episode offsets into the flat arrays: episode e holds rows [start[e], end[e]).
        self.lengths = np.array([len(ep) for ep in episodes], dtype=np.int64)  # (E,)
        self.ends = np.cumsum(self.lengths)  # (E,)
        self.starts = self.ends - self.lengths  # (E,)
        self.num_steps = int(self.ends[-1])

        rewards = np.concatenate([ep.rewards for ep in episodes])  # (N,)
        dones = np.zeros(self.num_steps, dtype=bool)
        dones[self.ends - 1] = True
        # R_t = sum_{t' >= t} r_t' (Chen et al. 2021, eq. 1 with gamma = 1), per episode.
        self.rtg = returns_to_go_segments(rewards, dones, 1.0).astype(np.float32)  # (N,)
        if isinstance(self.action_space, gym.spaces.Discrete):
            self.actions = np.concatenate([ep.actions.reshape(-1) for ep in episodes])
            self.actions = self.actions.astype(np.int64)  # (N,)
        else:
            self.actions = np.concatenate(
                [ep.actions.reshape(len(ep), -1) for ep in episodes]
            ).astype(np.float32)  # (N, A)

        # Image observations stay in their episodes (DQN Replay episodes are views of one
        # multi-GB array) and are gathered, and frame-stacked, per window; anything else is
        # small enough for one flat copy gathered in a single indexing operation.
        self._episode_obs = [ep.observations for ep in episodes]
        per_window = self.frame_stack > 1 or self.observation_space.dtype == np.uint8
        self._flat_obs = None if per_window else np.concatenate(self._episode_obs)  # (N, ...)
        self.obs_shape = tuple(self.observation_space.shape or ())

        episode_returns = np.array([ep.episode_return for ep in episodes], dtype=np.float64)
        self.statistics = self._compute_stats(episode_returns, return_scale, max_timestep)
        self.max_timestep = self.statistics.max_timestep
        # Episodes windows are drawn from, and the cumulative step count over them.
        self._selected = _top_episodes(self.lengths, episode_returns, top_fraction)  # (E',)
        self._selected_ends = np.cumsum(self.lengths[self._selected])  # (E',)

    def _compute_stats(
        self, episode_returns: np.ndarray, return_scale: float | None, max_timestep: int | None
    ) -> TrajectoryStats:
        if normalizes_states(self.observation_space):
            # Over dataset rows: with frame stacks the (*row_shape) stats broadcast over k.
            flat = np.concatenate(self._episode_obs).astype(np.float64)  # (N, *row_shape)
            mean = torch.from_numpy(flat.mean(axis=0)).float()  # (*obs_shape)
            std = torch.from_numpy(flat.std(axis=0) + STD_EPS).float()
        else:
            mean, std = torch.zeros(()), torch.ones(())
        if return_scale is None:
            peak = float(np.abs(episode_returns).max())
            return_scale = peak if peak > 0 else 1.0
        if return_scale <= 0:
            raise ValueError(f"return_scale must be > 0, got {return_scale}")
        if max_timestep is None:
            max_timestep = int(self.lengths.max())
        if max_timestep < 1:
            raise ValueError(f"max_timestep must be >= 1, got {max_timestep}")
        return TrajectoryStats(mean, std, float(return_scale), int(max_timestep))

    def stats(self) -> dict[str, Tensor | float | int]:
        """State mean/std, return scale and max timestep, for the model and its checkpoint."""
        return self.statistics.as_dict()

    def sample(
        self,
        batch_size: int,
        generator: np.random.Generator | None = None,
        *,
        device: torch.device | str | None = None,
    ) -> TrajectoryBatch:
        """`batch_size` windows of K steps (own seeded generator unless one is given)."""
        rng = self._rng if generator is None else generator
        k = self.context
        # One uniform draw over the selected steps = episode in proportion to its length,
        # then a uniform start inside it (the DT reference code's two draws, in one).
        u = rng.integers(0, self._selected_ends[-1], size=batch_size)  # (B,)
        j = np.searchsorted(self._selected_ends, u, side="right")  # (B,) index into selected
        episode = self._selected[j]  # (B,)
        offset = u - (self._selected_ends[j] - self.lengths[episode])  # (B,) start in episode
        first = self.starts[episode] + offset  # (B,) flat row of the first real step
        real = np.minimum(k, self.ends[episode] - first)  # (B,) real steps in the window
        pad = k - real  # (B,) left padding
        positions = np.arange(k)  # (K,)
        mask = positions[None, :] >= pad[:, None]  # (B, K)
        # Flat row of every window slot; padded slots point at the first real row (zeroed below).
        rows = first[:, None] + np.maximum(positions[None, :] - pad[:, None], 0)  # (B, K)

        timesteps = np.minimum(rows - self.starts[episode][:, None], self.max_timestep - 1)
        batch = TrajectoryBatch(
            states=torch.from_numpy(self._gather_states(rows, episode, mask)),
            actions=torch.from_numpy(self._zero_padding(self.actions[rows], mask)),
            returns_to_go=torch.from_numpy(self._zero_padding(self.rtg[rows], mask)[..., None]),
            timesteps=torch.from_numpy(np.where(mask, timesteps, 0)),
            mask=torch.from_numpy(mask),
        )
        return batch if device is None else batch.to(device)

    @staticmethod
    def _zero_padding(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """values (B, K, ...) with padded slots set to 0 (in place on the gathered copy)."""
        values[~mask] = 0
        return values

    def _gather_states(self, rows: np.ndarray, episode: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """States (B, K, *obs_shape) of the window rows, zero in padded slots."""
        if self._flat_obs is not None:
            return self._zero_padding(self._flat_obs[rows], mask)  # one gather (B, K, ...)
        b, k = rows.shape
        out = np.zeros((b, k, *self.obs_shape), dtype=self.observation_space.dtype)
        local = rows - self.starts[episode][:, None]  # (B, K) row inside the episode
        pad = k - mask.sum(axis=1)  # (B,)
        # A loop over B (not K): each window is one gather from its own episode's frames.
        for i in range(b):
            frames = self._episode_obs[episode[i]]
            idx = local[i, pad[i] :]  # (real,)
            out[i, pad[i] :] = stack_rows(frames, idx, self.frame_stack)
        return out


def stack_rows(frames: np.ndarray, index: np.ndarray, k: int) -> np.ndarray:
    """Rows `index` (n,) of one episode, each stacked with its k-1 predecessors: (n, k, ...).

    Rows before the episode start are zeros, the rule of `rltrans.envs.dqn_replay.stack_frames` and
    of Gymnasium's `FrameStackObservation(padding_type="zero")` at evaluation; k = 1 returns
    the rows themselves, (n, ...).
    """
    if k <= 1:
        return frames[index]
    rows = index[:, None] + np.arange(1 - k, 1)  # (n, k) oldest first
    out = frames[np.maximum(rows, 0)]  # (n, k, ...) a copy
    out[rows < 0] = 0
    return out
