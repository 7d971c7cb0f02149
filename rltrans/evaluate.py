"""python -m rltrans.evaluate checkpoint=<file or run dir> [episodes=20] [key=value ...]

Runs a saved policy for a number of episodes in a vector env (evaluation
settings: no episodic life, no reward clipping) and prints one JSON line:
mean_return, std_return, episodes, mean_length, and success_rate where the env
reports info["success"]. Knobs: configs/evaluate.yaml (``--help`` prints them).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from rltrans.checkpoint import (
    CheckpointError,
    CheckpointMismatchError,
    check_compatible,
    load_checkpoint,
    space_to_dict,
)
from rltrans.config import ConfigError, config_help, load_config
from rltrans.logging import EpisodeTracker, print_summary
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


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Run the evaluation a config describes and return the summary."""
    from envs import is_torch_env, make_env
    from envs.spaces import obs_to_tensor

    device = select_device(cfg.device)
    seed_everything(cfg.seed)
    path = resolve_checkpoint(cfg.checkpoint)
    payload = load_checkpoint(path, map_location=device)
    agent = agent_from_checkpoint(payload, device)
    env_cfg = OmegaConf.create(payload["config"]["env"])
    if cfg.num_envs:
        env_cfg.num_envs = cfg.num_envs
    if cfg.video:
        if env_cfg.kind != "gym":
            raise ConfigError("video=true needs a Gymnasium env (torch-native envs do not render)")
        env_cfg.kwargs = {**env_cfg.get("kwargs", {}), "render_mode": "rgb_array"}
    envs = make_env(env_cfg, seed=cfg.seed, device=device, training=False)
    for what in ("observation_space", "action_space"):
        space = getattr(envs, f"single_{what}")
        check_compatible(payload[what], space_to_dict(space), what.replace("_", " "))

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
            out, state = agent.act(x, state, done, deterministic=cfg.deterministic)
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
        "deterministic": bool(cfg.deterministic),
    }
    if tracker.successes:
        summary["success_rate"] = float(np.mean(tracker.successes))
    if frames:
        video = Path(cfg.video_dir or path.parent.parent / "videos") / "eval.gif"
        save_gif(frames, video)
        summary["video"] = str(video)
    return summary


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse overrides, evaluate, print one JSON line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:
        print(__doc__.strip() + "\n\n" + config_help("evaluate"))
        return 0
    try:
        cfg = load_config(argv, "evaluate")
        if cfg.checkpoint is None:
            raise ConfigError("checkpoint=<checkpoint file or run dir> is required")
        summary = evaluate(cfg)
    except (ConfigError, FileNotFoundError, CheckpointError, CheckpointMismatchError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
