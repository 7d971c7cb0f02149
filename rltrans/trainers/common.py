"""What the three trainers share: the run's name, the state they checkpoint besides weights
and optimizer, the speed choices (threads, compile), the logger and progress bar, and the
online trainers' periodic evaluation."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig

from rltrans.accel import (
    COMPILE_SECONDS,
    Accel,
    AutoCompile,
    CompileOverBudget,
    compile_choice,
    deadline,
    thread_tuners,
    workload_key,
)
from rltrans.config import to_container
from rltrans.config.plan import RunPlan
from rltrans.config.run_settings import RunSettings
from rltrans.envs import make_env
from rltrans.learners.settings import ImpalaConfig, PPOConfig
from rltrans.run.context import restoring
from rltrans.run.logging import MetricLogger
from rltrans.run.progress import ProgressBar
from rltrans.runtime.evaluation import episode_metrics, evaluate_episodes, isolated_rng
from rltrans.trainers.stop import StopSignals

# Evaluation envs are seeded cfg.seed + this: their own env objects, apart from training's.
EVAL_SEED_OFFSET = 10_000
# The periodic evaluation's metrics as the summary line names them.
SUMMARY_KEYS = {
    "eval/episodic_return": "eval_return",
    "eval/episodic_length": "eval_length",
    "eval/success_rate": "eval_success_rate",
}


MetricsHook = Callable[[int, dict[str, float]], "bool | None"]


@dataclass(frozen=True)
class Callbacks:
    """A Python caller's hooks into training (:func:`rltrans.learn`).

    ``on_log(step, metrics)`` gets every update's logged metrics (``losses/...``,
    ``charts/...``, ``perf/...``) and ``on_eval(step, metrics)`` each periodic evaluation's
    (``eval/episodic_return``, ...), as TensorBoard gets them. Either may return False to stop
    the run after the current update: it checkpoints as on SIGTERM and its summary's status
    is ``stopped_early``.
    """

    on_log: MetricsHook | None = None
    on_eval: MetricsHook | None = None

    def attach(self, logger: MetricLogger, stop: StopSignals) -> None:
        """Call the hooks from ``logger``'s writes; a False answer asks ``stop`` to stop."""
        if self.on_log is None and self.on_eval is None:
            return

        def listen(step: int, metrics: dict[str, float]) -> None:
            evaluation = any(name.startswith("eval/") for name in metrics)
            hook = self.on_eval if evaluation else self.on_log
            if hook is not None and hook(step, metrics) is False:
                stop.request(f"{'on_eval' if evaluation else 'on_log'} returned False")

        logger.listeners.append(listen)


def run_name(cfg: DictConfig) -> str:
    """<env>-<backbone>, the default run folder name."""
    env_name = cfg.env.get("name") or str(cfg.env.get("id", "env")).replace("/", "_")
    return f"{env_name}-{cfg.agent.get('backbone', cfg.agent.kind)}".replace(":", "_")


class Tuners(dict):
    """``torch_threads=auto``'s tuners by kind of call, checkpointed as one entry."""

    def state_dict(self) -> dict[str, Any]:
        """Each tuner's choice."""
        return {name: t.state_dict() for name, t in self.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the choices of the tuners this run has."""
        for name, saved in state.items():
            if name in self:
                self[name].load_state_dict(saved)


class Choice:
    """``compile=auto``'s chooser (or none), checkpointed as its choice."""

    def __init__(self, chooser: AutoCompile | None) -> None:
        self.chooser = chooser

    def after_update(self, seconds: float) -> None:
        """Account one update whose compilable work took ``seconds``."""
        if self.chooser is not None:
            self.chooser.after_update(seconds)

    def state_dict(self) -> str | None:
        """``compiled`` / ``eager`` once decided, else None."""
        return self.chooser.choice if self.chooser is not None else None

    def load_state_dict(self, choice: str | None) -> None:
        """Apply a saved choice without measuring again."""
        if self.chooser is not None:
            self.chooser.restore(choice)

    def set_updates_left(self, count: int) -> None:
        """How many updates the run has left (what compiling would save over)."""
        if self.chooser is not None:
            self.chooser.updates_left = count

    def compile_due(self) -> bool:
        """Whether the next update compiles, under a deadline (:meth:`bounded`)."""
        return self.chooser is not None and self.chooser.compile_due()

    def bounded(self) -> contextlib.AbstractContextManager[None]:
        """The deadline of an update that compiles (:class:`CompileOverBudget` past it);
        any other update runs unbounded."""
        budget = self.chooser.budget_s if self.compile_due() else None
        return deadline(budget, lambda: CompileOverBudget(budget))

    def over_budget(self, err: CompileOverBudget) -> None:
        """The compiling update was dropped: eager from now on."""
        if self.chooser is not None:
            self.chooser.over_budget(err)


class TrainerState:
    """The counters and statistics a trainer checkpoints besides weights and optimizer: the
    update counter and named parts, each with ``state_dict`` / ``load_state_dict`` (episode
    window, reward scalers, thread and compile choices, ...).

    >>> state = TrainerState(episodes=tracker, threads=tuners)  # doctest: +SKIP
    >>> run.save(step, agent, learner, spaces, extra=state.state_dict())  # doctest: +SKIP
    """

    def __init__(self, **parts: Any) -> None:
        self.update = 0
        self.parts = {name: part for name, part in parts.items() if part is not None}

    def state_dict(self) -> dict[str, Any]:
        """The update counter and every part's state, by name."""
        return {"update": self.update, **{k: p.state_dict() for k, p in self.parts.items()}}

    def load_state_dict(self, saved: dict[str, Any], source: str = "the checkpoint") -> None:
        """Restore :meth:`state_dict`'s entries (parts a checkpoint lacks keep theirs); an
        entry that does not load is one CheckpointError naming ``source``."""
        with restoring(source):
            self.update = int(saved.get("update", 0))
            for name, part in self.parts.items():
                if saved.get(name) is not None:
                    part.load_state_dict(saved[name])


def speed(
    plan: RunPlan,
    accel: Accel,
    device: torch.device,
    updates_left: int,
    *names: str,
    streams: tuple[str, ...] = (),
    measure: int = 2,
) -> tuple[Tuners, Choice]:
    """The run's thread tuners (``torch_threads``; the learner's is handed to ``accel``) and
    its compile choice (``compile``), to be restored from a checkpoint by a TrainerState."""
    cfg, run = plan.config, plan.run
    tuners = Tuners(thread_tuners(run.torch_threads, device, None, *names, streams=streams))
    accel.threads = tuners.get("learner step")
    chunks = unrolled_chunks(cfg)
    seconds = COMPILE_SECONDS if chunks == 1 else CHUNK_COMPILE_SECONDS * chunks
    # What the compiled programs depend on: a later run of the same workload on this machine
    # reuses compile=auto's decision (the budget and seeds do not change the programs).
    sections = {k: to_container(cfg[k]) for k in ("agent", "algo", "env") if k in cfg}
    sections["dataset"] = run.dataset
    sections["algo"] = {k: v for k, v in sections.get("algo", {}).items() if "eval" not in k}
    key = workload_key(sections, str(device), run.torch_threads, run.rollout)
    choice = compile_choice(
        run.compile, accel, updates_left, measure=measure, compile_seconds=seconds, key=key
    )
    return tuners, Choice(choice)


CHUNK_COMPILE_SECONDS = 120.0  # per unrolled chunk: 8 chunks had not compiled after 7 minutes


def unrolled_chunks(cfg: DictConfig) -> int:
    """How many chunks a compiled training step unrolls (``agent.chunk`` within
    ``algo.segment_length``; 1 without); compile=auto expects ``CHUNK_COMPILE_SECONDS`` of
    compilation for each (8 chunks of 64 steps had not finished after 7 minutes on one
    core, with two other runs on the machine)."""
    chunk, length = cfg.agent.get("chunk"), cfg.algo.get("segment_length")
    if not chunk or not length:
        return 1
    return max(1, -(-int(length) // int(chunk)))


def logger_and_bar(
    settings: RunSettings, run: Any, step: int, total: int, unit: str, *, main: bool = True
) -> tuple[MetricLogger, ProgressBar | None]:
    """The TensorBoard logger (events after the checkpoint of an interrupted process hidden)
    and the progress bar (``progress=true``) of a run at ``step`` of ``total``. A resumed
    run, its saved state restored, first says on stderr where it continues."""
    if settings.resume and main:
        print(
            f"resuming {run.dir} at {unit} {step:,} of {total:,} ({run.latest_checkpoint()})",
            file=sys.stderr,
        )
    purge = step + 1 if settings.resume else None  # events AT its step were logged before it
    tensorboard = settings.tensorboard and main
    dir_fd = getattr(run, "dir_fd", None)  # the run folder's descriptor: tb/ is reached by it
    logger = MetricLogger(run.dir, use_tensorboard=tensorboard, purge_step=purge, dir_fd=dir_fd)
    bar = ProgressBar(total, "train", unit, initial=step) if settings.progress and main else None
    return logger, bar


class PeriodicEvaluation:
    """``algo.eval_every`` / ``algo.eval_episodes`` of online training (PPO, IMPALA's learner).

    Every ``eval_every`` updates the learner's agent plays ``eval_episodes`` episodes with its
    mode action on an env of its own: the run's env config with ``training=False`` (no
    episodic life, no reward clipping) and ``min(eval_episodes, env.num_envs)`` envs, reset
    with seed ``seed + EVAL_SEED_OFFSET`` each time. Every evaluation so plays the same
    starts, which ``python -m rltrans.evaluate seed=<that> num_envs=<those>`` plays for the
    checkpoint of that update. It runs in :func:`isolated_rng`: a run trains the same with
    or without it. Logged as ``eval/episodic_return``, ``eval/episodic_length`` and (envs
    that report ``info["success"]``) ``eval/success_rate``.

    >>> evaluation = PeriodicEvaluation(plan, agent, device)  # doctest: +SKIP
    >>> evaluation.after_update(update, global_step, logger)  # every update  # doctest: +SKIP
    """

    def __init__(
        self,
        plan: RunPlan,
        agent: torch.nn.Module,
        device: torch.device,
        *,
        main: bool = True,
    ) -> None:
        algo: PPOConfig | ImpalaConfig = plan.algo  # type: ignore[assignment]
        self.every, self.episodes = algo.eval_every, algo.eval_episodes  # updates; 0 = never
        self.agent, self.device, self.seed = agent, device, plan.run.seed + EVAL_SEED_OFFSET
        env = plan.config.env
        self.envs = None
        self.last: dict[str, float] = {}
        if main and self.every > 0 and self.episodes > 0:  # under torchrun: rank 0 alone
            env_cfg = {**to_container(env), "num_envs": min(self.episodes, env.num_envs)}
            with isolated_rng(device):  # an env may draw from the global generators as built
                self.envs = make_env(env_cfg, seed=self.seed, device=device, training=False)

    def due(self, update: int) -> bool:
        """Whether update number ``update`` ends with an evaluation."""
        return self.envs is not None and update % self.every == 0

    def after_update(self, update: int, step: int, logger: MetricLogger) -> None:
        """Evaluate and log at ``step`` when ``update`` is a multiple of ``eval_every``."""
        if not self.due(update):
            return
        with isolated_rng(self.device):
            episodes = evaluate_episodes(
                self.agent, self.envs, self.episodes, seed=self.seed, device=self.device
            )  # deterministic: the mode action
        self.last = episode_metrics(episodes)
        logger.log(step, self.last)

    def summary(self) -> dict[str, float]:
        """The last evaluation for the summary line: ``eval_return``, ``eval_length`` and
        ``eval_success_rate`` (where reported); empty before the first."""
        return {SUMMARY_KEYS[tag]: value for tag, value in self.last.items()}

    def close(self) -> None:
        """Close the evaluation env."""
        if self.envs is not None:
            self.envs.close()
            self.envs = None


__all__ = [
    "EVAL_SEED_OFFSET",
    "Callbacks",
    "Choice",
    "CompileOverBudget",
    "PeriodicEvaluation",
    "TrainerState",
    "Tuners",
    "logger_and_bar",
    "run_name",
    "speed",
]
