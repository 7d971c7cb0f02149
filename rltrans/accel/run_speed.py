"""One run's speed, built in one call from its settings: what the trainers hold instead of
naming the mechanisms.

A trainer makes one :class:`RunSpeed` from :class:`SpeedSettings` (``compile``,
``torch_threads``, ``rollout``, ``algo.chunk_obs_mb`` and the sections compiled programs
depend on) and uses four things of it: :attr:`RunSpeed.accel` for its learner,
:meth:`RunSpeed.act_through` for its actors, :meth:`RunSpeed.parts` for what it
checkpoints (the thread and compile choices, under ``threads`` and ``compile``), and the
compile choice's hooks (:meth:`RunSpeed.after_update`, :meth:`RunSpeed.compile_due`,
:meth:`RunSpeed.bounded`, :meth:`RunSpeed.over_budget`) for its update loop. Which thread
plan, compiled program or rollout runs is decided here and nowhere in the trainers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from rltrans import distributed
from rltrans.accel import Accel, draws_random
from rltrans.accel.auto import AutoCompile, CompileOverBudget, Memory, deadline, workload_key
from rltrans.accel.compile import _report
from rltrans.accel.rollout import DeviceRollout, device_rollout
from rltrans.accel.threads import AUTO, ThreadTuner

# compile=auto's expected compile time per chunk a training step unrolls: 8 chunks of 64
# steps had not compiled after 7 minutes on one core, with two other runs on the machine.
CHUNK_COMPILE_SECONDS = 120.0
LEARNER, ACTING = "learner step", "acting step"  # the kinds of call torch_threads=auto tunes


@dataclass(frozen=True)
class SpeedSettings:
    """What a run's plan says about its speed.

    ``compile``, ``torch_threads`` and ``rollout`` are train.yaml's keys; ``chunk_obs_mb`` is
    ``algo.chunk_obs_mb`` (a minibatch's gradient in parts of at most that many MiB of
    observations); ``workload`` holds what the compiled programs depend on (the agent, algo
    and env sections, the dataset), the key under which ``compile=auto`` remembers its
    decision; ``unrolled_chunks`` is how many chunks a compiled training step unrolls.
    """

    compile: bool | str = "auto"
    torch_threads: int | str = 1
    rollout: str = "auto"
    chunk_obs_mb: float | None = None
    workload: Mapping[str, Any] = field(default_factory=dict)
    unrolled_chunks: int = 1


def thread_tuners(
    setting: Any,
    device: torch.device,
    saved: dict[str, Any] | None = None,
    *names: str,
    streams: tuple[str, ...] = (),
) -> dict[str, ThreadTuner]:
    """``torch_threads=auto`` on CPU: one :class:`ThreadTuner` per kind of call in ``names``
    (e.g. ``learner step``, ``acting step``), restored from a checkpoint's ``saved`` choices;
    each reports its choice on stderr. The calls named in ``streams`` can also run as
    one-thread streams (not under torchrun). Empty for a fixed count or a CUDA device."""
    if setting != AUTO or device.type != "cpu":
        return {}
    split = () if distributed.active() else streams  # torchrun's collectives: main thread
    tuners = {name: ThreadTuner(name, streams=name in split, report=_report) for name in names}
    for name, state in (saved or {}).items():
        if name in tuners:
            tuners[name].load_state_dict(state)
    return tuners


COMPILE_SECONDS = 60.0  # what compiling a training step and an acting step takes, about


def compile_choice(
    setting: Any,
    accel: Accel,
    updates_left: int,
    saved: str | None = None,
    *,
    measure: int = 2,
    compile_seconds: float = COMPILE_SECONDS,
    key: str | None = None,
) -> AutoCompile | None:
    """What ``compile`` asks: ``true`` switches ``accel`` to compiled programs now (said by
    :meth:`RunSpeed.start`), ``auto`` returns an :class:`AutoCompile` over ``updates_left``
    updates that times the first ``measure`` (or applies a checkpoint's ``saved`` choice),
    compiles only where a tenth of the rest of the run exceeds ``compile_seconds``, under
    that bound, and remembers the outcome under the workload ``key``; ``false`` returns
    None."""
    if setting == "auto":
        chooser = AutoCompile(
            updates_left,
            enable=lambda: accel.use_compiled(True),
            disable=lambda: accel.use_compiled(False),
            report=_report,
            measure=measure,
            compile_seconds=compile_seconds,
            memory=Memory() if key else None,
            key=key,
        )
        chooser.restore(saved)
        return chooser
    if setting:
        accel.use_compiled(True)
    return None


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


class RunSpeed:
    """A run's speed choices: its learner's :class:`Accel`, the ``torch_threads=auto``
    tuners of the ``calls`` it makes (``learner step``, ``acting step``) and its compile
    choice over ``updates`` updates (``compile=auto`` decides from the first ``measure``).
    ``streams_for``: the model whose minibatch parts may run side by side as one-thread
    streams (not when its training forward draws random numbers: dropout's draws from one
    generator would race, and the run would not repeat).

    >>> speed = RunSpeed(SpeedSettings(compile=False), torch.device("cpu"), 100)
    >>> learner = PPOLearner(agent, algo, total_updates=100, accel=speed.accel)  # doctest: +SKIP
    >>> speed.act_through(actor, agent)  # doctest: +SKIP
    >>> state = TrainerState(episodes=tracker, **speed.parts())  # doctest: +SKIP
    """

    def __init__(
        self,
        settings: SpeedSettings,
        device: torch.device,
        updates: int,
        *,
        calls: tuple[str, ...] = (LEARNER,),
        streams_for: nn.Module | None = None,
        measure: int = 2,
    ) -> None:
        self.settings = settings
        self.accel = Accel(chunk_obs_mb=settings.chunk_obs_mb)
        streams = (LEARNER,) if streams_for is not None and not draws_random(streams_for) else ()
        self.threads = Tuners(
            thread_tuners(settings.torch_threads, device, None, *calls, streams=streams)
        )
        self.accel.threads = self.threads.get(LEARNER)
        chunks = settings.unrolled_chunks
        seconds = COMPILE_SECONDS if chunks <= 1 else CHUNK_COMPILE_SECONDS * chunks
        key = workload_key(
            dict(settings.workload), str(device), settings.torch_threads, settings.rollout
        )
        self.compile = Choice(
            compile_choice(
                settings.compile, self.accel, updates, measure=measure,
                compile_seconds=seconds, key=key,
            )
        )  # fmt: skip

    def parts(self) -> dict[str, Tuners | Choice]:
        """What a trainer checkpoints of its speed: ``threads`` and ``compile``."""
        return {"threads": self.threads, "compile": self.compile}

    def start(self, updates_left: int) -> None:
        """The run (resumed or new) has ``updates_left`` updates to go; ``compile=true`` says
        now, as its first update starts, that it compiles."""
        self.compile.set_updates_left(updates_left)
        if self.settings.compile is True:
            _report(
                "compile=true: the first update compiles the training step and, for agents "
                "whose acting step is a pure function, the acting step (~15-60 s)"
            )

    def device_rollout(self, envs: Any) -> DeviceRollout | None:
        """The device rollout ``rollout`` asks for with ``envs`` (None: the generic loop)."""
        return device_rollout(self.settings.rollout, envs)

    def act_through(self, actor: Any, agent: nn.Module) -> None:
        """Let ``actor`` act through ``agent``'s fastest acting step (compiled while
        compiling; on CUDA, captured when it rolls out on the device), timed by the
        ``acting step`` tuner."""
        actor.loop.threads = self.threads.get(ACTING)
        capture = getattr(actor, "rollout", None) is not None
        self.accel.act_through(actor, agent, capture=capture)

    def after_update(self, seconds: float) -> None:
        """Account one update whose compilable work took ``seconds`` (``compile=auto``)."""
        self.compile.after_update(seconds)

    def compile_due(self) -> bool:
        """Whether the next update compiles (``compile=auto``, under :meth:`bounded`)."""
        return self.compile.compile_due()

    def bounded(self) -> contextlib.AbstractContextManager[None]:
        """The deadline of an update that compiles; any other update runs unbounded."""
        return self.compile.bounded()

    def over_budget(self, err: CompileOverBudget) -> None:
        """The compiling update was dropped: eager from now on."""
        self.compile.over_budget(err)


__all__ = [
    "CHUNK_COMPILE_SECONDS", "COMPILE_SECONDS", "Choice", "RunSpeed", "SpeedSettings", "Tuners",
    "compile_choice", "thread_tuners",
]  # fmt: skip
