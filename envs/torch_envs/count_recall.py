"""Count Recall memory task (POPGym's CountRecall, Morad et al. 2023): an aggregate.

Each observation shows two cards: a value card from one shuffled shoe and a query card from
a second. The agent answers how many value cards of the queried symbol it has seen so far in
the episode, the one on show included: the memory is a set of counters over the episode,
not a recall of one moment. With v_t and q_t the symbols on show at step t (t = 0 is the
reset observation), the answer at step t is #{j <= t : v_j == q_t}.

Cards come from shoes of 52-card decks, as many as the episode needs (`base.shoe_copies`),
each deck holding ceil(52 / num_symbols) cards of each symbol (2 symbols: colours, 4: suits,
13: ranks). A count never exceeds `copies`, so the actions are Discrete(copies + 1).
Observation: one-hot of the value's symbol, then of the query's (2 * num_symbols floats).
Reward: +1/length for the right count, -1/length otherwise, at each of the `length` steps;
the best return is 1.0, a uniform random answer 2 / (copies + 1) - 1 in expectation. Episodes
last `length` steps (the memory distance) and end terminated; the final observation is
never queried.

POPGym's presets (`CountRecall.popgym_presets`), with POPGym's observations, actions,
rewards and returns (its episodes deal every card):

    easy    length=51   num_symbols=2    (POPGym: 1 deck, colours; 27 actions)
    medium  length=103  num_symbols=4    (POPGym: 2 decks, suits; 27 actions)
    hard    length=207  num_symbols=13   (POPGym: 4 decks, ranks; 17 actions)

Frames (`render_mode="rgb_array"`): a top row with the value card, the query card and the
last answer's verdict (green correct, red wrong), then a row per symbol with its colour, a
marker where it is queried and a bar of its count so far (full width: `copies`).
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

__all__ = ["CountRecall"]

SCALE = 10  # pixels per cell
MAX_BAR = 32  # cells of a count bar
COUNT_COLOUR, QUERY_MARK = (60, 60, 60), (0, 0, 0)


class CountRecall(TorchVectorEnv):
    """N Count Recall tasks stepped together.

    Example:
        >>> env = CountRecall(num_envs=16, length=64, num_symbols=4)
        >>> obs, _ = env.reset(seed=0)          # (16, 8): value and query, one-hot each
        >>> env.single_action_space             # counts 0..26 (4 suits in 2 decks)
        Discrete(27)
        >>> easy = CountRecall(num_envs=16, **CountRecall.popgym_presets["easy"])

    Args:
        num_envs: number of envs N.
        length: steps per episode (>= 1), all graded.
        num_symbols: symbols counted (>= 2): 2 colours, 4 suits, 13 ranks of a card.
        device: where all state and returned tensors live.
        validate_actions: check action values each step (a host sync for GPU-tensor actions).
        render_mode: "rgb_array" to draw frames with `render()` (see the module docstring).
    """

    # POPGym's CountRecallEasy/Medium/Hard (see the module docstring).
    popgym_presets: ClassVar[dict[str, dict[str, int]]] = {
        "easy": {"length": 51, "num_symbols": 2},
        "medium": {"length": 103, "num_symbols": 4},
        "hard": {"length": 207, "num_symbols": 13},
    }

    def __init__(
        self,
        num_envs: int,
        length: int = 51,
        num_symbols: int = 2,
        device: str | torch.device = "cpu",
        validate_actions: bool = True,
        render_mode: RenderMode | None = None,
    ) -> None:
        """Build N tasks; see the class docstring for the arguments."""
        check_int("length", length, 1)
        check_int("num_symbols", num_symbols, 2)
        # Each shoe deals length + 1 cards: the first pair and one pair after each step.
        copies = shoe_copies(num_symbols, length + 1)
        super().__init__(
            num_envs=num_envs,
            single_observation_space=gym.spaces.Box(0.0, 1.0, (2 * num_symbols,), dtype=np.float32),
            single_action_space=gym.spaces.Discrete(copies + 1),
            max_episode_steps=None,  # the task ends itself after `length` steps
            device=device,
            validate_actions=validate_actions,
            render_mode=render_mode,
            episode_limit=length,
        )
        self.length = length
        self.num_symbols = num_symbols
        self.copies = copies
        self.reward_scale = 1.0 / length
        # The cards left in the value shoe [:, 0] and the query shoe [:, 1], as
        # `TorchVectorEnv._deal` reads them.  (N, 2, S)
        self._full_shoe = full_shoe(num_symbols, copies, self.device)  # (S,)
        self.shoe = self._full_shoe.repeat(num_envs, 2, 1)
        # The value and query symbols on show.  (N, 2)
        self.cards = torch.zeros(num_envs, 2, dtype=torch.int64, device=self.device)
        # Value cards of each symbol seen this episode, the one on show included.  (N, S)
        self.counts = torch.zeros(num_envs, num_symbols, dtype=torch.int64, device=self.device)
        self.t = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self._symbols = torch.arange(num_symbols, device=self.device)  # one-hot codes

    def _reset_idx(self, mask: torch.Tensor) -> None:
        """Shuffle fresh shoes and deal the first pair where `mask` is True."""
        if self._resets_nothing(mask):
            return  # no draws: a third of a CPU step saved
        cards, shoe = self._deal_fresh(self._full_shoe, self.shoe.shape[:-1])
        self.shoe = torch.where(mask[:, None, None], shoe, self.shoe)
        self.cards = torch.where(mask[:, None], cards, self.cards)
        first = cards[:, :1] == self._symbols  # (N, S)
        self.counts = torch.where(mask[:, None], first, self.counts)
        self.t = torch.where(mask, 0, self.t)

    def _step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Grade the count of the queried symbol, then deal the next pair."""
        answer = self.counts.gather(1, self.cards[:, 1:])  # (N, 1)
        correct = actions == answer[:, 0]
        reward = torch.where(correct, self.reward_scale, -self.reward_scale)  # float32
        self.cards, self.shoe = self._deal(self.shoe)
        self.counts = self.counts + (self.cards[:, :1] == self._symbols)
        self.t = self.t + 1
        return reward, self.t >= self.length, {}

    def _observe(self) -> torch.Tensor:
        """(N, 2 * num_symbols) float32: one-hot value symbol, then one-hot query symbol."""
        one_hot = self.cards[:, :, None] == self._symbols  # (N, 2, S)
        return one_hot.flatten(1).to(torch.float32)

    def _render_state(self) -> dict[str, torch.Tensor]:
        """The cards on show (N, 2) and the counts (N, S)."""
        return {"cards": self.cards, "counts": self.counts}

    def _draw_frames(self, state: dict[str, np.ndarray]) -> np.ndarray:
        """(N, (S + 1) * SCALE, (bar + 2) * SCALE, 3) uint8 frames: cards, verdict, counts."""
        n, s = self.num_envs, self.num_symbols
        colours = palette(s)
        bar_width = min(self.copies, MAX_BAR)
        cells = np.empty((n, s + 1, max(bar_width + 2, 5), 3), dtype=np.uint8)  # (N, R, C, 3)
        cells[:] = BACKGROUND
        value, query = state["cards"][:, 0], state["cards"][:, 1]
        cells[:, 0, 0], cells[:, 0, 1] = colours[value], colours[query]
        cells[:, 0, 3] = verdict(state["reward"], state["action"] >= 0)
        cells[:, 1:, 0] = colours  # the symbol of each count row
        queried = np.arange(s)[None, :] == query[:, None]  # (N, S)
        cells[:, 1:, 1] = np.where(queried[..., None], QUERY_MARK, BACKGROUND)
        counts = bar(state["counts"].reshape(-1), self.copies, bar_width).reshape(n, s, -1)
        cells[:, 1:, 2 : 2 + bar_width] = np.where(counts[..., None], COUNT_COLOUR, BACKGROUND)
        return cells_to_pixels(cells, SCALE)
