"""Inverted dropout (Srivastava et al. 2014) whose CPU mask comes from uniform samples.

On CPU, :func:`torch.nn.functional.dropout` draws its mask with ``bernoulli_``, which costs
about three times as much as drawing uniforms with ``rand_like`` and comparing (dropout was
~10 % of a CPU Decision Transformer training step). Here an element is kept when u >= p for
u ~ U[0, 1), i.e. with probability 1 - p, and kept elements are scaled by 1 / (1 - p). On
other devices the fused native kernel is used unchanged.

The mask is plain tensor code, so compiled graphs trace it like any other op: nothing is
registered with torch at import. Programs compiled by rltrans (``compile=true``) keep torch's
random ops as they are (Inductor's ``fallback_random``), so a compiled run draws the very
masks an eager run draws from the same seed; a plain ``torch.compile`` of a model uses
Inductor's own generator, whose masks differ (each is exact inverted dropout).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def keep_from_uniform(u: Tensor, p: float) -> Tensor:
    """The scaled keep mask of inverted dropout from uniforms u ~ U[0, 1): 1 / (1 - p) where
    u >= p (probability 1 - p), else 0."""
    return (u >= p).to(u.dtype) * (1.0 / (1.0 - p))


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout of x with drop probability p (identity when not training or p = 0)."""
    if not training or p == 0.0:
        return x
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if x.device.type != "cpu":
        return F.dropout(x, p, training=True)
    # Uniforms in float32 whatever x's dtype, so a half-precision x still keeps with
    # probability 1 - p; the mask carries no gradient.
    u = torch.rand_like(x, dtype=torch.float32, memory_format=torch.contiguous_format)
    keep = keep_from_uniform(u, p)
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
