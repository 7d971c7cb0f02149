"""The run plan: one run, resolved once at the top (:func:`rltrans.api.resolve`) and taken
whole by the trainer below it, which never reads the command line again."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, Literal

from rltrans.accel.run_speed import SpeedSettings
from rltrans.config.frozen import Frozen, thaw
from rltrans.config.run_settings import RunSettings, RuntimeSettings
from rltrans.learners.settings import AlgoConfig

TrainerKind = Literal["online", "impala", "offline"]
TRAINER_KINDS: tuple[str, ...] = ("online", "impala", "offline")


@dataclass(frozen=True)
class EnvSection:
    """The ``env`` section: its ``kind`` (torch | gym | dataset), ``num_envs`` (None:
    env=dataset's, sized by the evaluation) and the whole section (``options``), which the
    env factories take."""

    kind: str
    num_envs: int | None
    options: Frozen

    @property
    def label(self) -> str:
        """The env's part of a default run folder name: its task name, else its id."""
        return self.options.get("name") or str(self.options.get("id", "env")).replace("/", "_")

    def to_dict(self, **changes: Any) -> dict[str, Any]:
        """The section as plain data, with ``changes`` (e.g. ``num_envs``)."""
        return {**thaw(self.options), **changes}


@dataclass(frozen=True)
class AgentSection:
    """The ``agent`` section: its registered ``kind``, ``backbone`` where it has one, and the
    whole section (``options``), which :func:`rltrans.registry.build_agent` takes."""

    kind: str
    backbone: str | None
    options: Frozen

    @property
    def label(self) -> str:
        """The agent's part of a default run folder name: its backbone, else its kind."""
        return self.backbone or self.kind

    def to_dict(self) -> dict[str, Any]:
        """The section as plain data."""
        return thaw(self.options)


@dataclass(frozen=True)
class RunPlan:
    """One run, resolved: what trains, on what, with which settings.

    ``config``: the final config as read-only plain data (:class:`Frozen`: what the run
    folder's config.yaml and its checkpoints store). ``env`` and ``agent``: its two open
    sections, typed where the trainers read them. ``trainer``: ``online`` (PPO), ``impala``
    or ``offline`` (DT/BC). ``algo``: the ``algo`` section typed (``PPOConfig``, ``ImpalaConfig`` or
    ``OfflineConfig``), which the learner takes whole. ``run``: the top-level keys typed
    (seed, budgets, run folder, checkpoints, speed modes, logging). ``runtime``: where
    IMPALA's actors run, typed (``LocalRuntime``, ``ProcessRuntime`` or ``RayRuntime``).
    ``overrides``: the command line it was resolved from. ``horizon_note``: what
    ``agent.horizon`` fitted, printed when the run starts (None: nothing fitted).
    ``speed``: what the trainer's :class:`~rltrans.accel.run_speed.RunSpeed` is made from
    (the speed modes, and the workload ``compile=auto`` remembers its choice under).
    """

    config: Frozen
    trainer: TrainerKind
    algo: AlgoConfig
    run: RunSettings
    runtime: RuntimeSettings
    overrides: tuple[str, ...]
    speed: SpeedSettings
    horizon_note: str | None = None

    @property
    def env(self) -> EnvSection:
        """The ``env`` section, typed."""
        env = self.config["env"]
        return EnvSection(str(env["kind"]), env.get("num_envs"), env)

    @property
    def agent(self) -> AgentSection:
        """The ``agent`` section, typed."""
        agent = self.config["agent"]
        return AgentSection(str(agent["kind"]), agent.get("backbone"), agent)

    @property
    def command(self) -> str:
        """The shell command that runs this plan."""
        return " ".join(["python -m rltrans.train", *map(shlex.quote, self.overrides)])

    def to_dict(self) -> dict[str, Any]:
        """The resolved config as plain data."""
        return thaw(self.config)

    def __repr__(self) -> str:
        return f"RunPlan({self.command!r})"


__all__ = ["TRAINER_KINDS", "AgentSection", "EnvSection", "RunPlan", "TrainerKind"]
