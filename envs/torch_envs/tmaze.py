"""T-maze memory task (Bakker 2001, "Reinforcement Learning with Long Short-Term Memory").

The agent starts at the near end of a corridor; at the far end the corridor meets a
T-junction with an up arm and a down arm. On the first observation only, a cue says
which arm is rewarded; the agent must carry it through the corridor to the junction.
A policy without memory cannot beat chance at the junction, so it scores a mean
return of 0 (50% success); a policy that remembers the cue scores 1.

Layout: positions 0..length-1 are corridor cells, position `length` is the junction,
so the shortest episode is `length` forward moves plus one turn (length + 1 steps).

Observation, 4 floats (Bakker's 3-bit code, with the two cue values split out):

    index 0  cue_up      1 on the first observation of an episode if the up arm pays
    index 1  cue_down    1 on the first observation of an episode if the down arm pays
    index 2  in_corridor 1 at positions 0..length-1
    index 3  at_junction 1 at position `length`

Actions, Discrete(4): 0 up, 1 down, 2 left (back one cell), 3 right (forward one cell).
Moves into a wall are no-ops: left at position 0, right at the junction, and up/down
anywhere in the corridor (the arms open only at the junction). Up or down at the
junction ends the episode (terminated) with +1 for the cued arm and -1 for the other;
every other step gives `-step_penalty` (default 0, the plain task), and a step that
makes no progress (anything but right in the corridor, anything but a turn at the
junction) costs a further `idle_penalty` (default 0). The final observation of a
terminated episode is the junction observation.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from rltrans.envs.torch_envs.base import RenderMode, TorchVectorEnv, check_int
from rltrans.envs.torch_envs.draw import cells_to_pixels, mark_cells

__all__ = ["TMaze"]

UP, DOWN, LEFT, RIGHT = 0, 1, 2, 3

# Frame colours (RGB); the cue's colour is its arm's: UP_COLOUR means "take the up arm".
SCALE = 12  # pixels per cell
WALL, FLOOR, AGENT = (40, 40, 40), (225, 225, 225), (0, 0, 0)
UP_COLOUR, DOWN_COLOUR = (66, 133, 244), (244, 160, 0)


class TMaze(TorchVectorEnv):
    """N T-mazes stepped together; `info["success"]` at episode end says the cued arm was taken.

    `idle_penalty` is the shaping of the "passive T-maze" of Ni et al. 2023: it makes
    walking to the junction learnable without memory (a random walk almost never reaches
    the end of a long corridor before the time limit) while leaving the returns of the
    two reference policies unchanged: walking straight and guessing still scores 0 on
    average, walking straight and remembering the cue still scores 1.

    Differences from Bakker: reward +1/-1 instead of +4/-0.1, and the cue is shown at
    t=0 only, not whenever the agent stands on the start cell, so going back does not
    recover it. This is the "passive T-maze" of Ni et al. 2023 ("When Do Transformers
    Shine in RL?"), whose optional per-step penalty is `step_penalty` here.

    Frames (`render_mode="rgb_array"`): three rows of `length + 1` cells. The middle row is
    the corridor with the junction at its right end; the up arm (blue) sits above the
    junction, the down arm (orange) below it. The start cell carries the cue's colour,
    bright while the agent sees it (the first observation), pale after. The agent is a black
    square; on the step that ends an episode it stands in the arm it turned into.

    Example:
        >>> env = TMaze(num_envs=8, length=10)
        >>> obs, _ = env.reset(seed=0)          # (8, 4), obs[:, :2] holds the cue
        >>> obs, r, term, trunc, info = env.step(torch.full((8,), RIGHT))

    Args:
        num_envs: number of mazes N.
        length: corridor cells before the junction (>= 1); benchmarks use 30.
        max_episode_steps: truncation limit; None means 2 * (length + 1), twice the
            shortest episode, so a policy that walks straight and guesses always ends
            by termination while aimless wandering is cut off (truncation: success False).
        step_penalty: reward subtracted at every step that is not the final turn (>= 0).
        idle_penalty: further reward subtracted at every step that makes no progress
            toward the junction or, at the junction, does not turn (>= 0).
        device: where all state and returned tensors live.
        validate_actions: check action values each step (a host sync for GPU-tensor actions).
        render_mode: "rgb_array" to draw frames with `render()` (see Frames above).
    """

    def __init__(
        self,
        num_envs: int,
        length: int = 10,
        max_episode_steps: int | None = None,
        step_penalty: float = 0.0,
        idle_penalty: float = 0.0,
        device: str | torch.device = "cpu",
        validate_actions: bool = True,
        render_mode: RenderMode | None = None,
    ) -> None:
        """Build N mazes of corridor `length`; see the class docstring for the arguments."""
        check_int("length", length, 1)
        if not step_penalty >= 0.0:
            raise ValueError(f"step_penalty must be >= 0, got {step_penalty!r}")
        if not idle_penalty >= 0.0:
            raise ValueError(f"idle_penalty must be >= 0, got {idle_penalty!r}")
        if max_episode_steps is None:
            max_episode_steps = 2 * (length + 1)
        super().__init__(
            num_envs=num_envs,
            single_observation_space=gym.spaces.Box(0.0, 1.0, (4,), dtype=np.float32),
            single_action_space=gym.spaces.Discrete(4),
            max_episode_steps=max_episode_steps,
            device=device,
            validate_actions=validate_actions,
            render_mode=render_mode,
        )
        self.length = length
        self.step_penalty = float(step_penalty)
        self.idle_penalty = float(idle_penalty)
        # State, one entry per env: cue 0 = up arm pays, 1 = down arm pays.
        self.cue = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self.position = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self.show_cue = torch.zeros(num_envs, dtype=torch.bool, device=self.device)

    def _reset_idx(self, mask: torch.Tensor) -> None:
        """Draw a fresh cue and put the agent at the start for envs where `mask` is True."""
        cue = torch.randint(0, 2, (self.num_envs,), generator=self.generator, device=self.device)
        self.cue = torch.where(mask, cue, self.cue)
        self.position = torch.where(mask, 0, self.position)
        self.show_cue = self.show_cue | mask

    def _step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Move along the corridor or turn at the junction."""
        at_junction = self.position == self.length
        turn = at_junction & ((actions == UP) | (actions == DOWN))
        correct = actions == self.cue  # UP == 0 and DOWN == 1 share the cue's encoding
        # Python scalars, not a fresh tensor: building one per step would copy host->device.
        win_or_lose = torch.where(correct, 1.0, -1.0)
        move = (actions == RIGHT).long() - (actions == LEFT).long()
        progress = turn | (~at_junction & (move > 0))
        penalty = self.step_penalty + self.idle_penalty * (~progress).float()  # (N,)
        reward = torch.where(turn, win_or_lose, -penalty).to(torch.float32)
        # Clamping makes right at the junction and left at the start the wall no-ops.
        self.position = (self.position + move).clamp(0, self.length)
        self.show_cue = torch.zeros_like(self.show_cue)
        return reward, turn, {"success": turn & correct}

    def _observe(self) -> torch.Tensor:
        """(N, 4) float32: [cue_up, cue_down, in_corridor, at_junction]."""
        in_corridor = self.position < self.length
        features = (
            self.show_cue & (self.cue == UP),
            self.show_cue & (self.cue == DOWN),
            in_corridor,
            ~in_corridor,
        )
        return torch.stack(features, dim=1).to(torch.float32)  # (N, 4)

    def _render_state(self) -> dict[str, torch.Tensor]:
        """Cue, position and whether the cue is on show, (N,) each."""
        return {"cue": self.cue, "position": self.position, "show_cue": self.show_cue}

    def _draw_frames(self, state: dict[str, np.ndarray]) -> np.ndarray:
        """(N, 3 * SCALE, (length + 1) * SCALE, 3) uint8 frames of the mazes."""
        n, end = self.num_envs, self.length
        rows = np.arange(n)
        cells = np.empty((n, 3, end + 1, 3), dtype=np.uint8)  # (N, R, C, 3)
        cells[:] = WALL
        cells[:, 1] = FLOOR  # corridor 0..length-1 and the junction at column `length`
        cells[:, 0, end], cells[:, 2, end] = UP_COLOUR, DOWN_COLOUR
        cue = np.where(state["cue"][:, None] == UP, UP_COLOUR, DOWN_COLOUR)  # (N, 3)
        # Pale (half-way to the floor) once the agent no longer sees the cue.
        pale = (cue + np.asarray(FLOOR)) // 2
        cells[:, 1, 0] = np.where(state["show_cue"][:, None], cue, pale)
        # The agent's cell: its corridor cell, or the arm it turned into on this step.
        action, position = state["action"], state["position"]
        turned = (position == end) & ((action == UP) | (action == DOWN))
        agent_row = np.where(turned, np.where(action == UP, 0, 2), 1)
        marked = np.zeros((n, 3, end + 1), dtype=bool)
        marked[rows, agent_row, position] = True
        image = cells_to_pixels(cells, SCALE)
        mark_cells(image, marked, AGENT, SCALE, inset=3)
        return image
