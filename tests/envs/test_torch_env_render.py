"""Torch-native envs render: render_mode="rgb_array" gives one (H, W, 3) uint8 frame per env,
drawn with NumPy from the state on the env's device; frames follow the state, the step that
ends an episode shows the state it reached (before the autoreset), and rendering leaves the
dynamics unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rltrans.envs.torch_envs import TMaze, make_torch_env
from rltrans.envs.torch_envs.tmaze import DOWN, RIGHT, SCALE, UP, UP_COLOUR

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
# name, kwargs, frame shape (H, W): T-maze 3 x (length + 1) cells of 12 px, repeat-previous
# 2 x max(k + 4, episode_length) cells of 10 px, CartPole 100 x 150 px.
ENVS = [
    ("tmaze", {"length": 5}, (36, 72)),
    ("repeat_previous", {"k": 2, "episode_length": 6}, (20, 60)),
    ("stateless_cartpole", {}, (100, 150)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("name", "kwargs", "shape"), ENVS)
def test_frames_have_the_shape_and_dtype_and_follow_the_state(name, kwargs, shape, device):
    env = make_torch_env(name, 3, device=device, render_mode="rgb_array", **kwargs)
    env.reset(seed=0)
    frames = env.render()
    assert len(frames) == 3
    assert all(f.shape == (*shape, 3) and f.dtype == np.uint8 for f in frames)
    before = frames[0]
    env.step(torch.full((3,), RIGHT if name == "tmaze" else 1, device=device))
    after = env.render()[0]
    assert not np.array_equal(before, after)  # the state moved, so did the picture
    assert not np.shares_memory(frames[0], frames[1])  # one array per env, not views


@pytest.mark.parametrize(("name", "kwargs", "shape"), ENVS)
def test_rendering_changes_no_observation_or_reward(name, kwargs, shape):
    """The same seed and actions give the same trajectory with and without frames."""
    envs = [make_torch_env(name, 4, render_mode=mode, **kwargs) for mode in (None, "rgb_array")]
    traces = []
    for env in envs:
        obs, _ = env.reset(seed=3)
        trace = [obs]
        actions = torch.Generator().manual_seed(0)
        for _ in range(30):
            a = torch.randint(0, env.single_action_space.n, (4,), generator=actions)
            obs, reward, term, trunc, _ = env.step(a)
            trace += [obs, reward, term, trunc]
            env.render()
        traces.append(trace)
    assert all(torch.equal(a, b) for a, b in zip(*traces, strict=True))
    assert envs[0].render() is None  # no render_mode: nothing drawn, as Gymnasium's envs


def test_tmaze_frame_shows_the_cue_the_agent_and_the_arm_it_turned_into():
    env = TMaze(num_envs=1, length=2, render_mode="rgb_array")
    env.reset(seed=0)
    env.cue[:] = UP  # the up arm pays

    def cell(frame: np.ndarray, row: int, col: int) -> np.ndarray:
        """The colour at the middle of a cell."""
        return frame[row * SCALE + SCALE // 2, col * SCALE + SCALE // 2]

    start = env.render()[0]
    assert (cell(start, 1, 0) == 0).all()  # the agent (black) on the start cell
    assert tuple(start[SCALE + 2, 2]) == UP_COLOUR  # the cue's colour around it, bright
    env.step(torch.tensor([RIGHT]))
    walked = env.render()[0]
    assert tuple(walked[SCALE + 2, 2]) != UP_COLOUR  # the cue is gone from the observation
    assert (cell(walked, 1, 1) == 0).all() and (cell(walked, 1, 0) != 0).any()
    env.step(torch.tensor([RIGHT]))
    _, reward, terminated, *_ = env.step(torch.tensor([DOWN]))  # the wrong arm ends it
    assert terminated.item() and reward.item() == -1.0
    # The frame of the ending step: the agent in the down arm, not back at the start.
    last = env.render()[0]
    assert (cell(last, 2, 2) == 0).all() and (cell(last, 1, 0) != 0).any()
    env.reset()
    assert (cell(env.render()[0], 1, 0) == 0).all()  # after a reset: the new start


def test_render_mode_errors():
    with pytest.raises(ValueError, match=r"render_mode='human'; valid: None, \['rgb_array'\]"):
        make_torch_env("tmaze", 2, render_mode="human")
    with pytest.raises(RuntimeError, match="before reset"):
        make_torch_env("tmaze", 2, render_mode="rgb_array").render()
