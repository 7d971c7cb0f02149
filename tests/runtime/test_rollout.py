"""Acting loop, rollout buffer and PPO learner together: replay fidelity, autoreset, truncation."""

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

from rltrans.agents.memory_agent import MemoryAgent
from rltrans.buffers.rollout import RolloutBuffer
from rltrans.envs.gym_vec import make_vector_env
from rltrans.envs.torch_envs import make_torch_env
from rltrans.learners import PPOConfig, PPOLearner
from rltrans.runtime.actors import LocalActor
from rltrans.types import tree_map

PPO = {
    "epochs": 1,
    "num_minibatches": 1,
    "clip_coef": 0.2,
    "vf_clip_coef": 0.2,
    "ent_coef": 0.01,
    "vf_coef": 0.5,
    "normalize_advantages": True,
}


# Depth options: the Universal Transformer loops one block (max_steps), the others stack layers.
DEPTH = {"universal": {"max_steps": 3}}


def small_agent(envs, backbone, memory=8, **options):
    """A width-32, 4-head agent of two layers (``universal``: three steps) for ``envs``;
    ``options`` go to the backbone (e.g. long_memory, adaptive_span)."""
    agent = MemoryAgent(
        envs.single_observation_space,
        envs.single_action_space,
        backbone=backbone,
        dim=32,
        heads=4,
        memory=memory,
        **DEPTH.get(backbone, {"layers": 2}),
        **options,
    )
    if backbone == "universal":
        # At initialisation the token encodings are small next to the depth signal, so every
        # token halts at the same step; louder encodings and halting weights spread the depths.
        with torch.no_grad():
            for layer in (agent.encoder.net[0], agent.encoder.net[2]):
                layer.weight.mul_(10.0)
        torch.nn.init.normal_(agent.backbone.halting.unit.weight, std=1.0)
    return agent


@pytest.mark.parametrize("backbone", ["gtrxl", "trxl", "trxl_i", "universal", "lstm", "mlp"])
@pytest.mark.parametrize("segment_length", [1, 8, 32])
def test_replay_fidelity(backbone, segment_length):
    """The learner's first pass recomputes the acting log-probs and values."""
    envs = make_torch_env("stateless_cartpole", 4, max_episode_steps=13)  # many episode ends
    agent = small_agent(envs, backbone)
    buffer = RolloutBuffer(32, 4, segment_length, "cpu")
    actor = LocalActor(envs, agent, seed=0, device="cpu")
    actor.collect(buffer)
    actor.collect(buffer)  # the second rollout starts with memory carried over
    assert buffer.starts.any() and buffer.truncated.any() and buffer.terminated.any()
    buffer.compute_advantages(actor.bootstrap_value(), 0.99, 0.95)
    (batch,) = buffer.minibatches(1)
    log_prob, _, value, aux = agent.evaluate(batch.segment)
    torch.testing.assert_close(log_prob, batch.log_probs, atol=1e-5, rtol=0)
    torch.testing.assert_close(value, batch.values, atol=1e-5, rtol=0)
    if "ponder_steps" in aux:  # ACT: replay is only a test if tokens halt at different depths
        assert len(aux["ponder_steps"].unique()) >= 2

    learner = PPOLearner(agent, PPOConfig(**PPO, lr=1e-3), total_updates=2)
    metrics = learner.update(buffer)
    assert abs(metrics["ratio_mean"].item() - 1.0) < 1e-5
    assert metrics["approx_kl"].item() < 1e-9
    assert metrics["clipfrac"].item() == 0.0

    # After an update acting must use the new weights everywhere: the acting state's cached
    # keys and per-step contexts (xl's W_kR R) are rebuilt by refresh_state at rollout start.
    actor.collect(buffer)
    buffer.compute_advantages(actor.bootstrap_value(), 0.99, 0.95)
    (batch,) = buffer.minibatches(1)
    log_prob, _, value, _ = agent.evaluate(batch.segment)
    torch.testing.assert_close(log_prob, batch.log_probs, atol=1e-5, rtol=0)
    torch.testing.assert_close(value, batch.values, atol=1e-5, rtol=0)


def test_memory_is_stored_once_per_segment():
    envs = make_torch_env("tmaze", 3)
    agent = small_agent(envs, "gtrxl", memory=6)
    buffer = RolloutBuffer(24, 3, 8, "cpu")
    LocalActor(envs, agent, seed=0, device="cpu").collect(buffer)
    assert len(buffer.memories) == 3
    assert buffer.memories[0].hidden.shape == (3, 2, 6, 32)  # (N, Y, M, D), per segment
    batches = list(buffer.minibatches(3))
    assert sum(b.segment.starts.shape[0] for b in batches) == 9  # 3 segments x 3 envs


def test_segments_reassemble_the_rollout():
    buffer = RolloutBuffer(6, 2, 3, "cpu")
    for t in range(6):
        if t % 3 == 0:
            buffer.record_memory(t, torch.zeros(2, 1))
        step = torch.tensor([2.0 * t, 2.0 * t + 1])  # value = 2 t + n
        buffer.record_step(t, step, torch.zeros(2, dtype=torch.bool), step, step, step)
    (batch,) = buffer.minibatches(1)
    assert sorted(batch.values.tolist()) == [[0, 2, 4], [1, 3, 5], [6, 8, 10], [7, 9, 11]]
    with pytest.raises(ValueError, match="multiple of segment_length"):
        RolloutBuffer(10, 2, 4, "cpu")


def test_gymnasium_autoreset_has_no_dummy_transition():
    """Every stored CartPole transition is real (reward 1) and the step after an episode end
    is flagged as an episode start; with NEXT_STEP autoreset there would be reward-0 steps."""
    envs = make_vector_env("CartPole-v1", 3, seed=0, env_kwargs={"max_episode_steps": 15})
    agent = small_agent(envs, "gtrxl")
    buffer = RolloutBuffer(40, 3, 8, "cpu")
    LocalActor(envs, agent, seed=0, device="cpu").collect(buffer)
    assert torch.all(buffer.rewards == 1.0)
    ended = buffer.terminated | buffer.truncated
    assert ended.any()
    assert torch.equal(buffer.starts[1:], ended[:-1])
    assert buffer.starts[0].all()  # the very first step starts every episode
    envs.close()


def test_truncation_bootstraps_from_final_observation():
    """final_values hold V(final obs) of the truncated episode, not of the next one's start."""
    envs = make_torch_env("stateless_cartpole", 4, max_episode_steps=7)
    agent = small_agent(envs, "mlp")  # memoryless, so V(final obs) is checkable directly
    buffer = RolloutBuffer(16, 4, 8, "cpu")
    infos = []
    LocalActor(envs, agent, seed=0, device="cpu").collect(buffer, on_info=infos.append)
    for t, info in enumerate(infos):
        trunc = buffer.truncated[t]
        if not trunc.any():
            assert torch.all(buffer.final_values[t] == 0)
            continue
        with torch.no_grad():
            expected = agent.value(agent.backbone.net(agent.encoder(info["final_obs"])))[:, 0]
        torch.testing.assert_close(buffer.final_values[t][trunc], expected[trunc])
    assert buffer.truncated.any()


def test_peek_value_leaves_memory_untouched():
    envs = make_torch_env("tmaze", 2)
    agent = small_agent(envs, "gtrxl")
    state = agent.initial_state(2)
    obs = torch.randn(2, 4)
    _, state = agent.act(obs, state, torch.ones(2, dtype=torch.bool))
    before = tree_map(torch.clone, state)
    agent.peek_value(obs, state)
    for a, b in zip(before, state, strict=True):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)


def test_dict_observations_flow_through_the_buffer():
    space = gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (3,)), "b": gym.spaces.Discrete(5)})
    agent = MemoryAgent(
        space, gym.spaces.Discrete(2), backbone="gtrxl", dim=16, layers=1, heads=2, memory=4
    )
    buffer = RolloutBuffer(4, 2, 2, "cpu")
    state = agent.initial_state(2)
    done = torch.ones(2, dtype=torch.bool)
    for t in range(4):
        obs = {"a": torch.randn(2, 3), "b": torch.tensor([t % 5, 1])}
        if t % 2 == 0:
            buffer.record_memory(t, agent.state_to_memory(state))
        out, state = agent.act(obs, state, done)
        buffer.record_step(t, obs, done, out.action, out.log_prob, out.value)
        buffer.record_outcome(t, np.ones(2), np.zeros(2, bool), np.zeros(2, bool), 0.0)
        done = torch.zeros(2, dtype=torch.bool)
    buffer.compute_advantages(torch.zeros(2), 0.99, 0.95)
    (batch,) = buffer.minibatches(1)
    log_prob, _, _, _ = agent.evaluate(batch.segment)
    torch.testing.assert_close(log_prob, batch.log_probs, atol=1e-5, rtol=0)


def test_min_advantage_std_keeps_near_zero_advantages_small():
    """After an update on real advantages, one on a rollout whose advantages are all ~0 (a
    corridor without reward): standardising scales that noise up to the size of the real
    signal and moves the weights by it; with ``min_advantage_std`` the weights end where
    advantages of exactly 0 leave them (Adam's momentum moves both alike)."""
    envs = make_torch_env("stateless_cartpole", 4, max_episode_steps=13)
    torch.manual_seed(0)
    agent = small_agent(envs, "mlp")
    buffer = RolloutBuffer(32, 4, 8, "cpu")
    actor = LocalActor(envs, agent, seed=0, device="cpu")
    actor.collect(buffer)
    buffer.compute_advantages(actor.bootstrap_value(), 0.99, 0.95)
    real = buffer.advantages.clone()
    noise = torch.randn_like(real) * 1e-4  # no signal
    weights = {}
    for name, floor, second in (
        ("zero", 0.0, noise * 0),
        ("raw", 0.0, noise),
        ("floor", 1.0, noise),
    ):
        model = copy.deepcopy(agent)
        ppo = {**PPO, "ent_coef": 0.0, "vf_coef": 0.0, "min_advantage_std": floor}
        settings = PPOConfig(**ppo, lr=1e-3, anneal_lr=False)
        learner = PPOLearner(model, settings, total_updates=2)
        for advantages in (real, second):
            buffer.advantages = advantages
            learner.update(buffer)
        weights[name] = torch.cat([p.detach().flatten() for p in model.parameters()])
    by_noise = (weights["raw"] - weights["zero"]).norm()
    assert (weights["floor"] - weights["zero"]).norm() < 0.01 * by_noise


@pytest.mark.parametrize("scope", ["minibatch", "rollout"])
def test_advantage_scope_standardises_over_the_minibatch_or_the_whole_rollout(scope):
    """One segment of the rollout holds a large advantage (a rare decision), the others only
    noise: per minibatch, each noise minibatch is scaled up to unit std; over the rollout, the
    noise stays small and the whole rollout is standardised once."""
    envs = make_torch_env("stateless_cartpole", 4, max_episode_steps=13)
    torch.manual_seed(0)
    agent = small_agent(envs, "mlp")
    buffer = RolloutBuffer(32, 4, 8, "cpu")
    LocalActor(envs, agent, seed=0, device="cpu").collect(buffer)
    raw = torch.randn(32, 4) * 1e-3
    raw[:8, 0] = 5.0  # segment 0 of env 0
    buffer.advantages = raw.clone()
    ppo = {**PPO, "num_minibatches": 4, "advantage_scope": scope}
    learner = PPOLearner(agent, PPOConfig(**ppo, lr=1e-4, anneal_lr=False), total_updates=1)
    seen = []
    loss_of = learner.minibatch_loss
    learner.minibatch_loss = lambda batch: seen.append(batch.advantages) or loss_of(batch)
    learner.update(buffer, torch.Generator().manual_seed(0))
    stds = sorted(float(a.std()) for a in seen)
    if scope == "minibatch":
        assert stds == pytest.approx([1.0] * 4, abs=1e-4)
    else:
        assert stds[:3] < [0.01] * 3 and stds[3] > 1.0
        expected = (raw - raw.mean()) / raw.std()
        got = torch.cat([a.flatten() for a in seen]).sort().values
        torch.testing.assert_close(got, expected.flatten().sort().values, atol=1e-4, rtol=0)


def test_advantage_scope_names_the_valid_values():
    """A misspelt scope is refused once, where the config is checked, naming the choices."""
    from rltrans.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"algo.advantage_scope.*batch.*minibatch.*rollout"):
        load_config(["algo.advantage_scope=batch"])
