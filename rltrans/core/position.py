"""Position schemes, chosen by name.

Absolute schemes (``sinusoidal``, ``learned``) add an embedding to the tokens
at the input of a stack (:func:`build_input_position`). Relative schemes act
inside every attention layer (:func:`build_attention_position`): each is a
small module that only prepares what its positions change, the queries and keys that enter
the scores (rotary, xl's u), a float bias (alibi, shaw, xl) and, for shaw, a term of the
attention weights added to the output. Their base class runs what they prepare through the
shared kernel :func:`rltrans.core.attention.attend` in one place, so every scheme is called
as ``scheme(q, k, v, mask=, dropout=, kernel=)`` and ``scheme.step(q, kv, ...)`` for acting.

Layout convention shared by all schemes: keys are ``[memory ; current]`` in
time order, S = M + L keys for L queries, so query i sits at global index
M + i and its distance to key j is (M + i) - j.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, get_args

import torch
from torch import Tensor, nn

from rltrans.choices import check_choice
from rltrans.core.attention import Kernel, StepKV, attend, attend_one

PositionName = Literal["none", "sinusoidal", "learned", "shaw", "xl", "rotary", "alibi"]
POSITIONS: tuple[str, ...] = get_args(PositionName)


def relative_distance(length: int, keys: int, device: torch.device | None = None) -> Tensor:
    """(L, S) matrix of query-minus-key distances (M + i) - j, with M = S - L."""
    q_pos = torch.arange(keys - length, keys, device=device).unsqueeze(1)  # (L, 1)
    k_pos = torch.arange(keys, device=device).unsqueeze(0)  # (1, S)
    return q_pos - k_pos


def descending_sinusoid_table(first: int, count: int, dim: int, device: torch.device) -> Tensor:
    """Sinusoid features of first, first - 1, ..., first - count + 1."""
    return sinusoid(torch.arange(first, first - count, -1, device=device), dim)


# The same, cached for eager code (a constant table); compiled graphs call the plain function.
descending_sinusoid = functools.lru_cache(maxsize=64)(descending_sinusoid_table)


def sinusoid(positions: Tensor, dim: int) -> Tensor:
    """Sinusoidal features [sin(p w), cos(p w)] with w_k = 10000^(-2k/dim) (Vaswani et al. 2017)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=positions.device) / dim))
    angles = positions.float().unsqueeze(-1) * inv_freq  # (..., dim/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (..., dim)


# ---------------------------------------------------------------- input (absolute) schemes


class SinusoidalPosition(nn.Module):
    """Fixed sinusoidal absolute position embedding added to the input tokens."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, positions: Tensor) -> Tensor:
        """positions (B, L) long -> (B, L, D)."""
        return sinusoid(positions, self.dim)


class LearnedPosition(nn.Module):
    """Learned absolute position embedding; positions beyond ``max_len - 1`` are clamped."""

    def __init__(self, dim: int, max_len: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, dim)
        nn.init.normal_(self.table.weight, std=0.02)

    def forward(self, positions: Tensor) -> Tensor:
        """positions (B, L) long -> (B, L, D)."""
        return self.table(positions.clamp(0, self.max_len - 1))


def build_input_position(name: PositionName, dim: int, *, max_len: int = 1024) -> nn.Module | None:
    """The input-level embedding for absolute schemes, None for relative ones."""
    check_choice("position scheme", name, POSITIONS)
    if name == "sinusoidal":
        return SinusoidalPosition(dim)
    if name == "learned":
        return LearnedPosition(dim, max_len)
    return None


# ---------------------------------------------------------------- attention-level schemes


class Prepared(NamedTuple):
    """What a scheme makes of a segment's heads for the kernel: the queries (B, H, L, d) and
    keys (B, H, S, d) that enter the scores, a float bias broadcastable to (B, H, L, S), and a
    term of the attention weights added to the output (``values`` of :func:`attend`)."""

    q: Tensor
    k: Tensor
    bias: Tensor | None = None
    values: Callable[[Tensor], Tensor] | None = None


class PreparedStep(NamedTuple):
    """What a scheme makes of one acting step for :func:`attend_one`: the query (N, H, d), the
    window and own keys/values, and a float bias broadcastable to (N, H, M+1)."""

    q: Tensor
    kv: StepKV
    bias: Tensor | None = None


class AttentionScheme(nn.Module):
    """Base of the attention-level schemes. A scheme only prepares what its positions change:
    ``prepare`` for a segment, ``prepare_step`` for one acting step (one query per env over
    [window ; itself]). ``forward`` and ``step``, defined here once, run what it prepares
    through the shared kernel. The base prepares nothing (no positional term inside attention).
    """

    def prepare(self, q: Tensor, k: Tensor) -> Prepared:
        """Queries q (B, H, L, d) and keys k (B, H, S, d) as they enter the scores."""
        return Prepared(q, k)

    def prepare_step(self, q: Tensor, kv: StepKV, context: Any) -> PreparedStep:
        """The query q (N, H, d) and ``kv`` of one acting step as they enter the scores."""
        return PreparedStep(q, kv)

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask: Tensor | None,
        dropout: float,
        kernel: Kernel,
    ) -> Tensor:
        """q (B, H, L, d), k/v (B, H, S, d) -> (B, H, L, d): the prepared heads attend."""
        p = self.prepare(q, k)
        return attend(
            p.q, p.k, v, mask=mask, bias=p.bias, dropout=dropout, kernel=kernel, values=p.values
        )

    def step(self, q: Tensor, kv: StepKV, *, mask: Tensor, context: Any, dropout: float) -> Tensor:
        """q (N, H, d) over [window ; itself] (``kv``), additive mask (N, 1 or H, M+1) ->
        (N, H, d): the prepared step attends."""
        p = self.prepare_step(q, kv, context)
        return attend_one(p.q, p.kv, mask=mask, bias=p.bias, dropout=dropout)

    def step_context(self, window: int, device: torch.device, dtype: torch.dtype) -> Any:
        """What ``step`` needs that depends on parameters and the window of M steps only, not
        on the inputs; None here. Computed when an acting state is created or refreshed after
        a weight update and carried in that state (an input of a compiled step, never a value
        cached inside a module)."""
        return None

    def crop_context(self, context: Any, window: int, keep: int) -> Any:
        """The ``step_context`` of a window of M = ``window`` steps cut to its last ``keep``
        steps (an adaptive span that reaches no farther); unchanged here."""
        return context


class PlainAttention(AttentionScheme):
    """No positional term inside attention (``none`` and the absolute schemes)."""


class RotaryAttention(AttentionScheme):
    """Rotary position embedding (Su et al. 2021, RoFormer): q and k are rotated by
    their positions so q_i . k_j depends only on i - j. Keys are rotated by their
    position in the window, so a key cache can hold un-rotated keys."""

    def __init__(self, head_dim: int, base: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary position needs an even head dimension, got {head_dim}")
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def angles(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin of positions (N,) times the frequencies: (N, d/2) each."""
        angles = positions.to(self.inv_freq.dtype).unsqueeze(1) * self.inv_freq  # (N, d/2)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate x (B, H, N, d) by positions (N,), pairing the halves of d (GPT-NeoX layout)."""
        return rotate_halves(x, *self.angles(positions, x.dtype))

    def step_context(
        self, window: int, device: torch.device, dtype: torch.dtype
    ) -> tuple[Tensor, Tensor]:
        """cos and sin of positions 0..M (the window, then the step itself)."""
        return self.angles(torch.arange(window + 1, device=device), dtype)

    def crop_context(
        self, context: tuple[Tensor, Tensor], window: int, keep: int
    ) -> tuple[Tensor, Tensor]:
        """Positions 0..K: only distances matter, so a window of K steps starts at 0 again."""
        return context[0][: keep + 1], context[1][: keep + 1]

    def prepare_step(self, q: Tensor, kv: StepKV, context: tuple[Tensor, Tensor]) -> PreparedStep:
        """Rotate the window keys by 0..M-1 and the query and own key by M (the window is
        rotated into a new tensor: the cache holds un-rotated keys)."""
        cos, sin = context
        m = kv.window_k.shape[2]
        window_k = rotate_halves(kv.window_k, cos[:m], sin[:m])
        q, k = rotate_halves(torch.stack([q, kv.k], dim=2), cos[m:], sin[m:]).unbind(2)
        return PreparedStep(q, StepKV(window_k, kv.window_v, k, kv.v))

    def prepare(self, q: Tensor, k: Tensor) -> Prepared:
        """Rotate queries (positions M..S-1) and keys (0..S-1)."""
        length, keys = q.shape[2], k.shape[2]
        positions = torch.arange(keys, device=q.device)
        return Prepared(self.rotate(q, positions[keys - length :]), self.rotate(k, positions))


def rotate_halves(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (..., N, d) pairwise, element i with i + d/2, by angles with cos/sin (N, d/2)."""
    x1, x2 = x.chunk(2, dim=-1)  # (..., N, d/2) each
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def alibi_slopes(heads: int) -> Tensor:
    """Per-head slopes of ALiBi (Press et al. 2022, section 3): a geometric sequence
    starting at 2^(-8/n); for a non-power-of-two head count, the slopes of the
    closest power of two plus every other slope of the next one."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(heads).is_integer():
        return torch.tensor(power_of_two(heads))
    closest = 2 ** math.floor(math.log2(heads))
    extra = power_of_two(2 * closest)[0::2][: heads - closest]
    return torch.tensor(power_of_two(closest) + extra)


class ALiBiAttention(AttentionScheme):
    """Attention with linear biases (Press et al. 2022): score -= slope_h * |i - j|."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(heads).view(heads, 1, 1), persistent=False)

    def prepare(self, q: Tensor, k: Tensor) -> Prepared:
        """The distance penalty as a float bias."""
        distance = relative_distance(q.shape[2], k.shape[2], q.device).abs()  # (L, S)
        return Prepared(q, k, bias=(-self.slopes * distance).to(q.dtype))  # bias (H, L, S)

    def prepare_step(self, q: Tensor, kv: StepKV, context: Any) -> PreparedStep:
        """Single query at distance M-j from window key j (0 from itself)."""
        distance = torch.arange(kv.window_k.shape[2], -1, -1, device=q.device)  # (M+1,)
        return PreparedStep(q, kv, bias=(-self.slopes[:, 0] * distance).to(q.dtype))  # (H, M+1)


class ShawAttention(AttentionScheme):
    """Relative position representations of Shaw et al. (2018): learned vectors
    a^K and a^V for distances clipped to [-max_distance, max_distance], added to
    the keys (eq. 4) and to the values (eq. 3), shared across heads.

    Neither term materialises an (L, S, d) tensor: the key term is q @ a^K^T over
    the 2C+1 distinct distances, gathered to (L, S) as a bias; the value term sums the
    attention weights per distance bucket (scatter-add) and multiplies by a^V. The value
    term needs the weights, so this scheme always runs the reference math (SDPA does not
    return them), and an acting step is the segment path with L = 1.
    """

    def __init__(self, head_dim: int, max_distance: int = 16) -> None:
        super().__init__()
        if max_distance < 1:
            raise ValueError(f"shaw max_distance must be >= 1, got {max_distance}")
        self.max_distance = max_distance
        self.rel_k = nn.Embedding(2 * max_distance + 1, head_dim)
        self.rel_v = nn.Embedding(2 * max_distance + 1, head_dim)
        nn.init.normal_(self.rel_k.weight, std=0.02)
        nn.init.normal_(self.rel_v.weight, std=0.02)

    def bucket(self, length: int, keys: int, device: torch.device) -> Tensor:
        """(L, S) index of clip(distance) into the 2C+1 tables."""
        c = self.max_distance
        return relative_distance(length, keys, device).clamp(-c, c) + c

    def prepare(self, q: Tensor, k: Tensor) -> Prepared:
        """The clipped relative key term as a bias, and the value term with its buckets."""
        b, h, length, d = q.shape
        idx = self.bucket(length, k.shape[2], q.device).expand(b, h, -1, -1)  # (B, H, L, S)
        key_term = (q @ self.rel_k.weight.t()).gather(-1, idx)  # (B, H, L, S)
        values = functools.partial(self.relative_values, idx)
        return Prepared(q, k, bias=key_term / math.sqrt(d), values=values)

    def relative_values(self, idx: Tensor, probs: Tensor) -> Tensor:
        """Eq. 3's a^V term of the weights probs (B, H, L, S) in buckets idx: (B, H, L, d)."""
        per_bucket = probs.new_zeros(*probs.shape[:-1], self.rel_v.num_embeddings)
        per_bucket = per_bucket.scatter_add(-1, idx, probs)  # (B, H, L, 2C+1)
        return per_bucket @ self.rel_v.weight

    def step(self, q: Tensor, kv: StepKV, *, mask: Tensor, context: Any, dropout: float) -> Tensor:
        """The segment path with L = 1 over [window ; itself] (copied: reference math)."""
        k, v = kv.full()
        out = self(q.unsqueeze(2), k, v, mask=mask.unsqueeze(-2), dropout=dropout, kernel="math")
        return out.squeeze(2)


class XLAttention(AttentionScheme):
    """Transformer-XL relative attention (Dai et al. 2019, section 3.3).

    score_ij = (q_i + u) . k_j  +  (q_i + v) . W_kR R_{i-j}      [terms (a)+(c), (b)+(d)]

    with R a fixed sinusoid of the distance, W_kR a projection separate from the
    key projection, and u, v learned global biases. Terms (b)+(d) are computed
    for every distance once, (L, W) with W = S + L, then aligned to (L, S) with
    the O(L) "shift": a strided view of the flat buffer (appendix B), no gather
    and no (L, S, d) tensor. The result enters the shared kernel as a float bias,
    so the SDPA path stays available.
    """

    # True while rltrans.accel traces a compiled program: no Python-side cache of the table.
    static_graph = False

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.r_proj = nn.Linear(dim, dim, bias=False)  # W_kR
        self.u = nn.Parameter(torch.zeros(heads, 1, self.head_dim))
        self.v = nn.Parameter(torch.zeros(heads, 1, self.head_dim))

    def relative_keys(self, keys: int, length: int, device: torch.device) -> Tensor:
        """W_kR R for distances S-1, S-2, ..., -L (descending): (H, W, d), W = S + L."""
        # The table is a constant: cached in eager calls, computed in place in a compiled
        # graph (no lru_cache there).
        table_of = descending_sinusoid_table if self.static_graph else descending_sinusoid
        table = table_of(keys - 1, keys + length, self.dim, device)  # (W, D)
        r = self.r_proj(table.to(self.r_proj.weight.dtype))  # (W, D)
        return r.view(-1, self.heads, self.head_dim).transpose(0, 1)  # (H, W, d)

    @staticmethod
    def shift(bd: Tensor, keys: int) -> Tensor:
        """Align (B, H, L, W) scores over descending distances to (B, H, L, S).

        Column c of row i holds distance S-1-c; we need distance (S-L+i)-j at
        (i, j), i.e. column L-1-i+j. In the flat buffer that element sits at
        L-1 + i*(W-1) + j, so a view with row stride W-1 starting at L-1 picks it.
        """
        b, h, length, width = bd.shape
        flat = bd.reshape(b, h, length * width)
        start = length - 1
        rows = flat[..., start : start + length * (width - 1)]
        return rows.reshape(b, h, length, width - 1)[..., :keys]

    def prepare(self, q: Tensor, k: Tensor) -> Prepared:
        """The relative term (b)+(d) as a bias, and (q + u) as the queries of (a)+(c)."""
        length, keys = q.shape[2], k.shape[2]
        b, h, _, d = q.shape
        r = self.relative_keys(keys, length, q.device).to(q.dtype)  # (H, W, d)
        # Heads as the batch of one bmm (broadcasting r over B would copy it B times), and the
        # shift applied in that (H, B, L, W) layout, so the (L, S) bias is never copied.
        qv = ((q + self.v) * (1.0 / math.sqrt(d))).transpose(0, 1).reshape(h, b * length, d)
        bd = torch.bmm(qv, r.transpose(1, 2)).view(h, b, length, -1)  # (H, B, L, W)
        bias = self.shift(bd, keys).transpose(0, 1)  # (B, H, L, S), a view
        return Prepared(q + self.u, k, bias=bias)

    def step_context(self, window: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """W_kR R for distances M, M-1, ..., 0: (H, M+1, d). It depends on W_kR alone, so the
        acting state carries it (built with the state and at every refresh) instead of every
        step recomputing a (M+1, D) x (D, D) matmul per layer."""
        return self.relative_keys(window + 1, 1, device)[:, : window + 1].to(dtype)

    def crop_context(self, context: Tensor, window: int, keep: int) -> Tensor:
        """The columns of distances K .. 0 (the table descends from M)."""
        return context[:, window - keep :]

    def prepare_step(self, q: Tensor, kv: StepKV, context: Tensor) -> PreparedStep:
        """Single query: window key j sits at distance M-j and the own key at 0, i.e. column j
        of the descending table ``context``, so no shift is needed; the (b)+(d) term is one
        bmm with heads as its batch."""
        _, h, d = q.shape
        qv = ((q + self.v.view(h, d)) * (1.0 / math.sqrt(d))).transpose(0, 1)  # (H, N, d)
        bias = torch.bmm(qv, context.transpose(1, 2)).transpose(0, 1)  # (N, H, M+1), a view
        return PreparedStep(q + self.u.view(h, d), kv, bias=bias)


def build_attention_position(
    name: PositionName,
    dim: int,
    heads: int,
    *,
    shaw_max_distance: int = 16,
) -> AttentionScheme:
    """The per-layer attention scheme for a position name."""
    check_choice("position scheme", name, POSITIONS)
    head_dim = dim // heads
    if name == "rotary":
        return RotaryAttention(head_dim)
    if name == "alibi":
        return ALiBiAttention(heads)
    if name == "shaw":
        return ShawAttention(head_dim, shaw_max_distance)
    if name == "xl":
        return XLAttention(dim, heads)
    return PlainAttention()
