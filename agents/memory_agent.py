"""Memory policies for online RL: observation encoder + backbone + policy and value heads.

One recipe serves every backbone (GTrXL, TrXL, TrXL-I, LSTM/GRU, the MLP
control): the backbone is picked once at build time from ``backbone=`` and
hides its memory behind the interface of :mod:`rltrans.backbones.rnn`.

Agent interface (ARCHITECTURE.md): ``initial_state(num_envs)``,
``act(obs, state, done) -> (ActOutput, state)``, ``evaluate(segment) ->
(log_prob, entropy, value, aux)``.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple, get_args

import gymnasium as gym
import torch
from torch import Tensor, nn

from agents.encoders import build_encoder, layer_init
from agents.heads import build_action_head
from rltrans.backbones.gtrxl import PRESETS, TransformerStack
from rltrans.backbones.rnn import MLPBackbone, RNNBackbone
from rltrans.core.attention import check_choice
from rltrans.types import Segment, Tree, tree_map

BackboneName = Literal["gtrxl", "trxl", "trxl_i", "lstm", "gru", "mlp"]
BACKBONES: tuple[str, ...] = get_args(BackboneName)


class ActOutput(NamedTuple):
    """What one acting step returns per env: action (N, ...), log_prob (N,), value (N,)."""

    action: Tensor
    log_prob: Tensor
    value: Tensor


def build_backbone(name: BackboneName, dim: int, layers: int, heads: int, memory: int, **kw):
    """The backbone module for a name; transformer options (position, gate, ...) go in kw."""
    check_choice("backbone", name, BACKBONES)
    if name in PRESETS:
        return TransformerStack.preset(name, dim, layers, heads, memory=memory, **kw)
    if kw:
        raise ValueError(f"options {sorted(kw)} only apply to transformer backbones, not {name!r}")
    if name in ("lstm", "gru"):
        return RNNBackbone(dim, layers, cell=name)
    return MLPBackbone(dim, layers)


class MemoryAgent(nn.Module):
    """Actor-critic with a shared sequence backbone.

    >>> env = gym.make("CartPole-v1")
    >>> agent = MemoryAgent(env.observation_space, env.action_space, backbone="gtrxl", dim=32,
    ...                     layers=1, heads=2, memory=8)
    >>> state = agent.initial_state(3)
    >>> out, state = agent.act(torch.zeros(3, 4), state, torch.ones(3, dtype=torch.bool))
    >>> out.action.shape, out.value.shape
    (torch.Size([3]), torch.Size([3]))
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        *,
        backbone: BackboneName = "gtrxl",
        dim: int = 128,
        layers: int = 3,
        heads: int = 4,
        memory: int = 64,
        encoder: dict[str, Any] | None = None,
        **backbone_options: Any,
    ) -> None:
        super().__init__()
        self.observation_space, self.action_space = observation_space, action_space
        self.encoder = build_encoder(observation_space, dim, **(encoder or {}))
        self.backbone = build_backbone(backbone, dim, layers, heads, memory, **backbone_options)
        self.policy = build_action_head(action_space, dim)
        self.value = layer_init(nn.Linear(dim, 1), gain=1.0)

    @property
    def device(self) -> torch.device:
        """Device of the parameters (derived, never stored)."""
        return next(self.parameters()).device

    def initial_state(self, num_envs: int) -> Tree:
        """Fresh per-env memory for ``num_envs`` environments."""
        return self.backbone.initial_state(num_envs, self.device)

    def state_to_memory(self, state: Tree) -> Tree:
        """The training memory of a segment that starts at the current step (a copy)."""
        return self.backbone.state_to_memory(state)

    @torch.no_grad()
    def act(
        self, obs: Tree, state: Tree, done: Tensor, *, deterministic: bool = False
    ) -> tuple[ActOutput, Tree]:
        """One step for N envs: obs (N, ...), done (N,) = a new episode starts at this obs."""
        h, state = self.backbone.step(self.encoder(obs), state, done)
        dist = self.policy(h)
        action = dist.mode() if deterministic else dist.sample()
        return ActOutput(action, dist.log_prob(action), self.value(h)[..., 0]), state

    @torch.no_grad()
    def peek_value(self, obs: Tree, state: Tree) -> Tensor:
        """V(obs) as the next step of the current episodes, leaving ``state`` untouched.

        Used to bootstrap truncated episodes from their final observation.
        """
        h, _ = self.backbone.step(self.encoder(obs), tree_map(torch.clone, state), None)
        return self.value(h)[..., 0]

    def evaluate(self, segment: Segment) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor]]:
        """Recompute log-probs, entropies and values (B, L) of stored segments."""
        h, _ = self.backbone(self.encoder(segment.obs), segment.memory, starts=segment.starts)
        dist = self.policy(h)
        return dist.log_prob(segment.actions), dist.entropy(), self.value(h)[..., 0], {}
