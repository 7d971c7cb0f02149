"""PPO (Schulman et al. 2017) with GAE on a vector env, for any memory agent.

Reads top to bottom like a CleanRL script: open the run, build, then loop

    collect T steps of N envs (the actor) -> advantages -> update (the learner) -> log
    -> checkpoint

The pieces live in modules: the run context (:mod:`rltrans.run`), envs
(:func:`rltrans.envs.make_env`), agents (:mod:`rltrans.registry`), the actor
(:mod:`rltrans.runtime.actors`), the rollout buffer and the learner.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig

from rltrans.buffers.rollout import RolloutBuffer
from rltrans.config import to_container
from rltrans.envs import make_env
from rltrans.learner import NonFiniteLossError, PPOLearner, draws_random
from rltrans.logging import EpisodeTracker, MetricLogger, ProgressBar
from rltrans.registry import build_agent
from rltrans.run import Run, compile_choice, thread_tuners
from rltrans.runtime.actors import LocalActor, RewardScaler


def run_name(cfg: DictConfig) -> str:
    """<env>-<backbone>, the default run folder name."""
    env_name = cfg.env.get("name") or str(cfg.env.get("id", "env")).replace("/", "_")
    return f"{env_name}-{cfg.agent.get('backbone', cfg.agent.kind)}".replace(":", "_")


def train_ppo(cfg: DictConfig, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Train for ``total_steps`` env steps; returns the final summary."""
    run = Run.start(cfg, name=run_name(cfg), overrides=overrides)
    cfg, device, algo = run.cfg, run.device, run.cfg.algo
    with run.building("env"):
        envs = make_env(cfg.env, seed=cfg.seed, device=device)
    spaces = (envs.single_observation_space, envs.single_action_space)
    with run.building("agent"):
        agent = build_agent(to_container(cfg.agent), *spaces).to(device)
    steps_per_update = algo.num_steps * envs.num_envs
    total_updates = run.whole_updates(steps_per_update, "algo.num_steps x env.num_envs")
    learner = PPOLearner(
        agent,
        ppo=to_container(algo),
        lr=algo.lr,
        total_updates=total_updates,
        anneal_lr=algo.anneal_lr,
        max_grad_norm=algo.max_grad_norm,
        amp=algo.amp,
    )
    global_step = run.resume(agent, learner, spaces)
    resumed = run.resumed_payload or {}
    update = int(resumed.get("update", 0))
    chooser = compile_choice(cfg, learner, agent, total_updates - update, resumed.get("compile"))

    buffer = RolloutBuffer(algo.num_steps, envs.num_envs, algo.segment_length, device)
    scaler = RewardScaler(envs.num_envs, algo.gamma, device) if algo.reward_scaling else None
    if scaler is not None and resumed.get("reward_scaler"):
        scaler.load_state_dict(resumed["reward_scaler"])
    actor = LocalActor(envs, agent, seed=cfg.seed + update, device=device, reward_scaler=scaler)
    actor.set_policy_version(update)
    # Minibatches may run as parts side by side, unless the model draws random numbers
    # (dropout): threads racing for one generator would make the run irreproducible.
    streams = () if draws_random(agent) else ("learner step",)
    tuners = thread_tuners(
        cfg, device, resumed.get("threads"), "learner step", "acting step", streams=streams
    )
    learner.threads, actor.loop.threads = tuners.get("learner step"), tuners.get("acting step")
    tracker = EpisodeTracker(window=100)
    if resumed.get("episodes"):
        tracker.load_state_dict(resumed["episodes"])
    # Events logged after the checkpoint by an interrupted process are hidden (those AT its
    # step were logged before it was written, so they stay).
    purge = global_step + 1 if cfg.resume else None
    logger = MetricLogger(run.dir, use_tensorboard=cfg.tensorboard, purge_step=purge)
    bar = None
    if cfg.progress:
        bar = ProgressBar(total_updates * steps_per_update, "train", "step", initial=global_step)
    start, start_step, status = time.perf_counter(), global_step, "finished"
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
            actor.set_policy_version(update)
            timings = actor.pop_timings()
            if chooser is not None:
                chooser.after_update(learn_s + timings["act"])
            sps = (global_step - start_step) / (time.perf_counter() - start)
            logger.log(
                global_step,
                {
                    **{f"losses/{k}": v for k, v in metrics.items()},
                    **tracker.metrics(),
                    "charts/SPS": sps,
                    "perf/env_ms": 1e3 * timings["env"],
                    "perf/act_ms": 1e3 * timings["act"],
                    "perf/learn_ms": 1e3 * learn_s,
                },
            )
            for name, values in learner.distributions.items():  # e.g. ponder steps per token
                logger.log_histogram(global_step, f"charts/{name}", values)
            if update % cfg.checkpoint_every == 0 or global_step >= cfg.total_steps:
                extra = {"update": update, "episodes": tracker.state_dict()}
                extra["threads"] = {name: t.state_dict() for name, t in tuners.items()}
                extra["compile"] = chooser.choice if chooser is not None else None
                if scaler is not None:
                    extra["reward_scaler"] = scaler.state_dict()
                run.save(global_step, agent, learner, spaces, extra=extra)
                # Every env starts afresh after a checkpoint, as in a run resumed from it, so
                # an interrupted run continues exactly as this one does.
                actor.restart(seed=cfg.seed + update)
            if bar is not None:
                bar.update(steps_per_update, SPS=f"{sps:.0f}", ret=tracker.mean_return)
    except NonFiniteLossError as err:
        status = "stopped"
        run.stop_message(global_step, err)
    finally:
        if bar is not None:
            bar.close()
        logger.close()
        envs.close()
        run.close()
    return {
        "status": status,
        "run_dir": str(run.dir),
        "global_step": global_step,
        "updates": update,
        "episodic_return": tracker.mean_return,
        "episodic_length": tracker.mean_length,
        "success_rate": tracker.success_rate,
        "episodes": tracker.episodes_seen,
        "SPS": (global_step - start_step) / max(1e-9, time.perf_counter() - start),
        "checkpoint": run.latest_checkpoint(),
    }
