"""Acting loop: drive a vector env with an agent and fill a rollout buffer.

The in-process :class:`LocalActor` is the debugging mode and the PPO actor.
Conventions (Gymnasium 1.x, SAME_STEP autoreset everywhere in rltrans): when
env i ends at step t, the returned obs[i] is already the first observation of
its next episode, so the agent is told ``done[i] = True`` at step t + 1 and
resets that env's memory before acting. There is no dummy transition to mask.
A truncated episode bootstraps from V(final obs) computed with the memory of
the episode that just ended (:meth:`MemoryAgent.peek_value`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from gymnasium.vector import VectorEnv

from rltrans.buffers.rollout import RolloutBuffer
from rltrans.envs import is_torch_env
from rltrans.spaces import obs_to_tensor
from rltrans.types import Tree


def final_observations(info: dict[str, Any], obs: Any) -> Any:
    """The observation batch with rows of ended envs replaced by their true final observation."""
    final, mask = info["final_obs"], np.asarray(info["_final_obs"])
    if isinstance(final, torch.Tensor):  # torch-native envs: already a batched tensor
        keep = torch.as_tensor(mask, device=final.device).view(-1, *[1] * (final.dim() - 1))
        return torch.where(keep, final, obs)

    def replace(batch: Any, rows: list) -> Any:
        if isinstance(batch, dict):
            return {k: replace(v, [r[k] for r in rows]) for k, v in batch.items()}
        if isinstance(batch, tuple):
            return tuple(replace(v, [r[j] for r in rows]) for j, v in enumerate(batch))
        out = np.array(batch, copy=True)
        for i, row in zip(np.flatnonzero(mask), rows, strict=True):
            out[i] = row
        return out

    return replace(obs, [final[i] for i in np.flatnonzero(mask)])


class RewardScaler:
    """Divide rewards by a running std of the discounted return (as gymnasium's NormalizeReward;
    Engstrom et al. 2020, "Implementation Matters in Deep Policy Gradients", section 3).

    Keeps value targets O(1) whatever the reward scale, so that with a shared trunk the value
    loss does not swamp the policy gradient under global-norm clipping. Rewards are only ever
    scaled down (the divisor is at least 1): dividing by a std below 1 would blow rewards up
    once a sparse task is solved and its returns stop varying (seen on the T-maze). Only what
    the learner sees is scaled; episode statistics stay in the env's units.
    """

    def __init__(self, num_envs: int, gamma: float, device, epsilon: float = 1e-8) -> None:
        self.gamma, self.epsilon = gamma, epsilon
        self.returns = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.count = torch.tensor(epsilon, dtype=torch.float64, device=device)
        self.mean = torch.zeros((), dtype=torch.float64, device=device)
        self.var = torch.ones((), dtype=torch.float64, device=device)

    def __call__(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """Scaled rewards (N,); ``done`` (N,) ends the running returns of finished episodes."""
        self.returns = self.returns * self.gamma + reward.double()
        # Chan et al. parallel update of mean/var with this step's N returns.
        n = self.returns.numel()
        batch_mean, batch_var = self.returns.mean(), self.returns.var(unbiased=False)
        delta, total = batch_mean - self.mean, self.count + n
        self.mean = self.mean + delta * n / total
        self.var = (
            self.var * self.count + batch_var * n + delta**2 * self.count * n / total
        ) / total
        self.count = total
        self.returns = self.returns.masked_fill(done, 0.0)
        return (reward.double() / torch.sqrt(self.var + self.epsilon).clamp(min=1.0)).float()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Running statistics for checkpoints."""
        return {"returns": self.returns, "count": self.count, "mean": self.mean, "var": self.var}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore :meth:`state_dict` (the running returns are per env: same num_envs)."""
        self.count, self.mean, self.var = state["count"], state["mean"], state["var"]
        if state["returns"].shape == self.returns.shape:
            self.returns = state["returns"].to(self.returns.device)


class LocalActor:
    """Steps a vector env in this process; keeps the per-env memory state across rollouts."""

    def __init__(
        self,
        envs: VectorEnv,
        agent: torch.nn.Module,
        *,
        seed: int,
        device,
        reward_scaler: RewardScaler | None = None,
    ) -> None:
        self.envs, self.agent, self.device = envs, agent, torch.device(device)
        self.reward_scaler = reward_scaler
        self.space = envs.single_observation_space
        self.torch_env = is_torch_env(envs)
        obs, _ = envs.reset(seed=seed)
        self.obs = self.to_tensor(obs)
        self.done = torch.ones(envs.num_envs, dtype=torch.bool, device=self.device)
        self.state = agent.initial_state(envs.num_envs)
        self.timings = {"env": 0.0, "act": 0.0}

    def to_tensor(self, obs: Any) -> Tree:
        """Observation batch as tensors on the agent's device."""
        return obs_to_tensor(obs, self.space, self.device)

    def env_action(self, action: torch.Tensor) -> Any:
        """Actions in the env's format (tensors for torch-native envs, NumPy otherwise)."""
        head = self.agent.policy
        return head.env_action_tensor(action) if self.torch_env else head.env_action(action)

    def collect(self, buffer: RolloutBuffer, on_info=None) -> None:
        """Fill ``buffer`` with T steps of all envs; ``on_info(info)`` sees every step's info."""
        timings = self.timings
        # The weights may have changed since the last rollout: re-derive what the acting
        # state caches from them, so acting and the learner's replay agree exactly.
        self.state = self.agent.refresh_state(self.state)
        for t in range(buffer.num_steps):
            t0 = time.perf_counter()
            if t % buffer.segment_length == 0:
                buffer.record_memory(t, self.agent.state_to_memory(self.state))
            out, self.state = self.agent.act(self.obs, self.state, self.done)
            buffer.record_step(t, self.obs, self.done, out.action, out.log_prob, out.value)
            action = self.env_action(out.action)
            t1 = time.perf_counter()
            obs, reward, terminated, truncated, info = self.envs.step(action)
            t2 = time.perf_counter()
            truncated = torch.as_tensor(truncated, device=self.device)
            terminated = torch.as_tensor(terminated, device=self.device)
            final_value = torch.zeros(self.envs.num_envs, device=self.device)
            if bool(truncated.any()):  # rare: one extra forward on a copy of the memory
                final = self.to_tensor(final_observations(info, obs))
                final_value = torch.where(
                    truncated, self.agent.peek_value(final, self.state), final_value
                )
            done = terminated | truncated
            if self.reward_scaler is not None:
                reward = self.reward_scaler(torch.as_tensor(reward, device=self.device), done)
            buffer.record_outcome(t, reward, terminated, truncated, final_value)
            self.obs, self.done = self.to_tensor(obs), done
            if on_info is not None:
                on_info(info)
            t3 = time.perf_counter()
            timings["act"] += (t1 - t0) + (t3 - t2)
            timings["env"] += t2 - t1

    def bootstrap_value(self) -> torch.Tensor:
        """V of the observation after the rollout (used where the last step did not end)."""
        return self.agent.peek_value(self.obs, self.state)

    def pop_timings(self) -> dict[str, float]:
        """Seconds spent acting / stepping envs since the last call."""
        out, self.timings = self.timings, {"env": 0.0, "act": 0.0}
        return out
