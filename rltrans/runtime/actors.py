"""Actors: what produces training rollouts from envs, behind one interface.

An actor fills a :class:`~rltrans.buffers.rollout.RolloutBuffer` with T steps of N envs,
the initial memory of each training segment, and the version of the policy that acted
(``buffer.policy_version``); a learner consumes buffers and knows no env and no process.
:class:`LocalActor` steps its envs in this process through the one acting loop
(:class:`~rltrans.runtime.episodes.EpisodeLoop`), or for a torch-native env through the
device rollout (:class:`~rltrans.accel.rollout.DeviceRollout`, ``rollout=auto``), which keeps
the loop's observations, dones and memory: it is PPO's actor and the debugging mode of every
learner. A truncated episode bootstraps from V(final obs) computed with the memory
of the episode that just ended (``peek_value``).
"""

from __future__ import annotations

import math
import time
from typing import Any, Protocol

import numpy as np
import torch
from gymnasium.vector import VectorEnv

from rltrans.accel.rollout import DeviceRollout
from rltrans.buffers.rollout import RolloutBuffer
from rltrans.runtime.episodes import EpisodeLoop


class Actor(Protocol):
    """The actor/learner seam: rollouts out, weights (with a version) in."""

    def collect(self, buffer: RolloutBuffer, on_info: Any = None) -> None: ...

    def set_policy_version(self, version: int) -> None: ...


# The least divisor: returns that never leave [-1e-3, 1e-3] are scaled up 1,000 times at most.
MIN_RETURN_SCALE = 1e-3


class RewardScaler:
    """Divide rewards by a running std of the discounted return (as gymnasium's NormalizeReward;
    Engstrom et al. 2020, "Implementation Matters in Deep Policy Gradients", section 3), or by
    the largest |discounted return| so far where that is larger and below 1.

    Keeps value targets O(1) whatever the reward scale, so that with a shared trunk the value
    loss does not swamp the policy gradient under global-norm clipping, and so that returns
    far below 1 (an env that pays a few thousandths per step, as POPGym's do) are not lost
    under a critic whose initial values are O(1). The divisor is the std, but at least the
    largest |discounted return| seen so far capped at 1: large returns are scaled down by
    their std as before, returns that never reach 1 are scaled up until the largest is 1, and
    nothing is scaled beyond that, so a solved sparse task whose returns stop varying is not
    blown up (dividing by the std alone would, as seen on the T-maze). Only what the learner
    sees is scaled; episode statistics stay in the env's units.
    """

    def __init__(self, num_envs: int, gamma: float, device, epsilon: float = 1e-8) -> None:
        self.gamma, self.epsilon = gamma, epsilon
        self.returns = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.count = torch.tensor(epsilon, dtype=torch.float64, device=device)
        self.mean = torch.zeros((), dtype=torch.float64, device=device)
        self.var = torch.ones((), dtype=torch.float64, device=device)
        self.peak = torch.zeros((), dtype=torch.float64, device=device)  # largest |return| seen

    def __call__(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """Scaled rewards (N,); ``done`` (N,) ends the running returns of finished episodes."""
        if self.returns.device.type == "cpu":
            return self._scaled_on_host(reward, done)
        return self._scaled(reward, done)

    def _scaled(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """:meth:`__call__` in tensor ops on the statistics' device (a GPU's)."""
        self.returns = self.returns * self.gamma + reward.double()
        self.peak = torch.maximum(self.peak, self.returns.abs().max())
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
        floor = self.peak.clamp(min=MIN_RETURN_SCALE, max=1.0)
        return (reward.double() / torch.maximum(torch.sqrt(self.var + self.epsilon), floor)).float()

    def _scaled_on_host(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """:meth:`_scaled`'s float64 arithmetic in NumPy and Python floats, written in place
        into the statistics (a dozen tensor dispatches per env step were a fifth of a one-env
        MuJoCo step). One env's batch mean is its return and its variance 0, exactly what
        NumPy computes, without NumPy's reductions (a tenth of that step again)."""
        rewards = reward.detach().numpy().astype(np.float64)
        returns = self.returns.numpy()  # the statistics' memory: updated in place
        count_v, mean_v, var_v, peak_v = (t.numpy() for t in self._statistics())
        returns *= self.gamma
        returns += rewards
        n = returns.size
        if n == 1:
            batch_mean, batch_var = float(returns[0]), 0.0
            largest = abs(batch_mean)
        else:
            batch_mean, batch_var = float(returns.mean()), float(returns.var())
            largest = float(np.abs(returns).max())
        peak = max(float(peak_v), largest)
        count, mean, var = float(count_v), float(mean_v), float(var_v)
        delta, total = batch_mean - mean, count + n
        mean = mean + delta * n / total
        var = (var * count + batch_var * n + delta**2 * count * n / total) / total
        count_v[()], mean_v[()], var_v[()], peak_v[()] = total, mean, var, peak
        returns[done.numpy()] = 0.0
        floor = min(max(peak, MIN_RETURN_SCALE), 1.0)
        scaled = rewards / max(math.sqrt(var + self.epsilon), floor)
        return torch.from_numpy(scaled.astype(np.float32))

    def _statistics(self) -> tuple[torch.Tensor, ...]:
        return self.count, self.mean, self.var, self.peak

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Running statistics for checkpoints. The running returns are not saved: checkpoints
        are taken where every env starts a fresh episode (:meth:`LocalActor.restart`)."""
        stats = zip(("count", "mean", "var", "peak"), self._statistics(), strict=True)
        return {k: v.clone() for k, v in stats}  # copies: the host path updates in place

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore :meth:`state_dict`; running returns start at zero (fresh episodes).

        A state saved before ``peak`` existed resumes with the rule it was trained under (a
        divisor of at least 1): its peak is taken as 1."""
        device = self.returns.device  # copies: the host path updates them in place
        self.count, self.mean, self.var = (
            state[k].to(device, torch.float64, copy=True) for k in ("count", "mean", "var")
        )
        peak = state.get("peak", torch.ones((), dtype=torch.float64))
        self.peak = peak.to(device, torch.float64, copy=True)
        self.returns = torch.zeros_like(self.returns)


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
        rollout: DeviceRollout | None = None,
    ) -> None:
        self.agent, self.reward_scaler = agent, reward_scaler
        self.loop = EpisodeLoop(envs, agent, seed=seed, device=device)
        self.policy_version = 0
        self.rollout = rollout  # the device rollout of a torch-native env, else None

    def use_policy(self, policy: Any) -> None:
        """Act through ``policy``: the agent itself or a wrapper of it with the same acting
        interface (e.g. ``rltrans.accel.CompiledActing``); the learner still replays the agent."""
        self.loop.policy = policy

    @property
    def policy(self) -> Any:
        """What acts: the agent, or its compiled acting step."""
        return self.loop.policy

    def restart(self, seed: int) -> None:
        """Reset every env with ``seed`` and start fresh episodes and memory: what a resumed
        run does first, so a run that restarts here at each checkpoint continues exactly as
        one resumed from that checkpoint (env states are not in checkpoints)."""
        loop = self.loop
        self.loop = EpisodeLoop(loop.envs, self.policy, seed=seed, device=loop.device)
        self.loop.timings, self.loop.threads = loop.timings, loop.threads
        if self.reward_scaler is not None:  # running returns belong to the cut episodes
            self.reward_scaler.returns.zero_()

    def set_policy_version(self, version: int) -> None:
        """The agent is shared with the learner in this process: only the version moves."""
        self.policy_version = version

    def collect(self, buffer: RolloutBuffer, on_info=None) -> None:
        """Fill ``buffer`` with T steps of all envs; ``on_info(info)`` sees every step's info."""
        loop, agent = self.loop, self.agent
        if self.rollout is not None:
            buffer.policy_version = self.policy_version
            self.rollout.collect(
                loop, agent, buffer, reward_scaler=self.reward_scaler, on_info=on_info
            )
            return
        # The weights may have changed since the last rollout: re-derive what the acting
        # state caches from them, so acting and the learner's replay agree exactly.
        loop.state = agent.refresh_state(loop.state)
        buffer.policy_version = self.policy_version
        zeros = torch.zeros(loop.num_envs, device=loop.device)  # V(final obs) where none ended
        for t in range(buffer.num_steps):
            t0 = time.perf_counter()
            if t % buffer.segment_length == 0:
                buffer.record_memory(t, agent.state_to_memory(loop.state))
            t1 = time.perf_counter()
            step = loop.step()
            t2 = time.perf_counter()
            out = step.out
            buffer.record_step(t, step.obs, step.done, out.action, out.log_prob, out.value)
            final_value = zeros  # copied into the buffer, never written
            if bool(step.truncated.any()):  # rare: one extra forward on a copy of the memory
                final = loop.to_tensor(step.final_raw_obs())
                final_value = torch.where(
                    step.truncated, self.policy.peek_value(final, loop.state), final_value
                )
            reward = step.reward
            if self.reward_scaler is not None:
                reward = self.reward_scaler(reward, step.ended)
            buffer.record_outcome(t, reward, step.terminated, step.truncated, final_value)
            if on_info is not None:
                on_info(step.info)
            loop.timings["act"] += (t1 - t0) + (time.perf_counter() - t2)

    def bootstrap_value(self) -> torch.Tensor:
        """V of the observation after the rollout (used where the last step did not end)."""
        return self.policy.peek_value(self.loop.obs, self.loop.state)

    def pop_timings(self) -> dict[str, float]:
        """Seconds spent acting / stepping envs since the last call."""
        return self.loop.pop_timings()
