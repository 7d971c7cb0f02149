"""IMPALA actor-critic loss with V-trace targets as a pure function (Espeholt et al. 2018)."""

from __future__ import annotations

import torch
from torch import Tensor

from rltrans.losses.ppo import clipped_surrogate, keep_valid, masked_mean, standardize
from rltrans.returns import VTraceReturns, vtrace

__all__ = ["impala_loss", "impala_targets"]


def impala_loss(
    target_log_prob: Tensor,
    behaviour_log_prob: Tensor,
    entropy: Tensor,
    values: Tensor,
    next_values: Tensor,
    rewards: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    *,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float | None = None,
    lam: float = 1.0,
    vf_coef: float = 0.5,
    ent_coef: float = 0.01,
    normalize_advantages: bool = False,
    min_advantage_std: float = 0.0,
    clip_coef: float | None = None,
    mask: Tensor | None = None,
    advantage_moments: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """IMPALA loss = policy + vf_coef * value - ent_coef * entropy; all inputs time-major (T, N).

    ``target_log_prob`` and ``values`` come from the learner (with gradients), the behaviour
    log-probs from the actors; ``next_values`` follows :func:`rltrans.returns.next_values_from`.
    V-trace targets and advantages are stop-gradient (section 4.2), so the policy term is
    -(rho_s A_s).detach() * log pi and the value term 0.5 (v_s - V(x_s))^2 moves V only.
    ``mask`` (True = valid) drops steps from the means; masked steps must come after an
    episode end (padding), because they still lie on the V-trace recursion of earlier steps.
    ``normalize_advantages`` standardises the policy-gradient advantages over the batch (as
    PPO does per minibatch; not in the paper), dividing by max(std, ``min_advantage_std``);
    ``advantage_moments`` gives that mean and std when these inputs are a part of the batch.
    ``clip_coef`` replaces the policy term with PPO's clipped surrogate over the ratio
    r = pi/mu and the unweighted advantages q_s - V(x_s) (as APPO does; not in the paper):
    the same gradient as the paper's while r <= pg_rho_bar and r is inside the clip range,
    and none once a step has moved r out of it, which bounds repeated steps on one batch.
    Metrics: policy, value, entropy, rho_mean (unclipped pi/mu), rho_clipfrac (rho > rho_bar),
    and with ``clip_coef`` clipfrac (|r - 1| > clip_coef).
    """
    # Padding may hold garbage; neutralise it so it cannot overflow exp() or poison gradients.
    target_log_prob = keep_valid(target_log_prob, mask)
    log_rhos = keep_valid(target_log_prob.detach() - behaviour_log_prob, mask)
    values = keep_valid(values, mask)
    entropy = keep_valid(entropy, mask)

    targets, advantages = impala_targets(
        log_rhos,
        rewards,
        values,
        next_values,
        terminated,
        truncated,
        gamma=gamma,
        rho_bar=rho_bar,
        c_bar=c_bar,
        pg_rho_bar=pg_rho_bar,
        lam=lam,
        clip_coef=clip_coef,
        mask=mask,
    )
    if normalize_advantages:
        advantages = standardize(advantages, mask, min_advantage_std, advantage_moments)
    # Means instead of the paper's sums, so coefficients do not scale with T * N.
    if clip_coef is None:
        policy_loss = masked_mean(-advantages * target_log_prob, mask)
    else:
        ratio = torch.exp(keep_valid(target_log_prob - behaviour_log_prob, mask))
        policy_loss = clipped_surrogate(ratio, advantages, clip_coef, mask)
    value_loss = 0.5 * masked_mean((targets.vs - values).pow(2), mask)
    entropy_mean = masked_mean(entropy, mask)
    loss = policy_loss + vf_coef * value_loss - ent_coef * entropy_mean

    terms = {"policy": policy_loss, "value": value_loss, "entropy": entropy_mean}
    return loss, _metrics(terms, log_rhos, rho_bar, clip_coef, mask)


@torch.no_grad()
def impala_targets(
    log_rhos: Tensor,
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    *,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float | None = None,
    lam: float = 1.0,
    clip_coef: float | None = None,
    mask: Tensor | None = None,
) -> tuple[VTraceReturns, Tensor]:
    """The V-trace targets of :func:`impala_loss` and the advantages its policy term weighs
    (the paper's rho-weighted ones, or with ``clip_coef`` the unweighted ones), stop-gradient."""
    targets = vtrace(
        log_rhos.detach(),
        keep_valid(rewards, mask),
        values.detach(),
        keep_valid(next_values.detach(), mask),
        terminated,
        truncated,
        gamma,
        rho_bar=rho_bar,
        c_bar=c_bar,
        pg_rho_bar=pg_rho_bar,
        lam=lam,
    )
    return targets, targets.pg_advantages if clip_coef is None else targets.advantages


@torch.no_grad()
def _metrics(
    terms: dict[str, Tensor],
    log_rhos: Tensor,
    rho_bar: float,
    clip_coef: float | None,
    mask: Tensor | None,
) -> dict[str, Tensor]:
    """The loss terms, detached, and the importance ratios' mean and clipped fractions."""
    rhos = torch.exp(log_rhos)
    metrics = {name: term.detach() for name, term in terms.items()}
    metrics["rho_mean"] = masked_mean(rhos, mask)
    metrics["rho_clipfrac"] = masked_mean((rhos > rho_bar).to(rhos.dtype), mask)
    if clip_coef is not None:
        outside = ((rhos - 1.0).abs() > clip_coef).to(rhos.dtype)
        metrics["clipfrac"] = masked_mean(outside, mask)
    return metrics
