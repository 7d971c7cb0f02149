"""EpisodeRecorder: what it writes is what the env played (raw observations, the actions the
env received, rewards, how each episode ended), in order, across shards and recorders; a
``phase: training`` entry wraps the training envs only; bad entries are refused by name."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rltrans.envs.gym_vec import make_vector_env
from rltrans.envs.recorder import EpisodeRecorder, read_recorded


def _play(env: gym.Env, episodes: int, seed: int) -> list[tuple[np.ndarray, ...]]:
    """Random episodes, recorded by hand: (observations T+1, actions, rewards, terminated)."""
    played = []
    env.action_space.seed(seed)
    for k in range(episodes):
        obs, _ = env.reset(seed=seed + k)
        observations, actions, rewards = [obs], [], []
        while True:
            action = env.action_space.sample()
            obs, reward, terminated, truncated, _ = env.step(action)
            observations.append(obs)
            actions.append(action)
            rewards.append(reward)
            if terminated or truncated:
                break
        played.append((np.stack(observations), np.stack(actions), np.array(rewards), terminated))
    return played


def test_the_recording_is_what_was_played_in_order_across_shards(tmp_path):
    env = EpisodeRecorder(gym.make("CartPole-v1"), folder=str(tmp_path), flush_steps=30)
    played = _play(env, episodes=7, seed=3)
    env.close()
    assert len(list(tmp_path.glob("episodes-*.npz"))) > 1  # several shards
    recorded = read_recorded(tmp_path)
    assert len(recorded) == len(played)
    for ep, (observations, actions, rewards, terminated) in zip(recorded, played, strict=True):
        np.testing.assert_array_equal(ep.observations, observations[:-1])
        np.testing.assert_array_equal(ep.final_observation, observations[-1])
        np.testing.assert_array_equal(ep.actions, actions)
        np.testing.assert_array_equal(ep.rewards, rewards.astype(np.float32))
        assert ep.terminated == terminated and ep.truncated != terminated


def test_an_unfinished_episode_is_not_written_and_later_recorders_come_after(tmp_path):
    first = EpisodeRecorder(gym.make("CartPole-v1"), folder=str(tmp_path))
    played = _play(first, episodes=2, seed=0)
    first.reset(seed=99)
    first.step(first.action_space.sample())  # an episode cut short by close
    first.close()
    second = EpisodeRecorder(gym.make("CartPole-v1"), folder=str(tmp_path))
    played += _play(second, episodes=2, seed=10)
    second.close()
    recorded = read_recorded(tmp_path)
    assert [len(ep) for ep in recorded] == [len(p[2]) for p in played]


def test_phase_training_wraps_the_training_envs_only(tmp_path):
    for training in (True, False):
        entry = {
            "path": "rltrans.envs.recorder.EpisodeRecorder",
            "kwargs": {"folder": str(tmp_path / str(training)), "flush_steps": 1},
            "phase": "training",
        }
        envs = make_vector_env("CartPole-v1", 2, wrappers=[entry], seed=0, training=training)
        envs.reset()
        for _ in range(60):
            envs.step(envs.action_space.sample())
        envs.close()
        assert (tmp_path / str(training)).exists() == training
        if training:  # both sub-envs recorded, 60 steps each minus their unfinished episodes
            assert 0 < sum(len(ep) for ep in read_recorded(tmp_path / "True")) <= 120
    with pytest.raises(ValueError, match=r"phase='train'; valid: \['both', 'training', 'eval"):
        make_vector_env("CartPole-v1", 1, wrappers=[{**entry, "phase": "train"}])


def test_errors_name_the_bad_value(tmp_path):
    with pytest.raises(ValueError, match="flush_steps=0 must be >= 1"):
        EpisodeRecorder(gym.make("CartPole-v1"), folder=str(tmp_path), flush_steps=0)
    with pytest.raises(FileNotFoundError, match="no recorded episodes"):
        read_recorded(tmp_path)
    np.savez(tmp_path / "episodes-x.npz", rewards=np.zeros(3))
    with pytest.raises(ValueError, match="lacks"):
        read_recorded(tmp_path)


@pytest.mark.cli
def test_a_training_run_records_exactly_its_training_episodes(tmp_path, capsys):
    import json

    from rltrans.train import main as train_main

    folder = tmp_path / "replay"
    recorder = f"{{path: rltrans.envs.recorder.EpisodeRecorder, kwargs: {{folder: {folder}}}}}"
    args = ["agent=mlp", "env=gym", "env.id=CartPole-v1", "env.num_envs=2", "total_steps=512"]
    args += ["algo.num_steps=64", "algo.segment_length=1", "algo.eval_every=1", "progress=false"]
    args += [f"run_dir={tmp_path / 'run'}", "compile=false", "torch_threads=1"]
    wrappers = f"env.wrappers=[{recorder[:-1]}, phase: training}}]"
    assert train_main([*args, wrappers]) == 0  # typed by the user: no trust asked
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    summary = json.loads(lines[-1])
    recorded = read_recorded(folder)
    # Every finished training episode, none of the evaluations' (each update evaluated).
    assert len(recorded) == summary["episodes"] > 0
    # The run's saved config names a wrapper that writes files: reading it back needs trust.
    evaluate = ["checkpoint=" + str(tmp_path / "run"), "episodes=2", "progress=false"]
    from rltrans.evaluate import main as evaluate_main

    assert evaluate_main(evaluate) == 2
    assert "trust_env_code=true" in capsys.readouterr().err
    assert evaluate_main([*evaluate, "trust_env_code=true"]) == 0
    assert len(read_recorded(folder)) == len(recorded)  # evaluating recorded nothing
