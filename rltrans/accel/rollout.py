"""The device rollout: PPO's T steps x N envs of a torch-native env without a host round trip.

The generic acting loop (:class:`rltrans.runtime.episodes.EpisodeLoop`) serves every env:
each step it converts observations and actions, reads whether any env was truncated and
hands the step's info to the episode tracker, which reads it on the host. With a
torch-native env (:class:`rltrans.envs.torch_envs.TorchVectorEnv`) everything is already a
tensor on the training device, so :class:`DeviceRollout` runs the same steps, in the same
order, with none of that:

* actions go to the env as they are (no validation read: the policy's actions are valid);
* a truncated episode's bootstrap value is computed only where the env can truncate at all
  (its time limit is not beyond the task's own end), and then on the device for every env,
  kept where truncated (on the CPU it is still skipped on steps without a truncation,
  where reading the flags costs nothing);
* episode statistics stay on the device and are read once per rollout, as one copy, then
  handed to the tracker step by step as the generic loop would have;
* the agent acts through the program it is given (the compiled acting step, or its capture
  in a CUDA graph, :mod:`rltrans.accel.capture`).

Same seed, same rollout: observations, actions, log-probs, values, rewards, dones and the
segments' memories equal the generic loop's (``tests/runtime/test_device_rollout.py``).
"""

from __future__ import annotations

import time
from typing import Any, Literal, get_args

import torch
from torch import Tensor

from rltrans.accel.threads import tuned
from rltrans.envs import is_torch_env
from rltrans.types import tree_map, tree_stack

Rollout = Literal["auto", "device", "generic"]  # train.yaml's ``rollout``
ROLLOUTS: tuple[str, ...] = get_args(Rollout)


def can_truncate(envs: Any) -> bool:
    """Whether a torch-native env can ever truncate an episode: it has a truncation limit, and
    that limit is its time limit (no episode of the task ends itself before it)."""
    limit = envs.max_episode_steps
    return limit is not None and envs.time_limit == limit


def device_rollout_fits(envs: Any) -> bool:
    """Whether ``envs`` can be collected by :class:`DeviceRollout`: a bare torch-native env
    (a wrapper may change what a step returns)."""
    return is_torch_env(envs) and envs.unwrapped is envs


class DeviceRollout:
    """Collects rollouts of a torch-native env for a :class:`~rltrans.runtime.actors.LocalActor`
    (its episode loop keeps observations, dones and memory between rollouts)."""

    def __init__(self, envs: Any) -> None:
        if not device_rollout_fits(envs):
            raise ValueError(
                f"the device rollout needs a bare torch-native env (env.kind=torch), got "
                f"{type(envs).__name__}; use rollout=generic"
            )
        envs.validate_actions = False  # the policy's actions are in the space by construction
        self.truncates = can_truncate(envs)

    @torch.no_grad()
    def collect(
        self, loop: Any, agent: Any, buffer: Any, *, reward_scaler: Any = None, on_info: Any = None
    ) -> None:
        """Fill ``buffer`` with T steps of ``loop``'s envs, acting through ``loop.policy``;
        ``on_info`` sees each step's episode statistics after the rollout."""
        envs, policy, device = loop.envs, loop.policy, loop.device
        obs, state, done = loop.obs, agent.refresh_state(loop.state), loop.done
        zero = torch.zeros(envs.num_envs, device=device)
        stats: list[dict[str, Tensor]] = []
        env_s, t_start = 0.0, time.perf_counter()
        for t in range(buffer.num_steps):
            if t % buffer.segment_length == 0:
                buffer.record_memory(t, agent.state_to_memory(state))
            with tuned(loop.threads):
                out, state = policy.act(obs, state, done, deterministic=False)
            t_env = time.perf_counter()
            next_obs, reward, terminated, truncated, info = envs.step(out.env_action)
            env_s += time.perf_counter() - t_env
            state = policy.observe(state, reward)
            buffer.record_step(t, obs, done, out.action, out.log_prob, out.value)
            final_value = zero
            if self.truncates and (device.type != "cpu" or bool(truncated.any())):
                peek = policy.peek_value(info["final_obs"], state)
                final_value = torch.where(truncated, peek, zero)
            done = terminated | truncated
            scaled = reward if reward_scaler is None else reward_scaler(reward, done)
            buffer.record_outcome(t, scaled, terminated, truncated, final_value)
            stats.append(episode_stats(info))
            obs = next_obs
        loop.obs, loop.raw_obs, loop.done, loop.state = obs, obs, done, state
        if on_info is not None:
            for info in host_stats(stats):
                on_info(info)
        loop.timings["env"] += env_s
        loop.timings["act"] += time.perf_counter() - t_start - env_s


def episode_stats(info: dict[str, Any]) -> dict[str, Tensor]:
    """What the episode tracker reads of one step's info: the episode statistics and the
    per-episode values with their masks (``final_obs`` is left out)."""
    keep = {"episode": info["episode"], "_episode": info["_episode"]}
    for key, value in info.items():
        if key.startswith("_") or key in ("episode", "final_obs"):
            continue
        keep[key], keep[f"_{key}"] = value, info[f"_{key}"]
    return keep


def host_stats(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each step's statistics as NumPy, from one stacked copy per key (one host read per
    rollout instead of one per step)."""
    if not steps:
        return []
    host = tree_map(lambda x: x.cpu(), tree_stack(steps))  # (T, N) per key
    return [tree_map(lambda x, t=t: x[t].numpy(), host) for t in range(len(steps))]


def device_rollout(setting: str, envs: Any) -> DeviceRollout | None:
    """The device rollout ``rollout=setting`` asks for with ``envs`` (None: the generic loop);
    ValueError for ``device`` with an env that is not torch-native."""
    if setting == "generic" or (setting == "auto" and not device_rollout_fits(envs)):
        return None
    if not device_rollout_fits(envs):
        raise ValueError(
            f"rollout=device needs a torch-native env (env.kind=torch), got "
            f"{type(envs.unwrapped).__name__}; valid here: rollout=auto or rollout=generic"
        )
    return DeviceRollout(envs)


__all__ = [
    "ROLLOUTS", "DeviceRollout", "can_truncate", "device_rollout", "device_rollout_fits",
    "episode_stats", "host_stats",
]  # fmt: skip
