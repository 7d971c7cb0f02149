"""An agent's acting step compiled (or captured in a CUDA graph) from outside the agent.

An agent whose backbone step is a pure function of tensors (``agent.compilable_step``: the
transformer stacks) offers the step in three pieces: ``begin_step(state, done)`` (resets
and reads of the cache, eager), ``act_outputs(obs, deterministic, *inputs)`` (the math, a
pure function) and ``end_step(state, outputs)`` (the cache writes, eager).
:class:`CompiledActing` runs the middle piece through a program (by default
:class:`~rltrans.accel.compile.AheadOfTime`; on the device rollout's CUDA path, that or the
eager step captured by :class:`~rltrans.accel.capture.Captured`) and is otherwise the agent
itself, so the runtime can act through either; the agent holds no compiled program.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from rltrans.accel.capture import Captured
from rltrans.accel.compile import AheadOfTime
from rltrans.types import ActOutput


class CompiledActing:
    """``agent`` acting through its compiled step; every other attribute is the agent's."""

    def __init__(self, agent: nn.Module, program: Callable | None = None) -> None:
        if not getattr(agent, "compilable_step", False):
            raise ValueError(f"{type(agent).__name__} has no compilable acting step")
        self.agent = agent
        self.program = program if program is not None else AheadOfTime(agent.act_outputs, agent)
        self._modes: dict[tuple[bool, torch.device], Tensor] = {}  # read-only program inputs

    def _mode(self, deterministic: bool, device: torch.device) -> Tensor:
        """``deterministic`` as the bool tensor the program takes (made once per device)."""
        key = (bool(deterministic), device)
        mode = self._modes.get(key)
        if mode is None:
            mode = self._modes[key] = torch.tensor(key[0], device=device)
        return mode

    @torch.no_grad()
    def act(
        self, obs: Any, state: Any, done: Tensor, *, deterministic: bool = False
    ) -> tuple[ActOutput, Any]:
        """One step for N envs, as ``agent.act``."""
        state, inputs = self.agent.begin_step(state, done)
        mode = self._mode(deterministic, done.device)
        return self.agent.end_step(state, self.program(obs, mode, *inputs))

    @torch.no_grad()
    def peek_value(self, obs: Any, state: Any) -> Tensor:
        """V(obs) as the next step of the current episodes, as ``agent.peek_value``."""
        _, inputs = self.agent.begin_step(state, None)  # without ``done`` nothing is written
        return self.program(obs, self._mode(True, self.agent.device), *inputs)[2]

    def __getattr__(self, name: str) -> Any:
        # Only called for names this wrapper lacks: initial_state, observe, refresh_state...
        return getattr(self.__dict__["agent"], name)


def compiled_acting(agent: nn.Module) -> CompiledActing | None:
    """The agent acting through its compiled step, or None if its step cannot compile."""
    return CompiledActing(agent) if getattr(agent, "compilable_step", False) else None


def captured_acting(agent: nn.Module, compiled: bool) -> CompiledActing | None:
    """On CUDA, the agent acting through its step (``compiled``: the compiled one) replayed
    from a CUDA graph; None off CUDA or where the step is not a pure function."""
    if not getattr(agent, "compilable_step", False) or agent.device.type != "cuda":
        return None
    program = AheadOfTime(agent.act_outputs, agent) if compiled else agent.act_outputs
    return CompiledActing(agent, Captured(program, owner=agent))
