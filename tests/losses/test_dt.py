"""Decision Transformer action loss: equals the loss on valid positions only."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rltrans.losses.dt import dt_action_loss

B, K, A = 3, 5, 4


def padding_mask() -> torch.Tensor:
    """(B, K) validity with left padding of different lengths, as short DT windows have."""
    mask = torch.ones(B, K, dtype=torch.bool)
    mask[0, :2] = False
    mask[2, :4] = False
    return mask


def test_discrete_is_cross_entropy_over_valid_positions():
    logits = torch.randn(B, K, A, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, A, (B, K))
    mask = padding_mask()
    loss, m = dt_action_loss(logits, target, mask, "discrete")
    torch.testing.assert_close(loss, F.cross_entropy(logits[mask], target[mask]))
    acc = (logits[mask].argmax(-1) == target[mask]).double().mean()
    torch.testing.assert_close(m["accuracy"], acc)
    assert m["action"].item() == loss.item()

    # Padding may hold NaN logits and out-of-range actions: nothing changes, grads stay finite.
    wild = torch.where(mask[..., None], logits.detach(), float("nan")).requires_grad_()
    loss_w, m_w = dt_action_loss(wild, torch.where(mask, target, -100), mask, "discrete")
    assert loss_w.item() == loss.item() and m_w["accuracy"].item() == m["accuracy"].item()
    (g,) = torch.autograd.grad(loss, [logits])
    (g_w,) = torch.autograd.grad(loss_w, [wild])
    assert torch.all(g_w[~mask] == 0)
    torch.testing.assert_close(g_w, g, rtol=0, atol=0)


def test_continuous_is_mse_over_valid_positions():
    pred = torch.randn(B, K, A, dtype=torch.float64, requires_grad=True)
    target = torch.randn(B, K, A, dtype=torch.float64)
    mask = padding_mask()
    loss, m = dt_action_loss(pred, target, mask, "continuous")
    torch.testing.assert_close(loss, F.mse_loss(pred[mask], target[mask]))
    assert set(m) == {"action"}
    bad = torch.where(mask[..., None], target, float("inf"))
    loss_w, _ = dt_action_loss(pred, bad, mask.float(), "continuous")
    assert loss_w.item() == loss.item()


def test_no_mask_and_bad_kind():
    pred, target = torch.randn(B, K, A), torch.randn(B, K, A)
    loss, _ = dt_action_loss(pred, target, None, "continuous")
    torch.testing.assert_close(loss, F.mse_loss(pred, target))
    with pytest.raises(ValueError):
        dt_action_loss(pred, target, None, "gaussian")  # type: ignore[arg-type]
