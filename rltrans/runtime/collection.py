"""Dataset collection on the one acting loop: whole episodes of any policy, for Minari.

The random policy and the epsilon mix are policies like any other (the acting interface of
:class:`rltrans.types.ActingPolicy`), so collecting drives envs through the same
:class:`~rltrans.runtime.episodes.EpisodeLoop` as training and evaluation, and counts
episodes with the same per-env quotas (each env's first episodes in the order it starts
them, so the quota never favours short episodes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.registration import EnvSpec
from torch import Tensor
from tqdm.auto import tqdm

from rltrans.accel.threads import ThreadTuner
from rltrans.envs.offline import Episode
from rltrans.runtime.episodes import EpisodeLoop, Quota
from rltrans.types import ActingPolicy, ActOutput, Tree


class RandomPolicy:
    """Uniform random actions from a (batched) vector action space, seeded."""

    def __init__(self, action_space: gym.Space, seed: int) -> None:
        self.action_space = action_space
        action_space.seed(seed)

    def initial_state(self, num_envs: int) -> None:
        """Memoryless: no state."""
        return None

    def act(
        self, obs: Tree, state: Any, done: Tensor, *, deterministic: bool = False
    ) -> tuple[ActOutput, Any]:
        """One uniform sample per env."""
        action = torch.as_tensor(self.action_space.sample())
        return ActOutput(action, action), state

    def observe(self, state: Any, reward: Tensor) -> Any:
        """Rewards are ignored."""
        return state


class EpsilonMixed:
    """A policy whose env action is replaced by a uniformly random one with probability
    ``epsilon`` per env and step (mixed-quality offline data)."""

    def __init__(
        self, policy: ActingPolicy, action_space: gym.Space, epsilon: float, seed: int
    ) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon={epsilon} must lie in [0, 1]")
        self.policy, self.epsilon = policy, epsilon
        self.random = RandomPolicy(action_space, seed)
        self.rng = np.random.default_rng(seed)

    def initial_state(self, num_envs: int, *args: Any, **kwargs: Any) -> Tree:
        """The wrapped policy's state (conditioning arguments pass through)."""
        return self.policy.initial_state(num_envs, *args, **kwargs)

    def act(
        self, obs: Tree, state: Tree, done: Tensor, *, deterministic: bool = False
    ) -> tuple[ActOutput, Tree]:
        """The policy's action, or a random one where the epsilon draw says so."""
        random, _ = self.random.act(obs, None, done)  # drawn every step: seeded sequences
        out, state = self.policy.act(obs, state, done, deterministic=deterministic)
        if self.epsilon == 0.0:
            return out, state
        n = random.env_action.shape[0]
        explore = torch.as_tensor(self.rng.random(n) < self.epsilon)  # (N,)
        chosen = out.env_action.to(random.env_action.device)
        explore = explore.view(n, *[1] * (chosen.dim() - 1))
        env_action = torch.where(explore, random.env_action.to(chosen.dtype), chosen)
        return out._replace(env_action=env_action), state

    def observe(self, state: Tree, reward: Tensor) -> Tree:
        """The wrapped policy folds in the rewards."""
        return self.policy.observe(state, reward)


def make_collection_env(
    env_id: str | EnvSpec,
    num_envs: int,
    *,
    max_steps: int | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
) -> gym.vector.VectorEnv:
    """A sync vector env with SAME_STEP autoreset (the final obs is in ``info["final_obs"]``)
    and episode statistics, as the acting loop expects."""
    kwargs = dict(env_kwargs or {})
    if max_steps is not None:
        kwargs["max_episode_steps"] = max_steps
    envs = gym.make_vec(
        env_id,
        num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        **kwargs,
    )
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


def collect_episodes(
    env_id: str | EnvSpec,
    policy: ActingPolicy | None,
    *,
    episodes: int,
    epsilon: float = 0.0,
    seed: int = 0,
    num_envs: int = 8,
    max_steps: int | None = None,
    env_kwargs: dict[str, Any] | None = None,
    deterministic: bool = False,
    device: torch.device | str = "cpu",
    state: Tree = None,
    progress: bool = True,
    threads: ThreadTuner | None = None,
) -> list[Episode]:
    """Run ``policy`` (None: uniform random) in a sync vector env; return ``episodes`` episodes.

    With ``epsilon``, each env's action is replaced by a uniformly random one with that
    probability. ``max_steps`` caps each episode's length (truncation); to record that limit
    in a dataset, pass one ``EnvSpec`` (``dataclasses.replace(gym.spec(id),
    max_episode_steps=..)``) here and to ``write_minari(env=...)`` instead. ``state``
    overrides the policy's initial state (e.g. a return-conditioned policy's target);
    ``threads`` (torch_threads=auto) tunes the thread count of the acting calls.
    Episodes come in the order they started (vector step, then env index).

    Example:
        >>> eps = collect_episodes("CartPole-v1", None, episodes=20, num_envs=4)  # doctest: +SKIP
    """
    if episodes < 1 or num_envs < 1:
        raise ValueError(f"episodes={episodes} and num_envs={num_envs} must be >= 1")
    envs = make_collection_env(env_id, num_envs, max_steps=max_steps, env_kwargs=env_kwargs)
    try:
        if policy is None:
            policy = RandomPolicy(envs.action_space, seed)
        elif epsilon > 0.0:
            policy = EpsilonMixed(policy, envs.action_space, epsilon, seed)
        elif not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon={epsilon} must lie in [0, 1]")
        loop = EpisodeLoop(
            envs, policy, seed=seed, device=device, deterministic=deterministic, state=state,
            threads=threads,
        )  # fmt: skip
        return _record(loop, Quota.split(episodes, num_envs), episodes, progress)
    finally:
        envs.close()


def _record(loop: EpisodeLoop, quota: Quota, total: int, progress: bool) -> list[Episode]:
    """Step the loop, keeping each env's transitions while its current episode is counted."""
    n = loop.num_envs
    counted = [quota.take(i) for i in range(n)]  # every env starts an episode at step 0
    started = [0] * n  # vector step at which env i's current episode started
    steps: list[list[tuple[np.ndarray, np.ndarray, float]]] = [[] for _ in range(n)]
    finished: list[tuple[int, int, Episode]] = []
    bar = tqdm(total=total, desc="collecting episodes", unit="ep", disable=not progress)
    t = 0
    while len(finished) < total:
        step = loop.step()
        actions = np.asarray(step.env_action)
        rewards = step.reward.cpu().numpy()
        ended = step.ended.cpu().numpy()
        for i in range(n):
            if counted[i]:
                steps[i].append((np.array(step.raw_obs[i]), np.array(actions[i]), rewards[i]))
            if not ended[i]:
                continue
            if counted[i]:
                episode = _to_episode(
                    steps[i],
                    step.info["final_obs"][i],
                    bool(step.terminated[i]),
                    bool(step.truncated[i]),
                )
                finished.append((started[i], i, episode))
                bar.update(1)
            steps[i], started[i], counted[i] = [], t + 1, quota.take(i)
        t += 1
    bar.close()
    return [episode for _, _, episode in sorted(finished, key=lambda f: f[:2])]


def _to_episode(
    steps: list[tuple[np.ndarray, np.ndarray, float]],
    final_obs: np.ndarray,
    terminated: bool,
    truncated: bool,
) -> Episode:
    observations, actions, rewards = zip(*steps, strict=True)
    return Episode(
        observations=np.stack(observations),  # (T, ...)
        actions=np.stack(actions),  # (T, ...)
        rewards=np.asarray(rewards, dtype=np.float32),  # (T,)
        terminated=terminated,
        truncated=truncated,
        final_observation=np.array(final_obs),
    )
