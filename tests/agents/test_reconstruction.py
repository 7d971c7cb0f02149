"""Observation reconstruction (algo.reconstruction_coef): the decoders per observation space,
the aux loss of MemoryAgent and where its gradient goes, coef=0 building nothing, short PPO and
IMPALA runs whose logged reconstruction loss falls, and their checkpoints loading back (and one
written before the option, without it)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch.nn import functional as F

from rltrans import load_policy
from rltrans.agents.memory_agent import MemoryAgent
from rltrans.agents.reconstruction import (
    ContainerDecoder,
    DiscreteDecoder,
    ImageDecoder,
    MultiBinaryDecoder,
    MultiDiscreteDecoder,
    VectorDecoder,
    build_decoder,
)
from rltrans.buffers.rollout import RolloutBuffer
from rltrans.config import ConfigError, load_config
from rltrans.envs.torch_envs import make_torch_env
from rltrans.evaluate import main as evaluate_main
from rltrans.plot import read_curve
from rltrans.policy import agent_from_checkpoint
from rltrans.registry import RegistryError, algo_agent_options
from rltrans.run.checkpoint import load_checkpoint
from rltrans.runtime.actors import LocalActor
from rltrans.train import main as train_main
from tests.helpers.cli import TINY_PPO, summary_line

B, L, D = 2, 3, 16
FAST = ["torch_threads=1", "compile=false", "tensorboard=true"]


def samples(space: spaces.Space, n: int) -> torch.Tensor:
    """n observations of a Box / Discrete / MultiDiscrete / MultiBinary space, stacked."""
    space.seed(0)
    return torch.as_tensor(np.stack([np.asarray(space.sample()) for _ in range(n)]))


def batch_of(space: spaces.Space) -> torch.Tensor:
    """(B, L, *obs) observations."""
    x = samples(space, B * L)
    return x.reshape(B, L, *x.shape[1:])


# ------------------------------------------------------------------------------ decoders


def test_vector_decoder_is_the_mse_of_its_prediction():
    space = spaces.Box(-2.0, 2.0, (5,), np.float32)
    decoder = build_decoder(space, D)
    assert isinstance(decoder, VectorDecoder)
    h, obs = torch.randn(B, L, D), batch_of(space)
    assert decoder(h).shape == (B, L, 5)
    loss = decoder.loss(h, obs)
    assert loss.shape == (B, L)
    torch.testing.assert_close(loss, ((decoder(h) - obs) ** 2).mean(-1))


@pytest.mark.parametrize(
    "shape",
    [(7, 7, 3), (9, 10, 3), (4, 36, 36), (40, 37, 3), (8, 8)],
    ids=["minigrid-hwc", "odd-hwc", "framestack-chw", "nature-hwc", "hw"],
)
def test_image_decoder_returns_the_image_size_and_scales_targets(shape):
    """Transposed convolutions come back to exactly the image's size, in its own layout (the
    small and the Nature stack, odd sides too); targets are uint8 / 255."""
    space = spaces.Box(0, 255, shape, np.uint8)
    decoder = build_decoder(space, D)
    assert isinstance(decoder, ImageDecoder)
    h, obs = torch.randn(B, L, D), batch_of(space)
    prediction = decoder(h)
    assert prediction.shape == (B, L, *shape)
    loss = decoder.loss(h, obs)
    assert loss.shape == (B, L)
    expected = ((prediction - obs.float() / 255.0) ** 2).reshape(B, L, -1).mean(-1)
    torch.testing.assert_close(loss, expected)


def test_discrete_multidiscrete_and_multibinary_decoders_use_cross_entropy():
    h = torch.randn(B, L, D)
    discrete = spaces.Discrete(5, start=2)
    dec = build_decoder(discrete, D)
    obs = batch_of(discrete)
    assert isinstance(dec, DiscreteDecoder) and dec(h).shape == (B, L, 5)
    expected = F.cross_entropy(dec(h).reshape(-1, 5), (obs - 2).reshape(-1), reduction="none")
    torch.testing.assert_close(dec.loss(h, obs), expected.reshape(B, L))

    multi = spaces.MultiDiscrete([3, 4])
    dec = build_decoder(multi, D)
    obs = batch_of(multi)
    assert isinstance(dec, MultiDiscreteDecoder) and dec(h).shape == (B, L, 7)
    first, second = dec(h).split([3, 4], dim=-1)
    expected = (
        F.cross_entropy(first.reshape(-1, 3), obs[..., 0].reshape(-1), reduction="none")
        + F.cross_entropy(second.reshape(-1, 4), obs[..., 1].reshape(-1), reduction="none")
    ) / 2
    torch.testing.assert_close(dec.loss(h, obs), expected.reshape(B, L))

    bits = spaces.MultiBinary([2, 3])
    dec = build_decoder(bits, D)
    obs = batch_of(bits)
    assert isinstance(dec, MultiBinaryDecoder) and dec(h).shape == (B, L, 2, 3)
    expected = F.binary_cross_entropy_with_logits(dec(h), obs.float(), reduction="none")
    torch.testing.assert_close(dec.loss(h, obs), expected.reshape(B, L, -1).mean(-1))


def test_dict_and_tuple_decoders_sum_one_loss_per_entry():
    space = spaces.Dict(
        {
            "image": spaces.Box(0, 255, (7, 7, 3), np.uint8),
            "vector": spaces.Box(-1.0, 1.0, (2,), np.float32),
            "symbol": spaces.Discrete(3),
        }
    )
    decoder = build_decoder(space, D)
    assert isinstance(decoder, ContainerDecoder)
    assert sorted(decoder.decoders) == ["image", "symbol", "vector"]
    h = torch.randn(B, L, D)
    obs = {k: batch_of(sub) for k, sub in space.spaces.items()}
    prediction = decoder(h)
    assert prediction["image"].shape == (B, L, 7, 7, 3)
    assert prediction["vector"].shape == (B, L, 2) and prediction["symbol"].shape == (B, L, 3)
    parts = sum(decoder.decoders[k].loss(h, obs[k]) for k in space.spaces)
    torch.testing.assert_close(decoder.loss(h, obs), parts)

    pair = spaces.Tuple((spaces.Discrete(4), spaces.Box(-1.0, 1.0, (3,), np.float32)))
    decoder = build_decoder(pair, D)
    obs = tuple(batch_of(sub) for sub in pair.spaces)
    assert [p.shape for p in decoder(h)] == [(B, L, 4), (B, L, 3)]
    assert decoder.loss(h, obs).shape == (B, L)


# ------------------------------------------------------------------------------ the agent


def tmaze(num_envs: int = 3):
    return make_torch_env("tmaze", num_envs)


def agent_of(envs, seed: int = 0, **kw) -> MemoryAgent:
    torch.manual_seed(seed)
    return MemoryAgent(
        envs.single_observation_space,
        envs.single_action_space,
        backbone="gtrxl",
        dim=D,
        layers=1,
        heads=2,
        memory=8,
        **kw,
    )


def segment_of(agent: MemoryAgent, envs, steps: int = 16, segment_length: int = 8):
    """All segments of one rollout the agent acted, as one minibatch."""
    buffer = RolloutBuffer(steps, envs.num_envs, segment_length, "cpu")
    actor = LocalActor(envs, agent, seed=0, device="cpu")
    actor.collect(buffer)
    buffer.compute_advantages(actor.bootstrap_value(), 0.99, 0.95)
    (batch,) = buffer.minibatches(1)
    return batch.segment


def test_loss_is_in_aux_and_its_gradient_reaches_encoder_and_backbone():
    envs = tmaze()
    agent = agent_of(envs, reconstruction_coef=0.5, normalize_obs=True)
    assert isinstance(agent.decoder, VectorDecoder)
    seg = segment_of(agent, envs)
    agent.update_obs_norm(seg.obs)  # the target is the observation as the encoder sees it
    _, _, _, aux = agent.evaluate(seg)
    assert not aux["reconstruction"].requires_grad
    torch.testing.assert_close(aux["loss_reconstruction"], 0.5 * aux["reconstruction"])
    hidden = agent.backbone(agent.encode(seg.obs), seg.memory, starts=seg.starts).hidden
    target = agent.obs_norm(seg.obs)
    assert not torch.equal(target, seg.obs)
    expected = agent.decoder.loss(hidden, target).mean()
    torch.testing.assert_close(aux["reconstruction"], expected)

    aux["loss_reconstruction"].backward()
    for part in ("encoder", "backbone", "decoder"):
        grads = [p.grad for p in getattr(agent, part).parameters()]
        assert any(g is not None and g.abs().sum() > 0 for g in grads), part
    # Policy and value heads: untouched by this loss.
    assert all(p.grad is None for p in (*agent.policy.parameters(), *agent.value.parameters()))


def test_coef_zero_builds_nothing_and_changes_nothing():
    envs = tmaze()
    plain, zero = agent_of(envs), agent_of(envs, reconstruction_coef=0.0)
    assert zero.decoder is None and not any("decoder" in k for k in zero.state_dict())
    assert list(plain.state_dict()) == list(zero.state_dict())
    for (name, p), q in zip(plain.state_dict().items(), zero.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    seg = segment_of(plain, envs)
    out_plain, out_zero = plain.evaluate(seg), zero.evaluate(seg)
    for a, b in zip(out_plain[:3], out_zero[:3], strict=True):
        assert torch.equal(a, b)
    assert out_plain[3] == out_zero[3] == {}

    # The decoder is built last: every other weight starts as without it.
    with_decoder = agent_of(envs, reconstruction_coef=0.1).state_dict()
    for name, p in plain.state_dict().items():
        assert torch.equal(p, with_decoder[name]), name


def test_acting_never_runs_the_decoder():
    envs = tmaze()
    agent = agent_of(envs, reconstruction_coef=0.1)

    def refuse(*args, **kwargs):
        raise AssertionError("the decoder ran while acting")

    agent.decoder.forward = refuse
    agent.decoder.loss = refuse
    state = agent.initial_state(3)
    obs = torch.zeros(3, 4)
    agent.act(obs, state, torch.ones(3, dtype=torch.bool))
    agent.peek_value(obs, state)


def test_bad_coefficients_and_agents_are_refused():
    envs = tmaze()
    for bad in (-0.1, math.nan, math.inf, True):
        with pytest.raises(ValueError, match="reconstruction_coef"):
            agent_of(envs, reconstruction_coef=bad)
    with pytest.raises(ConfigError, match=r"algo.reconstruction_coef=-1: expected a number >= 0"):
        load_config(["algo.reconstruction_coef=-1"])
    # Offline algos (agent=dt|bc) have no such key.
    with pytest.raises(ConfigError, match="unknown config key 'algo.reconstruction_coef'"):
        load_config(["agent=dt", "algo.reconstruction_coef=0.1"])
    with pytest.raises(
        RegistryError, match="takes no reconstruction_coef; valid agent kinds: memory"
    ):
        algo_agent_options({"kind": "dt"}, {"reconstruction_coef": 0.1})
    with pytest.raises(RegistryError, match="set as algo.reconstruction_coef"):
        algo_agent_options({"kind": "memory", "reconstruction_coef": 0.1}, {})
    assert algo_agent_options({"kind": "dt"}, {"reconstruction_coef": 0.0}) == {}
    assert algo_agent_options({"kind": "memory"}, {"reconstruction_coef": 0.1}) == {
        "reconstruction_coef": 0.1
    }


# ------------------------------------------------------------------------------ training runs


def falls(run: Path) -> np.ndarray:
    """The logged unweighted reconstruction loss, checked to fall clearly over the run."""
    losses = read_curve(run, "losses/reconstruction", "step").y
    assert len(losses) >= 10 and np.isfinite(losses).all()
    start, end = losses[:2].mean(), losses[-3:].mean()
    assert end < 0.6 * start, losses  # a learning check: an untrained decoder stays near start
    return losses


@pytest.mark.cli
def test_ppo_run_logs_a_falling_reconstruction_loss_resumes_and_evaluates(tmp_path, capsys):
    run = tmp_path / "run"
    args = [*TINY_PPO, *FAST, "algo.reconstruction_coef=0.1", f"run_dir={run}"]
    assert train_main([*args, "total_steps=1024", "checkpoint_every=8"]) == 0
    assert summary_line(capsys.readouterr().out)["status"] == "finished"
    falls(run)
    weighted = read_curve(run, "losses/loss_reconstruction", "step").y
    unweighted = read_curve(run, "losses/reconstruction", "step").y
    np.testing.assert_allclose(weighted, 0.1 * unweighted, rtol=1e-5)

    payload = load_checkpoint(run / "checkpoints" / "last.pt")
    assert any(k.startswith("decoder.") for k in payload["model"])
    # Resume rebuilds the decoder from the saved config and restores its weights.
    assert train_main(["resume=true", f"run_dir={run}", "total_steps=1152", *FAST[:2]]) == 0
    assert summary_line(capsys.readouterr().out)["global_step"] == 1152

    assert evaluate_main([f"checkpoint={run}", "episodes=2", "torch_threads=1"]) == 0
    assert summary_line(capsys.readouterr().out)["episodes"] == 2
    policy = load_policy(run, torch_threads=1)
    saved = load_checkpoint(run / "checkpoints" / "last.pt")["model"]
    for name, p in policy.agent.decoder.state_dict().items():
        assert torch.equal(p, saved[f"decoder.{name}"]), name

    # A checkpoint written before the option (no key, no decoder weights) still loads.
    old = load_checkpoint(run / "checkpoints" / "last.pt")
    del old["config"]["algo"]["reconstruction_coef"]
    old["model"] = {k: v for k, v in old["model"].items() if not k.startswith("decoder.")}
    agent, _ = agent_from_checkpoint(old)
    assert agent.decoder is None


@pytest.mark.cli
def test_impala_run_logs_a_falling_reconstruction_loss_and_evaluates(tmp_path, capsys):
    run = tmp_path / "run"
    tiny = [a for a in TINY_PPO if not a.startswith(("algo.epochs", "algo.num_minibatches"))]
    args = [*tiny, *FAST, "algo=impala", "runtime=local", "algo.reconstruction_coef=0.1"]
    assert train_main([*args, "total_steps=1024", f"run_dir={run}"]) == 0
    assert summary_line(capsys.readouterr().out)["status"] == "finished"
    falls(run)
    assert evaluate_main([f"checkpoint={run}", "episodes=2", "torch_threads=1"]) == 0
    assert summary_line(capsys.readouterr().out)["episodes"] == 2
