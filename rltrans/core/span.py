"""Adaptive attention span (Sukhbaatar et al. 2019, "Adaptive Attention Span in Transformers").

Each head h learns how far back it attends: a span z_h in [0, W] steps (W: the window the
block reads, its memory M). A key at distance x = t - r from its query is weighted by the
soft mask

    m_z(x) = clamp((R + z - x) / R, 0, 1)          (R: the ramp, ``span_ramp`` steps)

inside the softmax, a_tr = m_z(t - r) exp(s_tr) / sum_q m_z(t - q) exp(s_tq), i.e. the
scores get log m_z(x) added (-inf where m = 0). The agent's loss adds ``span_coef`` times the
mean span over heads and layers (the paper's L1 cost), so a head keeps only the reach it
uses. Spans start at W (``m = 1`` on the whole window: the block starts as its fixed-window
twin). Keys farther back than every head's span plus the ramp get weight 0, so eager
training and acting attend over those nearest keys only (:meth:`AdaptiveSpan.reach`); a
compiled step keeps its static window and masks the rest.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from rltrans.core.attention import mask_to_bias


class AdaptiveSpan(nn.Module):
    """The learned spans of one block's heads, as fractions of its window (see above)."""

    def __init__(self, heads: int, ramp: int) -> None:
        super().__init__()
        if ramp < 1:
            raise ValueError(f"span_ramp must be >= 1, got {ramp}")
        self.ramp = ramp
        self.fraction = nn.Parameter(torch.ones(heads))  # z_h / W, kept in [0, 1]

    def spans(self, window: int) -> Tensor:
        """z_h in steps (H,), for a window of ``window`` steps."""
        return self.fraction.clamp(0.0, 1.0) * window

    def reach(self, window: int) -> int:
        """How many of the window's most recent steps any head can still weight (a host
        read): min(window, ceil(max z + R))."""
        longest = float(self.spans(window).detach().max())
        return min(window, math.ceil(longest + self.ramp))

    def log_mask(self, distance: Tensor, window: int, dtype: torch.dtype) -> Tensor:
        """log m_z(distance) per head: distance (...) steps -> (H, ...) (0 = full weight,
        -inf = none; a future key, distance < 0, gets 0 and is left to the causal mask)."""
        z = self.spans(window).to(dtype).view(-1, *([1] * distance.dim()))
        soft = ((self.ramp + z - distance.to(dtype)) / self.ramp).clamp(0.0, 1.0)
        # log 0 = -inf (that key gets no weight), with a zero gradient there: log's own would be
        # 0 / 0 where the ramp ends exactly on a key (x = R + z)
        log = torch.log(soft.clamp_min(torch.finfo(dtype).tiny))
        return log.masked_fill(soft == 0, float("-inf"))

    def segment_mask(self, mask: Tensor, length: int, window: int, dtype: torch.dtype) -> Tensor:
        """An additive (B, H, L, S) mask in ``dtype``: the stack's mask (B, 1, L, S) (bool or
        additive) with the span's log mask added; queries are the last L of the S keys."""
        keys = mask.shape[-1]
        query = torch.arange(keys - length, keys, device=mask.device)
        distance = query[:, None] - torch.arange(keys, device=mask.device)[None, :]  # (L, S)
        span = self.log_mask(distance, window, dtype).unsqueeze(0)  # (1, H, L, S)
        return mask_to_bias(mask, span, dtype)

    def step_mask(self, mask: Tensor, window: int) -> Tensor:
        """An additive (N, H, K + 1) mask for one acting step over its last K window slots and
        itself: the stack's step mask (N, 1, K + 1) with the span's log mask added."""
        keys = mask.shape[-1]
        distance = torch.arange(keys - 1, -1, -1, device=mask.device)  # K .. 1, then 0 (itself)
        return mask + self.log_mask(distance, window, mask.dtype).unsqueeze(0)
