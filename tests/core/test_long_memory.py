"""The long memories (linear, delta, additive, mixed, compressive): their papers' equations,
and the stack invariants with each on."""

import pytest
import torch

from rltrans.agents.memory_agent import build_backbone
from rltrans.backbones.gtrxl import TransformerStack
from rltrans.buffers.rollout import RolloutBuffer
from rltrans.config import ConfigError, load_config
from rltrans.core.block import BlockConfig
from rltrans.core.long_memory import (
    AdditiveMemory,
    CompressiveMemory,
    DeltaMemory,
    LinearMemory,
    LinearState,
    MixedMemory,
    build_long_memory,
    time_scales,
)
from rltrans.envs.torch_envs import make_torch_env
from rltrans.learners import PPOConfig, PPOLearner
from rltrans.runtime.actors import LocalActor
from tests.runtime.test_rollout import small_agent

D, H, Y, M, T = 16, 4, 2, 2, 14  # window reach Y x M = 4 steps, sequences of 14
KINDS = ("linear", "delta", "additive", "mixed", "compressive")
SLOTS, RATE = 3, 2  # the compressive memory in these tests: 7 blocks in 14 steps, 3 kept


def literal(module: LinearMemory, x, S, z, starts):
    """The module docstring's equations, one batch entry, head and step at a time (float64)."""
    b, length, _ = x.shape
    d = module.head_dim
    w_q, w_k, w_v, w_b = module.qkv.weight.split((D, D, D, module.heads))
    b_q, b_k, b_v, b_b = module.qkv.bias.split((D, D, D, module.heads))
    phi = lambda u: torch.nn.functional.elu(u) + 1  # noqa: E731
    reads = torch.zeros(b, length, D, dtype=x.dtype)
    S, z = S.clone(), z.clone()
    for i in range(b):
        for h in range(module.heads):
            rows = slice(h * d, (h + 1) * d)
            gamma = torch.sigmoid(module.retention[h])
            for t in range(length):
                if starts[i, t]:
                    S[i, h], z[i, h] = 0.0, 0.0
                x_t = x[i, t]
                q = phi(w_q[rows] @ x_t + b_q[rows])
                k = phi(w_k[rows] @ x_t + b_k[rows])
                v = w_v[rows] @ x_t + b_v[rows]
                beta = torch.sigmoid(w_b[h] @ x_t + b_b[h])
                S[i, h] = gamma * S[i, h] + beta * torch.outer(k, v)
                z[i, h] = gamma * z[i, h] + beta * k
                reads[i, t, rows] = (q @ S[i, h]) / (q @ z[i, h] + 1e-6)
    return module.out(reads), S, z


def literal_delta(module: DeltaMemory, x, S, starts):
    """The gated delta rule of the module docstring, one entry, head and step at a time; for
    an AdditiveMemory the sum rule instead, S_t = gamma S_{t-1} + beta_t k_t v_t^T; for a
    MixedMemory the delta rule in odd heads and the sum rule in even ones."""
    b, length, _ = x.shape
    d = module.head_dim
    w_q, w_k, w_v, w_b = module.qkv.weight.split((D, D, D, module.heads))
    b_q, b_k, b_v, b_b = module.qkv.bias.split((D, D, D, module.heads))
    reads = torch.zeros(b, length, D, dtype=x.dtype)
    S = S.clone()
    for i in range(b):
        for h in range(module.heads):
            rows = slice(h * d, (h + 1) * d)
            gamma = torch.sigmoid(module.retention[h])
            for t in range(length):
                if starts[i, t]:
                    S[i, h] = 0.0
                x_t = x[i, t]
                q = w_q[rows] @ x_t + b_q[rows]
                k = w_k[rows] @ x_t + b_k[rows]
                q, k = q / q.norm(), k / k.norm()
                v = w_v[rows] @ x_t + b_v[rows]
                beta = torch.sigmoid(w_b[h] @ x_t + b_b[h])
                counts = isinstance(module, MixedMemory) and h % 2 == 0
                if isinstance(module, AdditiveMemory) or counts:
                    S[i, h] = gamma * S[i, h] + beta * torch.outer(k, v)
                else:
                    u = beta * (v - gamma * S[i, h].T @ k)
                    S[i, h] = gamma * S[i, h] + torch.outer(k, u)
                reads[i, t, rows] = S[i, h].T @ q
    return module.out(reads), S


def literal_compressive(module: CompressiveMemory, x, starts):
    """Rae et al.'s compression and a softmax read over the newest Mc slots, one batch entry
    and step at a time from an empty memory, blocks and slots kept as Python lists."""
    b, length, _ = x.shape
    d, c = module.head_dim, module.rate
    w_q, b_q = module.query.weight, module.query.bias
    w_k, w_v = module.key_value.weight.split((D, D))
    b_k, b_v = module.key_value.bias.split((D, D))
    reads = torch.zeros(b, length, D, dtype=x.dtype)
    for i in range(b):
        slots, block = [], []
        for t in range(length):
            if starts[i, t]:
                slots, block = [], []
            q = w_q @ x[i, t] + b_q
            for h in range(module.heads):
                rows = slice(h * d, (h + 1) * d)
                kept = slots[-module.slots :]
                if kept:
                    keys = torch.stack([w_k[rows] @ s + b_k[rows] for s in kept])
                    values = torch.stack([w_v[rows] @ s + b_v[rows] for s in kept])
                    weights = torch.softmax(keys @ q[rows] / d**0.5, dim=0)
                    reads[i, t, rows] = weights @ values
            block.append(x[i, t])
            if len(block) == c:  # Conv1d with kernel = stride = c over the block's steps
                w = module.compress.weight
                slots.append(module.compress.bias + sum(w[:, :, j] @ block[j] for j in range(c)))
                block = []
    return module.out(reads)


def loud(module):
    """Give the (zero-initialised) read-out weights values, so the memory shows in outputs."""
    torch.manual_seed(3)
    torch.nn.init.normal_(module.out.weight, std=0.5)
    if hasattr(module, "qkv"):
        torch.nn.init.normal_(module.qkv.weight[-module.heads :], std=0.5)
    return module


def test_linear_memory_equals_the_literal_recurrence_in_float64():
    torch.manual_seed(0)
    module = loud(LinearMemory(D, H)).double()
    x = torch.randn(3, T, D, dtype=torch.float64)
    starts = torch.zeros(3, T, dtype=torch.bool)
    starts[0, 0], starts[1, 4], starts[1, 9] = True, True, True
    S0 = torch.rand(3, H, D // H, D // H, dtype=torch.float64)
    z0 = torch.rand(3, H, D // H, dtype=torch.float64)
    want, S, z = literal(module, x, S0, z0, starts)
    got, state = module(x, LinearState(S0, z0), starts)  # the parallel (closed) form
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(state.S, S)
    torch.testing.assert_close(state.z, z)
    stepped, state = [], LinearState(S0, z0)
    for t in range(T):  # the acting form, reset by the caller as the stack does
        keep = (~starts[:, t]).double()
        state = LinearState(state.S * keep.view(-1, 1, 1, 1), state.z * keep.view(-1, 1, 1))
        read, state = module.step(x[:, t], state)
        stepped.append(read)
    torch.testing.assert_close(torch.stack(stepped, 1), want)
    torch.testing.assert_close(state.S, S)


@pytest.mark.parametrize("kind", [DeltaMemory, AdditiveMemory, MixedMemory])
def test_delta_additive_and_mixed_memories_equal_their_literal_rules_in_float64(kind):
    torch.manual_seed(0)
    module = loud(kind(D, H)).double()
    x = torch.randn(3, T, D, dtype=torch.float64)
    starts = torch.zeros(3, T, dtype=torch.bool)
    starts[0, 0], starts[1, 4], starts[1, 9] = True, True, True
    S0 = torch.randn(3, H, D // H, D // H, dtype=torch.float64)
    z0 = torch.zeros(3, H, D // H, dtype=torch.float64)
    want, S = literal_delta(module, x, S0, starts)
    got, state = module(x, LinearState(S0, z0), starts)  # the triangular solve
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(state.S, S)
    stepped, state = [], LinearState(S0, z0)
    for t in range(T):
        keep = (~starts[:, t]).double()
        state = LinearState(state.S * keep.view(-1, 1, 1, 1), state.z)
        read, state = module.step(x[:, t], state)
        stepped.append(read)
    torch.testing.assert_close(torch.stack(stepped, 1), want)
    torch.testing.assert_close(state.S, S)


def test_compressive_memory_equals_the_literal_compression_in_float64():
    """Parallel over a segment, stepped, and split into two segments at an odd step (a block
    in progress and evicted slots carried in the state) all equal the literal loop."""
    torch.manual_seed(0)
    module = loud(CompressiveMemory(D, H, slots=SLOTS, rate=3)).double()
    x = torch.randn(3, T, D, dtype=torch.float64)
    starts = torch.zeros(3, T, dtype=torch.bool)
    starts[1, 4], starts[2, 0], starts[2, 11] = True, True, True
    want = literal_compressive(module, x, starts)
    got, _ = module(x, module.empty_state(3, dtype=x.dtype), starts)
    torch.testing.assert_close(got, want)
    first, state = module(x[:, :5], module.empty_state(3, dtype=x.dtype), starts[:, :5])
    second, _ = module(x[:, 5:], state, starts[:, 5:])
    torch.testing.assert_close(torch.cat([first, second], 1), want)
    stepped, state = [], module.empty_state(3, dtype=x.dtype)
    for t in range(T):
        keep = (~starts[:, t]).double()
        state = type(state)(*(f * keep.view(-1, *[1] * (f.dim() - 1)) for f in state))
        read, state = module.step(x[:, t], state)
        stepped.append(read)
    torch.testing.assert_close(torch.stack(stepped, 1), want)
    assert want[0, 3:].abs().sum() > 0 and want[0, :3].abs().sum() == 0  # first slot after 3


def test_a_repeated_step_does_not_wash_out_what_the_delta_rule_stored():
    """A cue, then 500 identical corridor steps: the delta memory still tells the two cues
    apart at the end about as well as after 20 steps; the additive linear memory has diluted
    them ~25 times more."""
    torch.manual_seed(0)
    cues = torch.randn(2, D, dtype=torch.float64)
    corridor = torch.randn(D, dtype=torch.float64)
    spread = {}
    for kind in KINDS:
        module = loud(build_long_memory(kind, D, H)).double()
        for length in (20, 500):
            x = corridor.expand(2, length, D).clone()
            x[:, 0] = cues
            read, _ = module(x, module.empty_state(2, dtype=x.dtype))
            spread[kind, length] = (read[0, -1] - read[1, -1]).norm().item()
    assert spread["delta", 500] > 0.5 * spread["delta", 20]
    assert spread["linear", 500] < 0.1 * spread["linear", 20]


def test_the_additive_memory_counts_where_the_delta_rule_saturates():
    """A step seen n times: the additive read for its key grows as n (a count, what
    count-recall asks), the delta rule's stays where one writing put it."""
    torch.manual_seed(0)
    card = torch.randn(D, dtype=torch.float64)
    reads = {}
    for kind in ("additive", "delta"):
        module = loud(build_long_memory(kind, D, H)).double()
        with torch.no_grad():
            module.retention.fill_(30.0)  # gamma = 1 - 1e-13: no forgetting
            module.qkv.bias[-H:] = 30.0  # beta = 1: every step written in full
        for n in (10, 20, 40):
            x = card.expand(1, n, D)
            read, _ = module(x, module.empty_state(1, dtype=x.dtype))
            reads[kind, n] = read[0, -1]
    for n in (20, 40):
        torch.testing.assert_close(reads["additive", n], n / 10 * reads["additive", 10])
        torch.testing.assert_close(reads["delta", n], reads["delta", 10])


def test_the_mixed_memory_counts_in_its_even_heads_and_overwrites_in_its_odd_heads():
    """One state, both rules: a step seen n times grows the even heads' reads as n and leaves
    the odd heads' where one writing put it; fewer than two heads are refused."""
    torch.manual_seed(0)
    card = torch.randn(D, dtype=torch.float64)
    module = loud(build_long_memory("mixed", D, H)).double()
    with torch.no_grad():
        module.out.weight.copy_(torch.eye(D))  # the read-out shows each head's read as it is
        module.out.bias.zero_()
        module.retention.fill_(30.0)
        module.qkv.bias[-H:] = 30.0
    reads = {}
    for n in (10, 20):
        read, _ = module(card.expand(1, n, D), module.empty_state(1, dtype=torch.float64))
        reads[n] = read[0, -1].view(H, D // H)
    torch.testing.assert_close(reads[20][0::2], 2 * reads[10][0::2])
    torch.testing.assert_close(reads[20][1::2], reads[10][1::2])
    with pytest.raises(ValueError, match="long_memory='mixed' needs heads >= 2"):
        build_long_memory("mixed", D, 1)


def test_heads_start_at_time_scales_16_x_8_to_the_h():
    scales = time_scales(LinearMemory(D, H))
    want = torch.tensor([16.0, 128.0, 1024.0, 8192.0], dtype=torch.float64)
    torch.testing.assert_close(scales, want, rtol=1e-3, atol=0)


@pytest.mark.parametrize("kind", ["linear", "delta", "additive"])
def test_retention_scale_sets_the_slowest_head_and_spaces_the_others_geometrically(kind):
    """agent.retention_scale reaches every block's long memory through the agent config: the
    heads start at 16 ... retention_scale, equal ratios apart (up to float32's rounding of a
    retention near 1); one head starts at it; below 16 steps it is refused with the value."""
    torch.testing.assert_close(
        time_scales(build_long_memory(kind, D, H, longest=40_000)),
        16.0 * 2500.0 ** (torch.arange(4, dtype=torch.float64) / 3),
        rtol=5e-3,
        atol=0,
    )
    torch.testing.assert_close(
        time_scales(build_long_memory(kind, D, 1, longest=40_000)),
        torch.tensor([40_000.0], dtype=torch.float64),
        rtol=5e-3,
        atol=0,
    )
    env = make_torch_env("passive_tmaze", 2, length=8)
    agent = small_agent(env, "gtrxl", long_memory=kind, retention_scale=20_000)
    blocks = [b for b in agent.backbone.blocks if b.long is not None]
    assert blocks and all(
        time_scales(b.long)[-1] == pytest.approx(20_000, rel=5e-3) for b in blocks
    )
    with pytest.raises(ValueError, match="retention_scale must be >= 16 steps or None, got 8"):
        BlockConfig(dim=D, heads=H, long_memory=kind, retention_scale=8)
    with pytest.raises(ConfigError, match="agent.retention_scale"):
        load_config([f"agent.long_memory={kind}", "agent.retention_scale=8"], "train")
    assert load_config(["agent.retention_scale=40000"], "train").agent.retention_scale == 40_000


def make(long_memory="linear", memory=M, layers=Y):
    torch.manual_seed(1)
    config = BlockConfig(
        dim=D, heads=H, long_memory=long_memory, compressed_slots=SLOTS, compression_rate=RATE
    )
    stack = TransformerStack(config, layers, memory=memory)
    for block in stack.blocks:
        if block.long is not None:
            loud(block.long)
    return stack.double().eval()


def seq(batch=3, length=T):
    torch.manual_seed(2)
    return torch.randn(batch, length, D, dtype=torch.float64)


def run_chunks(stack, x, chunk, starts=None):
    memory, outs = stack.empty_memory(x.shape[0], dtype=x.dtype), []
    for c in range(0, x.shape[1], chunk):
        s = None if starts is None else starts[:, c : c + chunk]
        y, memory, _ = stack(x[:, c : c + chunk], memory, starts=s)
        outs.append(y)
    return torch.cat(outs, 1), memory


def run_steps(stack, x, starts=None):
    state, outs = stack.initial_state(x.shape[0], device=x.device, dtype=x.dtype), []
    for t in range(x.shape[1]):
        y, state, _ = stack.step(x[:, t], state, None if starts is None else starts[:, t])
        outs.append(y)
    return torch.stack(outs, 1), state


def test_reach_goes_beyond_the_window_only_with_the_long_memory():
    x = seq()
    far = x.clone()
    far[:, 0] += torch.randn_like(far[:, 0])
    for kind, reaches in (("none", False), ("linear", True)):
        stack = make(kind)
        y, far_y = (stack(v, stack.empty_memory(3, dtype=v.dtype)).hidden for v in (x, far))
        assert torch.allclose(y[:, -1], far_y[:, -1]) != reaches  # step 13, window reach 4


def test_a_fresh_long_memory_reads_nothing_so_the_agent_starts_as_its_window_twin():
    torch.manual_seed(0)
    linear = TransformerStack(BlockConfig(dim=D, heads=H, long_memory="linear"), Y, memory=M)
    twin = TransformerStack(BlockConfig(dim=D, heads=H), Y, memory=M)
    missing = twin.load_state_dict(linear.state_dict(), strict=False)
    assert not missing.missing_keys and all(".long." in k for k in missing.unexpected_keys)
    x = seq().float()
    torch.testing.assert_close(
        linear(x, linear.empty_memory(3)).hidden, twin(x, twin.empty_memory(3)).hidden
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chunk", [1, 4, 5, T])
def test_chunked_equals_whole_and_cached_acting_equals_recomputing(chunk, kind):
    stack = make(kind)
    x = seq()
    whole, memory, _ = stack(x, stack.empty_memory(3, dtype=x.dtype))
    chunked, chunk_memory = run_chunks(stack, x, chunk)
    torch.testing.assert_close(chunked, whole)
    stepped, state = run_steps(stack, x)
    torch.testing.assert_close(stepped, whole)
    acted = state.to_memory()  # what a segment starting now stores
    for a, b, c in zip(acted.long, memory.long, chunk_memory.long, strict=True):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(c, b)


@pytest.mark.parametrize("kind", KINDS)
def test_episode_isolation_in_training_and_acting_reaches_the_long_state(kind):
    stack = make(kind)
    x = seq(batch=2)
    starts = torch.zeros(2, T, dtype=torch.bool)
    starts[0, 5], starts[1, 9] = True, True
    fresh0 = stack(x[:1, 5:], stack.empty_memory(1, dtype=x.dtype)).hidden
    fresh1 = stack(x[1:, 9:], stack.empty_memory(1, dtype=x.dtype)).hidden
    for chunk in (3, T):
        y, memory = run_chunks(stack, x, chunk, starts)
        torch.testing.assert_close(y[0, 5:], fresh0[0])
        torch.testing.assert_close(y[1, 9:], fresh1[0])
    stepped, state = run_steps(stack, x, starts)
    torch.testing.assert_close(stepped[0, 5:], fresh0[0])
    torch.testing.assert_close(stepped[1, 9:], fresh1[0])
    # and the state a reset leaves holds nothing of the old episode
    state.reset_where(torch.tensor([True, False]))
    assert all(t[:, 0].abs().max() == 0 for t in state.long)
    assert state.long[0][:, 1].abs().max() > 0  # S (z stays zero for delta)
    training = stack.empty_memory(2, dtype=x.dtype)._replace(long=memory.long)
    restart = torch.zeros(2, 3, dtype=torch.bool)
    restart[:, 0] = True  # both envs start an episode with this segment: the stored state is cut
    y = stack(x[:, :3], training, starts=restart).hidden
    torch.testing.assert_close(y, stack(x[:, :3], stack.empty_memory(2, dtype=x.dtype)).hidden)


@pytest.mark.parametrize("kind", ["none", *KINDS])
def test_a_segment_run_in_chunks_gives_the_same_outputs_and_the_long_state_its_gradient(kind):
    """chunk=4: the outputs of a 14-step segment are the whole segment's; the last step's
    gradient reaches the first chunk through the long state alone (the window's memory is
    stop-gradient between chunks, and 4 steps of reach do not span 13)."""
    stack = make(kind)
    x = seq().requires_grad_()
    starts = torch.zeros(3, T, dtype=torch.bool)
    starts[2, 6] = True  # env 2: a new episode in the second chunk cuts the first one off
    whole = stack(x, stack.empty_memory(3, dtype=x.dtype), starts=starts)
    stack.chunk = 4
    chunked = stack(x, stack.empty_memory(3, dtype=x.dtype), starts=starts)
    torch.testing.assert_close(chunked.hidden, whole.hidden)
    for a, b in zip(chunked.memory.long, whole.memory.long, strict=True):
        torch.testing.assert_close(a, b)
    weights = torch.randn(D, dtype=x.dtype)  # (a plain sum of a LayerNorm output is 0)
    (grad,) = torch.autograd.grad(chunked.hidden[:, -1] @ weights, x, torch.ones(3, dtype=x.dtype))
    reach = grad[:, :4].abs().sum(dim=(1, 2))  # (3,): per env, from the first chunk
    assert reach[2] == 0  # another episode
    assert (reach[:2] > 0).all() == (kind != "none")


@pytest.mark.parametrize("kind", KINDS)
def test_gradient_stops_at_the_stored_state_and_reaches_the_memory_weights(kind):
    stack = make(kind).float().train()
    x = seq().float()
    memory = stack.empty_memory(3)
    memory = memory._replace(long=tuple(torch.rand_like(t).requires_grad_() for t in memory.long))
    y = stack(x, memory).hidden
    y.sum().backward()
    assert all(t.grad is None for t in memory.long)
    for block in stack.blocks:
        for name, weight in block.long.named_parameters():
            assert weight.grad.abs().sum() > 0, name


@pytest.mark.parametrize("kind", KINDS)
def test_replay_fidelity_with_the_long_memory(kind):
    """PPO's first pass recomputes the acting log-probs and values: ratio exactly 1."""
    envs = make_torch_env("stateless_cartpole", 4, max_episode_steps=13)
    torch.manual_seed(0)
    # blocks of the compressive memory complete within the 13-step episodes
    options = {"long_memory": kind, "compressed_slots": SLOTS, "compression_rate": RATE}
    agent = small_agent(envs, "gtrxl", memory=4, **options)
    for block in agent.backbone.blocks:
        loud(block.long)
    buffer = RolloutBuffer(32, 4, 8, "cpu")
    actor = LocalActor(envs, agent, seed=0, device="cpu")
    for _ in range(2):  # the second rollout starts with a long state carried over
        actor.collect(buffer)
    assert buffer.starts.any() and any(m.long[0].abs().sum() > 0 for m in buffer.memories)
    buffer.compute_advantages(actor.bootstrap_value(), 0.99, 0.95)
    (batch,) = buffer.minibatches(1)
    log_prob, _, value, _ = agent.evaluate(batch.segment)
    torch.testing.assert_close(log_prob, batch.log_probs, atol=1e-5, rtol=0)
    torch.testing.assert_close(value, batch.values, atol=1e-5, rtol=0)
    ppo = {"epochs": 1, "num_minibatches": 1, "clip_coef": 0.2, "vf_clip_coef": 0.2}
    ppo |= {"ent_coef": 0.01, "vf_coef": 0.5, "normalize_advantages": True}
    metrics = PPOLearner(agent, PPOConfig(**ppo, lr=1e-3), total_updates=2).update(buffer)
    assert abs(metrics["ratio_mean"].item() - 1.0) < 1e-5
    actor.collect(buffer)  # after the update: acting and replay agree again
    buffer.compute_advantages(actor.bootstrap_value(), 0.99, 0.95)
    (batch,) = buffer.minibatches(1)
    log_prob, _, value, _ = agent.evaluate(batch.segment)
    torch.testing.assert_close(log_prob, batch.log_probs, atol=1e-5, rtol=0)


def test_errors_name_the_bad_value_and_the_valid_ones():
    valid = "valid choices: none, linear, delta, additive, mixed, compressive"
    with pytest.raises(ValueError, match=f"long memory 'lstm'; {valid}"):
        build_long_memory("lstm", D, H)
    with pytest.raises(ValueError, match=f"long memory 'x'; {valid}"):
        BlockConfig(dim=D, heads=H, long_memory="x")
    with pytest.raises(ValueError, match="needs memory >= 1, got 0"):
        make(memory=0)
    with pytest.raises(ValueError, match="Universal Transformer takes long_memory=none"):
        build_backbone("universal", D, None, H, M, long_memory="linear")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
def test_linear_memory_on_cuda_matches_cpu_and_acts_as_it_trains_under_bf16_autocast():
    stack, x = make().float(), seq().float()
    starts = torch.zeros(3, T, dtype=torch.bool)
    starts[1, 6] = True
    want, _ = run_steps(stack, x, starts)
    stack, x, starts = stack.cuda(), x.cuda(), starts.cuda()
    whole = stack(x, stack.empty_memory(3, device="cuda"), starts=starts).hidden
    stepped, _ = run_steps(stack, x, starts)
    torch.testing.assert_close(whole.cpu(), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(stepped.cpu(), want, rtol=1e-4, atol=1e-4)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        half = stack(x, stack.empty_memory(3, device="cuda"), starts=starts).hidden
    assert half.isfinite().all()
    torch.testing.assert_close(half.float().cpu(), want, rtol=0.1, atol=0.1)
