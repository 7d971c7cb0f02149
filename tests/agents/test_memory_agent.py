"""MemoryAgent with the Universal Transformer (agent=ut_act): ponder loss and its gradient,
halting decisions that agree between acting and training, config errors, a short CLI run whose
TensorBoard events hold the ponder scalars and the ponder-step histogram."""

from __future__ import annotations

import copy
import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from rltrans import load_policy
from rltrans.agents.memory_agent import MemoryAgent
from rltrans.backbones.universal import UniversalTransformer
from rltrans.buffers.rollout import RolloutBuffer
from rltrans.config import load_config
from rltrans.core.block import BlockConfig
from rltrans.core.position import sinusoid
from rltrans.envs.torch_envs import make_torch_env
from rltrans.learners import PPOConfig, PPOLearner
from rltrans.registry import build_agent
from rltrans.runtime.actors import LocalActor
from rltrans.train import main as train_main
from tests.cli.test_train import TINY

S = 4  # max_steps
PPO = {
    "epochs": 2,
    "num_minibatches": 2,
    "clip_coef": 0.2,
    "vf_clip_coef": 0.2,
    "ent_coef": 0.01,
    "vf_coef": 0.5,
    "normalize_advantages": True,
}


def ut_agent(envs, tau: float | None = 0.05, **kw) -> MemoryAgent:
    agent = MemoryAgent(
        envs.single_observation_space,
        envs.single_action_space,
        backbone="universal",
        dim=16,
        heads=2,
        memory=8,
        max_steps=S,
        tau=tau,
        **kw,
    )
    spread_halting(agent, rollout(agent, envs, steps=16).obs)
    return agent


def spread_halting(agent: MemoryAgent, obs: torch.Tensor) -> None:
    """Make tokens halt at different depths, so that the ACT tests test something.

    At initialisation the token encodings are small next to the depth signal and every token
    halts at the same step; louder encodings and halting weights, plus the halting bias that
    spreads the halting steps of ``obs`` (T, N, ...) most evenly, fix that.
    """
    with torch.no_grad():
        for layer in (agent.encoder.net[0], agent.encoder.net[2]):
            layer.weight.mul_(10.0)
        unit = agent.backbone.halting.unit
        unit.weight.normal_(std=1.0)
        x = agent.encoder(obs.transpose(0, 1))  # (N, T, D)

        def evenness(bias: float) -> float:
            unit.bias.fill_(bias)
            steps = agent.backbone(x)[2]["ponder_steps"].long()
            p = torch.bincount(steps.flatten(), minlength=S + 1).float() / steps.numel()
            return -(p * p.clamp_min(1e-9).log()).sum().item()  # entropy of the N histogram

        unit.bias.fill_(max(np.linspace(-4.0, 4.0, 33), key=evenness))


def rollout(agent, envs, steps: int = 24, segment_length: int = 8) -> RolloutBuffer:
    buffer = RolloutBuffer(steps, envs.num_envs, segment_length, "cpu")
    actor = LocalActor(envs, agent, seed=0, device="cpu")
    actor.collect(buffer)
    buffer.compute_advantages(actor.bootstrap_value(), 0.99, 0.95)
    return buffer


@pytest.fixture
def envs():
    return make_torch_env("stateless_cartpole", 3, max_episode_steps=11)


def test_ponder_loss_and_statistics_match_the_backbone(envs):
    agent = ut_agent(envs, tau=0.05)
    (batch,) = rollout(agent, envs).minibatches(1)
    seg = batch.segment
    _, _, _, aux = agent.evaluate(seg)
    _, _, raw = agent.backbone(agent.encoder(seg.obs), seg.memory, starts=seg.starts)
    torch.testing.assert_close(aux["loss_ponder"], 0.05 * raw["ponder_cost"].mean())
    torch.testing.assert_close(aux["ponder_steps"], raw["ponder_steps"])
    steps = raw["ponder_steps"]
    assert aux["ponder_mean"].item() == pytest.approx(steps.mean().item())
    assert aux["ponder_max"].item() == steps.max().item()
    assert len(steps.unique()) >= 2 and steps.min() >= 1 and steps.max() <= S
    torch.testing.assert_close(aux["halt_prob_mean"], raw["halt_prob_mean"].mean())
    assert all(v.dim() == 0 for k, v in aux.items() if k != "ponder_steps")


def test_ponder_loss_gradient_reaches_the_halting_unit_and_not_the_heads(envs):
    """loss_ponder trains the halting unit (through the remainders R) and the shared block,
    never the policy and value heads."""
    agent = ut_agent(envs)
    (batch,) = rollout(agent, envs).minibatches(1)
    agent.evaluate(batch.segment)[3]["loss_ponder"].backward()
    unit = agent.backbone.halting.unit
    assert unit.weight.grad.abs().sum() > 0 and unit.bias.grad.abs().item() > 0
    assert any(
        p.grad is not None and p.grad.abs().sum() > 0 for p in agent.backbone.block.parameters()
    )
    for head in (agent.policy, agent.value):
        assert all(p.grad is None for p in head.parameters())


def test_zero_tau_gives_a_zero_ponder_loss(envs):
    agent = ut_agent(envs, tau=0.0)
    (batch,) = rollout(agent, envs).minibatches(1)
    assert agent.evaluate(batch.segment)[3]["loss_ponder"].item() == 0.0


def test_acting_and_training_halt_at_the_same_depth(envs):
    """Replay fidelity holds for the ACT decisions themselves: N per token from step() equals
    N per token from the segment forward, in float32, across episode ends."""
    agent = ut_agent(envs)
    buffer = rollout(agent, envs, steps=24, segment_length=24)
    (batch,) = buffer.minibatches(1)
    seg = batch.segment
    state = agent.initial_state(envs.num_envs)
    x = agent.encoder(seg.obs)  # (N, T, D): one segment per env, in env order
    acted = []
    for t in range(x.shape[1]):
        _, state, aux = agent.backbone.step(x[:, t], state, seg.starts[:, t])
        acted.append(aux["ponder_steps"])
    acted = torch.stack(acted, 1)  # (N, T)
    assert seg.starts[:, 1:].any()  # an episode ends inside the segment
    assert len(acted.unique()) >= 2  # tokens halt at different depths
    assert torch.equal(acted, agent.evaluate(seg)[3]["ponder_steps"])


def test_learner_logs_ponder_scalars_and_gathers_steps_once_per_token(envs):
    agent = ut_agent(envs)
    buffer = rollout(agent, envs)
    learner = PPOLearner(agent, PPOConfig(**PPO, lr=1e-3), total_updates=1)
    metrics = learner.update(buffer)
    assert {"loss_ponder", "ponder_mean", "ponder_max", "halt_prob_mean"} <= set(metrics)
    assert all(v.dim() == 0 for v in metrics.values())
    steps = learner.distributions["ponder_steps"]
    assert steps.shape == (24 * envs.num_envs,)  # every token once, although epochs = 2
    assert steps.min() >= 1 and steps.max() <= S


def test_agent_copies_keep_the_ponder_loss(envs):
    """The build-time aux choice is a partial of a module-level function: copies keep it."""
    agent = ut_agent(envs, tau=0.5)
    (batch,) = rollout(agent, envs).minibatches(1)
    twin = copy.deepcopy(agent)
    torch.testing.assert_close(
        twin.evaluate(batch.segment)[3]["loss_ponder"],
        agent.evaluate(batch.segment)[3]["loss_ponder"],
    )


def test_options_that_do_not_apply_fail_loudly(envs):
    spaces = (envs.single_observation_space, envs.single_action_space)
    with pytest.raises(ValueError, match="only applies to backbone 'universal'"):
        MemoryAgent(*spaces, backbone="gtrxl", dim=16, layers=1, heads=2, memory=4, tau=0.1)
    with pytest.raises(ValueError, match="has no layers.*max_steps"):
        MemoryAgent(*spaces, backbone="universal", dim=16, layers=2, heads=2, memory=4)
    with pytest.raises(ValueError, match="tau .* must be >= 0"):
        MemoryAgent(*spaces, backbone="universal", dim=16, heads=2, memory=4, tau=-1.0)
    with pytest.raises(ValueError, match="unknown backbone 'universe'; valid choices"):
        MemoryAgent(*spaces, backbone="universe", dim=16, heads=2, memory=4)
    with pytest.raises(ValueError, match=r"options \['max_steps'\] do not apply to .*'gtrxl'"):
        MemoryAgent(*spaces, backbone="gtrxl", dim=16, layers=1, heads=2, memory=4, max_steps=3)
    with pytest.raises(ValueError, match=r"unknown options \['layer'\] for backbone 'universal'"):
        MemoryAgent(*spaces, backbone="universal", dim=16, heads=2, memory=4, layer=3)
    with pytest.raises(ValueError, match=r"only apply to transformer backbones, not 'lstm'"):
        MemoryAgent(*spaces, backbone="lstm", dim=16, position="xl")
    with pytest.raises(ValueError, match="BlockConfig.gate: unknown gate 'lstm'"):
        MemoryAgent(*spaces, backbone="trxl", dim=16, heads=2, memory=4, gate="lstm")


@pytest.mark.parametrize("position", ["xl", "sinusoidal"])
def test_coordinate_scale_multiplies_the_coordinate_embedding(position):
    """With halting off, H^t = Block(H^{t-1} + c P^t): c scales the depth sinusoid and the
    absolute position signal alike (Dehghani et al. 2019 eq. 1 with P^t scaled)."""
    torch.manual_seed(0)
    c, d, length = 0.1, 16, 6
    config = BlockConfig(dim=d, heads=2, position=position)
    ut = UniversalTransformer(config, max_steps=3, halting="none", coordinate_scale=c)
    ut = ut.double().eval()
    x = torch.randn(2, length, d, dtype=torch.float64)
    positions = torch.arange(length).expand(2, length)
    absolute = ut.input_position(positions).double() if ut.input_position is not None else 0.0
    mask = torch.ones(length, length, dtype=torch.bool).tril().view(1, 1, length, length)
    h = x
    for t in range(1, 4):
        h, *_ = ut.block(h + c * (absolute + sinusoid(torch.tensor(t), d).double()), None, mask)
    torch.testing.assert_close(ut(x)[0], ut.final_norm(h))
    with pytest.raises(ValueError, match="coordinate_scale must be >= 0"):
        UniversalTransformer(config, coordinate_scale=-1.0)


def test_ut_act_config_builds_the_documented_backbone(envs):
    cfg = load_config(["agent=ut_act"]).agent
    spaces = (envs.single_observation_space, envs.single_action_space)
    agent = build_agent(load_config(["agent=ut_act"]).agent, *spaces)
    ut = agent.backbone
    assert isinstance(ut, UniversalTransformer) and ut.ponders and not ut.pure_step
    assert (ut.dim, ut.heads, ut.memory, ut.max_steps) == (
        cfg.dim,
        cfg.heads,
        cfg.memory,
        cfg.max_steps,
    )
    assert ut.coordinate_scale == cfg.coordinate_scale < 1.0
    config = ut.config  # every block option of the YAML reached the BlockConfig
    for knob in ("position", "gate", "gate_bias", "norm", "sublayer_activation", "ff_mult"):
        assert getattr(config, knob) == cfg[knob], knob
    assert (config.dropout, config.kernel) == (cfg.dropout, cfg.kernel)
    assert agent.training_aux.keywords == {"tau": cfg.tau}


@pytest.mark.cli
def test_ut_act_trains_through_the_cli_and_logs_ponder_to_tensorboard(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    args = [
        "agent=ut_act",
        "env.num_envs=4",
        "algo.num_steps=16",
        "algo.segment_length=8",
        "algo.num_minibatches=2",
        "algo.epochs=2",
        "agent.dim=16",
        "agent.heads=2",
        "agent.memory=8",
        "agent.max_steps=3",
        "total_steps=192",
        "progress=false",
        "torch_threads=1",
        f"run_dir={run}",
    ]
    assert train_main(args) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    summary = json.loads(lines[-1])
    assert summary["status"] == "finished" and summary["updates"] == 3

    events = EventAccumulator(str(run / "tb"), size_guidance={"histograms": 0, "scalars": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    names = ("loss_ponder", "ponder_mean", "ponder_max", "halt_prob_mean")
    assert {f"losses/{n}" for n in names} <= scalars
    for entry in events.Scalars("losses/ponder_mean"):
        assert 1.0 <= entry.value <= 3.0
    histograms = events.Histograms("charts/ponder_steps")
    assert len(histograms) == 3  # once per update
    for entry in histograms:
        assert entry.histogram_value.num == 4 * 16  # every token of the rollout once
        assert 1.0 <= entry.histogram_value.min <= entry.histogram_value.max <= 3.0

    policy = load_policy(run)  # the checkpoint rebuilds the UT agent from its config
    state = policy.initial_state(2)
    action, state = policy.act(np.zeros((2, 4), np.float32), state, np.ones(2, dtype=bool))
    assert action.shape == (2,)


def test_observation_norm_matches_numpy_statistics():
    from rltrans.agents.memory_agent import ObservationNorm

    norm = ObservationNorm((3,))
    rng = np.random.default_rng(0)
    chunks = [rng.normal([1.0, -2.0, 5.0], [0.5, 2.0, 3.0], size=(64, 3)) for _ in range(5)]
    for chunk in chunks:
        norm.update(torch.tensor(chunk, dtype=torch.float32).view(8, 8, 3))  # any leading dims
    data = np.concatenate(chunks)
    np.testing.assert_allclose(norm.mean.numpy(), data.mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(norm.var.numpy(), data.var(0), rtol=1e-4)
    x = torch.tensor([[data.mean(0)[0], -2.0, 5.0 + 1e6]], dtype=torch.float32)
    out = norm(x)
    assert abs(out[0, 0]) < 1e-4 and out[0, 2] == 10.0  # centred, and clipped at +-10


def test_normalized_agent_keeps_replay_fidelity_and_checkpoints_its_stats(tmp_path, capsys):

    envs = make_torch_env("stateless_cartpole", 4, max_episode_steps=13)
    agent = MemoryAgent(
        envs.single_observation_space,
        envs.single_action_space,
        backbone="gtrxl",
        dim=16,
        layers=1,
        heads=2,
        memory=8,
        normalize_obs=True,
    )
    buffer = RolloutBuffer(16, 4, 8, "cpu")
    actor = LocalActor(envs, agent, seed=0, device="cpu")
    actor.collect(buffer)
    agent.update_obs_norm(buffer.obs)  # stats move between rollouts, never within one
    assert agent.obs_norm.count > 60
    actor.collect(buffer)
    (batch,) = buffer.minibatches(1)
    log_prob, _, _, _ = agent.evaluate(batch.segment)
    torch.testing.assert_close(log_prob, batch.log_probs, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="normalize_obs=true needs a 1-D float Box"):
        MemoryAgent(gym.spaces.Discrete(3), gym.spaces.Discrete(2), normalize_obs=True)

    run = tmp_path / "run"
    args = [*TINY, "env=stateless_cartpole", "agent.normalize_obs=true", "total_steps=128"]
    args.append(f"run_dir={run}")

    assert train_main(args) == 0
    policy = load_policy(run)
    assert policy.agent.obs_norm.count > 100  # the statistics came back with the weights


def test_value_init_gain_starts_the_critic_near_zero(envs):
    """A gtrxl stack's output is layer-normalised (rms ~1), so with gain 1 its first values are
    O(1); agent.value_init_gain=0.01 starts them within a hundredth of that, and changes no
    other weight. Zero or less is refused, naming the key."""
    values = {}
    for gain in (1.0, 0.01):
        cfg = load_config(["agent=gtrxl", f"agent.value_init_gain={gain}"]).agent
        torch.manual_seed(0)
        options = {k: v for k, v in cfg.items() if k not in ("kind", "horizon")}
        agent = MemoryAgent(envs.single_observation_space, envs.single_action_space, **options)
        buffer = rollout(agent, envs)
        values[gain] = (buffer.values, agent)
    big, small = values[1.0][0].abs().mean(), values[0.01][0].abs().mean()
    assert big > 0.1 and small < big / 50
    (_, a), (_, b) = values[1.0], values[0.01]
    for (name, x), y in zip(a.named_parameters(), b.parameters(), strict=True):
        if not name.startswith("value."):
            assert torch.equal(x, y), name
    with pytest.raises(ValueError, match=r"value_init_gain=0: expected a number > 0"):
        MemoryAgent(envs.single_observation_space, envs.single_action_space, value_init_gain=0)
