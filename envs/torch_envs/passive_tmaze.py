"""Passive T-maze (Ni et al. 2023, "When Do Transformers Shine in RL? Decoupling Memory from
Credit Assignment"): memory without exploration or credit assignment.

The agent sees a cue on its first observation only, then is carried along a corridor of
`length` cells whatever it does, and at the junction at the end turns up or down: +1 for
the cued arm, -1 for the other, and no other reward. The cue must be held for exactly
`length` steps, and a policy without memory succeeds half the time (mean return 0).

This is Ni et al.'s passive T-maze (their `TMazeClassicPassive`, episode length
corridor length + 1) with the walk made automatic: their agent must also learn to walk
right (a penalty for each step it does not), which the `tmaze` env here offers as
`idle_penalty`. Taking the walk away leaves memory as the only thing to learn. Their goal
pays 1 and the other arm 0; here the other arm pays -1, as in `tmaze`, so that chance is
a return of 0 and the best 1.

Positions 0..length-1 are the corridor, `length` is the junction: `length` steps carry
the agent there and the action of step `length` (0 up, 1 down; ignored before) is the
turn, which ends the episode (terminated, `info["success"]` True for the cued arm).

Observation, 3 floats: cue_up and cue_down (one of them 1 on the first observation
only), at_junction (1 where the turn is due). The final observation, in the arm turned
into, is all zeros.

Frames (`render_mode="rgb_array"`): three rows of cells, the corridor in the middle
(drawn in at most 64 columns, so one column can stand for several cells), the junction
at its right end between the up arm (blue) and the down arm (orange). The start cell
carries the cue's colour, bright while it is on show. The agent is a black square; on
the step that ends an episode it stands in the arm it turned into.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from rltrans.envs.torch_envs.base import RenderMode, TorchVectorEnv, check_int
from rltrans.envs.torch_envs.draw import cells_to_pixels, mark_cells

__all__ = ["PassiveTMaze"]

UP, DOWN = 0, 1

SCALE = 12  # pixels per cell
MAX_COLUMNS = 64  # corridor columns of a frame
WALL, FLOOR, AGENT = (40, 40, 40), (225, 225, 225), (0, 0, 0)
UP_COLOUR, DOWN_COLOUR = (66, 133, 244), (244, 160, 0)


class PassiveTMaze(TorchVectorEnv):
    """N passive T-mazes stepped together; `info["success"]` at episode end: the cued arm.

    Example:
        >>> env = PassiveTMaze(num_envs=8, length=100)
        >>> obs, _ = env.reset(seed=0)          # (8, 3), obs[:, :2] holds the cue
        >>> cue = obs[:, 1].long()              # 0 up, 1 down
        >>> for _ in range(101):
        ...     obs, r, term, trunc, info = env.step(cue)

    Args:
        num_envs: number of mazes N.
        length: corridor cells before the junction (>= 1): the steps the cue is held.
        device: where all state and returned tensors live.
        validate_actions: check action values each step (a host sync for GPU-tensor actions).
        render_mode: "rgb_array" to draw frames with `render()` (see the module docstring).
    """

    def __init__(
        self,
        num_envs: int,
        length: int = 10,
        device: str | torch.device = "cpu",
        validate_actions: bool = True,
        render_mode: RenderMode | None = None,
    ) -> None:
        """Build N mazes of corridor `length`; see the class docstring for the arguments."""
        check_int("length", length, 1)
        super().__init__(
            num_envs=num_envs,
            single_observation_space=gym.spaces.Box(0.0, 1.0, (3,), dtype=np.float32),
            single_action_space=gym.spaces.Discrete(2),
            max_episode_steps=None,  # the turn at step `length` always ends the episode
            device=device,
            validate_actions=validate_actions,
            render_mode=render_mode,
            episode_limit=length + 1,
        )
        self.length = length
        # State, one entry per env: cue 0 = up arm pays, 1 = down arm pays; the position is
        # also the step count, as the corridor carries the agent one cell per step.
        self.cue = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self.position = torch.zeros(num_envs, dtype=torch.int64, device=self.device)

    def _reset_idx(self, mask: torch.Tensor) -> None:
        """Draw a fresh cue and put the agent at the start where `mask` is True."""
        if self._resets_nothing(mask):
            return  # no draws: a third of a CPU step saved
        cue = torch.randint(0, 2, (self.num_envs,), generator=self.generator, device=self.device)
        self.cue = torch.where(mask, cue, self.cue)
        self.position = torch.where(mask, 0, self.position)

    def _step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Carry the agent one cell along, or turn at the junction."""
        turn = self.position == self.length
        correct = actions == self.cue  # UP == 0 and DOWN == 1 share the cue's encoding
        reward = torch.where(turn, torch.where(correct, 1.0, -1.0), 0.0)  # float32
        # Position length + 1 is the arm turned into, seen only in the final observation.
        self.position = self.position + 1
        return reward, turn, {"success": turn & correct}

    def _observe(self) -> torch.Tensor:
        """(N, 3) float32: [cue_up, cue_down, at_junction]."""
        start = self.position == 0
        cue_up, cue_down = start & (self.cue == UP), start & (self.cue == DOWN)
        features = (cue_up, cue_down, self.position == self.length)
        return torch.stack(features, dim=1).to(torch.float32)  # (N, 3)

    def _render_state(self) -> dict[str, torch.Tensor]:
        """Cue and position, (N,) each."""
        return {"cue": self.cue, "position": self.position}

    def _draw_frames(self, state: dict[str, np.ndarray]) -> np.ndarray:
        """(N, 3 * SCALE, columns * SCALE, 3) uint8 frames of the mazes."""
        n, end = self.num_envs, min(self.length, MAX_COLUMNS - 1)  # the junction's column
        cells = np.empty((n, 3, end + 1, 3), dtype=np.uint8)  # (N, R, C, 3)
        cells[:] = WALL
        cells[:, 1] = FLOOR
        cells[:, 0, end], cells[:, 2, end] = UP_COLOUR, DOWN_COLOUR
        cue = np.where(state["cue"][:, None] == UP, UP_COLOUR, DOWN_COLOUR)  # (N, 3)
        position, action = state["position"], state["action"]  # position length + 1: an arm
        pale = (cue + np.asarray(FLOOR)) // 2  # half-way to the floor once the cue is gone
        cells[:, 1, 0] = np.where((position == 0)[:, None], cue, pale)
        # Corridor cell -> column: the start and the junction keep their own columns, cells
        # 1..length-1 share columns 1..end-1 evenly (one each when nothing is compressed).
        inner = 1 + (position - 1) * (end - 1) // max(self.length - 1, 1)
        column = np.where(position == 0, 0, np.where(position >= self.length, end, inner))
        # Past the junction (the step that turned): in the arm the action chose.
        agent_row = np.where(position > self.length, np.where(action == UP, 0, 2), 1)
        marked = np.zeros((n, 3, end + 1), dtype=bool)
        marked[np.arange(n), agent_row, column] = True
        image = cells_to_pixels(cells, SCALE)
        mark_cells(image, marked, AGENT, SCALE, inset=3)
        return image
