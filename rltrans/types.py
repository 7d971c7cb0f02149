"""Batch dataclasses and the small tree helpers that let buffers hold any observation
or memory structure (tensor, dict, tuple, NamedTuple) without string-keyed plumbing."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

Tree = Any  # a Tensor, or a dict / tuple / list / NamedTuple of Trees
Aux = dict[str, Tensor]  # an agent's auxiliary outputs by name (e.g. a ponder cost)


def tree_map(fn: Callable[..., Any], tree: Tree, *rest: Tree) -> Tree:
    """Apply fn to every tensor leaf (zipping leaves of trees of the same structure)."""
    if isinstance(tree, Tensor):
        return fn(tree, *rest)
    if isinstance(tree, dict):
        return {k: tree_map(fn, v, *(r[k] for r in rest)) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # NamedTuple
        return type(tree)(*(tree_map(fn, *vals) for vals in zip(tree, *rest, strict=True)))
    if isinstance(tree, (tuple, list)):
        return type(tree)(tree_map(fn, *vals) for vals in zip(tree, *rest, strict=True))
    return tree  # non-tensor leaves (ints such as a ring cursor) pass through


def tree_leaves(tree: Tree) -> list[Tensor]:
    """All tensor leaves of a tree."""
    out: list[Tensor] = []
    tree_map(lambda t: out.append(t), tree)
    return out


def tree_stack(trees: list[Tree], dim: int = 0) -> Tree:
    """Stack a list of same-structure trees leaf by leaf."""
    return tree_map(lambda *ts: torch.stack(ts, dim=dim), *trees)


class ActOutput(NamedTuple):
    """What one acting step returns per env, as the policy has it.

    action:     (N, ...) the action as the policy represents it (stored for learning)
    env_action: (N, ...) the same action in the env's values (index + start, clipped Box)
    log_prob:   (N,) log-probability of ``action`` (None for policies without one)
    value:      (N,) the critic's value of the observation (None without a critic)
    """

    action: Tensor
    env_action: Tensor
    log_prob: Tensor | None = None
    value: Tensor | None = None


class ActingPolicy(Protocol):
    """The one acting interface: memory agents, DT/BC, loaded and scripted policies.

    ``state`` is a tensor or a small named tuple of tensors indexed by env id; ``done`` (N,)
    marks envs whose episode starts at ``obs``. ``observe`` folds in the rewards (N,) of the
    step just taken (a return-to-go counts down; memory policies return the state unchanged).
    """

    def initial_state(self, num_envs: int) -> Tree: ...

    def act(
        self, obs: Tree, state: Tree, done: Tensor, *, deterministic: bool = False
    ) -> tuple[ActOutput, Tree]: ...

    def observe(self, state: Tree, reward: Tensor) -> Tree: ...


@dataclass
class Segment:
    """B training sequences of L consecutive steps each, with the memory that precedes them.

    obs:     tree of (B, L, ...) observations as the agent saw them
    actions: (B, L, ...) actions taken (unclipped samples)
    starts:  (B, L) bool, True where an episode begins (memory before it is invisible)
    memory:  backbone memory of the B sequences, batch-first (stored once per segment)
    """

    obs: Tree
    actions: Tensor
    starts: Tensor
    memory: Tree


@dataclass
class PPOBatch:
    """A minibatch of segments plus what PPO needs per step, all (B, L)."""

    segment: Segment
    log_probs: Tensor
    values: Tensor
    advantages: Tensor
    returns: Tensor
    mask: Tensor


@dataclass
class TrajectoryBatch:
    """B windows of K steps, left-padded; padded steps hold zeros and have mask False."""

    states: Tensor  # (B, K, *obs_shape) raw observations (frame stacks (B, K, k, H, W) uint8)
    actions: Tensor  # (B, K) long for Discrete, (B, K, A) float32 for Box (A = prod(shape))
    returns_to_go: Tensor  # (B, K, 1) float32 sum of rewards from this step to the episode end
    timesteps: Tensor  # (B, K) long step within the episode, clamped to max_timestep - 1
    mask: Tensor  # (B, K) bool, True = real step

    @property
    def batch_size(self) -> int:
        """Number of windows B."""
        return self.mask.shape[0]

    @property
    def context(self) -> int:
        """Window length K."""
        return self.mask.shape[1]

    def to(self, device: torch.device | str) -> TrajectoryBatch:
        """The same batch on `device`."""
        return TrajectoryBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


@dataclass
class TrajectoryStats:
    """What a DT model needs from its training data, saved with it in every checkpoint.

    `state_mean`/`state_std` are (*obs_shape) for normalised observations (see
    `normalizes_states`) and () zeros/ones otherwise; `return_scale` divides returns-to-go;
    `max_timestep` is the size of the timestep embedding.
    """

    state_mean: Tensor
    state_std: Tensor
    return_scale: float
    max_timestep: int

    def as_dict(self) -> dict[str, Tensor | float | int]:
        """Tensors, floats and ints only: safe for `torch.load(weights_only=True)`."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any] | TrajectoryStats) -> TrajectoryStats:
        """Restore from `as_dict()` / `TrajectoryBuffer.stats()` output (checks the keys)."""
        if isinstance(stats, TrajectoryStats):
            return stats
        names = [f.name for f in fields(cls)]
        if sorted(stats) != sorted(names):
            raise ValueError(f"stats keys {sorted(stats)}; expected exactly {sorted(names)}")
        return cls(
            state_mean=torch.as_tensor(stats["state_mean"], dtype=torch.float32),
            state_std=torch.as_tensor(stats["state_std"], dtype=torch.float32),
            return_scale=float(stats["return_scale"]),
            max_timestep=int(stats["max_timestep"]),
        )
