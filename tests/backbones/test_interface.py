"""The interface every backbone shares: named outputs, declared capabilities, and acting
contexts that live in the acting state (built at initial_state, rebuilt by refresh_state)."""

import copy

import pytest
import torch

from rltrans.backbones.base import BackboneOutput, StepOutput
from rltrans.backbones.gtrxl import TransformerStack
from rltrans.backbones.rnn import MLPBackbone, RNNBackbone
from rltrans.backbones.universal import UniversalTransformer
from rltrans.core.block import BlockConfig
from rltrans.memory import Memory

D, H, M, N, T = 16, 2, 4, 3, 9
FLAGS = ("pure_step", "ponders", "selects_outputs")
CAPABILITIES = {  # class -> (pure_step, ponders, selects_outputs)
    TransformerStack: (True, False, True),
    UniversalTransformer: (False, True, False),
    RNNBackbone: (False, False, False),
    MLPBackbone: (True, False, False),
}
ACT_AUX = {"ponder_cost", "ponder_steps", "remainders", "halt_prob_mean", "halting_weights"}


def backbones(position: str = "xl") -> dict:
    torch.manual_seed(0)
    config = BlockConfig(dim=D, heads=H, position=position)
    return {
        "stack": TransformerStack(config, 2, memory=M),
        "universal": UniversalTransformer(config, max_steps=3, memory=M),
        "lstm": RNNBackbone(D, 2, cell="lstm"),
        "gru": RNNBackbone(D, 1, cell="gru"),
        "mlp": MLPBackbone(D, 2),
    }


@pytest.mark.parametrize("cls", list(CAPABILITIES))
def test_every_backbone_class_declares_its_capabilities(cls):
    """Declared by the class itself (never inherited by accident, never probed)."""
    assert all(isinstance(cls.__dict__[flag], bool) for flag in FLAGS)
    assert tuple(cls.__dict__[flag] for flag in FLAGS) == CAPABILITIES[cls]
    assert callable(getattr(cls, "step_outputs", None)) == cls.pure_step


@pytest.mark.parametrize("name", ["stack", "universal", "lstm", "gru", "mlp"])
def test_every_backbone_returns_the_named_outputs(name):
    backbone = backbones()[name].eval()
    x = torch.randn(N, T, D)
    memory = backbone.empty_memory(N)
    out = backbone(x, memory, starts=torch.rand(N, T) < 0.2)
    assert type(out) is BackboneOutput and out._fields == ("hidden", "memory", "aux")
    assert out.hidden.shape == (N, T, D) and isinstance(out.aux, dict)
    assert type(out.memory) is type(memory)
    if isinstance(memory, Memory):
        assert out.memory.hidden.shape == memory.hidden.shape
    assert set(out.aux) == (ACT_AUX if backbone.ponders else set())
    for key, value in out.aux.items():
        assert value.shape == ((3, N, T) if key == "halting_weights" else (N, T))

    state = backbone.initial_state(N)
    step = backbone.step(x[:, 0], state, torch.ones(N, dtype=torch.bool))
    assert type(step) is StepOutput and step._fields == ("hidden", "state", "aux")
    assert step.hidden.shape == (N, D) and type(step.state) is type(state)
    assert set(step.aux) == (ACT_AUX if backbone.ponders else set())
    # the first step of an episode equals the forward of a one-step segment
    alone = backbone(x[:, :1], backbone.empty_memory(N)).hidden[:, 0]
    torch.testing.assert_close(step.hidden, alone, rtol=1e-5, atol=1e-5)


def act(backbone, x, state, start: int, stop: int) -> tuple[torch.Tensor, object]:
    """Outputs (N, stop - start, D) of acting steps start..stop-1, and the state after."""
    outs = []
    for t in range(start, stop):
        done = torch.full((N,), t == 0, dtype=torch.bool)
        h, state, _ = backbone.step(x[:, t], state, done)
        outs.append(h)
    return torch.stack(outs, 1), state


def perturb_(module: torch.nn.Module, only: str | None = None) -> None:
    """An in-place update of the weights (``only``: the parameters whose name contains it)."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if only is None or only in name:
                p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))


@pytest.mark.parametrize(
    ("name", "position", "only"),
    [
        ("stack", "xl", "r_proj"),  # W_kR alone: only the per-step context goes stale
        ("stack", "xl", None),  # every weight: keys and contexts go stale
        ("universal", "xl", "r_proj"),
        ("stack", "rotary", None),
    ],
)
def test_refreshed_contexts_follow_an_in_place_weight_change(name, position, only):
    """After an in-place update, acting from a refreshed state equals the learner's
    recomputation (forward over the segment from the stored window, new weights); acting
    from the same state without the refresh does not (so this test can fail)."""
    backbone = backbones(position)[name].double().eval()
    for pname, p in backbone.named_parameters():  # non-trivial relative terms
        if pname.endswith((".u", ".v")):
            torch.nn.init.normal_(p, std=0.5)
    x = torch.randn(N, T, D, dtype=torch.float64)
    _, state = act(backbone, x, backbone.initial_state(N, dtype=x.dtype), 0, 5)
    memory = backbone.state_to_memory(state)  # what the rollout buffer stores
    stale = copy.deepcopy(state)
    perturb_(backbone, only)

    acted, _ = act(backbone, x, backbone.refresh_state(state), 5, T)
    replayed = backbone(x[:, 5:], memory).hidden
    torch.testing.assert_close(acted, replayed)
    without_refresh, _ = act(backbone, x, stale, 5, T)
    assert (without_refresh - replayed).abs().max() > 1e-3


def test_contexts_are_built_with_the_state_from_the_weights_of_that_moment():
    stack = backbones()["stack"]
    state = stack.initial_state(N)
    assert len(state.contexts) == 2 and state.contexts[0].shape == (H, M + 1, D // H)
    want = stack.blocks[1].attn.scheme.step_context(M, torch.device("cpu"), torch.float32)
    torch.testing.assert_close(state.contexts[1], want)
    assert not state.contexts[0].requires_grad  # built without autograd
    perturb_(stack, "r_proj")
    assert not torch.allclose(stack.refresh_state(state).contexts[1], want)
    with pytest.raises(ValueError, match="lacks step contexts"):
        stack.step(torch.randn(N, D), state._replace(contexts=()))
