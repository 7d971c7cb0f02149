"""Recurrent (LSTM/GRU) and memoryless (MLP) backbones with the interface of every backbone
(:mod:`rltrans.backbones.base`): ``forward`` returns a BackboneOutput and ``step`` a
StepOutput, both with an empty ``aux``; neither has a pure (compilable) step.
"""

from __future__ import annotations

from typing import ClassVar, Literal, NamedTuple

import torch
from torch import Tensor, nn

from rltrans.backbones.base import BackboneOutput, StepOutput
from rltrans.core.attention import check_choice

CellKind = Literal["lstm", "gru"]


class RNNState(NamedTuple):
    """h, c: (N, layers, D); c is unused (zeros) for a GRU."""

    h: Tensor
    c: Tensor


class RNNBackbone(nn.Module):
    """A multi-layer LSTM or GRU whose state resets where a new episode starts."""

    pure_step: ClassVar[bool] = False
    ponders: ClassVar[bool] = False
    selects_outputs: ClassVar[bool] = False

    def __init__(self, dim: int, layers: int = 1, cell: CellKind = "lstm") -> None:
        super().__init__()
        check_choice("recurrent cell", cell, ("lstm", "gru"))
        self.dim, self.layers, self.cell = dim, layers, cell
        rnn_cls = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn_cls(dim, dim, num_layers=layers, batch_first=True)
        for (
            name,
            p,
        ) in self.rnn.named_parameters():  # orthogonal init, zero bias (CleanRL ppo_atari_lstm)
            if "weight" in name:
                nn.init.orthogonal_(p, 1.0)
            else:
                nn.init.zeros_(p)

    def empty_memory(self, batch: int, device=None, dtype=None) -> RNNState:
        """Zero state for ``batch`` sequences."""
        z = torch.zeros(batch, self.layers, self.dim, device=device, dtype=dtype)
        return RNNState(z, z.clone())

    def initial_state(self, envs: int, device=None, dtype=None) -> RNNState:
        """Zero acting state for ``envs`` environments."""
        return self.empty_memory(envs, device, dtype)

    def refresh_state(self, state: RNNState) -> RNNState:
        """Nothing to refresh after a weight update: the learner replays from the stored
        (h, c) too, so acting and replay agree."""
        return state

    def state_to_memory(self, state: RNNState) -> RNNState:
        """A copy of the state (the acting state is the training memory for an RNN)."""
        return RNNState(state.h.clone(), state.c.clone())

    def _run(self, x: Tensor, state: RNNState) -> tuple[Tensor, RNNState]:
        """Run the cell over x (B, L, D) from a batch-first state."""
        h0 = state.h.transpose(0, 1).contiguous()  # (layers, B, D) as torch expects
        if self.cell == "lstm":
            y, (h, c) = self.rnn(x, (h0, state.c.transpose(0, 1).contiguous()))
        else:
            y, h = self.rnn(x, h0)
            c = torch.zeros_like(h)
        return y, RNNState(h.transpose(0, 1), c.transpose(0, 1))

    def forward(
        self, x: Tensor, memory: RNNState | None = None, *, starts: Tensor | None = None
    ) -> BackboneOutput:
        """Run a segment, zeroing the state of a sequence at each episode start."""
        b, length, _ = x.shape
        state = memory if memory is not None else self.empty_memory(b, x.device, x.dtype)
        # Without resets the whole segment runs in one call; a compiled graph cannot branch on
        # data, so there the per-step loop below (the same math) always runs.
        if starts is None or (not torch.compiler.is_compiling() and not bool(starts.any())):
            return BackboneOutput(*self._run(x, state), {})
        outs = []
        for t in range(length):  # a reset inside the segment: step so the state can be cut there
            keep = (~starts[:, t]).to(x.dtype).view(b, 1, 1)
            y, state = self._run(x[:, t : t + 1], RNNState(state.h * keep, state.c * keep))
            outs.append(y)
        return BackboneOutput(torch.cat(outs, dim=1), state, {})

    @torch.no_grad()
    def step(self, x: Tensor, state: RNNState, done: Tensor | None = None) -> StepOutput:
        """One acting step for N envs."""
        if done is not None:
            keep = (~done.bool()).to(x.dtype).view(-1, 1, 1)
            state = RNNState(state.h * keep, state.c * keep)
        y, state = self._run(x.unsqueeze(1), state)
        return StepOutput(y[:, 0], state, {})


class MLPBackbone(nn.Module):
    """Memoryless control: a per-step MLP, same interface as the memory backbones."""

    pure_step: ClassVar[bool] = False
    ponders: ClassVar[bool] = False
    selects_outputs: ClassVar[bool] = False

    def __init__(self, dim: int, layers: int = 2) -> None:
        super().__init__()
        self.dim = dim
        blocks: list[nn.Module] = []
        for _ in range(layers):
            blocks += [nn.Linear(dim, dim), nn.Tanh()]
        self.net = nn.Sequential(*blocks)

    def empty_memory(self, batch: int, device=None, dtype=None) -> tuple:
        """No memory."""
        return ()

    def initial_state(self, envs: int, device=None, dtype=None) -> tuple:
        """No state."""
        return ()

    def refresh_state(self, state: tuple) -> tuple:
        """Memoryless: nothing to refresh."""
        return state

    def state_to_memory(self, state: tuple) -> tuple:
        """No memory."""
        return ()

    def forward(
        self, x: Tensor, memory: tuple = (), *, starts: Tensor | None = None
    ) -> BackboneOutput:
        """Apply the MLP to every step independently."""
        return BackboneOutput(self.net(x), (), {})

    @torch.no_grad()
    def step(self, x: Tensor, state: tuple, done: Tensor | None = None) -> StepOutput:
        """One acting step."""
        return StepOutput(self.net(x), (), {})
