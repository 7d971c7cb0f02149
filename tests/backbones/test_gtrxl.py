"""TransformerStack invariants: causality, segment recurrence, cached acting, episode isolation."""

import itertools

import pytest
import torch

from rltrans.backbones.gtrxl import PRESETS, TransformerStack, preset_config
from rltrans.core.block import BlockConfig
from rltrans.core.gates import GATES
from rltrans.core.position import POSITIONS
from rltrans.memory import Memory

D, Y, H, M = 16, 2, 4, 6
T = 14

# Every position scheme with the GTrXL gate, and every gate with the xl scheme.
COMBOS = sorted({(p, "gru") for p in POSITIONS} | {("xl", g) for g in GATES})


def make(position="xl", gate="gru", norm="pre", memory=M, **kw):
    torch.manual_seed(1)
    config = BlockConfig(dim=D, heads=H, position=position, gate=gate, norm=norm, **kw)
    stack = TransformerStack(config, Y, memory=memory)
    for name, p in stack.named_parameters():  # make the relative terms non-trivial
        if name.endswith((".u", ".v")):
            torch.nn.init.normal_(p, std=0.5)
    return stack.double().eval()


def seq(batch=3, length=T):
    return torch.randn(batch, length, D, dtype=torch.float64)


def run_chunks(stack, x, chunk, starts=None, memory=None):
    memory = memory if memory is not None else stack.empty_memory(x.shape[0], dtype=x.dtype)
    outs = []
    for c in range(0, x.shape[1], chunk):
        s = None if starts is None else starts[:, c : c + chunk]
        y, memory, _ = stack(x[:, c : c + chunk], memory, starts=s)
        outs.append(y)
    return torch.cat(outs, 1), memory


def run_steps(stack, x, starts=None):
    state = stack.initial_state(x.shape[0], dtype=x.dtype)
    outs = []
    for t in range(x.shape[1]):
        done = None if starts is None else starts[:, t]
        y, state, _ = stack.step(x[:, t], state, done)
        outs.append(y)
    return torch.stack(outs, 1), state


@pytest.mark.parametrize(("position", "gate"), COMBOS)
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_causality(position, gate, norm):
    stack = make(position, gate, norm)
    x = seq()
    y = stack(x, stack.empty_memory(3, dtype=x.dtype)).hidden
    x2 = x.clone()
    x2[:, 9:] += torch.randn_like(x2[:, 9:])
    y2 = stack(x2, stack.empty_memory(3, dtype=x.dtype)).hidden
    torch.testing.assert_close(y[:, :9], y2[:, :9])
    assert not torch.allclose(y[:, 9:], y2[:, 9:])


@pytest.mark.parametrize(("position", "gate"), COMBOS)
@pytest.mark.parametrize("chunk", [1, 4, 5])
def test_chunked_with_memory_equals_whole_with_window(position, gate, chunk):
    """Chunks of any length with memory M == the whole sequence with window M."""
    stack = make(position, gate)
    x = seq()
    whole = stack(x, stack.empty_memory(3, dtype=x.dtype)).hidden
    chunked, _ = run_chunks(stack, x, chunk)
    torch.testing.assert_close(chunked, whole)


def test_window_really_limits_attention():
    """A token M+1 steps back has no influence; one M steps back does."""
    stack = make()
    x = seq(length=M + 2)
    y = stack(x, stack.empty_memory(3, dtype=x.dtype)).hidden
    far = x.clone()
    far[:, 0] += torch.randn_like(far[:, 0])  # reaches M steps per layer
    y_far = stack(far, stack.empty_memory(3, dtype=x.dtype)).hidden
    assert not torch.allclose(y[:, M], y_far[:, M])
    single = make(memory=M)
    single.blocks = single.blocks[:1]
    y1 = single(x, Memory.empty(1, 3, M, D, dtype=x.dtype)).hidden
    y1_far = single(far, Memory.empty(1, 3, M, D, dtype=x.dtype)).hidden
    torch.testing.assert_close(y1[:, M + 1], y1_far[:, M + 1])
    assert not torch.allclose(y1[:, M], y1_far[:, M])


@pytest.mark.parametrize(("position", "gate"), COMBOS)
def test_cached_step_equals_recomputed_window(position, gate):
    """Acting one step at a time with the key/value cache == recomputing."""
    stack = make(position, gate)
    x = seq()
    whole, memory, _ = stack(x, stack.empty_memory(3, dtype=x.dtype))
    stepped, state = run_steps(stack, x)
    torch.testing.assert_close(stepped, whole)
    # the acting window is exactly the training memory that follows the sequence
    window = state.to_memory()
    torch.testing.assert_close(window.hidden, memory.hidden)
    assert torch.equal(window.valid, memory.valid)
    assert torch.equal(window.time, memory.time)


@pytest.mark.parametrize("position", ["xl", "rotary", "learned", "shaw"])
def test_episode_isolation_in_training_and_acting(position):
    """After a reset nothing from the previous episode reaches the outputs."""
    stack = make(position)
    x = seq(batch=2)
    starts = torch.zeros(2, T, dtype=torch.bool)
    starts[0, 5] = True  # env 0 starts a new episode at step 5, env 1 at step 9
    starts[1, 9] = True
    fresh0 = stack(x[:1, 5:], stack.empty_memory(1, dtype=x.dtype)).hidden
    fresh1 = stack(x[1:, 9:], stack.empty_memory(1, dtype=x.dtype)).hidden
    for chunk in (3, T):
        y, _ = run_chunks(stack, x, chunk, starts)
        torch.testing.assert_close(y[0, 5:], fresh0[0])
        torch.testing.assert_close(y[1, 9:], fresh1[0])
    y_step, _ = run_steps(stack, x, starts)
    torch.testing.assert_close(y_step[0, 5:], fresh0[0])
    torch.testing.assert_close(y_step[1, 9:], fresh1[0])
    # the other episode's earlier steps do see their memory
    y_plain = stack(x, stack.empty_memory(2, dtype=x.dtype)).hidden
    assert not torch.allclose(y_plain[0, 5:], fresh0[0])


def test_memory_after_segment_keeps_only_current_episode():
    stack = make()
    x = seq(batch=1, length=4)
    starts = torch.tensor([[False, False, True, False]])
    mem = Memory(
        hidden=torch.randn(1, Y, M, D, dtype=torch.float64),
        valid=torch.ones(1, M, dtype=torch.bool),
        time=torch.tensor([7]),
    )
    new = stack(x, mem, starts=starts).memory
    assert new.valid.tolist() == [[False, False, False, False, True, True]]
    assert new.time.tolist() == [2]


def test_no_gradient_reaches_memory():
    stack = make().float().train()
    mem = stack.empty_memory(2)
    mem = Memory(torch.randn_like(mem.hidden).requires_grad_(), mem.valid | True, mem.time)
    x = torch.randn(2, 5, D, requires_grad=True)
    y, new, _ = stack(x, mem)
    assert not new.hidden.requires_grad
    y.sum().backward()
    assert mem.hidden.grad is None
    assert x.grad.abs().sum() > 0


def test_gradients_stop_at_segment_boundary():
    """A loss on segment 2 gives no gradient to segment 1's inputs."""
    stack = make().float()
    x1 = torch.randn(2, 5, D, requires_grad=True)
    x2 = torch.randn(2, 5, D)
    mem = stack(x1, stack.empty_memory(2)).memory
    y2 = stack(x2, mem).hidden
    y2.sum().backward()
    assert x1.grad is None


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_build_and_run(name):
    stack = TransformerStack(preset_config(name, D, H), Y, memory=M)
    y = stack(torch.randn(2, 3, D), stack.empty_memory(2)).hidden
    assert y.shape == (2, 3, D) and torch.isfinite(y).all()
    with pytest.raises(ValueError, match="unknown preset 'gpt'; valid choices: gtrxl, trxl"):
        preset_config("gpt", D, H)


def test_stack_without_memory_uses_key_padding_without_nan():
    stack = make(position="learned", memory=0)
    x = seq(batch=2, length=5)
    pad = torch.tensor([[False, False, True, True, True], [True] * 5])  # left padding
    y, mem, aux = stack(x, key_padding=pad)
    assert mem is None and aux == {} and torch.isfinite(y).all()
    alone = stack(x[:1, 2:], positions=torch.arange(2, 5).unsqueeze(0)).hidden
    torch.testing.assert_close(y[0, 2:], alone[0])


def test_sdpa_and_math_kernels_agree_on_the_stack():
    for position, kernel_pair in itertools.product(["xl", "alibi", "rotary"], [("sdpa", "math")]):
        a, b = (make(position, kernel=k) for k in kernel_pair)
        b.load_state_dict(a.state_dict())
        x = seq()
        torch.testing.assert_close(run_chunks(a, x, 4)[0], run_chunks(b, x, 4)[0])


def test_acting_needs_memory():
    with pytest.raises(ValueError, match="memory >= 1"):
        make(memory=0).initial_state(2)


@pytest.mark.parametrize("position", ["none", "learned", "xl"])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_selected_outputs_equal_the_whole_output_and_its_gradients(position, norm):
    """outputs= cuts the last layer to the wanted queries (position-free schemes) or selects
    afterwards (relative ones): same values and same parameter gradients either way."""
    torch.manual_seed(0)
    config = BlockConfig(dim=16, heads=2, position=position, norm=norm, gate="gru")
    stack = TransformerStack(config, 3).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    padding = torch.ones(2, 11, dtype=torch.bool)
    padding[0, :4] = False
    wanted = slice(1, None, 3)
    full = stack(x, key_padding=padding).hidden
    cut = stack(x, key_padding=padding, outputs=wanted).hidden
    torch.testing.assert_close(cut, full[:, wanted])
    grads = []
    for out in (full[:, wanted], cut):
        stack.zero_grad()
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        grads.append([p.grad.clone() for p in stack.parameters() if p.grad is not None])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


def recall_accuracy(memory: int, steps: int = 150) -> float:
    """Train stack + linear read-out, supervised, to output the symbol seen 4 steps earlier,
    on sequences fed as two 8-step segments; accuracy on the second segment's first 4 steps,
    whose answers lie in the first segment (reachable only through the memory)."""
    torch.manual_seed(0)
    k, symbols, dim = 4, 4, 32
    stack = TransformerStack(preset_config("gtrxl", dim, 2, ff_activation="relu"), 1, memory=memory)
    embed, head = torch.nn.Linear(symbols, dim), torch.nn.Linear(dim, symbols)
    params = [*stack.parameters(), *embed.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=3e-3)
    for _ in range(steps):
        sym = torch.randint(0, symbols, (32, 16))
        x = embed(torch.nn.functional.one_hot(sym, symbols).float())
        mem = stack.empty_memory(32) if memory else None
        first, mem, _ = stack(x[:, :8], mem)
        second = stack(x[:, 8:], mem).hidden
        logits = head(torch.cat([first, second], dim=1))[:, k:]  # steps 4..15
        targets = sym[:, :-k].reshape(-1)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, symbols), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
    across = logits[:, 4:8].argmax(-1) == sym[:, 4:8]  # steps 8..11: answers at steps 4..7
    return across.float().mean().item()


@pytest.mark.cli
def test_memory_carries_what_a_segment_needs_from_the_previous_one():
    """A learning check of the memory path: with memory the stack learns recall across the
    segment boundary; without memory (the same stack, memory=0) it stays at chance there."""
    assert recall_accuracy(memory=8) > 0.95
    assert recall_accuracy(memory=0) < 0.45  # chance is 0.25
