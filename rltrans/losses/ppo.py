"""PPO clipped-surrogate loss as a pure function (Schulman et al. 2017).

Also home of :func:`masked_mean` and :func:`keep_valid`, the masking helpers shared by the IMPALA
and Decision Transformer losses.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["clipped_surrogate", "keep_valid", "masked_mean", "ppo_loss", "standardize"]


def keep_valid(x: Tensor, mask: Tensor | None, fill: float = 0.0) -> Tensor:
    """Replace entries where ``mask`` is False by ``fill`` (mask broadcasts over trailing dims).

    Done before any arithmetic so that garbage in padded entries (inf, NaN, huge log-ratios) can
    neither reach a mean nor turn a zero gradient into NaN (0 * inf) on its way back.
    """
    if mask is None:
        return x
    m = mask.bool()
    m = m.reshape(m.shape + (1,) * (x.dim() - m.dim()))
    return torch.where(m, x, torch.full_like(x, fill))


def masked_mean(x: Tensor, mask: Tensor | None) -> Tensor:
    """Mean of x over entries where ``mask`` (same shape, bool or 0/1) is True; 0 if none are."""
    if mask is None:
        return x.mean()
    m = mask.bool()
    return torch.where(m, x, torch.zeros_like(x)).sum() / m.sum().clamp_min(1).to(x.dtype)


def moments(advantages: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """The mean and unbiased std of the valid entries of ``advantages``."""
    mean = masked_mean(advantages, mask)
    n = advantages.numel() if mask is None else mask.bool().sum()
    centred = keep_valid(advantages - mean, mask)
    # Unbiased variance, as torch.std in the PPO2 baselines / CleanRL; n - 1 >= 1 guards n = 1.
    var = centred.pow(2).sum() / (
        torch.as_tensor(n - 1, dtype=advantages.dtype, device=advantages.device)
    ).clamp_min(1)
    return mean, var.sqrt()


def standardize(
    advantages: Tensor,
    mask: Tensor | None,
    min_std: float = 0.0,
    given: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """Standardise advantages with the mean and unbiased std of the valid entries only (or
    the ``given`` ones, of a batch this is a part of); the std is taken as at least
    ``min_std``, so near-zero advantages are not scaled up to 1."""
    mean, std = moments(advantages, mask) if given is None else given
    return (advantages - mean) / (std.clamp_min(min_std) + 1e-8)


def clipped_surrogate(
    ratio: Tensor, advantages: Tensor, clip_coef: float | None, mask: Tensor | None = None
) -> Tensor:
    """PPO's clipped surrogate as a loss (Schulman et al. 2017, eq. 7): the mean over valid
    steps of max(-A r, -A clip(r, 1 - eps, 1 + eps)); ``advantages`` are constants.
    ``clip_coef=None`` leaves r unclipped (the importance-weighted policy gradient)."""
    unclipped = -advantages * ratio
    if clip_coef is None:
        return masked_mean(unclipped, mask)
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_coef, 1.0 + clip_coef)
    return masked_mean(torch.maximum(unclipped, clipped), mask)


def ppo_loss(
    new_log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    new_values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    entropy: Tensor,
    *,
    clip_coef: float | None,
    vf_clip_coef: float | None,
    ent_coef: float,
    vf_coef: float,
    mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO loss = policy - ent_coef * entropy + vf_coef * value; all inputs share one shape.

    ``advantages`` are used as given: standardising them (:func:`standardize`, over a
    minibatch or a whole rollout) is the caller's choice. ``mask`` (bool or 0/1, True = valid
    step) removes padded steps from every mean. ``old_log_prob``, ``advantages``,
    ``old_values`` and ``returns`` are treated as constants (detached). ``clip_coef=None`` /
    ``vf_clip_coef=None`` disable the policy-ratio / value clipping.
    Metrics (detached scalars, no host sync): policy, value, entropy, approx_kl, clipfrac,
    ratio_mean. Example: ``loss, m = ppo_loss(lp, old_lp, adv, v, old_v, ret, ent, clip_coef=0.2,
    vf_clip_coef=None, ent_coef=0.01, vf_coef=0.5)``.
    """
    # Neutralise padded entries first (log-ratio 0, zero advantage, zero value error).
    log_ratio = keep_valid(new_log_prob - old_log_prob.detach(), mask)
    advantages = keep_valid(advantages.detach(), mask)
    new_values = keep_valid(new_values, mask)
    old_values = keep_valid(old_values.detach(), mask)
    returns = keep_valid(returns.detach(), mask)
    entropy = keep_valid(entropy, mask)

    # Clipped surrogate, Schulman et al. 2017 eq. 7 (written as a loss: max of the negatives).
    ratio = torch.exp(log_ratio)
    policy_loss = clipped_surrogate(ratio, advantages, clip_coef, mask)

    # Value loss with the PPO2-baselines clipping: pessimistic max of clipped and unclipped errors.
    value_err = (new_values - returns).pow(2)
    if vf_clip_coef is not None:
        v_clipped = old_values + torch.clamp(new_values - old_values, -vf_clip_coef, vf_clip_coef)
        value_err = torch.maximum(value_err, (v_clipped - returns).pow(2))
    value_loss = 0.5 * masked_mean(value_err, mask)

    entropy_mean = masked_mean(entropy, mask)
    loss = policy_loss - ent_coef * entropy_mean + vf_coef * value_loss

    with torch.no_grad():
        # k3 estimator of KL(old || new): unbiased, non-negative and exactly 0 when ratio == 1
        # (Schulman, "Approximating KL divergence", 2020).
        approx_kl = masked_mean((ratio - 1.0) - log_ratio, mask)
        bound = float("inf") if clip_coef is None else clip_coef
        clipped = ((ratio - 1.0).abs() > bound).to(ratio.dtype)
        metrics = {
            "policy": policy_loss.detach(),
            "value": value_loss.detach(),
            "entropy": entropy_mean.detach(),
            "approx_kl": approx_kl,
            "clipfrac": masked_mean(clipped, mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
    return loss, metrics
