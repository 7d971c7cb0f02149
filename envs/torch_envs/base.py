"""Shared machinery for torch-native batched environments.

A `TorchVectorEnv` keeps the state of all N environments in torch tensors on one device and
steps them together: no Python loop over envs, no host sync on the step path (unless
action-value validation is on). It speaks the Gymnasium 1.x `VectorEnv` API with tensors.

Autoreset is SAME_STEP (https://farama.org/Vector-Autoreset-Mode): where env i ends,
`obs[i]` is already the first observation of its next episode and the true last one is in
`info["final_obs"][i]`. Every `step` returns the same info keys, each with a `_key` mask (N,)
of the meaningful rows, so no caller tests key presence (a host sync):

    info["final_obs"]   (N, ...) obs reached by this step, before any reset (= `obs` where
                        the env did not end); info["_final_obs"] (N,) bool: it ended
    info["episode"]     {"r": float32 (N,), "l": int64 (N,)}: the ended episode's return and
                        length, 0 elsewhere (RecordEpisodeStatistics' layout, without "t");
                        info["_episode"] as `_final_obs`
    info[key], info[f"_{key}"]  per-episode values an env reports (e.g. TMaze "success"),
                        zero/False where the episode did not end

Subclasses write only the dynamics, `_reset_idx(mask)`, `_step(actions)` and `_observe()`;
this class owns autoreset, episode statistics, the time limit, action conversion and
validation, and seeding.

Rendering (`render_mode="rgb_array"`): `render()` returns one RGB frame (H, W, 3) uint8 per
env, drawn with NumPy from the state (no pygame; only the tensors a frame needs are copied to
the host). After a step, an env whose episode just ended shows the state it reached (the
frame of `info["final_obs"]`), so a recorded episode ends on its last state. Subclasses that
render implement `_render_state()` and `_draw_frames()`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

__all__ = ["DECK_SIZE", "RenderMode", "TorchVectorEnv", "full_shoe", "shoe_copies"]

RenderMode = Literal["rgb_array"]

# Cards in one deck: POPGym's card tasks (Morad et al. 2023) deal from standard 52-card decks.
DECK_SIZE = 52


def _zero_where_not(mask: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Rows of `value` where `mask` (N,) is False set to zero (False for bool)."""
    # (N,) -> (N, 1, ..., 1) so the mask broadcasts over trailing dims.
    m = mask.view(-1, *([1] * (value.dim() - 1)))
    return torch.where(m, value, torch.zeros((), dtype=value.dtype, device=value.device))


def check_int(name: str, value: object, low: int) -> None:
    """Raise ValueError unless ``value`` is an int (not a bool) >= ``low``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def shoe_copies(num_symbols: int, cards: int) -> int:
    """Cards of each symbol in the fewest decks that hold `cards` cards.

    A deck holds ceil(52 / num_symbols) cards of each symbol: the 52 cards of a standard
    deck for 2 (colours), 4 (suits) or 13 (ranks) symbols.

        >>> shoe_copies(4, 52), shoe_copies(4, 53), shoe_copies(13, 208)
        (13, 26, 16)
    """
    per_deck = -(-DECK_SIZE // num_symbols)  # ceil division
    decks = -(-cards // (per_deck * num_symbols))
    return decks * per_deck


def full_shoe(num_symbols: int, copies: int, device: str | torch.device) -> torch.Tensor:
    """A fresh shoe for `TorchVectorEnv._deal`: `copies` cards of each symbol, as the
    running totals (num_symbols,) that `_deal` reads (float64, exact for any real shoe)."""
    return copies * torch.arange(1, num_symbols + 1, device=device, dtype=torch.float64)


class TorchVectorEnv(VectorEnv[torch.Tensor, torch.Tensor, torch.Tensor]):
    """Base class for batched environments whose state lives in torch tensors.

    Subclasses call `super().__init__` with the single-env spaces, then implement:

    - `_reset_idx(mask)`: re-draw the initial state of envs where `mask` (N,) is True,
      with `torch.where` (no boolean indexing, which would sync with the host);
    - `_step(actions)`: advance all N envs by one step with `actions` (N, ...) on the
      device, return `(reward (N,) float32, terminated (N,) bool, episode_info)` where
      `episode_info` maps names to (N,) tensors that are meaningful at episode end;
    - `_observe()`: the current observation (N, ...) float32 from the state.

    Random draws must use `self.generator`, which `reset(seed=...)` seeds. Card tasks deal
    their symbols from shuffled decks with `_deal` and `_deal_fresh`.

    To render (`render_mode="rgb_array"`), a subclass also implements:

    - `_render_state()`: the state tensors (N, ...) a frame is drawn from;
    - `_draw_frames(state)`: frames (N, H, W, 3) uint8 from those tensors as NumPy arrays, plus
      `state["action"]` (N,) int64, the action of the last step (-1 after a reset), and
      `state["reward"]` (N,) float32, its reward (0 after a reset).
    """

    metadata: ClassVar[dict[str, Any]] = {
        "autoreset_mode": AutoresetMode.SAME_STEP,
        "render_modes": ["rgb_array"],
        "render_fps": 4,  # frames per second of a recorded episode (VideoRecorder's GIF)
    }

    def __init__(
        self,
        num_envs: int,
        single_observation_space: gym.spaces.Box,
        single_action_space: gym.spaces.Discrete,
        max_episode_steps: int | None,
        device: str | torch.device = "cpu",
        validate_actions: bool = True,
        render_mode: RenderMode | None = None,
        episode_limit: int | None = None,
    ) -> None:
        """Set spaces, device, generator and episode counters for `num_envs` envs.
        ``episode_limit``: the steps every episode of a task that ends itself lasts at most."""
        if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
        if max_episode_steps is not None and (
            not isinstance(max_episode_steps, int) or max_episode_steps < 1
        ):
            raise ValueError(
                f"max_episode_steps must be a positive int or None, got {max_episode_steps!r}"
            )
        if not isinstance(single_action_space, gym.spaces.Discrete):
            raise TypeError(
                f"TorchVectorEnv supports Discrete action spaces, got {single_action_space}"
            )
        if int(single_action_space.start) != 0:
            raise ValueError(f"Discrete action spaces must start at 0, got {single_action_space}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode={render_mode!r}; valid: None, {self.metadata['render_modes']}"
            )
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.max_episode_steps = max_episode_steps
        self.episode_limit = episode_limit
        self.validate_actions = validate_actions
        self.render_mode = render_mode
        self.single_observation_space = single_observation_space
        self.single_action_space = single_action_space
        self.observation_space = batch_space(single_observation_space, num_envs)
        self.action_space = batch_space(single_action_space, num_envs)
        self._num_actions = int(single_action_space.n)

        # One generator for all envs, on the env's device so draws never leave it.
        # Seeded from OS entropy until reset(seed=...) like Gymnasium's unseeded envs
        # (a fresh torch.Generator would otherwise start from the same fixed seed).
        self.generator = torch.Generator(device=self.device)
        self.generator.seed()

        self._episode_return = torch.zeros(num_envs, dtype=torch.float32, device=self.device)
        self._episode_length = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self._has_reset = False
        # What render() draws after a step: the state before the autoreset (None: draw
        # the current state, as after a reset).
        self._shown: dict[str, torch.Tensor] | None = None

    # ------------------------------------------------------------------ dynamics API
    def _reset_idx(self, mask: torch.Tensor) -> None:
        """Re-initialise the state of envs where `mask` (N,) bool is True."""
        raise NotImplementedError

    def _step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Advance all envs; return (reward (N,), terminated (N,), episode_info)."""
        raise NotImplementedError

    def _observe(self) -> torch.Tensor:
        """Current observation (N, ...) float32 computed from the state."""
        raise NotImplementedError

    def _render_state(self) -> dict[str, torch.Tensor]:
        """The state tensors (N, ...) that `_draw_frames` draws a frame from."""
        raise NotImplementedError(f"{type(self).__name__} does not render")

    def _draw_frames(self, state: dict[str, np.ndarray]) -> np.ndarray:
        """Frames (N, H, W, 3) uint8 from `_render_state()` as NumPy, with action and reward."""
        raise NotImplementedError(f"{type(self).__name__} does not render")

    # ------------------------------------------------------------------ Gymnasium API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Reset all envs (or those in `options["reset_mask"]`); return (obs (N, ...), {}).

        `seed` re-seeds the env's torch generator, so the same seed gives the same
        episodes. `options={"reset_mask": mask}` resets only the envs where the (N,)
        bool mask is True, as in Gymnasium's vector envs.
        """
        if seed is not None:
            if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
                raise TypeError(
                    f"seed must be an int or None (one generator drives all envs), got {seed!r}"
                )
            super().reset(seed=int(seed))  # also seeds self.np_random for API parity
            self.generator.manual_seed(int(seed))
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        if options:
            raise ValueError(f"unknown reset options {sorted(options)}; valid: ['reset_mask']")
        if mask is None:
            mask = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        else:
            mask = torch.as_tensor(mask, device=self.device)
            if mask.dtype != torch.bool or mask.shape != (self.num_envs,):
                raise ValueError(
                    f"reset_mask must be a bool array of shape ({self.num_envs},), "
                    f"got dtype {mask.dtype} shape {tuple(mask.shape)}"
                )
            if not self._has_reset:
                raise RuntimeError("the first reset() must reset all envs (no reset_mask)")
        self._reset_idx(mask)
        self._episode_return = _zero_where_not(~mask, self._episode_return)
        self._episode_length = _zero_where_not(~mask, self._episode_length)
        self._has_reset = True
        self._shown = None
        return self._observe(), {}

    def step(
        self, actions: torch.Tensor | np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Step all envs with `actions` (N,); return (obs, reward, terminated, truncated, info).

        Envs that end are reset in the same call (SAME_STEP autoreset); see the module
        docstring for the info layout.
        """
        if not self._has_reset:
            raise RuntimeError(f"{type(self).__name__}.step() called before reset()")
        actions = self._convert_actions(actions)
        reward, terminated, episode_info = self._step(actions)

        self._episode_return = self._episode_return + reward
        self._episode_length = self._episode_length + 1
        # Same rule as gymnasium.wrappers.TimeLimit: truncation depends only on the step
        # count, so terminated and truncated can both be True at the limit.
        if self.max_episode_steps is None:
            truncated = torch.zeros_like(terminated)
        else:
            truncated = self._episode_length >= self.max_episode_steps
        done = terminated | truncated

        final_obs = self._observe()
        info: dict[str, Any] = {
            "final_obs": final_obs,
            "_final_obs": done,
            "episode": {
                "r": _zero_where_not(done, self._episode_return),
                "l": _zero_where_not(done, self._episode_length),
            },
            "_episode": done,
        }
        for key, value in episode_info.items():
            info[key] = _zero_where_not(done, value)
            info[f"_{key}"] = done

        if self.render_mode is not None:
            # Frames show the state this step reached, before the autoreset (as final_obs).
            # Copies on the device: no host sync until render() is called.
            state = {k: v.clone() for k, v in self._render_state().items()}
            self._shown = {**state, "action": actions.clone(), "reward": reward.clone()}
        # SAME_STEP autoreset: re-draw ended envs now so obs is their first observation.
        self._reset_idx(done)
        self._episode_return = _zero_where_not(~done, self._episode_return)
        self._episode_length = _zero_where_not(~done, self._episode_length)
        obs = torch.where(done.view(-1, *([1] * (final_obs.dim() - 1))), self._observe(), final_obs)
        return obs, reward, terminated, truncated, info

    @property
    def time_limit(self) -> int | None:
        """The most steps an episode can last: the truncation limit, else the task's own end
        (None: unbounded)."""
        if self.max_episode_steps is not None and self.episode_limit is not None:
            return min(self.max_episode_steps, self.episode_limit)
        return self.max_episode_steps if self.max_episode_steps is not None else self.episode_limit

    def render(self) -> tuple[np.ndarray, ...] | None:
        """One RGB frame (H, W, 3) uint8 per env, drawn from the state (None without a
        render_mode, as Gymnasium's envs)."""
        if self.render_mode is None:
            return None
        if not self._has_reset:
            raise RuntimeError(f"{type(self).__name__}.render() called before reset()")
        state = self._shown
        if state is None:  # after a reset: no step to show yet
            state = {
                **self._render_state(),
                "action": torch.full((self.num_envs,), -1, device=self.device),
                "reward": torch.zeros(self.num_envs, device=self.device),
            }
        # Rendering's only device -> host copies: the few small tensors a frame needs.
        frames = self._draw_frames({k: v.cpu().numpy() for k, v in state.items()})  # (N, H, W, 3)
        return tuple(frame.copy() for frame in frames)  # frames that do not share one buffer

    # ------------------------------------------------------------------ helpers
    def _resets_nothing(self, mask: torch.Tensor) -> bool:
        """Whether `_reset_idx(mask)` may return at once: on the CPU, where reading the mask
        is free, when it is all False (most steps of a fixed-length task, whose envs end
        together); never on other devices, where reading it would wait for the device."""
        return self.device.type == "cpu" and not bool(mask.any())

    def _deal(self, shoe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Deal one card from each shoe: (symbols (N, ...), the shoes without them).

        A shoe is one or more shuffled decks of cards, each card showing one of S symbols.
        `shoe` (N, ..., S) holds the cards left as running totals over the symbols:
        shoe[..., s] counts the cards of symbols 0..s, so shoe[..., -1] counts them all
        (`full_shoe` builds a fresh one). The card dealt is uniform among those left, so
        symbol s comes with probability (cards of s left) / (cards left): dealing a shoe card
        by card gives the symbol sequence of a uniformly shuffled deck, with S counters as
        the only state. An empty shoe deals symbol S and stays empty. Card tasks draw all
        their symbols here and in `_deal_fresh`, the places a test replaces to replay decks.
        """
        # A uniform position among the cards left, [0, left) (float64: unbiased for any shoe).
        u = torch.rand(
            (*shoe.shape[:-1], 1), generator=self.generator, device=self.device, dtype=shoe.dtype
        )
        # The cards are in symbol order: the card at that position shows the first symbol
        # whose running total exceeds the position.
        before = u * shoe[..., -1:] >= shoe  # (N, ..., S): symbols before the dealt one
        # Every running total from the dealt symbol on loses one card.
        return before.sum(-1), torch.add(shoe, ~before, alpha=-1)

    def _deal_fresh(
        self, full: torch.Tensor, shape: tuple[int, ...]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`_deal` from fresh shoes `full` (S,) (`full_shoe`), one for each index of `shape`
        (N, ...): the same law in fewer operations (a reset's hot path), as every symbol
        is equally likely to come first."""
        symbol = torch.randint(0, full.numel(), shape, generator=self.generator, device=self.device)
        after = torch.arange(full.numel(), device=self.device) >= symbol.unsqueeze(-1)  # (..., S)
        return symbol, torch.add(full, after, alpha=-1)

    def _convert_actions(self, actions: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Actions (N,) of integer dtype as an int64 tensor on the device, validated."""
        if not isinstance(actions, torch.Tensor):
            actions = torch.as_tensor(np.asarray(actions))
        if actions.shape != (self.num_envs,):
            raise ValueError(
                f"actions must have shape ({self.num_envs},) (one Discrete action per env), "
                f"got shape {tuple(actions.shape)}"
            )
        if actions.dtype == torch.bool or actions.is_floating_point() or actions.is_complex():
            raise TypeError(f"actions must have an integer dtype, got {actions.dtype}")
        if self.validate_actions:
            # Checked where the actions are: free for NumPy/CPU input, one device->host
            # read for device tensors (turn off with validate_actions=False on GPU hot loops).
            bad = (actions < 0) | (actions >= self._num_actions)
            if bool(bad.any()):
                i = int(bad.nonzero()[0, 0])
                raise ValueError(
                    f"invalid action {int(actions[i])} for env {i}: "
                    f"valid actions are 0..{self._num_actions - 1} ({self.single_action_space})"
                )
        actions = actions.to(device=self.device, dtype=torch.int64)
        return actions

    def __repr__(self) -> str:
        """Class name, number of envs and device."""
        return f"{type(self).__name__}(num_envs={self.num_envs}, device={self.device})"
