"""Scripted controllers: competent policies that need no training, for datasets and tests.

Both follow rltrans's acting interface (`initial_state(n)`, `act(obs, state, done) ->
(ActOutput, state)`, `observe(state, reward)`) and act on whole vector-env batches, so
``python -m rltrans.collect policy=rltrans.envs.scripted:CartPoleController env_id=CartPole-v1``
writes an expert dataset in seconds, and mixing them with random actions (``epsilon=``)
gives the mixed-quality data that offline RL is evaluated on.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rltrans.types import ActOutput

__all__ = ["CartPoleController", "PendulumController"]


class CartPoleController:
    """A linear state-feedback controller for CartPole-v1 that balances for the full 500 steps.

    Pushes right when ``k . (x, x_dot, theta, theta_dot) > 0``: the pole angle and angular
    velocity dominate (keep the pole up), and the small cart terms bring the cart back to the
    centre so that it never drives off the track (|x| > 2.4) within 500 steps.

    Example:
        >>> ctrl = CartPoleController()
        >>> ctrl.act(torch.tensor([[0.0, 0.0, 0.05, 0.0]]), None, None)[0].env_action
        tensor([1])
    """

    def __init__(self, gains: tuple[float, float, float, float] = (0.1, 0.5, 10.0, 2.0)) -> None:
        self.gains = np.asarray(gains, dtype=np.float64)  # (4,) for (x, x_dot, theta, theta_dot)

    def initial_state(self, num_envs: int) -> None:
        """Memoryless: no state."""
        return None

    def act(
        self, obs: Any, state: Any, done: Any, *, deterministic: bool = True
    ) -> tuple[ActOutput, Any]:
        """Actions (N,) in {0, 1} for observations (N, 4)."""
        u = np.asarray(obs, dtype=np.float64) @ self.gains  # (N,)
        action = torch.as_tensor((u > 0).astype(np.int64))
        return ActOutput(action, action), state

    def observe(self, state: Any, reward: Any) -> Any:
        """Memoryless: rewards are ignored."""
        return state


class PendulumController:
    """Energy-based swing-up with a PD catch near the top, for Pendulum-v1 (Astrom & Furuta 2000).

    Pendulum-v1 integrates theta'' = 3g/(2l) sin(theta) + 3/(m l^2) u with m = l = 1, g = 10
    and theta = 0 upright, so E = theta'^2 / 2 + (3g/2) cos(theta) is conserved without torque
    and equals 3g/2 upright at rest. Far from the top the torque pumps energy towards that
    value, u = k (E* - E) theta' (clipped to +-2); within `catch` radians of the top a PD law
    u = -(kp theta + kd theta') holds the pendulum up. Typical returns are -100 to -250, against
    about -1200 for uniform random torques.

    Example:
        >>> ctrl = PendulumController()
        >>> ctrl.act(torch.tensor([[1.0, 0.1, 0.0]]), None, None)[0].env_action.shape
        torch.Size([1, 1])
    """

    def __init__(
        self, k: float = 0.5, kp: float = 10.0, kd: float = 2.0, catch: float = 0.5
    ) -> None:
        self.k, self.kp, self.kd, self.catch = k, kp, kd, catch
        self.g, self.max_torque = 10.0, 2.0  # Pendulum-v1 defaults

    def initial_state(self, num_envs: int) -> None:
        """Memoryless: no state."""
        return None

    def act(
        self, obs: Any, state: Any, done: Any, *, deterministic: bool = True
    ) -> tuple[ActOutput, Any]:
        """Torques (N, 1) in [-2, 2] for observations (N, 3) = (cos theta, sin theta, theta')."""
        obs = np.asarray(obs, dtype=np.float64)
        cos, sin, vel = obs[:, 0], obs[:, 1], obs[:, 2]
        theta = np.arctan2(sin, cos)  # (N,) in (-pi, pi], 0 upright
        energy = 0.5 * vel**2 + 1.5 * self.g * cos
        pump = self.k * (1.5 * self.g - energy) * vel
        hold = -(self.kp * theta + self.kd * vel)
        u = np.where(np.abs(theta) < self.catch, hold, pump)
        torque = np.clip(u, -self.max_torque, self.max_torque)[:, None].astype(np.float32)
        action = torch.as_tensor(torque)
        return ActOutput(action, action), state

    def observe(self, state: Any, reward: Any) -> Any:
        """Memoryless: rewards are ignored."""
        return state
