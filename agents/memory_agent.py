"""Memory policies for online RL: observation encoder + backbone + policy and value heads.

One recipe serves every backbone (GTrXL, TrXL, TrXL-I, the Universal
Transformer with ACT, LSTM/GRU, the MLP control): the backbone is picked once
at build time from ``backbone=`` (a name and its keywords, or a typed spec of
:mod:`rltrans.backbones.spec`) and hides its memory behind :mod:`rltrans.backbones.base`.

Every backbone's ``forward`` returns a ``BackboneOutput(hidden, memory, aux)`` and its
``step`` a ``StepOutput(hidden, state, aux)``; ``aux`` is empty except for a backbone that
declares ``ponders`` (the Universal Transformer: ACT's ponder cost, halting steps, ...).
Training turns ``aux`` into loss terms and statistics with a function picked once at build
time from that flag, so ``act`` and ``evaluate`` hold no branch on the backbone kind. Where
the backbone declares ``pure_step``, the acting step's math is also offered as a pure
function (``begin_step`` / ``act_outputs`` / ``end_step``) that ``rltrans.accel`` compiles
from outside.

Agent interface: ``initial_state(num_envs)``, ``refresh_state(state)``,
``act(obs, state, done) -> (ActOutput, state)``, ``evaluate(segment) ->
(log_prob, entropy, value, aux)``. ``aux`` follows the learner's convention
(:class:`rltrans.learners.ppo.PPOLearner`): ``loss_*`` entries are added to the
loss, other 0-d entries are logged as ``losses/<name>``, and (B, L) entries
with one value per token are logged as histograms ``charts/<name>``.

``reconstruction_coef > 0`` (``algo.reconstruction_coef``; the trainers pass it) adds a decoder
from the backbone output h_t back to the observation o_t (:mod:`rltrans.agents.reconstruction`;
Memory Gym, Pleines et al. 2024): ``evaluate`` then returns ``loss_reconstruction`` (weighted)
and ``reconstruction`` (unweighted) in ``aux``. Acting never runs the decoder; at 0 none is built.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any, Literal, get_args

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from rltrans.agents.encoders import build_encoder, layer_init
from rltrans.agents.heads import ActionDist, build_action_head
from rltrans.agents.reconstruction import build_decoder, reconstruction_aux
from rltrans.backbones.base import Backbone
from rltrans.backbones.spec import (
    BACKBONES,
    DEFAULT_HEADS,
    DEFAULT_MEMORY,
    BackboneName,
    BackboneSpec,
    MLPSpec,
    backbone_spec,
    build,
    check_keywords,
)
from rltrans.choices import check_choice
from rltrans.types import ActOutput, Aux, Segment, Tree, tree_map

Critic = Literal["shared", "separate"]
CRITICS: tuple[str, ...] = get_args(Critic)
DEFAULT_DIM = 128  # D where neither a keyword nor a spec gives it
DEFAULT_TAU = 0.01  # ponder-cost weight (the Universal Transformer's act_loss_weight)
DEFAULT_SPAN_COEF = 1e-4  # adaptive-span cost per step of mean span (M=256 at full span: 0.026)


def build_backbone(
    name: BackboneName, dim: int, layers: int | None, heads: int, memory: int, **kw: Any
) -> Backbone:
    """The backbone module for a name and its keywords: ``build(backbone_spec(...))`` (see
    :func:`rltrans.backbones.spec.backbone_spec` for the options)."""
    return build(backbone_spec(name, dim, layers, heads, memory, **kw))


def resolve_backbone(
    backbone: BackboneName | BackboneSpec,
    dim: int | None,
    layers: int | None,
    heads: int | None,
    memory: int | None,
    options: dict[str, Any],
) -> BackboneSpec:
    """The spec of MemoryAgent's backbone arguments: a name and its keywords (None: the
    defaults), or a spec, next to which a keyword may only repeat the spec's value."""
    if isinstance(backbone, BackboneSpec):
        sizes = {"dim": dim, "layers": layers, "heads": heads, "memory": memory}
        check_keywords(backbone, {k: v for k, v in sizes.items() if v is not None} | options)
        return backbone
    if not isinstance(backbone, str):
        raise TypeError(
            f"backbone must be a name ({', '.join(BACKBONES)}) or a StackSpec, UniversalSpec, "
            f"RNNSpec or MLPSpec, got {type(backbone).__name__}"
        )
    dim = DEFAULT_DIM if dim is None else dim
    heads = DEFAULT_HEADS if heads is None else heads
    memory = DEFAULT_MEMORY if memory is None else memory
    return backbone_spec(backbone, dim, layers, heads, memory, **options)


class ObservationNorm(nn.Module):
    """Running mean/std normalisation of vector observations, clipped to +-clip (as SB3's
    VecNormalize). The statistics are buffers, so every checkpoint and ``load_policy`` carry
    them; they change only through :meth:`update`, which the training loop calls after each
    PPO update, so acting and the learner's recomputation see the same normalisation."""

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8) -> None:
        super().__init__()
        self.clip, self.eps = clip, eps
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.tensor(eps))

    def forward(self, obs: Tensor) -> Tensor:
        """(..., *shape) -> normalised and clipped."""
        return ((obs - self.mean) / torch.sqrt(self.var + self.eps)).clamp(-self.clip, self.clip)

    @torch.no_grad()
    def update(self, obs: Tensor) -> None:
        """Merge a batch (..., *shape) into the statistics (Chan et al. parallel variance)."""
        x = obs.reshape(-1, *self.mean.shape).double()
        n, mean, var = x.shape[0], x.mean(0), x.var(0, unbiased=False)
        delta, total = mean - self.mean, self.count + n
        new_mean = self.mean + delta * n / total
        m2 = self.var * self.count + var * n + delta**2 * self.count * n / total
        self.mean.copy_(new_mean)
        self.var.copy_(m2 / total)
        self.count.copy_(total)


class NoNorm(nn.Module):
    """Observations pass through unchanged (``normalize_obs=false``)."""

    def forward(self, obs: Tree) -> Tree:
        """Identity."""
        return obs

    def update(self, obs: Tree) -> None:
        """Nothing to track."""


def build_obs_norm(space: gym.Space, normalize: bool) -> ObservationNorm | NoNorm:
    """The running normalisation of a 1-D float Box's observations where ``normalize``."""
    if not normalize:
        return NoNorm()
    is_vector = isinstance(space, gym.spaces.Box) and len(space.shape) == 1
    if not is_vector or space.dtype == np.uint8:
        raise ValueError(
            f"normalize_obs=true needs a 1-D float Box observation space, got "
            f"{space}; set agent.normalize_obs=false"
        )
    return ObservationNorm(space.shape)


def no_aux(aux: Aux) -> Aux:
    """Training aux of a backbone without auxiliary outputs: nothing to add or log."""
    return {}


def span_aux(aux: Aux, *, coef: float) -> Aux:
    """The adaptive span's L1 cost and the learned spans from a stack's ``spans`` (Y, H).

    ``loss_span = coef * mean span`` (in steps; Sukhbaatar et al. 2019); ``span_mean``,
    ``span_max`` and one ``span_l<layer>_h<head>`` per head are logged (as ``losses/...``).
    """
    spans = aux["spans"]
    out = {"loss_span": coef * spans.mean(), "span_mean": spans.detach().mean()}
    out["span_max"] = spans.detach().max()
    for layer, heads in enumerate(spans.detach()):
        out |= {f"span_l{layer}_h{head}": z for head, z in enumerate(heads)}
    return out


def ponder_aux(aux: Aux, *, tau: float) -> Aux:
    """Ponder loss and halting statistics from a Universal Transformer's (B, L) aux.

    ``loss_ponder = tau * mean(N + R)``: Graves 2016's ponder cost with time
    penalty tau (section 2.1, "Limiting Computation Time"; Dehghani et al.
    2019 add it to the task loss the same way). N is piecewise constant, so the
    gradient reaches the halting unit through the remainders R.
    ``ponder_mean``/``ponder_max`` summarise the halting steps N per token (the
    learner averages them over minibatches, so ``losses/ponder_max`` is a mean
    of per-minibatch maxima), ``halt_prob_mean`` the halting probabilities h,
    and ``ponder_steps`` (B, L) keeps N per token for the histogram.
    """
    steps = aux["ponder_steps"].detach()  # (B, L) N per token
    return {
        "loss_ponder": tau * aux["ponder_cost"].mean(),
        "ponder_mean": steps.mean(),
        "ponder_max": steps.max(),
        "halt_prob_mean": aux["halt_prob_mean"].detach().mean(),
        "ponder_steps": steps,
    }


class MemoryAgent(nn.Module):
    """Actor-critic with a shared sequence backbone.

    ``backbone`` is a name (gtrxl, trxl, trxl_i, universal, lstm, gru, mlp) with ``dim``,
    ``layers``, ``heads``, ``memory`` (default 128, 3, 4, 64) and the backbone's options as
    keywords, as agent configs give them (:func:`rltrans.backbones.spec.backbone_spec`), or a
    typed spec (``StackSpec``, ``UniversalSpec``, ``RNNSpec``, ``MLPSpec``) that holds them
    all; a keyword given next to a spec must repeat its value. :attr:`backbone_spec` is the
    spec either way. ``tau`` weighs the ponder cost of a pondering backbone (``universal``;
    default 0.01) and is an error for the others. ``span_coef`` weighs the mean learned span
    (in steps) of a stack built with ``adaptive_span=True``. ``reconstruction_coef``
    weighs the observation-reconstruction loss; above 0 it builds :attr:`decoder` (built last,
    so the other modules start from the same weights as without it), at 0 nothing.
    ``value_init_gain`` is the value head's orthogonal init gain: a stack whose output is
    layer-normalised (rms 1) starts its values at O(1) with gain 1, while returns scaled into
    [-1, 1] start near 0; a small gain starts the critic there too.
    ``critic="separate"`` (memoryless ``backbone="mlp"`` only) gives the value its own encoder
    and MLP of the same shape, so the two losses share no weights (the PPO-for-MuJoCo recipe;
    Andrychowicz et al. 2021 found separate networks better on continuous control).

    >>> env = gym.make("CartPole-v1")
    >>> agent = MemoryAgent(env.observation_space, env.action_space, backbone="gtrxl", dim=32,
    ...                     layers=1, heads=2, memory=8)
    >>> state = agent.initial_state(3)
    >>> out, state = agent.act(torch.zeros(3, 4), state, torch.ones(3, dtype=torch.bool))
    >>> out.action.shape, out.value.shape
    (torch.Size([3]), torch.Size([3]))
    >>> from rltrans.backbones.spec import StackSpec
    >>> from rltrans.core.block import BlockConfig
    >>> spec = StackSpec(BlockConfig(dim=32, heads=2), memory=8, layers=1)  # the same backbone
    >>> MemoryAgent(env.observation_space, env.action_space, backbone=spec).backbone_spec == (
    ...     agent.backbone_spec)
    True
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        *,
        backbone: BackboneName | BackboneSpec = "gtrxl",
        dim: int | None = None,
        layers: int | None = None,
        heads: int | None = None,
        memory: int | None = None,
        tau: float | None = None,
        span_coef: float = DEFAULT_SPAN_COEF,
        encoder: dict[str, Any] | None = None,
        normalize_obs: bool = False,
        reconstruction_coef: float = 0.0,
        value_init_gain: float = 1.0,
        critic: Critic = "shared",
        **backbone_options: Any,
    ) -> None:
        super().__init__()
        spec = resolve_backbone(backbone, dim, layers, heads, memory, backbone_options)
        self.backbone_spec = spec  # what the backbone is: frozen, typed, picklable
        dim, name = spec.dim, backbone if isinstance(backbone, str) else type(backbone).__name__
        self.observation_space, self.action_space = observation_space, action_space
        self.obs_norm = build_obs_norm(observation_space, normalize_obs)
        self.encoder = build_encoder(observation_space, dim, **(encoder or {}))
        self.backbone = build(spec)
        self.policy = build_action_head(action_space, dim)
        if not 0 < value_init_gain < math.inf:
            raise ValueError(f"value_init_gain={value_init_gain!r}: expected a number > 0")
        self.value = layer_init(nn.Linear(dim, 1), gain=float(value_init_gain))
        check_choice("critic", critic, CRITICS)
        self.critic_net: nn.Module | None = None  # the value's own tower (critic="separate")
        if critic == "separate":
            if not isinstance(spec, MLPSpec):
                raise ValueError(
                    f"critic='separate' needs backbone 'mlp', not {name!r}: a memory "
                    f"backbone's state serves the policy and the value together; "
                    f"valid critics for it: ['shared']"
                )
            self.critic_net = nn.Sequential(
                build_encoder(observation_space, dim, **(encoder or {})), spec.build().net
            )
        # What evaluate() makes of the backbone's aux, chosen once here from its declared
        # capability; module-level functions and partials keep the agent picklable.
        self.training_aux: Callable[[Aux], Aux] = no_aux
        if self.backbone.ponders:
            tau = DEFAULT_TAU if tau is None else tau
            if tau < 0:
                raise ValueError(f"tau (ponder-cost weight) must be >= 0, got {tau}")
            self.training_aux = partial(ponder_aux, tau=tau)
        elif tau is not None:
            raise ValueError(
                f"tau (ponder-cost weight) only applies to backbone 'universal', not {name!r}"
            )
        if getattr(self.backbone, "adaptive_span", False):
            if not 0 <= span_coef < math.inf:
                raise ValueError(f"span_coef (adaptive-span cost) must be >= 0, got {span_coef}")
            self.training_aux = partial(span_aux, coef=float(span_coef))
        # Last, so that the modules above draw the same initial weights with it or without.
        coef = reconstruction_coef
        if isinstance(coef, bool) or not isinstance(coef, int | float) or not 0 <= coef < math.inf:
            raise ValueError(
                f"reconstruction_coef={reconstruction_coef!r}: expected a number >= 0 "
                f"(0 = no reconstruction loss)"
            )
        self.reconstruction_coef = float(reconstruction_coef)
        self.decoder: nn.Module | None = None
        if self.reconstruction_coef > 0:
            options = {k: v for k, v in (encoder or {}).items() if k != "dict_mode"}
            self.decoder = build_decoder(observation_space, dim, **options)

    @property
    def compilable_step(self) -> bool:
        """Whether the acting step's math is a pure function of tensors (the transformer
        stacks), which ``begin_step`` / ``act_outputs`` / ``end_step`` split out so that it
        can be compiled from outside (``rltrans.accel.acting``)."""
        return bool(self.backbone.pure_step)

    def begin_step(self, state: Tree, done: Tensor | None) -> tuple[Tree, tuple]:
        """Episode resets of ``state`` (when ``done`` is given) and the inputs of
        :meth:`act_outputs` read from it."""
        return self.backbone.step_begin(state, done, self.value.weight.dtype)

    def end_step(self, state: Tree, outputs: tuple) -> tuple[ActOutput, Tree]:
        """The step's :class:`ActOutput` and new state from :meth:`act_outputs`' outputs."""
        action, log_prob, value, *cache = outputs
        out = ActOutput(action, self.policy.env_action_tensor(action), log_prob, value)
        return out, self.backbone.step_end(state, *cache)

    def act_outputs(
        self, obs: Tree, deterministic: Tensor, *inputs: Any
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """The math of one acting step as a pure function: action, log-prob and value (N,),
        then what the stack caches (see ``TransformerStack.step_outputs``). ``deterministic``
        is a bool tensor, so one compiled program serves both modes."""
        normed = self.obs_norm(obs)
        h, *cache = self.backbone.step_outputs(self.encoder(normed), *inputs)
        dist = self.policy(h)
        action = torch.where(deterministic, dist.mode(), dist.sample())
        return action, dist.log_prob(action), self._value(normed, h), *cache

    def encode(self, obs: Tree) -> Tensor:
        """Normalised (if enabled) and encoded observations (..., D)."""
        return self.encoder(self.obs_norm(obs))

    def _value(self, normed_obs: Tree, hidden: Tensor) -> Tensor:
        """V (...,) from the backbone's output, or from the critic's own tower."""
        if self.critic_net is not None:
            hidden = self.critic_net(normed_obs)
        return self.value(hidden)[..., 0]

    def update_obs_norm(self, obs: Tree) -> None:
        """Fold a rollout's observations into the normalisation statistics (no-op if off)."""
        self.obs_norm.update(obs)

    @property
    def device(self) -> torch.device:
        """Device of the parameters (derived, never stored)."""
        return next(self.parameters()).device

    def initial_state(self, num_envs: int) -> Tree:
        """Fresh per-env memory for ``num_envs`` environments."""
        return self.backbone.initial_state(num_envs, self.device)

    def refresh_state(self, state: Tree) -> Tree:
        """The acting state made consistent with the current weights (re-projected key/value
        cache and per-step contexts; see ``WindowedMemory.refresh_state``): call after the
        weights changed (the runtime does at the start of every rollout)."""
        return self.backbone.refresh_state(state)

    def state_to_memory(self, state: Tree) -> Tree:
        """The training memory of a segment that starts at the current step (a copy)."""
        return self.backbone.state_to_memory(state)

    @torch.no_grad()
    def act(
        self, obs: Tree, state: Tree, done: Tensor, *, deterministic: bool = False
    ) -> tuple[ActOutput, Tree]:
        """One step for N envs: obs (N, ...), done (N,) = a new episode starts at this obs."""
        dist, value, state = self.act_distribution(obs, state, done)
        action = dist.mode() if deterministic else dist.sample()
        env_action = self.policy.env_action_tensor(action)
        return ActOutput(action, env_action, dist.log_prob(action), value), state

    @torch.no_grad()
    def act_distribution(
        self, obs: Tree, state: Tree, done: Tensor | None
    ) -> tuple[ActionDist, Tensor, Tree]:
        """One step for N envs before an action is chosen: the action distribution, the
        value (N,) and the state after the step (``act`` draws from the distribution; an
        exported program reads its parameters). ``done`` None: no episode starts."""
        normed = self.obs_norm(obs)
        h, state, _ = self.backbone.step(self.encoder(normed), state, done)  # aux: unused here
        return self.policy(h), self._value(normed, h), state

    def observe(self, state: Tree, reward: Tensor) -> Tree:
        """Memory policies do not condition on rewards: the state is returned unchanged."""
        return state

    @torch.no_grad()
    def peek_value(self, obs: Tree, state: Tree) -> Tensor:
        """V(obs) as the next step of the current episodes, leaving ``state`` untouched.

        Used to bootstrap truncated episodes from their final observation.
        """
        normed = self.obs_norm(obs)
        h = self.backbone.step(self.encoder(normed), tree_map(torch.clone, state), None).hidden
        return self._value(normed, h)

    def evaluate(self, segment: Segment) -> tuple[Tensor, Tensor, Tensor, Aux]:
        """Recompute log-probs, entropies and values (B, L) of stored segments, plus aux."""
        obs = self.obs_norm(segment.obs)  # as encode(); also the reconstruction target
        out = self.backbone(self.encoder(obs), segment.memory, starts=segment.starts)
        dist = self.policy(out.hidden)
        aux = self.training_aux(out.aux)
        if self.decoder is not None:  # h_t -> o_t; its gradient shapes backbone and encoder
            recon = reconstruction_aux(self.decoder, out.hidden, obs, coef=self.reconstruction_coef)
            aux = {**aux, **recon}
        return dist.log_prob(segment.actions), dist.entropy(), self._value(obs, out.hidden), aux
