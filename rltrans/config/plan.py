"""The run plan: one run, resolved once at the top (:func:`rltrans.api.resolve`) and taken
whole by the trainer below it, which never reads the command line again."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, Literal

from omegaconf import DictConfig

from rltrans.accel.run_speed import SpeedSettings
from rltrans.config.compose import to_container
from rltrans.config.run_settings import RunSettings, RuntimeSettings
from rltrans.learners.settings import AlgoConfig

TrainerKind = Literal["online", "impala", "offline"]
TRAINER_KINDS: tuple[str, ...] = ("online", "impala", "offline")


@dataclass(frozen=True)
class RunPlan:
    """One run, resolved: what trains, on what, with which settings.

    ``config``: the final config, read-only (what the run folder's config.yaml and its
    checkpoints store). ``trainer``: ``online`` (PPO), ``impala`` or ``offline`` (DT/BC).
    ``algo``: the ``algo`` section typed (``PPOConfig``, ``ImpalaConfig`` or
    ``OfflineConfig``), which the learner takes whole. ``run``: the top-level keys typed
    (seed, budgets, run folder, checkpoints, speed modes, logging). ``runtime``: where
    IMPALA's actors run, typed (``LocalRuntime``, ``ProcessRuntime`` or ``RayRuntime``).
    ``overrides``: the command line it was resolved from. ``horizon_note``: what
    ``agent.horizon`` fitted, printed when the run starts (None: nothing fitted).
    ``speed``: what the trainer's :class:`~rltrans.accel.run_speed.RunSpeed` is made from
    (the speed modes, and the workload ``compile=auto`` remembers its choice under).
    """

    config: DictConfig
    trainer: TrainerKind
    algo: AlgoConfig
    run: RunSettings
    runtime: RuntimeSettings
    overrides: tuple[str, ...]
    speed: SpeedSettings
    horizon_note: str | None = None

    @property
    def command(self) -> str:
        """The shell command that runs this plan."""
        return " ".join(["python -m rltrans.train", *map(shlex.quote, self.overrides)])

    def to_dict(self) -> dict[str, Any]:
        """The resolved config as plain data."""
        return to_container(self.config)

    def __repr__(self) -> str:
        return f"RunPlan({self.command!r})"


__all__ = ["TRAINER_KINDS", "RunPlan", "TrainerKind"]
