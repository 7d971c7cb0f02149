"""Decision Transformer (Chen et al. 2021) and the behaviour-cloning baseline of its paper.

Decision Transformer embeds each step of a K-step window as three tokens, return-to-go,
state and action, each plus an embedding of the step's episode timestep; interleaves them as
(R_1, s_1, a_1, R_2, s_2, a_2, ...) -> (B, 3K, D); runs the causal GPT stack of
:mod:`rltrans.backbones.causal`; and reads the action of step t off the hidden state of the
s_t token, which sees R_1..R_t, s_1..s_t and a_1..a_{t-1} only.

`DecisionTransformer` takes a built backbone (a causal stack or a Universal Transformer);
:func:`build_decision_transformer` turns the knobs of ``configs/agent/dt.yaml`` into one;
`BehaviorCloning` has no transformer, so ``configs/agent/bc.yaml``'s knobs are its arguments.

Both models take raw `TrajectoryBatch` windows and own their scaling: state mean/std, return
scale and the timestep embedding size come in as `stats` (`TrajectoryBuffer.stats()`) and
live in registered buffers, so `state_dict()` (and every checkpoint) carries them.

Acting, for N envs at once (one vectorised pass evaluates N target returns), through
rltrans's acting interface, which :class:`rltrans.runtime.episodes.EpisodeLoop` drives::

    state = model.initial_state(N, target_returns)   # (N,) one target per env
    out, state = model.act(obs, state, done)         # done: obs starts a new episode
    state = model.observe(state, reward)             # R_{t+1} = R_t - r_t

`done` must mark observations that begin an episode (vector envs with
``autoreset_mode=SAME_STEP``); the env's context then restarts from its own target.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rltrans.agents.context_policy import ContextPolicy, DTOutput, DTState
from rltrans.agents.encoders import FlattenSteps, build_encoder
from rltrans.agents.heads import build_actions
from rltrans.backbones.base import Backbone
from rltrans.backbones.causal import Init, gpt2_config
from rltrans.backbones.spec import CausalSpec, DTBackboneSpec, UniversalSpec, build
from rltrans.choices import check_choice
from rltrans.core.attention import Kernel
from rltrans.core.block import FFActivation, NormPlacement
from rltrans.core.dropout import Dropout
from rltrans.core.gates import GateName
from rltrans.core.position import PositionName
from rltrans.types import TrajectoryBatch, TrajectoryStats

__all__ = [
    "BehaviorCloning",
    "DTOutput",
    "DTState",
    "DecisionTransformer",
    "build_decision_transformer",
]

DTBackbone = Literal["causal", "universal"]
DEFAULT_MAX_TIMESTEP = 1000  # DT's max_ep_len for MuJoCo, used when no stats are given


# ------------------------------------------------------------------------------ models


class DecisionTransformer(ContextPolicy):
    """Return-conditioned policy over the last K (R, s, a) steps (Chen et al. 2021).

    ``transformer`` is the built backbone the 3K tokens run through: a causal
    `TransformerStack` (GPT-2 as DT uses it, :func:`rltrans.backbones.causal.causal_stack`)
    or a `UniversalTransformer` (one shared block looped with ACT, Dehghani et al. 2019),
    whose ``max_len`` covers 3K tokens; its width is the model's. `max_timestep` defaults
    to the stats' (the data's longest episode) or 1000; later timesteps share the last
    embedding. ``embed_dropout`` is GPT-2's embedding dropout (default: the backbone's
    ``dropout``). ``tau`` weighs the ponder cost of a pondering backbone. Build from config
    knobs with :func:`build_decision_transformer`.

    Example:
        >>> model = build_decision_transformer(env.observation_space, env.action_space,
        ...                                    stats=buffer.stats())  # doctest: +SKIP
        >>> loss, metrics = model.loss(buffer.sample(64))  # doctest: +SKIP
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        transformer: Backbone,
        *,
        context: int = 20,
        max_timestep: int | None = None,
        embed_dropout: float | None = None,
        action_tanh: bool = True,
        predict_next: bool = False,
        tau: float = 0.01,
        stats: dict[str, Any] | TrajectoryStats | None = None,
    ) -> None:
        super().__init__(observation_space, action_space, stats)
        self.tau = tau
        if max_timestep is None:
            have = TrajectoryStats.from_stats(stats).max_timestep if stats is not None else None
            max_timestep = have or DEFAULT_MAX_TIMESTEP
        if context < 1 or max_timestep < 1:
            raise ValueError(
                f"context and max_timestep must be >= 1, got context={context}, "
                f"max_timestep={max_timestep}"
            )
        dim = transformer.dim
        self.context, self.max_timestep, self.dim = context, max_timestep, dim
        if embed_dropout is None:
            embed_dropout = transformer.config.dropout
        # Modality-specific embeddings (section 3: "a linear layer for each modality"; a
        # convolutional encoder for pixel inputs) plus a learned episodic timestep embedding.
        self.embed_return = nn.Linear(1, dim)
        if self.normalize:
            self.embed_state = FlattenSteps(self.obs_shape, dim)  # DT: one Linear for vectors
        else:
            self.embed_state = build_encoder(observation_space, dim)  # Nature-CNN for images
        self.action_codec = build_actions(action_space, dim, dim, action_tanh)
        self.embed_timestep = nn.Embedding(max_timestep, dim)
        self.embed_norm = nn.LayerNorm(dim)  # LayerNorm of the token sequence (the DT code)
        self.embed_drop = Dropout(embed_dropout)  # GPT-2's embedding dropout
        self.transformer = transformer
        # Training may skip the last layer's work off the state tokens (state_outputs) where
        # the backbone can select outputs and has no per-token aux (a ponder cost) to keep.
        self.prunes_to_states = transformer.selects_outputs and not transformer.ponders
        self.next_return_head = nn.Linear(dim, 1) if predict_next else None
        self.next_state_head = None
        if predict_next:
            if not self.normalize:
                raise ValueError(
                    f"predict_next needs vector Box observations to regress, got "
                    f"{observation_space!r}; use predict_next=False"
                )
            self.next_state_head = nn.Linear(dim, math.prod(self.obs_shape))

    def embed_tokens(self, batch: TrajectoryBatch) -> Tensor:
        """Interleaved tokens (B, 3K, D) before the LayerNorm: token 3t is R_t, 3t+1 s_t,
        3t+2 a_t, each its modality embedding plus the embedding of timestep t."""
        b, k = batch.mask.shape
        time = self.embed_timestep(batch.timesteps.long().clamp(0, self.max_timestep - 1))
        r = self.embed_return(batch.returns_to_go.float() / self.return_scale)  # (B, K, D)
        s = self.embed_state(self.normalize_states(batch.states))  # (B, K, D)
        a = self.action_codec.embed_actions(batch.actions, batch.mask)  # (B, K, D)
        tokens = torch.stack([r + time, s + time, a + time], dim=2)  # (B, K, 3, D)
        return tokens.reshape(b, 3 * k, self.dim)  # (B, 3K, D): R_1, s_1, a_1, R_2, ...

    def hidden_and_ponder(self, batch: TrajectoryBatch) -> tuple[Tensor, Tensor | None]:
        """Stack outputs (B, K, 3, D) and, with backbone=universal, ACT's N + R (B, K, 3)."""
        b, k = batch.mask.shape
        x = self.embed_drop(self.embed_norm(self.embed_tokens(batch)))  # (B, 3K, D)
        # Each step's mask covers its three tokens; padded queries see only themselves (the
        # core keeps the diagonal), real ones never see padding.
        key_padding = batch.mask.bool().repeat_interleave(3, dim=1)  # (B, 3K)
        out = self.transformer(x, key_padding=key_padding)  # hidden (B, 3K, D)
        ponder = out.aux["ponder_cost"].view(b, k, 3) if self.transformer.ponders else None
        return out.hidden.view(b, k, 3, self.dim), ponder

    def state_outputs(self, batch: TrajectoryBatch) -> Tensor:
        """Stack outputs (B, K, D) at the s_t tokens alone, computed without dead work.

        The same as ``hidden(batch)[:, :, 1]``, cheaper: the last action token a_K is seen by
        no state token (causality), so it is left out, and the last layer computes queries,
        MLP and final norm only at state tokens (``TransformerStack(outputs=...)``).
        """
        x = self.embed_drop(self.embed_norm(self.embed_tokens(batch)[:, :-1]))  # (B, 3K-1, D)
        key_padding = batch.mask.bool().repeat_interleave(3, dim=1)[:, :-1]
        return self.transformer(x, key_padding=key_padding, outputs=slice(1, None, 3)).hidden

    def hidden(self, batch: TrajectoryBatch) -> Tensor:
        """Stack outputs (B, K, 3, D): [:, t, 0] R_t, [:, t, 1] s_t, [:, t, 2] a_t."""
        return self.hidden_and_ponder(batch)[0]

    def predict(self, batch: TrajectoryBatch) -> DTOutput:
        """Action from each s_t token; next return and state from each a_t token if enabled."""
        plain = self.next_state_head is None and self.next_return_head is None
        if plain and self.prunes_to_states:
            return DTOutput(self.action_codec(self.state_outputs(batch)), None, None, None)
        h, ponder = self.hidden_and_ponder(batch)
        action = self.action_codec(h[:, :, 1])  # (B, K, A) from the state tokens
        h_a = h[:, :, 2]  # (B, K, D) action tokens: they have seen (R_t, s_t, a_t)
        nr = self.next_return_head(h_a) if self.next_return_head is not None else None
        ns = self.next_state_head(h_a) if self.next_state_head is not None else None
        return DTOutput(action, nr, ns, ponder)


class BehaviorCloning(ContextPolicy):
    """The DT paper's behaviour-cloning baseline: an MLP on the last `history` states.

    As the DT reference code's BC model: states of the last `history` steps (its default is
    the DT context K) concatenated into an MLP of `layers` hidden Linear layers of width
    `dim` with ReLU and dropout, tanh head for Box actions. Vector states enter raw
    (normalised); images and Discrete observations through the same encoder as DT. Trained on
    the same windows, it predicts every step from the states up to it inside the window
    (zeros where the window or the episode has none), as DT does; acting ignores the target.
    Train on `TrajectoryBuffer(..., top_fraction=0.1)` for the paper's %BC.
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        *,
        dim: int = 128,
        layers: int = 3,
        history: int = 20,
        dropout: float = 0.1,
        action_tanh: bool = True,
        stats: dict[str, Any] | TrajectoryStats | None = None,
    ) -> None:
        super().__init__(observation_space, action_space, stats)
        if history < 1 or layers < 1:
            raise ValueError(f"history and layers must be >= 1, got {history}, {layers}")
        self.context = self.history = history
        # Vector states enter the MLP as they are (normalised), as in the DT code's BC model.
        self.features = (
            FlattenSteps(self.obs_shape)
            if self.normalize
            else build_encoder(observation_space, dim)
        )
        width = self.features.out_dim
        mlp: list[nn.Module] = [nn.Linear(history * width, dim)]
        for _ in range(layers - 1):
            mlp += [nn.ReLU(), Dropout(dropout), nn.Linear(dim, dim)]
        self.mlp = nn.Sequential(*mlp, nn.ReLU(), Dropout(dropout))
        self.action_codec = build_actions(action_space, dim, dim, action_tanh)

    def predict(self, batch: TrajectoryBatch) -> DTOutput:
        """Action per step t from the states t-h+1..t of the window (missing ones zero)."""
        mask = batch.mask.bool()
        x = self.features(self.normalize_states(batch.states)).float()  # (B, K, F)
        x = x * mask.unsqueeze(-1)  # padded steps contribute zeros
        x = F.pad(x, (0, 0, self.history - 1, 0))  # (B, K+h-1, F)
        x = x.unfold(1, self.history, 1)  # (B, K, F, h): step t sees rows t..t+h-1 = t-h+1..t
        x = x.transpose(2, 3).flatten(2)  # (B, K, h*F), oldest state first
        return DTOutput(self.action_codec(self.mlp(x)), None, None)


# ------------------------------------------------------------------------------ builders


def build_decision_transformer(
    observation_space: gym.Space,
    action_space: gym.Space,
    *,
    dim: int = 128,
    layers: int = 3,
    heads: int = 1,
    context: int = 20,
    max_timestep: int | None = None,
    dropout: float = 0.1,
    position: PositionName = "none",
    gate: GateName = "residual",
    norm: NormPlacement = "pre",
    activation: FFActivation = "relu",
    action_tanh: bool = True,
    predict_next: bool = False,
    kernel: Kernel = "sdpa",
    init: Init = "gpt2",
    stats: dict[str, Any] | TrajectoryStats | None = None,
    backbone: DTBackbone = "causal",
    max_steps: int = 4,
    tau: float = 0.01,
    halting_bias: float = -1.0,
    coordinate_scale: float = 0.1,
) -> DecisionTransformer:
    """A DecisionTransformer from the knobs of ``configs/agent/dt.yaml`` (the registry's "dt").

    Defaults are the paper's Gym setting (3 layers, 1 head, D 128, K 20, dropout 0.1, ReLU
    MLP); Atari used 6 layers, 8 heads, K 30 (50 for Pong) and GELU. ``backbone="causal"``
    is GPT-2 as DT uses it (``init`` picks its initialisation); ``"universal"`` loops one
    shared block with ACT (Dehghani et al. 2019) for up to ``max_steps`` depth steps, and
    ``layers`` and ``init`` do not apply. The backbone is built from its spec
    (:class:`~rltrans.backbones.spec.CausalSpec` or ``UniversalSpec``); to give one directly,
    pass ``build(spec)`` to :class:`DecisionTransformer`.
    """
    check_choice("DT backbone", backbone, ("causal", "universal"))
    # GPT-2's block as DT uses it; max_len counts tokens, 3 per step.
    config = gpt2_config(
        dim,
        heads,
        position=position,
        gate=gate,
        norm=norm,
        ff_activation=activation,  # the DT Gym code's GPT-2 MLP uses ReLU
        dropout=dropout,
        kernel=kernel,
        max_len=3 * context,
    )
    if backbone == "causal":
        spec: DTBackboneSpec = CausalSpec(config, layers, init=init)
    else:  # memory 0: the window of 3K tokens is the whole context
        spec = UniversalSpec(
            config,
            memory=0,
            max_steps=max_steps,
            halting_bias=halting_bias,
            coordinate_scale=coordinate_scale,
        )
    return DecisionTransformer(
        observation_space,
        action_space,
        build(spec),
        context=context,
        max_timestep=max_timestep,
        action_tanh=action_tanh,
        predict_next=predict_next,
        tau=tau,
        stats=stats,
    )
