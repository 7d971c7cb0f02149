"""env=minigrid_memory: the named MiniGrid Memory config builds the documented env (84x84 RGB
partial views, 7 actions, 96-step limit) and its uint8 frames stay uint8 in rollouts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rltrans.config import env_code, load_config
from rltrans.envs import make_env
from rltrans.runtime.pool import LocalPool
from tests.runtime.test_rollout import small_agent

pytest.importorskip("minigrid", reason='env=minigrid_memory needs: pip install -e ".[minigrid]"')


def minigrid_envs(num_envs: int = 2):
    cfg = load_config(["env=minigrid_memory", f"env.num_envs={num_envs}"])
    return make_env(cfg.env, seed=0)


def test_config_builds_the_documented_env():
    envs = minigrid_envs()
    try:
        assert envs.single_observation_space.shape == (84, 84, 3)
        assert envs.single_observation_space.dtype == np.uint8
        assert envs.single_action_space.n == 7
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (2, 84, 84, 3) and obs.dtype == np.uint8
        # Turning left forever never ends an episode: the 96-step limit truncates it.
        for step in range(1, 97):
            obs, _, terminated, truncated, _ = envs.step(np.zeros(2, dtype=np.int64))
            assert not terminated.any()
            assert truncated.all() == (step == 96)
    finally:
        envs.close()


def test_frames_stay_uint8_in_rollouts():
    envs = minigrid_envs()
    try:
        agent = small_agent(envs, "gtrxl")
        pool = LocalPool([envs], agent, num_steps=8, segment_length=4, seed=0, device="cpu")
        pool.publish(None, 0)
        buffer = pool.get().buffer
        assert buffer.obs.dtype == torch.uint8 and buffer.obs.shape == (8, 2, 84, 84, 3)
        assert buffer.obs.float().std() > 0  # real frames, not zeros
    finally:
        envs.close()


def test_checkpoints_naming_minigrid_need_no_trust_flag():
    """minigrid's ids and wrappers are trusted like gymnasium's, so evaluating a checkpoint of
    env=minigrid_memory needs no trust_env_code=true."""
    assert env_code(load_config(["env=minigrid_memory"]).env) == []


def cue_in_view(env_id: str = "MiniGrid-MemoryS9-v0", fixed_ends: bool = False):
    import gymnasium as gym

    from rltrans.envs.minigrid import CueInView

    return CueInView(gym.make(env_id, agent_view_size=3), fixed_ends=fixed_ends)


def walk_to(env, object_type: str) -> float:
    """From CueInView's start, walk the hallway and enter the end object ``object_type``'s side;
    returns the episode's reward."""
    right, left, forward = 1, 0, 2
    base = env.unwrapped
    hallway_end = base.width - 3  # the fixed-length Memory envs
    env.step(right)  # face the hallway
    for _ in range(hallway_end):
        env.step(forward)
    upper = base.grid.get(hallway_end + 1, base.height // 2 - 2).type
    env.step(left if upper == object_type else right)
    _, reward, terminated, _, _ = env.step(forward)
    assert terminated
    return reward


@pytest.mark.parametrize("fixed_ends", [False, True])
@pytest.mark.parametrize("env_id", ["MiniGrid-MemoryS7-v0", "MiniGrid-MemoryS13-v0"])
def test_cue_in_view_shows_the_cue_first_and_success_needs_it(env_id, fixed_ends):
    from minigrid.core.constants import OBJECT_TO_IDX

    env = cue_in_view(env_id, fixed_ends)
    cues, uppers = set(), set()
    for seed in range(12):
        obs, _ = env.reset(seed=seed)
        base = env.unwrapped
        cue = base.grid.get(1, base.height // 2 - 1).type
        cues.add(cue)
        # The agent stands at the view's bottom centre; the cell in front of it is the cue.
        assert obs["image"][1, 1, 0] == OBJECT_TO_IDX[cue]
        uppers.add(base.grid.get(base.width - 2, base.height // 2 - 2).type)
        assert walk_to(env, cue) > 0  # the matching object's side ends in success ...
        env.reset(seed=seed)
        other = {"key": "ball", "ball": "key"}[cue]
        assert walk_to(env, other) == 0  # ... the other one's in failure
    assert cues == {"key", "ball"}
    # Fixed ends: the key is always above, so the cue alone gives the turn; else both layouts.
    assert uppers == ({"key"} if fixed_ends else {"key", "ball"})


def test_cue_in_view_refuses_other_envs():
    with pytest.raises(ValueError, match="MiniGrid Memory env.*MiniGrid-Empty-5x5-v0"):
        cue_in_view("MiniGrid-Empty-5x5-v0")


def test_cue_in_view_refuses_to_come_after_observation_wrappers():
    import gymnasium as gym
    from minigrid.wrappers import ImgObsWrapper

    from rltrans.envs.minigrid import CueInView

    with pytest.raises(ValueError, match="first entry of env.wrappers"):
        CueInView(ImgObsWrapper(gym.make("MiniGrid-MemoryS7-v0")))


def test_cue_in_view_builds_from_pixels_through_the_config():
    """The documented command's wrapper list builds: the first frame shows the cue."""
    wrappers = (
        "env.wrappers=[{path: rltrans.envs.minigrid.CueInView},"
        " {path: minigrid.wrappers.RGBImgPartialObsWrapper, kwargs: {tile_size: 4}},"
        " {path: minigrid.wrappers.ImgObsWrapper}]"
    )
    cfg = load_config(["env=minigrid_memory", "env.num_envs=4", wrappers])
    assert env_code(cfg.env) == []  # rltrans's own wrapper needs no trust flag
    envs = make_env(cfg.env, seed=0)
    try:
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (4, 12, 12, 3)
        # The cue's cell (row 1 of 3, column 1: pixels 4-7) differs between a key and a ball.
        cells = obs[:, 4:8, 4:8].reshape(4, -1)
        assert len({c.tobytes() for c in cells}) == 2  # seeds 0..3 show both objects
    finally:
        envs.close()
