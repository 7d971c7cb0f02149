"""Decision Transformer action loss as a pure function (Chen et al. 2021, section 3)."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from rltrans.losses.ppo import keep_valid, masked_mean

__all__ = ["dt_action_loss"]


def dt_action_loss(
    pred: Tensor,
    target: Tensor,
    mask: Tensor | None,
    kind: Literal["discrete", "continuous"],
) -> tuple[Tensor, dict[str, Tensor]]:
    """Action loss averaged over valid (``mask`` True, non-padding) positions of (B, K) windows.

    ``discrete``: ``pred`` (B, K, A) logits, ``target`` (B, K) integer actions, cross-entropy.
    ``continuous``: ``pred`` and ``target`` (B, K, A), squared error averaged over A.
    Metrics: ``action`` (the loss) and, for discrete actions, ``accuracy`` of the argmax.
    Example: ``loss, m = dt_action_loss(logits, actions, valid, "discrete")``.
    """
    # Padding may hold anything (NaN predictions, -1 actions): replace it before any arithmetic
    # so it cannot reach the mean or make cross_entropy index out of range.
    pred = keep_valid(pred, mask)
    metrics: dict[str, Tensor] = {}
    if kind == "discrete":
        target = keep_valid(target.long(), mask)
        per_pos = F.cross_entropy(pred.flatten(0, 1), target.flatten(), reduction="none")  # (B*K,)
        per_pos = per_pos.view(target.shape)  # (B, K)
        with torch.no_grad():
            hits = (pred.argmax(dim=-1) == target).to(pred.dtype)
            metrics["accuracy"] = masked_mean(hits, mask)
    elif kind == "continuous":
        target = keep_valid(target, mask)
        per_pos = (pred - target).pow(2).mean(dim=-1)  # (B, K)
    else:
        raise ValueError(f"kind must be 'discrete' or 'continuous', got {kind!r}")
    loss = masked_mean(per_pos, mask)
    metrics["action"] = loss.detach()
    return loss, metrics
