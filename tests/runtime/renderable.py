"""A tiny Gymnasium env that renders RGB frames without pygame (for video tests).

Registered on import as ``rltrans_tests/Blink-v0``; use it from the command line as
``env=gym env.id=tests.runtime.renderable:rltrans_tests/Blink-v0``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class Blink(gym.Env):
    """obs = [t / 8]; an episode lasts 3 + (seed-driven 0..2) steps; frames show t as a grey."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}  # noqa: RUF012 (gym's API)
    observation_space = gym.spaces.Box(0.0, 10.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.t, self.length = 0, 3

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.length = 0, 3 + int(self.np_random.integers(0, 3))
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.array([self.t / 8], np.float32)
        return obs, 1.0, self.t >= self.length, False, {}

    def render(self):
        return np.full((8, 8, 3), 30 * self.t, dtype=np.uint8)


if "rltrans_tests/Blink-v0" not in gym.registry:
    gym.register("rltrans_tests/Blink-v0", entry_point=Blink)
