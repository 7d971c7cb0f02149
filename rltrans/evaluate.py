"""python -m rltrans.evaluate checkpoint=<file or run dir> [episodes=20] [key=value ...]

Runs a saved policy for a number of episodes in a vector env (evaluation
settings: no episodic life, no reward clipping) and prints one JSON line:
mean_return, std_return, episodes, mean_length, and success_rate where the env
reports info["success"]. Knobs: configs/evaluate.yaml (``--help`` prints them).

Return-conditioned policies (agent=dt|bc) take ``target_return=500`` or
``target_return=[100,300,500]``: ``episodes`` episodes per target, every one of
them in one vector env of targets x episodes sub-envs (``evaluate_targets``);
the JSON line adds the mean return per target. The evaluator is picked once from
the checkpoint's ``algo.kind`` (:data:`EVALUATORS`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from rltrans.checkpoint import (
    CheckpointError,
    CheckpointMismatchError,
    check_compatible,
    load_checkpoint,
    space_to_dict,
)
from rltrans.config import ConfigError, run_cli
from rltrans.logging import EpisodeTracker
from rltrans.policy import agent_from_checkpoint, resolve_checkpoint
from rltrans.train import seed_everything, select_device


class QuotaTracker(EpisodeTracker):
    """Counts the first episodes of each env up to a per-env quota (``total`` split evenly),
    so that short episodes are not over-represented (the first N to finish would be)."""

    def __init__(self, num_envs: int, total: int) -> None:
        super().__init__(window=total)
        self.quota = np.array([total // num_envs + (i < total % num_envs) for i in range(num_envs)])
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.successes: list[bool] = []

    def update(self, info: dict[str, Any]) -> list:
        """Record finished episodes of envs that still have quota left."""
        finished = []
        for ep in super().update(info):
            if self.quota[ep.env_index] > 0:
                self.quota[ep.env_index] -= 1
                self.returns.append(ep.ret)
                self.lengths.append(ep.length)
                if ep.success is not None:
                    self.successes.append(ep.success)
                finished.append(ep)
        return finished

    @property
    def done(self) -> bool:
        """True once every env has used its quota."""
        return bool((self.quota == 0).all())


def record_frame(envs, frames: list) -> None:
    """Append env 0's rendered frame (envs made with render_mode='rgb_array')."""
    frame = envs.call("render")[0]
    if frame is not None:
        frames.append(np.asarray(frame))


def save_gif(frames: list, path: Path, fps: int = 30) -> None:
    """Write frames as an animated GIF with Pillow (no video codec needed)."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    images = [Image.fromarray(f) for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=1000 // fps, loop=0)


def eval_env_config(cfg: DictConfig, payload: dict[str, Any], num_envs: int | None) -> DictConfig:
    """The checkpoint's env config with evaluate's overrides: env_id, num_envs, video."""
    env_cfg = OmegaConf.create(payload["config"]["env"])
    if cfg.env_id is not None:
        if env_cfg.kind != "gym":
            raise ConfigError(
                f"env_id={cfg.env_id} replaces a Gymnasium id, but this checkpoint's env is "
                f"kind {env_cfg.kind!r}; valid for checkpoints trained on kind 'gym' envs"
            )
        env_cfg.id, env_cfg.kwargs = cfg.env_id, {}  # kwargs belonged to the old id
    if num_envs:
        env_cfg.num_envs = num_envs
    if cfg.video:
        if env_cfg.kind != "gym":
            raise ConfigError("video=true needs a Gymnasium env (torch-native envs do not render)")
        env_cfg.kwargs = {**env_cfg.get("kwargs", {}), "render_mode": "rgb_array"}
    return env_cfg


def make_checked_env(env_cfg: DictConfig, payload: dict[str, Any], cfg: DictConfig, device):
    """The evaluation vector env, after checking its spaces against the checkpoint's."""
    from rltrans.envs import make_env

    envs = make_env(env_cfg, seed=cfg.seed, device=device, training=False)
    try:
        for what in ("observation_space", "action_space"):
            space = getattr(envs, f"single_{what}")
            check_compatible(payload[what], space_to_dict(space), what.replace("_", " "))
    except CheckpointMismatchError:
        envs.close()
        raise
    return envs


def evaluate_online(
    cfg: DictConfig, payload: dict[str, Any], path: Path, device: torch.device
) -> dict[str, Any]:
    """Memory agents (PPO/IMPALA checkpoints): ``episodes`` split over the envs."""
    from rltrans.envs import is_torch_env
    from rltrans.spaces import obs_to_tensor

    agent = agent_from_checkpoint(payload, device)
    envs = make_checked_env(eval_env_config(cfg, payload, cfg.num_envs), payload, cfg, device)
    deterministic = True if cfg.deterministic is None else bool(cfg.deterministic)
    n = envs.num_envs
    tracker = QuotaTracker(n, cfg.episodes)
    obs, _ = envs.reset(seed=cfg.seed)
    state = agent.initial_state(n)
    done = torch.ones(n, dtype=torch.bool, device=device)
    torch_env = is_torch_env(envs)
    frames: list = []
    steps = 0
    try:
        while not tracker.done:
            x = obs_to_tensor(obs, envs.single_observation_space, device)
            out, state = agent.act(x, state, done, deterministic=deterministic)
            head = agent.policy
            action = (
                head.env_action_tensor(out.action) if torch_env else head.env_action(out.action)
            )
            obs, _, terminated, truncated, info = envs.step(action)
            done = torch.as_tensor(terminated, device=device) | torch.as_tensor(
                truncated, device=device
            )
            tracker.update(info)
            steps += 1
            if cfg.video and not tracker.returns:  # env 0's first episode
                record_frame(envs, frames)
            if steps > cfg.max_steps:
                raise RuntimeError(f"evaluation exceeded max_steps={cfg.max_steps} vector steps")
    finally:
        envs.close()
    returns = np.array(tracker.returns)
    summary: dict[str, Any] = {
        "checkpoint": str(path),
        "episodes": len(returns),
        "mean_return": float(returns.mean()),
        "std_return": float(returns.std()),
        "mean_length": float(np.mean(tracker.lengths)),
        "deterministic": deterministic,
    }
    if tracker.successes:
        summary["success_rate"] = float(np.mean(tracker.successes))
    if frames:
        video = Path(cfg.video_dir or path.parent.parent / "videos") / "eval.gif"
        save_gif(frames, video)
        summary["video"] = str(video)
    return summary


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


def evaluate_targets(
    agent: torch.nn.Module,
    envs,
    targets: Sequence[float],
    episodes: int,
    *,
    seed: int,
    deterministic: bool = True,
    max_steps: int = 1_000_000,
    on_step: Callable[[list], None] | None = None,
) -> list[TargetResult]:
    """Play ``episodes`` episodes per target return, all of them in ONE pass of ``envs``.

    ``envs`` has N = len(targets) x episodes sub-envs; env i is conditioned on
    ``targets[i // episodes]`` and its first episode is counted (QuotaTracker, quota 1), so
    every target gets exactly ``episodes`` episodes however long they are. The agent follows
    the Decision Transformer acting API: ``initial_state(N, targets)``, ``act(obs, state,
    done)``, ``observe(state, rewards)`` (return-to-go minus reward, Chen et al. 2021, Alg. 1).
    ``on_step(finished_episodes)`` runs after every vector step.
    """
    from rltrans.envs import is_torch_env

    n = envs.num_envs
    if episodes < 1 or n != len(targets) * episodes:
        raise ValueError(
            f"need len(targets) x episodes = {len(targets)} x {episodes} envs, got {n}"
        )
    device = next(agent.parameters()).device
    per_env = torch.as_tensor(np.repeat(np.asarray(targets, np.float32), episodes), device=device)
    results = [TargetResult(float(t)) for t in targets]
    tracker = QuotaTracker(n, n)
    to_env = (lambda a: a) if is_torch_env(envs) else (lambda a: a.cpu().numpy())
    was_training = agent.training
    agent.eval()  # no dropout while acting
    obs, _ = envs.reset(seed=seed)
    state = agent.initial_state(n, per_env)
    done = torch.ones(n, dtype=torch.bool, device=device)  # every env starts an episode
    steps = 0
    try:
        while not tracker.done:
            out, state = agent.act(obs, state, done, deterministic=deterministic)
            obs, reward, terminated, truncated, info = envs.step(to_env(out.env_action))
            state = agent.observe(state, reward)
            done = torch.as_tensor(terminated, device=device) | torch.as_tensor(
                truncated, device=device
            )
            finished = tracker.update(info)
            for ep in finished:
                results[ep.env_index // episodes].returns.append(ep.ret)
                results[ep.env_index // episodes].lengths.append(ep.length)
            if on_step is not None:
                on_step(finished)
            steps += 1
            if steps > max_steps:
                raise RuntimeError(f"evaluation exceeded max_steps={max_steps} vector steps")
    finally:
        agent.train(was_training)
    return results


def target_list(value: Any) -> list[float]:
    """target_return= as a list of floats: one number or a list of numbers."""
    items = (
        list(value)
        if isinstance(value, Sequence | ListConfig) and not isinstance(value, str)
        else [value]
    )
    try:
        targets = [float(v) for v in items]
    except (TypeError, ValueError):
        raise ConfigError(
            f"target_return={value!r}; valid: a number or a list such as [100, 500]"
        ) from None
    if not targets:
        raise ConfigError("target_return=[] holds no target; give at least one number")
    return targets


def evaluate_offline(
    cfg: DictConfig, payload: dict[str, Any], path: Path, device: torch.device
) -> dict[str, Any]:
    """Return-conditioned policies (DT/BC): ``episodes`` per target, all targets in one env."""
    if cfg.target_return is not None:
        targets = target_list(cfg.target_return)
    elif payload.get("eval_targets"):
        targets = [float(t) for t in payload["eval_targets"]]
    else:
        raise ConfigError(f"{path} records no evaluation targets; pass target_return=<number>")
    if cfg.episodes < 1:
        raise ConfigError(f"episodes={cfg.episodes}; need at least 1 episode per target")
    agent = agent_from_checkpoint(payload, device)
    deterministic = cfg.deterministic
    if deterministic is None:  # as the training run evaluated
        deterministic = payload["config"]["algo"].get("eval_deterministic", False)
    n = len(targets) * cfg.episodes
    envs = make_checked_env(eval_env_config(cfg, payload, n), payload, cfg, device)
    frames: list = []
    env0_done = [False]

    def record(finished: list) -> None:  # env 0's first episode, when video=true
        if not env0_done[0]:
            record_frame(envs, frames)
            env0_done[0] = any(ep.env_index == 0 for ep in finished)

    try:
        results = evaluate_targets(
            agent,
            envs,
            targets,
            cfg.episodes,
            seed=cfg.seed,
            deterministic=bool(deterministic),
            max_steps=cfg.max_steps,
            on_step=record if cfg.video else None,
        )
    finally:
        envs.close()
    returns = np.concatenate([r.returns for r in results])
    lengths = np.concatenate([r.lengths for r in results])
    summary: dict[str, Any] = {
        "checkpoint": str(path),
        "dataset": payload.get("dataset", {}).get("id"),
        "episodes": len(returns),
        "episodes_per_target": int(cfg.episodes),
        "num_envs": n,
        "mean_return": float(returns.mean()),
        "std_return": float(returns.std()),
        "mean_length": float(lengths.mean()),
        "deterministic": bool(deterministic),
        "targets": targets,
        "return_by_target": {f"{r.target:g}": r.summary()["mean_return"] for r in results},
        "per_target": [r.summary() for r in results],
    }
    if frames:
        video = Path(cfg.video_dir or path.parent.parent / "videos") / "eval.gif"
        save_gif(frames, video)
        summary["video"] = str(video)
    return summary


# Picked once per checkpoint from its algo.kind.
EVALUATORS: dict[str, Callable[..., dict[str, Any]]] = {
    "online": evaluate_online,
    "offline": evaluate_offline,
}


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Run the evaluation a config describes and return the summary."""
    device = select_device(cfg.device)
    seed_everything(cfg.seed)
    path = resolve_checkpoint(cfg.checkpoint)
    payload = load_checkpoint(path, map_location=device)
    kind = payload.get("config", {}).get("algo", {}).get("kind", "online")
    if kind not in EVALUATORS:
        raise CheckpointError(f"{path}: algo.kind={kind!r}; known kinds: {', '.join(EVALUATORS)}")
    if cfg.target_return is not None and kind != "offline":
        raise ConfigError(
            f"target_return applies to return-conditioned policies (algo.kind offline: "
            f"agent=dt|bc); {path} was trained with algo.kind={kind!r}"
        )
    return EVALUATORS[kind](cfg, payload, path, device)


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse overrides, evaluate, print one JSON line."""

    def run(cfg: DictConfig) -> dict[str, Any]:
        if cfg.checkpoint is None:
            raise ConfigError("checkpoint=<checkpoint file or run dir> is required")
        return evaluate(cfg)

    return run_cli(argv, "evaluate", __doc__, run)


if __name__ == "__main__":
    sys.exit(main())
