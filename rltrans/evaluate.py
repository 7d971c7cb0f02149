"""python -m rltrans.evaluate checkpoint=<file or run dir> [episodes=20] [key=value ...]

Runs a saved policy for a number of episodes in a vector env (evaluation settings: no
episodic life, no reward clipping) and prints one JSON line: mean_return, std_return,
episodes, mean_length, and success_rate where the env reports info["success"]. Knobs:
configs/evaluate.yaml (``--help`` prints them).

Return-conditioned policies (agent=dt|bc) take ``target_return=500`` or
``target_return=[100,300,500]``: ``episodes`` episodes per target, every one of them in one
vector env of targets x episodes sub-envs; the JSON line adds the mean return per target.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, ListConfig, OmegaConf

from rltrans.accel.run_speed import thread_tuners
from rltrans.cli import run_cli
from rltrans.config import ConfigError
from rltrans.config.keys import MAX_ENVS
from rltrans.config.resources import check_resources
from rltrans.envs import make_env
from rltrans.envs.offline import normalized_by_target
from rltrans.fsutil import check_output
from rltrans.policy import (
    agent_from_checkpoint,
    check_env_code,
    check_payload,
    resolve_checkpoint,
)
from rltrans.registry import agent_entry
from rltrans.run.checkpoint import load_checkpoint
from rltrans.run.context import building, payload_spaces, setup
from rltrans.run.progress import ProgressBar
from rltrans.runtime.episodes import MaxStepsError, VideoRecorder
from rltrans.runtime.evaluation import evaluate_episodes, evaluate_targets
from rltrans.spaces import check_same_spaces


def eval_env_config(cfg: DictConfig, payload: dict[str, Any], num_envs: int | None) -> DictConfig:
    """The checkpoint's env config with evaluate's overrides: env_id, num_envs, video.

    Offline checkpoints record the env their config resolved to (``eval_env``: e.g. a
    dataset's own env for env=dataset)."""
    env_cfg = OmegaConf.create(payload.get("eval_env") or payload["config"]["env"])
    if env_cfg.kind == "dataset":
        raise ConfigError(
            "this checkpoint records no evaluation env (its dataset names none); pass "
            "env_id=<Gymnasium id with the same spaces>"
        )
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
        # Both env kinds take render_mode: Gymnasium ids through gymnasium.make, torch-native
        # envs draw their frames with NumPy (rltrans.envs.torch_envs.base).
        env_cfg.kwargs = {**env_cfg.get("kwargs", {}), "render_mode": "rgb_array"}
    return env_cfg


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


def _targets(cfg: DictConfig, payload: dict[str, Any], path: Path) -> list[float]:
    """target_return=, else the targets the training run evaluated."""
    if cfg.target_return is not None:
        return target_list(cfg.target_return)
    if payload.get("eval_targets"):
        return [float(t) for t in payload["eval_targets"]]
    raise ConfigError(f"{path} records no evaluation targets; pass target_return=<number>")


def acting_envs(cfg: DictConfig, payload: dict[str, Any], path: Path) -> int:
    """The envs an evaluation acts in: episodes x targets for return-conditioned policies,
    else num_envs or the checkpoint's env.num_envs."""
    if agent_entry(payload["config"]["agent"]).return_conditioned:
        try:
            return len(_targets(cfg, payload, path)) * cfg.episodes
        except ConfigError:  # said later, where the targets are read
            return cfg.episodes
    env = payload.get("eval_env") or payload["config"]["env"]
    return cfg.num_envs or env.get("num_envs") or 1


def _summary(returns: np.ndarray, lengths: np.ndarray) -> dict[str, Any]:
    return {
        "episodes": len(returns),
        "mean_return": float(returns.mean()),
        "std_return": float(returns.std()),
        "mean_length": float(lengths.mean()),
    }


def _play_settings(
    cfg: DictConfig, payload: dict[str, Any], path: Path, conditioned: bool
) -> tuple[list[float], bool, int | None]:
    """(target returns, deterministic, num_envs) of an evaluation: a return-conditioned
    policy plays every episode of every target in its own env."""
    if cfg.target_return is not None and not conditioned:
        raise ConfigError(
            f"target_return applies to return-conditioned policies (agent=dt|bc); {path} holds "
            f"agent.kind={payload['config']['agent'].get('kind', 'memory')!r}"
        )
    targets = _targets(cfg, payload, path) if conditioned else []
    deterministic = cfg.deterministic
    if deterministic is None:  # the mode action, or as the DT training run evaluated
        algo = payload["config"].get("algo", {})
        deterministic = algo.get("eval_deterministic", False) if conditioned else True
    num_envs = len(targets) * cfg.episodes if conditioned else cfg.num_envs
    if num_envs is not None and num_envs > MAX_ENVS:
        raise ConfigError(
            f"episodes={cfg.episodes} x {len(targets)} target returns = {num_envs} envs, more "
            f"than {MAX_ENVS}; lower episodes (DT/BC play every episode in its own env)"
        )
    return targets, bool(deterministic), num_envs


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Run the evaluation a config describes and return the summary."""
    if cfg.checkpoint is None:
        raise ConfigError("checkpoint=<checkpoint file or run dir> is required")
    device = setup(cfg)
    path = resolve_checkpoint(cfg.checkpoint)
    payload = load_checkpoint(path, map_location=device)
    # The one estimate, once this command line and the checkpoint's config are combined.
    check_payload(payload, f"checkpoint {path}")
    spaces, envs_needed = payload_spaces(payload), acting_envs(cfg, payload, path)
    check_resources(payload["config"], spaces=spaces, acting_envs=envs_needed)
    agent, entry = agent_from_checkpoint(payload, device, source=f"checkpoint {path}")
    conditioned = entry.return_conditioned
    targets, deterministic, num_envs = _play_settings(cfg, payload, path, conditioned)
    env_cfg = eval_env_config(cfg, payload, num_envs)
    check_env_code(env_cfg, cfg.trust_env_code, f"the env config of checkpoint {path}")
    gif_path = Path(cfg.video_dir or path.parent.parent / "videos") / "eval.gif"
    if cfg.video:  # the same rules as train's videos/: refused before anything is played
        check_output(gif_path, folder_link=False)
    with building("env"):
        envs = make_env(env_cfg, seed=cfg.seed, device=device, training=False)
    video = VideoRecorder(envs) if cfg.video else None
    total = num_envs if conditioned else cfg.episodes
    progress = cfg.get("progress", True)
    bar = ProgressBar(total, "evaluate", "episode", quiet_if_quick=True) if progress else None
    hooks: list[Any] = [video] if video is not None else []
    if bar is not None:
        hooks.append(lambda _, done: bar.update(len(done)))

    def on_step(step: Any, done: list[Any]) -> None:
        for hook in hooks:
            hook(step, done)

    try:
        env_spaces = (envs.single_observation_space, envs.single_action_space)
        check_same_spaces(payload_spaces(payload), env_spaces)
        tuners = thread_tuners(cfg.get("torch_threads"), device, None, "acting step")
        common = dict(
            seed=cfg.seed, device=device, deterministic=bool(deterministic),
            max_steps=cfg.max_steps, on_step=on_step,
            threads=tuners.get("acting step"),
        )  # fmt: skip
        if conditioned:
            results = evaluate_targets(agent, envs, targets, cfg.episodes, **common)
            returns = np.concatenate([r.returns for r in results])
            lengths = np.concatenate([r.lengths for r in results])
        else:
            episodes = evaluate_episodes(agent, envs, cfg.episodes, **common)
            returns = np.array([ep.ret for ep in episodes])
            lengths = np.array([ep.length for ep in episodes])
    except MaxStepsError as err:
        raise ConfigError(f"{err}; raise max_steps or lower episodes") from None
    finally:
        if bar is not None:
            bar.close()
        envs.close()
    summary: dict[str, Any] = {"checkpoint": str(path), **_summary(returns, lengths)}
    summary["deterministic"] = bool(deterministic)
    if conditioned:
        summary["dataset"] = (payload.get("dataset") or {}).get("id")
        summary["episodes_per_target"] = int(cfg.episodes)
        summary["num_envs"] = num_envs
        summary["targets"] = targets
        summary["return_by_target"] = {f"{r.target:g}": r.summary()["mean_return"] for r in results}
        normalized = normalized_by_target(summary["return_by_target"], payload.get("dataset"))
        if normalized is not None:
            summary["normalized_score_by_target"] = normalized
        summary["per_target"] = [r.summary() for r in results]
    else:
        successes = [ep.success for ep in episodes if ep.success is not None]
        if successes:
            summary["success_rate"] = float(np.mean(successes))
    if video is not None:
        gif = video.save(gif_path)  # never through a link (VideoRecorder.save)
        if gif is not None:
            summary["video"] = str(gif)
    return summary


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse overrides, evaluate, print one JSON line."""
    return run_cli(argv, "evaluate", __doc__, evaluate)


if __name__ == "__main__":
    sys.exit(main())
