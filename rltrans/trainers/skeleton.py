"""The one skeleton of the three trainers: open the run, build, loop, checkpoint, stop,
summarise, tear down. PPO, IMPALA and offline training each fill in only what is theirs.

    run = Run.start(plan)               the folder, its lock, device, threads, seeds
    build()                             envs or dataset, agent, learner, resumed state
    logger, bar, signals, callbacks; begin()
    while not finished():
        copy = payload()                before an update that may be long (see below)
        update()                        one update: collect / sample, learn, log, evaluate
          a signal during it            -> the update dropped, the copy saved, stop
          a compile over its budget     -> the update dropped, the copy restored, eager
        stopping = a signal or a callback's False (every learner process agrees)
        checkpoint(done, stopping)      on the trainer's cadence, and always when stopping
        if stopping: report it, stop
    NonFiniteLossError -> status "stopped", the run says why

Before an update the trainer copies its checkpoint payload wherever that is cheap
(:func:`copy_due`): the cheapest copy so far cost at most :data:`COPY_SHARE` of the last
update, or the last update took :data:`LONG_UPDATE_S` or more, or it is the first, or it
evaluates or compiles (:meth:`Trainer.long_update_due`); a copy dearer than that is still
made every so many updates, so that copies cost COPY_SHARE of the time on average. So a
Ctrl-C is answered within seconds wherever the update is; only an update too quick to be
worth a copy (a DT gradient step) runs to its end first.
    teardown: bar, logger, the trainer's envs / actors, the run folder, the signals
    summary(status)                     the JSON line the command prints

A failure anywhere after the run folder is open still releases it (and its lock), so a
Python caller can start another run in the same process.
"""

from __future__ import annotations

import contextlib
import copy
import math
import sys
import time
from typing import Any

import torch

from rltrans.accel import Accel
from rltrans.config.frozen import thaw
from rltrans.config.plan import RunPlan
from rltrans.config.resources import check_resources
from rltrans.fsutil import StorageError
from rltrans.learners import NonFiniteLossError
from rltrans.registry import algo_agent_options, build_agent
from rltrans.run.context import Run
from rltrans.run.logging import MetricLogger
from rltrans.run.progress import ProgressBar
from rltrans.run.saved_state import restore_payload
from rltrans.trainers.common import Callbacks, CompileOverBudget, PeriodicEvaluation, logger_and_bar
from rltrans.trainers.stop import StopNow, StopSignals

# The state is copied before an update, so that a stop signal can drop the update, where
# the last update took this long or longer (a copy costs milliseconds, under 1 % of it) or
# where the cheapest copy so far cost at most COPY_SHARE of the last update.
LONG_UPDATE_S = 1.0
COPY_SHARE = 0.01


def copy_due(last_s: float | None, cheapest_s: float | None, since: int) -> bool:
    """Whether to copy the state before the next update, given the last update's seconds,
    the cheapest copy's seconds so far (the least disturbed by other work on the machine)
    and the updates since the last copy. A copy dearer than COPY_SHARE of an update is made
    once every ``ceil(share / COPY_SHARE)`` updates: copies cost COPY_SHARE on average and
    the cheapest copy is measured again."""
    if last_s is None or cheapest_s is None or last_s >= LONG_UPDATE_S:
        return True
    share = cheapest_s / max(last_s, 1e-9)
    return share <= COPY_SHARE or since >= math.ceil(share / COPY_SHARE)


STATIC_PAYLOAD = ("config", "observation_space", "action_space")  # fixed for a whole run


def copied(value: Any) -> Any:
    """A copy of checkpoint data that shares nothing mutable with it: tensors cloned into host
    memory (a copy on the GPU would double the weights and moments there), dicts, lists and
    tuples rebuilt, anything else deep-copied (a faster deepcopy for state dicts of many small
    tensors). Loading it back moves each tensor to its parameter's device."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: copied(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(copied(v) for v in value)
    return copy.deepcopy(value)


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

    def payload(self) -> dict[str, Any]:
        """The checkpoint of the state now (:meth:`rltrans.run.context.Run.payload`'s dict)."""
        raise NotImplementedError

    def restored(self, payload: dict[str, Any]) -> None:
        """After :meth:`restore` loaded an earlier ``payload``: what else the trainer resets
        (its envs start afresh, as after a checkpoint)."""

    def long_update_due(self) -> bool:
        """Whether the next update does more than usual (an evaluation)."""
        return False

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
        run = self.run = Run.start(self.plan, name=self.name(), multi_process=self.multi_process)
        if self.plan.horizon_note is not None and run.world.is_main:
            print(self.plan.horizon_note, file=sys.stderr, flush=True)  # agent.horizon's fit
        status, stop, failing = "finished", StopSignals(), True
        self.logger: MetricLogger | None = None
        try:
            self.build(run)
            self.logger, self.bar = logger_and_bar(
                self.plan.run, run, self.progress, self.total, self.unit, main=self.is_main()
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

    def restore(self, payload: dict[str, Any]) -> None:
        """Go back to the state of an earlier :meth:`payload`: weights, learner, RNG states,
        progress and the trainer's own state."""
        self.progress = restore_payload(payload, self.agent, self.learner)
        self.state.load_state_dict(payload)
        self.restored(payload)

    def _copy_due(self, last_s: float | None, cheapest_s: float | None, since: int) -> bool:
        """Whether to copy the state before the next update (see the module's docstring)."""
        if self.run.world.distributed:
            return False  # under torchrun no update is dropped: the signal waits for its end
        speed = getattr(self, "speed", None)
        compiling = speed is not None and speed.compile_due()
        return copy_due(last_s, cheapest_s, since) or compiling or self.long_update_due()

    def _compile_budget(self, copied: bool) -> contextlib.AbstractContextManager[None]:
        """compile=auto's deadline on an update that compiles (only one copied before it can
        be dropped)."""
        speed = getattr(self, "speed", None)
        return speed.bounded() if copied and speed is not None else contextlib.nullcontext()

    def _loop(self, stop: StopSignals) -> str:
        last_s: float | None = None  # how long the last update took
        cheapest_s: float | None = None  # the cheapest copy of the state so far
        since = 0  # updates since the last copy
        if not self.finished():
            self.payload()  # its parts made once (the config, the spaces): not a copy's cost
        stop.where = lambda: f"; checkpoint {self.run.latest_checkpoint()} is kept"
        while not self.finished():
            start = time.perf_counter()
            saved = None
            since += 1
            if self._copy_due(last_s, cheapest_s, since):
                saved = {  # what the run never changes is shared, the rest copied
                    k: v if k in STATIC_PAYLOAD else copied(v) for k, v in self.payload().items()
                }
                copy_s = time.perf_counter() - start
                cheapest_s = copy_s if cheapest_s is None else min(cheapest_s, copy_s)
                since, start = 0, time.perf_counter()
            try:
                with stop.abortable(saved is not None), self._compile_budget(saved is not None):
                    self.update()
            except StopNow:
                stop.dropped()
                self.run.save_payload(saved["global_step"], saved)
                self.progress = saved["global_step"]
                self.state.load_state_dict(saved)  # the summary's counters: those saved
                if self.is_main():
                    where = self.run.latest_checkpoint()
                    stop.report(self.progress, where, self.run.dir, dropped=True)
                return stop.status
            except CompileOverBudget as over:
                self.restore(saved)
                self.speed.over_budget(over)  # eager from now on, remembered for this workload
                last_s = None
                continue
            last_s = time.perf_counter() - start
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
        config = self.plan.config
        self.spaces = spaces
        with run.building("agent"):
            check_resources(config, spaces=spaces)  # the heads and encoders the spaces size
            agent_cfg = self.plan.agent.to_dict()
            options = algo_agent_options(agent_cfg, thaw(config.algo))  # e.g. recon. loss
            self.agent = build_agent(agent_cfg, *spaces, **options).to(run.device)
        with run.building("env"):  # algo.eval_every (0: none); under torchrun rank 0's
            self.evaluation = PeriodicEvaluation(
                self.plan, self.agent, run.device, main=self.is_main()
            )

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
