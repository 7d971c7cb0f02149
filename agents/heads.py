"""Action heads: features (..., in_dim) -> an action distribution over one Gymnasium action space.

``build_action_head(space, in_dim)`` picks, once, from the space:

=============  ===========================================  ==============  ===========
space          distribution                                 action_shape    action_dtype
=============  ===========================================  ==============  ===========
Discrete       categorical over n logits                    ()              torch.long
MultiDiscrete  one categorical per entry, one Linear        nvec.shape      torch.long
Box (float)    diagonal Gaussian, learned state-free        shape           float32
               log_std (init 0)
MultiBinary    independent Bernoulli per entry              shape           torch.long
=============  ===========================================  ==============  ===========

Every distribution has ``sample()``, ``mode()`` (the deterministic action), ``log_prob(a)`` and
``entropy()``; the last two are summed over the action dims, so all four keep exactly the
leading dims of the features ((N,), (B, L), ...).

Actions are stored as the head produces them and mapped to the env by ``head.env_action(a)``:
integer actions are 0-based and get the space's ``start`` added; Gaussian samples are unbounded
and are clipped to the Box bounds only for the env, while the rollout buffer keeps the unclipped
sample so that ``log_prob`` at learning time matches the one at acting time (CleanRL's
``ppo_continuous_action.py`` and SB3's PPO do the same).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor, nn
from torch.nn import functional as F

from rltrans.agents.encoders import layer_init
from rltrans.losses.dt import dt_action_loss

# Policy-output init gain 0.01: near-uniform initial policy (CleanRL's PPO scripts; Andrychowicz
# et al. 2021, "What matters in on-policy RL", recommend scaling the last policy layer by 0.01).
POLICY_INIT_GAIN = 0.01
SUPPORTED_ACTION_SPACES = ("Discrete", "MultiDiscrete", "Box (float dtype)", "MultiBinary")
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _sum_event(x: torch.Tensor, event_ndim: int) -> torch.Tensor:
    """Sums the trailing ``event_ndim`` dims (none for 0: ``sum(dim=())`` would sum everything)."""
    return x.sum(dim=tuple(range(-event_ndim, 0))) if event_ndim else x


def _safe_log_probs(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax with -inf (masked/padded) entries clamped so that 0 * log p stays 0."""
    return F.log_softmax(logits, dim=-1).clamp_min(torch.finfo(logits.dtype).min)


class CategoricalDist:
    """Independent categoricals over the last dim of ``logits`` (..., *event, n), summed over event.

    ``event_ndim`` = 0 for Discrete (one categorical) and 1 for MultiDiscrete (K of them, padded
    to a common n with -inf logits).
    """

    def __init__(self, logits: torch.Tensor, event_ndim: int):
        self.log_p = _safe_log_probs(logits)  # (..., *event, n)
        self.event_ndim = event_ndim

    def sample(self) -> torch.Tensor:
        """Draws one action per sample: (..., *event) long (no gradient)."""
        # Gumbel-max trick: argmax(log p + G), G = -log(E), E ~ Exp(1), is an exact sample and
        # a few elementwise ops, cheaper than multinomial on the acting hot path.
        log_p = self.log_p.detach()
        return (log_p - torch.empty_like(log_p).exponential_().log()).argmax(dim=-1)

    def mode(self) -> torch.Tensor:
        """Most likely action: argmax of the logits."""
        return self.log_p.argmax(dim=-1)

    def log_prob(self, a: torch.Tensor) -> torch.Tensor:
        """log p(a), summed over the event dims: (...)."""
        lp = self.log_p.gather(-1, a.long().unsqueeze(-1)).squeeze(-1)
        return _sum_event(lp, self.event_ndim)

    def entropy(self) -> torch.Tensor:
        """-sum p log p, summed over the event dims: (...)."""
        return _sum_event(-(self.log_p.exp() * self.log_p).sum(dim=-1), self.event_ndim)


class DiagGaussianDist:
    """Independent Gaussians N(mean, exp(log_std)^2) over the action dims, summed over them."""

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor, event_ndim: int):
        self.mean = mean  # (..., *shape)
        self.log_std = log_std.expand_as(mean)
        self.event_ndim = event_ndim

    def sample(self) -> torch.Tensor:
        """Draw mean + std * eps, unbounded, without gradient (as torch's ``sample``)."""
        with torch.no_grad():
            return self.mean + self.log_std.exp() * torch.randn_like(self.mean)

    def mode(self) -> torch.Tensor:
        """The mean."""
        return self.mean

    def log_prob(self, a: torch.Tensor) -> torch.Tensor:
        """sum_d [-(a-mu)^2 / (2 sigma^2) - log sigma - log sqrt(2 pi)]: (...)."""
        z = (a - self.mean) * torch.exp(-self.log_std)
        return _sum_event(-0.5 * z.square() - self.log_std - _LOG_SQRT_2PI, self.event_ndim)

    def entropy(self) -> torch.Tensor:
        """sum_d [1/2 + log sqrt(2 pi) + log sigma]: (...)."""
        return _sum_event(0.5 + _LOG_SQRT_2PI + self.log_std, self.event_ndim)


class BernoulliDist:
    """Independent Bernoullis with ``logits`` (..., *shape), summed over the shape."""

    def __init__(self, logits: torch.Tensor, event_ndim: int):
        self.logits = logits
        self.event_ndim = event_ndim

    def sample(self) -> torch.Tensor:
        """0/1 draws: (..., *shape) long (no gradient)."""
        return torch.bernoulli(torch.sigmoid(self.logits.detach())).long()

    def mode(self) -> torch.Tensor:
        """1 where p > 1/2."""
        return (self.logits > 0).long()

    def log_prob(self, a: torch.Tensor) -> torch.Tensor:
        """sum_d [a log p + (1-a) log(1-p)], computed stably from the logits: (...)."""
        lp = -F.binary_cross_entropy_with_logits(
            self.logits, a.to(self.logits.dtype), reduction="none"
        )
        return _sum_event(lp, self.event_ndim)

    def entropy(self) -> torch.Tensor:
        """sum_d -[p log p + (1-p) log(1-p)]: (...)."""
        p = torch.sigmoid(self.logits)
        ent = F.binary_cross_entropy_with_logits(self.logits, p, reduction="none")
        return _sum_event(ent, self.event_ndim)


ActionDist = CategoricalDist | DiagGaussianDist | BernoulliDist


class ActionHead(nn.Module):
    """Base: ``head(h) -> ActionDist``; ``action_shape``, ``action_dtype`` size the buffer."""

    action_shape: tuple[int, ...]
    action_dtype: torch.dtype

    def forward(self, h: torch.Tensor) -> ActionDist:  # pragma: no cover - abstract
        """(..., in_dim) -> distribution with leading dims (...)."""
        raise NotImplementedError

    def env_action_tensor(self, a: torch.Tensor) -> torch.Tensor:
        """Maps stored actions to the env's values (for torch-native envs): identity here."""
        return a

    def env_action(self, a: torch.Tensor) -> np.ndarray:
        """Maps stored actions (N, *action_shape) to a numpy batch for a Gymnasium vector env."""
        return self.env_action_tensor(a).detach().cpu().numpy()


class CategoricalHead(ActionHead):
    """Discrete(n, start): Linear(in_dim, n) logits; env action = index + start."""

    def __init__(self, space: spaces.Discrete, in_dim: int):
        super().__init__()
        self.logits = layer_init(nn.Linear(in_dim, int(space.n)), gain=POLICY_INIT_GAIN)
        self.start = int(space.start)
        self.action_shape, self.action_dtype = (), torch.long

    def forward(self, h: torch.Tensor) -> CategoricalDist:
        """(..., in_dim) -> categorical over n."""
        return CategoricalDist(self.logits(h), event_ndim=0)

    def env_action_tensor(self, a: torch.Tensor) -> torch.Tensor:
        """index + start."""
        return a + self.start


class MultiCategoricalHead(ActionHead):
    """MultiDiscrete(nvec): one Linear(in_dim, sum(nvec)) split into K categoricals.

    Entries with different sizes are padded to max(nvec) with -inf logits through a fixed gather,
    so every op runs on one (..., K, max n) tensor instead of a Python loop over K.
    """

    def __init__(self, space: spaces.MultiDiscrete, in_dim: int):
        super().__init__()
        nvec = space.nvec.reshape(-1).astype(np.int64)
        k, width, total = len(nvec), int(nvec.max()), int(nvec.sum())
        self.logits = layer_init(nn.Linear(in_dim, total), gain=POLICY_INIT_GAIN)
        # gather index (K * width,): position j of entry i reads logit offset_i + j, or the
        # appended -inf column (index `total`) where j >= nvec[i].
        offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
        j = np.arange(width)[None, :]
        index = np.where(j < nvec[:, None], offsets[:, None] + j, total).reshape(-1)
        self.register_buffer("pad_index", torch.as_tensor(index), persistent=False)
        self.register_buffer(
            "start", torch.as_tensor(space.start.astype(np.int64)), persistent=False
        )
        self._k, self._width = k, width
        self.action_shape, self.action_dtype = tuple(space.nvec.shape), torch.long

    def forward(self, h: torch.Tensor) -> CategoricalDist:
        """(..., in_dim) -> K categoricals, actions (..., *nvec.shape)."""
        flat = self.logits(h)  # (..., sum nvec)
        neg_inf = flat.new_full((*flat.shape[:-1], 1), float("-inf"))
        padded = torch.cat([flat, neg_inf], dim=-1)[..., self.pad_index]  # (..., K * width)
        padded = padded.reshape(*flat.shape[:-1], *self.action_shape, self._width)
        return CategoricalDist(padded, event_ndim=len(self.action_shape))

    def env_action_tensor(self, a: torch.Tensor) -> torch.Tensor:
        """index + start, per entry."""
        return a + self.start


class GaussianHead(ActionHead):
    """Box: mean = Linear(in_dim, prod(shape)), state-independent log_std parameter (init 0).

    ``env_action`` clips to [low, high]; the distribution itself is unbounded (module docstring).
    """

    def __init__(self, space: spaces.Box, in_dim: int):
        super().__init__()
        self.action_shape, self.action_dtype = tuple(space.shape), torch.float32
        dim = int(np.prod(space.shape, dtype=np.int64))
        self.mean = layer_init(nn.Linear(in_dim, dim), gain=POLICY_INIT_GAIN)
        self.log_std = nn.Parameter(torch.zeros(self.action_shape))
        self.register_buffer(
            "low", torch.as_tensor(space.low, dtype=torch.float32), persistent=False
        )
        self.register_buffer(
            "high", torch.as_tensor(space.high, dtype=torch.float32), persistent=False
        )
        self._np_dtype = space.dtype

    def forward(self, h: torch.Tensor) -> DiagGaussianDist:
        """(..., in_dim) -> Gaussian with actions (..., *shape)."""
        mean = self.mean(h).reshape(*h.shape[:-1], *self.action_shape)
        return DiagGaussianDist(mean, self.log_std, event_ndim=len(self.action_shape))

    def env_action_tensor(self, a: torch.Tensor) -> torch.Tensor:
        """Clipped to the Box bounds."""
        return torch.clamp(a, self.low, self.high)

    def env_action(self, a: torch.Tensor) -> np.ndarray:
        """Clipped to the Box bounds, in the Box's dtype."""
        return super().env_action(a).astype(self._np_dtype, copy=False)


class BernoulliHead(ActionHead):
    """MultiBinary: Linear(in_dim, prod(shape)) logits, one Bernoulli per entry; env dtype int8."""

    def __init__(self, space: spaces.MultiBinary, in_dim: int):
        super().__init__()
        self.action_shape, self.action_dtype = tuple(space.shape), torch.long
        dim = int(np.prod(space.shape, dtype=np.int64))
        self.logits = layer_init(nn.Linear(in_dim, dim), gain=POLICY_INIT_GAIN)

    def forward(self, h: torch.Tensor) -> BernoulliDist:
        """(..., in_dim) -> Bernoullis with actions (..., *shape)."""
        logits = self.logits(h).reshape(*h.shape[:-1], *self.action_shape)
        return BernoulliDist(logits, event_ndim=len(self.action_shape))

    def env_action(self, a: torch.Tensor) -> np.ndarray:
        """0/1 as int8 (MultiBinary's dtype)."""
        return super().env_action(a).astype(np.int8)


def build_action_head(space: spaces.Space, in_dim: int) -> ActionHead:
    """Builds the action head for one action of ``space`` (the single-env action space).

    Example::

        head = build_action_head(envs.single_action_space, 128)
        dist = head(features)                 # features (N, 128)
        a = dist.sample()                     # (N, *head.action_shape), stored in the buffer
        env_a = head.env_action_tensor(a)     # the env's values (ActOutput.env_action)
    """
    if isinstance(space, spaces.Discrete):
        return CategoricalHead(space, in_dim)
    if isinstance(space, spaces.MultiDiscrete):
        return MultiCategoricalHead(space, in_dim)
    if isinstance(space, spaces.Box) and np.issubdtype(space.dtype, np.floating):
        return GaussianHead(space, in_dim)
    if isinstance(space, spaces.MultiBinary):
        return BernoulliHead(space, in_dim)
    raise ValueError(
        f"action space {space!r} ({type(space).__name__}) is not supported; supported: "
        f"{', '.join(SUPPORTED_ACTION_SPACES)}"
    )


# ------------------------------------------------------- Decision Transformer action codecs


class DiscreteActions(nn.Module):
    """Discrete actions: `nn.Embedding` in, logits out, cross-entropy loss."""

    def __init__(self, space: spaces.Discrete, dim: int, in_dim: int) -> None:
        super().__init__()
        self.n, self.start = int(space.n), int(space.start)
        self.embed = nn.Embedding(self.n, dim)
        self.head = nn.Linear(in_dim, self.n)

    def embed_actions(self, actions: Tensor, mask: Tensor) -> Tensor:
        """(B, K) env actions -> (B, K, D); padded slots use index 0."""
        return self.embed((actions.long() - self.start).masked_fill(~mask, 0))

    def forward(self, h: Tensor) -> Tensor:
        """(..., in_dim) -> logits (..., n)."""
        return self.head(h)

    def loss(self, pred: Tensor, actions: Tensor, mask: Tensor) -> tuple[Tensor, dict]:
        """Cross-entropy over real steps."""
        return dt_action_loss(pred, actions.long() - self.start, mask, "discrete")

    def select(self, pred: Tensor, deterministic: bool) -> Tensor:
        """Env actions (N,) from logits (N, n): argmax, or a categorical sample."""
        if deterministic:
            return pred.argmax(-1) + self.start
        return torch.distributions.Categorical(logits=pred).sample() + self.start

    def blank(self, n: int, device: torch.device) -> Tensor:
        """Placeholder action (N,) for the step being predicted (causally invisible to it)."""
        return torch.full((n,), self.start, dtype=torch.long, device=device)


class ContinuousActions(nn.Module):
    """Box actions: Linear in and out; tanh rescaled to the bounds when `tanh` (DT's MuJoCo head).

    Inputs and the loss work in units where finite bounds map to [-1, 1] ((a - center) / radius),
    so every action dimension weighs the same whatever its range; `forward` returns env units.
    """

    def __init__(self, space: spaces.Box, dim: int, in_dim: int, tanh: bool) -> None:
        super().__init__()
        self.shape = tuple(space.shape)
        low = np.asarray(space.low, np.float64).reshape(-1)
        high = np.asarray(space.high, np.float64).reshape(-1)
        finite = np.isfinite(low) & np.isfinite(high)
        if tanh and not finite.all():
            raise ValueError(
                f"action_tanh=True needs finite Box bounds, got low={space.low}, high={space.high};"
                " pass action_tanh=False for unbounded actions"
            )
        low, high = np.where(finite, low, 0.0), np.where(finite, high, 0.0)  # unbounded: 0, 1
        center = (high + low) / 2
        radius = np.where(high > low, (high - low) / 2, 1.0)
        self.register_buffer("center", torch.as_tensor(center, dtype=torch.float32), False)
        self.register_buffer("radius", torch.as_tensor(radius, dtype=torch.float32), False)
        self.dim_a = len(center)
        self.embed = nn.Linear(self.dim_a, dim)
        self.head = nn.Linear(in_dim, self.dim_a)
        self.squash = nn.Tanh() if tanh else nn.Identity()

    def unit(self, actions: Tensor) -> Tensor:
        """Env actions (..., A) -> bound-normalised units."""
        return (actions.float() - self.center) / self.radius

    def embed_actions(self, actions: Tensor, mask: Tensor) -> Tensor:
        """(B, K, A) env actions -> (B, K, D); padded slots embed zeros."""
        return self.embed(self.unit(actions) * mask.unsqueeze(-1))

    def forward(self, h: Tensor) -> Tensor:
        """(..., in_dim) -> actions (..., A) in env units."""
        return self.center + self.radius * self.squash(self.head(h))

    def loss(self, pred: Tensor, actions: Tensor, mask: Tensor) -> tuple[Tensor, dict]:
        """Squared error in bound-normalised units over real steps (DT's MSE)."""
        return dt_action_loss(self.unit(pred), self.unit(actions), mask, "continuous")

    def select(self, pred: Tensor, deterministic: bool) -> Tensor:
        """Env actions (N, *shape): DT regresses a point estimate, so always the prediction."""
        return pred.reshape(pred.shape[0], *self.shape)

    def blank(self, n: int, device: torch.device) -> Tensor:
        """Placeholder action (N, A) for the step being predicted."""
        return self.center.expand(n, self.dim_a).clone()


def build_actions(
    space: spaces.Space, dim: int, in_dim: int, tanh: bool
) -> DiscreteActions | ContinuousActions:
    """The action embedding + head for a Discrete or Box action space."""
    if isinstance(space, spaces.Discrete):
        return DiscreteActions(space, dim, in_dim)
    if isinstance(space, spaces.Box):
        return ContinuousActions(space, dim, in_dim, tanh)
    raise ValueError(f"unsupported action space {space!r}; supported: ['Box', 'Discrete']")
