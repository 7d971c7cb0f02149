"""What an exported program's tensors are, and the action outputs of each distribution.

Every input and output is described by a :class:`TensorSpec` (name, role, shape with the
batch axis first, dtype, initial value of a state input and the output that replaces it);
the sidecar holds them as JSON. The outputs of the action head are picked once from its
distribution: the action in the env's values, the distribution's parameters (a categorical's
log-probabilities, a Gaussian's mean and log std, a Bernoulli's logits) and, when the program
samples, the draw from a noise input the caller supplies (uniform or standard normal), so the
program holds no random number generator and one noise array gives one action.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from rltrans.agents.heads import ActionHead, BernoulliHead, GaussianHead

Role = Literal[
    "observation",  # the env's observation (one input per leaf of a Dict/Tuple space)
    "episode_start",  # true where the observation begins an episode: the env's state resets
    "reward",  # the reward of the previous step (return-conditioned policies)
    "target_return",  # the return an episode aims for (return-conditioned policies)
    "noise",  # random numbers the sampling program draws its action with
    "state",  # memory carried to the next step: an input and the output that replaces it
    "action",  # the action in the env's values
    "distribution",  # a parameter of the action distribution
    "value",  # the critic's value estimate
]
BATCH = "batch"  # the name of the dynamic leading axis in every shape


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of an exported program.

    ``shape`` starts with ``"batch"`` (the envs, dynamic); ``initial`` is the value a state
    input holds at the start (every element); ``pairs`` names the state output that replaces
    a state input, or the input a state output replaces; ``default`` is an input's usual value.
    """

    name: str
    role: Role
    shape: tuple[int | str, ...]
    dtype: str
    doc: str
    initial: float | int | bool | None = None
    pairs: str | None = None
    default: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A plain dict for the sidecar (fields that do not apply are left out)."""
        out: dict[str, Any] = {"name": self.name, "role": self.role, "shape": list(self.shape)}
        out |= {"dtype": self.dtype, "doc": self.doc}
        if self.role == "state":
            out["initial"] = self.initial
        optional = {"pairs": self.pairs, "default": self.default}
        out |= {key: value for key, value in optional.items() if value is not None}
        return out | self.extra


def dtype_name(dtype: torch.dtype) -> str:
    """A torch dtype as NumPy names it (``float32``, ``int64``, ``bool``, ``uint8``)."""
    return str(dtype).removeprefix("torch.")


def spec_of(example: Tensor, name: str, role: Role, doc: str, **kw: Any) -> TensorSpec:
    """The spec of a tensor shaped like ``example`` (N, ...) with N dynamic."""
    shape = (BATCH, *(int(s) for s in example.shape[1:]))
    return TensorSpec(name, role, shape, dtype_name(example.dtype), doc, **kw)


def reset_rows(t: Tensor, keep: Tensor) -> Tensor:
    """``t`` (N, ...) with the rows where ``keep`` (N,) is False set to zero (False for
    bool): a state tensor back at its initial value where an episode starts. Arithmetic,
    not ``where``: ONNX Runtime has no kernel for ``Where`` on bool tensors."""
    shaped = keep.view(-1, *[1] * (t.dim() - 1))
    return t & shaped if t.dtype == torch.bool else t * shaped.to(t.dtype)


def categorical_noise_sample(log_p: Tensor, uniform: Tensor) -> Tensor:
    """The Gumbel-max draw argmax(log p + G), G = -log(-log U), of U ~ Uniform(0, 1) noise
    shaped like ``log_p`` (..., n): the sample the PyTorch head draws with its own noise."""
    tiny = torch.finfo(log_p.dtype).tiny
    u = uniform.to(log_p.dtype).clamp(tiny, 1.0 - 1e-7)
    return (log_p - torch.log(-torch.log(u))).argmax(dim=-1)


class CategoricalOutputs:
    """Discrete and MultiDiscrete heads: ``logits`` = the log-probabilities (log_softmax)."""

    names = ("logits",)
    noise = "uniform"
    docs = ("log-probabilities of each action (log_softmax of the logits)",)

    def parameters(self, dist: Any) -> tuple[Tensor, ...]:
        """The distribution's outputs."""
        return (dist.log_p,)

    def noise_like(self, dist: Any) -> Tensor:
        """A noise example of the shape the sample draws from."""
        return torch.rand_like(dist.log_p)

    def sample(self, dist: Any, noise: Tensor) -> Tensor:
        """The action drawn with ``noise``."""
        return categorical_noise_sample(dist.log_p, noise)


class GaussianOutputs:
    """Box heads: ``mean`` and ``log_std`` of the diagonal Gaussian; the action is clipped
    to the Box for the env (as ``load_policy``), the distribution is not."""

    names = ("mean", "log_std")
    noise = "normal"
    docs = ("mean of the Gaussian (before clipping)", "log standard deviation of the Gaussian")

    def parameters(self, dist: Any) -> tuple[Tensor, ...]:
        """The distribution's outputs."""
        return dist.mean, dist.log_std.expand_as(dist.mean)

    def noise_like(self, dist: Any) -> Tensor:
        """A noise example of the shape the sample draws from."""
        return torch.randn_like(dist.mean)

    def sample(self, dist: Any, noise: Tensor) -> Tensor:
        """mean + std * noise."""
        return dist.mean + dist.log_std.exp() * noise.to(dist.mean.dtype)


class BernoulliOutputs:
    """MultiBinary heads: ``logits`` of each entry's probability of 1."""

    names = ("logits",)
    noise = "uniform"
    docs = ("logit of each entry's probability of 1",)

    def parameters(self, dist: Any) -> tuple[Tensor, ...]:
        """The distribution's outputs."""
        return (dist.logits,)

    def noise_like(self, dist: Any) -> Tensor:
        """A noise example of the shape the sample draws from."""
        return torch.rand_like(dist.logits)

    def sample(self, dist: Any, noise: Tensor) -> Tensor:
        """1 where the noise falls below the probability."""
        return (noise.to(dist.logits.dtype) < torch.sigmoid(dist.logits)).long()


ActionOutputs = CategoricalOutputs | GaussianOutputs | BernoulliOutputs


def action_outputs(head: ActionHead) -> ActionOutputs:
    """The outputs of a memory agent's action head, chosen once from its kind."""
    if isinstance(head, GaussianHead):
        return GaussianOutputs()
    if isinstance(head, BernoulliHead):
        return BernoulliOutputs()
    return CategoricalOutputs()
