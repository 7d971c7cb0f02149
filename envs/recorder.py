"""Record every episode an env plays to disk: the data a training run saw, as offline data.

:class:`EpisodeRecorder` is a single-env wrapper: put it in an env config's ``wrappers`` with
``phase: training`` and a PPO run writes each finished training episode (raw observations,
the actions the env received, rewards, how it ended) to ``.npz`` shards in ``folder``; D4RL's
``medium-replay`` datasets are made this way. :func:`read_recorded` reads the shards back as
one :class:`~rltrans.envs.offline.Episode` list in the order they were played (shards are
named by their recorder's creation time), so a caller can keep the episodes of a stretch of
training by their summed lengths. Example::

    python -m rltrans.train agent=mlp_continuous env=gym env.id=Hopper-v5 env.num_envs=1 \\
        "env.wrappers=[{path: rltrans.envs.recorder.EpisodeRecorder, \\
        kwargs: {folder: runs/hopper-replay}, phase: training}]" trust_env_code=true

A shard is written (to a temporary name, then renamed) every ``flush_steps`` recorded steps
and when the env closes; a killed process loses at most the episodes since its last shard.
"""

from __future__ import annotations

import itertools
import os
import time
import uuid
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rltrans.envs.offline import Episode

SHARD_GLOB = "episodes-*.npz"
_FIELDS = ("observations", "actions", "rewards", "lengths", "terminated", "truncated")


class EpisodeRecorder(gym.Wrapper):
    """Writes each finished episode of the wrapped env to ``.npz`` shards in ``folder``."""

    _instances = itertools.count()

    def __init__(self, env: gym.Env, folder: str, flush_steps: int = 10_000) -> None:
        super().__init__(env)
        if flush_steps < 1:
            raise ValueError(f"flush_steps={flush_steps} must be >= 1")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        # Sorting the names sorts shards by recorder, then by shard: creation time leads (a
        # resumed run's recorders come after the interrupted one's).
        self.name = f"{time.time_ns():020d}-{next(self._instances):04d}-{uuid.uuid4().hex[:8]}"
        self.flush_steps = flush_steps
        self.shard = 0
        self._episode: list[Any] | None = None  # [observations (T+1), actions, rewards]
        self._done: list[dict[str, Any]] = []
        self._buffered = 0

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """Resets; the observation starts a new episode (an unfinished one is dropped)."""
        obs, info = self.env.reset(**kwargs)
        self._episode = [[np.array(obs)], [], []]
        return obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        """Steps and records the transition; a finished episode joins the next shard."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self._episode is not None:
            observations, actions, rewards = self._episode
            observations.append(np.array(obs))
            actions.append(np.array(action))
            rewards.append(float(reward))
            if terminated or truncated:
                self._finish(bool(terminated), bool(truncated))
        return obs, reward, terminated, truncated, info

    def _finish(self, terminated: bool, truncated: bool) -> None:
        observations, actions, rewards = self._episode  # type: ignore[misc]
        self._episode = None
        self._done.append(
            dict(
                observations=np.stack(observations),
                actions=np.stack(actions),
                rewards=np.asarray(rewards, np.float32),
                terminated=terminated,
                truncated=truncated,
            )
        )
        self._buffered += len(rewards)
        if self._buffered >= self.flush_steps:
            self.flush()

    def flush(self) -> None:
        """Write the finished episodes not yet on disk as one shard."""
        if not self._done:
            return
        eps, self._done, self._buffered = self._done, [], 0
        arrays = {
            "observations": np.concatenate([e["observations"] for e in eps]),
            "actions": np.concatenate([e["actions"] for e in eps]),
            "rewards": np.concatenate([e["rewards"] for e in eps]),
            "lengths": np.array([len(e["rewards"]) for e in eps], np.int64),
            "terminated": np.array([e["terminated"] for e in eps]),
            "truncated": np.array([e["truncated"] for e in eps]),
        }
        path = self.folder / f"episodes-{self.name}-{self.shard:06d}.npz"
        tmp = path.with_name(path.stem + ".tmp.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
        self.shard += 1

    def close(self) -> None:
        """Writes the last shard, then closes the env."""
        self.flush()
        super().close()


def read_recorded(folder: str | os.PathLike[str]) -> list[Episode]:
    """The episodes :class:`EpisodeRecorder` wrappers wrote to ``folder``, recorder by
    recorder in the order they were made, each recorder's in the order they ended."""
    paths = sorted(Path(folder).glob(SHARD_GLOB))
    if not paths:
        raise FileNotFoundError(f"no recorded episodes ({SHARD_GLOB}) in {folder}")
    episodes = []
    for path in paths:
        with np.load(path) as shard:
            missing = [f for f in _FIELDS if f not in shard]
            if missing:
                raise ValueError(f"{path} lacks {missing}; not a shard EpisodeRecorder wrote")
            data = {f: shard[f] for f in _FIELDS}
        start = 0  # in actions; observations hold one more row per episode
        for k, t in enumerate(data["lengths"].tolist()):
            obs = data["observations"][start + k : start + k + t + 1]
            episodes.append(
                Episode(
                    obs[:-1],
                    data["actions"][start : start + t],
                    data["rewards"][start : start + t],
                    terminated=bool(data["terminated"][k]),
                    truncated=bool(data["truncated"][k]),
                    final_observation=obs[-1],
                )
            )
            start += t
    return episodes
