"""The device rollout (rollout=auto|device) against the generic acting loop: the same rollout
from the same seed, the same episode statistics, the same trained weights; its choices and
errors; the CUDA-graph capture's fallback off CUDA."""

from types import SimpleNamespace

import pytest
import torch

import rltrans
from rltrans.accel import Accel
from rltrans.accel.capture import Captured
from rltrans.accel.rollout import (
    DeviceRollout,
    can_truncate,
    device_rollout,
    device_rollout_fits,
    host_stats,
)
from rltrans.agents.memory_agent import MemoryAgent
from rltrans.buffers.rollout import RolloutBuffer
from rltrans.config import ConfigError
from rltrans.envs.gym_vec import make_vector_env
from rltrans.envs.torch_envs import make_torch_env
from rltrans.run.logging import EpisodeTracker
from rltrans.runtime.actors import LocalActor, RewardScaler
from rltrans.types import tree_map

FIELDS = ("obs", "actions", "starts", "log_probs", "values", "rewards", "terminated",
          "truncated", "final_values")  # fmt: skip


def collect_twice(env: str, kwargs: dict, device_path: bool, backbone: str = "gtrxl"):
    """Two rollouts of 24 steps x 6 envs (segments of 8) from seed 0, and their tracker."""
    torch.manual_seed(0)
    envs = make_torch_env(env, 6, **kwargs)
    agent = MemoryAgent(
        envs.single_observation_space, envs.single_action_space, backbone=backbone, dim=16,
        heads=2, memory=4, layers=2,
        **({"long_memory": "mixed"} if backbone == "gtrxl" else {}),
    )  # fmt: skip
    actor = LocalActor(
        envs, agent, seed=0, device="cpu", reward_scaler=RewardScaler(6, 0.9, "cpu"),
        rollout=DeviceRollout(envs) if device_path else None,
    )  # fmt: skip
    tracker, buffers = EpisodeTracker(), []
    for _ in range(2):
        buffer = RolloutBuffer(24, 6, 8, "cpu")
        actor.collect(buffer, on_info=tracker.update)
        buffers.append((buffer, actor.bootstrap_value()))
    return buffers, tracker


@pytest.mark.parametrize(
    "env, kwargs, backbone",
    [
        ("tmaze", {"length": 6, "max_episode_steps": 7}, "gtrxl"),  # truncates now and then
        ("repeat_first", {"length": 5}, "gtrxl"),  # ends itself, never truncates
        ("tmaze", {"length": 3}, "gru"),  # a recurrent agent acts through agent.act
    ],
)
def test_device_rollout_equals_the_generic_loop(env, kwargs, backbone):
    generic, tracked = collect_twice(env, kwargs, False, backbone)
    device, tracked_on_device = collect_twice(env, kwargs, True, backbone)
    for (a, value_a), (b, value_b) in zip(generic, device, strict=True):
        for field in FIELDS:
            assert torch.equal(getattr(a, field), getattr(b, field)), field
        assert torch.equal(value_a, value_b)
        for mem_a, mem_b in zip(a.memories, b.memories, strict=True):
            tree_map(lambda x, y: torch.testing.assert_close(x, y, rtol=0, atol=0), mem_a, mem_b)
    if env == "tmaze" and "max_episode_steps" in kwargs:
        assert any(bool(buffer.truncated.any()) for buffer, _ in generic)  # the case is covered
    assert tracked.episodes_seen == tracked_on_device.episodes_seen > 0
    assert list(tracked._returns) == list(tracked_on_device._returns)
    assert list(tracked._lengths) == list(tracked_on_device._lengths)
    assert list(tracked._successes) == list(tracked_on_device._successes)


def test_can_truncate_reads_the_time_limit_against_the_tasks_own_end():
    assert can_truncate(make_torch_env("tmaze", 2, length=6, max_episode_steps=7))
    assert not can_truncate(make_torch_env("repeat_first", 2, length=5))
    facts = lambda limit, most: SimpleNamespace(max_episode_steps=limit, time_limit=most)  # noqa: E731
    assert not can_truncate(facts(50, 6))  # the task ends every episode first
    assert can_truncate(facts(6, 6))  # truncated (and perhaps terminated) at the last step
    assert not can_truncate(facts(None, 6))


def test_host_stats_reads_each_step_back_as_numpy():
    steps = [
        {"episode": {"r": torch.tensor([1.0, 0.0]), "l": torch.tensor([3, 0])},
         "_episode": torch.tensor([True, False])},
        {"episode": {"r": torch.tensor([0.0, 2.0]), "l": torch.tensor([0, 5])},
         "_episode": torch.tensor([False, True])},
    ]  # fmt: skip
    out = host_stats(steps)
    assert [info["_episode"].tolist() for info in out] == [[True, False], [False, True]]
    assert out[1]["episode"]["l"].tolist() == [0, 5]
    assert host_stats([]) == []


def test_rollout_setting_chooses_and_refuses_by_name():
    torch_env = make_torch_env("tmaze", 2, length=3)
    gym_env = make_vector_env("CartPole-v1", 2, seed=0)
    try:
        assert isinstance(device_rollout("auto", torch_env), DeviceRollout)
        assert device_rollout("generic", torch_env) is None
        assert device_rollout("auto", gym_env) is None
        assert not device_rollout_fits(gym_env)
        with pytest.raises(ValueError, match="rollout=device needs a torch-native env"):
            device_rollout("device", gym_env)
    finally:
        gym_env.close()
    with pytest.raises(ConfigError, match="rollout=device does nothing with algo.kind=impala"):
        rltrans.plan("algo=impala", "rollout=device")
    with pytest.raises(ConfigError, match="rollout"):
        rltrans.plan("rollout=fast")


TINY = ["env.kwargs.length=4", "env.num_envs=4", "algo.num_steps=16", "algo.segment_length=8",
        "algo.num_minibatches=2", "algo.epochs=1", "agent.dim=16", "agent.heads=2",
        "agent.memory=4", "agent.horizon=8", "total_steps=128", "compile=false",
        "torch_threads=1", "progress=false", "tensorboard=false"]  # fmt: skip


@pytest.mark.cli
def test_a_run_trains_the_same_weights_either_way(tmp_path):
    weights = []
    for rollout in ("generic", "device"):
        run_dir = tmp_path / rollout
        summary = rltrans.learn(rltrans.plan(*TINY, f"rollout={rollout}", run_dir=str(run_dir)))
        assert summary["status"] == "finished"
        weights.append(torch.load(run_dir / "checkpoints" / "last.pt", weights_only=False))
    a, b = (w["model"] for w in weights)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # a speed setting: a resumed run may change it
    resumed = rltrans.learn(rltrans.plan(
        "resume=true", f"run_dir={tmp_path / 'generic'}", "rollout=device", "total_steps=192"
    ))  # fmt: skip
    assert resumed["status"] == "finished" and resumed["global_step"] == 192


def test_capture_runs_the_function_itself_off_cuda():
    lin = torch.nn.Linear(3, 2)
    captured = Captured(lambda x, y: (lin(x).relu(), y * 2), owner=lin)
    x, y = torch.randn(4, 3), torch.arange(3)
    out = captured(x, y)
    torch.testing.assert_close(out[0], lin(x).relu(), rtol=0, atol=0)
    assert torch.equal(out[1], y * 2)
    assert captured.graphs == {}  # nothing recorded: no CUDA graph on the CPU


def test_capture_is_only_asked_for_on_cuda():
    envs = make_torch_env("tmaze", 2, length=3)
    agent = MemoryAgent(envs.single_observation_space, envs.single_action_space, dim=16,
                        heads=2, memory=4, layers=1)  # fmt: skip
    actor = LocalActor(envs, agent, seed=0, device="cpu", rollout=DeviceRollout(envs))
    Accel().act_through(actor, agent, capture=True)
    assert actor.policy is agent  # the CPU acts eagerly unless compiling


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_capture_replays_what_eager_computes_on_cuda():
    lin = torch.nn.Linear(3, 2).cuda()
    captured = Captured(lambda x: lin(x).tanh(), owner=lin)
    for _ in range(3):
        x = torch.randn(4, 3, device="cuda")
        torch.testing.assert_close(captured(x), lin(x).tanh())
    assert len(captured.graphs) == 1
    with torch.no_grad():
        lin.weight.mul_(2)  # in place, as an optimiser step: the replay reads it
    x = torch.randn(4, 3, device="cuda")
    torch.testing.assert_close(captured(x), lin(x).tanh())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_capture_that_cannot_record_runs_eagerly_on_cuda(capsys):
    captured = Captured(lambda x: x * float(x.sum().item()))  # a host read: not recordable
    x = torch.ones(3, device="cuda")
    torch.testing.assert_close(captured(x), x * 3.0)
    assert list(captured.graphs.values()) == [None]
    assert "runs eagerly" in capsys.readouterr().err
