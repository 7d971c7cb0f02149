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
    for _ in range(10):
        a(torch.ones(2), torch.tensor([False, True]))
    b = RewardScaler(2, gamma=0.99, device="cpu")
    b.load_state_dict(a.state_dict())
    assert not b.returns.any()
    a.returns.zero_()
    done = torch.zeros(2, dtype=torch.bool)
    for _ in range(3):
        torch.testing.assert_close(a(torch.ones(2), done), b(torch.ones(2), done))


def test_reward_scaler_never_scales_up():
    """Returns that barely vary (a solved sparse task) must not have their rewards inflated."""
    scaler = RewardScaler(2, gamma=0.99, device="cpu")
    done = torch.ones(2, dtype=torch.bool)
    for _ in range(100):
        scaled = scaler(torch.full((2,), 0.5), done)
    torch.testing.assert_close(scaled, torch.full((2,), 0.5))
