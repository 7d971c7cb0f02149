"""The learner trains the model's own parameters as torch's AdamW does, and an optimizer state
an earlier release saved for one flat parameter (its CPU runs' layout) resumes per parameter
to the very weights the unconverted state reaches."""

import copy

import pytest
import torch
from torch import nn

from rltrans.learners import Learner, OptimizerConfig
from rltrans.learners.flat_state import is_flat_state, per_parameter_state


def small_net() -> nn.Module:
    torch.manual_seed(0)
    lstm = nn.LSTM(5, 7, batch_first=True)  # shapes that do not fill 16-element slots
    return nn.ModuleDict({"lstm": lstm, "head": nn.Linear(7, 3)})


def loss_of(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    y, _ = net["lstm"](x)
    return net["head"](y).square().mean()


def learner(net: nn.Module) -> Learner:
    optim = OptimizerConfig(lr=1e-2, max_grad_norm=0.1, weight_decay=0.1)
    return Learner(net, optim, total_updates=10)


def as_saved_flat(state: dict) -> dict:
    """``state`` (per parameter) as the earlier releases saved it on CPU, written out by hand:
    one parameter whose moments hold every parameter's values at 16-element-aligned starts,
    zeros between, and one shared step count."""
    per = state["state"]
    moments = {}
    for key in per[0]:
        if per[0][key].dim() == 0:
            moments[key] = per[0][key].clone()
            continue
        pieces = []
        for i in sorted(per):
            values = per[i][key].reshape(-1)
            pad = -values.numel() % 16
            pieces += [values, values.new_zeros(pad)]
        moments[key] = torch.cat(pieces)
    group = {**state["param_groups"][0], "params": [0]}
    return {"state": {0: moments}, "param_groups": [group]}


def test_a_step_is_torchs_clipped_adamw():
    net, ref = small_net(), small_net()
    trained = learner(net)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, eps=1e-5, weight_decay=0.1, foreach=False)
    x = torch.randn(4, 6, 5)
    for _ in range(3):
        norm = trained.step(loss_of(net, x))
        opt.zero_grad()
        loss_of(ref, x).backward()
        torch.testing.assert_close(norm, nn.utils.clip_grad_norm_(ref.parameters(), 0.1))
        opt.step()
    for (name, a), b in zip(net.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_a_flat_saved_state_resumes_to_the_same_weights():
    x = torch.randn(4, 6, 5)
    net = small_net()
    saver = learner(net)
    for _ in range(2):
        saver.step(loss_of(net, x))
    saved = saver.state_dict()
    old = {**saved, "optimizer": as_saved_flat(saved["optimizer"])}
    shapes = [p.shape for p in net.parameters()]
    assert is_flat_state(old["optimizer"], shapes)
    assert not is_flat_state(saved["optimizer"], shapes)
    twins = [copy.deepcopy(net), copy.deepcopy(net)]
    loaders = [learner(twin) for twin in twins]
    loaders[0].load_state_dict(copy.deepcopy(saved))
    loaders[1].load_state_dict(old)
    for _ in range(2):
        saver.step(loss_of(net, x))
        for twin, loader in zip(twins, loaders, strict=True):
            loader.step(loss_of(twin, x))
    for a, b, c in zip(net.parameters(), *(t.parameters() for t in twins), strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_a_per_parameter_state_is_left_as_it_is():
    net = small_net()
    trained = learner(net)
    trained.step(loss_of(net, torch.randn(2, 3, 5)))
    state = trained.state_dict()["optimizer"]
    assert per_parameter_state(state, [p.shape for p in net.parameters()]) is state


def test_another_models_flat_state_is_refused_naming_the_shapes():
    """A flat state of another size is no state of this model: refused, naming both shapes."""
    net = small_net()
    trained = learner(net)
    trained.step(loss_of(net, torch.randn(2, 3, 5)))
    state = trained.state_dict()
    flat = as_saved_flat(state["optimizer"])
    flat["state"][0] = {k: v[:-16] if v.dim() else v for k, v in flat["state"][0].items()}
    wrong = r"optimizer.state\[0\].exp_avg has shape \(448,\), its parameter \(28, 5\)"
    with pytest.raises(ValueError, match=wrong):
        learner(copy.deepcopy(net)).load_state_dict({**state, "optimizer": flat})


def test_a_0d_moment_of_a_parameter_is_refused():
    """Only the step count is a scalar: a 0-d moment for a tensor parameter would send a fused
    step outside its storage, so it is refused, naming the entry."""
    net = small_net()
    trained = learner(net)
    trained.step(loss_of(net, torch.randn(2, 3, 5)))
    state = trained.state_dict()
    state["optimizer"]["state"][0]["exp_avg"] = torch.tensor(0.5)
    with pytest.raises(ValueError, match=r"state\[0\]\.exp_avg has shape \(\), its parameter"):
        learner(copy.deepcopy(net)).load_state_dict(state)
