"""Minari round trips without jax, episode collection from vector envs, and the error messages."""

from __future__ import annotations

import sys
import warnings

import gymnasium as gym
import minari
import numpy as np
import pytest
from gymnasium.envs.registration import EnvSpec
from minari.data_collector.episode_buffer import EpisodeBuffer

from rltrans.envs.minari_data import load_minari, make_eval_env_fn, write_minari
from rltrans.envs.offline import Episode
from rltrans.runtime.collection import collect_episodes
from rltrans.types import ActOutput


@pytest.fixture(autouse=True)
def _minari_root(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))


class CountEnv(gym.Env):
    """obs = [t, episode length, vector step at which the episode started]; reward = t + 1.

    Lengths come from the reset RNG (1..5); the first episode of the env seeded 0 lasts 60
    steps. Odd lengths end by termination, even ones by truncation.
    """

    observation_space = gym.spaces.Box(0, 1e6, (3,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def __init__(self) -> None:
        self.clock = 0  # steps taken by this env since creation = vector step index
        self.long_first = False

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.length, self.start], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        first = seed is not None
        if first:
            self.long_first = seed == 0
        self.length = 60 if first and self.long_first else int(self.np_random.integers(1, 6))
        self.t, self.start = 0, self.clock
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        self.clock += 1
        end = self.t >= self.length
        odd = self.length % 2 == 1
        return self._obs(), float(self.t), end and odd, end and not odd, {}


COUNT_SPEC = EnvSpec(id="Count-v0", entry_point=CountEnv)


class ScriptedPolicy:
    """Action = t mod 3, read from the observation; records the done flags it is given."""

    def __init__(self) -> None:
        self.seen: list[tuple[np.ndarray, np.ndarray]] = []

    def initial_state(self, num_envs: int) -> np.ndarray:
        return np.zeros(num_envs, dtype=np.int64)

    def act(self, obs, state, done, *, deterministic=False):
        self.seen.append((obs.numpy().copy(), done.numpy().copy()))
        action = obs[:, 0].long() % 3
        return ActOutput(action, action), state + 1

    def observe(self, state, reward):
        return state


def test_collect_records_whole_episodes_exactly():
    eps = collect_episodes(COUNT_SPEC, ScriptedPolicy(), episodes=9, num_envs=3, progress=False)
    assert len(eps) == 9
    for ep in eps:
        length = int(ep.observations[0, 1])
        assert len(ep) == length
        np.testing.assert_array_equal(
            ep.observations[:, 0], np.arange(length)
        )  # no reset obs inside
        np.testing.assert_array_equal(ep.final_observation, [length, length, ep.observations[0, 2]])
        np.testing.assert_array_equal(ep.rewards, np.arange(1, length + 1, dtype=np.float32))
        np.testing.assert_array_equal(ep.actions, np.arange(length) % 3)  # epsilon=0: policy's
        assert ep.terminated == (length % 2 == 1) and ep.truncated == (length % 2 == 0)


def test_quota_keeps_episodes_in_start_order_not_finish_order():
    # Env 0's first episode lasts 60 steps while the others last 1-5: keeping the first
    # episodes to *finish* would drop it; keeping the first to *start* must not.
    eps = collect_episodes(COUNT_SPEC, None, episodes=8, num_envs=4, seed=0, progress=False)
    assert len(eps[0]) == 60
    starts = [ep.observations[0, 2] for ep in eps]
    assert starts == sorted(starts) and starts[:4] == [0, 0, 0, 0]


def test_policy_done_flags_mark_episode_starts():
    policy = ScriptedPolicy()
    collect_episodes(COUNT_SPEC, policy, episodes=12, num_envs=3, progress=False)
    assert policy.seen[0][1].all()
    for obs, done in policy.seen:
        np.testing.assert_array_equal(done, obs[:, 0] == 0)  # t == 0 exactly at a new episode


def _policy_agreement(epsilon: float) -> float:
    eps = collect_episodes(
        COUNT_SPEC, ScriptedPolicy(), episodes=150, num_envs=4, epsilon=epsilon, progress=False
    )
    acts = np.concatenate([ep.actions for ep in eps])
    scripted = np.concatenate([ep.observations[:, 0].astype(np.int64) % 3 for ep in eps])
    return float((acts == scripted).mean())


def test_epsilon_mixes_random_actions():
    assert _policy_agreement(0.0) == 1.0
    # Uniform over 3 actions agrees with the script 1/3 of the time; epsilon=0.5 gives 2/3.
    assert 0.2 < _policy_agreement(1.0) < 0.46
    assert 0.55 < _policy_agreement(0.5) < 0.78


def test_cartpole_round_trip_without_jax(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", None)  # `import jax` now raises ImportError
    eps = collect_episodes("CartPole-v1", None, episodes=12, num_envs=4, seed=3, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Minari warns about missing metadata; we fill it
        path = write_minari(
            "rltrans/cartpole-random-v0",
            eps,
            env="CartPole-v1",
            algorithm_name="uniform random",
            author="rltrans tests",
            description="12 random CartPole episodes",
        )
    assert (path / "data").is_dir()
    ds = load_minari("rltrans/cartpole-random-v0", progress=False)
    assert len(ds) == 12 and ds.num_steps == sum(len(e) for e in eps)
    assert ds.env_id == "CartPole-v1"
    np.testing.assert_allclose(ds.returns(), [e.episode_return for e in eps])
    np.testing.assert_array_equal(ds.lengths(), [len(e) for e in eps])
    for got, want in zip(ds, eps, strict=True):
        np.testing.assert_array_equal(got.observations, want.observations)
        np.testing.assert_array_equal(got.final_observation, want.final_observation)
        np.testing.assert_array_equal(got.actions, want.actions)
        np.testing.assert_array_equal(got.rewards, want.rewards)
        assert (got.terminated, got.truncated) == (want.terminated, want.truncated)
    assert any(e.terminated for e in eps)
    env = make_eval_env_fn(ds)()
    assert env.spec.id == "CartPole-v1" and env.observation_space == ds.observation_space
    env.close()


def test_pendulum_box_action_round_trip():
    eps = collect_episodes(
        "Pendulum-v1", None, episodes=3, num_envs=2, max_steps=20, progress=False
    )
    assert all(len(e) == 20 and e.truncated and not e.terminated for e in eps)
    write_minari(
        "rltrans/pendulum-random-v0",
        eps,
        env="Pendulum-v1",
        algorithm_name="uniform random",
        author="rltrans tests",
        description="3 random Pendulum episodes",
    )
    ds = load_minari("rltrans/pendulum-random-v0", progress=False)
    assert isinstance(ds.action_space, gym.spaces.Box) and ds[0].actions.shape == (20, 1)
    for got, want in zip(ds, eps, strict=True):
        np.testing.assert_array_equal(got.actions, want.actions)
        np.testing.assert_array_equal(got.observations, want.observations)
        assert got.truncated and not got.terminated


def _tiny_episode(final: bool = True) -> Episode:
    obs = np.arange(12, dtype=np.float32).reshape(3, 4)
    return Episode(
        obs,
        np.array([0, 1, 0]),
        np.ones(3),
        terminated=True,
        final_observation=obs[-1] + 1 if final else None,
    )


def _write_tiny(dataset_id: str, episodes: list[Episode], **kwargs) -> None:
    write_minari(
        dataset_id,
        episodes,
        env="CartPole-v1",
        algorithm_name="hand written",
        author="rltrans tests",
        description="tiny",
        **kwargs,
    )


def test_missing_dataset_error_names_id_path_and_local_datasets(tmp_path):
    _write_tiny("rltrans/present-v0", [_tiny_episode()])
    with pytest.raises(FileNotFoundError) as info:
        load_minari("rltrans/absent-v0")
    text = str(info.value)
    assert "rltrans/absent-v0" in text
    assert str(tmp_path / "minari" / "rltrans" / "absent-v0" / "data") in text
    assert "rltrans/present-v0" in text
    assert "python -m rltrans.collect" in text and "download=True" in text


def test_download_goes_through_minari_and_fails_clearly(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr("minari.storage.hosting.download_dataset", offline)
    with pytest.raises(RuntimeError, match=r"rltrans/remote-v0.*no network"):
        load_minari("rltrans/remote-v0", download=True)


def test_overwrite_refused_unless_asked():
    _write_tiny("rltrans/tiny-v0", [_tiny_episode()])
    with pytest.raises(FileExistsError, match="overwrite=True"):
        _write_tiny("rltrans/tiny-v0", [_tiny_episode()])
    _write_tiny("rltrans/tiny-v0", [_tiny_episode(), _tiny_episode()], overwrite=True)
    assert len(load_minari("rltrans/tiny-v0", progress=False)) == 2


def test_missing_final_observation_needs_opt_in(tmp_path):
    with pytest.raises(ValueError, match="repeat_last"):
        _write_tiny("rltrans/nofinal-v0", [_tiny_episode(), _tiny_episode(final=False)])
    assert not (tmp_path / "minari" / "rltrans" / "nofinal-v0").exists()  # no half-written data
    _write_tiny(
        "rltrans/nofinal-v0", [_tiny_episode(final=False)], missing_final_observation="repeat_last"
    )
    ep = load_minari("rltrans/nofinal-v0", progress=False)[0]
    np.testing.assert_array_equal(ep.final_observation, ep.observations[-1])


def test_unsupported_spaces_are_named():
    dict_space = gym.spaces.Dict({"a": gym.spaces.Discrete(2)})
    with pytest.raises(ValueError, match=r"unsupported observation space Dict"):
        write_minari(
            "rltrans/dict-v0",
            [],
            env=None,
            observation_space=dict_space,
            action_space=gym.spaces.Discrete(2),
            algorithm_name="x",
            author="x",
            description="x",
        )
    # A Dict-observation dataset written by Minari itself is refused on load.
    buffer = EpisodeBuffer(
        id=0,
        observations={"a": np.array([0, 1, 0])},
        actions=np.array([1, 0]),
        rewards=np.array([1.0, 1.0]),
        terminations=np.array([False, True]),
        truncations=np.array([False, False]),
        infos={},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        minari.create_dataset_from_buffers(
            "rltrans/dict-v1",
            [buffer],
            observation_space=dict_space,
            action_space=gym.spaces.Discrete(2),
        )
    with pytest.raises(ValueError, match=r"rltrans/dict-v1: unsupported observation space Dict"):
        load_minari("rltrans/dict-v1", progress=False)


def test_corrupt_dataset_names_the_dataset_the_file_and_the_fix(tmp_path):
    from rltrans.envs.minari_data import CorruptDatasetError

    eps = collect_episodes("CartPole-v1", None, episodes=3, num_envs=3, seed=0, progress=False)
    path = write_minari(
        "rltrans/broken-v0",
        eps,
        env="CartPole-v1",
        algorithm_name="uniform random",
        author="rltrans tests",
        description="3 random CartPole episodes",
    )
    data = path / "data" / "main_data.hdf5"
    data.write_bytes(data.read_bytes()[:200])  # truncated mid-file
    with pytest.raises(CorruptDatasetError) as info:
        load_minari("rltrans/broken-v0", progress=False)
    message = str(info.value)
    assert "'rltrans/broken-v0' is corrupt" in message and str(data) in message
    assert "Rebuild it" in message and "overwrite=true" in message
