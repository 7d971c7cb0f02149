"""Recurrent (LSTM/GRU) and memoryless (MLP) backbones with the interface of every backbone
(:mod:`rltrans.backbones.base`): ``forward`` returns a BackboneOutput and ``step`` a
StepOutput, both with an empty ``aux``; neither has a pure (compilable) step.
"""

from __future__ import annotations

from typing import ClassVar, Literal, NamedTuple

import torch
from torch import Tensor, nn

from rltrans.backbones.base import BackboneOutput, StepOutput
from rltrans.choices import check_choice

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
    # True while rltrans.accel traces a compiled program: no data-dependent shortcut.
    static_graph = False

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
        b = x.shape[0]
        state = memory if memory is not None else self.empty_memory(b, x.device, x.dtype)
        # Without resets the whole segment runs in one call; a compiled graph cannot branch on
        # data, so there the per-step loop (the same math) always runs.
        if starts is None or (not self.static_graph and not bool(starts.any())):
            return BackboneOutput(*self._run(x, state), {})
        return BackboneOutput(*self._run_with_resets(x, state, ~starts), {})

    def _run_with_resets(self, x: Tensor, state: RNNState, keep: Tensor) -> tuple[Tensor, RNNState]:
        """The cell's equations (as torch documents them for nn.LSTM / nn.GRU, on its weights)
        stepped over x (B, L, D), zeroing each layer's state where ``keep`` (B, L) is False.
        Stepping nn.LSTM one call per step costs ~4x this loop in backward on CPU."""
        keep = keep.to(x.dtype).unsqueeze(-1)  # (B, L, 1)
        hs, cs = [], []
        for layer in range(self.layers):
            w_ih, w_hh, b_ih, b_hh = (
                getattr(self.rnn, f"{name}_l{layer}")
                for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
            )
            inputs = nn.functional.linear(x, w_ih, b_ih)  # (B, L, G*D) for all steps at once
            h, c, outs = state.h[:, layer], state.c[:, layer], []
            for t in range(x.shape[1]):
                h, c = h * keep[:, t], c * keep[:, t]
                hidden = nn.functional.linear(h, w_hh, b_hh)
                if self.cell == "lstm":
                    i, f, g, o = (inputs[:, t] + hidden).chunk(4, dim=-1)
                    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                    h = torch.sigmoid(o) * torch.tanh(c)
                else:  # r, z, n as in nn.GRU: n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
                    xr, xz, xn = inputs[:, t].chunk(3, dim=-1)
                    hr, hz, hn = hidden.chunk(3, dim=-1)
                    r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
                    h = (1 - z) * torch.tanh(xn + r * hn) + z * h
                outs.append(h)
            x = torch.stack(outs, dim=1)
            hs.append(h)
            cs.append(c if self.cell == "lstm" else torch.zeros_like(h))
        return x, RNNState(torch.stack(hs, dim=1), torch.stack(cs, dim=1))

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

    pure_step: ClassVar[bool] = True  # no state: the step is the MLP
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

    def step_begin(self, state: tuple, done: Tensor | None, dtype: torch.dtype) -> tuple:
        """No state to reset or read: the step's only input is x."""
        return state, ()

    def step_outputs(self, x: Tensor) -> tuple[Tensor]:
        """The step's math (a pure function): the MLP's output (N, D), nothing to cache."""
        return (self.net(x),)

    def step_end(self, state: tuple) -> tuple:
        """Nothing cached: the state as it was."""
        return state
