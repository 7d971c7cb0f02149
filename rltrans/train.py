"""python -m rltrans.train [group=option ...] [key=value ...]   (--help lists every knob)

Online training reads top to bottom like a CleanRL script: parse, seed, build,
then loop (collect -> advantages -> update -> log -> checkpoint). The pieces
live in modules: envs (make_env), agents (rltrans.registry),
rltrans.actors, rltrans.buffers, rltrans.learner, rltrans.checkpoint, rltrans.logging.
"""

from __future__ import annotations

import random
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from rltrans.checkpoint import (
    CheckpointManager,
    check_compatible,
    restore_rng_state,
    rng_state,
    space_to_dict,
)
from rltrans.config import ConfigError, run_cli, to_container
from rltrans.logging import EpisodeTracker, MetricLogger, ProgressBar
from rltrans.policy import spaces_payload


def select_device(name: str) -> torch.device:
    """auto -> cuda when available, else cpu; cuda without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise ConfigError(f"unknown device {name!r}; valid choices: auto, cpu, cuda, cuda:<index>")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name} but torch sees no CUDA device; use device=cpu or auto")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def prepare_run_dir(cfg: DictConfig, name: str | None = None) -> Path:
    """The run folder (created), from run_dir= or runs/<name>-s<seed>-<timestamp>.

    ``name`` defaults to ``<env>-<backbone>``; offline runs pass ``<dataset>-<agent>``.
    """
    if cfg.run_dir is None:
        if cfg.resume:
            raise ConfigError("resume=true needs run_dir=<the run to continue>")
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        if name is None:
            env_name = cfg.env.get("name") or str(cfg.env.get("id", "env")).replace("/", "_")
            name = f"{env_name}-{cfg.agent.backbone}"
        cfg.run_dir = f"runs/{name}-s{cfg.seed}-{stamp}"
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def build_agent(cfg: DictConfig, observation_space, action_space, device) -> torch.nn.Module:
    """The registered agent class the agent config names, built for the env-derived spaces."""
    from rltrans.registry import build_agent as build

    return build(to_container(cfg.agent), observation_space, action_space).to(device)


def checkpoint_payload(agent, learner, cfg, envs, global_step: int, update: int) -> dict[str, Any]:
    """Everything a resume or an evaluation needs (loadable with weights_only=True)."""
    return {
        "model": agent.state_dict(),
        "learner": learner.state_dict(),
        "global_step": global_step,
        "update": update,
        "rng": rng_state(),
        "config": to_container(cfg),
        "observation_space": space_to_dict(envs.single_observation_space),
        "action_space": space_to_dict(envs.single_action_space),
        **spaces_payload(envs.single_observation_space, envs.single_action_space),
    }


def resume_from(manager: CheckpointManager, agent, learner, envs) -> tuple[int, int]:
    """Restore weights, optimizer, schedule, RNG and counters; returns (global_step, update)."""
    payload = manager.load_latest()
    if payload is None:
        raise ConfigError(f"resume=true but no checkpoint in {manager.directory}")
    for what, space in (
        ("observation space", envs.single_observation_space),
        ("action space", envs.single_action_space),
    ):
        key = what.replace(" ", "_")
        check_compatible(payload[key], space_to_dict(space), what)
    agent.load_state_dict(payload["model"])
    learner.load_state_dict(payload["learner"])
    restore_rng_state(payload["rng"])
    return payload["global_step"], payload["update"]


def train_online(cfg: DictConfig) -> dict[str, Any]:
    """PPO on a vector env; returns the final summary."""
    from rltrans.actors import LocalActor, RewardScaler
    from rltrans.buffers.rollout import RolloutBuffer
    from rltrans.envs import make_env
    from rltrans.learner import NonFiniteLossError, PPOLearner

    run_dir = prepare_run_dir(cfg)
    device = select_device(cfg.device)
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    seed_everything(cfg.seed)
    algo = cfg.algo
    envs = make_env(cfg.env, seed=cfg.seed, device=device)
    agent = build_agent(cfg, envs.single_observation_space, envs.single_action_space, device)
    steps_per_update = algo.num_steps * envs.num_envs
    total_updates = max(1, -(-cfg.total_steps // steps_per_update))  # ceil
    learner = PPOLearner(
        agent,
        ppo=to_container(algo),
        lr=algo.lr,
        total_updates=total_updates,
        anneal_lr=algo.anneal_lr,
        max_grad_norm=algo.max_grad_norm,
        amp=algo.amp,
        compile=cfg.compile,
    )
    if cfg.compile:
        what = "the PPO loss and the acting step" if agent.compile_step() else "the PPO loss"
        print(f"compile=true: the first update compiles {what} (~15-60 s)", file=sys.stderr)
    manager = CheckpointManager(run_dir / "checkpoints", keep_last=cfg.keep_checkpoints)
    global_step, update = 0, 0
    scaler_state = None
    if cfg.resume:
        global_step, update = resume_from(manager, agent, learner, envs)
        scaler_state = manager.load_latest().get("reward_scaler")
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)

    buffer = RolloutBuffer(algo.num_steps, envs.num_envs, algo.segment_length, device)
    scaler = RewardScaler(envs.num_envs, algo.gamma, device) if algo.reward_scaling else None
    if scaler is not None and scaler_state:
        scaler.load_state_dict(scaler_state)
    actor = LocalActor(envs, agent, seed=cfg.seed + update, device=device, reward_scaler=scaler)
    tracker = EpisodeTracker(window=100)
    logger = MetricLogger(run_dir, use_tensorboard=cfg.tensorboard)
    bar = ProgressBar(cfg.total_steps, desc="train", unit="step") if cfg.progress else None
    if bar is not None:
        bar.update(global_step)
    start, start_step = time.perf_counter(), global_step
    status = "finished"
    try:
        while global_step < cfg.total_steps:
            actor.collect(buffer, on_info=tracker.update)
            buffer.compute_advantages(actor.bootstrap_value(), algo.gamma, algo.gae_lambda)
            t_learn = time.perf_counter()
            metrics = learner.update(buffer)
            agent.update_obs_norm(buffer.obs)  # after the update: acting == replay within a rollout
            learn_s = time.perf_counter() - t_learn
            global_step += steps_per_update
            update += 1
            timings = actor.pop_timings()
            sps = (global_step - start_step) / (time.perf_counter() - start)
            logger.log(
                global_step,
                {
                    **{f"losses/{k}": v for k, v in metrics.items()},
                    "charts/episodic_return": tracker.mean_return,
                    "charts/episodic_length": tracker.mean_length,
                    "charts/success_rate": tracker.success_rate,
                    "charts/SPS": sps,
                    "perf/env_ms": 1e3 * timings["env"],
                    "perf/act_ms": 1e3 * timings["act"],
                    "perf/learn_ms": 1e3 * learn_s,
                },
            )
            for name, values in learner.distributions.items():  # e.g. ponder steps per token
                logger.log_histogram(global_step, f"charts/{name}", values)
            if update % cfg.checkpoint_every == 0 or global_step >= cfg.total_steps:
                payload = checkpoint_payload(agent, learner, cfg, envs, global_step, update)
                if scaler is not None:
                    payload["reward_scaler"] = scaler.state_dict()
                manager.save(global_step, payload)
            if bar is not None:
                bar.update(steps_per_update, SPS=f"{sps:.0f}", ret=tracker.mean_return)
    except NonFiniteLossError as err:
        status = "stopped"
        last = manager.latest()
        print(
            f"training stopped at step {global_step}: {err}. Last good checkpoint: {last}",
            file=sys.stderr,
        )
    finally:
        if bar is not None:
            bar.close()
        logger.close()
        envs.close()
    return {
        "status": status,
        "run_dir": str(run_dir),
        "global_step": global_step,
        "updates": update,
        "episodic_return": tracker.mean_return,
        "episodic_length": tracker.mean_length,
        "success_rate": tracker.success_rate,
        "episodes": tracker.episodes_seen,
        "SPS": (global_step - start_step) / max(1e-9, time.perf_counter() - start),
        "checkpoint": str(manager.latest()) if manager.latest() else None,
    }


def train_offline(cfg: DictConfig) -> dict[str, Any]:
    """DT/BC on a fixed dataset; returns the final summary (see :mod:`rltrans.offline`)."""
    from rltrans.offline import train_offline as run  # that module imports this one's helpers

    return run(cfg)


TRAINERS = {"online": train_online, "offline": train_offline}


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse overrides, train, print one JSON summary line."""

    def run(cfg: DictConfig) -> dict[str, Any]:
        kind = cfg.algo.kind
        if kind not in TRAINERS:
            raise ConfigError(f"unknown algo kind {kind!r}; valid kinds: {', '.join(TRAINERS)}")
        return TRAINERS[kind](cfg)

    return run_cli(argv, "train", __doc__, run)


if __name__ == "__main__":
    sys.exit(main())
