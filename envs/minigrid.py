"""MiniGrid Memory with the cue in the first view, for testing what a memory keeps from pixels.

In ``MiniGrid-Memory*`` the agent starts somewhere in the hallway facing away from the start
room's object (the cue), so an agent first has to learn to turn back and look before memory can
matter; a learner stuck at the memoryless optimum (either end object, success 0.5) never shows
what its memory keeps. :class:`CueInView` starts every episode on the cell below the cue, facing
it: the first observation shows the cue, the corridor and the choice come after, and success
above 0.5 is memory alone. Used as the first entry of ``env.wrappers`` (it edits the grid's
state, so it must see the env before the pixel wrappers do)::

    python -m rltrans.train agent=gru env=minigrid_memory \\
        'env.wrappers=[{path: rltrans.envs.minigrid.CueInView},
                       {path: minigrid.wrappers.RGBImgPartialObsWrapper, kwargs: {tile_size: 8}},
                       {path: minigrid.wrappers.ImgObsWrapper}]'
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["CueInView"]

_FACING_UP = 3  # MiniGrid's directions: 0 right, 1 down, 2 left, 3 up


class CueInView(gym.Wrapper):
    """Start each MiniGrid Memory episode in front of the cue, facing it (first view shows it)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        from minigrid.envs import MemoryEnv  # the minigrid extra; only this wrapper needs it

        if not isinstance(env.unwrapped, MemoryEnv):
            env_id = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
            raise ValueError(
                f"CueInView needs a MiniGrid Memory env (MiniGrid-MemoryS<size>-v0, e.g. "
                f"MiniGrid-MemoryS9-v0); got {env_id}"
            )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset the maze as usual, then move the agent below the cue, facing it."""
        _, info = self.env.reset(seed=seed, options=options)
        base = self.env.unwrapped
        # MemoryEnv puts the cue at (1, height // 2 - 1) in the start room; the cell below it is
        # the start room's end of the hallway row, always free.
        base.agent_pos = np.array((1, base.height // 2))
        base.agent_dir = _FACING_UP
        return base.gen_obs(), info
