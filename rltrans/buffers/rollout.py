"""On-policy rollout storage: T steps x N envs, plus one backbone memory per training segment.

Training uses segments of L consecutive steps of one env. The memory a segment
needs (for GTrXL: M layer inputs per layer) is copied out of the acting state
once, at the segment's first step, so a rollout stores T/L memories per env,
never one per step (the pitfall of caches sized to the episode or per-step
copies of the whole window).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from rltrans.returns import gae, next_values_from
from rltrans.types import PPOBatch, Segment, Tree, tree_leaves, tree_map, tree_stack


class RolloutBuffer:
    """Fixed-size storage filled step by step by an actor, read as minibatches of segments."""

    def __init__(self, num_steps: int, num_envs: int, segment_length: int, device) -> None:
        if segment_length < 1 or num_steps % segment_length:
            raise ValueError(
                f"num_steps={num_steps} must be a positive multiple of segment_length="
                f"{segment_length} (valid segment lengths divide num_steps)"
            )
        self.num_steps, self.num_envs, self.segment_length = num_steps, num_envs, segment_length
        self.device = torch.device(device)
        t, n = num_steps, num_envs
        z = lambda dtype=torch.float32: torch.zeros(t, n, dtype=dtype, device=self.device)  # noqa: E731
        self.log_probs, self.values, self.rewards, self.final_values = z(), z(), z(), z()
        self.terminated, self.truncated, self.starts = (z(torch.bool) for _ in range(3))
        self.advantages, self.returns = z(), z()
        self.obs: Tree = None  # allocated on the first step, from the observation's structure
        self.actions: Tensor | None = None
        self.memories: list[Tree] = [None] * (num_steps // segment_length)

    def _alloc(self, x: Tensor) -> Tensor:
        return torch.zeros((self.num_steps, *x.shape), dtype=x.dtype, device=self.device)

    def record_memory(self, t: int, memory: Tree) -> None:
        """Store the memory of the segment starting at step t (a multiple of L)."""
        self.memories[t // self.segment_length] = memory

    def record_step(self, t: int, obs: Tree, starts: Tensor, action, log_prob, value) -> None:
        """What the agent saw and did at step t."""
        if self.obs is None:
            self.obs = tree_map(self._alloc, obs)
            self.actions = self._alloc(action)

        def put(buf: Tensor, x: Tensor) -> None:
            buf[t] = x

        tree_map(put, self.obs, obs)
        self.actions[t] = action
        self.starts[t], self.log_probs[t], self.values[t] = starts, log_prob, value

    def record_outcome(self, t: int, reward, terminated, truncated, final_value) -> None:
        """What the env returned for step t; final_value = V(final obs) where truncated."""
        self.rewards[t] = torch.as_tensor(reward, dtype=torch.float32, device=self.device)
        self.terminated[t] = torch.as_tensor(terminated, device=self.device)
        self.truncated[t] = torch.as_tensor(truncated, device=self.device)
        self.final_values[t] = final_value

    def compute_advantages(self, bootstrap_value: Tensor, gamma: float, lam: float) -> None:
        """GAE over the rollout; truncated episodes bootstrap from V(final obs)."""
        next_values = next_values_from(
            self.values, bootstrap_value, self.truncated, self.final_values
        )
        self.advantages, self.returns = gae(
            self.rewards, self.values, next_values, self.terminated, self.truncated, gamma, lam
        )

    def _memories_of(self, segments: Tensor, envs: Tensor) -> Tree:
        """The memories of the minibatch's segments alone, gathered from the per-segment list
        (stacking the whole list first would copy every memory of the rollout once per epoch)."""
        return tree_stack(
            [
                tree_map(lambda m, e=e: m[e], self.memories[s])
                for s, e in zip(segments.tolist(), envs.tolist(), strict=True)
            ]
        )

    def minibatches(
        self, num_minibatches: int, generator: torch.Generator | None = None
    ) -> Iterator[PPOBatch]:
        """Shuffled minibatches of whole segments, each with its stored memory."""
        count = self.num_envs * self.num_steps // self.segment_length
        if not 1 <= num_minibatches <= count:
            raise ValueError(f"num_minibatches={num_minibatches} must be in [1, {count} segments]")
        gen_device = generator.device if generator is not None else "cpu"
        order = torch.randperm(count, generator=generator, device=gen_device).to(self.device)
        steps = torch.arange(self.segment_length, device=self.device)
        # A memoryless backbone's memories hold no tensor (an MLP's are ()): nothing to
        # gather, and the per-segment loop below was a tenth of an MLP's PPO update.
        gather = bool(tree_leaves(self.memories[0]))
        for idx in order.tensor_split(num_minibatches):
            # Segment s = k * N + n holds steps k*L .. k*L + L - 1 of env n (segments
            # ordered segment-major): index the (T, N, ...) storage directly, so a minibatch copies
            # only its own steps (images stay uint8; no segment-major copy of the rollout).
            k, n = idx // self.num_envs, (idx % self.num_envs)[:, None]  # (B,), (B, 1)
            t = k[:, None] * self.segment_length + steps  # (B, L)
            starts = self.starts[t, n]
            memory = self._memories_of(k, n[:, 0]) if gather else self.memories[0]
            segment = Segment(
                obs=tree_map(lambda x, t=t, n=n: x[t, n], self.obs),
                actions=self.actions[t, n],
                starts=starts,
                memory=memory,
            )
            yield PPOBatch(
                segment=segment,
                log_probs=self.log_probs[t, n],
                values=self.values[t, n],
                advantages=self.advantages[t, n],
                returns=self.returns[t, n],
                mask=torch.ones_like(starts),
            )
