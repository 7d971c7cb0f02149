"""GAE, V-trace and returns-to-go against naive per-env, per-episode loops."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rltrans.returns import (
    discounted_returns,
    gae,
    next_values_from,
    returns_to_go,
    returns_to_go_segments,
    vtrace,
)

D = torch.float64


def make_batch(seed: int, T: int, N: int, p_end: float = 0.2) -> dict[str, torch.Tensor]:
    """Random (T, N) rollout with terminations and truncations at random in-batch steps."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(T, N, generator=g)
    terminated = u < p_end / 2
    truncated = (u >= p_end / 2) & (u < p_end)
    if p_end > 0:
        # Every random batch exercises both kinds of episode end, at different times and envs.
        terminated[T // 3, 0], truncated[T // 3, 0] = True, False
        truncated[T // 2, N - 1], terminated[T // 2, N - 1] = True, False
    values = torch.randn(T, N, generator=g, dtype=D)
    bootstrap = torch.randn(N, generator=g, dtype=D)
    final_values = torch.randn(T, N, generator=g, dtype=D)
    return {
        "rewards": torch.randn(T, N, generator=g, dtype=D),
        "values": values,
        "bootstrap": bootstrap,
        "final_values": final_values,
        "terminated": terminated,
        "truncated": truncated,
        "next_values": next_values_from(values, bootstrap, truncated, final_values),
        "log_rhos": 0.7 * torch.randn(T, N, generator=g, dtype=D),
    }


# ---- naive references: plain Python floats, one env at a time, split into episodes ----


def naive_next_value(b: dict, t: int, n: int) -> float:
    """V of the state after step t of env n, in the same episode (None if terminated)."""
    T = b["values"].shape[0]
    if b["terminated"][t, n]:
        return 0.0  # never used: multiplied by gamma * 0
    if b["truncated"][t, n]:
        return b["final_values"][t, n].item()
    return b["bootstrap"][n].item() if t == T - 1 else b["values"][t + 1, n].item()


def episode_end(b: dict, t: int, n: int) -> int:
    """Last index >= t of the episode (or batch piece) containing step t of env n."""
    T = b["values"].shape[0]
    s = t
    while s < T - 1 and not (b["terminated"][s, n] or b["truncated"][s, n]):
        s += 1
    return s


def naive_delta(b: dict, t: int, n: int, gamma: float) -> float:
    """One-step TD error computed from scratch."""
    boot = 0.0 if b["terminated"][t, n] else gamma * naive_next_value(b, t, n)
    return b["rewards"][t, n].item() + boot - b["values"][t, n].item()


def naive_gae(b: dict, gamma: float, lam: float) -> torch.Tensor:
    """A_t = sum_{k} (gamma*lam)^k delta_{t+k} over the rest of step t's episode."""
    T, N = b["values"].shape
    out = torch.zeros(T, N, dtype=D)
    for n in range(N):
        for t in range(T):
            end = episode_end(b, t, n)
            out[t, n] = sum(
                (gamma * lam) ** (k - t) * naive_delta(b, k, n, gamma) for k in range(t, end + 1)
            )
    return out


def naive_vtrace(
    b: dict, gamma: float, rho_bar: float, c_bar: float, pg_rho_bar: float, lam: float
):
    """Espeholt et al. eq. 1 as an explicit sum, then q_s from the explicit v_{s+1}."""
    T, N = b["values"].shape
    rho = torch.exp(b["log_rhos"])
    vs = torch.zeros(T, N, dtype=D)
    for n in range(N):
        for s in range(T):
            end = episode_end(b, s, n)
            total, trace = 0.0, 1.0
            for t in range(s, end + 1):
                total += (
                    gamma ** (t - s)
                    * trace
                    * min(rho_bar, rho[t, n].item())
                    * naive_delta(b, t, n, gamma)
                )
                trace *= lam * min(c_bar, rho[t, n].item())
            vs[s, n] = b["values"][s, n].item() + total
    pg = torch.zeros(T, N, dtype=D)
    for n in range(N):
        for s in range(T):
            ends = b["terminated"][s, n] or b["truncated"][s, n] or s == T - 1
            v_next = naive_next_value(b, s, n) if ends else vs[s + 1, n].item()
            q = b["rewards"][s, n].item() + (0.0 if b["terminated"][s, n] else gamma * v_next)
            pg[s, n] = min(pg_rho_bar, rho[s, n].item()) * (q - b["values"][s, n].item())
    return vs, pg


def run_gae(b: dict, gamma: float, lam: float):
    """Call gae on a batch dict."""
    keys = ("rewards", "values", "next_values", "terminated", "truncated")
    return gae(*(b[k] for k in keys), gamma, lam)


def run_vtrace(b: dict, gamma: float, **kw):
    """Call vtrace on a batch dict."""
    keys = ("log_rhos", "rewards", "values", "next_values", "terminated", "truncated")
    return vtrace(*(b[k] for k in keys), gamma, **kw)


# ---- tests ----


def test_next_values_from_matches_naive():
    b = make_batch(0, T=9, N=4)
    T, N = b["values"].shape
    for n in range(N):
        for t in range(T):
            if not b["terminated"][t, n]:
                assert b["next_values"][t, n].item() == naive_next_value(b, t, n)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    T=st.integers(1, 12),
    N=st.integers(1, 4),
    gamma=st.floats(0.5, 1.0),
    lam=st.floats(0.0, 1.0, allow_subnormal=False),  # torch 2.4 compiled kernels flush them
)
def test_gae_matches_naive_loop(seed, T, N, gamma, lam):
    b = make_batch(seed, T, N)
    adv, ret = run_gae(b, gamma, lam)
    expected = naive_gae(b, gamma, lam)
    torch.testing.assert_close(adv, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ret, expected + b["values"], rtol=1e-10, atol=1e-10)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    T=st.integers(1, 12),
    N=st.integers(1, 4),
    gamma=st.floats(0.5, 1.0),
    rho_bar=st.sampled_from([0.8, 1.0, 2.0]),
    c_bar=st.sampled_from([0.6, 1.0, 1.5]),
    pg_rho_bar=st.sampled_from([None, 0.9, 3.0]),
    lam=st.sampled_from([1.0, 0.9]),
)
def test_vtrace_matches_explicit_sum(seed, T, N, gamma, rho_bar, c_bar, pg_rho_bar, lam):
    b = make_batch(seed, T, N)
    out = run_vtrace(b, gamma, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar, lam=lam)
    vs, pg = naive_vtrace(
        b, gamma, rho_bar, c_bar, rho_bar if pg_rho_bar is None else pg_rho_bar, lam
    )
    torch.testing.assert_close(out.vs, vs, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out.pg_advantages, pg, rtol=1e-10, atol=1e-10)


def test_trailing_dims_are_independent():
    bs = [make_batch(s, T=7, N=3) for s in (1, 2)]
    stacked = {k: torch.stack([b[k] for b in bs], dim=-1) for k in bs[0]}  # (T, N, 2)
    adv, _ = run_gae(stacked, 0.97, 0.9)
    vs = run_vtrace(stacked, 0.97, rho_bar=1.2, c_bar=0.8).vs
    for i, b in enumerate(bs):
        torch.testing.assert_close(adv[..., i], run_gae(b, 0.97, 0.9)[0])
        torch.testing.assert_close(vs[..., i], run_vtrace(b, 0.97, rho_bar=1.2, c_bar=0.8).vs)


@pytest.mark.parametrize("estimator", ["gae", "vtrace"])
def test_truncation_bootstraps_from_final_obs_not_next_episode(estimator):
    T, N, t = 8, 2, 3
    b = make_batch(5, T, N, p_end=0.0)
    b["truncated"][t, 0] = True

    def first_steps(b: dict) -> torch.Tensor:
        b = dict(
            b,
            next_values=next_values_from(
                b["values"], b["bootstrap"], b["truncated"], b["final_values"]
            ),
        )
        if estimator == "gae":
            out = run_gae(b, 0.9, 0.95)[0]
        else:
            out = run_vtrace(b, 0.9, rho_bar=1.5, c_bar=1.5).pg_advantages
        return out[: t + 1, 0]

    base = first_steps(b)
    # The next episode's first value must not leak into the truncated episode...
    changed_next = dict(b, values=b["values"].clone())
    changed_next["values"][t + 1, 0] += 100.0
    torch.testing.assert_close(first_steps(changed_next), base, rtol=0, atol=0)
    # ...but V(final_obs) of the truncated episode must be used.
    changed_final = dict(b, final_values=b["final_values"].clone())
    changed_final["final_values"][t, 0] += 1.0
    diff = first_steps(changed_final) - base
    assert diff[t] != 0 and torch.all(diff != 0)


def test_termination_ignores_any_next_value():
    b = make_batch(6, T=8, N=2, p_end=0.0)
    b["terminated"][4, 1] = True

    def outputs(b: dict) -> list[torch.Tensor]:
        mc = discounted_returns(
            b["rewards"], b["next_values"], b["terminated"], b["truncated"], 0.9
        )
        vt = run_vtrace(b, 0.9, rho_bar=1.5, c_bar=1.5)
        return [o[:5, 1] for o in (run_gae(b, 0.9, 0.9)[0], mc, vt.vs, vt.pg_advantages)]

    base = outputs(b)
    b["next_values"] = b["next_values"].clone()
    b["next_values"][4, 1] = float("inf")  # even inf/NaN there must not leak (no 0 * inf)
    for got, want in zip(outputs(b), base, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_on_policy_vtrace_equals_monte_carlo_and_gae_lambda_one(seed):
    b = make_batch(seed, T=10, N=3)
    b["log_rhos"] = torch.zeros_like(b["log_rhos"])
    out = run_vtrace(b, 0.95, rho_bar=1.0, c_bar=1.0, lam=1.0)
    adv, ret = run_gae(b, 0.95, 1.0)
    mc = discounted_returns(b["rewards"], b["next_values"], b["terminated"], b["truncated"], 0.95)
    torch.testing.assert_close(out.vs, ret)
    torch.testing.assert_close(out.vs, mc)
    torch.testing.assert_close(out.pg_advantages, adv)


def test_on_policy_vtrace_with_lambda_equals_gae():
    # With rho = 1 and c_s = lam, Remark 1's recursion is exactly GAE's.
    b = make_batch(3, T=10, N=3)
    b["log_rhos"] = torch.zeros_like(b["log_rhos"])
    out = run_vtrace(b, 0.9, rho_bar=1.0, c_bar=1.0, lam=0.8)
    _, ret = run_gae(b, 0.9, 0.8)
    torch.testing.assert_close(out.vs, ret)


def naive_rtg(rewards: list[float], gamma: float) -> list[float]:
    """R_t = sum_{j>=t} gamma^(j-t) r_j by the definition (quadratic, no recursion)."""
    return [
        sum(gamma ** (j - t) * rewards[j] for j in range(t, len(rewards)))
        for t in range(len(rewards))
    ]


@pytest.mark.parametrize("gamma", [1.0, 0.9])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_returns_to_go_single_episode(gamma, backend):
    r = np.random.default_rng(0).normal(size=13)
    x = r if backend == "numpy" else torch.from_numpy(r)
    out = returns_to_go(x, gamma)
    assert type(out) is type(x)
    np.testing.assert_allclose(np.asarray(out), naive_rtg(r.tolist(), gamma), rtol=1e-12)


def test_returns_to_go_dtypes():
    r32 = np.full(5, 0.1, dtype=np.float32)
    assert returns_to_go(r32).dtype == np.float32
    assert returns_to_go(np.arange(4)).dtype == np.float64
    np.testing.assert_array_equal(returns_to_go(np.arange(4)), [6.0, 6.0, 5.0, 3.0])
    assert returns_to_go(torch.ones(3, dtype=torch.float32)).dtype == torch.float32
    assert returns_to_go(torch.ones(3, dtype=torch.int64)).dtype == torch.float64


@pytest.mark.parametrize("gamma", [1.0, 0.8])
def test_returns_to_go_segments_restarts_at_episode_ends(gamma):
    rng = np.random.default_rng(1)
    lengths = [4, 1, 6, 3]  # the last one is cut by the end of the data (no done)
    episodes = [rng.normal(size=n) for n in lengths]
    rewards = np.concatenate(episodes)
    dones = np.zeros(len(rewards), dtype=bool)
    dones[np.cumsum(lengths)[:-1] - 1] = True
    expected = np.concatenate([naive_rtg(e.tolist(), gamma) for e in episodes])
    np.testing.assert_allclose(returns_to_go_segments(rewards, dones, gamma), expected, rtol=1e-12)
    got_torch = returns_to_go_segments(torch.from_numpy(rewards), torch.from_numpy(dones), gamma)
    np.testing.assert_allclose(got_torch.numpy(), expected, rtol=1e-12)
    assert math.isclose(returns_to_go_segments([1, 1, 1], [False, True, False])[0], 2.0)


def test_returns_to_go_segments_rejects_bad_shapes():
    with pytest.raises(ValueError):
        returns_to_go_segments(np.zeros(3), np.zeros(4, dtype=bool))
