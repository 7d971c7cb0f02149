"""Repeat Previous memory task (after POPGym's RepeatPrevious, Morad et al. 2023).

Each step shows a random symbol out of `num_symbols` as a one-hot vector; the agent
must answer with the symbol it saw `k` steps earlier. Writing s_t for the symbol in
the observation the agent acts on at step t (t = 0 is the reset observation), the
action a_t is graded for t >= k and is correct iff a_t == s_{t-k}. k = 0 asks for
the current symbol (a no-memory control).

Reward: +1/(episode_length - k) when correct, -1/(episode_length - k) when wrong,
0 for the first k steps. So the best return is 1.0 and uniform random guessing
scores (2 - num_symbols) / num_symbols in expectation (-0.5 for 4 symbols).

Episodes have a fixed length and end with terminated=True (never truncated): the
end is part of the task, so a learner must not bootstrap past it. The final
observation is the next (never graded) symbol.

Differences from POPGym: symbols are drawn i.i.d. uniformly instead of dealt from a
deck of cards, and POPGym's k counts the current card as 1 (its k=4 is k=3 here).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from rltrans.envs.torch_envs.base import TorchVectorEnv

__all__ = ["RepeatPrevious"]


class RepeatPrevious(TorchVectorEnv):
    """N Repeat Previous tasks stepped together.

    Example:
        >>> env = RepeatPrevious(num_envs=16, num_symbols=4, k=4, episode_length=32)
        >>> obs, _ = env.reset(seed=0)          # (16, 4) one-hot symbols
        >>> obs, r, term, trunc, info = env.step(obs.argmax(-1))

    Args:
        num_envs: number of envs N.
        num_symbols: size of the symbol alphabet (>= 2); also the number of actions.
        k: how many steps back the answer lies (>= 0).
        episode_length: steps per episode (> k).
        device: where all state and returned tensors live.
        validate_actions: check action values each step (a host sync for GPU-tensor actions).
    """

    def __init__(
        self,
        num_envs: int,
        num_symbols: int = 4,
        k: int = 4,
        episode_length: int = 32,
        device: str | torch.device = "cpu",
        validate_actions: bool = True,
    ) -> None:
        """Build N tasks; see the class docstring for the arguments."""
        if not isinstance(num_symbols, int) or num_symbols < 2:
            raise ValueError(f"num_symbols must be an int >= 2, got {num_symbols!r}")
        if not isinstance(k, int) or k < 0:
            raise ValueError(f"k must be an int >= 0, got {k!r}")
        if not isinstance(episode_length, int) or episode_length <= k:
            raise ValueError(f"episode_length must be an int > k={k}, got {episode_length!r}")
        super().__init__(
            num_envs=num_envs,
            single_observation_space=gym.spaces.Box(0.0, 1.0, (num_symbols,), dtype=np.float32),
            single_action_space=gym.spaces.Discrete(num_symbols),
            max_episode_steps=None,  # the task ends itself after episode_length steps
            device=device,
            validate_actions=validate_actions,
        )
        self.num_symbols = num_symbols
        self.k = k
        self.episode_length = episode_length
        self.reward_scale = 1.0 / (episode_length - k)
        # history[:, -1] is the symbol on show, history[:, 0] the one shown k steps
        # before it: a shift register of k + 1 symbols per env.  (N, k + 1)
        self.history = torch.zeros(num_envs, k + 1, dtype=torch.int64, device=self.device)
        self.t = torch.zeros(num_envs, dtype=torch.int64, device=self.device)

    def _draw(self) -> torch.Tensor:
        """One uniform symbol per env, (N,)."""
        return torch.randint(
            0, self.num_symbols, (self.num_envs,), generator=self.generator, device=self.device
        )

    def _reset_idx(self, mask: torch.Tensor) -> None:
        """Show a fresh symbol and restart the step count for envs where `mask` is True."""
        fresh = torch.zeros_like(self.history)
        # Slots before the newest are left zero: they leave the register after k steps,
        # before grading starts at t = k, so they are never graded.
        fresh[:, -1] = self._draw()
        self.history = torch.where(mask[:, None], fresh, self.history)
        self.t = torch.where(mask, 0, self.t)

    def _step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Grade the answer against the symbol k steps back, then show the next one."""
        graded = self.t >= self.k
        correct = actions == self.history[:, 0]
        signed = torch.where(correct, self.reward_scale, -self.reward_scale)
        reward = torch.where(graded, signed, 0.0).to(torch.float32)
        self.t = self.t + 1
        # Shift left by one and append the new symbol.  (N, k + 1)
        self.history = torch.cat([self.history[:, 1:], self._draw()[:, None]], dim=1)
        terminated = self.t >= self.episode_length
        return reward, terminated, {}

    def _observe(self) -> torch.Tensor:
        """(N, num_symbols) float32 one-hot of the symbol on show."""
        return torch.nn.functional.one_hot(self.history[:, -1], self.num_symbols).to(torch.float32)
