"""Evaluation on the one acting loop: a number of episodes split over the envs, or, for
return-conditioned policies (Decision Transformer, BC), a number of episodes per target
return with every target in ONE vector env (env i plays ``targets[i // episodes]``).

Both count each env's episodes in the order it starts them (:class:`Quota`), so short
episodes are not over-represented, and return what the env itself reported. Evaluation
during training runs inside :func:`isolated_rng`, so that it changes no random draw of the
training that follows.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from gymnasium.vector import VectorEnv

from rltrans.accel.threads import ThreadTuner
from rltrans.run.logging import Episode
from rltrans.runtime.episodes import EpisodeLoop, Quota, Transition, play_episodes
from rltrans.types import ActingPolicy

OnStep = Callable[[Transition, list[Episode]], None]


@dataclass
class TargetResult:
    """The episodes a return-conditioned policy played for one target return."""

    target: float
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Mean/std return, mean length and the returns, for the JSON summary."""
        r = np.asarray(self.returns, dtype=np.float64)
        return {
            "target": self.target,
            "episodes": len(r),
            "mean_return": float(r.mean()) if len(r) else None,
            "std_return": float(r.std()) if len(r) else None,
            "mean_length": float(np.mean(self.lengths)) if self.lengths else None,
            "returns": r.tolist(),
        }


@contextlib.contextmanager
def isolated_rng(device: torch.device | str) -> Iterator[None]:
    """Give Python's, NumPy's and torch's global generators (the CPU's and a CUDA
    ``device``'s) their states back after the block, whatever it drew."""
    device = torch.device(device)
    python, numpy = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)


def episode_metrics(episodes: Sequence[Episode], prefix: str = "eval/") -> dict[str, float]:
    """Mean ``episodic_return`` and ``episodic_length`` of ``episodes`` and, where the env
    reports ``info["success"]``, ``success_rate``, each under ``prefix``.

    >>> episode_metrics([Episode(0, 1.0, 12, True), Episode(1, 0.0, 12, False)])
    {'eval/episodic_return': 0.5, 'eval/episodic_length': 12.0, 'eval/success_rate': 0.5}
    """
    out = {
        f"{prefix}episodic_return": float(np.mean([ep.ret for ep in episodes])),
        f"{prefix}episodic_length": float(np.mean([ep.length for ep in episodes])),
    }
    successes = [ep.success for ep in episodes if ep.success is not None]
    if successes:
        out[f"{prefix}success_rate"] = float(np.mean(successes))
    return out


def evaluate_episodes(
    policy: ActingPolicy,
    envs: VectorEnv,
    episodes: int,
    *,
    seed: int,
    device: torch.device | str,
    deterministic: bool = True,
    max_steps: int = 1_000_000,
    on_step: OnStep | None = None,
    threads: ThreadTuner | None = None,
) -> list[Episode]:
    """Play ``episodes`` episodes split evenly over the envs; returns them in finish order."""
    loop = EpisodeLoop(
        envs, policy, seed=seed, device=device, deterministic=deterministic, threads=threads
    )
    quota = Quota.split(episodes, envs.num_envs)
    return play_episodes(loop, quota, max_steps=max_steps, on_step=on_step)


def evaluate_targets(
    policy: ActingPolicy,
    envs: VectorEnv,
    targets: Sequence[float],
    episodes: int,
    *,
    seed: int,
    device: torch.device | str,
    deterministic: bool = True,
    max_steps: int = 1_000_000,
    on_step: OnStep | None = None,
    threads: ThreadTuner | None = None,
) -> list[TargetResult]:
    """Play ``episodes`` episodes per target return, all of them in ONE pass of ``envs``.

    ``envs`` has N = len(targets) x episodes sub-envs; env i is conditioned on
    ``targets[i // episodes]`` (``initial_state(N, targets)``) and plays one counted episode,
    so every target gets exactly ``episodes`` episodes however long they are. The return-to-go
    counts the rewards down (``observe``; Chen et al. 2021, Algorithm 1).
    """
    n = envs.num_envs
    if episodes < 1 or n != len(targets) * episodes:
        raise ValueError(
            f"need len(targets) x episodes = {len(targets)} x {episodes} envs, got {n}"
        )
    per_env = torch.as_tensor(np.repeat(np.asarray(targets, np.float32), episodes), device=device)
    state = policy.initial_state(n, per_env)  # type: ignore[call-arg]  # return-conditioned
    loop = EpisodeLoop(
        envs, policy, seed=seed, device=device, deterministic=deterministic, state=state,
        threads=threads,
    )  # fmt: skip
    results = [TargetResult(float(t)) for t in targets]
    for ep in play_episodes(loop, Quota([1] * n), max_steps=max_steps, on_step=on_step):
        results[ep.env_index // episodes].returns.append(ep.ret)
        results[ep.env_index // episodes].lengths.append(ep.length)
    return results
