"""Mixed precision: every memory backbone trains under bfloat16 autocast.

On CPU the model code runs under ``torch.autocast("cpu", bfloat16)`` (the learner turns
autocast on only on CUDA, but the dtype rules the layers must follow are the same); on CUDA a
PPO update with ``amp=True`` runs end to end.
"""

from __future__ import annotations

import pytest
import torch

from rltrans.accel import Accel
from rltrans.agents.memory_agent import BACKBONES, MemoryAgent
from rltrans.buffers.rollout import RolloutBuffer
from rltrans.core.long_memory import LONG_MEMORIES
from rltrans.envs.torch_envs import make_torch_env
from rltrans.learners import PPOConfig, PPOLearner
from rltrans.runtime.actors import LocalActor

PPO = {"epochs": 1, "num_minibatches": 2, "clip_coef": 0.2, "vf_clip_coef": 0.2}
PPO |= {"ent_coef": 0.01, "vf_coef": 0.5, "normalize_advantages": True}
CASES = [(b, "none") for b in BACKBONES] + [(b, "linear") for b in ("gtrxl", "trxl", "trxl_i")]
# Every long memory on the default backbone, the default one ("mixed") included.
CASES += [("gtrxl", m) for m in LONG_MEMORIES if m not in ("none", "linear")]


def rollout(
    backbone: str, long_memory: str, device: str = "cpu", *, memory: int = 4, steps: int = 16
):
    """A small agent and one rollout of it on stateless CartPole (episodes end inside it)."""
    envs = make_torch_env("stateless_cartpole", 4, max_episode_steps=13, device=device)
    torch.manual_seed(0)
    kw = {} if long_memory == "none" else {"long_memory": long_memory}
    agent = MemoryAgent(
        envs.single_observation_space, envs.single_action_space, backbone=backbone,
        dim=32, heads=4, memory=memory, **kw,
    ).to(device)  # fmt: skip
    buffer = RolloutBuffer(steps, 4, steps // 2, device)
    actor = LocalActor(envs, agent, seed=0, device=device)
    actor.collect(buffer)
    buffer.compute_advantages(actor.bootstrap_value(), 0.99, 0.95)
    return agent, buffer


@pytest.mark.parametrize(("backbone", "long_memory"), CASES)
def test_bfloat16_autocast_matches_float32_and_gives_finite_gradients(backbone, long_memory):
    agent, buffer = rollout(backbone, long_memory)
    (batch,) = buffer.minibatches(1)
    log_prob, _, value, _ = agent.evaluate(batch.segment)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half_log_prob, entropy, half_value, _ = agent.evaluate(batch.segment)
    assert half_value.isfinite().all() and half_log_prob.isfinite().all()
    # bfloat16 keeps 8 bits of mantissa: outputs agree to a few parts in a hundred
    torch.testing.assert_close(half_log_prob.float(), log_prob, atol=0.05, rtol=0.05)
    torch.testing.assert_close(half_value.float(), value, atol=0.1, rtol=0.05)
    (half_log_prob.float().mean() + half_value.float().mean() + entropy.float().mean()).backward()
    grads = [p.grad for p in agent.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 and g.isfinite().all() for g in grads)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
@pytest.mark.parametrize(("backbone", "long_memory"), CASES)
def test_ppo_update_with_amp_on_cuda(backbone, long_memory):
    agent, buffer = rollout(backbone, long_memory, device="cuda")
    before = [p.detach().clone() for p in agent.parameters()]
    learner = PPOLearner(agent, PPOConfig(**PPO, lr=1e-3, amp=True), total_updates=2)
    assert learner.amp
    metrics = learner.update(buffer)
    assert all(torch.as_tensor(v).isfinite().all() for v in metrics.values())
    assert any(not torch.equal(a, p) for a, p in zip(before, agent.parameters(), strict=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
def test_compiled_ppo_update_with_amp_on_cuda():
    """The compiled learner under bfloat16 autocast, with the default backbone, position and
    long memory and a window of 32: on CPU, Inductor's code for this step (reachable only by
    forcing autocast there) gave non-finite gradients where the eager step did not."""
    agent, buffer = rollout("gtrxl", "mixed", device="cuda", memory=32, steps=128)
    accel = Accel()
    accel.use_compiled(True)
    learner = PPOLearner(agent, PPOConfig(**PPO, lr=1e-3, amp=True), total_updates=2, accel=accel)
    metrics = learner.update(buffer)
    assert all(torch.as_tensor(v).isfinite().all() for v in metrics.values())
    assert all(p.isfinite().all() for p in agent.parameters())
