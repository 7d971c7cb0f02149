"""Dropout with masks drawn from uniform samples: the same distribution, cheaper on CPU.

On CPU, :func:`torch.nn.functional.dropout` draws its mask with ``bernoulli_``, which costs
about three times as much as drawing uniforms with ``rand_like`` and comparing (measured in
``benchmarks/dt_throughput.py``: dropout was ~10 % of a Decision Transformer training step).
Here an element is kept when u >= p for u ~ U[0, 1), i.e. with probability 1 - p, and kept
elements are scaled by 1 / (1 - p), exactly as inverted dropout (Srivastava et al. 2014).
On other devices the fused native kernel is used unchanged.

Inside a compiled graph the mask comes from ``keep_mask`` (the opaque op
``rltrans::keep_from_uniform``, wrapping :func:`keep_from_uniform`): left to itself,
Inductor fuses the comparison into the consumer and saves a boolean mask for backward, whose
byte stores its AVX2 code does one element at a time (about half of each fused LayerNorm
kernel in a compiled Decision Transformer step; that step was slower compiled than eager).
The opaque op's float mask is saved instead, and its draws are the eager path's, in order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def keep_from_uniform(u: Tensor, p: float) -> Tensor:
    """The scaled keep mask of inverted dropout from uniforms u ~ U[0, 1): 1 / (1 - p) where
    u >= p (probability 1 - p), else 0."""
    keep = torch.empty_like(u)
    return torch.ge(u, p, out=keep).mul_(1.0 / (1.0 - p))


# The same function as an opaque op, for compiled graphs (see the module docstring). Its input
# is the uniforms, not x: graph CSE would merge two identical calls of a pure op, so two
# dropouts of one tensor would share a mask; each rand_like stays its own node.
keep_mask = torch.library.custom_op(
    "rltrans::keep_from_uniform", keep_from_uniform, mutates_args=(), device_types="cpu"
)


@keep_mask.register_fake
def _keep_mask_shape(u: Tensor, p: float) -> Tensor:
    return torch.empty_like(u)


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout of x with drop probability p (identity when not training or p = 0)."""
    if not training or p == 0.0:
        return x
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if x.device.type != "cpu":
        return F.dropout(x, p, training=True)
    # The scaled keep mask: 1 / (1 - p) with probability 1 - p, else 0 (no gradient). Uniforms
    # in float32 whatever x's dtype, so a half-precision x still keeps with probability 1 - p.
    u = torch.rand_like(x, dtype=torch.float32, memory_format=torch.contiguous_format)
    # Compiled graphs take the opaque op; eager fills u in place (the op adds ~25 us a call).
    compiling = torch.compiler.is_compiling()
    keep = keep_mask(u, p) if compiling else u.ge_(p).mul_(1.0 / (1.0 - p))
    return x * (keep if keep.dtype == x.dtype else keep.to(x.dtype))


class Dropout(nn.Module):
    """Module form of :func:`dropout` (a drop-in for ``nn.Dropout``)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        """Drop elements while training."""
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        """Show p like nn.Dropout."""
        return f"p={self.p}"
