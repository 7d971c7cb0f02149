"""Standard Atari preprocessing for ALE environments, as single-env Gymnasium wrappers.

The recipe is the one of Mnih et al. 2015 ("Human-level control through deep RL", Methods) with the
evaluation protocol remarks of Machado et al. 2018 ("Revisiting the ALE"), in the form CleanRL's
``ppo_atari.py`` and Stable-Baselines3's ``AtariWrapper`` use it:

==================  =========  ==========  ====================================================
step                training   evaluation  implemented by
==================  =========  ==========  ====================================================
no-op reset (30)    yes        yes         ``gymnasium.wrappers.AtariPreprocessing``
frame skip 4, max   yes        yes         ``AtariPreprocessing`` (max over the last two frames)
84x84 grayscale     yes        yes         ``AtariPreprocessing`` (cv2 INTER_AREA)
episodic life       yes        no          :class:`EpisodicLife` (below)
FIRE on reset       yes        yes         :class:`FireReset` (below), only where action 1 is FIRE
reward sign clip    yes        no          :class:`SignReward` (below)
frame stack 4       yes        yes         ``FrameStackObservation`` -> (4, 84, 84) uint8
==================  =========  ==========  ====================================================

FIRE-on-reset is kept for evaluation too: it changes no reward, and an agent trained with it (where
every life starts already launched) may never have learned to press FIRE at the start of a game.

The underlying ALE env must be made with ``frameskip=1`` (``ALE/*-v5`` defaults to 4, which would
skip twice); :func:`rltrans.envs.gym_vec.make_vector_env` does that. Sticky actions
(``repeat_action_probability``, 0.25 for ``-v5`` ids) stay at the id's default.
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

# ALE action 0 is NOOP and action 1 is FIRE in every minimal action set that has FIRE.
NOOP_ACTION = 0
FIRE_ACTION = 1


def is_ale_env(env: gym.Env) -> bool:
    """True when the innermost env is an Arcade Learning Environment (has an ``ale`` interface)."""
    return hasattr(env.unwrapped, "ale") and hasattr(env.unwrapped, "get_action_meanings")


class EpisodicLife(gym.Wrapper):
    """Ends the learner's episode (``terminated=True``) on a life loss without resetting the game.

    Mnih et al. 2015 treat a life loss as terminal for the value target while the game goes on.
    After a life-loss termination the next ``reset()`` does not restart the game: it takes one
    NOOP step and returns that observation (SB3's ``EpisodicLifeEnv`` behaves the same).
    ``gymnasium.wrappers.AtariPreprocessing(terminal_on_life_loss=True)`` instead restarts the game,
    which turns every life into a separate game and breaks the real return.

    Differences from SB3: a ``reset()`` that does not follow a life loss, or that passes a ``seed``
    or ``options``, is always a real reset (SB3 would continue a game that is not over); and if the
    game ends during the NOOP step, the real reset's info is merged over that step's info so that
    statistics recorded underneath (``RecordEpisodeStatistics``) are not lost.

    Terminal on the last life is the game's own termination; games without lives (Pong reports 0)
    are unaffected.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        if not is_ale_env(env):
            raise TypeError(f"EpisodicLife needs an ALE env (with .unwrapped.ale), got {env}")
        self._lives = 0
        # True after a step that ended the learner's episode on a life loss (the game goes on).
        self._continue_game = False

    def _ale_lives(self) -> int:
        return int(self.env.unwrapped.ale.lives())

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Steps the game; ``terminated`` is also True when a life was lost."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = self._ale_lives()
        # 0 < lives: losing the last life is the game's own termination (SB3's rule).
        life_lost = 0 < lives < self._lives
        self._lives = lives
        self._continue_game = life_lost and not (terminated or truncated)
        return obs, reward, terminated or life_lost, truncated, info

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Real reset after a game over; a single NOOP step after a life loss."""
        if self._continue_game and seed is None and options is None:
            self._continue_game = False
            obs, _, terminated, truncated, info = self.env.step(NOOP_ACTION)
            if terminated or truncated:
                # The game ended during the NOOP step: keep that step's info (game statistics).
                obs, reset_info = self.env.reset()
                info = {**info, **reset_info}
        else:
            obs, info = self.env.reset(seed=seed, options=options)
        self._continue_game = False
        self._lives = self._ale_lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Presses FIRE (then action 2) after each reset, for games that stand still until FIRE.

    From OpenAI baselines' ``FireResetEnv`` (also in SB3 and CleanRL): Breakout and others do not
    launch the ball until FIRE is pressed. Rewards of these two steps are not returned (the raw
    ``RecordEpisodeStatistics`` below still counts them). If the game ends during them, the env is
    reset again and, as in :class:`EpisodicLife`, the step's info is kept under the reset info.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()
        if len(meanings) < 3 or meanings[FIRE_ACTION] != "FIRE":
            raise ValueError(
                f"FireReset needs action {FIRE_ACTION} to be FIRE and at least 3 actions; "
                f"this game has {meanings}. Use needs_fire_reset(env) to decide."
            )

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Resets, then steps FIRE and action 2."""
        obs, info = self.env.reset(seed=seed, options=options)
        for action in (FIRE_ACTION, 2):
            obs, _, terminated, truncated, step_info = self.env.step(action)
            if terminated or truncated:
                obs, reset_info = self.env.reset()
                info = {**step_info, **reset_info}
        return obs, info


def needs_fire_reset(env: gym.Env) -> bool:
    """True for ALE games whose action 1 is FIRE (SB3/CleanRL apply FireReset exactly then)."""
    meanings = env.unwrapped.get_action_meanings()
    return len(meanings) >= 3 and meanings[FIRE_ACTION] == "FIRE"


def _sign(reward: SupportsFloat) -> float:
    return float(np.sign(reward))


class SignReward(gym.RewardWrapper):
    """Clips rewards to their sign {-1, 0, +1} (Mnih et al. 2015: one step size for all games)."""

    def reward(self, reward: SupportsFloat) -> float:
        """Returns sign(reward)."""
        return _sign(reward)


def wrap_atari(
    env: gym.Env,
    *,
    training: bool,
    noop_max: int = 30,
    frame_skip: int = 4,
    screen_size: int = 84,
    frame_stack: int = 4,
) -> gym.Env:
    """Applies the standard Atari preprocessing to an ALE env made with ``frameskip=1``.

    ``training=True`` adds episodic life and reward sign clipping. The result observes
    ``(frame_stack, screen_size, screen_size)`` uint8 frames, oldest first (channel-first).

    Example::

        env = gym.make("ALE/Breakout-v5", frameskip=1)
        env = wrap_atari(gym.wrappers.RecordEpisodeStatistics(env), training=True)
    """
    if not is_ale_env(env):
        raise TypeError(
            f"wrap_atari needs an ALE env (ale-py), got {env.unwrapped!r}; "
            "use atari='off' for non-ALE ids"
        )
    skip = getattr(env.unwrapped, "_frameskip", None)
    if skip != 1:
        raise ValueError(
            f"the ALE env skips frameskip={skip!r} frames itself; make it with frameskip=1 "
            f"so that the preprocessing's frame_skip={frame_skip} is the only skip"
        )
    # NoopReset(noop_max) + skip with max-pool of the last two frames + 84x84 grayscale, uint8.
    env = AtariPreprocessing(
        env,
        noop_max=noop_max,
        frame_skip=frame_skip,
        screen_size=screen_size,
        terminal_on_life_loss=False,  # see EpisodicLife for why not gymnasium's version
        grayscale_obs=True,
        scale_obs=False,  # keep uint8 (4x smaller to store and transfer); the encoder scales
    )
    if training:
        env = EpisodicLife(env)
    # FireReset sits outside EpisodicLife so that each new life is launched, as in SB3.
    if needs_fire_reset(env):
        env = FireReset(env)
    if training:
        env = SignReward(env)
    # (84, 84) -> (4, 84, 84); the first observation of an episode is repeated ("reset" padding).
    return FrameStackObservation(env, frame_stack)
