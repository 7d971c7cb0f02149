"""agent=mlp_continuous (and algo=ppo_continuous): CleanRL's PPO-for-MuJoCo settings as one
preset, a critic that shares no weight with the policy (gradient isolation, the same values
acting and training), its errors, and a run from the command line that evaluates."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from rltrans.agents.memory_agent import MemoryAgent
from rltrans.config import load_config
from rltrans.evaluate import main as evaluate_main
from rltrans.train import main as train_main
from rltrans.types import Segment

PENDULUM = ["env=gym", "env.id=Pendulum-v1", "env.num_envs=1"]


def test_the_preset_is_cleanrls_recipe():
    """2048-step rollouts, 10 epochs of 32 minibatches, lr 3e-4 annealed, GAE 0.95, clip 0.2
    (policy and value), no entropy bonus, grad norm 0.5; observations normalised, tanh 64 x 64,
    a separate critic."""
    cfg = load_config(["agent=mlp_continuous", *PENDULUM])
    algo, agent = cfg.algo, cfg.agent
    assert (algo.num_steps, algo.segment_length, algo.epochs, algo.num_minibatches) == (
        2048, 1, 10, 32,
    )  # fmt: skip
    assert (algo.lr, algo.anneal_lr, algo.gamma, algo.gae_lambda) == (3e-4, True, 0.99, 0.95)
    assert (algo.clip_coef, algo.vf_clip_coef, algo.ent_coef, algo.vf_coef) == (0.2, 0.2, 0.0, 0.5)
    assert algo.max_grad_norm == 0.5 and algo.reward_scaling and algo.normalize_advantages
    assert agent.backbone == "mlp" and agent.dim == 64 and agent.layers == 1
    assert agent.normalize_obs and agent.critic == "separate"
    assert agent.encoder.activation == "tanh" and agent.encoder.hidden_dim == 64
    # algo=<name> still overrides the algo the agent selects
    assert load_config(["agent=mlp_continuous", "algo=ppo", *PENDULUM]).algo.epochs == 4


def _agent(critic: str) -> MemoryAgent:
    env = gym.make("Pendulum-v1")
    torch.manual_seed(0)
    return MemoryAgent(
        env.observation_space, env.action_space, backbone="mlp", dim=16, layers=1,
        normalize_obs=True, critic=critic,
    )  # fmt: skip


def _segment(agent: MemoryAgent, n: int = 6) -> Segment:
    obs = torch.randn(n, 1, 3)
    return Segment(
        obs=obs, actions=torch.randn(n, 1, 1), starts=torch.zeros(n, 1, dtype=torch.bool),
        memory=agent.backbone.empty_memory(n),
    )  # fmt: skip


def test_a_separate_critic_shares_no_weight_with_the_policy():
    """The value's gradient reaches only the critic's tower and head, the policy's only the
    policy's; with critic=shared the value's reaches the shared encoder."""
    agent = _agent("separate")
    agent.update_obs_norm(torch.randn(32, 3))
    critic = {id(p) for p in [*agent.critic_net.parameters(), *agent.value.parameters()]}
    log_prob, _, value, _ = agent.evaluate(_segment(agent))
    for loss, own in ((value.sum(), True), (log_prob.sum(), False)):
        agent.zero_grad(set_to_none=True)
        loss.backward(retain_graph=True)
        touched = {id(p) for p in agent.parameters() if p.grad is not None and p.grad.any()}
        assert touched and (touched <= critic if own else not touched & critic)
    shared = _agent("shared")
    _, _, value, _ = shared.evaluate(_segment(shared))
    value.sum().backward()
    assert shared.encoder.net[0].weight.grad.abs().sum() > 0


def test_a_separate_critic_gives_the_same_values_acting_and_training():
    agent = _agent("separate")
    agent.update_obs_norm(torch.randn(32, 3))
    segment = _segment(agent)
    out, _ = agent.act(segment.obs[:, 0], agent.initial_state(6), torch.ones(6, dtype=torch.bool))
    _, _, value, _ = agent.evaluate(segment)
    torch.testing.assert_close(out.value, value[:, 0])
    torch.testing.assert_close(agent.peek_value(segment.obs[:, 0], ()), value[:, 0])


def test_a_separate_critic_needs_the_memoryless_backbone():
    env = gym.make("Pendulum-v1")
    spaces = env.observation_space, env.action_space
    with pytest.raises(ValueError, match=r"critic='separate' needs backbone 'mlp', not 'gru'"):
        MemoryAgent(*spaces, backbone="gru", dim=8, layers=1, critic="separate")
    with pytest.raises(ValueError, match=r"critic.*'own'.*shared.*separate"):
        MemoryAgent(*spaces, backbone="mlp", dim=8, layers=1, critic="own")


@pytest.mark.cli
def test_the_preset_trains_and_evaluates_from_the_command_line(tmp_path, capsys):
    run = tmp_path / "run"
    args = ["agent=mlp_continuous", *PENDULUM, "algo.num_steps=256", "algo.num_minibatches=4"]
    quiet = ["progress=false", "compile=false", "torch_threads=1", "tensorboard=false"]
    assert train_main([*args, *quiet, "total_steps=1024", f"run_dir={run}"]) == 0
    assert evaluate_main([f"checkpoint={run}", "episodes=2", "progress=false"]) == 0
    assert '"mean_return"' in capsys.readouterr().out
