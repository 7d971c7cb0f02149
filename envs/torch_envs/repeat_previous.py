"""Repeat Previous memory task (POPGym's RepeatPrevious, Morad et al. 2023): recall at an offset.

Each step shows a symbol out of `num_symbols` as a one-hot vector; the agent must
answer with the symbol it saw `k` steps earlier. Writing s_t for the symbol in the
observation the agent acts on at step t (t = 0 is the reset observation), the action
a_t is graded for t >= k and is correct iff a_t == s_{t-k}. k = 0 asks for the current
symbol (a no-memory control).

Symbols are card suits (4 by default) dealt from a shuffled shoe of 52-card decks, as
many as the episode needs (`base.shoe_copies`): each comes up equally often over a deck.

Reward: +1/(episode_length - k) when correct, -1/(episode_length - k) when wrong,
0 for the first k steps. So the best return is 1.0 and uniform random guessing
scores (2 - num_symbols) / num_symbols in expectation (-0.5 for 4 symbols).

Episodes have a fixed length and end with terminated=True (never truncated): the
end is part of the task, so a learner must not bootstrap past it. The final
observation is the next (never graded) symbol.

POPGym's presets (`RepeatPrevious.popgym_presets`): POPGym's k counts the current card
as 1, so its k is k + 1 here, and its episodes deal every card of 1, 2 or 3 decks:

    easy    k=3   episode_length=51    (POPGym: 1 deck,  k=4)
    medium  k=31  episode_length=103   (POPGym: 2 decks, k=32)
    hard    k=63  episode_length=155   (POPGym: 3 decks, k=64)

with the same observations (the suit, one-hot), rewards and returns as POPGym.
"""

from __future__ import annotations

from typing import ClassVar

import gymnasium as gym
import numpy as np
import torch

from rltrans.envs.torch_envs.base import (
    RenderMode,
    TorchVectorEnv,
    full_shoe,
    shoe_copies,
)
from rltrans.envs.torch_envs.draw import BACKGROUND, bar, cells_to_pixels, palette, verdict

__all__ = ["RepeatPrevious"]

SCALE = 10  # pixels per cell
STEP_COLOUR = (60, 60, 60)
MAX_BAR = 64  # cells of the step bar


class RepeatPrevious(TorchVectorEnv):
    """N Repeat Previous tasks stepped together.

    Frames (`render_mode="rgb_array"`), one colour per symbol, two rows of cells. Top row:
    the last k + 1 symbols shown, oldest (the one the next answer must repeat) on the left,
    the current symbol on the right; after a gap, the last answer's symbol and a verdict
    cell (green correct, red wrong, grey not graded). Bottom row: the steps taken, one cell
    per step (a bar of at most 64 cells for longer episodes).

    Example:
        >>> env = RepeatPrevious(num_envs=16, num_symbols=4, k=4, episode_length=32)
        >>> obs, _ = env.reset(seed=0)          # (16, 4) one-hot symbols
        >>> obs, r, term, trunc, info = env.step(obs.argmax(-1))
        >>> hard = RepeatPrevious(num_envs=16, **RepeatPrevious.popgym_presets["hard"])

    Args:
        num_envs: number of envs N.
        num_symbols: size of the symbol alphabet (>= 2); also the number of actions.
        k: how many steps back the answer lies (>= 0).
        episode_length: steps per episode (> k).
        device: where all state and returned tensors live.
        validate_actions: check action values each step (a host sync for GPU-tensor actions).
        render_mode: "rgb_array" to draw frames with `render()` (see Frames above).
    """

    # POPGym's RepeatPreviousEasy/Medium/Hard (see Frames above).
    popgym_presets: ClassVar[dict[str, dict[str, int]]] = {
        "easy": {"k": 3, "episode_length": 51},
        "medium": {"k": 31, "episode_length": 103},
        "hard": {"k": 63, "episode_length": 155},
    }

    def __init__(
        self,
        num_envs: int,
        num_symbols: int = 4,
        k: int = 4,
        episode_length: int = 32,
        device: str | torch.device = "cpu",
        validate_actions: bool = True,
        render_mode: RenderMode | None = None,
    ) -> None:
        """Build N tasks; see the class docstring for the arguments."""
        if not isinstance(num_symbols, int) or num_symbols < 2:
            raise ValueError(f"num_symbols must be an int >= 2, got {num_symbols!r}")
        if not isinstance(k, int) or k < 0:
            raise ValueError(f"k must be an int >= 0, got {k!r}")
        if not isinstance(episode_length, int) or episode_length <= k:
            raise ValueError(f"episode_length must be an int > k={k}, got {episode_length!r}")
        super().__init__(
            num_envs=num_envs,
            single_observation_space=gym.spaces.Box(0.0, 1.0, (num_symbols,), dtype=np.float32),
            single_action_space=gym.spaces.Discrete(num_symbols),
            max_episode_steps=None,  # the task ends itself after episode_length steps
            device=device,
            validate_actions=validate_actions,
            render_mode=render_mode,
            episode_limit=episode_length,
        )
        self.num_symbols = num_symbols
        self.k = k
        self.episode_length = episode_length
        self.reward_scale = 1.0 / (episode_length - k)
        # Cards of each symbol in a full shoe: the episode deals episode_length + 1 cards.
        self.copies = shoe_copies(num_symbols, episode_length + 1)
        # The cards left in each env's shoe, as `TorchVectorEnv._deal` reads them.  (N, S)
        self._full_shoe = full_shoe(num_symbols, self.copies, self.device)  # (S,)
        self.shoe = self._full_shoe.repeat(num_envs, 1)
        self._symbols = torch.arange(num_symbols, device=self.device)  # one-hot codes
        # history[:, -1] is the symbol on show, history[:, 0] the one shown k steps
        # before it: a shift register of k + 1 symbols per env.  (N, k + 1)
        self.history = torch.zeros(num_envs, k + 1, dtype=torch.int64, device=self.device)
        self.t = torch.zeros(num_envs, dtype=torch.int64, device=self.device)

    def _reset_idx(self, mask: torch.Tensor) -> None:
        """Shuffle a fresh shoe, deal its first card and restart the step count where `mask`."""
        if self._resets_nothing(mask):
            return  # no draws: a third of a CPU step saved
        symbol, shoe = self._deal_fresh(self._full_shoe, self.shoe.shape[:-1])
        self.shoe = torch.where(mask[:, None], shoe, self.shoe)
        # Only the newest slot is written: the older ones leave the register in the k steps
        # before grading starts at t = k, so they are never graded (nor drawn).
        self.history[:, -1] = torch.where(mask, symbol, self.history[:, -1])
        self.t = torch.where(mask, 0, self.t)

    def _step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Grade the answer against the symbol k steps back, then deal the next one."""
        graded = self.t >= self.k
        correct = actions == self.history[:, 0]
        signed = torch.where(correct, self.reward_scale, -self.reward_scale)
        reward = torch.where(graded, signed, 0.0).to(torch.float32)
        self.t = self.t + 1
        symbol, self.shoe = self._deal(self.shoe)
        # Shift left by one and append the new symbol.  (N, k + 1)
        self.history = torch.cat([self.history[:, 1:], symbol[:, None]], dim=1)
        terminated = self.t >= self.episode_length
        return reward, terminated, {}

    def _observe(self) -> torch.Tensor:
        """(N, num_symbols) float32 one-hot of the symbol on show."""
        return (self.history[:, -1:] == self._symbols).to(torch.float32)

    def _render_state(self) -> dict[str, torch.Tensor]:
        """The symbol register (N, k + 1) and the step count (N,)."""
        return {"history": self.history, "t": self.t}

    def _draw_frames(self, state: dict[str, np.ndarray]) -> np.ndarray:
        """(N, 2 * SCALE, width * SCALE, 3) uint8 frames: symbols, answer, verdict, steps."""
        n, k = self.num_envs, self.k
        history, t = state["history"], state["t"]
        colours = palette(self.num_symbols)
        bar_width = min(self.episode_length, MAX_BAR)
        width = max(k + 4, bar_width)  # k + 1 symbols, a gap, answer, verdict
        cells = np.empty((n, 2, width, 3), dtype=np.uint8)  # (N, R, C, 3)
        cells[:] = BACKGROUND
        # Slot j of the register holds a symbol once t >= k - j (earlier slots are filler).
        shown = np.arange(k + 1)[None, :] >= k - t[:, None]  # (N, k + 1)
        cells[:, 0, : k + 1] = np.where(shown[..., None], colours[history], BACKGROUND)
        action, reward = state["action"], state["reward"]
        answered = action >= 0
        cells[:, 0, k + 2] = np.where(answered[:, None], colours[np.maximum(action, 0)], BACKGROUND)
        cells[:, 0, k + 3] = verdict(reward, answered)
        steps = bar(t, self.episode_length, bar_width)  # (N, bar_width)
        cells[:, 1, :bar_width] = np.where(steps[..., None], STEP_COLOUR, BACKGROUND)
        return cells_to_pixels(cells, SCALE)
