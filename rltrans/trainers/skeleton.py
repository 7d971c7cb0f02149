"""The one skeleton of the three trainers: open the run, build, loop, checkpoint, stop,
summarise, tear down. PPO, IMPALA and offline training each fill in only what is theirs.

    run = Run.start(plan)               the folder, its lock, device, threads, seeds
    build()                             envs or dataset, agent, learner, resumed state
    logger, bar, signals, callbacks; begin()
    while not finished():
        update()                        one update: collect / sample, learn, log, evaluate
        stopping = a signal or a callback's False (every learner process agrees)
        checkpoint(done, stopping)      on the trainer's cadence, and always when stopping
        if stopping: report it, stop
    NonFiniteLossError -> status "stopped", the run says why
    teardown: bar, logger, the trainer's envs / actors, the run folder, the signals
    summary(status)                     the JSON line the command prints

A failure anywhere after the run folder is open still releases it (and its lock), so a
Python caller can start another run in the same process.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from rltrans.accel import Accel
from rltrans.config import to_container
from rltrans.config.plan import RunPlan
from rltrans.config.resources import check_resources
from rltrans.fsutil import StorageError
from rltrans.learners import NonFiniteLossError
from rltrans.logging import MetricLogger
from rltrans.progress import ProgressBar
from rltrans.registry import algo_agent_options, build_agent
from rltrans.run import Run
from rltrans.trainers.common import Callbacks, PeriodicEvaluation, logger_and_bar
from rltrans.trainers.horizon import report_horizon
from rltrans.trainers.stop import StopSignals


class Trainer:
    """A training run of one plan; :meth:`train` runs the skeleton above.

    Subclasses set :attr:`unit` (what the progress counts) and fill in :meth:`name`,
    :meth:`build`, :meth:`update`, :meth:`checkpoint`, :meth:`close` and :meth:`summary`;
    :attr:`progress` and :attr:`total` are in units of :attr:`unit`.
    """

    unit = "step"
    multi_process = False  # whether learner processes under torchrun may share the run

    def __init__(self, plan: RunPlan, callbacks: Callbacks | None = None) -> None:
        self.plan, self.callbacks = plan, callbacks or Callbacks()
        self.progress = 0  # env steps or gradient steps done, resumed ones included
        self.total = 0  # where the run ends
        self.bar: ProgressBar | None = None
        self.start_time, self.start_progress = time.perf_counter(), 0

    # ------------------------------------------------------------------ what a trainer fills in

    def name(self) -> str:
        """The default run folder's name."""
        raise NotImplementedError

    def build(self, run: Run) -> None:
        """Build what the run trains and set :attr:`progress` (resumed) and :attr:`total`."""
        raise NotImplementedError

    def update(self) -> None:
        """One update: advance :attr:`progress`, log it, evaluate where due."""
        raise NotImplementedError

    def checkpoint(self, done: bool, stopping: bool) -> None:
        """Save where the trainer's cadence says, and always when ``done`` or ``stopping``."""
        raise NotImplementedError

    def begin(self) -> None:
        """Called once before the loop, with the logger in place."""

    def close(self, status: str) -> None:
        """Close what :meth:`build` opened (envs, actors) however the run ends, also after
        :meth:`build` failed halfway (close only what exists)."""

    def summary(self, status: str) -> dict[str, Any]:
        """The summary line's fields (the stop's own are added)."""
        raise NotImplementedError

    def is_main(self) -> bool:
        """Whether this process reports (rank 0 under torchrun)."""
        return True

    # --------------------------------------------------------------------------- the skeleton

    def finished(self) -> bool:
        """Whether the run has reached its total."""
        return self.progress >= self.total

    def elapsed_rate(self) -> float:
        """Units per second since this process started training."""
        return (self.progress - self.start_progress) / max(
            1e-9, time.perf_counter() - self.start_time
        )

    def train(self) -> dict[str, Any]:
        """Run the plan to its end, a stop or a non-finite loss; returns the summary."""
        run = self.run = Run.start(
            self.plan.config, name=self.name(), multi_process=self.multi_process
        )
        report_horizon(self.plan.horizon_note)  # what agent.horizon fitted
        status, stop, failing = "finished", StopSignals(), True
        self.logger: MetricLogger | None = None
        try:
            self.build(run)
            self.logger, self.bar = logger_and_bar(
                run.cfg, run, self.progress, self.total, self.unit, main=self.is_main()
            )
            stop.install()  # SIGINT / SIGTERM: finish the update, checkpoint, stop
            self.callbacks.attach(self.logger, stop)  # rltrans.learn's on_log / on_eval
            self.start_time, self.start_progress = time.perf_counter(), self.progress
            self.begin()
            status = self._loop(stop)
            failing = False
        except NonFiniteLossError as err:
            status, failing = "stopped", False
            run.stop_message(self.progress, err)
        except StorageError as err:  # a full disk mid-run: one line, the checkpoint to go on from
            raise run.storage_stop(self.progress, err) from None
        finally:
            if self.bar is not None:
                self.bar.close()
            if self.logger is not None:
                # A full disk that stopped the run fails the events' last flush too: the
                # error that stopped it (naming the intact checkpoint) is the one reported.
                with contextlib.suppress(StorageError) if failing else contextlib.nullcontext():
                    self.logger.close()
            self.close(status)  # what build() opened, also after it failed halfway
            run.close()
            stop.restore()
        return {**self.summary(status), **stop.summary(status)}

    def _loop(self, stop: StopSignals) -> str:
        while not self.finished():
            self.update()
            done = self.finished()
            stopping = stop.poll() and not done  # a signal or a callback: checkpoint, stop
            self.checkpoint(done, stopping)
            if stopping:
                if self.is_main():
                    stop.report(self.progress, self.run.latest_checkpoint(), self.run.dir)
                return stop.status  # interrupted (a signal) or stopped_early
        return "finished"


class OnlineTrainer(Trainer):
    """What PPO and IMPALA's learner share: the agent built for the env's spaces, its
    periodic evaluation, the learner's settings and the summary of the episode window. A
    subclass sets ``tracker`` (an EpisodeTracker) and ``state`` (a TrainerState) in build."""

    def build_agent(self, run: Run, spaces: tuple[Any, Any]) -> None:
        """``agent`` for ``spaces`` on the run's device, and its ``evaluation``."""
        cfg = run.cfg
        self.spaces = spaces
        with run.building("agent"):
            check_resources(cfg, spaces=spaces)  # the heads and encoders the spaces size
            agent_cfg = to_container(cfg.agent)
            options = algo_agent_options(agent_cfg, to_container(cfg.algo))  # e.g. recon. loss
            self.agent = build_agent(agent_cfg, *spaces, **options).to(run.device)
        with run.building("env"):  # algo.eval_every (0: none); under torchrun rank 0's
            self.evaluation = PeriodicEvaluation(cfg, self.agent, run.device, main=self.is_main())

    def build_learner(self, learner: type, updates: int, accel: Accel) -> None:
        """``learner`` (PPOLearner, ImpalaLearner) over ``updates`` updates, taking the plan's
        typed ``algo`` settings whole."""
        self.learner = learner(self.agent, self.plan.algo, total_updates=updates, accel=accel)

    def summary(self, status: str) -> dict[str, Any]:
        """status, steps, updates, the episode window's means, SPS, checkpoint, evaluation."""
        tracker = self.tracker
        return {
            "status": status,
            "run_dir": str(self.run.dir),
            "global_step": self.progress,
            "updates": self.state.update,
            "episodic_return": tracker.mean_return,
            "episodic_length": tracker.mean_length,
            "success_rate": tracker.success_rate,
            "episodes": tracker.episodes_seen,
            "SPS": self.elapsed_rate(),
            "checkpoint": self.run.latest_checkpoint(),
            **self.evaluation.summary(),
        }


__all__ = ["OnlineTrainer", "Trainer"]
