"""make_vector_env: SAME_STEP autoreset, game statistics, seeding, ids, wrappers, errors."""

from __future__ import annotations

import textwrap

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from rltrans.envs.gym_vec import make_vector_env

# CartPole-v1 terminates when |theta| > 12 degrees or |x| > 2.4 (gymnasium cartpole.py).
THETA_LIMIT = 12 * 2 * np.pi / 360
X_LIMIT = 2.4


def _drive_cartpole(envs: gym.vector.VectorEnv, steps: int) -> dict[str, list]:
    """Pushes every cart left forever; checks each transition and collects per-episode counts."""
    n = envs.num_envs
    obs, _ = envs.reset()
    counts = np.zeros(n, dtype=np.int64)
    ends: list[tuple[int, int, float, int]] = []  # (env, transitions, stats r, stats l)
    truncated_ends = 0
    for _ in range(steps):
        prev = obs
        obs, rew, term, trunc, info = envs.step(np.zeros(n, dtype=np.int64))
        # A NEXT_STEP dummy transition would show up as reward 0 right after an episode end.
        assert np.all(rew == 1.0), rew
        counts += 1
        done = term | trunc
        # Outside episode ends the env moved: no step returns the previous observation again.
        assert not np.any(np.all(obs[~done] == prev[~done], axis=-1))
        if not done.any():
            assert "_episode" not in info
            continue
        np.testing.assert_array_equal(info["_final_obs"], done)
        np.testing.assert_array_equal(info["_episode"], done)  # CartPole: every end is a game end
        for i in np.flatnonzero(done):
            x, _, theta, _ = info["final_obs"][i]
            if term[i]:
                assert abs(theta) > THETA_LIMIT or abs(x) > X_LIMIT, info["final_obs"][i]
            else:
                truncated_ends += 1
            # obs[i] is already the reset observation: uniform in [-0.05, 0.05] (cartpole.py).
            assert np.all(np.abs(obs[i]) <= 0.05)
            ends.append(
                (i, int(counts[i]), float(info["episode"]["r"][i]), int(info["episode"]["l"][i]))
            )
            counts[i] = 0
    return {"ends": ends, "truncated": [truncated_ends]}


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_same_step_autoreset_has_no_dummy_transition(vectorization: str) -> None:
    envs = make_vector_env("CartPole-v1", 3, vectorization=vectorization, seed=0)
    try:
        assert envs.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        result = _drive_cartpole(envs, 60)
    finally:
        envs.close()
    assert len(result["ends"]) >= 9  # always-left fails in about 10 steps
    for _, transitions, ret, length in result["ends"]:
        # Each episode's length equals the number of its transitions, and every one paid 1.0.
        assert length == transitions
        assert ret == float(transitions)


def test_truncation_reports_stats_and_real_final_obs() -> None:
    envs = make_vector_env("CartPole-v1", 2, seed=3, env_kwargs={"max_episode_steps": 5})
    result = _drive_cartpole(envs, 12)
    assert result["truncated"][0] == 4  # both envs truncate at steps 5 and 10
    assert all(t == 5 and r == 5.0 and length == 5 for _, t, r, length in result["ends"])


def test_seed_gives_each_env_seed_plus_index() -> None:
    envs = make_vector_env("CartPole-v1", 3, seed=7)
    obs, _ = envs.reset()
    for i in range(3):
        expected, _ = gym.make("CartPole-v1").reset(seed=7 + i)
        np.testing.assert_array_equal(obs[i], expected)
    again, _ = make_vector_env("CartPole-v1", 3, seed=7).reset()
    np.testing.assert_array_equal(obs, again)
    other, _ = make_vector_env("CartPole-v1", 3, seed=8).reset()
    assert not np.array_equal(obs, other)
    # The seed is used once: a later reset continues the RNG instead of repeating the episode.
    later, _ = envs.reset()
    assert not np.array_equal(obs, later)


def test_unseeded_first_reset_is_not_fixed() -> None:
    a, _ = make_vector_env("CartPole-v1", 2).reset()
    b, _ = make_vector_env("CartPole-v1", 2).reset()
    assert not np.array_equal(a, b)


def test_spaces_are_the_envs_own() -> None:
    envs = make_vector_env("Pendulum-v1", 2)
    assert envs.single_observation_space == gym.make("Pendulum-v1").observation_space
    assert envs.single_action_space == gym.make("Pendulum-v1").action_space
    assert envs.observation_space.shape == (2, 3)


PROBE_MODULE = textwrap.dedent(
    """
    import gymnasium as gym
    import numpy as np

    class Probe(gym.Env):
        observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return np.zeros(2, np.float32), {}

        def step(self, action):
            self.t += 1
            return np.full(2, 0.5, np.float32), 2.0, self.t >= 3, False, {}

    gym.register("RltransProbe-v0", entry_point=Probe)
    """
)


@pytest.fixture
def probe_module(tmp_path, monkeypatch) -> str:
    """A module that registers RltransProbe-v0 when imported (and only then)."""
    (tmp_path / "rltrans_probe_envs.py").write_text(PROBE_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "rltrans_probe_envs"


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_module_colon_id_imports_then_makes(probe_module: str, vectorization: str) -> None:
    envs = make_vector_env(f"{probe_module}:RltransProbe-v0", 2, vectorization=vectorization)
    try:
        envs.reset(seed=0)
        for _ in range(2):
            _, _, term, _, info = envs.step(np.zeros(2, dtype=np.int64))
            assert not term.any() and "_episode" not in info
        _, _, term, _, info = envs.step(np.zeros(2, dtype=np.int64))
    finally:
        envs.close()
    assert term.all() and info["_episode"].all()
    np.testing.assert_array_equal(info["episode"]["r"], [6.0, 6.0])
    np.testing.assert_array_equal(info["episode"]["l"], [3, 3])


def test_module_import_failure_names_the_module() -> None:
    with pytest.raises(ImportError, match=r"no_such_pkg_xyz.*Install the package"):
        make_vector_env("no_such_pkg_xyz:Thing-v0", 1)


@pytest.mark.parametrize("bad_id", ["CartPol-v1", "cartpole-v1"])
def test_unknown_id_suggests_close_ids(bad_id: str) -> None:
    with pytest.raises(ValueError, match=r"unknown environment id .*CartPole-v1"):
        make_vector_env(bad_id, 1)


def test_unknown_id_without_match_says_so() -> None:
    with pytest.raises(ValueError, match="No close match"):
        make_vector_env("Zzqqxxwv-v9", 1)


def test_unversioned_id_resolves_to_latest() -> None:
    envs = make_vector_env("CartPole", 1)
    assert envs.unwrapped.envs[0].spec.id == "CartPole-v1"


def test_wrappers_apply_per_env_in_order() -> None:
    time_aware = {"path": "gymnasium.wrappers.TimeAwareObservation"}
    stack = {"path": "gymnasium.wrappers.FrameStackObservation", "kwargs": {"stack_size": 2}}
    # Time feature then stack: (2, 4 + 1). Stack then time feature (which flattens): 2 * 4 + 1.
    assert make_vector_env(
        "CartPole-v1", 2, wrappers=[time_aware, stack]
    ).observation_space.shape == (2, 2, 5)
    assert make_vector_env(
        "CartPole-v1", 2, wrappers=[stack, time_aware]
    ).observation_space.shape == (2, 9)


def test_episode_stats_are_recorded_below_reward_wrappers() -> None:
    clip = {
        "path": "gymnasium.wrappers.ClipReward",
        "kwargs": {"min_reward": 0.0, "max_reward": 0.25},
    }
    envs = make_vector_env("CartPole-v1", 2, seed=0, wrappers=[clip])
    envs.reset()
    total = np.zeros(2)
    while True:
        _, rew, _, _, info = envs.step(np.zeros(2, dtype=np.int64))
        np.testing.assert_array_equal(rew, 0.25)
        total += rew
        if "_episode" in info:
            i = int(np.flatnonzero(info["_episode"])[0])
            # The learner saw 0.25 per step; the statistics keep the game's 1.0 per step.
            assert info["episode"]["r"][i] == info["episode"]["l"][i] == 4 * total[i]
            break


@pytest.mark.parametrize(
    ("wrappers", "error", "pattern"),
    [
        (
            [{"path": "gymnasium.wrappers.TimeAwareObservatio"}],
            ImportError,
            r"has no 'TimeAwareObservatio'.*gymnasium\.wrappers\.TimeAwareObservation",
        ),
        (
            [{"path": "no_such_mod_q.Wrapper"}],
            ImportError,
            r"'no_such_mod_q\.Wrapper'.*cannot import module",
        ),
        ([{"path": "NoDots"}], ValueError, "not an import path"),
        (
            [{"path": "gymnasium.wrappers.TimeAwareObservation", "kwarg": {}}],
            ValueError,
            r"unknown keys \['kwarg'\]; valid keys: \['path', 'kwargs', 'phase'\]",
        ),
        ([{"kwargs": {}}], ValueError, r"wrappers\[0\].*must be a mapping with keys"),
        (
            [{"path": "gymnasium.wrappers.vector.NormalizeObservation"}],
            ValueError,
            "is a vector wrapper",
        ),
        (  # a config must not name a function to call on the env
            [{"path": "builtins.open", "kwargs": {"mode": "w"}}],
            ValueError,
            r"'builtins.open' is not a gymnasium.Wrapper subclass",
        ),
    ],
)
def test_bad_wrapper_entries_fail_clearly(wrappers: list, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        make_vector_env("CartPole-v1", 1, wrappers=wrappers)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"vectorization": "threads"}, r"vectorization='threads'; valid: \['sync', 'async'\]"),
        ({"atari": "yes"}, r"atari='yes'; valid: \['auto', 'on', 'off'\]"),
        ({"num_envs": 0}, "num_envs=0"),
    ],
)
def test_bad_options_list_valid_ones(kwargs: dict, pattern: str) -> None:
    args = {"env_id": "CartPole-v1", "num_envs": 1} | kwargs
    with pytest.raises(ValueError, match=pattern):
        make_vector_env(**args)


class SlowStep(gym.Env):
    """One-step env whose step takes a minute: a worker still busy when a signal arrives."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        import time

        time.sleep(60)
        return np.zeros(1, np.float32), 0.0, True, False, {}


def test_envs_cut_short_by_a_signal_close_without_awaiting_their_workers():
    """A step sent to async workers and never read back (a signal dropped the update): the
    close terminates the workers at once, where Gymnasium's would wait for the step."""
    import time

    from gymnasium.vector import AsyncVectorEnv

    from rltrans.envs.gym_vec import close_envs

    envs = AsyncVectorEnv([SlowStep, SlowStep], context="fork")
    envs.reset(seed=0)
    envs.step_async(np.zeros(2, np.int64))
    start = time.monotonic()
    close_envs(envs, cut_short=True)
    assert time.monotonic() - start < 20
    assert envs.closed and not any(p.is_alive() for p in envs.processes)
    close_envs(envs, cut_short=True)  # closing again does nothing
