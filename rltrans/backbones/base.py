"""The one interface every backbone offers: named outputs and declared capabilities.

Every backbone (:class:`~rltrans.backbones.gtrxl.TransformerStack`,
:class:`~rltrans.backbones.universal.UniversalTransformer`,
:class:`~rltrans.backbones.rnn.RNNBackbone`, :class:`~rltrans.backbones.rnn.MLPBackbone`)
offers the same calls, so agents and learners never ask which one they hold:

* ``forward(x (B, L, D), memory, starts=) -> BackboneOutput(hidden, memory, aux)``,
* ``step(x (N, D), state, done) -> StepOutput(hidden, state, aux)``, one acting step,
* ``initial_state(envs, device, dtype)`` -> acting state (batch-first tensors, plus what the
  step derives from the weights alone),
* ``refresh_state(state)`` -> the state made consistent with the current weights,
* ``state_to_memory(state)`` -> a copy of what a training segment needs,
* ``empty_memory(batch, device, dtype)``.

What a backbone can do beyond that is declared by its class, never probed:

* ``pure_step``: acting splits into ``step_begin`` (state work), ``step_outputs`` (the math,
  a pure function of tensors that can be compiled) and ``step_end`` (cache writes);
* ``ponders``: ``aux`` carries Adaptive Computation Time outputs (Graves 2016): per token
  ``ponder_cost`` N + R, ``ponder_steps`` N, ``remainders`` R, ``halt_prob_mean`` and
  ``halting_weights`` (S, ...);
* ``selects_outputs``: ``forward`` takes ``outputs=`` (a slice of positions) and then
  computes only what those positions need in its last layer.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple, Protocol

from torch import Tensor

Aux = dict[str, Tensor]  # auxiliary per-token outputs by name (empty where a backbone has none)


class BackboneOutput(NamedTuple):
    """What a backbone's ``forward`` returns.

    hidden: (B, L, D) outputs (B, L', D with ``outputs=``).
    memory: the memory the next segment starts from (None where none was given to a stack,
            ``()`` for the memoryless MLP).
    aux:    per-token auxiliary outputs, (B, L) each (see ``ponders``); empty where none.
    """

    hidden: Tensor
    memory: Any
    aux: Aux


class StepOutput(NamedTuple):
    """What a backbone's ``step`` returns for N envs.

    hidden: (N, D) outputs.  state: the acting state after the step.
    aux:    per-env auxiliary outputs, (N,) each (see ``ponders``); empty where none.
    """

    hidden: Tensor
    state: Any
    aux: Aux


class Backbone(Protocol):
    """The calls and capability flags of every backbone (see the module docstring)."""

    pure_step: ClassVar[bool]
    ponders: ClassVar[bool]
    selects_outputs: ClassVar[bool]
    dim: int

    def __call__(self, x: Tensor, memory: Any = None, *, starts: Tensor | None = None) -> Any:
        """``forward``: a BackboneOutput."""
        ...

    def step(self, x: Tensor, state: Any, done: Tensor | None = None) -> StepOutput:
        """One acting step for N envs."""
        ...

    def initial_state(self, envs: int, device: Any = None, dtype: Any = None) -> Any:
        """Fresh acting state for ``envs`` environments."""
        ...

    def refresh_state(self, state: Any) -> Any:
        """The acting state made consistent with the current weights."""
        ...

    def state_to_memory(self, state: Any) -> Any:
        """The training memory of a segment that starts at the current step (a copy)."""
        ...

    def empty_memory(self, batch: int, device: Any = None, dtype: Any = None) -> Any:
        """Empty training memory for ``batch`` sequences."""
        ...

    def parameters(self) -> Any:
        """The module's parameters (a backbone is an ``nn.Module``)."""
        ...
