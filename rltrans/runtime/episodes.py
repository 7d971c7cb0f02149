"""The one acting loop: any policy over any vector env, for every purpose.

Training rollouts (PPO, and the actors of later learners), evaluation with per-env episode
quotas (every Decision Transformer target in one vector pass), dataset collection and video
recording all step their envs through :class:`EpisodeLoop`; the one other caller of
``envs.step`` is PPO's device rollout of a torch-native env
(:class:`rltrans.accel.rollout.DeviceRollout`), tested to give this loop's rollout. The
policy is anything with the acting interface of :class:`rltrans.types.ActingPolicy`:
``initial_state(n)``, ``act(obs, state, done, deterministic=) -> (ActOutput, state)`` and
``observe(state, reward) -> state``.

Conventions (Gymnasium 1.x, SAME_STEP autoreset everywhere in rltrans): when env i ends at
step t, the returned obs[i] is already the first observation of its next episode and
``info["final_obs"][i]`` holds its true last one, so the policy is told ``done[i] = True``
at step t + 1 and resets that env's state before acting. No dummy transition follows a done.

Example:
    >>> loop = EpisodeLoop(envs, agent, seed=0, device="cpu", deterministic=True)
    >>> episodes = play_episodes(loop, Quota.split(20, envs.num_envs))
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from gymnasium.error import DependencyNotInstalled
from gymnasium.vector import VectorEnv
from torch import Tensor

from rltrans import fsutil
from rltrans.accel.threads import ThreadTuner, tuned
from rltrans.config import ConfigError
from rltrans.envs import is_torch_env
from rltrans.run.logging import Episode, EpisodeTracker
from rltrans.spaces import obs_to_tensor
from rltrans.types import ActingPolicy, ActOutput, Tree


def final_observations(info: dict[str, Any], obs: Any) -> Any:
    """The observation batch with rows of ended envs replaced by their true final observation."""
    final = info["final_obs"]
    if isinstance(final, torch.Tensor):  # torch-native envs: batched tensors on their device
        keep = torch.as_tensor(info["_final_obs"], device=final.device)
        return torch.where(keep.view(-1, *[1] * (final.dim() - 1)), final, obs)
    mask = np.asarray(info["_final_obs"])

    def replace(batch: Any, rows: list) -> Any:
        if isinstance(batch, dict):
            return {k: replace(v, [r[k] for r in rows]) for k, v in batch.items()}
        if isinstance(batch, tuple):
            return tuple(replace(v, [r[j] for r in rows]) for j, v in enumerate(batch))
        out = np.array(batch, copy=True)
        for i, row in zip(np.flatnonzero(mask), rows, strict=True):
            out[i] = row
        return out

    return replace(obs, [final[i] for i in np.flatnonzero(mask)])


@dataclass
class Transition:
    """One vector step as the loop saw it (N envs)."""

    obs: Tree  # tensors (N, ...) the policy acted on
    raw_obs: Any  # the same batch as the env returned it
    done: Tensor  # (N,) bool, True where an episode started at ``obs``
    out: ActOutput  # what the policy returned
    env_action: Any  # what the env was given (NumPy, or tensors for torch-native envs)
    reward: Tensor  # (N,) as the env returned it (float64 for Gymnasium envs)
    terminated: Tensor  # (N,) bool
    truncated: Tensor  # (N,) bool
    info: dict[str, Any]
    next_raw_obs: Any  # the env's next observation batch (reset rows where an episode ended)

    @property
    def ended(self) -> Tensor:
        """(N,) bool: the episode of env i ended at this step."""
        return self.terminated | self.truncated

    def final_raw_obs(self) -> Any:
        """``next_raw_obs`` with the rows of ended envs replaced by their final observation."""
        return final_observations(self.info, self.next_raw_obs)


class EpisodeLoop:
    """Steps a vector env with a policy, keeping observations, per-env state and done flags
    across calls (so a PPO actor continues its episodes from one rollout to the next).

    ``state`` overrides ``policy.initial_state(num_envs)`` (e.g. a return-conditioned
    policy's state with one target per env). ``timings`` accumulates seconds spent acting
    (the policy and the conversions) and stepping the env. ``threads`` (torch_threads=auto)
    sets torch's thread count for every acting call and tunes it.
    """

    def __init__(
        self,
        envs: VectorEnv,
        policy: ActingPolicy,
        *,
        seed: int,
        device: torch.device | str,
        deterministic: bool = False,
        state: Tree = None,
        threads: ThreadTuner | None = None,
    ) -> None:
        self.envs, self.policy = envs, policy
        self.device = torch.device(device)
        self.deterministic = deterministic
        self.space = envs.single_observation_space
        self.torch_env = is_torch_env(envs)
        self.action_dtype = getattr(envs.single_action_space, "dtype", None)
        raw, _ = envs.reset(seed=seed)
        self.raw_obs, self.obs = raw, self.to_tensor(raw)
        self.done = torch.ones(envs.num_envs, dtype=torch.bool, device=self.device)
        self.state = policy.initial_state(envs.num_envs) if state is None else state
        self.timings = {"env": 0.0, "act": 0.0}
        self.threads = threads  # torch_threads=auto: a ThreadTuner timing each acting call

    @property
    def num_envs(self) -> int:
        """N, the number of sub-envs."""
        return self.envs.num_envs

    def to_tensor(self, obs: Any) -> Tree:
        """An observation batch as tensors on the loop's device."""
        return obs_to_tensor(obs, self.space, self.device)

    def to_env(self, action: Tensor) -> Any:
        """Actions in the env's format: tensors for torch-native envs, else NumPy arrays in
        the action space's dtype."""
        if self.torch_env:
            return action
        array = action.detach().cpu().numpy()
        return array if self.action_dtype is None else array.astype(self.action_dtype, copy=False)

    def step(self) -> Transition:
        """Act in every env once and step them; returns what happened."""
        t0 = time.perf_counter()
        with tuned(self.threads):
            out, self.state = self.policy.act(
                self.obs, self.state, self.done, deterministic=self.deterministic
            )
        if not isinstance(out, ActOutput):
            raise TypeError(
                f"{type(self.policy).__name__}.act must return (rltrans.types.ActOutput, state), "
                f"got ({type(out).__name__}, ...)"
            )
        env_action = self.to_env(out.env_action)
        t1 = time.perf_counter()
        raw, reward, terminated, truncated, info = self.envs.step(env_action)
        t2 = time.perf_counter()
        reward = torch.as_tensor(reward, device=self.device)
        terminated = torch.as_tensor(terminated, device=self.device)
        truncated = torch.as_tensor(truncated, device=self.device)
        self.state = self.policy.observe(self.state, reward)
        step = Transition(
            self.obs, self.raw_obs, self.done, out, env_action, reward, terminated, truncated,
            info, raw,
        )  # fmt: skip
        self.raw_obs, self.obs, self.done = raw, self.to_tensor(raw), terminated | truncated
        self.timings["act"] += (t1 - t0) + (time.perf_counter() - t2)
        self.timings["env"] += t2 - t1
        return step

    def pop_timings(self) -> dict[str, float]:
        """Seconds spent acting / stepping envs since the last call."""
        out, self.timings = self.timings, {"env": 0.0, "act": 0.0}
        return out


class Quota:
    """Per-env episode quotas: env i counts its first ``per_env[i]`` episodes (in the order
    it starts them), so short episodes are not over-represented (the first N episodes to
    finish would be)."""

    def __init__(self, per_env: Sequence[int]) -> None:
        self.left = np.asarray(per_env, dtype=np.int64).copy()
        if self.left.ndim != 1 or (self.left < 0).any():
            raise ValueError(f"quotas must be a list of counts >= 0, got {per_env!r}")

    @classmethod
    def split(cls, total: int, num_envs: int) -> Quota:
        """``total`` episodes split as evenly as possible over ``num_envs`` envs."""
        if total < 1 or num_envs < 1:
            raise ValueError(f"need total >= 1 and num_envs >= 1, got {total} and {num_envs}")
        return cls([total // num_envs + (i < total % num_envs) for i in range(num_envs)])

    def take(self, env_index: int) -> bool:
        """Count one episode of env ``env_index`` if its quota allows; returns whether it did."""
        if self.left[env_index] > 0:
            self.left[env_index] -= 1
            return True
        return False

    @property
    def done(self) -> bool:
        """True once every env has used its quota."""
        return bool((self.left == 0).all())


class MaxStepsError(RuntimeError):
    """Evaluation ran more vector steps than its ``max_steps`` allows."""


def play_episodes(
    loop: EpisodeLoop,
    quota: Quota,
    *,
    max_steps: int = 1_000_000,
    on_step: Callable[[Transition, list[Episode]], None] | None = None,
) -> list[Episode]:
    """Run the loop until every env has finished its quota of episodes; returns them in the
    order they finished. Returns and lengths are the env's own episode statistics (Gymnasium's
    ``RecordEpisodeStatistics`` layout, which every rltrans vector env reports).
    ``on_step(transition, finished)`` runs after every vector step."""
    tracker = EpisodeTracker(window=1)
    episodes: list[Episode] = []
    steps = 0
    with acting_mode(loop.policy):
        while not quota.done:
            step = loop.step()
            finished = [ep for ep in tracker.update(step.info) if quota.take(ep.env_index)]
            episodes += finished
            if on_step is not None:
                on_step(step, finished)
            steps += 1
            if steps > max_steps:
                raise MaxStepsError(f"evaluation exceeded max_steps={max_steps} vector steps")
    return episodes


@contextlib.contextmanager
def acting_mode(policy: Any) -> Iterator[None]:
    """Evaluation mode (no dropout) for torch modules while the block runs, restored after."""
    if not isinstance(policy, torch.nn.Module):
        yield
        return
    was_training = policy.training
    policy.eval()
    try:
        yield
    finally:
        policy.train(was_training)


class VideoRecorder:
    """Frames of env 0's first episode, for ``play_episodes(on_step=...)`` on envs made with
    ``render_mode="rgb_array"`` (Gymnasium envs, and torch-native envs, which draw their
    frames with NumPy); :meth:`save` writes them as an animated GIF (Pillow, no codec).

    A Gymnasium env whose renderer is not installed (pygame for CartPole) raises
    :class:`rltrans.config.ConfigError` naming what to install.
    """

    def __init__(self, envs: VectorEnv) -> None:
        self.envs = envs
        self.frames: list[np.ndarray] = []
        self.finished = False

    def __call__(self, step: Transition, finished: list[Episode]) -> None:
        """Record env 0's frame after this step until its first episode has ended."""
        if self.finished:
            return
        frames = self._render()
        if frames is not None and frames[0] is not None:
            self.frames.append(np.array(frames[0]))  # a copy: envs may reuse their buffers
        self.finished = bool(step.ended[0])

    def _render(self) -> Sequence[Any] | None:
        """One frame per env (vector wrappers forward ``render``)."""
        try:
            return self.envs.render()
        except DependencyNotInstalled as err:
            raise ConfigError(_missing_renderer(err)) from None

    def save(self, path: Path, fps: int | None = None) -> Path | None:
        """Write the GIF (None when nothing was rendered); ``fps`` defaults to the env's
        ``render_fps`` (else 30).

        The GIF goes to a new file of a unique name (created exclusively) that is then renamed
        onto ``path``, all through a descriptor of its folder: the folder (created when missing)
        and ``path`` may not be links, and ``path`` no special file either (UnsafePathError)."""
        from PIL import Image

        if not self.frames:
            return None
        fps = fps or self.envs.metadata.get("render_fps") or 30
        images = [Image.fromarray(f) for f in self.frames]

        def fill(f: IO[bytes]) -> None:
            images[0].save(
                f, format="GIF", save_all=True, append_images=images[1:],
                duration=max(20, round(1000 / fps)), loop=0,
            )  # fmt: skip

        fsutil.write_file(path, fill, folder_link=False)
        return path


def _missing_renderer(err: Exception) -> str:
    """One line for a renderer Gymnasium reports missing: its own advice, plus rltrans's
    ``render`` extra where the missing piece is pygame."""
    text = " ".join(str(err).split())  # one line
    extra = ' (or: pip install "rltrans[render]")' if "pygame" in text else ""
    return f"video=true: this env cannot draw frames: {text}{extra}"
