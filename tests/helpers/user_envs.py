"""A user's Gymnasium env for tests of what rltrans reads of the envs it is given."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

EPISODES_ID = "RltransTest/Episodes-v0"


class Episodes(gym.Env):
    """Episodes of ``length`` steps (None: it ends when action 1 follows action 1, so its
    length varies with the actions; -1: it never ends). It also declares a learning hint,
    ``myopic``, which no trainer may read; the reward is the action."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)
    myopic = True

    def __init__(self, length: int | None = None) -> None:
        self.length, self.t, self.last = length, 0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.last = 0, 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        done = self.t == self.length or (self.length is None and action == self.last == 1)
        self.last = int(action)
        return np.full(2, self.t % 2, np.float32), float(action), done, False, {}


if EPISODES_ID not in gym.registry:
    gym.register(EPISODES_ID, entry_point=Episodes)
