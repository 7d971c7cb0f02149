"""Reward scaling in the acting loop."""

import numpy as np
import torch

from rltrans.runtime.actors import RewardScaler


def test_reward_scaler_divides_by_running_std_of_discounted_returns():
    rng = np.random.default_rng(0)
    scaler = RewardScaler(3, gamma=0.9, device="cpu")
    returns, seen = np.zeros(3), []
    for t in range(400):
        reward = rng.normal(5.0, 2.0, size=3)
        done = rng.random(3) < 0.05
        scaled = scaler(torch.tensor(reward, dtype=torch.float32), torch.tensor(done))
        returns = returns * 0.9 + reward.astype(np.float32)  # naive discounted returns
        seen.extend(returns)
        if t > 50:  # the prior (mean 0, var 1, weight 1e-8) no longer matters
            expected = reward / max(np.sqrt(np.var(seen) + 1e-8), 1.0)
            np.testing.assert_allclose(scaled.numpy(), expected, rtol=1e-4)
        returns[done] = 0.0


def test_reward_scaler_state_round_trip():
    """Statistics round-trip; running returns restart at zero, as after a checkpoint, where
    every env starts a fresh episode (LocalActor.restart zeroes them too)."""
    a = RewardScaler(2, gamma=0.99, device="cpu")
    for _ in range(10):  # small returns: the peak, not the std, sets the divisor
        a(torch.full((2,), 0.01), torch.tensor([False, True]))
    b = RewardScaler(2, gamma=0.99, device="cpu")
    b.load_state_dict(a.state_dict())
    assert not b.returns.any()
    a.returns.zero_()
    done = torch.zeros(2, dtype=torch.bool)
    for _ in range(3):
        torch.testing.assert_close(a(torch.full((2,), 0.01), done), b(torch.full((2,), 0.01), done))


def test_reward_scaler_scales_small_returns_up_to_one_and_no_further():
    """Returns that never reach 1 (a few thousandths per step) are scaled until the largest is
    1; a solved task whose returns stop varying is not inflated beyond that."""
    scaler = RewardScaler(2, gamma=0.9, device="cpu")
    done = torch.ones(2, dtype=torch.bool)
    for _ in range(100):
        scaled = scaler(torch.full((2,), 0.5), done)
    torch.testing.assert_close(scaled, torch.full((2,), 1.0))

    dense = RewardScaler(4, gamma=0.9, device="cpu")
    never = torch.zeros(4, dtype=torch.bool)
    returns = torch.zeros(4)
    for _ in range(300):  # 0.005 per step: discounted returns approach 0.05
        scaled = dense(torch.full((4,), 0.005), never)
        returns = returns * 0.9 + scaled
    assert 0.95 < returns.max().item() <= 1.0 + 1e-6


def test_reward_scaler_leaves_returns_that_reach_one_as_the_std_rule_has_them():
    """A sparse +-1 reward (the T-maze's): the divisor is the std, at least 1, as before."""
    rng = np.random.default_rng(1)
    scaler = RewardScaler(3, gamma=0.9, device="cpu")
    returns, seen = np.zeros(3), []
    for _ in range(600):
        done = rng.random(3) < 0.05
        reward = np.where(done, rng.choice([-1.0, 1.0], size=3), 0.0)
        scaled = scaler(torch.tensor(reward, dtype=torch.float32), torch.tensor(done))
        returns = returns * 0.9 + reward
        seen.extend(returns)
        if np.abs(seen).max() >= 1.0:
            expected = reward / max(np.sqrt(np.var(seen) + 1e-8), 1.0)
            np.testing.assert_allclose(scaled.numpy(), expected, rtol=1e-5)
        returns[done] = 0.0


def test_reward_scaler_scales_up_at_most_a_thousandfold():
    scaler = RewardScaler(2, gamma=0.9, device="cpu")
    done = torch.ones(2, dtype=torch.bool)
    scaled = scaler(torch.full((2,), 1e-7), done)
    torch.testing.assert_close(scaled, torch.full((2,), 1e-4))


def test_reward_scaler_state_without_peak_keeps_the_rule_it_was_saved_under():
    """A checkpoint written before the peak existed resumes dividing by at least 1."""
    old = RewardScaler(2, gamma=0.9, device="cpu")
    state = {k: v for k, v in old.state_dict().items() if k != "peak"}
    resumed = RewardScaler(2, gamma=0.9, device="cpu")
    resumed.load_state_dict(state)
    done = torch.ones(2, dtype=torch.bool)
    torch.testing.assert_close(resumed(torch.full((2,), 0.5), done), torch.full((2,), 0.5))


def test_reward_scaler_host_arithmetic_is_the_tensor_arithmetic():
    """On the CPU the scaler computes in NumPy floats; its rewards and statistics are the
    tensor ops' (a GPU's path) within float64 rounding, with 1 env and with 5."""
    rng = np.random.default_rng(2)
    for n in (1, 5):
        host, tensors = RewardScaler(n, 0.99, "cpu"), RewardScaler(n, 0.99, "cpu")
        for _ in range(300):
            reward = torch.tensor(rng.normal(3.0, 4.0, size=n))  # float64, as envs give it
            done = torch.tensor(rng.random(n) < 0.03)
            torch.testing.assert_close(host(reward, done), tensors._scaled(reward, done))
        for key, value in host.state_dict().items():
            torch.testing.assert_close(value, tensors.state_dict()[key], rtol=1e-12, atol=0)
        torch.testing.assert_close(host.returns, tensors.returns, rtol=1e-12, atol=0)
