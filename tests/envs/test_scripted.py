"""Scripted controllers: competent without training, far better than random."""

from __future__ import annotations

import numpy as np

from rltrans.envs.scripted import CartPoleController, PendulumController
from rltrans.runtime.collection import collect_episodes


def returns(env_id: str, policy, episodes: int = 4) -> np.ndarray:
    eps = collect_episodes(env_id, policy, episodes=episodes, num_envs=4, progress=False)
    return np.array([ep.episode_return for ep in eps])


def test_cartpole_controller_balances_for_the_whole_episode():
    assert (returns("CartPole-v1", CartPoleController()) == 500.0).all()


def test_pendulum_controller_swings_up_and_holds():
    scripted, random = returns("Pendulum-v1", PendulumController()), returns("Pendulum-v1", None)
    assert scripted.mean() > -400 and random.mean() < -700
