"""Adaptive attention span: the paper's soft-masked softmax, and the stack invariants with it."""

import pytest
import torch

from rltrans.agents.memory_agent import MemoryAgent, build_backbone
from rltrans.backbones.gtrxl import TransformerStack
from rltrans.buffers.rollout import RolloutBuffer
from rltrans.core.attention import attend, sequence_mask
from rltrans.core.block import BlockConfig
from rltrans.core.span import AdaptiveSpan
from rltrans.envs.torch_envs import make_torch_env
from rltrans.learners import PPOConfig, PPOLearner
from rltrans.runtime.actors import LocalActor
from tests.runtime.test_rollout import small_agent

D, H, Y, M, T = 16, 4, 2, 6, 20
FRACTIONS = (0.1, 0.3, 0.5, 0.2)  # spans 0.6, 1.8, 3.0, 1.2 steps of M = 6; ramp 2: reach 5


def literal(q, k, v, allowed, spans, ramp):
    """a_tr = m_z(t - r) exp(s_tr) / sum_q m_z(t - q) exp(s_tq), one entry, head and query at a
    time (Sukhbaatar et al. 2019, eq. 2), with m_z(x) = clamp((R + z - x) / R, 0, 1)."""
    b, h, length, e = q.shape
    keys = k.shape[2]
    out = torch.zeros_like(q)
    for i in range(b):
        for j in range(h):
            for t in range(length):
                weights = torch.zeros(keys, dtype=q.dtype)
                for r in range(keys):
                    if allowed[i, 0, t, r]:
                        x = (keys - length + t) - r
                        soft = min(max((ramp + spans[j] - x) / ramp, 0.0), 1.0)
                        weights[r] = soft * torch.exp(q[i, j, t] @ k[i, j, r] / e**0.5)
                out[i, j, t] = (weights / weights.sum()) @ v[i, j]
    return out


def test_soft_masked_attention_equals_the_paper_in_float64():
    torch.manual_seed(0)
    span = AdaptiveSpan(H, ramp=2).double()
    with torch.no_grad():
        span.fraction.copy_(torch.tensor(FRACTIONS))
    q, k, v = (torch.randn(2, H, 5, 8, dtype=torch.float64) for _ in range(3))
    k, v = (torch.randn(2, H, M + 5, 8, dtype=torch.float64) for _ in range(2))
    starts = torch.zeros(2, 5, dtype=torch.bool)
    starts[1, 3] = True
    valid = torch.ones(2, M, dtype=torch.bool)
    valid[0, :2] = False
    allowed = sequence_mask(5, M, window=M, memory_valid=valid, starts=starts)
    mask = span.segment_mask(allowed, 5, M, torch.float64)
    want = literal(q, k, v, allowed, [f * M for f in FRACTIONS], 2)
    for kernel in ("sdpa", "math"):
        torch.testing.assert_close(attend(q, k, v, mask=mask, kernel=kernel), want)


def make(position="xl", fractions=FRACTIONS, memory=M):
    torch.manual_seed(1)
    config = BlockConfig(dim=D, heads=H, position=position, adaptive_span=True, span_ramp=2)
    stack = TransformerStack(config, Y, memory=memory).double().eval()
    with torch.no_grad():
        for block in stack.blocks:
            block.span.fraction.copy_(torch.tensor(fractions))
    return stack


def run(stack, x, chunk, starts=None):
    memory, outs = stack.empty_memory(x.shape[0], dtype=x.dtype), []
    for c in range(0, x.shape[1], chunk):
        s = None if starts is None else starts[:, c : c + chunk]
        outs.append(stack(x[:, c : c + chunk], memory, starts=s).hidden)
        memory = stack(x[:, c : c + chunk], memory, starts=s).memory
    state, steps = stack.initial_state(x.shape[0], dtype=x.dtype), []
    for t in range(x.shape[1]):
        y, state, _ = stack.step(x[:, t], state, None if starts is None else starts[:, t])
        steps.append(y)
    return torch.cat(outs, 1), torch.stack(steps, 1)


def test_full_spans_start_as_the_fixed_window_twin():
    torch.manual_seed(0)
    spanned = TransformerStack(BlockConfig(dim=D, heads=H, adaptive_span=True), Y, memory=M)
    twin = TransformerStack(BlockConfig(dim=D, heads=H), Y, memory=M)
    missing = twin.load_state_dict(spanned.state_dict(), strict=False)
    assert not missing.missing_keys and all(".span." in k for k in missing.unexpected_keys)
    x = torch.randn(3, T, D)
    torch.testing.assert_close(
        spanned(x, spanned.empty_memory(3)).hidden, twin(x, twin.empty_memory(3)).hidden
    )


@pytest.mark.parametrize("position", ["xl", "rotary", "alibi", "shaw", "none"])
@pytest.mark.parametrize("chunk", [1, 7, T])
def test_chunked_equals_whole_and_cached_acting_equals_recomputing(position, chunk):
    stack = make(position)
    x = torch.randn(3, T, D, dtype=torch.float64)
    starts = torch.zeros(3, T, dtype=torch.bool)
    starts[1, 9] = True
    whole = stack(x, stack.empty_memory(3, dtype=x.dtype), starts=starts).hidden
    chunked, stepped = run(stack, x, chunk, starts)
    torch.testing.assert_close(chunked, whole)
    torch.testing.assert_close(stepped, whole)
    fresh = stack(x[1:2, 9:], stack.empty_memory(1, dtype=x.dtype)).hidden  # episode isolation
    torch.testing.assert_close(whole[1, 9:], fresh[0])


def test_attention_runs_over_the_reach_only_and_farther_steps_do_not_matter():
    stack = make(fractions=(0.1, 0.1, 0.12, 0.1), memory=20)  # spans <= 2.4 steps, ramp 2
    assert [b.span.reach(20) for b in stack.blocks] == [5, 5]
    seen = []
    block = stack.blocks[0]
    project = block.memory_kv
    block.memory_kv = lambda h: seen.append(h.shape[1]) or project(h)
    x = torch.randn(2, 12, D, dtype=torch.float64)
    memory = stack(x, stack.empty_memory(2, dtype=x.dtype)).memory
    far = memory._replace(hidden=memory.hidden.clone())
    far.hidden[:, :, :15] += 5.0  # steps more than 5 back
    y = torch.randn(2, 4, D, dtype=torch.float64)
    torch.testing.assert_close(stack(y, far).hidden, stack(y, memory).hidden)
    assert seen[-1] == 5  # memory keys projected: the last 5 of 20
    state = stack.initial_state(2, dtype=x.dtype)
    for t in range(12):  # acting reads the last 5 window slots of 20
        state = stack.step(x[:, t], state).state
    copy = state._replace(**{f: getattr(state, f).clone() for f in ("hidden", "keys", "values")})
    w = state.window()
    for cache in (copy.keys, copy.values):
        cache[:, :, :, w.start : w.start + 15] += 5.0  # slots more than 5 steps back
    copy = copy._replace(valid=state.valid.clone(), time=state.time.clone())
    torch.testing.assert_close(stack.step(y[:, 0], copy).hidden, stack.step(y[:, 0], state).hidden)


def test_acting_reads_the_reach_once_per_refresh_not_at_every_step(monkeypatch):
    stack = make(memory=20)
    x = torch.randn(2, 12, D, dtype=torch.float64)
    state = stack.initial_state(2, dtype=x.dtype)
    assert stack.acting_reach == (12, 12)  # the longest span (0.5 x 20) + the ramp (2)
    reads = []
    monkeypatch.setattr(AdaptiveSpan, "reach", lambda self, w: reads.append(w) or w)
    for t in range(12):
        state = stack.step(x[:, t], state).state
    assert reads == []  # no host read (a device sync on CUDA) per step and layer
    monkeypatch.undo()
    with torch.no_grad():
        for block in stack.blocks:
            block.span.fraction.copy_(torch.tensor([0.1, 0.1, 0.12, 0.1]))  # a weight update
    state = stack.refresh_state(state)
    assert stack.acting_reach == (5, 5)
    y = torch.randn(2, D, dtype=torch.float64)
    copy = state._replace(**{f: getattr(state, f).clone() for f in ("hidden", "keys", "values")})
    copy = copy._replace(valid=state.valid.clone(), time=state.time.clone())
    acted = stack.step(y, state).hidden
    stack.acting_reach = (20, 20)  # the whole window: the keys beyond the reach weigh nothing
    torch.testing.assert_close(acted, stack.step(y, copy).hidden)


def test_the_span_cost_and_the_task_both_train_the_spans_and_the_spans_are_logged():
    envs = make_torch_env("stateless_cartpole", 4, max_episode_steps=13)
    torch.manual_seed(0)
    agent = small_agent(envs, "gtrxl", adaptive_span=True, span_ramp=2, span_coef=0.01)
    with torch.no_grad():
        for block in agent.backbone.blocks:
            block.span.fraction.copy_(torch.tensor([0.2, 0.5, 0.6, 0.8]))  # 0.5: R + z = 6
    buffer = RolloutBuffer(32, 4, 8, "cpu")
    actor = LocalActor(envs, agent, seed=0, device="cpu")
    actor.collect(buffer)
    buffer.compute_advantages(actor.bootstrap_value(), 0.99, 0.95)
    (batch,) = buffer.minibatches(1)
    log_prob, _, value, aux = agent.evaluate(batch.segment)
    torch.testing.assert_close(log_prob, batch.log_probs, atol=1e-5, rtol=0)  # replay fidelity
    torch.testing.assert_close(value, batch.values, atol=1e-5, rtol=0)
    spans = agent.backbone.span_aux()["spans"]
    torch.testing.assert_close(aux["loss_span"], 0.01 * spans.mean())
    assert aux["span_l1_h3"] == pytest.approx(0.8 * 8)
    fraction = agent.backbone.blocks[0].span.fraction
    grad = torch.autograd.grad(value.sum(), fraction)[0]
    assert grad.isfinite().all() and grad.abs().sum() > 0  # the task trains it
    ppo = {"epochs": 1, "num_minibatches": 1, "clip_coef": 0.2, "vf_clip_coef": 0.2}
    ppo |= {"ent_coef": 0.0, "vf_coef": 0.0, "normalize_advantages": True}
    before = fraction.detach().clone()
    metrics = PPOLearner(agent, PPOConfig(**ppo, lr=1e-2), total_updates=1).update(buffer)
    assert abs(metrics["ratio_mean"].item() - 1.0) < 1e-5
    assert {"loss_span", "span_mean", "span_max", "span_l0_h0"} <= set(metrics)
    after = agent.backbone.blocks[0].span.fraction  # the learner may re-home parameters
    assert not torch.equal(after.detach(), before)


def test_errors_name_the_bad_value():
    with pytest.raises(ValueError, match="needs memory >= 1, got 0"):
        make(memory=0)
    with pytest.raises(ValueError, match="span_ramp must be >= 1, got 0"):
        BlockConfig(dim=D, heads=H, adaptive_span=True, span_ramp=0)
    with pytest.raises(ValueError, match="Universal Transformer takes adaptive_span=false"):
        build_backbone("universal", D, None, H, M, adaptive_span=True)
    env = make_torch_env("stateless_cartpole", 1)
    with pytest.raises(ValueError, match="span_coef .* must be >= 0, got -1"):
        MemoryAgent(
            env.single_observation_space,
            env.single_action_space,
            dim=D,
            heads=H,
            adaptive_span=True,
            span_coef=-1,
        )
