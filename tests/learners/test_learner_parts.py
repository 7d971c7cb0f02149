"""PPO minibatches split into parts (algo.chunk_obs_mb, or torch_threads=auto's streams): the
same gradient step as one pass."""

import copy
import threading

import pytest
import torch

from rltrans.accel import Accel, draws_random
from rltrans.accel.chunks import part_count
from rltrans.accel.threads import Plan, ThreadTuner
from rltrans.agents.memory_agent import MemoryAgent
from rltrans.buffers.rollout import RolloutBuffer
from rltrans.envs.torch_envs import make_torch_env
from rltrans.learners import NonFiniteLossError, PPOConfig, PPOLearner
from rltrans.runtime.actors import LocalActor
from tests.runtime.test_rollout import DEPTH, PPO, small_agent


def rollout(backbone: str) -> tuple[torch.nn.Module, RolloutBuffer]:
    """An agent and a filled rollout of 6 envs x 24 steps (segments of 4: 36 segments)."""
    torch.manual_seed(0)
    envs = make_torch_env("stateless_cartpole", 6, max_episode_steps=13)
    agent = small_agent(envs, backbone)
    buffer = RolloutBuffer(24, 6, 4, "cpu")
    actor = LocalActor(envs, agent, seed=0, device="cpu")
    actor.collect(buffer)
    buffer.compute_advantages(actor.bootstrap_value(), 0.99, 0.95)
    return agent, buffer


@pytest.mark.parametrize("backbone", ["gtrxl", "universal", "lstm"])
def test_parts_give_the_whole_minibatch_step(backbone):
    """Two epochs of 2 minibatches, each in 1 pass or in parts: same weights, same metrics,
    same per-token aux values (ACT's ponder steps)."""
    agent, buffer = rollout(backbone)
    ppo = {**PPO, "epochs": 2, "num_minibatches": 2}
    results = {}
    for name, chunk_mb in (("whole", None), ("parts", 1e-9)):
        model = copy.deepcopy(agent)
        accel = Accel(chunk_obs_mb=chunk_mb)
        learner = PPOLearner(model, PPOConfig(**ppo, lr=1e-3), total_updates=2, accel=accel)
        batch = next(buffer.minibatches(2))
        assert part_count(batch, accel.chunk_bytes) == (1 if chunk_mb is None else 18)  # 18 each
        metrics = learner.update(buffer, torch.Generator().manual_seed(3))
        results[name] = (model, metrics, learner.distributions)
    (whole, m_whole, d_whole), (parts, m_parts, d_parts) = results["whole"], results["parts"]
    for (name, a), b in zip(whole.named_parameters(), parts.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5, msg=name)
    assert m_whole.keys() == m_parts.keys()
    for k in m_whole:
        torch.testing.assert_close(m_whole[k], m_parts[k], atol=1e-5, rtol=1e-5, msg=k)
    assert d_whole.keys() == d_parts.keys()
    for k in d_whole:
        assert torch.equal(d_whole[k], d_parts[k]), k


def test_parts_are_the_fewest_that_fit():
    """The count divides the segments and is the smallest whose float obs fit the budget."""
    _, buffer = rollout("gtrxl")
    batch = next(buffer.minibatches(1))  # 36 segments x 4 steps x 2 floats = 1,152 bytes
    assert Accel(chunk_obs_mb=300 / 2**20).chunk_bytes == 300
    assert part_count(batch, 300.0) == 4  # 1152 / 300 -> at least 4; 4 divides 36
    assert part_count(batch, 250.0) == 6  # at least 5 -> 6, the next divisor of 36
    assert part_count(batch, 2000.0) == 1


@pytest.mark.parametrize("bad", [0, -1.5])
def test_bad_chunk_size_is_named(bad):
    with pytest.raises(ValueError, match=rf"algo.chunk_obs_mb={bad} must be a positive"):
        Accel(chunk_obs_mb=bad)


def streams_learner(model: torch.nn.Module, plan: Plan, chunk_mb: float | None = None):
    """A learner whose thread tuner has settled on ``plan``."""
    settings = PPOConfig(**{**PPO, "epochs": 2, "num_minibatches": 2}, lr=1e-3)
    learner = PPOLearner(model, settings, total_updates=2, accel=Accel(chunk_obs_mb=chunk_mb))
    tuner = learner.accel.threads = ThreadTuner("learner step", (1, 2), streams=True)
    tuner.load_state_dict({"chosen": plan.threads, "streams": plan.streams})
    assert tuner.chosen_plan == plan
    return learner


@pytest.mark.parametrize("backbone", ["gtrxl", "universal"])
@pytest.mark.parametrize("chunk_mb", [None, 1e-9])
def test_streams_give_the_whole_minibatch_step(backbone, chunk_mb):
    """Minibatches in parts run side by side on two threads (torch_threads=auto's plan in
    streams), alone or with chunk_obs_mb: the same step as one pass, and the same to the
    bit in every run (the side parts' gradients are summed in part order)."""
    agent, buffer = rollout(backbone)
    runs = {}
    for name, plan in (("one pass", Plan(1)), ("streams", Plan(1, 2)), ("again", Plan(1, 2))):
        model = copy.deepcopy(agent)
        learner = streams_learner(model, plan, None if name == "one pass" else chunk_mb)
        metrics = learner.update(buffer, torch.Generator().manual_seed(3))
        runs[name] = (model, metrics, learner.distributions)
    (whole, m_whole, d_whole), (model, metrics, dists) = runs["one pass"], runs["streams"]
    for (name, a), b in zip(whole.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5, msg=name)
    for k in m_whole:
        torch.testing.assert_close(m_whole[k], metrics[k], atol=1e-5, rtol=1e-5, msg=k)
    assert d_whole.keys() == dists.keys()
    for k in d_whole:
        assert torch.equal(d_whole[k], dists[k]), k
    same = list(map(torch.equal, model.parameters(), runs["again"][0].parameters()))
    assert all(same)  # bit for bit, run after run
    assert not all(map(torch.equal, model.parameters(), whole.parameters()))  # a real split


def test_streams_use_worker_threads_with_the_plan_s_thread_count():
    """The side part runs on a worker thread with one torch thread while the first runs here."""
    agent, buffer = rollout("gtrxl")
    learner = streams_learner(agent, Plan(1, 2))
    seen = []
    original = learner.minibatch_loss

    def spy(batch):
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return original(batch)

    learner.minibatch_loss = spy
    learner.update(buffer, torch.Generator().manual_seed(3))
    names = {name.split("_")[0] for name, _ in seen}
    assert names == {"MainThread", "rltrans-stream"}, seen
    assert {n for _, n in seen} == {1} and len(seen) == 2 * 2 * 2  # epochs x minibatches x 2


def test_a_non_finite_side_part_stops_before_the_weights_change():
    agent, buffer = rollout("gtrxl")
    learner = streams_learner(agent, Plan(1, 2))
    before = [p.detach().clone() for p in agent.parameters()]
    original = learner.minibatch_loss

    def poisoned(batch):
        loss, metrics, aux = original(batch)
        side = threading.current_thread() is not threading.main_thread()
        return (loss * float("nan") if side else loss), metrics, aux

    learner.minibatch_loss = poisoned
    with pytest.raises(NonFiniteLossError, match="non-finite"):
        learner.update(buffer, torch.Generator().manual_seed(3))
    assert all(torch.equal(a, b) for a, b in zip(before, agent.parameters(), strict=True))


@pytest.mark.parametrize("backbone", ["gtrxl", "universal"])
def test_models_with_dropout_are_never_split_into_streams(backbone):
    """Parts on several threads would draw dropout masks from one generator in racing order,
    so a model with dropout > 0 (residual or attention) is never offered streams."""
    envs = make_torch_env("stateless_cartpole", 2)
    assert not draws_random(small_agent(envs, backbone))
    for kwargs in ({"dropout": 0.1}, {"attn_dropout": 0.1}):
        agent = MemoryAgent(
            envs.single_observation_space, envs.single_action_space, backbone=backbone,
            dim=16, heads=2, memory=4, **DEPTH.get(backbone, {"layers": 1}), **kwargs,
        )  # fmt: skip
        assert draws_random(agent), kwargs


def test_a_minibatch_out_of_device_memory_is_retried_in_parts(monkeypatch, capsys):
    """A loss that runs out of device memory above 6 segments: the minibatch of 18 segments
    is retried in 2 parts (9 segments each), then in 6 (the first divisor of 18 from twice
    2), and the step equals the whole minibatch's."""
    agent, buffer = rollout("gtrxl")
    ppo = PPOConfig(**{**PPO, "epochs": 1, "num_minibatches": 2}, lr=1e-3)
    results = {}
    for name in ("whole", "short of memory"):
        model = copy.deepcopy(agent)
        learner = PPOLearner(model, ppo, total_updates=2, accel=Accel())
        if name != "whole":
            plain = learner.minibatch_loss

            def limited(batch, plain=plain):
                if batch.mask.shape[0] > 6:
                    raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
                return plain(batch)

            monkeypatch.setattr(learner, "minibatch_loss", limited)
        learner.update(buffer, torch.Generator().manual_seed(3))
        results[name] = (model, learner.accel.min_parts)
    (whole, _), (retried, parts) = results["whole"], results["short of memory"]
    assert parts == 6  # 18 segments: 1 -> 2 (9 each) -> 6 (3 each), kept for the next one
    for (name, a), b in zip(whole.named_parameters(), retried.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5, msg=name)
    err = capsys.readouterr().err
    assert "out of device memory on a minibatch of 18 segments in 1 part(s)" in err
    assert "now computed in 2 parts" in err and "now computed in 6 parts" in err


def test_a_single_segment_out_of_device_memory_is_not_hidden():
    agent, buffer = rollout("gtrxl")
    learner = PPOLearner(agent, PPOConfig(**PPO, lr=1e-3), total_updates=1, accel=Accel())

    def always(batch):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    learner.minibatch_loss = always
    batch = next(buffer.minibatches(36))  # one segment
    with pytest.raises(torch.cuda.OutOfMemoryError):
        learner.accel.gradient(learner.minibatch_loss, batch, learner)
