"""PPO (Schulman et al. 2017) with GAE on a vector env, for any memory agent.

Reads top to bottom like a CleanRL script: open the run, build, then loop

    collect T steps of N envs (the actor) -> advantages -> update (the learner) -> log
    -> evaluate (every algo.eval_every updates) -> checkpoint (every checkpoint_every
    updates, and at once on SIGINT / SIGTERM, which then stop the run)

The pieces live in modules: the run context (:mod:`rltrans.run`), envs
(:func:`rltrans.envs.make_env`), agents (:mod:`rltrans.registry`), the actor
(:mod:`rltrans.runtime.actors`), the rollout buffer, the learner, the periodic evaluation
(:class:`rltrans.trainers.common.PeriodicEvaluation`) and the signals
(:mod:`rltrans.trainers.stop`).
"""

from __future__ import annotations

import time
from typing import Any

from rltrans.accel import Accel, draws_random
from rltrans.buffers.rollout import RolloutBuffer
from rltrans.config import to_container
from rltrans.config.plan import RunPlan
from rltrans.config.resources import check_resources
from rltrans.envs import make_env
from rltrans.learners import NonFiniteLossError, PPOLearner
from rltrans.logging import EpisodeTracker
from rltrans.registry import algo_agent_options, build_agent
from rltrans.run import Run
from rltrans.runtime.actors import LocalActor, RewardScaler
from rltrans.trainers.common import (
    Callbacks,
    PeriodicEvaluation,
    TrainerState,
    logger_and_bar,
    run_name,
    speed,
)
from rltrans.trainers.horizon import report_horizon
from rltrans.trainers.stop import StopSignals


def train_ppo(plan: RunPlan, callbacks: Callbacks | None = None) -> dict[str, Any]:
    """Train for ``total_steps`` env steps; returns the final summary."""
    run = Run.start(plan.config, name=run_name(plan.config))
    report_horizon(plan.horizon_note)  # what agent.horizon fitted
    cfg, device, algo = run.cfg, run.device, run.cfg.algo
    with run.building("env"):
        envs = make_env(cfg.env, seed=cfg.seed, device=device)
    spaces = (envs.single_observation_space, envs.single_action_space)
    with run.building("agent"):
        check_resources(cfg, spaces=spaces)  # the heads and encoders the spaces size
        agent_cfg = to_container(cfg.agent)
        options = algo_agent_options(agent_cfg, to_container(algo))  # algo.reconstruction_coef
        agent = build_agent(agent_cfg, *spaces, **options).to(device)
    with run.building("env"):
        evaluation = PeriodicEvaluation(cfg, agent, device)  # algo.eval_every; 0 = none
    steps_per_update = algo.num_steps * envs.num_envs
    total_updates = run.whole_updates(steps_per_update, "algo.num_steps x env.num_envs")
    accel = Accel(chunk_obs_mb=algo.get("chunk_obs_mb"))
    learner = PPOLearner(
        agent,
        ppo=to_container(algo),
        lr=algo.lr,
        total_updates=total_updates,
        anneal_lr=algo.anneal_lr,
        max_grad_norm=algo.max_grad_norm,
        amp=algo.amp,
        accel=accel,
    )
    global_step = run.resume(agent, learner, spaces)
    buffer = RolloutBuffer(algo.num_steps, envs.num_envs, algo.segment_length, device)
    scaler = RewardScaler(envs.num_envs, algo.gamma, device) if algo.reward_scaling else None
    # Minibatches may run as parts side by side, unless the model draws random numbers
    # (dropout): threads racing for one generator would make the run irreproducible.
    streams = () if draws_random(agent) else ("learner step",)
    tuners, choice = speed(
        cfg, accel, device, total_updates, "learner step", "acting step", streams=streams
    )
    tracker = EpisodeTracker(window=100)
    state = TrainerState(episodes=tracker, reward_scaler=scaler, threads=tuners, compile=choice)
    state.load_state_dict(run.resumed_payload or {})
    choice.set_updates_left(total_updates - state.update)
    actor = LocalActor(
        envs, agent, seed=cfg.seed + state.update, device=device, reward_scaler=scaler
    )
    actor.loop.threads = tuners.get("acting step")
    accel.act_through(actor, agent)
    actor.set_policy_version(state.update)
    logger, bar = logger_and_bar(cfg, run, global_step, total_updates * steps_per_update, "step")
    start, start_step, status = time.perf_counter(), global_step, "finished"
    stop = StopSignals().install()  # SIGINT / SIGTERM: finish the update, checkpoint, stop
    (callbacks or Callbacks()).attach(logger, stop)  # rltrans.learn's on_log / on_eval
    try:
        while global_step < cfg.total_steps:
            actor.collect(buffer, on_info=tracker.update)
            buffer.compute_advantages(actor.bootstrap_value(), algo.gamma, algo.gae_lambda)
            t_learn = time.perf_counter()
            metrics = learner.update(buffer)
            agent.update_obs_norm(buffer.obs)  # after the update: acting == replay within a rollout
            learn_s = time.perf_counter() - t_learn
            global_step += steps_per_update
            state.update += 1
            actor.set_policy_version(state.update)
            timings = actor.pop_timings()
            choice.after_update(learn_s + timings["act"])
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
            evaluation.after_update(state.update, global_step, logger)
            done = global_step >= cfg.total_steps
            stopping = stop.poll() and not done  # a signal: checkpoint now, then stop
            if stopping or done or state.update % cfg.checkpoint_every == 0:
                run.save(global_step, agent, learner, spaces, extra=state.state_dict())
                # Every env starts afresh after a checkpoint, as in a run resumed from it, so
                # an interrupted run continues exactly as this one does.
                actor.restart(seed=cfg.seed + state.update)
            if bar is not None:
                bar.update(steps_per_update, ret=tracker.mean_return)
            if stopping:
                status = stop.status  # interrupted (a signal) or stopped_early
                stop.report(global_step, run.latest_checkpoint(), run.dir)
                break
    except NonFiniteLossError as err:
        status = "stopped"
        run.stop_message(global_step, err)
    finally:
        if bar is not None:
            bar.close()
        logger.close()
        envs.close()
        evaluation.close()
        run.close()
        stop.restore()
    return {
        "status": status,
        "run_dir": str(run.dir),
        "global_step": global_step,
        "updates": state.update,
        "episodic_return": tracker.mean_return,
        "episodic_length": tracker.mean_length,
        "success_rate": tracker.success_rate,
        "episodes": tracker.episodes_seen,
        "SPS": (global_step - start_step) / max(1e-9, time.perf_counter() - start),
        "checkpoint": run.latest_checkpoint(),
        **evaluation.summary(),
        **stop.summary(status),
    }
