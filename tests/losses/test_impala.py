"""IMPALA loss: a hand-computed example, stop-gradient targets and padding masks."""

from __future__ import annotations

import math

import pytest
import torch

from rltrans.losses.impala import impala_loss
from rltrans.returns import next_values_from, vtrace

D = torch.float64
NAMES = (
    "target_log_prob",
    "behaviour_log_prob",
    "entropy",
    "values",
    "next_values",
    "rewards",
    "terminated",
    "truncated",
)


def t(*v: float) -> torch.Tensor:
    """A float64 (T, N=1) column."""
    return torch.tensor(v, dtype=D).unsqueeze(1)


def hand_example() -> tuple[torch.Tensor, ...]:
    """Inputs of the hand-computed example (T = 2, one env, no episode end)."""
    return (
        t(math.log(0.5), math.log(0.8)),
        t(math.log(0.25), 0.0),
        t(0.3, 0.7),
        t(1.0, 2.0),
        t(2.0, 3.0),
        t(1.0, -1.0),
        torch.zeros(2, 1, dtype=torch.bool),
        torch.zeros(2, 1, dtype=torch.bool),
    )


def test_hand_computed_example():
    # T = 2, one env, no episode end, gamma 0.5, rho_bar = c_bar = 1.
    # rho = (0.5/0.25, 0.8/1.0) = (2, 0.8) -> clipped rho = (1, 0.8), c = (1, 0.8).
    # delta_1 = 0.8 (-1 + 0.5 * 3 - 2) = -1.2 -> v_1 = 2 - 1.2 = 0.8
    # delta_0 = 1 (1 + 0.5 * 2 - 1) = 1      -> v_0 = 1 + 1 + 0.5 * 1 * (-1.2) = 1.4
    # pg_0 = 1 (1 + 0.5 * v_1 - 1) = 0.4;  pg_1 = 0.8 (-1 + 0.5 * 3 - 2) = -1.2
    loss, m = impala_loss(
        *hand_example(),
        gamma=0.5,
        rho_bar=1.0,
        c_bar=1.0,
        vf_coef=0.25,
        ent_coef=0.1,
    )
    policy = -(0.4 * math.log(0.5) - 1.2 * math.log(0.8)) / 2
    value = 0.5 * ((1.4 - 1.0) ** 2 + (0.8 - 2.0) ** 2) / 2
    assert m["policy"].item() == pytest.approx(policy, abs=1e-12)
    assert m["value"].item() == pytest.approx(value, abs=1e-12)
    assert m["entropy"].item() == pytest.approx(0.5, abs=1e-12)
    assert loss.item() == pytest.approx(policy + 0.25 * value - 0.1 * 0.5, abs=1e-12)
    assert m["rho_mean"].item() == pytest.approx(1.4, abs=1e-12)
    assert m["rho_clipfrac"].item() == 0.5


def random_batch(seed: int, T: int = 7, N: int = 3) -> dict[str, torch.Tensor]:
    """Random time-major batch with in-batch episode ends; learner outputs require grad."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(T, N, generator=g)
    values = torch.randn(T, N, generator=g, dtype=D).requires_grad_()
    truncated = u < 0.1
    final_values = torch.randn(T, N, generator=g, dtype=D)
    return {
        "target_log_prob": (-torch.rand(T, N, generator=g, dtype=D)).requires_grad_(),
        "behaviour_log_prob": (-torch.rand(T, N, generator=g, dtype=D)).requires_grad_(),
        "entropy": torch.rand(T, N, generator=g, dtype=D).requires_grad_(),
        "values": values,
        # Built from the learner's own values, as a caller would: must still act as a constant.
        "next_values": next_values_from(values, values[-1] * 0.5, truncated, final_values),
        "rewards": torch.randn(T, N, generator=g, dtype=D).requires_grad_(),
        "terminated": (u >= 0.1) & (u < 0.2),
        "truncated": truncated,
    }


KW = {"gamma": 0.9, "rho_bar": 1.0, "c_bar": 0.9, "vf_coef": 0.5, "ent_coef": 0.01}


def test_normalized_advantages_are_the_standardised_pg_advantages():
    """normalize_advantages: the policy term uses (A - mean A) / max(std A, min_advantage_std)
    (unbiased std), the value and entropy terms are unchanged."""
    # pg advantages of the hand-computed example: (0.4, -1.2): mean -0.4, unbiased std
    # sqrt(0.64 + 0.64) = 0.8 sqrt(2); standardised: (1, -1) / sqrt(2).
    args = hand_example()
    kw = {"gamma": 0.5, "vf_coef": 0.25, "ent_coef": 0.1}
    _, plain = impala_loss(*args, **kw)
    _, normed = impala_loss(*args, **kw, normalize_advantages=True)
    a = torch.tensor([1.0, -1.0], dtype=D) / math.sqrt(2)
    policy = -(a[0] * math.log(0.5) + a[1] * math.log(0.8)) / 2
    assert normed["policy"].item() == pytest.approx(policy.item(), abs=1e-6)
    assert normed["value"].item() == pytest.approx(plain["value"].item(), abs=1e-12)
    assert normed["entropy"].item() == pytest.approx(plain["entropy"].item(), abs=1e-12)
    # min_advantage_std above the batch's std (0.8 sqrt 2): centred, divided by the floor.
    _, floored = impala_loss(*args, **kw, normalize_advantages=True, min_advantage_std=4.0)
    a = torch.tensor([0.8, -0.8], dtype=D) / 4.0
    policy = -(a[0] * math.log(0.5) + a[1] * math.log(0.8)) / 2
    assert floored["policy"].item() == pytest.approx(policy.item(), abs=1e-6)
    # ... and below it: plain standardising.
    _, below = impala_loss(*args, **kw, normalize_advantages=True, min_advantage_std=0.5)
    assert below["policy"].item() == pytest.approx(normed["policy"].item(), abs=1e-12)


def test_clipped_surrogate_by_hand():
    """clip_coef: the policy term is PPO's clipped surrogate over r = pi/mu with the unweighted
    advantages q_s - V(x_s); a step whose ratio left the clip range in the advantage's
    direction gets no gradient; the value and entropy terms are unchanged."""
    # rho = (2, 0.8); q - V = (1 + 0.5 * 0.8 - 1, -1 + 0.5 * 3 - 2) = (0.4, -1.5).
    # clip 0.3: step 0 max(-0.4 * 2, -0.4 * 1.3) = -0.52 (clipped: no gradient),
    # step 1 max(1.5 * 0.8, 1.5 * 0.8) = 1.2 (inside the range): d/dlog pi_1 = 1.5 * 0.8 / 2.
    args = list(hand_example())
    args[0] = args[0].clone().requires_grad_()
    kw = {"gamma": 0.5, "vf_coef": 0.25, "ent_coef": 0.1}
    _, plain = impala_loss(*args, **kw)
    loss, m = impala_loss(*args, **kw, clip_coef=0.3)
    assert m["policy"].item() == pytest.approx((-0.52 + 1.2) / 2, abs=1e-12)
    assert m["value"].item() == pytest.approx(plain["value"].item(), abs=1e-12)
    assert m["entropy"].item() == pytest.approx(plain["entropy"].item(), abs=1e-12)
    assert m["clipfrac"].item() == 0.5
    (grad,) = torch.autograd.grad(loss, args[0])
    torch.testing.assert_close(grad[:, 0], torch.tensor([0.0, 0.6], dtype=D), rtol=0, atol=1e-12)


def test_clipped_surrogate_at_ratio_one_has_the_papers_gradient():
    """With the behaviour log-probs equal to the target's (r = 1: lag 0, first step), the
    clipped surrogate's policy gradient is the paper's, normalized or not."""
    for normalize in (False, True):
        batch = random_batch(3)
        batch["behaviour_log_prob"] = batch["target_log_prob"].detach().clone()
        kw = {**KW, "vf_coef": 0.0, "ent_coef": 0.0, "normalize_advantages": normalize}
        paper, _ = impala_loss(**batch, **kw)
        clipped, m = impala_loss(**batch, **kw, clip_coef=0.2)
        (g_paper,) = torch.autograd.grad(paper, batch["target_log_prob"])
        (g_clipped,) = torch.autograd.grad(clipped, batch["target_log_prob"])
        torch.testing.assert_close(g_clipped, g_paper, rtol=1e-12, atol=1e-14)
        assert m["clipfrac"].item() == 0.0


def test_targets_are_stop_gradient():
    b = random_batch(0)
    n = b["values"].numel()
    loss, _ = impala_loss(*(b[k] for k in NAMES[:6]), b["terminated"], b["truncated"], **KW)
    g_lp, g_beh, g_v, g_r = torch.autograd.grad(
        loss,
        [b["target_log_prob"], b["behaviour_log_prob"], b["values"], b["rewards"]],
        allow_unused=True,
    )
    with torch.no_grad():
        targets = vtrace(
            b["target_log_prob"] - b["behaviour_log_prob"],
            b["rewards"],
            b["values"],
            b["next_values"],
            b["terminated"],
            b["truncated"],
            0.9,
            rho_bar=1.0,
            c_bar=0.9,
        )
    # log pi gets only -(rho A) / n: no gradient through the importance weights.
    torch.testing.assert_close(g_lp, -targets.pg_advantages / n)
    # V gets only vf_coef * (V - v_s) / n: nothing flows through v_s or next_values.
    torch.testing.assert_close(g_v, 0.5 * (b["values"].detach() - targets.vs) / n)
    assert g_beh is None and g_r is None


def test_padding_after_episode_end_is_ignored():
    b = random_batch(1, T=8, N=2)
    b["terminated"][3, 1], b["truncated"][3, 1] = True, False
    mask = torch.ones(8, 2, dtype=torch.bool)
    mask[4:, 1] = False  # env 1 is padding after its episode ended at step 3
    inputs = [b[k] for k in NAMES]
    loss, m = impala_loss(*inputs, **KW, mask=mask)
    grads = torch.autograd.grad(loss, [b["target_log_prob"], b["values"]])

    junk = {"target_log_prob": 1e30, "behaviour_log_prob": -1e30, "entropy": float("nan")}
    junk |= {"values": float("inf"), "rewards": float("nan"), "next_values": 1e30}
    wild = {}
    for k, v in b.items():
        if k in junk:
            v = torch.where(mask, v.detach(), torch.full_like(v, junk[k])).requires_grad_()
        wild[k] = v
    loss_w, m_w = impala_loss(*(wild[k] for k in NAMES), **KW, mask=mask)
    grads_w = torch.autograd.grad(loss_w, [wild["target_log_prob"], wild["values"]])
    assert loss_w.item() == loss.item()
    assert all(m_w[k].item() == m[k].item() for k in m)
    for g, gw in zip(grads, grads_w, strict=True):
        assert torch.all(gw[~mask] == 0)
        torch.testing.assert_close(gw[mask], g[mask], rtol=0, atol=0)
    # The valid part of env 1 is a complete episode: same as running env 1 alone on steps 0..3.
    alone = {k: v.detach()[:4, 1:] for k, v in b.items()}
    loss_1, _ = impala_loss(*(alone[k] for k in NAMES), **KW)
    loss_0, _ = impala_loss(*(v.detach()[:, :1] for v in inputs), **KW)
    torch.testing.assert_close(loss, (8 * loss_0 + 4 * loss_1) / 12)
