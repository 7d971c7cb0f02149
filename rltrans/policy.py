"""Saved policies for use from Python: ``rltrans.load_policy(path)``.

>>> policy = load_policy("runs/my-run/checkpoints/last.pt")     # doctest: +SKIP
>>> state = policy.initial_state(1)                              # doctest: +SKIP
>>> action, state = policy.act(obs[None], state)                 # doctest: +SKIP

Return-conditioned policies (agent=dt|bc, trained offline) take the return to aim for, and
count the rewards they receive down from it (Chen et al. 2021, Algorithm 1):

>>> dt = load_policy("runs/dt-run")                              # doctest: +SKIP
>>> state = dt.initial_state(1, target_return=500.0)             # doctest: +SKIP
>>> action, state = dt.act(obs[None], state, done)               # doctest: +SKIP
>>> state = dt.observe(state, reward[None])                      # doctest: +SKIP

The class is picked once from the checkpoint's ``algo.kind`` (:data:`POLICY_CLASSES`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from minari.serialization import deserialize_space, serialize_space

from rltrans.checkpoint import CheckpointError, load_checkpoint
from rltrans.spaces import obs_to_tensor
from rltrans.types import Tree, tree_leaves


def spaces_payload(observation_space: gym.Space, action_space: gym.Space) -> dict[str, str]:
    """Exact JSON descriptions of the spaces, so a checkpoint can rebuild its agent alone."""
    return {
        "observation_space_json": serialize_space(observation_space),
        "action_space_json": serialize_space(action_space),
    }


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, or a run directory / checkpoints directory -> its last.pt."""
    path = Path(path)
    for candidate in (path, path / "last.pt", path / "checkpoints" / "last.pt"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"no checkpoint at {path} (looked for the file itself, {path / 'last.pt'} and "
        f"{path / 'checkpoints' / 'last.pt'})"
    )


def agent_from_checkpoint(payload: dict[str, Any], device: torch.device | str = "cpu"):
    """Rebuild the agent a checkpoint describes and load its weights."""
    try:
        agent_cfg = payload["config"]["agent"]
        obs_space = deserialize_space(payload["observation_space_json"])
        act_space = deserialize_space(payload["action_space_json"])
        state_dict = payload["model"]
    except KeyError as err:
        raise CheckpointError(
            f"checkpoint lacks {err}; it was not written by rltrans.train"
        ) from None
    # Build arguments that are not config knobs, e.g. DT's dataset statistics (whose
    # max_timestep sizes the timestep embedding): saved by the trainer as "agent_kwargs".
    extra = payload.get("agent_kwargs") or {}
    from rltrans.registry import RegistryError, build_agent

    try:
        agent = build_agent(agent_cfg, obs_space, act_space, **extra)
    except RegistryError as err:
        raise CheckpointError(f"checkpoint config: {err}") from None
    agent.load_state_dict(state_dict)
    return agent.to(device).eval()


class Policy:
    """A trained agent behind a NumPy-or-torch acting API with explicit per-env state."""

    def __init__(self, agent: torch.nn.Module, config: dict[str, Any]) -> None:
        self.agent, self.config = agent, config
        self.observation_space = agent.observation_space
        self.action_space = agent.action_space

    @property
    def device(self) -> torch.device:
        """Device of the agent's parameters."""
        return next(self.agent.parameters()).device

    def initial_state(self, num_envs: int) -> Tree:
        """Fresh memory for ``num_envs`` environments."""
        return self.agent.initial_state(num_envs)

    def act(
        self, obs: Any, state: Tree, done: Any = None, *, deterministic: bool = True
    ) -> tuple[Any, Tree]:
        """Actions for a batch of observations (N, ...); ``done`` (N,) marks episode starts.

        NumPy in, NumPy out (in the env's action format); torch in, torch out.
        """
        as_numpy = not isinstance(obs, torch.Tensor)
        x = obs_to_tensor(obs, self.observation_space, self.device)
        n = tree_leaves(x)[0].shape[0]
        if done is None:
            done = torch.zeros(n, dtype=torch.bool, device=self.device)
        done = torch.as_tensor(np.asarray(done) if as_numpy else done, device=self.device).bool()
        out, state = self.agent.act(x, state, done, deterministic=deterministic)
        head = self.agent.policy
        action = head.env_action(out.action) if as_numpy else head.env_action_tensor(out.action)
        return action, state

    def observe(self, state: Tree, reward: Any) -> Tree:
        """Fold in the rewards (N,) of the last step; memory policies do not use them."""
        return state

    @classmethod
    def from_payload(cls, payload: dict[str, Any], device: torch.device | str = "cpu") -> Policy:
        """The policy a loaded checkpoint payload describes."""
        return cls(agent_from_checkpoint(payload, device), payload["config"])


class ReturnConditionedPolicy(Policy):
    """A Decision Transformer (or its BC baseline) conditioned on a target return per env.

    ``initial_state(n, target_return=...)`` sets the return each env's episodes aim for
    (default :attr:`target_return`: the evaluation target the checkpoint recorded, else the
    best return in its dataset). Pass each step's rewards to :meth:`observe` (or as
    ``act(..., reward=...)``) so the return-to-go counts down; BC ignores the target.
    Discrete actions are sampled unless ``deterministic=True`` (the default follows the
    training run's ``algo.eval_deterministic``; DT's Atari code samples).
    """

    def __init__(
        self, agent: torch.nn.Module, config: dict[str, Any], target_return: float | None = None
    ) -> None:
        super().__init__(agent, config)
        self.target_return = target_return
        self.deterministic = bool(config.get("algo", {}).get("eval_deterministic", False))

    @classmethod
    def from_payload(
        cls, payload: dict[str, Any], device: torch.device | str = "cpu"
    ) -> ReturnConditionedPolicy:
        """The policy of an offline checkpoint; its default target is the largest recorded one."""
        targets = payload.get("eval_targets") or []
        best = payload.get("dataset", {}).get("max_return")
        default = max(targets) if targets else best
        return cls(agent_from_checkpoint(payload, device), payload["config"], default)

    def initial_state(self, num_envs: int, target_return: Any = None) -> Tree:
        """Empty contexts for ``num_envs`` envs aiming at ``target_return`` (one value or (N,))."""
        target = self.target_return if target_return is None else target_return
        if target is None:
            raise ValueError(
                "this checkpoint records no default target return; pass "
                "initial_state(n, target_return=<the return to aim for>)"
            )
        if not isinstance(target, torch.Tensor):
            target = np.asarray(target, dtype=np.float32)
        return self.agent.initial_state(num_envs, torch.as_tensor(target, device=self.device))

    def act(
        self,
        obs: Any,
        state: Tree,
        done: Any = None,
        *,
        reward: Any = None,
        deterministic: bool | None = None,
    ) -> tuple[Any, Tree]:
        """Actions for obs (N, ...); ``reward`` (N,), if given, is the previous step's reward.

        ``done`` (N,) marks envs whose episode starts at ``obs`` (their context restarts from
        their target). NumPy in, NumPy out; torch in, torch out.
        """
        as_numpy = not isinstance(obs, torch.Tensor)
        if reward is not None:
            state = self.observe(state, reward)
        if done is not None:
            done = torch.as_tensor(np.asarray(done) if as_numpy else done, device=self.device)
        if deterministic is None:
            deterministic = self.deterministic
        out, state = self.agent.act(obs, state, done, deterministic=deterministic)
        return (out.env_action.cpu().numpy() if as_numpy else out.env_action), state

    def observe(self, state: Tree, reward: Any) -> Tree:
        """Subtract the rewards (N,) of the last step from each env's return-to-go."""
        if not isinstance(reward, torch.Tensor):
            reward = np.asarray(reward, dtype=np.float32)
        return self.agent.observe(state, torch.as_tensor(reward, device=self.device))


# Picked once per checkpoint from its algo.kind; online (PPO/IMPALA) agents keep per-env memory.
POLICY_CLASSES: dict[str, type[Policy]] = {
    "online": Policy,
    "offline": ReturnConditionedPolicy,
}


def load_policy(path: str | Path, device: torch.device | str = "cpu") -> Policy:
    """Load a saved rltrans policy (checkpoint file or run directory) for acting."""
    payload = load_checkpoint(resolve_checkpoint(path), map_location=device)
    kind = payload.get("config", {}).get("algo", {}).get("kind", "online")
    if kind not in POLICY_CLASSES:
        raise CheckpointError(
            f"checkpoint has algo.kind={kind!r}; known kinds: {', '.join(POLICY_CLASSES)}"
        )
    return POLICY_CLASSES[kind].from_payload(payload, device)
