"""Autoencode memory task (POPGym's Autoencode, Morad et al. 2023): a sequence, played back.

An episode has two phases. Watch: the agent is shown `length` cards, one per step, while
its actions are ignored (reward 0). Play: it must name those cards in reverse order, the
last card first, one per step. The memory is the whole sequence in order, not one value.

Writing c_0 .. c_{L-1} for the cards shown (L = `length`), observation t shows c_t for
t <= L - 1; the observation that shows c_{L-1} already carries the play flag, so the
agent's first answer comes at t = L - 1. The answer at step t >= L - 1 is c_{2(L-1) - t}:
c_{L-1} first, c_0 last, at step 2L - 2. Cards are suits (4 by default) dealt from a
shuffled shoe of 52-card decks (`base.shoe_copies`).

Observation, 1 + num_symbols floats: a watch flag (1 while cards are still to come),
then the one-hot card on show (zeros after c_{L-1}, during play). Reward: 0 while
watching, +1/length for each right answer, -1/length for each wrong one: the best return
is 1.0, uniform random answers score (2 - num_symbols) / num_symbols (-0.5 for 4).

Episodes last 2 * length - 1 steps and end with terminated=True. `length` is the memory
distance twice over: c_0 is recalled 2L - 2 steps after it was seen.

POPGym's presets (`Autoencode.popgym_presets`), with the same rewards and returns as
POPGym, whose episodes deal every card of its decks:

    easy    length=52    (POPGym: 1 deck,  103 steps)
    medium  length=104   (POPGym: 2 decks, 207 steps)
    hard    length=156   (POPGym: 3 decks, 311 steps)
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
from rltrans.envs.torch_envs.draw import BACKGROUND, cells_to_pixels, palette, verdict

__all__ = ["Autoencode"]

SCALE = 10  # pixels per cell
ROW = 26  # cards per row of a frame
WATCH_COLOUR, PLAY_COLOUR = (66, 133, 244), (244, 160, 0)


class Autoencode(TorchVectorEnv):
    """N Autoencode tasks stepped together.

    POPGym observes (mode, suit) as two discrete values and shows suit 0 during play; here
    the mode is one flag and play shows no card (both carry no information).

    Frames (`render_mode="rgb_array"`), one colour per symbol. Top row: the phase (blue
    watch, orange play), a gap, the last answer and its verdict (green correct, red wrong,
    grey while watching). Below, the cards shown so far in rows of 26; cards already
    played back are pale.

    Example:
        >>> env = Autoencode(num_envs=16, length=8)
        >>> obs, _ = env.reset(seed=0)          # (16, 5): watch flag, one-hot card
        >>> obs, r, term, trunc, info = env.step(torch.zeros(16, dtype=torch.long))
        >>> easy = Autoencode(num_envs=16, **Autoencode.popgym_presets["easy"])

    Args:
        num_envs: number of envs N.
        length: cards to memorise (>= 1); an episode lasts 2 * length - 1 steps.
        num_symbols: size of the card alphabet (>= 2); also the number of actions.
        device: where all state and returned tensors live.
        validate_actions: check action values each step (a host sync for GPU-tensor actions).
        render_mode: "rgb_array" to draw frames with `render()` (see Frames above).
    """

    # POPGym's AutoencodeEasy/Medium/Hard (see Frames above).
    popgym_presets: ClassVar[dict[str, dict[str, int]]] = {
        "easy": {"length": 52},
        "medium": {"length": 104},
        "hard": {"length": 156},
    }

    def __init__(
        self,
        num_envs: int,
        length: int = 52,
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
            single_observation_space=gym.spaces.Box(0.0, 1.0, (1 + num_symbols,), dtype=np.float32),
            single_action_space=gym.spaces.Discrete(num_symbols),
            max_episode_steps=None,  # the task ends itself after 2 * length - 1 steps
            device=device,
            validate_actions=validate_actions,
            render_mode=render_mode,
            episode_limit=2 * length - 1,
        )
        self.length = length
        self.num_symbols = num_symbols
        self.reward_scale = 1.0 / length
        self.copies = shoe_copies(num_symbols, length)
        # The cards left in each env's shoe, as `TorchVectorEnv._deal` reads them.  (N, S)
        self._full_shoe = full_shoe(num_symbols, self.copies, self.device)  # (S,)
        self.shoe = self._full_shoe.repeat(num_envs, 1)
        # The cards shown this episode, c_0 .. c_{L-1} (c_t recorded when step t begins), then
        # a scratch slot that play writes to; later slots are stale until written.  (N, L + 1)
        self.cards = torch.zeros(num_envs, length + 1, dtype=torch.int64, device=self.device)
        # The card on show, -1 for none (play after c_{L-1}); the step count.  (N,) each
        self.on_show = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self.t = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self._symbols = torch.arange(num_symbols, device=self.device)  # one-hot codes

    def _reset_idx(self, mask: torch.Tensor) -> None:
        """Shuffle a fresh shoe and show its first card where `mask` is True."""
        if self._resets_nothing(mask):
            return  # no draws: a third of a CPU step saved
        first, shoe = self._deal_fresh(self._full_shoe, self.shoe.shape[:-1])
        self.shoe = torch.where(mask[:, None], shoe, self.shoe)
        self.on_show = torch.where(mask, first, self.on_show)
        self.t = torch.where(mask, 0, self.t)

    def _step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Watch: deal the next card. Play: grade the answer against the card due."""
        last = self.length - 1
        # Record c_t at slot t; during play (t > L - 1) the -1 on show goes to scratch slot L.
        self.cards.scatter_(1, self.t.clamp(max=self.length)[:, None], self.on_show[:, None])
        watching = self.t < last
        # The card to name at step t >= L - 1 is c_{2(L-1) - t} (clamped while watching).
        due = (2 * last - self.t).clamp(0, last)[:, None]  # (N, 1)
        correct = actions == self.cards.gather(1, due)[:, 0]
        signed = torch.where(correct, self.reward_scale, -self.reward_scale)
        reward = torch.where(watching, 0.0, signed)  # float32
        # Deal c_{t+1} while watching; during play the cards dealt are discarded.
        card, self.shoe = self._deal(self.shoe)
        self.on_show = torch.where(watching, card, -1)
        self.t = self.t + 1
        return reward, self.t >= 2 * self.length - 1, {}

    def _observe(self) -> torch.Tensor:
        """(N, 1 + num_symbols) float32: watch flag, then the one-hot card on show (or zeros)."""
        obs = torch.empty(self.num_envs, 1 + self.num_symbols, device=self.device)
        obs[:, 0] = self.t < self.length - 1
        obs[:, 1:] = self.on_show[:, None] == self._symbols
        return obs

    def _render_state(self) -> dict[str, torch.Tensor]:
        """The cards recorded (N, L), the card on show and the step count (N,)."""
        return {"cards": self.cards[:, : self.length], "on_show": self.on_show, "t": self.t}

    def _draw_frames(self, state: dict[str, np.ndarray]) -> np.ndarray:
        """(N, (1 + rows) * SCALE, width * SCALE, 3) uint8 frames: phase, verdict, cards."""
        n, length, last = self.num_envs, self.length, self.length - 1
        t, cards = state["t"], state["cards"].copy()
        # The card on show is recorded when the next step begins: c_t, for t <= L - 1.
        showing = np.flatnonzero(t <= last)
        cards[showing, t[showing]] = state["on_show"][showing]
        rows, width = -(-length // ROW), max(min(length, ROW), 4)
        cells = np.empty((n, 1 + rows, width, 3), dtype=np.uint8)  # (N, R, C, 3)
        cells[:] = BACKGROUND
        cells[:, 0, 0] = np.where((t < last)[:, None], WATCH_COLOUR, PLAY_COLOUR)
        palette_ = palette(self.num_symbols)
        action, answered = state["action"], state["action"] >= 0
        answer = palette_[np.maximum(action, 0)]
        cells[:, 0, 2] = np.where(answered[:, None], answer, BACKGROUND)
        cells[:, 0, 3] = verdict(state["reward"], answered)
        colours = palette_[cards]  # (N, L, 3); unrecorded slots are hidden below
        index = np.arange(length)[None, :]  # (1, L)
        played = np.maximum(t - last, 0)[:, None]  # answers given, (N, 1)
        shown = index <= np.minimum(t, last)[:, None]  # (N, L)
        recited = index >= length - played  # (N, L)
        pale = (colours.astype(np.int32) + np.asarray(BACKGROUND)) // 2
        grid = np.where(recited[..., None], pale, colours)
        grid = np.where(shown[..., None], grid, BACKGROUND).astype(np.uint8)
        # The L cards in rows of ROW (the last row padded with background).  (N, rows, ROW, 3)
        padded = np.full((n, rows * ROW, 3), BACKGROUND, dtype=np.uint8)
        padded[:, :length] = grid
        cells[:, 1:] = padded.reshape(n, rows, ROW, 3)[:, :, :width]
        return cells_to_pixels(cells, SCALE)
