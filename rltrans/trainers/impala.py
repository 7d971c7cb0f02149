"""IMPALA (Espeholt et al. 2018): actors roll out, the learner trains on their rollouts with
V-trace off-policy correction, for any memory agent.

Reads top to bottom like trainers/ppo.py: open the run, build, then loop

    get B rollouts from the actor pool (dropping those older than max_policy_lag)
    -> one V-trace update (the learner) -> publish the weights -> log
    -> evaluate the learner's agent (every algo.eval_every updates) -> checkpoint (every
    checkpoint_every updates, and at once on SIGINT / SIGTERM, which then stop the run)

The actor pool (:mod:`rltrans.runtime.pool`) is the only thing a runtime changes:
``runtime=local`` steps ``num_actors`` actors in this process, round-robin with the
learner's own module (deterministic, policy lag 0); ``runtime=process`` runs them in
actor processes (:mod:`rltrans.runtime.process`). Either way every actor acts through
the one acting loop. Rewards are scaled here, one running scaler per actor, so their
statistics are in the checkpoints whatever the runtime.

Several learner processes (``torchrun --nproc_per_node=K -m rltrans.train algo=impala ...``)
each run their own pool of actors (other seeds) and average their gradients every step
(:mod:`rltrans.distributed`), so they hold the same weights throughout; a step then consumes
K x B rollouts. Rank 0 writes the checkpoints (with every rank's reward scalers) and the logs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig

from rltrans import distributed
from rltrans.accel import Accel
from rltrans.config import to_container
from rltrans.config.plan import RunPlan
from rltrans.config.resources import check_resources
from rltrans.envs import make_env
from rltrans.learners import ImpalaLearner, NonFiniteLossError
from rltrans.logging import EpisodeTracker
from rltrans.registry import algo_agent_options, build_agent
from rltrans.run import Run, seed_everything
from rltrans.runtime.actors import RewardScaler
from rltrans.runtime.pool import ActorPool, LocalPool, Rollout
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


def build_pool(
    cfg: DictConfig,
    agent: torch.nn.Module,
    envs: list[Any],
    *,
    seed: int,
    device: torch.device,
    on_info: Callable[[dict[str, Any]], Any],
) -> ActorPool:
    """The actor pool ``cfg.runtime`` names; its envs reset with ``seed``."""
    algo, kind = cfg.algo, cfg.runtime.kind
    if kind == "local":
        return LocalPool(
            envs,
            agent,
            num_steps=algo.num_steps,
            segment_length=algo.segment_length,
            seed=seed,
            device=device,
            on_info=on_info,
        )
    pool: Any
    if kind == "ray":
        from rltrans.runtime.ray_pool import RayPool, import_ray

        import_ray()  # without Ray: a ConfigError saying how to install it, before envs close
        pool = RayPool
    else:
        from rltrans.runtime.process import ProcessPool

        pool = ProcessPool
    for e in envs:  # the actors build their own
        e.close()
    return pool.from_config(cfg, agent, seed=seed, device=device, on_info=on_info)


def scale_rewards(rollout: Rollout, scalers: list[RewardScaler] | None) -> None:
    """Scale the rollout's rewards in place, step by step, with its actor's running scaler."""
    if scalers is None:
        return
    buffer, scaler = rollout.buffer, scalers[rollout.actor_id]
    ended = buffer.terminated | buffer.truncated
    for t in range(buffer.num_steps):
        buffer.rewards[t] = scaler(buffer.rewards[t], ended[t]).to(buffer.rewards.dtype)


class Scalers:
    """One running reward scaler per actor, checkpointed with every learner process's."""

    def __init__(self, scalers: list[RewardScaler], rank: int) -> None:
        self.scalers, self.rank = scalers, rank

    def state_dict(self) -> dict[str, Any]:
        """Every rank's scalers (a collective: every rank calls it)."""
        states = distributed.gather_objects([s.state_dict() for s in self.scalers])
        return {"own": states[0], "by_rank": states if len(states) > 1 else []}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """This rank's scalers (rank 0's where the run had fewer learner processes)."""
        if isinstance(state, list):  # a checkpoint of one learner process, older layout
            state = {"own": state, "by_rank": []}
        by_rank = state["by_rank"]
        saved = by_rank[self.rank] if self.rank < len(by_rank) else state["own"]
        for scaler, own in zip(self.scalers, saved, strict=False):
            scaler.load_state_dict(own)


class Count:
    """A checkpointed counter (rollouts dropped as too stale)."""

    def __init__(self) -> None:
        self.value = 0

    def state_dict(self) -> int:
        """The count."""
        return self.value

    def load_state_dict(self, value: int) -> None:
        """Restore the count."""
        self.value = int(value)


def train_impala(plan: RunPlan, callbacks: Callbacks | None = None) -> dict[str, Any]:
    """Train for ``total_steps`` env steps (steps trained on); returns the final summary."""
    run = Run.start(plan.config, name=run_name(plan.config), multi_process=True)
    report_horizon(plan.horizon_note)  # what agent.horizon fitted
    cfg, device, algo, world = run.cfg, run.device, run.cfg.algo, run.world
    local = cfg.runtime.kind == "local"
    num_actors = cfg.runtime.num_actors if local else 1  # process: the pool builds its own
    with run.building("env"):
        envs = [make_env(cfg.env, seed=cfg.seed + i, device=device) for i in range(num_actors)]
    spaces = (envs[0].single_observation_space, envs[0].single_action_space)
    with run.building("agent"):
        check_resources(cfg, spaces=spaces)  # the heads and encoders the spaces size
        agent_cfg = to_container(cfg.agent)
        options = algo_agent_options(agent_cfg, to_container(algo))  # algo.reconstruction_coef
        agent = build_agent(agent_cfg, *spaces, **options).to(device)
    with run.building("env"):  # the learner evaluates its own agent (algo.eval_every)
        evaluation = PeriodicEvaluation(cfg, agent, device, main=world.is_main)
    per_actor = None if local else cfg.runtime.get("envs_per_actor")  # N of each rollout
    num_envs = per_actor or envs[0].num_envs
    # Under torchrun each of the world.size learner processes trains on its own rollouts.
    steps_per_update = algo.batch_rollouts * algo.num_steps * num_envs * world.size
    made_of = "algo.batch_rollouts x algo.num_steps x envs per actor"
    if world.distributed:
        made_of += " x learner processes"
    total_updates = run.whole_updates(steps_per_update, made_of)
    accel = Accel()
    learner = ImpalaLearner(
        agent,
        impala=to_container(algo),
        lr=algo.lr,
        total_updates=total_updates,
        anneal_lr=algo.anneal_lr,
        max_grad_norm=algo.max_grad_norm,
        amp=algo.amp,
        accel=accel,
    )
    global_step = run.resume(agent, learner, spaces)
    actors = cfg.runtime.num_actors
    scalers = None
    if algo.reward_scaling:
        scalers = [RewardScaler(num_envs, algo.gamma, device) for _ in range(actors)]
    # torch_threads=auto tunes the learner (and runtime=local's in-process acting); actor
    # processes use one thread, and so does every learner process under torchrun.
    names = ("learner step", "acting step") if local else ("learner step",)
    tuners, choice = speed(cfg, accel, device, total_updates, *(() if world.distributed else names))
    tracker, dropped = EpisodeTracker(window=100), Count()
    state = TrainerState(
        episodes=tracker, dropped=dropped, threads=tuners, compile=choice,
        reward_scalers=None if scalers is None else Scalers(scalers, world.rank),
    )  # fmt: skip
    state.load_state_dict(run.resumed_payload or {})
    choice.set_updates_left(total_updates - state.update)
    # Learner processes: the same weights everywhere, other actors (seeds) on each.
    distributed.broadcast_module_(agent)
    seed_offset = world.rank * actors * num_envs  # actor_seed: actor i resets with seed + i * N
    if world.rank:
        seed_everything(cfg.seed + state.update + 1_000_003 * world.rank)
    pool = build_pool(
        cfg,
        agent,
        envs,
        seed=cfg.seed + state.update + seed_offset,
        device=device,
        on_info=tracker.update,
    )
    pool.publish(agent.state_dict(), state.update)
    for actor in pool.actors if isinstance(pool, LocalPool) else ():
        actor.loop.threads = tuners.get("acting step")
        accel.act_through(actor, agent)
    logger, bar = logger_and_bar(
        cfg, run, global_step, total_updates * steps_per_update, "step", main=world.is_main
    )
    start, start_step, status = time.perf_counter(), global_step, "finished"
    # SIGINT / SIGTERM: finish the update, checkpoint, stop (every learner process together).
    stop = StopSignals().install()
    (callbacks or Callbacks()).attach(logger, stop)  # rltrans.learn's on_log / on_eval
    try:
        while global_step < cfg.total_steps:
            rollouts: list[Rollout] = []
            lags: list[int] = []
            while len(rollouts) < algo.batch_rollouts:
                rollout = pool.get()
                scale_rewards(rollout, scalers)  # every rollout: the running returns go on
                lag = state.update - rollout.policy_version
                if lag > algo.max_policy_lag:  # too stale to correct: dropped and counted
                    dropped.value += 1
                    pool.release(rollout)
                    continue
                rollouts.append(rollout)
                lags.append(lag)
            t_learn = time.perf_counter()
            metrics = learner.update(
                [r.buffer for r in rollouts], [r.bootstrap_value for r in rollouts]
            )
            for rollout in rollouts:  # after the update: acting == replay within a rollout
                agent.update_obs_norm(rollout.buffer.obs)
                pool.release(rollout)
            distributed.broadcast_module_(agent, buffers_only=True)  # rank 0's obs statistics
            learn_s = time.perf_counter() - t_learn
            global_step += steps_per_update
            state.update += 1
            pool.publish(agent.state_dict(), state.update)
            stats = pool.stats()
            # The learner's work, and acting where it runs here.
            choice.after_update(learn_s + (stats.get("act_ms", 0.0) / 1e3 if local else 0.0))
            sps = (global_step - start_step) / (time.perf_counter() - start)
            logger.log(
                global_step,
                {
                    **{f"losses/{k}": v for k, v in metrics.items()},
                    **tracker.metrics(),
                    "charts/SPS": sps,
                    "perf/learner_sps": steps_per_update / max(learn_s, 1e-9),
                    "perf/policy_lag": sum(lags) / len(lags),
                    "perf/queue_wait_ms": stats.get("queue_wait_ms", 0.0),
                    "perf/actor_restarts": stats.get("restarts", 0.0),
                    "perf/dropped_rollouts": dropped.value + stats.get("dropped", 0.0),
                    "perf/env_ms": stats.get("env_ms", 0.0),
                    "perf/act_ms": stats.get("act_ms", 0.0),
                    "perf/learn_ms": 1e3 * learn_s,
                },
            )
            logger.log_histogram(global_step, "perf/policy_lag", torch.tensor(lags))
            for name, values in learner.distributions.items():  # e.g. ponder steps per token
                logger.log_histogram(global_step, f"charts/{name}", values)
            evaluation.after_update(state.update, global_step, logger)
            done = global_step >= cfg.total_steps
            stopping = stop.poll() and not done  # a signal: checkpoint now, then stop
            if stopping or done or state.update % cfg.checkpoint_every == 0:
                run.save(global_step, agent, learner, spaces, extra=state.state_dict())
                if local:
                    # Every env starts afresh after a checkpoint, as in a run resumed from it,
                    # so an interrupted run continues exactly as this one does. Actors in other
                    # processes run asynchronously (no resume repeats them exactly), so there
                    # episodes go on: cutting them every checkpoint_every updates of one
                    # rollout would cap long episodes (CartPole's 500 steps).
                    pool.restart_envs(cfg.seed + state.update + seed_offset)
                    for scaler in scalers or ():  # running returns belong to the cut episodes
                        scaler.returns.zero_()
            if bar is not None:
                bar.update(steps_per_update, ret=tracker.mean_return)
            if stopping:
                status = stop.status  # interrupted (a signal) or stopped_early
                if world.is_main:
                    stop.report(global_step, run.latest_checkpoint(), run.dir)
                break
    except NonFiniteLossError as err:
        status = "stopped"
        run.stop_message(global_step, err)
    finally:
        if bar is not None:
            bar.close()
        logger.close()
        pool.close()  # stops the actors, as at a normal finish
        evaluation.close()
        if status == "interrupted":  # torchrun stops every process once one exits: rank 0
            distributed.barrier()  # has written its checkpoint and closed before any exits
        run.close()
        stop.restore()
    return {
        "status": status,
        "run_dir": str(run.dir),
        "global_step": global_step,
        "updates": state.update,
        "dropped_rollouts": dropped.value,
        "episodic_return": tracker.mean_return,
        "episodic_length": tracker.mean_length,
        "success_rate": tracker.success_rate,
        "episodes": tracker.episodes_seen,
        "SPS": (global_step - start_step) / max(1e-9, time.perf_counter() - start),
        "checkpoint": run.latest_checkpoint(),
        **evaluation.summary(),
        **stop.summary(status),
    }
