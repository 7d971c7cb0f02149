"""Flat parameters (rltrans.accel.flat): the learner trains exactly as per-tensor AdamW would,
parameters stay views of the flat buffer, and optimizer states convert both ways."""

import copy

import pytest
import torch
from torch import nn

from rltrans.accel import Accel
from rltrans.accel.flat import (
    FlatLayout,
    FlatParameters,
    PerTensor,
    to_flat_state,
    to_per_parameter_state,
)
from rltrans.learners import Learner, OptimizerConfig


def small_net() -> nn.Module:
    torch.manual_seed(0)
    lstm = nn.LSTM(5, 7, batch_first=True)  # shapes that do not fill 16-element slots
    return nn.ModuleDict({"lstm": lstm, "head": nn.Linear(7, 3)})


def loss_of(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    y, _ = net["lstm"](x)
    return net["head"](y).square().mean()


class PerTensorAccel(Accel):
    """Keeps the tensors apart (as on CUDA)."""

    trainable = staticmethod(PerTensor)


def learner(net: nn.Module, accel: Accel | None = None) -> Learner:
    optim = OptimizerConfig(lr=1e-2, max_grad_norm=0.1, weight_decay=0.1)
    return Learner(net, optim, total_updates=10, accel=accel)


def per_tensor_learner(net: nn.Module, monkeypatch=None) -> Learner:
    """A learner that keeps the tensors apart (as on CUDA)."""
    return learner(net, PerTensorAccel())


def test_flat_training_equals_per_tensor_adamw_with_clipping():
    """Three clipped AdamW steps through the flat buffer == torch's per-tensor AdamW."""
    net, ref = small_net(), small_net()
    flat = learner(net)
    assert isinstance(flat.params, FlatParameters) and len(flat.params.tensors) == 1
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, eps=1e-5, weight_decay=0.1, foreach=False)
    x = torch.randn(4, 6, 5)
    for _ in range(3):
        norm = flat.step(loss_of(net, x))
        opt.zero_grad()
        loss_of(ref, x).backward()
        torch.testing.assert_close(norm, nn.utils.clip_grad_norm_(ref.parameters(), 0.1))
        opt.step()
    for (name, a), b in zip(net.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_parameters_are_views_and_see_every_update():
    """Each parameter aliases the flat buffer, starts 64-byte aligned, and an optimizer step
    on the flat parameter changes every parameter's values in place."""
    net = small_net()
    x = torch.randn(2, 3, 5)
    before = loss_of(net, x)
    flat = learner(net)
    torch.testing.assert_close(loss_of(net, x), before)  # the same function after flattening
    base = flat.params.param.data_ptr()
    for p in net.parameters():
        assert base <= p.data_ptr() < base + flat.params.param.numel() * 4
        assert (p.data_ptr() - base) % 64 == 0
    before_step = [(p, p.detach().clone()) for p in net.parameters()]
    flat.step(loss_of(net, x))
    assert all(not torch.equal(p, old) for p, old in before_step)  # seen through the views


def test_gradients_reset_by_the_user_are_relinked():
    """model.zero_grad() (which sets .grad to None) does not silently stop training."""
    net = small_net()
    flat = learner(net)
    x = torch.randn(2, 3, 5)
    net.zero_grad()
    weight = net["head"].weight.detach().clone()
    flat.step(loss_of(net, x))
    assert not torch.equal(net["head"].weight, weight)
    assert net["head"].weight.grad.data_ptr() >= flat.params.param.grad.data_ptr()


def test_moving_the_model_after_building_the_learner_is_refused():
    net = small_net()
    flat = learner(net)
    net.double()
    with pytest.raises(RuntimeError, match="no longer lives in the learner's flat buffer"):
        flat.step(loss_of(net, torch.randn(2, 3, 5, dtype=torch.float64)))


def test_frozen_or_mixed_parameters_stay_per_tensor():
    net = small_net()
    net["head"].bias.requires_grad_(False)
    assert isinstance(learner(net).params, PerTensor)
    with pytest.raises(ValueError, match="one dtype and device"):
        FlatParameters(nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2).double()]))


@pytest.mark.parametrize("direction", ["per-tensor -> flat", "flat -> per-tensor"])
def test_optimizer_state_converts_between_layouts(direction, monkeypatch):
    """A checkpoint's optimizer state from one layout resumes in the other (e.g. saved on
    CUDA, resumed on CPU): the next steps match an uninterrupted run."""
    x = torch.randn(4, 6, 5)
    make_saver, make_loader = learner, lambda net: per_tensor_learner(net, monkeypatch)
    if direction == "per-tensor -> flat":
        make_saver, make_loader = make_loader, make_saver
    net = small_net()
    saver = make_saver(net)
    for _ in range(2):
        saver.step(loss_of(net, x))
    twin = copy.deepcopy(net)
    loader = make_loader(twin)
    loader.load_state_dict(saver.state_dict())
    for _ in range(2):
        saver.step(loss_of(net, x))
        loader.step(loss_of(twin, x))
    for a, b in zip(net.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_state_conversion_round_trips():
    net = small_net()
    shapes = [p.shape for p in net.parameters()]
    layout = FlatLayout.of(shapes)
    state = {
        "state": {
            i: {"step": torch.tensor(3.0), "exp_avg": torch.randn(s), "exp_avg_sq": torch.rand(s)}
            for i, s in enumerate(shapes)
        },
        "param_groups": [{"lr": 0.1, "params": list(range(len(shapes)))}],
    }
    flat = to_flat_state(state, layout)
    assert flat["state"][0]["exp_avg"].shape == (layout.size,)
    back = to_per_parameter_state(flat, layout)
    assert back["param_groups"] == state["param_groups"]
    for i in state["state"]:
        for k, v in state["state"][i].items():
            torch.testing.assert_close(back["state"][i][k], v)
