"""Dropout with masks drawn from uniform samples: the same distribution, cheaper on CPU.

On CPU, :func:`torch.nn.functional.dropout` draws its mask with ``bernoulli_``, which costs
about three times as much as drawing uniforms with ``rand_like`` and comparing (measured in
``benchmarks/dt_throughput.py``: dropout was ~10 % of a Decision Transformer training step).
Here an element is kept when u >= p for u ~ U[0, 1), i.e. with probability 1 - p, and kept
elements are scaled by 1 / (1 - p), exactly as inverted dropout (Srivastava et al. 2014).
On other devices the fused native kernel is used unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


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
    keep = u.ge_(p).mul_(1.0 / (1.0 - p))
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
