"""rltrans.load_policy: single observations as Stable-Baselines3's predict takes them, shape
errors that name the observation space, NumPy/torch in and out, and the thread setting."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rltrans import load_policy
from rltrans.train import main as train_main

TINY = [
    "env=stateless_cartpole",  # observations (2,), actions Discrete(2)
    "env.num_envs=2",
    "algo.num_steps=8",
    "algo.segment_length=8",
    "algo.num_minibatches=1",
    "algo.epochs=1",
    "agent=lstm",
    "agent.dim=8",
    "progress=false",
    "tensorboard=false",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("policy") / "run"
    assert train_main([*TINY, "total_steps=16", f"run_dir={run}"]) == 0
    return run


def test_single_observation_gives_a_single_action(run_dir):
    policy = load_policy(run_dir)
    state = policy.initial_state(1)
    action, state = policy.act(np.zeros(2, np.float32), state)
    assert isinstance(action, np.ndarray) and action.shape == () and action.dtype == np.int64
    batch, _ = policy.act(np.zeros((3, 2), np.float32), policy.initial_state(3))
    assert batch.shape == (3,)
    tensor, _ = policy.act(torch.zeros(2), policy.initial_state(1))
    assert isinstance(tensor, torch.Tensor) and tensor.shape == ()


def test_wrong_observation_shape_names_the_space(run_dir):
    policy = load_policy(run_dir)
    with pytest.raises(ValueError, match=r"shape \(5,\) does not fit .*Box\(.*\(2,\)"):
        policy.act(np.zeros(5, np.float32), policy.initial_state(1))
    with pytest.raises(ValueError, match=r"one observation of shape \(2,\) or a batch"):
        policy.act(np.zeros((3, 4), np.float32), policy.initial_state(3))


def test_load_policy_sets_one_thread_by_default(run_dir):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        load_policy(run_dir)
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        load_policy(run_dir, torch_threads=None)  # leaves torch alone
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_target_return_only_for_return_conditioned_policies(run_dir):
    policy = load_policy(run_dir)
    assert not policy.return_conditioned
    with pytest.raises(ValueError, match="return-conditioned"):
        policy.initial_state(1, target_return=10.0)
