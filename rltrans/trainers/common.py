"""What the three trainers share: the run's name, the state they checkpoint besides weights
and optimizer, the plan's speed settings, the logger and progress bar, and the
online trainers' periodic evaluation."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rltrans.accel.auto import CompileOverBudget
from rltrans.config.plan import RunPlan
from rltrans.config.run_settings import RunSettings
from rltrans.envs import make_env
from rltrans.envs.gym_vec import close_envs
from rltrans.learners.settings import ImpalaConfig, PPOConfig
from rltrans.run.context import restoring
from rltrans.run.logging import MetricLogger
from rltrans.run.progress import ProgressBar
from rltrans.runtime.evaluation import episode_metrics, evaluate_episodes, isolated_rng
from rltrans.trainers.stop import StopSignals

# Evaluation envs are seeded seed + this: their own env objects, apart from training's.
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


def run_name(plan: RunPlan) -> str:
    """<env>-<backbone>, the default run folder name."""
    return f"{plan.env.label}-{plan.agent.label}".replace(":", "_")


class TrainerState:
    """The counters and statistics a trainer checkpoints besides weights and optimizer: the
    update counter and named parts, each with ``state_dict`` / ``load_state_dict`` (episode
    window, reward scalers, thread and compile choices, ...).

    >>> state = TrainerState(episodes=tracker, **speed.parts())  # doctest: +SKIP
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
        env = plan.env
        self.envs = None
        self.last: dict[str, float] = {}
        if main and self.every > 0 and self.episodes > 0:  # under torchrun: rank 0 alone
            env_cfg = env.to_dict(num_envs=min(self.episodes, env.num_envs))
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

    def close(self, cut_short: bool = False) -> None:
        """Close the evaluation env; ``cut_short`` (after a signal, which may have stopped an
        evaluation mid-step): without awaiting its async workers."""
        if self.envs is not None:
            close_envs(self.envs, cut_short=cut_short)
            self.envs = None


__all__ = [
    "EVAL_SEED_OFFSET",
    "Callbacks",
    "CompileOverBudget",
    "PeriodicEvaluation",
    "TrainerState",
    "logger_and_bar",
    "run_name",
]
