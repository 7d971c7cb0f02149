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
                       {path: minigrid.wrappers.RGBImgPartialObsWrapper, kwargs: {tile_size: 4}},
                       {path: minigrid.wrappers.ImgObsWrapper}]'
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["CueInView"]

_FACING_UP = 3  # MiniGrid's directions: 0 right, 1 down, 2 left, 3 up


class CueInView(gym.Wrapper):
    """Start each MiniGrid Memory episode in front of the cue, facing it (first view shows it).

    ``fixed_ends=True`` also puts the key at the upper end and the ball at the lower one in
    every episode, so the cue alone says which way to turn (a T-maze from pixels); by default
    the ends are drawn at random, as in MiniGrid, and the turn depends on the cue and on the
    end layout together.
    """

    def __init__(self, env: gym.Env, fixed_ends: bool = False) -> None:
        super().__init__(env)
        if not isinstance(fixed_ends, bool):  # bool("false") would be True: take no strings
            raise ValueError(f"CueInView fixed_ends must be true or false, got {fixed_ends!r}")
        self.fixed_ends = fixed_ends
        from minigrid.envs import MemoryEnv  # the minigrid extra; only this wrapper needs it

        if not isinstance(env.unwrapped, MemoryEnv):
            env_id = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
            raise ValueError(
                f"CueInView needs a MiniGrid Memory env (MiniGrid-MemoryS<size>-v0, e.g. "
                f"MiniGrid-MemoryS9-v0); got {env_id}"
            )
        if env.observation_space != env.unwrapped.observation_space:
            # Reset rebuilds the observation from the grid, past any wrapper below this one.
            raise ValueError(
                "CueInView must be the first entry of env.wrappers (before the pixel wrappers); "
                f"it was given an env whose observations are {env.observation_space}"
            )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset the maze as usual, then move the agent below the cue, facing it."""
        _, info = self.env.reset(seed=seed, options=options)
        base = self.env.unwrapped
        # MemoryEnv puts the cue at (1, height // 2 - 1) in the start room; the cell below it is
        # the start room's end of the hallway row, always free.
        base.agent_pos = np.array((1, base.height // 2))
        base.agent_dir = _FACING_UP
        if self.fixed_ends:
            self._fix_ends(base)
        return base.gen_obs(), info

    @staticmethod
    def _fix_ends(base: Any) -> None:
        """Key at the upper end, ball at the lower one; success is the cue's side."""
        from minigrid.core.world_object import Ball, Key

        x, mid = base.success_pos[0], base.height // 2  # the column beside the end objects
        cue = base.grid.get(1, mid - 1)
        base.grid.set(x, mid - 2, Key(cue.color))
        base.grid.set(x, mid + 2, Ball(cue.color))
        upper, lower = (x, mid - 1), (x, mid + 1)
        base.success_pos, base.failure_pos = (upper, lower) if cue.type == "key" else (lower, upper)
