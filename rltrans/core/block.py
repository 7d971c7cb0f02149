"""BlockConfig and TransformerBlock: norm placement + attention + gate + MLP + gate.

Two placements, picked once at build time (Parisotto et al. 2019, figure 1):

* ``post`` (vanilla Transformer / TrXL): x = LN(gate(x, Attn(x))), x = LN(gate(x, MLP(x)));
* ``pre`` (identity-map reordering, TrXL-I / GTrXL / GPT-2): x = gate(x, act(Attn(LN(x)))),
  x = gate(x, act(MLP(LN(x)))), leaving an identity path from input to output.
  ``sublayer_activation="relu"`` is the ReLU that TrXL-I and GTrXL apply to each
  sub-module output before the gate; GPT-2 style stacks use ``"none"``.

Memory enters as keys/values: with pre-norm the memory tokens are normalised
by the same LayerNorm as the current ones before projection
(:meth:`TransformerBlock.memory_kv`).

Every transformer option lives in one frozen :class:`BlockConfig`, passed whole to the
block and to every stack built from blocks (as nanoGPT passes its ``GPTConfig``), so the
options are declared and validated in one place.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, get_args, get_origin, get_type_hints

from torch import Tensor, nn

from rltrans.choices import check_choice
from rltrans.core.attention import Kernel, MultiHeadAttention
from rltrans.core.dropout import Dropout
from rltrans.core.gates import GateName, build_gate
from rltrans.core.long_memory import FIRST_SCALE, LongMemoryName, LongState, build_long_memory
from rltrans.core.position import PositionName, build_attention_position
from rltrans.core.span import AdaptiveSpan

NormPlacement = Literal["pre", "post"]
LongInput = tuple[LongState, "Tensor | None"]  # a long memory's state and the episode starts
NORMS: tuple[str, ...] = get_args(NormPlacement)
SublayerActivation = Literal["relu", "none"]
ACTIVATIONS: tuple[str, ...] = get_args(SublayerActivation)
FFActivation = Literal["gelu", "relu"]
FF_ACTIVATIONS: tuple[str, ...] = get_args(FFActivation)

# How a bad choice is named in errors, per BlockConfig field (the field name is added).
CHOICE_LABELS: dict[str, str] = {
    "position": "position scheme",
    "gate": "gate",
    "norm": "norm placement",
    "sublayer_activation": "sublayer activation",
    "ff_activation": "feed-forward activation",
    "kernel": "attention kernel",
    "long_memory": "long memory",
}


@dataclass(frozen=True)
class BlockConfig:
    """The options of a transformer block and of the stacks built from it, validated once.

    dim, heads: model width D and attention heads H (D divisible by H). position: the
    position scheme (absolute ones are added at a stack's input, relative ones act inside
    attention; :mod:`rltrans.core.position`). gate, gate_bias: how each sub-layer joins the
    stream (:mod:`rltrans.core.gates`). norm, sublayer_activation: the placement above.
    ff_mult, ff_activation: MLP width ff_mult * D and its activation. dropout: on each
    sub-layer output; attn_dropout: on the attention weights. kernel: ``sdpa`` or ``math``.
    shaw_max_distance: the clip distance of ``shaw``. max_len: the positions a ``learned``
    table holds. causal: whether a stack's queries see only earlier keys. long_memory: what
    the attention sub-layer reads beyond its window (:mod:`rltrans.core.long_memory`);
    compressed_slots, compression_rate: the ``compressive`` kind's Mc slots and its rate c.
    retention_scale: the slowest head's initial time scale in steps for ``linear``, ``delta``
    and ``additive`` (None: 16 x 8^(H-1)).
    adaptive_span, span_ramp: a learned attention span per head with a soft ramp of R steps
    (:mod:`rltrans.core.span`).

    >>> BlockConfig(dim=64, heads=4, gate="residual").norm
    'pre'
    >>> BlockConfig(dim=64, heads=4, norm="middle")
    Traceback (most recent call last):
    ...
    ValueError: BlockConfig.norm: unknown norm placement 'middle'; valid choices: pre, post
    """

    dim: int
    heads: int
    position: PositionName = "xl"
    gate: GateName = "gru"
    norm: NormPlacement = "pre"
    sublayer_activation: SublayerActivation = "relu"
    ff_mult: int = 4
    ff_activation: FFActivation = "gelu"
    dropout: float = 0.0
    attn_dropout: float = 0.0
    gate_bias: float = 2.0
    kernel: Kernel = "sdpa"
    shaw_max_distance: int = 16
    max_len: int = 1024
    causal: bool = True
    long_memory: LongMemoryName = "none"
    compressed_slots: int = 32
    compression_rate: int = 16
    retention_scale: int | None = None
    adaptive_span: bool = False
    span_ramp: int = 16

    def __post_init__(self) -> None:
        for name, valid in block_choices().items():
            value = getattr(self, name)
            if value not in valid:
                raise ValueError(
                    f"BlockConfig.{name}: unknown {CHOICE_LABELS.get(name, name)} {value!r}; "
                    f"valid choices: {', '.join(valid)}"
                )
        positive = ("dim", "heads", "ff_mult", "shaw_max_distance", "max_len")
        for name in (*positive, "compressed_slots", "compression_rate", "span_ramp"):
            if getattr(self, name) < 1:
                raise ValueError(f"BlockConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.dim % self.heads:
            raise ValueError(
                f"BlockConfig.dim={self.dim} must be divisible by BlockConfig.heads={self.heads}"
            )
        if self.retention_scale is not None and self.retention_scale < FIRST_SCALE:
            raise ValueError(
                f"BlockConfig.retention_scale must be >= {FIRST_SCALE:g} steps or None, got "
                f"{self.retention_scale}"
            )
        for name in ("dropout", "attn_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"BlockConfig.{name} must be in [0, 1), got {getattr(self, name)}")

    def replace(self, **changes: Any) -> BlockConfig:
        """A copy with some options changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def split(cls, options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Split keyword options into BlockConfig fields and the rest."""
        names = {f.name for f in dataclasses.fields(cls)}
        ours = {k: v for k, v in options.items() if k in names}
        return ours, {k: v for k, v in options.items() if k not in names}


@functools.cache
def block_choices() -> dict[str, tuple[str, ...]]:
    """The valid values of every ``Literal`` field of BlockConfig, read from its annotations."""
    hints = get_type_hints(BlockConfig)
    return {name: get_args(t) for name, t in hints.items() if get_origin(t) is Literal}


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


class Placement(NamedTuple):
    """Where a block's two LayerNorms act, picked once at build time: on each sub-layer's
    input (``pre``) or on each gated sum (``post``); the other slots are the identity."""

    attn_in: nn.Module
    attn_out: nn.Module
    mlp_in: nn.Module
    mlp_out: nn.Module

    @classmethod
    def of(cls, norm: NormPlacement, norm1: nn.Module, norm2: nn.Module) -> Placement:
        """The slots of placement ``norm`` for the block's LayerNorms norm1 and norm2."""
        keep = nn.Identity()
        if norm == "pre":
            return cls(norm1, keep, norm2, keep)
        return cls(keep, norm1, keep, norm2)


class TransformerBlock(nn.Module):
    """One layer: attention then MLP, each joined to the stream by a gate, with the norm
    placement of its config (see the module docstring). Build with :func:`build_block`."""

    def __init__(self, config: BlockConfig) -> None:
        super().__init__()
        c = config
        scheme = build_attention_position(
            c.position, c.dim, c.heads, shaw_max_distance=c.shaw_max_distance
        )
        self.attn = MultiHeadAttention(
            c.dim, c.heads, scheme, dropout=c.attn_dropout, kernel=c.kernel
        )
        self.mlp = FeedForward(c.dim, c.ff_mult * c.dim, c.ff_activation)
        self.gate1 = build_gate(c.gate, c.dim, gate_bias=c.gate_bias)
        self.gate2 = build_gate(c.gate, c.dim, gate_bias=c.gate_bias)
        self.norm1 = nn.LayerNorm(c.dim)
        self.norm2 = nn.LayerNorm(c.dim)
        # A plain tuple, not submodules: norm1 and norm2 keep their one name in a state_dict.
        self.norm, self.placement = c.norm, Placement.of(c.norm, self.norm1, self.norm2)
        self.drop = Dropout(c.dropout) if c.dropout > 0 else nn.Identity()
        self.act = nn.ReLU() if c.sublayer_activation == "relu" else nn.Identity()
        self.long = build_long_memory(
            c.long_memory,
            c.dim,
            c.heads,
            slots=c.compressed_slots,
            rate=c.compression_rate,
            longest=c.retention_scale,
        )
        self.span = AdaptiveSpan(c.heads, c.span_ramp) if c.adaptive_span else None

    def attend(
        self,
        x: Tensor,
        memory_kv: tuple[Tensor, Tensor] | None,
        mask: Tensor | None,
        queries: slice | None,
        long: LongInput | None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor], LongState | None]:
        """The attention sub-layer on its input x (B, L, D): attention over the window plus,
        with a long memory, its read-out; returns the output, this segment's (k, v) and the
        long-memory state after the segment (None without one)."""
        a, kv = self.attn(x, memory_kv, mask, queries=queries)
        if self.long is None:
            return a, kv, None
        state, starts = long
        read, state = self.long(x, state, starts)
        return a + (read if queries is None else read[:, queries]), kv, state

    def attend_step(
        self,
        x: Tensor,
        window_k: Tensor,
        window_v: Tensor,
        mask: Tensor,
        context: Any,
        long: LongState | None,
    ) -> tuple[Tensor, Tensor, Tensor, LongState | None]:
        """The attention sub-layer for one step of N envs (``attend`` with L = 1)."""
        a, k, v = self.attn.step(x, window_k, window_v, mask, context)
        if self.long is None:
            return a, k, v, None
        read, long = self.long.step(x, long)
        return a + read, k, v, long

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys/values (B, H, M, d) of stored layer inputs ``memory`` (B, M, D), normalised as
        the attention's input is (pre-norm) or as stored (post-norm: already a normalised
        layer output)."""
        return self.attn.project_kv(self.placement.attn_in(memory))

    def forward(
        self,
        x: Tensor,
        memory_kv: tuple[Tensor, Tensor] | None = None,
        mask: Tensor | None = None,
        *,
        queries: slice | None = None,
        long: LongInput | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor], LongState | None]:
        """x (B, L, D) -> (B, L, D), the current (k, v) and the long-memory state after the
        segment; memory as in MultiHeadAttention. ``long``: the long memory's state before the
        segment and the episode starts (B, L), for a block that has one.

        ``queries`` keeps only those positions of the output (B, L', D): all tokens are keys,
        the rest of the block runs on the kept ones (see MultiHeadAttention)."""
        attn_in, attn_out, mlp_in, mlp_out = self.placement
        a, kv, long_state = self.attend(attn_in(x), memory_kv, mask, queries, long)
        if queries is not None:
            x = x[:, queries]
        x = attn_out(self.gate1(x, self.act(self.drop(a))))
        m = self.mlp(mlp_in(x))
        return mlp_out(self.gate2(x, self.act(self.drop(m)))), kv, long_state

    def step(
        self,
        x: Tensor,
        window_k: Tensor,
        window_v: Tensor,
        mask: Tensor,
        context: Any = None,
        long: LongState | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, LongState | None]:
        """One acting step x (N, D) -> (N, D) over the cached window, plus this step's key and
        value (see :meth:`MultiHeadAttention.step`) and the long-memory state after it; the
        same math as ``forward`` with L = 1."""
        attn_in, attn_out, mlp_in, mlp_out = self.placement
        a, k, v, long = self.attend_step(attn_in(x), window_k, window_v, mask, context, long)
        x = attn_out(self.gate1(x, self.act(self.drop(a))))
        return mlp_out(self.gate2(x, self.act(self.drop(self.mlp(mlp_in(x)))))), k, v, long


def build_block(config: BlockConfig) -> TransformerBlock:
    """The TransformerBlock of ``config``, with its norm placement."""
    return TransformerBlock(config)
