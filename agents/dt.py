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
from typing import Any, Literal, NamedTuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rltrans.agents.encoders import FlattenSteps, build_encoder
from rltrans.agents.heads import ContinuousActions, DiscreteActions, build_actions
from rltrans.backbones.base import Backbone
from rltrans.backbones.causal import Init, causal_stack, gpt2_config
from rltrans.backbones.universal import UniversalTransformer
from rltrans.core.attention import Kernel, check_choice
from rltrans.core.block import FFActivation, NormPlacement
from rltrans.core.dropout import Dropout
from rltrans.core.gates import GateName
from rltrans.core.position import PositionName
from rltrans.losses.dt import dt_action_loss
from rltrans.spaces import normalizes_states, obs_to_tensor
from rltrans.types import ActOutput, TrajectoryBatch, TrajectoryStats

__all__ = [
    "BehaviorCloning",
    "DTOutput",
    "DTState",
    "DecisionTransformer",
    "build_decision_transformer",
]

DEFAULT_MAX_TIMESTEP = 1000  # DT's max_ep_len for MuJoCo, used when no stats are given


class DTState(NamedTuple):
    """Per-env acting context, oldest step first, newest at index K-1 (left-padded like the
    training windows); `valid` counts the real steps at the end. Indexed by env id."""

    returns_to_go: Tensor  # (N, K) float32, raw reward units
    states: Tensor  # (N, K, *obs_shape) raw observations
    actions: Tensor  # (N, K) long or (N, K, A) float32, env actions
    timesteps: Tensor  # (N, K) long, episode step of each context step
    valid: Tensor  # (N,) long in [0, K]
    next_return: Tensor  # (N,) float32, return-to-go of the next step (target minus rewards)
    target: Tensor  # (N,) float32, the return an env's context restarts with
    time: Tensor  # (N,) long, episode step of the next observation


DTBackbone = Literal["causal", "universal"]


class DTOutput(NamedTuple):
    """Predictions per window step; the next-step ones only with `predict_next=True`."""

    action: Tensor  # (B, K, A) logits (Discrete) or actions in env units (Box)
    next_return: Tensor | None  # (B, K, 1) R_{t+1} / return_scale, from the a_t token
    next_state: Tensor | None  # (B, K, obs_dim) normalised s_{t+1}, from the a_t token
    ponder_cost: Tensor | None = None  # (B, K, 3) ACT's N + R per token (backbone=universal)


# ------------------------------------------------------------------------ shared machinery


def _check_statistics(module: nn.Module, incompatible: Any) -> None:
    """Refuse loaded dataset statistics a model cannot divide by: a ``state_std`` or
    ``return_scale`` that is not a positive finite number (ValueError naming the buffer)."""
    for name in ("state_std", "return_scale"):
        value = getattr(module, name)
        if not bool(torch.isfinite(value).all() and (value > 0).all()):
            raise ValueError(
                f"{name} must be positive and finite, got {value.flatten()[:4].tolist()}"
            )


class ContextPolicy(nn.Module):
    """What DT and BC share: stats buffers, action codec, loss and the K-step acting context.

    Subclasses define `predict(batch) -> DTOutput` and set `self.context` (K).
    """

    context: int  # K, the steps an acting context holds
    action_codec: DiscreteActions | ContinuousActions  # set by the subclass

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        stats: dict[str, Any] | TrajectoryStats | None,
    ) -> None:
        super().__init__()
        if not isinstance(observation_space, gym.spaces.Box | gym.spaces.Discrete):
            raise ValueError(
                f"unsupported observation space {observation_space!r}; supported: "
                "['Box', 'Discrete']"
            )
        self.observation_space, self.action_space = observation_space, action_space
        self.obs_shape = tuple(observation_space.shape or ())
        self.normalize = normalizes_states(observation_space)
        # Acting contexts store observations as given: indices, uint8 frames, or float32.
        if isinstance(observation_space, gym.spaces.Discrete):
            self.obs_dtype = torch.long
        else:
            self.obs_dtype = torch.uint8 if observation_space.dtype == np.uint8 else torch.float32
        stat_shape = self.obs_shape if self.normalize else ()
        # Registered (persistent) buffers: the checkpoint holds the data's statistics.
        self.register_buffer("state_mean", torch.zeros(stat_shape))
        self.register_buffer("state_std", torch.ones(stat_shape))
        self.register_buffer("return_scale", torch.ones(()))
        if stats is not None:
            self.load_stats(stats)
        # Statistics read back from a file divide every input: a zero or non-finite one turns
        # every action into NaN, so it is refused as the state dict loads.
        self.register_load_state_dict_post_hook(_check_statistics)

    @property
    def device(self) -> torch.device:
        """Device of the parameters (derived, never stored)."""
        return next(self.parameters()).device

    def load_stats(self, stats: dict[str, Any] | TrajectoryStats) -> None:
        """Copy dataset statistics (`TrajectoryBuffer.stats()`) into the model's buffers."""
        s = TrajectoryStats.from_stats(stats)
        if self.normalize:
            try:
                self.state_mean.copy_(torch.broadcast_to(s.state_mean, self.state_mean.shape))
                self.state_std.copy_(torch.broadcast_to(s.state_std, self.state_std.shape))
            except RuntimeError as exc:
                raise ValueError(
                    f"state stats of shape {tuple(s.state_mean.shape)} do not fit observations "
                    f"of shape {self.obs_shape}"
                ) from exc
        self.return_scale.fill_(s.return_scale)

    def normalize_states(self, states: Tensor) -> Tensor:
        """(B, K, *obs) raw -> standardised float for vector Box obs; others unchanged."""
        if not self.normalize:
            return states
        return (states.float() - self.state_mean) / self.state_std

    def predict(self, batch: TrajectoryBatch) -> DTOutput:
        """All predictions for a batch of windows."""
        raise NotImplementedError  # pragma: no cover - defined by subclasses

    def forward(self, batch: TrajectoryBatch) -> Tensor:
        """Action predictions (B, K, A): logits (Discrete) or env-unit actions (Box)."""
        return self.predict(batch).action

    def loss(self, batch: TrajectoryBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """Action loss over real steps (+ next return/state losses when predicted)."""
        out = self.predict(batch)
        loss, metrics = self.action_codec.loss(out.action, batch.actions, batch.mask)
        # Next-step targets exist where steps t and t+1 are both real (same window, episode).
        both = batch.mask[:, :-1] & batch.mask[:, 1:]  # (B, K-1)
        if out.next_return is not None:
            target = batch.returns_to_go[:, 1:] / self.return_scale  # (B, K-1, 1)
            aux, _ = dt_action_loss(out.next_return[:, :-1], target, both, "continuous")
            loss, metrics["return"] = loss + aux, aux.detach()
        if out.ponder_cost is not None:  # Graves 2016: loss += tau * (N + R), real tokens only
            real = batch.mask.bool().unsqueeze(-1).expand_as(out.ponder_cost)
            ponder = out.ponder_cost[real].mean()
            loss, metrics["ponder"] = loss + self.tau * ponder, ponder.detach()
        if out.next_state is not None:
            target = self.normalize_states(batch.states[:, 1:]).flatten(2)  # (B, K-1, obs_dim)
            aux, _ = dt_action_loss(out.next_state[:, :-1], target, both, "continuous")
            loss, metrics["state"] = loss + aux, aux.detach()
        return loss, metrics

    # ---------------------------------------------------------------------------- acting

    def initial_state(self, num_envs: int, target_returns: Tensor | float = 0.0) -> DTState:
        """Empty contexts for N envs, each starting from its target return (N,) or one float."""
        n, k, dev = num_envs, self.context, self.device
        target = torch.as_tensor(target_returns, dtype=torch.float32, device=dev)
        target = target.expand(n).clone() if target.dim() == 0 else target
        if target.shape != (n,):
            raise ValueError(f"target_returns has shape {tuple(target.shape)}, want ({n},)")
        blank = self.action_codec.blank(n, dev)  # (N,) or (N, A)
        return DTState(
            returns_to_go=torch.zeros(n, k, device=dev),
            states=torch.zeros(n, k, *self.obs_shape, dtype=self.obs_dtype, device=dev),
            actions=torch.zeros(n, k, *blank.shape[1:], dtype=blank.dtype, device=dev),
            timesteps=torch.zeros(n, k, dtype=torch.long, device=dev),
            valid=torch.zeros(n, dtype=torch.long, device=dev),
            next_return=target.clone(),
            target=target,
            time=torch.zeros(n, dtype=torch.long, device=dev),
        )

    def reset_where(self, state: DTState, done: Tensor) -> DTState:
        """Start a new episode for envs where `done` (N,): empty context, return = target."""
        d = done.to(device=state.valid.device, dtype=torch.bool)

        def clear(x: Tensor) -> Tensor:
            return torch.where(d.view(-1, *[1] * (x.dim() - 1)), torch.zeros_like(x), x)

        emptied = ("returns_to_go", "states", "actions", "timesteps", "valid", "time")
        return state._replace(
            **{name: clear(getattr(state, name)) for name in emptied},
            next_return=torch.where(d, state.target, state.next_return),
        )

    def context_batch(self, state: DTState) -> TrajectoryBatch:
        """The acting context as a one-window-per-env batch (K-step, left-padded)."""
        k = self.context
        mask = torch.arange(k, device=state.valid.device) >= (k - state.valid).unsqueeze(1)
        return TrajectoryBatch(
            states=state.states,
            actions=state.actions,
            returns_to_go=state.returns_to_go.unsqueeze(-1),
            timesteps=state.timesteps,
            mask=mask,  # (N, K)
        )

    @torch.no_grad()
    def predict_context(self, state: DTState) -> Tensor:
        """Prediction (N, A) for the newest step of each env's context (logits or actions)."""
        return self(self.context_batch(state))[:, -1]

    @torch.no_grad()
    def act(
        self, obs: Any, state: DTState, done: Any = None, *, deterministic: bool = True
    ) -> tuple[ActOutput, DTState]:
        """Append obs (N, ...) as the newest step, predict its action; call `.eval()` first.

        `done` (N,) marks envs whose episode starts at `obs` (their context is reset to their
        target). Recomputes the whole K-step window, as DT does: a sliding window changes
        every hidden state, so there is no cache to reuse. Returns the actions (already in the
        env's values) and the state.
        """
        obs = obs_to_tensor(obs, self.observation_space, self.device)
        if done is not None:
            state = self.reset_where(state, torch.as_tensor(done, device=self.device))
        n = state.valid.shape[0]

        def push(x: Tensor, new: Tensor) -> Tensor:  # drop the oldest step, append the newest
            return torch.cat([x[:, 1:], new.to(x.dtype).unsqueeze(1)], dim=1)

        state = state._replace(
            returns_to_go=push(state.returns_to_go, state.next_return),
            states=push(state.states, obs),
            actions=push(state.actions, self.action_codec.blank(n, self.device)),
            timesteps=push(state.timesteps, state.time),
            valid=(state.valid + 1).clamp(max=self.context),
        )
        action = self.action_codec.select(self.predict_context(state), deterministic)
        flat = action.reshape(n, *state.actions.shape[2:])  # (N,) or (N, A)
        state = state._replace(
            actions=torch.cat([state.actions[:, :-1], flat.unsqueeze(1)], dim=1),
            time=state.time + 1,
        )
        return ActOutput(action, action), state

    def observe(self, state: DTState, reward: Any) -> DTState:
        """Fold in the rewards (N,) of the last step: R_{t+1} = R_t - r_t (Chen et al. 2021,
        Algorithm 1). Rewards are raw; the model divides returns by `return_scale` itself."""
        r = torch.as_tensor(reward, dtype=torch.float32, device=state.next_return.device)
        return state._replace(next_return=state.next_return - r)


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
    ``layers`` and ``init`` do not apply.
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
        transformer: Backbone = causal_stack(config, layers, init=init)
    else:
        transformer = UniversalTransformer(
            config,
            max_steps=max_steps,
            halting_bias=halting_bias,
            coordinate_scale=coordinate_scale,
        )
    return DecisionTransformer(
        observation_space,
        action_space,
        transformer,
        context=context,
        max_timestep=max_timestep,
        action_tanh=action_tanh,
        predict_next=predict_next,
        tau=tau,
        stats=stats,
    )
