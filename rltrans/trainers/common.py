"""What the three trainers share: the run's name, the state they checkpoint besides weights
and optimizer, the speed choices (threads, compile) and the logger and progress bar."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig

from rltrans.accel import Accel, AutoCompile, compile_choice, thread_tuners
from rltrans.logging import MetricLogger, ProgressBar


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

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s entries (parts a checkpoint lacks keep theirs)."""
        self.update = int(saved.get("update", 0))
        for name, part in self.parts.items():
            if saved.get(name) is not None:
                part.load_state_dict(saved[name])


def speed(
    cfg: DictConfig,
    accel: Accel,
    device: torch.device,
    updates_left: int,
    *names: str,
    streams: tuple[str, ...] = (),
    measure: int = 2,
) -> tuple[Tuners, Choice]:
    """The run's thread tuners (``torch_threads``; the learner's is handed to ``accel``) and
    its compile choice (``compile``), to be restored from a checkpoint by a TrainerState."""
    tuners = Tuners(thread_tuners(cfg.get("torch_threads"), device, None, *names, streams=streams))
    accel.threads = tuners.get("learner step")
    return tuners, Choice(compile_choice(cfg.compile, accel, updates_left, measure=measure))


def logger_and_bar(
    cfg: DictConfig, run: Any, step: int, total: int, unit: str, *, main: bool = True
) -> tuple[MetricLogger, ProgressBar | None]:
    """The TensorBoard logger (events after the checkpoint of an interrupted process hidden)
    and the progress bar (``progress=true``) of a run at ``step`` of ``total``."""
    purge = step + 1 if cfg.resume else None  # events AT its step were logged before it
    logger = MetricLogger(run.dir, use_tensorboard=cfg.tensorboard and main, purge_step=purge)
    bar = ProgressBar(total, "train", unit, initial=step) if cfg.progress and main else None
    return logger, bar


__all__ = ["Choice", "TrainerState", "Tuners", "logger_and_bar", "run_name", "speed"]
