"""Atari preprocessing: shapes, frame stack, episodic life without game reset, real game scores."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers import RecordEpisodeStatistics

from rltrans.envs.atari import EpisodicLife
from rltrans.envs.gym_vec import GAME_STATS_KEY, GameEpisodeStatistics, make_vector_env


class FakeAle:
    """The two ALE calls EpisodicLife uses, driven by a scripted game."""

    def __init__(self, game: ScriptedGame) -> None:
        self.game = game

    def lives(self) -> int:
        return self.game.lives


class ScriptedGame(gym.Env):
    """A game with ``lives`` lives; each step pays 1 and loses a life at the ``loss_frames``."""

    observation_space = gym.spaces.Box(0, 1000, (1,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, lives: int, loss_frames: set[int]) -> None:
        self.start_lives, self.loss_frames = lives, loss_frames
        self.ale = FakeAle(self)
        self.resets, self.frame, self.lives = 0, 0, lives

    def get_action_meanings(self) -> list[str]:
        return ["NOOP", "FIRE", "RIGHT"]

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.resets, self.frame, self.lives = self.resets + 1, 0, self.start_lives
        return np.array([self.frame], np.float32), {}

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict]:
        self.frame += 1
        if self.frame in self.loss_frames:
            self.lives -= 1
        return np.array([self.frame], np.float32), 1.0, self.lives == 0, False, {}


def test_episodic_life_terminates_without_resetting_the_game() -> None:
    game = ScriptedGame(lives=3, loss_frames={2, 4, 6, 8})
    env = EpisodicLife(game)
    env.reset(seed=0)
    assert game.resets == 1
    _, _, term, _, _ = env.step(2)
    assert not term
    _, _, term, _, _ = env.step(2)  # frame 2: life lost -> learner episode ends
    assert term and game.lives == 2
    obs, _ = env.reset()  # one NOOP step, same game
    assert game.resets == 1 and obs[0] == 3 and game.lives == 2
    _, _, term, _, _ = env.step(2)  # frame 4: second life lost
    assert term and game.lives == 1
    env.reset()
    env.step(2)  # frame 6: last life lost -> the game's own termination
    assert game.lives == 0
    env.reset()  # game over: real reset
    assert game.resets == 2 and game.lives == 3


def test_episodic_life_reset_with_seed_or_without_life_loss_is_real() -> None:
    game = ScriptedGame(lives=3, loss_frames={2, 4, 6, 8})
    env = EpisodicLife(game)
    env.reset()
    env.step(0)
    env.reset()  # no life was lost: a real reset, unlike SB3's EpisodicLifeEnv
    assert game.resets == 2
    env.step(0)
    env.step(0)  # life lost
    env.reset(seed=1)  # an explicit seed asks for a new game
    assert game.resets == 3 and game.lives == 3


def test_game_ending_inside_episodic_life_reset_still_reports_stats() -> None:
    """Life lost at frame 2 (learner episode ends); the last life goes during the NOOP step."""

    def make() -> gym.Env:
        game = ScriptedGame(lives=2, loss_frames={2, 3})
        return EpisodicLife(RecordEpisodeStatistics(game, stats_key=GAME_STATS_KEY))

    envs = GameEpisodeStatistics(SyncVectorEnv([make], autoreset_mode=AutoresetMode.SAME_STEP))
    envs.reset(seed=0)
    _, _, term, _, info = envs.step(np.array([2]))  # frame 1
    assert not term[0] and "_episode" not in info
    # Frame 2 loses a life; the autoreset's NOOP (frame 3) loses the last one: game over, and
    # the game's statistics arrive at this step through the reset info.
    obs, _, term, _, info = envs.step(np.array([2]))
    assert term[0] and obs[0, 0] == 0  # obs is from the real reset that followed
    assert info["_episode"][0]
    assert info["episode"]["l"][0] == 3 and info["episode"]["r"][0] == 3.0


@pytest.fixture(scope="module")
def ale() -> Any:
    pytest.importorskip("cv2")
    return pytest.importorskip("ale_py")


def _lives_and_frames(envs: gym.vector.VectorEnv) -> tuple[np.ndarray, np.ndarray]:
    ales = [e.unwrapped.ale for e in envs.unwrapped.envs]
    return np.array([a.lives() for a in ales]), np.array([a.getEpisodeFrameNumber() for a in ales])


@pytest.mark.cli
def test_breakout_training_episodic_life_and_clipping(ale: Any) -> None:
    envs = make_vector_env("ALE/Breakout-v5", 2, seed=0, training=True)
    assert envs.single_observation_space.shape == (4, 84, 84)
    obs, _ = envs.reset()
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
    lives, frames = _lives_and_frames(envs)
    np.testing.assert_array_equal(lives, [5, 5])
    life_losses = games = 0
    for _ in range(300):
        obs, rew, term, _, info = envs.step(envs.action_space.sample())
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
        assert set(np.unique(rew)) <= {-1.0, 0.0, 1.0}
        new_lives, new_frames = _lives_and_frames(envs)
        game_over = info.get("_episode", np.zeros(2, dtype=bool))
        for i in range(2):
            if term[i] and not game_over[i]:
                # A life was lost and the game goes on: one life fewer, emulator clock not reset.
                life_losses += 1
                assert new_lives[i] == lives[i] - 1 and new_lives[i] > 0
                assert new_frames[i] > frames[i]
            elif game_over[i]:
                games += 1
                assert term[i] and lives[i] == 1  # the last life
                assert new_lives[i] == 5 and new_frames[i] < frames[i]  # a real new game
                # Length counts emulator frames: 4 per agent step at least.
                assert info["episode"]["l"][i] >= 4 * 5
            else:
                assert new_lives[i] == lives[i]
        lives, frames = new_lives, new_frames
    assert life_losses >= 4 and games >= 1


def test_frame_stack_is_oldest_first(ale: Any) -> None:
    envs = make_vector_env("ALE/Pong-v5", 2, seed=1, training=True)
    prev, _ = envs.reset()
    # Reset padding repeats the first frame.
    assert all(np.array_equal(prev[:, k], prev[:, 3]) for k in range(3))
    moved = False
    for _ in range(60):
        obs, _, term, trunc, _ = envs.step(envs.action_space.sample())
        assert not (term | trunc).any()  # Pong has no lives: episodic life never fires early
        np.testing.assert_array_equal(obs[:, :3], prev[:, 1:])  # shift by one, newest last
        moved |= not np.array_equal(obs[:, 3], prev[:, 3])
        prev = obs
    assert moved


def test_episode_stats_are_the_unclipped_game_score(ale: Any) -> None:
    """SpaceInvaders pays 5-30 points per alien: the clipped learner reward cannot match them."""
    for training in (True, False):
        envs = make_vector_env("ALE/SpaceInvaders-v5", 2, seed=0, training=training)
        envs.reset()
        learner_sum, positive_steps = np.zeros(2), np.zeros(2)
        while True:
            _, rew, _, _, info = envs.step(envs.action_space.sample())
            learner_sum += rew
            positive_steps += rew > 0
            if "_episode" in info:
                i = int(np.flatnonzero(info["_episode"])[0])
                score = info["episode"]["r"][i]
                break
        assert score > 0 and score % 5 == 0
        if training:
            # Each positive step is clipped to 1 but scored at least 5 points in the game.
            assert learner_sum[i] == positive_steps[i] < score
            assert score >= 5 * positive_steps[i]
        else:
            assert learner_sum[i] == score  # evaluation: no clipping, no episodic life


def test_evaluation_keeps_all_lives_in_one_episode(ale: Any) -> None:
    envs = make_vector_env("ALE/Breakout-v5", 1, seed=0, training=False)
    envs.reset()
    lives = 5
    for _ in range(200):
        _, _, term, _, info = envs.step(envs.action_space.sample())
        new_lives = envs.unwrapped.envs[0].unwrapped.ale.lives()
        if new_lives < lives and new_lives > 0:
            assert not term[0]  # a life loss does not end the evaluation episode
        lives = new_lives
        assert "_episode" not in info or term[0]
    assert lives < 5


def test_atari_env_kwargs(ale: Any) -> None:
    default = make_vector_env("ALE/Pong-v5", 1)
    assert default.unwrapped.envs[0].unwrapped.ale.getFloat("repeat_action_probability") == 0.25
    no_sticky = make_vector_env("ALE/Pong-v5", 1, env_kwargs={"repeat_action_probability": 0.0})
    assert no_sticky.unwrapped.envs[0].unwrapped.ale.getFloat("repeat_action_probability") == 0.0
    assert default.unwrapped.envs[0].unwrapped._frameskip == 1  # the wrappers skip, not ALE
    with pytest.raises(ValueError, match="frameskip=4 .* skip frames twice"):
        make_vector_env("ALE/Pong-v5", 1, env_kwargs={"frameskip": 4})


def test_atari_modes(ale: Any) -> None:
    raw = make_vector_env("ALE/Pong-v5", 2, atari="off")
    assert raw.single_observation_space.shape == (210, 160, 3)
    with pytest.raises(TypeError, match="needs an ALE env"):
        make_vector_env("CartPole-v1", 1, atari="on")
