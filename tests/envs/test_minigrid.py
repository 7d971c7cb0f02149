"""env=minigrid_memory: the named MiniGrid Memory config builds the documented env (84x84 RGB
partial views, 7 actions, 96-step limit) and its uint8 frames stay uint8 in rollouts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rltrans.config import env_code, load_config
from rltrans.envs import make_env
from rltrans.runtime.pool import LocalPool
from tests.test_rollout import small_agent

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
