"""CartPole with hidden velocities (the POMDP variant used by POPGym and RLlib examples).

Dynamics are those of Gymnasium's CartPole-v1 (classic_control/cartpole.py, after
Barto, Sutton & Anderson 1983, with the corrected equations of Florian 2007,
https://coneural.org/florian/papers/05_cart_pole.pdf): explicit Euler with
tau = 0.02 s, force +-10 N, termination when |x| > 2.4 or |theta| > 12 degrees,
reward 1 on every step including the terminating one, truncation after 500 steps,
initial state uniform in [-0.05, 0.05) for all four components.

With `hide_velocity=True` (the default) the observation is [x, theta]: the agent
must infer velocities from the history, which is what makes it a memory task. With
`hide_velocity=False` the observation is the full [x, x_dot, theta, theta_dot] and
the env is CartPole-v1 itself, batched.

The state is float32 on the device (Gymnasium integrates in float64 and casts the
observation to float32), so trajectories agree with Gymnasium's to float32 rounding.

Frames (`render_mode="rgb_array"`) are drawn after Gymnasium's CartPole at a quarter of
its 600 x 400 size, rasterised with NumPy: the track spans x in [-2.4, 2.4] over the frame's
width, the cart is a black box on it and the pole a line of its full length (1 m) from
the cart's top, leaning right for theta > 0. Velocities show only as motion between
frames.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from rltrans.envs.torch_envs.base import RenderMode, TorchVectorEnv
from rltrans.envs.torch_envs.draw import BACKGROUND, fill_box

__all__ = ["StatelessCartPole"]

# Physical constants of gymnasium.envs.classic_control.CartPoleEnv.
GRAVITY = 9.8
MASS_CART = 1.0
MASS_POLE = 0.1
TOTAL_MASS = MASS_CART + MASS_POLE
HALF_POLE_LENGTH = 0.5
POLEMASS_LENGTH = MASS_POLE * HALF_POLE_LENGTH
FORCE_MAG = 10.0
TAU = 0.02
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4
INIT_HIGH = 0.05

# Frames: Gymnasium's 600 x 400 CartPole picture at a quarter of the size (the cart sits
# on the track here rather than centred on it).
WIDTH, HEIGHT = 150, 100
PIXELS_PER_METRE = WIDTH / (2 * X_THRESHOLD)
CART_HALF_WIDTH, CART_TOP, CART_BOTTOM = 6, 67, 75  # pixels
POLE_PIXELS = 2 * HALF_POLE_LENGTH * PIXELS_PER_METRE
TRACK_Y = 75
CART, POLE, TRACK = (0, 0, 0), (202, 152, 101), (0, 0, 0)


class StatelessCartPole(TorchVectorEnv):
    """N CartPole-v1 systems stepped together, observing [x, theta] (or all four).

    Example:
        >>> env = StatelessCartPole(num_envs=32)
        >>> obs, _ = env.reset(seed=0)          # (32, 2): cart position, pole angle
        >>> obs, r, term, trunc, info = env.step(torch.ones(32, dtype=torch.long))

    Args:
        num_envs: number of carts N.
        hide_velocity: observe [x, theta] (True) or [x, x_dot, theta, theta_dot] (False).
        max_episode_steps: truncation limit, 500 as in CartPole-v1.
        device: where all state and returned tensors live.
        validate_actions: check action values each step (a host sync for GPU-tensor actions).
        render_mode: "rgb_array" to draw frames with `render()` (see the module docstring).

    Attributes:
        state: (N, 4) float32 [x, x_dot, theta, theta_dot], as `CartPoleEnv.state`.
    """

    # Real time, as Gymnasium's CartPole: one step is tau = 0.02 s.
    metadata: ClassVar[dict[str, Any]] = {**TorchVectorEnv.metadata, "render_fps": 50}

    def __init__(
        self,
        num_envs: int,
        hide_velocity: bool = True,
        max_episode_steps: int | None = 500,
        device: str | torch.device = "cpu",
        validate_actions: bool = True,
        render_mode: RenderMode | None = None,
    ) -> None:
        """Build N carts; see the class docstring for the arguments."""
        if not isinstance(hide_velocity, bool):
            raise TypeError(f"hide_velocity must be a bool, got {hide_velocity!r}")
        # Bounds of Gymnasium's CartPole observation space (twice the termination limits).
        high = np.array([X_THRESHOLD * 2, np.inf, THETA_THRESHOLD * 2, np.inf], dtype=np.float32)
        self._observed = [0, 2] if hide_velocity else [0, 1, 2, 3]
        high = high[self._observed]
        super().__init__(
            num_envs=num_envs,
            single_observation_space=gym.spaces.Box(-high, high, dtype=np.float32),
            single_action_space=gym.spaces.Discrete(2),
            max_episode_steps=max_episode_steps,
            device=device,
            validate_actions=validate_actions,
            render_mode=render_mode,
        )
        self.hide_velocity = hide_velocity
        self.state = torch.zeros(num_envs, 4, dtype=torch.float32, device=self.device)

    def _reset_idx(self, mask: torch.Tensor) -> None:
        """Draw a state uniform in [-0.05, 0.05)^4 for envs where `mask` is True."""
        u = torch.rand(
            self.num_envs, 4, generator=self.generator, device=self.device
        )  # (N, 4) in [0, 1)
        fresh = (2.0 * u - 1.0) * INIT_HIGH
        self.state = torch.where(mask[:, None], fresh, self.state)

    def _step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """One Euler step of the cart-pole equations; action 1 pushes right, 0 left."""
        x, x_dot, theta, theta_dot = self.state.unbind(dim=1)  # each (N,)
        force = torch.where(actions == 1, FORCE_MAG, -FORCE_MAG)
        cos_t, sin_t = torch.cos(theta), torch.sin(theta)
        # Equations as in CartPoleEnv.step (Florian 2007, eqs. 23-24 with friction off).
        temp = (force + POLEMASS_LENGTH * theta_dot.square() * sin_t) / TOTAL_MASS
        theta_acc = (GRAVITY * sin_t - cos_t * temp) / (
            HALF_POLE_LENGTH * (4.0 / 3.0 - MASS_POLE * cos_t.square() / TOTAL_MASS)
        )
        x_acc = temp - POLEMASS_LENGTH * theta_acc * cos_t / TOTAL_MASS
        # Explicit Euler: positions advance with the old velocities.
        self.state = torch.stack(
            (
                x + TAU * x_dot,
                x_dot + TAU * x_acc,
                theta + TAU * theta_dot,
                theta_dot + TAU * theta_acc,
            ),
            dim=1,
        )  # (N, 4)
        x, theta = self.state[:, 0], self.state[:, 2]
        terminated = (x.abs() > X_THRESHOLD) | (theta.abs() > THETA_THRESHOLD)
        reward = torch.ones(self.num_envs, dtype=torch.float32, device=self.device)
        return reward, terminated, {}

    def _observe(self) -> torch.Tensor:
        """(N, 2) [x, theta] or (N, 4) full state, float32, a copy of the state."""
        return self.state[:, self._observed]  # advanced indexing copies

    def _render_state(self) -> dict[str, torch.Tensor]:
        """The full state (N, 4): the frame shows position and angle."""
        return {"state": self.state}

    def _draw_frames(self, state: dict[str, np.ndarray]) -> np.ndarray:
        """(N, HEIGHT, WIDTH, 3) uint8 frames: track, cart and pole."""
        x, theta = state["state"][:, 0], state["state"][:, 2]  # (N,) each
        image = np.empty((self.num_envs, HEIGHT, WIDTH, 3), dtype=np.uint8)
        image[:] = BACKGROUND
        image[:, TRACK_Y] = TRACK
        centre = np.round(x * PIXELS_PER_METRE + WIDTH / 2).astype(np.int64)  # (N,) pixels
        left, right = centre - CART_HALF_WIDTH, centre + CART_HALF_WIDTH + 1
        fill_box(image, left, right, CART_TOP, CART_BOTTOM, CART)
        # The pole: points every half pixel from the cart's top along the angle, 3 pixels wide.
        along = np.linspace(0.0, POLE_PIXELS, int(2 * POLE_PIXELS) + 1)  # (P,)
        px = centre[:, None] + np.sin(theta)[:, None] * along  # (N, P)
        py = CART_TOP - np.cos(theta)[:, None] * along  # (N, P), image rows grow downward
        rows = np.round(py).astype(np.int64)
        for dx in (-1, 0, 1):
            cols = np.round(px).astype(np.int64) + dx
            inside = (rows >= 0) & (rows < HEIGHT) & (cols >= 0) & (cols < WIDTH)
            env = np.broadcast_to(np.arange(self.num_envs)[:, None], rows.shape)
            image[env[inside], rows[inside], cols[inside]] = POLE
        return image
