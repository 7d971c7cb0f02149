"""Universal Transformer invariants: weight-tied equivalence with halting off, halting weights,
frozen halted positions in memory, segment recurrence, cached acting, episode isolation."""

import pytest
import torch

from rltrans.backbones.gtrxl import TransformerStack
from rltrans.backbones.universal import UniversalTransformer
from rltrans.core.block import BlockConfig
from rltrans.core.position import sinusoid
from rltrans.memory import Memory

D, H, M, S = 16, 4, 5, 4
T = 12


def make(position="xl", halting="act", memory=M, **kw):
    torch.manual_seed(1)
    config = BlockConfig(dim=D, heads=H, position=position, **kw)
    ut = UniversalTransformer(config, max_steps=S, memory=memory, halting=halting)
    for name, p in ut.named_parameters():
        if name.endswith((".u", ".v")):  # make the xl relative terms non-trivial
            torch.nn.init.normal_(p, std=0.5)
        if name == "halting.unit.weight":  # spread the halting depth across positions
            torch.nn.init.normal_(p, std=0.4)
    return ut.double().eval()


def seq(batch=3, length=T):
    return torch.randn(batch, length, D, dtype=torch.float64)


def run_chunks(ut, x, chunk, starts=None):
    memory = ut.empty_memory(x.shape[0], dtype=x.dtype)
    outs, steps = [], []
    for c in range(0, x.shape[1], chunk):
        s = None if starts is None else starts[:, c : c + chunk]
        y, memory, aux = ut(x[:, c : c + chunk], memory, starts=s)
        outs.append(y)
        steps.append(aux["ponder_steps"])
    return torch.cat(outs, 1), memory, torch.cat(steps, 1)


def run_steps(ut, x, starts=None):
    state = ut.initial_state(x.shape[0], dtype=x.dtype)
    outs, steps = [], []
    for t in range(x.shape[1]):
        done = None if starts is None else starts[:, t]
        y, state, aux = ut.step(x[:, t], state, done)
        outs.append(y)
        steps.append(aux["ponder_steps"])
    return torch.stack(outs, 1), state, torch.stack(steps, 1)


def test_halting_spreads_over_depths_in_these_tests():
    """The recurrence tests below only mean something if positions halt at different depths."""
    ut = make()
    _, _, aux = ut(seq(), ut.empty_memory(3, dtype=torch.float64))
    steps = set(aux["ponder_steps"].flatten().tolist())
    assert len(steps) >= 2 and min(steps) < S


@pytest.mark.parametrize("position", ["sinusoidal", "learned", "xl"])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_halting_off_equals_the_block_applied_S_times_by_hand(position, norm):
    """H^t = Block(H^{t-1} + P^t), t = 1..S, with P^t = position + sinusoid(t)."""
    ut = make(position, halting="none", memory=0, norm=norm)
    x = seq()
    y, memory, aux = ut(x)
    assert memory is None
    positions = torch.arange(T).expand(3, T)
    absolute = ut.input_position(positions).double() if ut.input_position is not None else 0.0
    mask = torch.ones(T, T, dtype=torch.bool).tril().view(1, 1, T, T)
    h = x
    for t in range(1, S + 1):
        h, *_ = ut.block(h + absolute + sinusoid(torch.tensor(t), D).double(), None, mask)
    torch.testing.assert_close(y, ut.final_norm(h))
    assert (aux["ponder_steps"] == S).all()
    torch.testing.assert_close(aux["halting_weights"][-1], torch.ones(3, T, dtype=torch.float64))


@pytest.mark.parametrize("position", ["xl", "rotary", "alibi"])
def test_halting_off_without_depth_signal_equals_a_tied_transformer_stack(position):
    """The UT equals a TransformerStack of S blocks that all hold the shared
    block's weights, in chunks with memory, including the memory it hands on."""
    ut = make(position, halting="none")
    ut.depth_signal.zero_()  # relative positions only: P^t = 0, the stack adds nothing either
    stack = TransformerStack(ut.config, S, memory=M).double().eval()
    for block in stack.blocks:
        block.load_state_dict(ut.block.state_dict())
    stack.final_norm.load_state_dict(ut.final_norm.state_dict())
    x = seq()
    y_ut, mem_ut, _ = run_chunks(ut, x, 5)
    mem = stack.empty_memory(3, dtype=x.dtype)
    y_stack = []
    for c in range(0, T, 5):
        y, mem, _ = stack(x[:, c : c + 5], mem)
        y_stack.append(y)
    torch.testing.assert_close(y_ut, torch.cat(y_stack, 1))
    for a, b in zip(mem_ut, mem, strict=True):
        torch.testing.assert_close(a, b)
    assert not torch.allclose(y_ut, make(position, halting="none")(x)[0])  # P^t does matter


def test_halting_weights_sum_to_one_per_position():
    ut = make()
    for seed in range(3):
        torch.manual_seed(seed)
        _, _, aux = ut(seq() * (seed + 1), ut.empty_memory(3, dtype=torch.float64))
        weights = aux["halting_weights"]  # (S, B, L)
        torch.testing.assert_close(weights.sum(0), torch.ones(3, T, dtype=torch.float64))
        assert (weights >= 0).all()
        torch.testing.assert_close(aux["ponder_cost"], aux["ponder_steps"] + aux["remainders"])


def test_halted_position_keeps_its_state_and_still_writes_memory():
    """With h ~ 1 every position halts after one step: the output is one block application,
    and the depth-t memory entries are that frozen state plus P^t for every later depth."""
    ut = make(position="sinusoidal")
    with torch.no_grad():
        ut.halting.unit.bias.fill_(30.0)
    x = seq(length=M)
    y, memory, aux = ut(x, ut.empty_memory(3, dtype=x.dtype))
    assert (aux["ponder_steps"] == 1).all()
    position = ut.input_position(torch.arange(M).expand(3, M)).double()
    mask = torch.ones(M, M, dtype=torch.bool).tril().view(1, 1, M, M)
    first = x + position + ut.depth_signal[0].double()
    h1, *_ = ut.block(first, None, mask)
    torch.testing.assert_close(y, ut.final_norm(h1))
    torch.testing.assert_close(memory.hidden[:, 0], first)
    for t in range(1, S):
        torch.testing.assert_close(memory.hidden[:, t], h1 + position + ut.depth_signal[t].double())


@pytest.mark.parametrize("position", ["xl", "rotary", "learned", "sinusoidal", "shaw"])
@pytest.mark.parametrize("chunk", [1, 5])
def test_chunked_with_memory_equals_whole(position, chunk):
    """Segment recurrence with one memory per depth step; halting decisions agree too."""
    ut = make(position)
    x = seq()
    whole, _, aux = ut(x, ut.empty_memory(3, dtype=x.dtype))
    chunked, _, steps = run_chunks(ut, x, chunk)
    torch.testing.assert_close(chunked, whole)
    assert torch.equal(steps, aux["ponder_steps"])


@pytest.mark.parametrize("position", ["xl", "learned", "alibi"])
@pytest.mark.parametrize("halting", ["act", "none"])
def test_cached_step_equals_forward(position, halting):
    """Acting with the per-depth key/value cache == the training forward."""
    ut = make(position, halting=halting)
    x = seq()
    whole, memory, aux = ut(x, ut.empty_memory(3, dtype=x.dtype))
    stepped, state, steps = run_steps(ut, x)
    torch.testing.assert_close(stepped, whole)
    assert torch.equal(steps, aux["ponder_steps"])
    window = ut.state_to_memory(state)
    for a, b in zip(window, memory, strict=True):
        torch.testing.assert_close(a, b)


def test_causality():
    ut = make()
    x = seq()
    y, _, aux = ut(x, ut.empty_memory(3, dtype=x.dtype))
    x2 = x.clone()
    x2[:, 7:] += torch.randn_like(x2[:, 7:])
    y2, _, aux2 = ut(x2, ut.empty_memory(3, dtype=x.dtype))
    torch.testing.assert_close(y[:, :7], y2[:, :7])
    torch.testing.assert_close(aux["ponder_cost"][:, :7], aux2["ponder_cost"][:, :7])
    assert not torch.allclose(y[:, 7:], y2[:, 7:])


@pytest.mark.parametrize("position", ["xl", "learned"])
def test_episode_isolation_in_training_and_acting(position):
    """After a reset nothing from the previous episode reaches the outputs."""
    ut = make(position)
    x = seq(batch=2)
    starts = torch.zeros(2, T, dtype=torch.bool)
    starts[0, 4], starts[1, 8] = True, True
    fresh0, _, _ = ut(x[:1, 4:], ut.empty_memory(1, dtype=x.dtype))
    fresh1, _, _ = ut(x[1:, 8:], ut.empty_memory(1, dtype=x.dtype))
    for chunk in (3, T):
        y, _, _ = run_chunks(ut, x, chunk, starts)
        torch.testing.assert_close(y[0, 4:], fresh0[0])
        torch.testing.assert_close(y[1, 8:], fresh1[0])
    y_step, _, _ = run_steps(ut, x, starts)
    torch.testing.assert_close(y_step[0, 4:], fresh0[0])
    torch.testing.assert_close(y_step[1, 8:], fresh1[0])
    y_plain, _, _ = ut(x, ut.empty_memory(2, dtype=x.dtype))
    assert not torch.allclose(y_plain[0, 4:], fresh0[0])


def test_fully_invalid_memory_is_ignored_without_nan():
    ut = make()
    x = seq(length=4)
    garbage = Memory(
        hidden=torch.randn(3, S, M, D, dtype=torch.float64) * 1e3,
        valid=torch.zeros(3, M, dtype=torch.bool),
        time=torch.zeros(3, dtype=torch.long),
    )
    y, _, aux = ut(x, garbage, starts=torch.ones(3, 4, dtype=torch.bool))  # every step resets
    assert torch.isfinite(y).all() and torch.isfinite(aux["ponder_cost"]).all()
    alone = torch.cat([ut(x[:, i : i + 1])[0] for i in range(4)], 1)
    torch.testing.assert_close(y, alone)
    y_pad, _, _ = make(memory=0)(x, key_padding=torch.tensor([[False, False, True, True]] * 3))
    assert torch.isfinite(y_pad).all()


def test_zero_memory_passes_an_empty_memory_through():
    ut = make(memory=0)
    x = seq(length=3)
    y, memory, _ = ut(x, ut.empty_memory(3, dtype=x.dtype))
    assert memory.hidden.shape == (3, S, 0, D) and memory.valid.shape == (3, 0)
    torch.testing.assert_close(y, ut(x)[0])
    y2, _, _ = ut(x, memory)  # the next segment accepts it
    torch.testing.assert_close(y2, y)


def test_ponder_cost_gradient_reaches_the_halting_unit():
    ut = make().float().train()
    _, _, aux = ut(torch.randn(2, 6, D), ut.empty_memory(2))
    assert (aux["ponder_steps"] > 1).any()
    aux["ponder_cost"].sum().backward()
    assert ut.halting.unit.weight.grad.abs().sum() > 0
    assert ut.halting.unit.bias.grad.abs().item() > 0


def test_memory_is_stop_gradient():
    ut = make().float()
    x1 = torch.randn(2, 5, D, requires_grad=True)
    _, mem, _ = ut(x1, ut.empty_memory(2))
    assert not mem.hidden.requires_grad
    y2, _, aux = ut(torch.randn(2, 5, D), mem)
    (y2.sum() + aux["ponder_cost"].sum()).backward()
    assert x1.grad is None


@pytest.mark.cli
def test_forward_compiles_as_one_graph():
    """The halting loop and the memory path trace without graph breaks."""
    ut = UniversalTransformer(BlockConfig(dim=D, heads=H), max_steps=2, memory=M).eval()
    mem = ut.empty_memory(2)
    x = torch.randn(2, 5, D)
    compiled = torch.compile(ut, fullgraph=True, backend="eager")
    (y, new, aux), (y_ref, new_ref, aux_ref) = compiled(x, mem), ut(x, mem)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(new.hidden, new_ref.hidden)
    torch.testing.assert_close(aux["ponder_cost"], aux_ref["ponder_cost"])


def test_bad_options_name_the_valid_ones():
    config = BlockConfig(dim=D, heads=H)
    with pytest.raises(ValueError, match="unknown halting 'adaptive'; valid choices: act, none"):
        UniversalTransformer(config, halting="adaptive")
    with pytest.raises(ValueError, match="BlockConfig.position: .* valid choices: none, sinus"):
        BlockConfig(dim=D, heads=H, position="absolute")
    with pytest.raises(ValueError, match="valid choices: pre, post"):
        BlockConfig(dim=D, heads=H, norm="middle")
    with pytest.raises(ValueError, match="acting with a cache needs memory >= 1"):
        UniversalTransformer(config, memory=0).initial_state(2)
    ut = make()
    with pytest.raises(ValueError, match=r"expected \(4, 5\)"):
        ut(seq(), Memory.empty(2, 3, M, D, dtype=torch.float64))


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_the_shared_block_honours_ff_activation(activation):
    """BlockConfig.ff_activation reaches the shared block's MLP: with halting off the output
    is the block applied S times by hand with that activation, and the two activations give
    different outputs from the same weights."""
    ut = make(halting="none", memory=0, ff_activation=activation)
    want = torch.nn.ReLU if activation == "relu" else torch.nn.GELU
    assert isinstance(ut.block.mlp.net[1], want)
    x = seq()
    mask = torch.ones(T, T, dtype=torch.bool).tril().view(1, 1, T, T)
    fc1, _, fc2 = ut.block.mlp.net
    act = torch.relu if activation == "relu" else torch.nn.functional.gelu
    h = x
    for t in range(1, S + 1):  # the block written out, MLP with the chosen activation
        u = h + ut.depth_signal[t - 1].double()
        a, _ = ut.block.attn(ut.block.norm1(u), None, mask)
        u = ut.block.gate1(u, ut.block.act(a))
        h = ut.block.gate2(u, ut.block.act(fc2(act(fc1(ut.block.norm2(u))))))
    torch.testing.assert_close(ut(x).hidden, ut.final_norm(h))
    other = make(halting="none", memory=0, ff_activation="gelu" if activation == "relu" else "relu")
    other.load_state_dict(ut.state_dict())
    assert not torch.allclose(other(x).hidden, ut(x).hidden)
