"""Everything that only makes rltrans faster, behind one seam; removing it changes no result.

* :mod:`~rltrans.accel.compile` — ``compile=true|auto``: ``torch.compile`` of training
  steps, an ahead-of-time compiled acting step, and the ``auto`` chooser;
* :mod:`~rltrans.accel.acting` — an agent's acting step compiled from outside the agent;
* :mod:`~rltrans.accel.rollout` — PPO's rollout of a torch-native env without host reads
  (``rollout=auto|device``), and :mod:`~rltrans.accel.capture`, its acting step replayed
  from a CUDA graph;
* :mod:`~rltrans.accel.threads` — ``torch_threads=auto``: thread counts and streams chosen
  by timing the run's own calls;
* :mod:`~rltrans.accel.chunks` — a minibatch's gradient in parts (``algo.chunk_obs_mb``)
  or in parts side by side (streams);
* :mod:`~rltrans.accel.run_speed` — all of these for one run, made in one call from its
  settings: what a trainer holds.

A learner holds one :class:`Accel` and asks it for what to run: ``program(loss_fn)`` (the
loss as it should run now, eager or compiled), ``gradient(loss_fn, batch, learner)`` (a
minibatch's gradient, whole or in parts) and ``step()`` (the context that sets and times the
thread plan). The learner knows nothing of how any of these is made fast. Only public
PyTorch APIs are used here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from rltrans.accel.acting import CompiledActing, captured_acting, compiled_acting
from rltrans.accel.auto import AutoCompile, CompileOverBudget, deadline, workload_key
from rltrans.accel.chunks import LossFn, Parts, more_parts, part_count
from rltrans.accel.compile import AheadOfTime, _report, compiled
from rltrans.accel.threads import AUTO, Plan, ThreadTuner, set_threads, tuned
from rltrans.core.dropout import Dropout

T = TypeVar("T")

__all__ = [
    "AUTO", "Accel", "AheadOfTime", "AutoCompile", "CompileOverBudget", "CompiledActing",
    "Plan", "ThreadTuner", "compiled", "compiled_acting", "deadline",
    "draws_random", "set_threads", "workload_key",
]  # fmt: skip


class Accel:
    """How one learner's steps run: eager or compiled, on which thread plan, in how many parts.

    ``chunk_obs_mb``: split a minibatch into parts whose observations take at most this many
    MiB as float32 (None: whole minibatches).
    """

    def __init__(self, *, chunk_obs_mb: float | None = None) -> None:
        if chunk_obs_mb is not None and not chunk_obs_mb > 0:
            raise ValueError(f"algo.chunk_obs_mb={chunk_obs_mb} must be a positive number or null")
        self.chunk_bytes = None if chunk_obs_mb is None else float(chunk_obs_mb) * 2**20
        self.threads: ThreadTuner | None = None  # torch_threads=auto: times each step
        self.compiling = False
        self._programs: dict[Any, Callable] = {}
        self._parts = Parts()
        self.min_parts = 1  # raised when a minibatch runs out of device memory
        self._actors: list[tuple[Any, nn.Module, bool]] = []
        self._compiled_acting: dict[tuple[int, bool, bool], CompiledActing | None] = {}

    # ---------------------------------------------------------------- what the learner asks
    def step(self) -> contextlib.AbstractContextManager:
        """Context for one learner step: sets (and while measuring, times) the thread plan."""
        return tuned(self.threads)

    def program(
        self, fn: Callable, device: Any = "cpu", owner: nn.Module | None = None
    ) -> Callable:
        """``fn`` as it should run now (on ``device``): compiled (compiled at its first call
        and kept) when compiling, else eager. Eager while the thread plan is still measured:
        compiled kernels keep the thread count they were built with. ``owner``: the model
        ``fn`` runs (default: the module ``fn`` is a method of), which takes its static
        paths in the compiled program."""
        if not self.compiling or self.trialing_threads:
            return fn
        program = self._programs.get(fn)  # bound methods compare by object and function
        if program is None:
            program = self._programs[fn] = compiled(fn, device=device, owner=owner)
        return program

    def gradient(
        self, loss_fn: LossFn, batch: Any, learner: Any
    ) -> tuple[dict[str, torch.Tensor], Any]:
        """The gradient of ``loss_fn(batch)`` summed into ``learner``'s parameters (through
        its ``backward`` / ``gradients`` / ``add_gradients``), whole or in parts; returns the
        metrics and per-token aux values of the whole minibatch."""
        plan = self.threads.plan if self.threads is not None else None
        least = part_count(batch, self.chunk_bytes)
        return self.fitting(
            lambda count: self._parts.accumulate(
                self.program(loss_fn, learner.device_type, owner=learner.model),
                batch,
                learner,
                count=count,
                streams=plan.streams if plan is not None else 1,
                threads=plan.threads if plan is not None else 1,
            ),
            size=batch.mask.shape[0],
            least=least,
            what="segments",
            hint="algo.chunk_obs_mb sets parts from the start",
        )

    def fitting(
        self, attempt: Callable[[int], T], *, size: int, least: int = 1, what: str, hint: str
    ) -> T:
        """``attempt(count)`` for a batch of ``size`` ``what`` split into ``count`` parts (at
        least ``least`` and :attr:`min_parts`); on running out of device memory, again with
        more parts, which later batches keep (saying so, with ``hint``). One item per part
        that does not fit raises."""
        while True:
            count = min(max(least, self.min_parts), size)
            try:
                return attempt(count)
            except torch.cuda.OutOfMemoryError:
                if count >= size:  # one item per part already: nothing left to split
                    raise
            # Out of the handler, so the failed attempt's tensors are freed before the retry.
            self.min_parts = more_parts(size, count)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            _report(
                f"out of device memory on a minibatch of {size} {what} in {count} part(s): "
                f"its gradient is now computed in {self.min_parts} parts (the same gradient; "
                f"{hint})"
            )

    @property
    def trialing_threads(self) -> bool:
        """True while ``torch_threads=auto`` is still timing thread plans."""
        return self.threads is not None and self.threads.chosen is None

    # ------------------------------------------------------------------- the compile switch
    def act_through(self, actor: Any, agent: nn.Module, *, capture: bool = False) -> None:
        """Let ``actor`` (anything with ``use_policy(policy)``) act through ``agent``'s compiled
        step while compiling, through ``agent`` otherwise (applied at once). ``capture`` (the
        device rollout): on CUDA, either step is replayed from a CUDA graph."""
        self._actors.append((actor, agent, capture))
        actor.use_policy(self._acting(agent, capture) or agent)

    def use_compiled(self, on: bool) -> None:
        """Switch compiled programs on or off, for the learner's steps and the acting steps
        of every actor handed to :meth:`act_through`."""
        self.compiling = on
        for actor, agent, capture in self._actors:
            actor.use_policy(self._acting(agent, capture) or agent)

    def _acting(self, agent: nn.Module, capture: bool = False) -> CompiledActing | None:
        """``agent``'s acting program (one per agent and choice, kept): captured on CUDA when
        ``capture``, compiled while compiling, else None (the agent itself)."""
        key = (id(agent), capture, self.compiling)
        if key not in self._compiled_acting:
            program = captured_acting(agent, self.compiling) if capture else None
            if program is None and self.compiling:
                program = compiled_acting(agent)
            self._compiled_acting[key] = program
        return self._compiled_acting[key]


def draws_random(model: nn.Module) -> bool:
    """True if the model's training forward draws random numbers (dropout with p > 0): parts
    of such a step on several threads would draw from the one generator in racing order."""
    for m in model.modules():
        p = getattr(m, "p", None) if isinstance(m, nn.Dropout | Dropout) else None
        if (p or 0.0) > 0.0 or getattr(m, "dropout", 0.0) > 0.0:
            return True
    return False
