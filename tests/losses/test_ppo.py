"""PPO loss: exact identities, a hand-computed example, masking and gradient isolation."""

from __future__ import annotations

import math

import pytest
import torch

from rltrans.losses.ppo import masked_mean, ppo_loss, standardize

D = torch.float64
COEFS = {"clip_coef": 0.2, "vf_clip_coef": 0.5, "ent_coef": 0.01, "vf_coef": 0.5}
NAMES = (
    "new_log_prob",
    "old_log_prob",
    "advantages",
    "new_values",
    "old_values",
    "returns",
    "entropy",
)


def random_inputs(seed: int, shape=(6, 5), dtype=D) -> dict[str, torch.Tensor]:
    """Random PPO inputs of one shape; new log-probs near the old ones, as after a few epochs."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(shape, generator=g, dtype=dtype) * 2
    old_v = torch.randn(shape, generator=g, dtype=dtype)
    return {
        "new_log_prob": (old + 0.3 * torch.randn(shape, generator=g, dtype=dtype)).requires_grad_(),
        "old_log_prob": old.requires_grad_(),
        "advantages": (torch.randn(shape, generator=g, dtype=dtype) * 3 + 1).requires_grad_(),
        "new_values": (old_v + torch.randn(shape, generator=g, dtype=dtype)).requires_grad_(),
        "old_values": old_v.requires_grad_(),
        "returns": torch.randn(shape, generator=g, dtype=dtype).requires_grad_(),
        "entropy": torch.rand(shape, generator=g, dtype=dtype).requires_grad_(),
    }


def call(x: dict, normalize_advantages: bool = True, **kw):
    """ppo_loss on an inputs dict with default coefficients overridable by kw, the advantages
    standardised over the valid entries first (as the learner does) unless told not to."""
    if normalize_advantages:
        x = dict(x, advantages=standardize(x["advantages"], kw.get("mask")))
    return ppo_loss(*(x[k] for k in NAMES), **{**COEFS, **kw})


def test_identical_policies_give_ratio_one_and_zero_kl_exactly():
    x = random_inputs(0, dtype=torch.float32)
    x["new_log_prob"] = x["old_log_prob"].detach().clone().requires_grad_()
    _, m = call(x)
    assert m["ratio_mean"].item() == 1.0
    assert m["approx_kl"].item() == 0.0
    assert m["clipfrac"].item() == 0.0
    assert set(m) == {"policy", "value", "entropy", "approx_kl", "clipfrac", "ratio_mean"}


def t(*v: float) -> torch.Tensor:
    """A float64 vector."""
    return torch.tensor(v, dtype=D)


def test_hand_computed_example():
    # ratios 1.5, 0.5, 0.5, 1.5 with advantages +1, +1, -1, -1 and clip 0.2:
    # min(r A, clip(r) A) = 1.2, 0.5, -0.8, -1.5 -> policy loss = -mean = 0.15.
    ratios = t(1.5, 0.5, 0.5, 1.5)
    old_lp = t(-1.0, -2.0, -0.5, -0.1)
    # value clip 0.5 around old 0: (1 vs 2) -> max(1, 2.25); (1 vs 0.9) -> max(0.01, 0.16);
    # (0.1 vs 1) -> 0.81 (inside the clip range); (-3 vs -3) -> max(0, 6.25).
    new_v, ret = t(1.0, 1.0, 0.1, -3.0), t(2.0, 0.9, 1.0, -3.0)
    loss, m = ppo_loss(
        old_lp + ratios.log(), old_lp, t(1.0, 1.0, -1.0, -1.0), new_v, torch.zeros(4, dtype=D),
        ret, t(0.5, 1.0, 1.5, 2.0), clip_coef=0.2, vf_clip_coef=0.5, ent_coef=0.1, vf_coef=2.0,
        mask=None,
    )  # fmt: skip
    policy = 0.15
    value = 0.5 * (2.25 + 0.16 + 0.81 + 6.25) / 4
    entropy = 1.25
    assert m["policy"].item() == pytest.approx(policy, abs=1e-12)
    assert m["value"].item() == pytest.approx(value, abs=1e-12)
    assert m["entropy"].item() == pytest.approx(entropy, abs=1e-12)
    assert loss.item() == pytest.approx(policy + 2.0 * value - 0.1 * entropy, abs=1e-12)
    assert m["clipfrac"].item() == 1.0
    assert m["ratio_mean"].item() == pytest.approx(1.0, abs=1e-12)
    kl = [(r - 1) - math.log(r) for r in (1.5, 0.5, 0.5, 1.5)]
    assert m["approx_kl"].item() == pytest.approx(sum(kl) / 4, abs=1e-12)
    # Without value clipping it is the plain 0.5 * squared error.
    _, m2 = ppo_loss(
        old_lp, old_lp, t(1, 1, 1, 1), new_v, torch.zeros(4, dtype=D), ret, t(0, 0, 0, 0),
        clip_coef=0.2, vf_clip_coef=None, ent_coef=0.0, vf_coef=1.0,
    )  # fmt: skip
    assert m2["value"].item() == pytest.approx(0.5 * (1 + 0.01 + 0.81 + 0) / 4, abs=1e-12)


def wild(x: dict, mask: torch.Tensor) -> dict:
    """Copy of x whose masked-out entries hold inf, NaN and huge values."""
    out = {}
    for i, (k, v) in enumerate(x.items()):
        junk = [float("nan"), float("inf"), -1e30, 1e30][i % 4]
        out[k] = torch.where(mask, v.detach(), torch.full_like(v, junk)).requires_grad_()
    return out


@pytest.mark.parametrize("vf_clip_coef", [None, 0.3])
@pytest.mark.parametrize("normalize", [True, False])
def test_masked_entries_do_not_affect_anything(vf_clip_coef, normalize):
    x = random_inputs(1)
    mask = torch.rand(x["advantages"].shape) < 0.6
    mask[0, 0] = True
    kw = {"vf_clip_coef": vf_clip_coef, "normalize_advantages": normalize, "mask": mask}
    loss, m = call(x, **kw)
    y = wild(x, mask)
    loss_w, m_w = call(y, **kw)
    assert loss_w.item() == loss.item()
    assert all(m_w[k].item() == m[k].item() for k in m)
    grads = torch.autograd.grad(loss, [x[k] for k in NAMES], allow_unused=True)
    grads_w = torch.autograd.grad(loss_w, [y[k] for k in NAMES], allow_unused=True)
    for g, gw in zip(grads, grads_w, strict=True):
        assert (g is None) == (gw is None)
        if g is not None:
            assert torch.all(gw[~mask] == 0)  # finite zeros, no NaN from the junk
            torch.testing.assert_close(gw, torch.where(mask, g, 0.0), rtol=0, atol=0)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_mask_equals_running_on_the_valid_subset(mask_dtype):
    # Also checks that advantage normalisation uses statistics of the valid entries only.
    x = random_inputs(2)
    mask = torch.rand(x["advantages"].shape) < 0.5
    loss, m = call(x, mask=mask.to(mask_dtype))
    sub = {k: v[mask] for k, v in x.items()}
    loss_s, m_s = call(sub)
    torch.testing.assert_close(loss, loss_s)
    for k in m:
        torch.testing.assert_close(m[k], m_s[k])


def test_advantage_normalisation_matches_naive_standardisation():
    x = random_inputs(3)
    mask = torch.rand(x["advantages"].shape) < 0.7
    valid = x["advantages"].detach()[mask]
    mean = sum(valid.tolist()) / len(valid)
    std = math.sqrt(sum((a - mean) ** 2 for a in valid.tolist()) / (len(valid) - 1))
    y = dict(x, advantages=(x["advantages"].detach() - mean) / (std + 1e-8))
    loss, _ = call(x, mask=mask, normalize_advantages=True)
    loss_pre, _ = call(y, mask=mask, normalize_advantages=False)
    torch.testing.assert_close(loss, loss_pre, rtol=1e-12, atol=1e-12)
    # Normalisation really changes the loss here (advantages have mean ~1, std ~3).
    loss_raw, _ = call(x, mask=mask, normalize_advantages=False)
    assert not torch.isclose(loss, loss_raw)


def test_gradients_reach_only_the_intended_inputs():
    x = random_inputs(4)
    n = x["advantages"].numel()

    def grad(name: str, **kw) -> torch.Tensor | None:
        loss, _ = call(x, **kw)
        (g,) = torch.autograd.grad(loss, [x[name]], allow_unused=True)
        return g

    # Targets and old quantities are constants.
    for name in ("old_log_prob", "advantages", "old_values", "returns"):
        assert grad(name) is None
    # The value and entropy terms do not touch the policy gradient, and vice versa.
    torch.testing.assert_close(
        grad("new_log_prob", vf_coef=0.0, ent_coef=0.0), grad("new_log_prob")
    )
    torch.testing.assert_close(grad("new_values", ent_coef=0.0, clip_coef=0.9), grad("new_values"))
    # d loss / d entropy = -ent_coef / n and d loss / d V = vf_coef * (V - R) / n unclipped.
    torch.testing.assert_close(grad("entropy"), torch.full_like(x["entropy"], -0.01 / n))
    expected = 0.5 * (x["new_values"] - x["returns"]).detach() / n
    torch.testing.assert_close(grad("new_values", vf_clip_coef=None), expected)


def test_masked_mean():
    x = torch.tensor([1.0, 2.0, 6.0])
    assert masked_mean(x, torch.tensor([True, False, True])).item() == 3.5
    assert masked_mean(x, torch.zeros(3, dtype=torch.bool)).item() == 0.0
    assert masked_mean(x, None).item() == 3.0
