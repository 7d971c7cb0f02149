"""TransformerBlock: norm placement + attention + gate + MLP + gate.

Two placements, picked once at build time (Parisotto et al. 2019, figure 1):

* ``post`` (vanilla Transformer / TrXL): x = LN(gate(x, Attn(x))), x = LN(gate(x, MLP(x)));
* ``pre`` (identity-map reordering, TrXL-I / GTrXL / GPT-2): x = gate(x, act(Attn(LN(x)))),
  x = gate(x, act(MLP(LN(x)))), leaving an identity path from input to output.
  ``sublayer_activation="relu"`` is the ReLU that TrXL-I and GTrXL apply to each
  sub-module output before the gate; GPT-2 style stacks use ``"none"``.

Memory enters as keys/values: with pre-norm the memory tokens are normalised
by the same LayerNorm as the current ones before projection
(:meth:`TransformerBlock.memory_kv`).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from torch import Tensor, nn

from rltrans.core.attention import Kernel, MultiHeadAttention, check_choice
from rltrans.core.dropout import Dropout
from rltrans.core.gates import GateName, build_gate
from rltrans.core.position import PositionName, build_attention_position

NormPlacement = Literal["pre", "post"]
NORMS: tuple[str, ...] = get_args(NormPlacement)
SublayerActivation = Literal["relu", "none"]
ACTIVATIONS: tuple[str, ...] = get_args(SublayerActivation)


FFActivation = Literal["gelu", "relu"]
FF_ACTIVATIONS: tuple[str, ...] = get_args(FFActivation)


class FeedForward(nn.Module):
    """Position-wise MLP: Linear -> GELU or ReLU -> Linear.

    No dropout on the hidden layer: as in GPT-2, dropout acts on the sub-layer output (the
    block's residual dropout), which is also 4x cheaper than masking the 4D hidden layer.
    """

    def __init__(self, dim: int, hidden: int, activation: FFActivation) -> None:
        super().__init__()
        check_choice("feed-forward activation", activation, FF_ACTIVATIONS)
        # ReLU in place: the first Linear's output is needed by nothing else, and not
        # allocating the (B, L, 4D) activation twice makes a DT training step faster on CPU.
        act = nn.GELU() if activation == "gelu" else nn.ReLU(inplace=True)
        self.net = nn.Sequential(nn.Linear(dim, hidden), act, nn.Linear(hidden, dim))

    def forward(self, x: Tensor) -> Tensor:
        """Apply the MLP to every position."""
        fc1, act, fc2 = self.net
        # On (tokens, D): a 3-D Linear output is a view, and an in-place op on a view costs
        # autograd a copy of the whole base in backward (CopySlices).
        hidden = act(fc1(x.reshape(-1, x.shape[-1])))
        return fc2(hidden).view(*x.shape[:-1], fc2.out_features)


class TransformerBlock(nn.Module):
    """One layer; subclasses fix the norm placement. Build with :func:`build_block`."""

    def __init__(
        self,
        dim: int,
        heads: int,
        *,
        position: PositionName = "xl",
        gate: GateName = "gru",
        sublayer_activation: SublayerActivation = "relu",
        ff_mult: int = 4,
        ff_activation: FFActivation = "gelu",
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        gate_bias: float = 2.0,
        kernel: Kernel = "sdpa",
        shaw_max_distance: int = 16,
    ) -> None:
        super().__init__()
        check_choice("sublayer activation", sublayer_activation, ACTIVATIONS)
        scheme = build_attention_position(position, dim, heads, shaw_max_distance=shaw_max_distance)
        self.attn = MultiHeadAttention(dim, heads, scheme, dropout=attn_dropout, kernel=kernel)
        self.mlp = FeedForward(dim, ff_mult * dim, ff_activation)
        self.gate1 = build_gate(gate, dim, gate_bias=gate_bias)
        self.gate2 = build_gate(gate, dim, gate_bias=gate_bias)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.drop = Dropout(dropout) if dropout > 0 else nn.Identity()
        self.act = nn.ReLU() if sublayer_activation == "relu" else nn.Identity()

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys/values (B, H, M, D/H) of stored layer inputs ``memory`` (B, M, D)."""
        raise NotImplementedError  # pragma: no cover - defined by the placements below

    def forward(
        self,
        x: Tensor,
        memory_kv: tuple[Tensor, Tensor] | None = None,
        mask: Tensor | None = None,
        *,
        queries: slice | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """x (B, L, D) -> (B, L, D) and the current (k, v); memory as in MultiHeadAttention.

        ``queries`` keeps only those positions of the output (B, L', D): all tokens are keys,
        the rest of the block runs on the kept ones (see MultiHeadAttention)."""
        raise NotImplementedError  # pragma: no cover

    def step(
        self, x: Tensor, window_k: Tensor, window_v: Tensor, mask: Tensor, context: Any = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One acting step x (N, D) -> (N, D) over the cached window, plus this step's key and
        value (see :meth:`MultiHeadAttention.step`); the same math as ``forward`` with L = 1."""
        raise NotImplementedError  # pragma: no cover


class PreNormBlock(TransformerBlock):
    """Identity-map reordering: LayerNorm inside the branch, gate on the stream."""

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Normalise the memory like the current tokens, then project."""
        return self.attn.project_kv(self.norm1(memory))

    def forward(
        self,
        x: Tensor,
        memory_kv: tuple[Tensor, Tensor] | None = None,
        mask: Tensor | None = None,
        *,
        queries: slice | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Gated attention then gated MLP, each on a normalised copy of the stream."""
        a, kv = self.attn(self.norm1(x), memory_kv, mask, queries=queries)
        if queries is not None:
            x = x[:, queries]
        x = self.gate1(x, self.act(self.drop(a)))
        m = self.mlp(self.norm2(x))
        return self.gate2(x, self.act(self.drop(m))), kv

    def step(
        self, x: Tensor, window_k: Tensor, window_v: Tensor, mask: Tensor, context: Any = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Gated attention then gated MLP for one step of N envs."""
        a, k, v = self.attn.step(self.norm1(x), window_k, window_v, mask, context)
        x = self.gate1(x, self.act(self.drop(a)))
        return self.gate2(x, self.act(self.drop(self.mlp(self.norm2(x))))), k, v


class PostNormBlock(TransformerBlock):
    """Vanilla placement: LayerNorm after each gated sum."""

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Project the memory as stored (it is already a normalised layer output)."""
        return self.attn.project_kv(memory)

    def forward(
        self,
        x: Tensor,
        memory_kv: tuple[Tensor, Tensor] | None = None,
        mask: Tensor | None = None,
        *,
        queries: slice | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Attention and MLP sub-layers, each followed by gate and LayerNorm."""
        a, kv = self.attn(x, memory_kv, mask, queries=queries)
        if queries is not None:
            x = x[:, queries]
        x = self.norm1(self.gate1(x, self.act(self.drop(a))))
        m = self.mlp(x)
        return self.norm2(self.gate2(x, self.act(self.drop(m)))), kv

    def step(
        self, x: Tensor, window_k: Tensor, window_v: Tensor, mask: Tensor, context: Any = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Attention and MLP sub-layers for one step of N envs."""
        a, k, v = self.attn.step(x, window_k, window_v, mask, context)
        x = self.norm1(self.gate1(x, self.act(self.drop(a))))
        return self.norm2(self.gate2(x, self.act(self.drop(self.mlp(x))))), k, v


def build_block(dim: int, heads: int, *, norm: NormPlacement = "pre", **kwargs) -> TransformerBlock:
    """A TransformerBlock with the given norm placement; kwargs as TransformerBlock."""
    check_choice("norm placement", norm, NORMS)
    cls = PreNormBlock if norm == "pre" else PostNormBlock
    return cls(dim, heads, **kwargs)
