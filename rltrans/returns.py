"""Return estimators as pure functions of tensors: GAE, V-trace, Monte-Carlo, returns-to-go.

Conventions (Gymnasium SAME_STEP autoreset, time-major tensors of shape (T, ...), where the
trailing dims are usually (N,) envs but may be anything):

- ``rewards[t]``, ``terminated[t]``, ``truncated[t]`` describe the transition taken at step t,
  and ``values[t]`` is V(s_t).
- ``next_values[t]`` is V of the state that follows step t *within the same episode*:
  ``values[t + 1]`` for a step that does not end the episode, the bootstrap value V(s_T) at
  t = T - 1, and V(final_obs) for a truncated step. Where ``terminated[t]`` it is ignored.
  :func:`next_values_from` assembles it.
- TD error: ``delta_t = r_t + gamma * (1 - terminated_t) * next_values[t] - values[t]``, and every
  trace is cut at ``done_t = terminated_t | truncated_t``, so nothing is ever bootstrapped from the
  first state of the next episode.

Every recursion runs one Python loop over T and is vectorised over all other dims.
"""

from __future__ import annotations

from typing import NamedTuple, TypeVar

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "VTraceReturns",
    "discounted_returns",
    "gae",
    "next_values_from",
    "returns_to_go",
    "returns_to_go_segments",
    "vtrace",
]

ArrayT = TypeVar("ArrayT", np.ndarray, Tensor)


def next_values_from(
    values: Tensor, bootstrap_value: Tensor, truncated: Tensor, final_values: Tensor
) -> Tensor:
    """Assemble ``next_values`` (T, ...) from V(s_t), the bootstrap V(s_T) and V(final_obs).

    ``values`` (T, ...) is V(s_t) on the observations the agent acted on; ``bootstrap_value``
    (...) is V of the observation after the last step; ``final_values`` (T, ...) is
    V(final_obs) and is read only where ``truncated`` (T, ...) is True (fill it with anything
    elsewhere). Terminated rows keep whatever the shift puts there: the estimators ignore them.

    Example: ``nv = next_values_from(v, v_last, trunc, v_final); adv, ret = gae(r, v, nv, ...)``.
    """
    # With SAME_STEP autoreset, values[t + 1] after a done is the NEXT episode's first state,
    # so truncated rows must be overwritten with V(final_obs) of the episode that was cut.
    shifted = torch.cat([values[1:], bootstrap_value.unsqueeze(0).to(values)], dim=0)  # (T, ...)
    return torch.where(truncated.bool(), final_values.to(values), shifted)


def _td_terms(
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    gamma: float,
) -> tuple[Tensor, Tensor]:
    """Return the TD errors delta_t and the trace-continuation mask (1 - done_t), both (T, ...)."""
    not_done = 1.0 - (terminated.bool() | truncated.bool()).to(values.dtype)
    delta = rewards + gamma * _zero_where_terminated(next_values, terminated) - values
    return delta, not_done


def _zero_where_terminated(x: Tensor, terminated: Tensor) -> Tensor:
    """Zero x at terminal steps; a select, not a product, so an ignored inf/NaN stays ignored."""
    return torch.where(terminated.bool(), torch.zeros_like(x), x)


def _reverse_scan(deltas: Tensor, decay: Tensor) -> Tensor:
    """Solve x_t = deltas_t + decay_t * x_{t+1} backwards with x_T = 0; (T, ...) -> (T, ...)."""
    acc = torch.zeros_like(deltas[0])
    out = []
    for t in range(deltas.shape[0] - 1, -1, -1):
        acc = deltas[t] + decay[t] * acc
        out.append(acc)
    out.reverse()
    return torch.stack(out, dim=0)


def gae(
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Generalized Advantage Estimation; returns ``(advantages, returns)``, each (T, ...).

    Schulman et al. 2016, eq. 16: A_t = sum_k (gamma * lam)^k delta_{t+k}, computed backwards as
    A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}; ``returns = advantages + values`` is the
    TD(lambda) value target. Example: ``adv, ret = gae(r, v, nv, term, trunc, 0.99, 0.95)``.
    """
    delta, not_done = _td_terms(rewards, values, next_values, terminated, truncated, gamma)
    advantages = _reverse_scan(delta, gamma * lam * not_done)
    return advantages, advantages + values


def discounted_returns(
    rewards: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    gamma: float,
) -> Tensor:
    """Bootstrapped discounted returns G_t (T, ...): Monte-Carlo within the batch.

    G_t = r_t + gamma * (1 - terminated_t) * (G_{t+1} if the episode goes on else next_values[t]),
    with G_T = next_values[T-1]; equal to ``gae(..., lam=1)[1]`` but needs no values.
    """
    done = terminated.bool() | truncated.bool()
    acc = next_values[-1]
    out = []
    for t in range(rewards.shape[0] - 1, -1, -1):
        # At an episode end, continue from V(final_obs) instead of the next episode's return.
        following = torch.where(done[t], next_values[t], acc)
        acc = rewards[t] + gamma * _zero_where_terminated(following, terminated[t])
        out.append(acc)
    out.reverse()
    return torch.stack(out, dim=0)


class VTraceReturns(NamedTuple):
    """V-trace targets ``vs``, policy-gradient advantages and q_s - V(x_s), each (T, ...)."""

    vs: Tensor
    pg_advantages: Tensor  # min(pg_rho_bar, pi/mu) (q_s - V(x_s)), section 4.2
    advantages: Tensor  # q_s - V(x_s), unweighted (for a clipped-ratio surrogate)


def vtrace(
    log_rhos: Tensor,
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float | None = None,
    lam: float = 1.0,
) -> VTraceReturns:
    """V-trace off-policy targets (Espeholt et al. 2018, eq. 1 and Remark 1); inputs (T, ...).

    ``log_rhos`` = log pi(a_t|x_t) - log mu(a_t|x_t). With rho_t = min(rho_bar, pi/mu),
    c_t = lam * min(c_bar, pi/mu) and delta_t V = rho_t (r_t + gamma V(x_{t+1}) - V(x_t)):
    v_s - V(x_s) = delta_s V + gamma c_s (v_{s+1} - V(x_{s+1})), cut at episode ends.
    Policy-gradient advantage (section 4.2): min(pg_rho_bar, pi/mu) (q_s - V(x_s)) with
    q_s = r_s + gamma (1 - terminated_s) v'_{s+1}, where v'_{s+1} = v_{s+1} while the episode
    continues inside the batch and next_values[s] otherwise (V(final_obs), or the bootstrap at
    s = T - 1). ``pg_rho_bar=None`` uses ``rho_bar`` as in the paper; ``inf`` disables a clip.
    The result carries gradients of its inputs: callers detach what must be a fixed target.
    """
    rhos = torch.exp(log_rhos)
    clipped_rhos = torch.clamp(rhos, max=rho_bar)
    cs = lam * torch.clamp(rhos, max=c_bar)
    pg_rhos = torch.clamp(rhos, max=rho_bar if pg_rho_bar is None else pg_rho_bar)

    delta, not_done = _td_terms(rewards, values, next_values, terminated, truncated, gamma)
    # Remark 1: v_s - V(x_s) obeys a backward recursion like GAE's, with decay gamma * c_s.
    vs = values + _reverse_scan(clipped_rhos * delta, gamma * cs * not_done)

    # v'_{s+1}: the next V-trace target inside the episode, else the caller's next value.
    vs_following = torch.cat([vs[1:], next_values[-1:]], dim=0)  # (T, ...)
    done = not_done == 0
    vs_following = torch.where(done, next_values, vs_following)
    q = rewards + gamma * _zero_where_terminated(vs_following, terminated)
    advantages = q - values
    return VTraceReturns(vs=vs, pg_advantages=pg_rhos * advantages, advantages=advantages)


def returns_to_go(rewards: ArrayT, gamma: float = 1.0) -> ArrayT:
    """Returns-to-go R_t = sum_{j >= t} gamma^(j-t) r_j of one episode; 1-D NumPy or torch.

    Summed in float64 and returned in the input's floating dtype (float64 for integer input).
    """
    return returns_to_go_segments(rewards, _zeros_like_bool(rewards), gamma)


def returns_to_go_segments(rewards: ArrayT, dones: ArrayT, gamma: float = 1.0) -> ArrayT:
    """Returns-to-go of episodes stored back to back in a flat 1-D array (Chen et al. 2021).

    ``dones[t]`` is True on the last step of each episode (terminated or truncated); the sum
    restarts after it. Steps after the last done form an episode cut by the end of the data.
    Example: ``returns_to_go_segments([1, 1, 1], [False, True, False]) -> [2, 1, 1]``.
    """
    is_torch = isinstance(rewards, Tensor)
    r = rewards.detach().cpu().numpy() if is_torch else np.asarray(rewards)
    d = dones.detach().cpu().numpy() if isinstance(dones, Tensor) else np.asarray(dones)
    if r.ndim != 1 or d.shape != r.shape:
        raise ValueError(f"expected 1-D rewards and dones of one shape, got {r.shape}, {d.shape}")
    # A plain Python loop over float64 scalars: exact, and ~0.2 s per million steps, which is
    # fine for a dataset transformed once at load time.
    r_list = r.astype(np.float64).tolist()
    d_list = d.astype(bool).tolist()
    out = [0.0] * len(r_list)
    acc = 0.0
    for t in range(len(r_list) - 1, -1, -1):
        acc = r_list[t] + (0.0 if d_list[t] else gamma * acc)
        out[t] = acc
    rtg = np.asarray(out, dtype=np.float64)
    if is_torch:
        dtype = rewards.dtype if rewards.is_floating_point() else torch.float64
        return torch.from_numpy(rtg).to(device=rewards.device, dtype=dtype)
    dtype = r.dtype if np.issubdtype(r.dtype, np.floating) else np.float64
    return rtg.astype(dtype, copy=False)


def _zeros_like_bool(x: np.ndarray | Tensor) -> np.ndarray | Tensor:
    """Boolean zeros of x's shape, in x's library."""
    if isinstance(x, Tensor):
        return torch.zeros(x.shape, dtype=torch.bool)
    return np.zeros(np.shape(x), dtype=bool)
