"""Repeat First memory task (POPGym's RepeatFirst, Morad et al. 2023): a latch.

The reset observation shows a symbol out of `num_symbols`; every step after shows
another one. At every step, the first included, the agent must answer with the first
symbol: it must latch one value and hold it for the whole episode while ignoring
the symbols that follow. Symbols are card suits (4 by default), dealt one-hot from a
shuffled shoe of 52-card decks, as many as the episode needs (`base.shoe_copies`).

Reward: +1/length for the first symbol, -1/length otherwise, at each of the `length`
steps. The best return is 1.0; guessing, or answering with the symbol on show (all a
policy without memory can do: only step 0 shows the answer), scores about
(2 - num_symbols) / num_symbols (-0.5 for 4 symbols).

Episodes last `length` steps and end with terminated=True; the final observation is
the next (never graded) symbol. `length` is the memory distance: the first symbol must
be held for `length` steps.

POPGym's presets (`RepeatFirst.popgym_presets`), with the same observations (the suit,
one-hot), rewards and returns as POPGym, whose episodes deal every card of its decks:

    easy    length=51    (POPGym: 1 deck)
    medium  length=415   (POPGym: 8 decks)
    hard    length=831   (POPGym: 16 decks)

Frames (`render_mode="rgb_array"`), one colour per symbol, two rows of cells. Top row:
the first symbol (the answer), a gap, the symbol on show, a gap, the last answer and its
verdict (green correct, red wrong). Bottom row: the share of the episode played.
"""

from __future__ import annotations

from typing import ClassVar

import gymnasium as gym
import numpy as np
import torch

from rltrans.envs.torch_envs.base import (
    RenderMode,
    TorchVectorEnv,
    check_int,
    full_shoe,
    shoe_copies,
)
from rltrans.envs.torch_envs.draw import BACKGROUND, bar, cells_to_pixels, palette, verdict

__all__ = ["RepeatFirst"]

SCALE = 10  # pixels per cell
WIDTH = 16  # cells per row
STEP_COLOUR = (60, 60, 60)


class RepeatFirst(TorchVectorEnv):
    """N Repeat First tasks stepped together.

    Example:
        >>> env = RepeatFirst(num_envs=16, length=64)
        >>> obs, _ = env.reset(seed=0)          # (16, 4) one-hot suits; obs is the answer
        >>> obs, r, term, trunc, info = env.step(obs.argmax(-1))
        >>> easy = RepeatFirst(num_envs=16, **RepeatFirst.popgym_presets["easy"])

    Args:
        num_envs: number of envs N.
        length: steps per episode (>= 1), all graded.
        num_symbols: size of the symbol alphabet (>= 2); also the number of actions.
        device: where all state and returned tensors live.
        validate_actions: check action values each step (a host sync for GPU-tensor actions).
        render_mode: "rgb_array" to draw frames with `render()` (see the module docstring).
    """

    # POPGym's RepeatFirstEasy/Medium/Hard (see the module docstring).
    popgym_presets: ClassVar[dict[str, dict[str, int]]] = {
        "easy": {"length": 51},
        "medium": {"length": 415},
        "hard": {"length": 831},
    }

    def __init__(
        self,
        num_envs: int,
        length: int = 51,
        num_symbols: int = 4,
        device: str | torch.device = "cpu",
        validate_actions: bool = True,
        render_mode: RenderMode | None = None,
    ) -> None:
        """Build N tasks; see the class docstring for the arguments."""
        check_int("length", length, 1)
        check_int("num_symbols", num_symbols, 2)
        super().__init__(
            num_envs=num_envs,
            single_observation_space=gym.spaces.Box(0.0, 1.0, (num_symbols,), dtype=np.float32),
            single_action_space=gym.spaces.Discrete(num_symbols),
            max_episode_steps=None,  # the task ends itself after `length` steps
            device=device,
            validate_actions=validate_actions,
            render_mode=render_mode,
            episode_limit=length,
        )
        self.length = length
        self.num_symbols = num_symbols
        self.reward_scale = 1.0 / length
        # The episode deals length + 1 cards: the first and one after each step.
        self.copies = shoe_copies(num_symbols, length + 1)
        self._symbols = torch.arange(num_symbols, device=self.device)  # one-hot codes
        zeros = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self.first, self.symbol, self.t = zeros, zeros.clone(), zeros.clone()
        # The cards left in each env's shoe, as `TorchVectorEnv._deal` reads them.  (N, S)
        self._full_shoe = full_shoe(num_symbols, self.copies, self.device)  # (S,)
        self.shoe = self._full_shoe.repeat(num_envs, 1)

    def _reset_idx(self, mask: torch.Tensor) -> None:
        """Shuffle a fresh shoe and deal the first symbol where `mask` is True."""
        if self._resets_nothing(mask):
            return  # no draws: a third of a CPU step saved
        first, shoe = self._deal_fresh(self._full_shoe, self.shoe.shape[:-1])
        self.shoe = torch.where(mask[:, None], shoe, self.shoe)
        self.first = torch.where(mask, first, self.first)
        self.symbol = torch.where(mask, first, self.symbol)
        self.t = torch.where(mask, 0, self.t)

    def _step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Grade the answer against the first symbol, then deal the next one."""
        correct = actions == self.first
        reward = torch.where(correct, self.reward_scale, -self.reward_scale)  # float32
        self.symbol, self.shoe = self._deal(self.shoe)
        self.t = self.t + 1
        return reward, self.t >= self.length, {}

    def _observe(self) -> torch.Tensor:
        """(N, num_symbols) float32 one-hot of the symbol on show."""
        return (self.symbol[:, None] == self._symbols).to(torch.float32)

    def _render_state(self) -> dict[str, torch.Tensor]:
        """The first symbol, the symbol on show and the step count, (N,) each."""
        return {"first": self.first, "symbol": self.symbol, "t": self.t}

    def _draw_frames(self, state: dict[str, np.ndarray]) -> np.ndarray:
        """(N, 2 * SCALE, WIDTH * SCALE, 3) uint8 frames: answer, symbol, verdict, progress."""
        colours = palette(self.num_symbols)
        cells = np.empty((self.num_envs, 2, WIDTH, 3), dtype=np.uint8)  # (N, R, C, 3)
        cells[:] = BACKGROUND
        cells[:, 0, 0] = colours[state["first"]]
        cells[:, 0, 2] = colours[state["symbol"]]
        action, answered = state["action"], state["action"] >= 0
        cells[:, 0, 4] = np.where(answered[:, None], colours[np.maximum(action, 0)], BACKGROUND)
        cells[:, 0, 5] = verdict(state["reward"], answered)
        played = bar(state["t"], self.length, WIDTH)  # (N, WIDTH)
        cells[:, 1] = np.where(played[..., None], STEP_COLOUR, BACKGROUND)
        return cells_to_pixels(cells, SCALE)
