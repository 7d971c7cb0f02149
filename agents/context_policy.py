"""What Decision Transformer and its behaviour-cloning baseline share: a policy over a K-step
context of (return-to-go, state, action, timestep) that owns its scaling statistics, predicts
the action of every step of a window in training, and acts for N envs at once through
rltrans's acting interface (``initial_state`` / ``act`` / ``observe``), keeping each env's
last K steps and its return-to-go."""

from __future__ import annotations

from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from rltrans.agents.heads import ContinuousActions, DiscreteActions
from rltrans.losses.dt import dt_action_loss
from rltrans.spaces import normalizes_states, obs_to_tensor
from rltrans.types import ActOutput, TrajectoryBatch, TrajectoryStats


class DTState(NamedTuple):
    """Per-env acting context, oldest step first, newest at index K-1 (left-padded like the
    training windows); `valid` counts the real steps at the end. Indexed by env id."""

    returns_to_go: Tensor  # (N, K) float32, raw reward units
    states: Tensor  # (N, K, *obs_shape) raw observations
    actions: Tensor  # (N, K) long or (N, K, A) float32, env actions
    timesteps: Tensor  # (N, K) long, episode step of each context step
    valid: Tensor  # (N,) long in [0, K]
    next_return: Tensor  # (N,) float32, return-to-go of the next step (target minus rewards)
    target: Tensor  # (N,) float32, the return an env's context restarts with
    time: Tensor  # (N,) long, episode step of the next observation


class DTOutput(NamedTuple):
    """Predictions per window step; the next-step ones only with `predict_next=True`."""

    action: Tensor  # (B, K, A) logits (Discrete) or actions in env units (Box)
    next_return: Tensor | None  # (B, K, 1) R_{t+1} / return_scale, from the a_t token
    next_state: Tensor | None  # (B, K, obs_dim) normalised s_{t+1}, from the a_t token
    ponder_cost: Tensor | None = None  # (B, K, 3) ACT's N + R per token (backbone=universal)


# ------------------------------------------------------------------------ shared machinery


def _check_statistics(module: nn.Module, incompatible: Any) -> None:
    """Refuse loaded dataset statistics a model cannot divide by: a ``state_std`` or
    ``return_scale`` that is not a positive finite number (ValueError naming the buffer)."""
    for name in ("state_std", "return_scale"):
        value = getattr(module, name)
        if not bool(torch.isfinite(value).all() and (value > 0).all()):
            raise ValueError(
                f"{name} must be positive and finite, got {value.flatten()[:4].tolist()}"
            )


class ContextPolicy(nn.Module):
    """What DT and BC share: stats buffers, action codec, loss and the K-step acting context.

    Subclasses define `predict(batch) -> DTOutput` and set `self.context` (K).
    """

    context: int  # K, the steps an acting context holds
    action_codec: DiscreteActions | ContinuousActions  # set by the subclass

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        stats: dict[str, Any] | TrajectoryStats | None,
    ) -> None:
        super().__init__()
        if not isinstance(observation_space, gym.spaces.Box | gym.spaces.Discrete):
            raise ValueError(
                f"unsupported observation space {observation_space!r}; supported: "
                "['Box', 'Discrete']"
            )
        self.observation_space, self.action_space = observation_space, action_space
        self.obs_shape = tuple(observation_space.shape or ())
        self.normalize = normalizes_states(observation_space)
        # Acting contexts store observations as given: indices, uint8 frames, or float32.
        if isinstance(observation_space, gym.spaces.Discrete):
            self.obs_dtype = torch.long
        else:
            self.obs_dtype = torch.uint8 if observation_space.dtype == np.uint8 else torch.float32
        stat_shape = self.obs_shape if self.normalize else ()
        # Registered (persistent) buffers: the checkpoint holds the data's statistics.
        self.register_buffer("state_mean", torch.zeros(stat_shape))
        self.register_buffer("state_std", torch.ones(stat_shape))
        self.register_buffer("return_scale", torch.ones(()))
        if stats is not None:
            self.load_stats(stats)
        # Statistics read back from a file divide every input: a zero or non-finite one turns
        # every action into NaN, so it is refused as the state dict loads.
        self.register_load_state_dict_post_hook(_check_statistics)

    @property
    def device(self) -> torch.device:
        """Device of the parameters (derived, never stored)."""
        return next(self.parameters()).device

    def load_stats(self, stats: dict[str, Any] | TrajectoryStats) -> None:
        """Copy dataset statistics (`TrajectoryBuffer.stats()`) into the model's buffers."""
        s = TrajectoryStats.from_stats(stats)
        if self.normalize:
            try:
                self.state_mean.copy_(torch.broadcast_to(s.state_mean, self.state_mean.shape))
                self.state_std.copy_(torch.broadcast_to(s.state_std, self.state_std.shape))
            except RuntimeError as exc:
                raise ValueError(
                    f"state stats of shape {tuple(s.state_mean.shape)} do not fit observations "
                    f"of shape {self.obs_shape}"
                ) from exc
        self.return_scale.fill_(s.return_scale)

    def normalize_states(self, states: Tensor) -> Tensor:
        """(B, K, *obs) raw -> standardised float for vector Box obs; others unchanged."""
        if not self.normalize:
            return states
        return (states.float() - self.state_mean) / self.state_std

    def predict(self, batch: TrajectoryBatch) -> DTOutput:
        """All predictions for a batch of windows."""
        raise NotImplementedError  # pragma: no cover - defined by subclasses

    def forward(self, batch: TrajectoryBatch) -> Tensor:
        """Action predictions (B, K, A): logits (Discrete) or env-unit actions (Box)."""
        return self.predict(batch).action

    def loss(self, batch: TrajectoryBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """Action loss over real steps (+ next return/state losses when predicted)."""
        out = self.predict(batch)
        loss, metrics = self.action_codec.loss(out.action, batch.actions, batch.mask)
        # Next-step targets exist where steps t and t+1 are both real (same window, episode).
        both = batch.mask[:, :-1] & batch.mask[:, 1:]  # (B, K-1)
        if out.next_return is not None:
            target = batch.returns_to_go[:, 1:] / self.return_scale  # (B, K-1, 1)
            aux, _ = dt_action_loss(out.next_return[:, :-1], target, both, "continuous")
            loss, metrics["return"] = loss + aux, aux.detach()
        if out.ponder_cost is not None:  # Graves 2016: loss += tau * (N + R), real tokens only
            real = batch.mask.bool().unsqueeze(-1).expand_as(out.ponder_cost)
            ponder = out.ponder_cost[real].mean()
            loss, metrics["ponder"] = loss + self.tau * ponder, ponder.detach()
        if out.next_state is not None:
            target = self.normalize_states(batch.states[:, 1:]).flatten(2)  # (B, K-1, obs_dim)
            aux, _ = dt_action_loss(out.next_state[:, :-1], target, both, "continuous")
            loss, metrics["state"] = loss + aux, aux.detach()
        return loss, metrics

    # ---------------------------------------------------------------------------- acting

    def initial_state(self, num_envs: int, target_returns: Tensor | float = 0.0) -> DTState:
        """Empty contexts for N envs, each starting from its target return (N,) or one float."""
        n, k, dev = num_envs, self.context, self.device
        target = torch.as_tensor(target_returns, dtype=torch.float32, device=dev)
        target = target.expand(n).clone() if target.dim() == 0 else target
        if target.shape != (n,):
            raise ValueError(f"target_returns has shape {tuple(target.shape)}, want ({n},)")
        blank = self.action_codec.blank(n, dev)  # (N,) or (N, A)
        return DTState(
            returns_to_go=torch.zeros(n, k, device=dev),
            states=torch.zeros(n, k, *self.obs_shape, dtype=self.obs_dtype, device=dev),
            actions=torch.zeros(n, k, *blank.shape[1:], dtype=blank.dtype, device=dev),
            timesteps=torch.zeros(n, k, dtype=torch.long, device=dev),
            valid=torch.zeros(n, dtype=torch.long, device=dev),
            next_return=target.clone(),
            target=target,
            time=torch.zeros(n, dtype=torch.long, device=dev),
        )

    def reset_where(self, state: DTState, done: Tensor) -> DTState:
        """Start a new episode for envs where `done` (N,): empty context, return = target."""
        d = done.to(device=state.valid.device, dtype=torch.bool)

        def clear(x: Tensor) -> Tensor:
            return torch.where(d.view(-1, *[1] * (x.dim() - 1)), torch.zeros_like(x), x)

        emptied = ("returns_to_go", "states", "actions", "timesteps", "valid", "time")
        return state._replace(
            **{name: clear(getattr(state, name)) for name in emptied},
            next_return=torch.where(d, state.target, state.next_return),
        )

    def context_batch(self, state: DTState) -> TrajectoryBatch:
        """The acting context as a one-window-per-env batch (K-step, left-padded)."""
        k = self.context
        mask = torch.arange(k, device=state.valid.device) >= (k - state.valid).unsqueeze(1)
        return TrajectoryBatch(
            states=state.states,
            actions=state.actions,
            returns_to_go=state.returns_to_go.unsqueeze(-1),
            timesteps=state.timesteps,
            mask=mask,  # (N, K)
        )

    @torch.no_grad()
    def predict_context(self, state: DTState) -> Tensor:
        """Prediction (N, A) for the newest step of each env's context (logits or actions)."""
        return self(self.context_batch(state))[:, -1]

    @torch.no_grad()
    def act(
        self, obs: Any, state: DTState, done: Any = None, *, deterministic: bool = True
    ) -> tuple[ActOutput, DTState]:
        """Append obs (N, ...) as the newest step, predict its action; call `.eval()` first.

        `done` (N,) marks envs whose episode starts at `obs` (their context is reset to their
        target). Recomputes the whole K-step window, as DT does: a sliding window changes
        every hidden state, so there is no cache to reuse. Returns the actions (already in the
        env's values) and the state.
        """
        state = self.push_observation(obs, state, done)
        action = self.action_codec.select(self.predict_context(state), deterministic)
        return ActOutput(action, action), self.record_action(state, action)

    def push_observation(self, obs: Any, state: DTState, done: Any = None) -> DTState:
        """The context with obs (N, ...) appended as its newest step (the oldest dropped),
        after the resets where `done` (N,), its action still a placeholder: what
        :meth:`predict_context` reads before :meth:`record_action` fills the action in."""
        obs = obs_to_tensor(obs, self.observation_space, self.device)
        if done is not None:
            state = self.reset_where(state, torch.as_tensor(done, device=self.device))
        n = state.valid.shape[0]

        def push(x: Tensor, new: Tensor) -> Tensor:  # drop the oldest step, append the newest
            return torch.cat([x[:, 1:], new.to(x.dtype).unsqueeze(1)], dim=1)

        return state._replace(
            returns_to_go=push(state.returns_to_go, state.next_return),
            states=push(state.states, obs),
            actions=push(state.actions, self.action_codec.blank(n, self.device)),
            timesteps=push(state.timesteps, state.time),
            valid=(state.valid + 1).clamp(max=self.context),
        )

    def record_action(self, state: DTState, action: Tensor) -> DTState:
        """The context after the env actions (N, ...) chosen for its newest step."""
        n = state.valid.shape[0]
        flat = action.reshape(n, *state.actions.shape[2:])  # (N,) or (N, A)
        return state._replace(
            actions=torch.cat([state.actions[:, :-1], flat.unsqueeze(1)], dim=1),
            time=state.time + 1,
        )

    def observe(self, state: DTState, reward: Any) -> DTState:
        """Fold in the rewards (N,) of the last step: R_{t+1} = R_t - r_t (Chen et al. 2021,
        Algorithm 1). Rewards are raw; the model divides returns by `return_scale` itself."""
        r = torch.as_tensor(reward, dtype=torch.float32, device=state.next_return.device)
        return state._replace(next_return=state.next_return - r)


__all__ = ["ContextPolicy", "DTOutput", "DTState"]
