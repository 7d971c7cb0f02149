"""PPO (Schulman et al. 2017) with GAE on a vector env, for any memory agent.

One update reads top to bottom like a CleanRL script, on the trainers' shared skeleton
(:class:`rltrans.trainers.skeleton.Trainer`: run folder, loop, checkpoint, stop, summary):

    collect T steps of N envs (the actor) -> advantages -> update (the learner) -> log
    -> evaluate (every algo.eval_every updates) -> checkpoint (every checkpoint_every
    updates, and at once on SIGINT / SIGTERM or a callback's False, which then stop the run)

The pieces live in modules: envs (:func:`rltrans.envs.make_env`), agents
(:mod:`rltrans.registry`), the actor (:mod:`rltrans.runtime.actors`), the rollout buffer, the
learner and the periodic evaluation (:class:`rltrans.trainers.common.PeriodicEvaluation`).
"""

from __future__ import annotations

import time
from typing import Any

from rltrans.accel.run_speed import ACTING, LEARNER, RunSpeed
from rltrans.buffers.rollout import RolloutBuffer
from rltrans.config.plan import RunPlan
from rltrans.envs import make_env
from rltrans.envs.gym_vec import close_envs
from rltrans.learners import PPOLearner
from rltrans.run.context import Run
from rltrans.run.logging import EpisodeTracker
from rltrans.runtime.actors import LocalActor, RewardScaler
from rltrans.trainers.common import (
    Callbacks,
    TrainerState,
    run_name,
)
from rltrans.trainers.skeleton import OnlineTrainer


class PPOTrainer(OnlineTrainer):
    """PPO on the skeleton of :class:`rltrans.trainers.skeleton.Trainer`."""

    def name(self) -> str:
        """<env>-<backbone>."""
        return run_name(self.plan)

    def build(self, run: Run) -> None:
        """Env, agent, learner, buffer, actor and the resumed state."""
        settings, device, algo = self.plan.run, run.device, self.plan.algo
        with run.building("env"):
            self.envs = envs = make_env(self.plan.env.to_dict(), seed=settings.seed, device=device)
        self.build_agent(run, (envs.single_observation_space, envs.single_action_space))
        agent = self.agent
        self.steps_per_update = algo.num_steps * envs.num_envs
        updates = run.whole_updates(self.steps_per_update, "algo.num_steps x env.num_envs")
        self.total = updates * self.steps_per_update
        self.speed = speed = RunSpeed(
            self.plan.speed, device, updates, calls=(LEARNER, ACTING), streams_for=agent
        )
        self.build_learner(PPOLearner, updates, speed.accel)
        self.progress = run.resume(agent, self.learner, self.spaces)
        self.buffer = RolloutBuffer(algo.num_steps, envs.num_envs, algo.segment_length, device)
        scaler = RewardScaler(envs.num_envs, algo.gamma, device) if algo.reward_scaling else None
        self.tracker = EpisodeTracker(window=100)
        self.state = TrainerState(episodes=self.tracker, reward_scaler=scaler, **speed.parts())
        self.state.load_state_dict(run.resumed_payload or {}, source=run.resumed_source)
        speed.start(updates - self.state.update)
        with run.building("env"):  # rollout=device refused for an env that is not torch-native
            rollout = speed.device_rollout(envs)
        self.actor = LocalActor(
            envs,
            agent,
            seed=settings.seed + self.state.update,
            device=device,
            reward_scaler=scaler,
            rollout=rollout,
        )
        speed.act_through(self.actor, agent)
        self.actor.set_policy_version(self.state.update)

    def update(self) -> None:
        """Collect a rollout, compute advantages, update, log, evaluate where due."""
        algo, buffer, actor, state = self.plan.algo, self.buffer, self.actor, self.state
        actor.collect(buffer, on_info=self.tracker.update)
        buffer.compute_advantages(actor.bootstrap_value(), algo.gamma, algo.gae_lambda)
        t_learn = time.perf_counter()
        metrics = self.learner.update(buffer)
        self.agent.update_obs_norm(buffer.obs)  # after the update: acting == replay
        learn_s = time.perf_counter() - t_learn
        self.progress += self.steps_per_update
        state.update += 1
        actor.set_policy_version(state.update)
        timings = actor.pop_timings()
        self.speed.after_update(learn_s + timings["act"])
        logger = self.logger
        logger.log(
            self.progress,
            {
                **{f"losses/{k}": v for k, v in metrics.items()},
                **self.tracker.metrics(),
                "charts/SPS": self.elapsed_rate(),
                "perf/env_ms": 1e3 * timings["env"],
                "perf/act_ms": 1e3 * timings["act"],
                "perf/learn_ms": 1e3 * learn_s,
            },
        )
        for name, values in self.learner.distributions.items():  # e.g. ponder steps per token
            logger.log_histogram(self.progress, f"charts/{name}", values)
        self.evaluation.after_update(state.update, self.progress, logger)
        if self.bar is not None:
            self.bar.update(self.steps_per_update, ret=self.tracker.mean_return)

    def payload(self) -> dict[str, Any]:
        """Weights, learner, RNG states and the trainer state, as a checkpoint holds them."""
        extra = self.state.state_dict()
        return self.run.payload(self.progress, self.agent, self.learner, self.spaces, extra)

    def restored(self, payload: dict[str, Any]) -> None:
        """Every env starts afresh, as after a checkpoint."""
        self.actor.restart(seed=self.plan.run.seed + self.state.update)
        self.actor.set_policy_version(self.state.update)

    def long_update_due(self) -> bool:
        """The next update evaluates."""
        return self.evaluation.due(self.state.update + 1)

    def checkpoint(self, done: bool, stopping: bool) -> None:
        """Every ``checkpoint_every`` updates, at the end and when stopping."""
        settings, state = self.plan.run, self.state
        if stopping or done or state.update % settings.checkpoint_every == 0:
            self.run.save_payload(self.progress, self.payload())
            # Every env starts afresh after a checkpoint, as in a run resumed from it, so an
            # interrupted run continues exactly as this one does.
            self.actor.restart(seed=settings.seed + state.update)

    def close(self, status: str) -> None:
        """Close the training and evaluation envs (after a signal, their async workers are
        terminated, not awaited: the signal may have cut a call to them short)."""
        cut_short = status == "interrupted"
        if hasattr(self, "envs"):
            close_envs(self.envs, cut_short=cut_short)
        if hasattr(self, "evaluation"):
            self.evaluation.close(cut_short)


def train_ppo(plan: RunPlan, callbacks: Callbacks | None = None) -> dict[str, Any]:
    """Train for ``total_steps`` env steps; returns the final summary."""
    return PPOTrainer(plan, callbacks).train()
