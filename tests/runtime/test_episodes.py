"""The one acting loop: vectorised stepping equals a per-env loop, episode starts reach the
policy, per-env quotas count episodes in start order, and video records on Gymnasium envs."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from rltrans.envs import make_env
from rltrans.evaluate import main as evaluate_main
from rltrans.runtime.episodes import EpisodeLoop, Quota, VideoRecorder, play_episodes
from rltrans.runtime.evaluation import evaluate_episodes
from rltrans.train import main as train_main
from rltrans.types import ActOutput
from tests.runtime import renderable

N = 3


class PushRight:
    """Always pushes right (CartPole falls within ~10 steps); records what it is given."""

    def __init__(self) -> None:
        self.calls: list[tuple[np.ndarray, np.ndarray]] = []
        self.rewards: list[np.ndarray] = []

    def initial_state(self, num_envs: int) -> torch.Tensor:
        return torch.zeros(num_envs, dtype=torch.long)

    def act(self, obs, state, done, *, deterministic=False):
        self.calls.append((obs.numpy().copy(), done.numpy().copy()))
        state = torch.where(done, torch.zeros_like(state), state + 1)  # steps into the episode
        action = torch.ones(obs.shape[0], dtype=torch.long)
        return ActOutput(action, action), state

    def observe(self, state, reward):
        self.rewards.append(reward.numpy().copy())
        return state


def cartpole_envs(num_envs: int = N):
    cfg = {"kind": "gym", "id": "CartPole-v1", "num_envs": num_envs}
    return make_env(cfg, seed=0, training=False)


def test_vector_loop_equals_a_per_env_loop():
    """Observations, rewards and episode starts of the vector loop equal N separate envs
    stepped one by one with the same seeds (sub-env i is seeded seed + i)."""
    envs, policy = cartpole_envs(), PushRight()
    loop = EpisodeLoop(envs, policy, seed=7, device="cpu")
    steps = [loop.step() for _ in range(30)]
    envs.close()
    for i in range(N):
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=7 + i)
        start = True
        for t, step in enumerate(steps):
            np.testing.assert_allclose(step.obs[i].numpy(), obs, rtol=0, atol=0)
            assert bool(step.done[i]) == start  # done marks the first step of an episode
            assert policy.calls[t][1][i] == start
            obs, reward, term, trunc, _ = env.step(1)
            assert float(step.reward[i]) == reward and bool(step.terminated[i]) == term
            assert np.allclose(policy.rewards[t][i], reward)  # observe saw the same reward
            start = term or trunc
            if start:
                np.testing.assert_allclose(step.final_raw_obs()[i], obs, rtol=0, atol=0)
                obs, _ = env.reset()
        env.close()


def test_quota_counts_each_envs_first_episodes():
    envs = cartpole_envs()
    loop = EpisodeLoop(envs, PushRight(), seed=0, device="cpu")
    episodes = play_episodes(loop, Quota([2, 1, 0]))
    envs.close()
    assert sorted(ep.env_index for ep in episodes) == [0, 0, 1]
    assert Quota.split(7, 3).left.tolist() == [3, 2, 2]
    with pytest.raises(ValueError, match="counts >= 0"):
        Quota([1, -1])


def test_episode_returns_match_the_env():
    envs = cartpole_envs(2)
    episodes = evaluate_episodes(PushRight(), envs, 4, seed=3, device="cpu")
    envs.close()
    assert len(episodes) == 4
    for ep in episodes:
        assert ep.ret == ep.length  # CartPole pays 1 per step


def test_act_must_return_an_act_output():
    class Old:
        def initial_state(self, n):
            return None

        def act(self, obs, state, done, *, deterministic=False):
            return np.ones(obs.shape[0], np.int64), state

        def observe(self, state, reward):
            return state

    envs = cartpole_envs(2)
    with pytest.raises(TypeError, match=r"Old.act must return \(rltrans.types.ActOutput"):
        EpisodeLoop(envs, Old(), seed=0, device="cpu").step()
    envs.close()


def test_video_records_env_zeros_first_episode_on_a_gymnasium_env(tmp_path):
    cfg = {"kind": "gym", "id": "rltrans_tests/Blink-v0", "num_envs": 2}
    cfg["kwargs"] = {"render_mode": "rgb_array"}
    envs = make_env(cfg, seed=0, training=False)  # wrapped: the wrapper has no call()
    video = VideoRecorder(envs)
    episodes = evaluate_episodes(PushRight(), envs, 4, seed=0, device="cpu", on_step=video)
    envs.close()
    first = next(ep for ep in episodes if ep.env_index == 0)
    assert len(video.frames) == first.length and video.frames[0].shape == (8, 8, 3)
    assert video.save(tmp_path / "v.gif").stat().st_size > 0


@pytest.mark.cli
def test_evaluate_video_true_writes_a_gif(tmp_path, capsys):
    env = ["env=gym", f"env.id={renderable.__name__}:rltrans_tests/Blink-v0", "env.num_envs=2"]
    tiny = ["agent=mlp", "agent.dim=8", "algo.num_steps=8", "algo.segment_length=8"]
    tiny += ["algo.num_minibatches=1"]
    run = tmp_path / "run"
    args = [*env, *tiny, "total_steps=16", f"run_dir={run}", "progress=false"]
    assert train_main([*args, "tensorboard=false"]) == 0
    capsys.readouterr()
    # The env comes from a test module named in the checkpoint's env.id: trusted here.
    args = [f"checkpoint={run}", "episodes=2", "video=true", "trust_env_code=true"]
    assert evaluate_main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["episodes"] == 2 and summary["video"].endswith("eval.gif")
    assert (run / "videos" / "eval.gif").stat().st_size > 0
