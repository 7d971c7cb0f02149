"""IMPALA (Espeholt et al. 2018): actors roll out, the learner trains on their rollouts with
V-trace off-policy correction, for any memory agent.

On the trainers' shared skeleton (:class:`rltrans.trainers.skeleton.Trainer`), as PPO: open
the run, build, then loop

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

from rltrans import distributed
from rltrans.accel.run_speed import ACTING, LEARNER, RunSpeed
from rltrans.config.plan import RunPlan
from rltrans.config.run_settings import LocalRuntime
from rltrans.envs import make_env
from rltrans.envs.gym_vec import close_envs
from rltrans.learners import ImpalaLearner
from rltrans.run.context import Run, seed_everything
from rltrans.run.logging import EpisodeTracker
from rltrans.runtime.actors import RewardScaler
from rltrans.runtime.pool import ActorPool, LocalPool, Rollout
from rltrans.trainers.common import (
    Callbacks,
    TrainerState,
    run_name,
)
from rltrans.trainers.skeleton import OnlineTrainer


def build_pool(
    plan: RunPlan,
    agent: torch.nn.Module,
    envs: list[Any],
    *,
    seed: int,
    device: torch.device,
    on_info: Callable[[dict[str, Any]], Any],
) -> ActorPool:
    """The actor pool ``plan.runtime`` names; its envs reset with ``seed``."""
    algo, kind = plan.algo, plan.runtime.kind
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
    return pool.from_config(plan.config, agent, seed=seed, device=device, on_info=on_info)


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


class ImpalaTrainer(OnlineTrainer):
    """IMPALA's learner on the skeleton of :class:`rltrans.trainers.skeleton.Trainer`."""

    multi_process = True

    def name(self) -> str:
        """<env>-<backbone>."""
        return run_name(self.plan)

    def is_main(self) -> bool:
        """Rank 0 reports."""
        return self.run.world.is_main

    def build(self, run: Run) -> None:
        """Envs, agent, learner, the resumed state and the actor pool."""
        device, algo, world = run.device, self.plan.algo, run.world
        seed = self.plan.run.seed
        runtime = self.plan.runtime
        self.local = local = isinstance(runtime, LocalRuntime)
        num_actors = runtime.num_actors if local else 1  # process: the pool builds its own
        with run.building("env"):
            env = self.plan.env.to_dict()
            self.envs = [make_env(env, seed=seed + i, device=device) for i in range(num_actors)]
        envs = self.envs
        self.build_agent(run, (envs[0].single_observation_space, envs[0].single_action_space))
        agent = self.agent
        per_actor = None if local else runtime.envs_per_actor  # N of each rollout
        num_envs = per_actor or envs[0].num_envs
        # Under torchrun each of the world.size learner processes trains on its own rollouts.
        self.steps_per_update = algo.batch_rollouts * algo.num_steps * num_envs * world.size
        made_of = "algo.batch_rollouts x algo.num_steps x envs per actor"
        if world.distributed:
            made_of += " x learner processes"
        updates = run.whole_updates(self.steps_per_update, made_of)
        self.total = updates * self.steps_per_update
        # torch_threads=auto tunes the learner (and runtime=local's in-process acting); actor
        # processes use one thread, and so does every learner process under torchrun.
        calls = () if world.distributed else (LEARNER, ACTING) if local else (LEARNER,)
        self.speed = speed = RunSpeed(self.plan.speed, device, updates, calls=calls)
        self.build_learner(ImpalaLearner, updates, speed.accel)
        self.progress = run.resume(agent, self.learner, self.spaces)
        self.scalers = None
        if algo.reward_scaling:
            actors = runtime.num_actors
            self.scalers = [RewardScaler(num_envs, algo.gamma, device) for _ in range(actors)]
        self.tracker, self.dropped = EpisodeTracker(window=100), Count()
        scalers = None if self.scalers is None else Scalers(self.scalers, world.rank)
        self.state = TrainerState(
            episodes=self.tracker, dropped=self.dropped, reward_scalers=scalers, **speed.parts(),
        )  # fmt: skip
        self.state.load_state_dict(run.resumed_payload or {}, source=run.resumed_source)
        speed.start(updates - self.state.update)
        self.pool = self._start_pool(run, num_envs)
        for actor in self.pool.actors if isinstance(self.pool, LocalPool) else ():
            speed.act_through(actor, agent)

    def _start_pool(self, run: Run, num_envs: int) -> ActorPool:
        """The actor pool, acting with the learner's weights (the same on every learner)."""
        world, update = run.world, self.state.update
        seed = self.plan.run.seed
        # Learner processes: the same weights everywhere, other actors (seeds) on each.
        distributed.broadcast_module_(self.agent)
        # actor_seed: actor i resets with seed + i * N
        self.seed_offset = world.rank * self.plan.runtime.num_actors * num_envs
        if world.rank:
            seed_everything(seed + update + 1_000_003 * world.rank)
        pool = build_pool(
            self.plan,
            self.agent,
            self.envs,
            seed=seed + update + self.seed_offset,
            device=run.device,
            on_info=self.tracker.update,
        )
        pool.publish(self.agent.state_dict(), update)
        return pool

    def _batch(self) -> tuple[list[Rollout], list[int]]:
        """``algo.batch_rollouts`` rollouts fresh enough to correct, and their policy lags."""
        algo, pool = self.plan.algo, self.pool
        rollouts: list[Rollout] = []
        lags: list[int] = []
        while len(rollouts) < algo.batch_rollouts:
            rollout = pool.get()
            scale_rewards(rollout, self.scalers)  # every rollout: the running returns go on
            lag = self.state.update - rollout.policy_version
            if lag > algo.max_policy_lag:  # too stale to correct: dropped and counted
                self.dropped.value += 1
                pool.release(rollout)
                continue
            rollouts.append(rollout)
            lags.append(lag)
        return rollouts, lags

    def update(self) -> None:
        """Take a batch of rollouts, update, publish the weights, log, evaluate where due."""
        pool, agent, state = self.pool, self.agent, self.state
        rollouts, lags = self._batch()
        t_learn = time.perf_counter()
        metrics = self.learner.update(
            [r.buffer for r in rollouts], [r.bootstrap_value for r in rollouts]
        )
        for rollout in rollouts:  # after the update: acting == replay within a rollout
            agent.update_obs_norm(rollout.buffer.obs)
            pool.release(rollout)
        distributed.broadcast_module_(agent, buffers_only=True)  # rank 0's obs statistics
        learn_s = time.perf_counter() - t_learn
        self.progress += self.steps_per_update
        state.update += 1
        pool.publish(agent.state_dict(), state.update)
        stats = pool.stats()
        # The learner's work, and acting where it runs here.
        self.speed.after_update(learn_s + (stats.get("act_ms", 0.0) / 1e3 if self.local else 0))
        self._log(metrics, lags, stats, learn_s)
        self.evaluation.after_update(state.update, self.progress, self.logger)
        if self.bar is not None:
            self.bar.update(self.steps_per_update, ret=self.tracker.mean_return)

    def _log(
        self, metrics: dict[str, Any], lags: list[int], stats: dict[str, float], learn_s: float
    ) -> None:
        logger, step = self.logger, self.progress
        logger.log(
            step,
            {
                **{f"losses/{k}": v for k, v in metrics.items()},
                **self.tracker.metrics(),
                "charts/SPS": self.elapsed_rate(),
                "perf/learner_sps": self.steps_per_update / max(learn_s, 1e-9),
                "perf/policy_lag": sum(lags) / len(lags),
                "perf/queue_wait_ms": stats.get("queue_wait_ms", 0.0),
                "perf/actor_restarts": stats.get("restarts", 0.0),
                "perf/dropped_rollouts": self.dropped.value + stats.get("dropped", 0.0),
                "perf/env_ms": stats.get("env_ms", 0.0),
                "perf/act_ms": stats.get("act_ms", 0.0),
                "perf/learn_ms": 1e3 * learn_s,
            },
        )
        logger.log_histogram(step, "perf/policy_lag", torch.tensor(lags))
        for name, values in self.learner.distributions.items():  # e.g. ponder steps per token
            logger.log_histogram(step, f"charts/{name}", values)

    def payload(self) -> dict[str, Any]:
        """Weights, learner, RNG states and the trainer state, as a checkpoint holds them."""
        extra = self.state.state_dict()
        return self.run.payload(self.progress, self.agent, self.learner, self.spaces, extra)

    def restored(self, payload: dict[str, Any]) -> None:
        """The actors act with the restored weights; in-process envs start afresh."""
        self.pool.publish(self.agent.state_dict(), self.state.update)
        if self.local:
            self.pool.restart_envs(self.plan.run.seed + self.state.update + self.seed_offset)
            for scaler in self.scalers or ():
                scaler.returns.zero_()

    def long_update_due(self) -> bool:
        """The next update evaluates."""
        return self.evaluation.due(self.state.update + 1)

    def checkpoint(self, done: bool, stopping: bool) -> None:
        """Every ``checkpoint_every`` updates, at the end and when stopping (all ranks)."""
        settings, state = self.plan.run, self.state
        if not (stopping or done or state.update % settings.checkpoint_every == 0):
            return
        self.run.save_payload(self.progress, self.payload())
        if self.local:
            # Every env starts afresh after a checkpoint, as in a run resumed from it, so an
            # interrupted run continues exactly as this one does. Actors in other processes
            # run asynchronously (no resume repeats them exactly), so there episodes go on:
            # cutting them every checkpoint_every updates of one rollout would cap long
            # episodes (CartPole's 500 steps).
            self.pool.restart_envs(settings.seed + state.update + self.seed_offset)
            for scaler in self.scalers or ():  # running returns belong to the cut episodes
                scaler.returns.zero_()

    def close(self, status: str) -> None:
        """Stop the actors (as at a normal finish), close the envs (after a signal, without
        awaiting a call to them the signal may have cut short)."""
        cut_short = status == "interrupted"
        if hasattr(self, "pool"):
            self.pool.close(cut_short)
        else:  # build stopped before the pool took the envs over
            for envs in getattr(self, "envs", ()):
                close_envs(envs, cut_short=cut_short)
        if hasattr(self, "evaluation"):
            self.evaluation.close(cut_short)
        if status == "interrupted":  # torchrun stops every process once one exits: rank 0
            distributed.barrier()  # has written its checkpoint and closed before any exits

    def summary(self, status: str) -> dict[str, Any]:
        """The online summary, with the rollouts dropped as too stale."""
        return {**super().summary(status), "dropped_rollouts": self.dropped.value}


def train_impala(plan: RunPlan, callbacks: Callbacks | None = None) -> dict[str, Any]:
    """Train for ``total_steps`` env steps (steps trained on); returns the final summary."""
    return ImpalaTrainer(plan, callbacks).train()
