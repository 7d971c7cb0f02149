"""Gating layers that replace the residual connection, chosen by name.

All share the call ``gate(x, y)`` where x is the skip (stream) input and y the
sub-layer output. Equations from Parisotto et al. 2019, "Stabilizing
Transformers for Reinforcement Learning", section 3.2.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor, nn

from rltrans.choices import check_choice

GateName = Literal["residual", "input", "output", "highway", "sigmoid_tanh", "gru"]
GATES: tuple[str, ...] = get_args(GateName)


class ResidualGate(nn.Module):
    """g(x, y) = x + y."""

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        """Plain residual sum."""
        return x + y


class InputGate(nn.Module):
    """g(x, y) = sigmoid(W_g x) * x + y."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w = nn.Linear(dim, dim)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        """Gate the skip path by the skip input."""
        return torch.sigmoid(self.w(x)) * x + y


class OutputGate(nn.Module):
    """g(x, y) = x + sigmoid(W_g x - b_g) * y."""

    def __init__(self, dim: int, gate_bias: float) -> None:
        super().__init__()
        self.w = nn.Linear(dim, dim)
        nn.init.constant_(self.w.bias, -gate_bias)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        """Gate the sub-layer output by the skip input."""
        return x + torch.sigmoid(self.w(x)) * y


class HighwayGate(nn.Module):
    """g(x, y) = sigmoid(W_g x + b_g) * x + (1 - sigmoid(W_g x + b_g)) * y."""

    def __init__(self, dim: int, gate_bias: float) -> None:
        super().__init__()
        self.w = nn.Linear(dim, dim)
        nn.init.constant_(self.w.bias, gate_bias)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        """Convex mix of skip and sub-layer output."""
        carry = torch.sigmoid(self.w(x))
        return carry * x + (1.0 - carry) * y


class SigmoidTanhGate(nn.Module):
    """g(x, y) = x + sigmoid(W_g y - b) * tanh(U_g y)."""

    def __init__(self, dim: int, gate_bias: float) -> None:
        super().__init__()
        self.w = nn.Linear(dim, 2 * dim)  # [W_g ; U_g] in one matmul
        with torch.no_grad():
            self.w.bias.zero_()
            self.w.bias[:dim] = -gate_bias

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        """Add a gated, squashed sub-layer output."""
        g, h = self.w(y).chunk(2, dim=-1)
        return x + torch.sigmoid(g) * torch.tanh(h)


class GRUGate(nn.Module):
    """GRU-type gate, the one GTrXL uses:

    r = sigmoid(W_r y + U_r x),  z = sigmoid(W_z y + U_z x - b_g),
    h = tanh(W_g y + U_g (r * x)),  g = (1 - z) * x + z * h.

    With b_g > 0 the update gate z starts small, so the layer starts close to the
    identity on its skip input x (the paper's key to stable early training).
    """

    def __init__(self, dim: int, gate_bias: float) -> None:
        super().__init__()
        self.w = nn.Linear(dim, 3 * dim, bias=False)  # [W_r ; W_z ; W_g] applied to y
        self.u = nn.Linear(dim, 2 * dim, bias=False)  # [U_r ; U_z] applied to x
        self.u_g = nn.Linear(dim, dim, bias=False)
        self.bias_z = nn.Parameter(torch.full((dim,), -gate_bias))

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        """Gated update of x toward a candidate computed from y and x."""
        wr, wz, wg = self.w(y).chunk(3, dim=-1)
        ur, uz = self.u(x).chunk(2, dim=-1)
        r = torch.sigmoid(wr + ur)
        z = torch.sigmoid(wz + uz + self.bias_z)
        h = torch.tanh(wg + self.u_g(r * x))
        # lerp takes one dtype: under autocast h and z come out of bfloat16 matmuls while the
        # residual stream x stays float32, so the gate mixes in x's dtype.
        return torch.lerp(x, h.to(x.dtype), z.to(x.dtype))  # (1 - z) * x + z * h


def build_gate(name: GateName, dim: int, *, gate_bias: float = 2.0) -> nn.Module:
    """The gate module for a gate name."""
    check_choice("gate", name, GATES)
    builders = {
        "residual": lambda: ResidualGate(),
        "input": lambda: InputGate(dim),
        "output": lambda: OutputGate(dim, gate_bias),
        "highway": lambda: HighwayGate(dim, gate_bias),
        "sigmoid_tanh": lambda: SigmoidTanhGate(dim, gate_bias),
        "gru": lambda: GRUGate(dim, gate_bias),
    }
    return builders[name]()
