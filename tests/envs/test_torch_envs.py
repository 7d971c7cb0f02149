"""Torch-native batched envs against per-env pure-Python references and Gymnasium's CartPole.

Each batched env is stepped alongside N single-env reference implementations written
here in plain Python, driven by the same actions. Random initial conditions are read
from the batched env's state (the cue, the symbol on show, the cart state) and
injected into the references; everything else (dynamics, rewards, termination,
truncation, SAME_STEP autoreset, final_obs, episode statistics, success) the
references compute on their own.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.vector import AutoresetMode, VectorEnv

from rltrans.envs.torch_envs import (
    RepeatPrevious,
    StatelessCartPole,
    TMaze,
    env_kwargs,
    make_torch_env,
)

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")


# ---------------------------------------------------------------------------- references
class RefEnv:
    """Single-env reference: subclasses write `_reset` and `_step`; this keeps episode stats."""

    max_steps: int | None = None

    def reset(self, env, i: int) -> list[float]:
        """Start an episode from the initial conditions env `i` drew."""
        self.ret, self.length = 0.0, 0
        return self._reset(env, i)

    def step(self, action: int, final_obs: list[float]):
        """One step; `final_obs` (the batched env's row) is only read for fresh draws."""
        obs, reward, terminated, extras = self._step(action, final_obs)
        self.ret += reward
        self.length += 1
        truncated = self.max_steps is not None and self.length >= self.max_steps
        return obs, reward, terminated, truncated, extras


class RefTMaze(RefEnv):
    """Corridor cells 0..length-1, junction at `length`; the cue is seen at t=0 only."""

    def __init__(self, length: int, max_steps: int, step_penalty: float = 0.0) -> None:
        self.n, self.max_steps, self.penalty = length, max_steps, step_penalty

    def _obs(self, first: bool) -> list[float]:
        return [
            float(first and self.cue == 0),
            float(first and self.cue == 1),
            float(self.pos < self.n),
            float(self.pos == self.n),
        ]

    def _reset(self, env, i):
        self.cue, self.pos = int(env.cue[i]), 0  # injected draw
        return self._obs(first=True)

    def _step(self, a, final_obs):
        if self.pos == self.n and a in (0, 1):
            success = a == self.cue
            return self._obs(False), 1.0 if success else -1.0, True, {"success": success}
        if a == 3 and self.pos < self.n:
            self.pos += 1
        elif a == 2 and self.pos > 0:
            self.pos -= 1
        return self._obs(False), -self.penalty, False, {"success": False}


class RefRepeatPrevious(RefEnv):
    """Keeps every symbol seen; answer at step t is graded against seen[t - k]."""

    def __init__(self, num_symbols: int, k: int, length: int) -> None:
        self.s, self.k, self.len = num_symbols, k, length

    def _one_hot(self, sym: int) -> list[float]:
        return [float(j == sym) for j in range(self.s)]

    def _reset(self, env, i):
        self.seen = [int(env.history[i, -1])]  # injected draw
        return self._one_hot(self.seen[0])

    def answer(self) -> int:
        return self.seen[-1 - self.k]

    def _step(self, a, final_obs):
        t = len(self.seen) - 1
        reward = 0.0
        if t >= self.k:
            reward = (1.0 if a == self.seen[t - self.k] else -1.0) / (self.len - self.k)
        # The next symbol is a fresh draw: inject it from the step's final_obs.
        assert sorted(final_obs) == [0.0] * (self.s - 1) + [1.0]  # a valid one-hot
        self.seen.append(final_obs.index(1.0))
        return self._one_hot(self.seen[-1]), reward, t + 1 >= self.len, {}


class RefCartPole(RefEnv):
    """CartPole-v1 equations written out in float64 Python floats."""

    def __init__(self, hide_velocity: bool, max_steps: int) -> None:
        self.hide, self.max_steps = hide_velocity, max_steps

    def _obs(self) -> list[float]:
        x, xd, th, thd = self.s
        return [x, th] if self.hide else [x, xd, th, thd]

    def _reset(self, env, i):
        self.s = [float(v) for v in env.state[i]]  # injected draw
        assert all(-0.05 <= v < 0.05 for v in self.s)
        return self._obs()

    def _step(self, a, final_obs):
        x, xd, th, thd = self.s
        f = 10.0 if a == 1 else -10.0
        c, s = math.cos(th), math.sin(th)
        tmp = (f + 0.05 * thd * thd * s) / 1.1
        thacc = (9.8 * s - c * tmp) / (0.5 * (4.0 / 3.0 - 0.1 * c * c / 1.1))
        xacc = tmp - 0.05 * thacc * c / 1.1
        self.s = [x + 0.02 * xd, xd + 0.02 * xacc, th + 0.02 * thd, thd + 0.02 * thacc]
        lim = 12 * 2 * math.pi / 360
        terminated = abs(self.s[0]) > 2.4 or abs(self.s[2]) > lim
        return self._obs(), 1.0, terminated, {}


# ---------------------------------------------------------------------------- harness
def assert_row(got: list[float], want: list[float], atol: float, where) -> None:
    """Equal rows (exactly when atol is 0)."""
    assert got == pytest.approx(want, abs=atol, rel=0), where


def run_against_references(env, refs, policy, steps, seed, atol=0.0, partial_resets=None):
    """Step `env` and `refs` together; assert equality of every output. Returns the ends."""
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    assert info == {}
    for i, (row, r) in enumerate(zip(obs.tolist(), refs, strict=True)):
        assert_row(row, r.reset(env, i), atol, ("reset", i))
    ends: list[tuple[int, int, bool, bool]] = []  # (step, env, terminated, truncated)
    for t in range(steps):
        if partial_resets and t in partial_resets:
            mask, before = partial_resets[t], obs.tolist()
            obs, _ = env.reset(options={"reset_mask": torch.as_tensor(mask)})
            for i, (row, r) in enumerate(zip(obs.tolist(), refs, strict=True)):
                assert_row(row, r.reset(env, i) if mask[i] else before[i], atol, ("mask", t, i))
        actions = policy(rng, refs)
        obs, rew, term, trunc, info = env.step(actions)
        for key in ("final_obs", "_final_obs", "episode", "_episode"):
            assert key in info  # present at every step; masks say which rows count
        # Plain lists: per-element tensor access would dominate the test's run time.
        obs_l, rew_l, term_l, trunc_l = obs.tolist(), rew.tolist(), term.tolist(), trunc.tolist()
        final_l, final_m = info["final_obs"].tolist(), info["_final_obs"].tolist()
        ep_r, ep_l = (info["episode"][k].tolist() for k in "rl")
        ep_m = info["_episode"].tolist()
        for i, r in enumerate(refs):
            o, reward, te, tr, extras = r.step(int(actions[i]), final_l[i])
            where = (t, i)
            assert rew_l[i] == pytest.approx(reward, rel=1e-6), where
            assert (term_l[i], trunc_l[i]) == (te, tr), where
            done = te or tr
            assert final_m[i] == ep_m[i] == done, where
            assert_row(final_l[i], o, atol, where)
            for key, value in extras.items():
                assert info[f"_{key}"][i].item() == done, (key, where)
                assert info[key][i].item() == (value if done else False), (key, where)
            if done:
                assert ep_r[i] == pytest.approx(r.ret, abs=1e-5), where
                assert ep_l[i] == r.length, where
                ends.append((t, i, te, tr))
                o = r.reset(env, i)  # SAME_STEP: obs is already the next episode's first
            else:
                assert (ep_r[i], ep_l[i]) == (0.0, 0), where
            assert_row(obs_l[i], o, atol, where)
    return ends


def spread(ends, num_envs):
    """Assert episode ends happened in every env and at many different steps."""
    assert {i for _, i, _, _ in ends} == set(range(num_envs))
    assert len({t for t, _, _, _ in ends}) > 10


# ---------------------------------------------------------------------------- TMaze
def biased_walk(rng, refs):
    """Mostly forward, sometimes back or a turn: reaches the junction often, not always."""
    return rng.choice(4, size=len(refs), p=[0.15, 0.15, 0.2, 0.5])


def test_tmaze_matches_reference():
    env = TMaze(num_envs=10, length=4, step_penalty=0.05)
    refs = [RefTMaze(4, env.max_episode_steps, 0.05) for _ in range(10)]
    ends = run_against_references(env, refs, biased_walk, steps=300, seed=3)
    spread(ends, 10)
    assert any(te for *_, te, _ in ends) and any(tr for *_, tr in ends)


def test_tmaze_default_time_limit_and_spaces():
    env = TMaze(num_envs=3, length=30)
    assert env.max_episode_steps == 62
    assert env.single_observation_space.shape == (4,)
    assert env.action_space == gym.spaces.MultiDiscrete([4, 4, 4])
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs.numpy())


def cue_policy(obs, memory):
    """Remember the cue from the first observation, walk right, turn to the cued arm."""
    memory = torch.where(obs[:, :2].sum(1) > 0, obs[:, 1].long(), memory)  # 0 up, 1 down
    return torch.where(obs[:, 3] > 0, memory, 3), memory


def test_tmaze_cue_policy_always_succeeds():
    env = TMaze(num_envs=16, length=5)
    obs, _ = env.reset(seed=1)
    memory = torch.full((16,), -1)
    returns, successes, lengths = [], [], []
    for _ in range(60):
        actions, memory = cue_policy(obs, memory)
        obs, _, _, trunc, info = env.step(actions)
        assert not trunc.any()
        done = info["_episode"]
        returns += info["episode"]["r"][done].tolist()
        lengths += info["episode"]["l"][done].tolist()
        successes += info["success"][info["_success"]].tolist()
    assert len(returns) == 16 * 10  # 60 steps / 6 steps per episode
    assert set(returns) == {1.0} and set(lengths) == {6} and all(successes)


def test_tmaze_memoryless_policy_is_at_chance():
    env = TMaze(num_envs=64, length=2)
    obs, _ = env.reset(seed=2)
    successes, returns = [], []
    for _ in range(150):
        # Reactive: forward in the corridor, always up at the junction.
        obs, _, _, _, info = env.step(torch.where(obs[:, 3] > 0, 0, 3))
        successes += info["success"][info["_success"]].tolist()
        returns += info["episode"]["r"][info["_episode"]].tolist()
    assert len(successes) == 64 * 50
    assert abs(np.mean(successes) - 0.5) < 0.05
    assert abs(np.mean(returns)) < 0.1


def test_tmaze_truncation_is_not_success():
    env = TMaze(num_envs=2, length=3, max_episode_steps=5)
    env.reset(seed=0)
    for _ in range(5):
        _, rew, term, trunc, info = env.step(np.array([2, 1]))  # back, and down in the corridor
        assert not term.any() and rew.eq(0).all()
    assert trunc.all() and info["_success"].all() and not info["success"].any()
    assert info["episode"]["l"].tolist() == [5, 5]


# ---------------------------------------------------------------------------- RepeatPrevious
def half_right(rng, refs):
    """The correct answer half of the time, a uniform guess otherwise."""
    guess = rng.integers(0, refs[0].s, size=len(refs))
    right = [r.answer() if len(r.seen) > r.k else 0 for r in refs]
    return np.where(rng.random(len(refs)) < 0.5, right, guess)


def test_repeat_previous_matches_reference():
    n = 10
    env = RepeatPrevious(num_envs=n, num_symbols=3, k=2, episode_length=9)
    refs = [RefRepeatPrevious(3, 2, 9) for _ in range(n)]
    # Fixed-length episodes end in lockstep; partial resets put envs out of phase.
    rng = np.random.default_rng(0)
    partial = {t: rng.random(n) < 0.3 for t in (3, 7, 20, 44)}
    ends = run_against_references(env, refs, half_right, steps=200, seed=4, partial_resets=partial)
    spread(ends, n)
    assert all(te and not tr for *_, te, tr in ends)


def test_repeat_previous_returns_of_perfect_and_random_policies():
    env = RepeatPrevious(num_envs=64, num_symbols=4, k=4, episode_length=32)
    obs, _ = env.reset(seed=5)
    seen = [obs.argmax(1)]
    for t in range(32):
        action = seen[t - 4] if t >= 4 else torch.zeros(64, dtype=torch.long)
        obs, _, _, _, info = env.step(action)
        seen.append(obs.argmax(1))
    assert info["_episode"].all()
    torch.testing.assert_close(info["episode"]["r"], torch.ones(64))  # perfect recall
    random_returns = []
    for _ in range(32 * 4):
        obs, _, _, _, info = env.step(torch.randint(0, 4, (64,)))
        random_returns += info["episode"]["r"][info["_episode"]].tolist()
    assert len(random_returns) == 64 * 4
    assert abs(np.mean(random_returns) + 0.5) < 0.05


def test_repeat_previous_symbols_are_uniform_and_independent():
    env = RepeatPrevious(num_envs=256, num_symbols=4, k=1, episode_length=8)
    obs, _ = env.reset(seed=6)
    symbols = [obs.argmax(1)]
    for _ in range(15):
        obs, *_ = env.step(torch.zeros(256, dtype=torch.long))
        symbols.append(obs.argmax(1))
    s = torch.stack(symbols)  # (T, N)
    freq = torch.bincount(s.flatten(), minlength=4).float() / s.numel()
    assert (freq - 0.25).abs().max() < 0.02
    # Consecutive symbols, and neighbouring envs, agree at chance rate (1/4).
    assert abs((s[1:] == s[:-1]).float().mean().item() - 0.25) < 0.03
    assert abs((s[:, 1:] == s[:, :-1]).float().mean().item() - 0.25) < 0.03


# ---------------------------------------------------------------------------- CartPole
def mostly_balanced(rng, refs):
    """A linear balancing controller with 60% random actions: episodes of mixed lengths."""
    ctrl = [int(r.s[2] + 0.5 * r.s[3] + 0.05 * r.s[0] + 0.2 * r.s[1] > 0) for r in refs]
    return np.where(rng.random(len(refs)) < 0.6, rng.integers(0, 2, len(refs)), ctrl)


@pytest.mark.parametrize("hide_velocity", [True, False])
def test_cartpole_matches_reference(hide_velocity):
    n = 10
    env = StatelessCartPole(num_envs=n, hide_velocity=hide_velocity, max_episode_steps=40)
    refs = [RefCartPole(hide_velocity, 40) for _ in range(n)]
    ends = run_against_references(env, refs, mostly_balanced, steps=300, seed=7, atol=1e-4)
    spread(ends, n)
    assert any(te for *_, te, _ in ends) and any(tr for *_, tr in ends)


def test_cartpole_matches_gymnasium_cartpole_v1():
    n = 8
    env = StatelessCartPole(num_envs=n, hide_velocity=False)
    gyms = [gym.make("CartPole-v1").unwrapped for _ in range(n)]
    assert all(isinstance(g, CartPoleEnv) for g in gyms)
    for g in gyms:
        g.reset(seed=0)
    obs, _ = env.reset(seed=8)
    for i, g in enumerate(gyms):
        g.state = env.state[i].double().numpy()  # start from the same state
    rng = np.random.default_rng(8)
    episodes = 0
    for _ in range(400):
        actions = rng.integers(0, 2, n)
        obs, rew, term, trunc, info = env.step(torch.as_tensor(actions))
        for i, g in enumerate(gyms):
            g_obs, g_rew, g_term, _, _ = g.step(int(actions[i]))
            final = info["final_obs"][i].numpy()
            # float32 vs float64 rounding, grown by the unstable dynamics over an episode.
            np.testing.assert_allclose(final, g_obs, atol=1e-4, rtol=1e-4)
            assert (rew[i].item(), term[i].item()) == (g_rew, g_term)
            if g_term:
                episodes += 1
                g.reset()
                g.state = env.state[i].double().numpy()  # the batched env's next episode
                np.testing.assert_allclose(obs[i].numpy(), g.state, atol=1e-7)
    assert not trunc.any() and episodes > 50


def test_cartpole_one_step_matches_gymnasium_from_many_states():
    n = 256
    env = StatelessCartPole(num_envs=n, hide_velocity=False)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    # Ranges that straddle both termination limits (|x| 2.4, |theta| 0.2094).
    start = rng.uniform(-1, 1, (n, 4)) * np.array([2.45, 2.0, 0.22, 2.0])
    env.state = torch.as_tensor(start, dtype=torch.float32)
    actions = rng.integers(0, 2, n)
    _, _, term, _, info = env.step(actions)
    g = CartPoleEnv()
    g.reset(seed=0)
    for i in range(n):
        g.state = start[i].astype(np.float32).astype(np.float64)  # the same float32 values
        g.steps_beyond_terminated = None
        g_obs, _, g_term, _, _ = g.step(int(actions[i]))
        np.testing.assert_allclose(info["final_obs"][i].numpy(), g_obs, atol=1e-6, rtol=1e-6)
        assert term[i].item() == g_term
    x_out = np.abs(info["final_obs"][:, 0].numpy()) > 2.4
    theta_out = np.abs(info["final_obs"][:, 2].numpy()) > 12 * 2 * math.pi / 360
    assert x_out.any() and theta_out.any() and (x_out & ~theta_out).any()
    assert 0 < term.sum() < n


def test_cartpole_initial_state_is_uniform_in_005():
    env = StatelessCartPole(num_envs=4096)
    env.reset(seed=1)
    s = env.state  # (N, 4)
    assert s.min() >= -0.05 and s.max() < 0.05
    assert (s.min(0).values < -0.049).all() and (s.max(0).values > 0.049).all()
    torch.testing.assert_close(s.mean(0), torch.zeros(4), atol=2e-3, rtol=0)
    torch.testing.assert_close(s.std(0), torch.full((4,), 0.1 / math.sqrt(12)), atol=1e-3, rtol=0)


def test_cartpole_truncates_at_500_steps():
    env = StatelessCartPole(num_envs=4, hide_velocity=False)
    obs, _ = env.reset(seed=9)
    for t in range(500):
        x, xd, th, thd = obs.unbind(1)
        obs, _, term, trunc, info = env.step((th + 0.5 * thd + 0.05 * x + 0.2 * xd > 0).long())
        assert not term.any()
        assert trunc.all() == (t == 499) and trunc.any() == (t == 499)
    assert info["episode"]["l"].tolist() == [500] * 4
    assert info["episode"]["r"].tolist() == [500.0] * 4
    assert obs.abs().max() < 0.05  # already reset


def test_cartpole_stateless_observation_is_position_and_angle():
    env = StatelessCartPole(num_envs=5)
    obs, _ = env.reset(seed=10)
    assert obs.shape == (5, 2) and env.single_observation_space.shape == (2,)
    torch.testing.assert_close(obs, env.state[:, [0, 2]], atol=0, rtol=0)
    obs[:] = 1.0  # the observation is a copy, never a view of the state
    assert env.state.abs().max() < 0.05


# ---------------------------------------------------------------------------- SAME_STEP
def test_same_step_autoreset_has_no_dummy_transition():
    env = StatelessCartPole(num_envs=3, hide_velocity=False)
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    obs, _ = env.reset(seed=11)
    ended = 0
    for _ in range(200):
        prev_obs = obs
        obs, rew, _, _, info = env.step(torch.ones(3, dtype=torch.long))  # always push right
        assert rew.eq(1.0).all()  # every step is a real transition
        done = info["_final_obs"]
        torch.testing.assert_close(info["final_obs"][~done], obs[~done])
        for i in done.nonzero().flatten().tolist():
            ended += 1
            last = info["final_obs"][i]
            # The true last obs is past a termination limit; obs is a fresh start state.
            assert last[0].abs() > 2.4 or last[2].abs() > 12 * 2 * math.pi / 360
            assert obs[i].abs().max() < 0.05 and prev_obs[i].abs().max() > 0.05
    assert ended > 10


# ---------------------------------------------------------------------------- API, seeding, devices
@pytest.mark.parametrize("name", ["tmaze", "repeat_previous", "stateless_cartpole"])
def test_seeding_reproduces_and_differs(name):
    def rollout(seed):
        env = make_torch_env(name, num_envs=32)
        obs, _ = env.reset(seed=seed)
        trace = [obs]
        gen = torch.Generator().manual_seed(0)
        for _ in range(60):
            acts = torch.randint(0, int(env.single_action_space.n), (32,), generator=gen)
            obs, rew, *_ = env.step(acts)
            trace += [obs, rew[:, None]]
        return torch.cat(trace, 1)

    a, b, c = rollout(1), rollout(1), rollout(2)
    assert torch.equal(a, b) and not torch.equal(a, c)
    env = make_torch_env(name, num_envs=32)
    first, _ = env.reset(seed=1)
    env.step(torch.zeros(32, dtype=torch.long))
    again, _ = env.reset(seed=1)  # re-seeding restarts the generator
    assert torch.equal(first, again)


def test_unseeded_envs_differ():
    x, _ = TMaze(num_envs=64).reset()
    y, _ = TMaze(num_envs=64).reset()
    assert not torch.equal(x, y)


@pytest.mark.parametrize("name", ["tmaze", "repeat_previous", "stateless_cartpole"])
def test_gymnasium_vector_api(name):
    env = make_torch_env(name, num_envs=6)
    assert isinstance(env, VectorEnv) and env.num_envs == 6
    assert env.observation_space.shape == (6, *env.single_observation_space.shape)
    obs, _ = env.reset(seed=0)
    for _ in range(50):
        actions = env.action_space.sample()  # a NumPy (N,) array
        obs, rew, term, trunc, info = env.step(actions)
        assert obs.dtype == torch.float32 and rew.dtype == torch.float32
        assert term.dtype == trunc.dtype == info["_episode"].dtype == torch.bool
        assert rew.shape == term.shape == trunc.shape == (6,)
        assert env.observation_space.contains(obs.numpy())
        assert info["final_obs"].shape == obs.shape


def test_reset_mask_resets_only_masked_envs():
    env = TMaze(num_envs=4, length=3)
    env.reset(seed=0)
    for _ in range(2):
        env.step(torch.full((4,), 3))
    obs, _ = env.reset(options={"reset_mask": torch.tensor([True, False, True, False])})
    assert env.position.tolist() == [0, 2, 0, 2]
    assert obs[[0, 2], :2].sum(1).eq(1).all() and obs[[1, 3], :2].eq(0).all()
    *_, info = env.step(torch.full((4,), 3))
    *_, info = env.step(torch.tensor([0, 0, 3, 0]))  # envs 1 and 3 turn at the junction
    assert info["_episode"].tolist() == [False, True, False, True]
    assert info["episode"]["l"].tolist() == [0, 4, 0, 4]


def test_devices_cpu():
    env = make_torch_env("stateless_cartpole", num_envs=3, device="cpu")
    obs, _ = env.reset(seed=0)
    out = env.step(np.array([0, 1, 0]))
    assert all(t.device.type == "cpu" for t in (obs, *out[:4], out[4]["final_obs"]))


@CUDA
@pytest.mark.parametrize("name", ["tmaze", "repeat_previous", "stateless_cartpole"])
def test_devices_cuda(name):
    def rollout():
        env = make_torch_env(name, num_envs=8, device="cuda")
        obs, _ = env.reset(seed=0)
        assert obs.device.type == "cuda" and env.generator.device.type == "cuda"
        trace = [obs]
        for step in range(20):
            # Host (NumPy, CPU tensor) and device actions are all accepted.
            acts = [np.zeros(8, dtype=np.int64), torch.ones(8, dtype=torch.long)][step % 2]
            acts = torch.as_tensor(acts, device="cuda") if step % 3 == 0 else acts
            obs, rew, term, trunc, info = env.step(acts)
            for t in (obs, rew, term, trunc, info["final_obs"], info["episode"]["r"]):
                assert t.device.type == "cuda"
            trace.append(obs)
        return torch.cat(trace, 1)

    assert torch.equal(rollout(), rollout())  # seeded runs on the GPU reproduce
    cpu_env = make_torch_env(name, num_envs=8, device="cpu")
    cpu_env.reset(seed=0)
    obs, *_ = cpu_env.step(torch.zeros(8, dtype=torch.long, device="cuda"))  # moved to CPU
    assert obs.device.type == "cpu"


@CUDA
def test_cartpole_cuda_matches_cpu_dynamics():
    envs = [StatelessCartPole(num_envs=64, hide_velocity=False, device=d) for d in ("cpu", "cuda")]
    for e in envs:
        e.reset(seed=0)
        e.state = (torch.rand(64, 4, generator=torch.Generator().manual_seed(1)) - 0.5) * 0.2
        e.state = e.state.to(e.device)
    actions = torch.randint(0, 2, (64,), generator=torch.Generator().manual_seed(2))
    outs = [e.step(actions) for e in envs]
    torch.testing.assert_close(outs[1][4]["final_obs"].cpu(), outs[0][4]["final_obs"])
    assert torch.equal(outs[1][2].cpu(), outs[0][2])


# ---------------------------------------------------------------------------- errors
def test_make_torch_env_errors():
    with pytest.raises(ValueError, match=r"'maze'.*'repeat_previous', 'stateless_cartpole'"):
        make_torch_env("maze", num_envs=2)
    with pytest.raises(TypeError, match=r"\['lenght'\].*'tmaze'.*'length'"):
        make_torch_env("tmaze", num_envs=2, lenght=5)
    assert env_kwargs("repeat_previous") == [
        "num_symbols",
        "k",
        "episode_length",
        "validate_actions",
        "render_mode",
    ]
    assert make_torch_env("repeat_previous", num_envs=2, k=2).k == 2


@pytest.mark.parametrize(
    ("cls", "kwargs", "match"),
    [
        (TMaze, {"length": 0}, "length must be an int >= 1, got 0"),
        (TMaze, {"step_penalty": -1.0}, "step_penalty must be >= 0"),
        (TMaze, {"max_episode_steps": 0}, "max_episode_steps must be a positive int"),
        (RepeatPrevious, {"k": 4, "episode_length": 4}, "episode_length must be an int > k=4"),
        (RepeatPrevious, {"num_symbols": 1}, "num_symbols must be an int >= 2, got 1"),
        (StatelessCartPole, {"num_envs": 0}, "num_envs must be a positive int, got 0"),
    ],
)
def test_constructor_errors(cls, kwargs, match):
    kwargs = {"num_envs": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


def test_action_and_reset_errors():
    env = TMaze(num_envs=3)
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(np.zeros(3, dtype=np.int64))
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"invalid action 4 for env 1: valid actions are 0\.\.3"):
        env.step(np.array([0, 4, 1]))
    with pytest.raises(ValueError, match=r"invalid action -1 for env 2"):
        env.step(torch.tensor([0, 1, -1]))
    with pytest.raises(ValueError, match=r"shape \(3,\).*got shape \(3, 1\)"):
        env.step(np.zeros((3, 1), dtype=np.int64))
    with pytest.raises(TypeError, match="integer dtype, got torch.float32"):
        env.step(torch.zeros(3))
    with pytest.raises(TypeError, match="seed must be an int"):
        env.reset(seed=[1, 2, 3])
    with pytest.raises(ValueError, match=r"unknown reset options \['low'\]"):
        env.reset(options={"low": 0.0})
    with pytest.raises(ValueError, match="reset_mask must be a bool array of shape"):
        env.reset(options={"reset_mask": np.ones(2, dtype=bool)})
    # Without validation an out-of-range action is a wall no-op rather than an error.
    env = TMaze(num_envs=3, validate_actions=False)
    env.reset(seed=0)
    env.step(np.array([7, 7, 7]))
    assert env.position.tolist() == [0, 0, 0]


def test_tmaze_idle_penalty_spares_the_straight_path():
    """idle_penalty costs only non-progress steps: straight walkers keep returns 0 / 1."""
    env = TMaze(num_envs=4, length=3, idle_penalty=0.1)
    env.reset(seed=3)
    cue = env.cue.clone()
    for _ in range(3):
        _, rew, term, _, _ = env.step(torch.full((4,), 3))  # right, right, right
        assert rew.eq(0).all() and not term.any()
    _, rew, _, _, _ = env.step(torch.full((4,), 2))  # left at the junction region: idle
    torch.testing.assert_close(rew, torch.full((4,), -0.1))
    env.step(torch.full((4,), 3))
    _, rew, _, _, _ = env.step(torch.full((4,), 3))  # right at the junction: a wall, idle
    torch.testing.assert_close(rew, torch.full((4,), -0.1))
    _, rew, term, _, info = env.step(cue)  # the cued arm
    assert term.all() and rew.eq(1.0).all() and info["success"].all()
    with pytest.raises(ValueError, match="idle_penalty must be >= 0"):
        TMaze(num_envs=1, idle_penalty=-1.0)
