"""Saved policies for use from Python: ``rltrans.load_policy(path)``.

>>> policy = load_policy("runs/my-run/checkpoints/last.pt")     # doctest: +SKIP
>>> state = policy.initial_state(1)                              # doctest: +SKIP
>>> action, state = policy.act(obs[None], state)                 # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from hydra.utils import instantiate
from minari.serialization import deserialize_space, serialize_space

from envs.spaces import obs_to_tensor
from rltrans.checkpoint import CheckpointError, load_checkpoint
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
    agent = instantiate(
        agent_cfg, observation_space=obs_space, action_space=act_space, _convert_="all"
    )
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


def load_policy(path: str | Path, device: torch.device | str = "cpu") -> Policy:
    """Load a saved rltrans policy (checkpoint file or run directory) for acting."""
    payload = load_checkpoint(resolve_checkpoint(path), map_location=device)
    return Policy(agent_from_checkpoint(payload, device), payload["config"])
