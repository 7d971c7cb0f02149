"""The one attention kernel of rltrans, its masks, and multi-head attention.

Every model family (GTrXL, the Decision Transformer stack, the Universal
Transformer) attends through :func:`attend` (:func:`attend_one` for an acting step); a
position scheme (:mod:`rltrans.core.position`) only prepares the queries, keys and bias that
enter it, and never re-implements the softmax. The kernel switch is one named option:

* ``"sdpa"``: :func:`torch.nn.functional.scaled_dot_product_attention`
  (flash / memory-efficient kernels where the inputs allow),
* ``"math"``: the reference formula softmax(q k^T / sqrt(d) + bias) v (d = D/H, the head width),
  written out so tests can check the fast path against it.

Masks are boolean, ``True`` meaning "may attend". Builders here always leave
the diagonal (a query's own key) visible, so no row is ever fully masked and
-inf never turns into NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rltrans.choices import check_choice
from rltrans.core.dropout import dropout as drop_out

Kernel = Literal["sdpa", "math"]
KERNELS: tuple[str, ...] = get_args(Kernel)


def mask_to_bias(mask: Tensor | None, bias: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """Fold a mask (boolean, or already additive) into an additive float bias."""
    if mask is None:
        return bias
    if mask.is_floating_point():
        return mask if bias is None else bias + mask
    if bias is None:
        bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return bias.masked_fill(~mask, float("-inf"))


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    dropout: float = 0.0,
    kernel: Kernel = "sdpa",
    values: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """Scaled dot-product attention, the single kernel every rltrans model uses.

    q: (B, H, L, d); k, v: (B, H, S, d); mask: bool broadcastable to (B, H, L, S),
    True = may attend (or the same as an additive float mask, 0 / -inf, which saves
    re-inverting a mask shared by many layers); bias: float broadcastable to
    (B, H, L, S), added to the scores. Scores are scaled by 1/sqrt(d), d being the head dimension
    (Vaswani et al. 2017, eq. 1), not the model width. values: a term of the attention weights
    (B, H, L, S) -> (B, H, L, d) added to the output (Shaw et al. 2018's relative values); it
    needs the weights, which SDPA does not return, so it always runs the reference math.

    >>> q = k = v = torch.randn(2, 4, 8, 16)
    >>> attend(q, k, v).shape
    torch.Size([2, 4, 8, 16])
    """
    if mask is not None and mask.is_floating_point() and mask.dtype != q.dtype:
        mask = mask.to(q.dtype)  # an additive mask (e.g. an adaptive span's) under autocast
    if kernel == "sdpa" and values is None and use_sdpa(q, bias, dropout, mask):
        # SDPA accepts either a boolean mask or one float bias: fold them when both are given.
        attn_mask = mask if bias is None else mask_to_bias(mask, bias, q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout)
    probs = drop_out(attention_probs(q, k, mask=mask, bias=bias), dropout)
    out = probs @ v  # (B, H, L, d)
    return out if values is None else out + values(probs)


def use_sdpa(q: Tensor, bias: Tensor | None, dropout: float, mask: Tensor | None = None) -> bool:
    """Whether SDPA beats the reference math for this call (CPU: benchmarks/attention.py).

    Not for a bias or an additive mask that needs a gradient (xl's relative term and an
    adaptive span in training: SDPA's unfused fallback is slower than the math below), a
    single query (an acting step: one row of scores is cheaper than SDPA's setup), or
    dropout on CPU (SDPA's CPU path then draws its mask with ``bernoulli_``, 3x the cost of
    :func:`rltrans.core.dropout.dropout`).
    """
    if any(t is not None and t.requires_grad for t in (bias, mask)):
        return False
    if q.shape[-2] == 1:
        return False
    return not (dropout > 0.0 and q.device.type == "cpu")


class StepKV(NamedTuple):
    """What one acting step attends over: the cached window of the last M steps (N, H, M, d
    each, views of the ring buffer, never copied) and the step's own key and value (N, H, d)."""

    window_k: Tensor
    window_v: Tensor
    k: Tensor
    v: Tensor

    def full(self) -> tuple[Tensor, Tensor]:
        """[window ; own] keys and values, (N, H, M+1, d) each (copies: for reference paths)."""
        keys = torch.cat([self.window_k, self.k.unsqueeze(2)], dim=2)
        return keys, torch.cat([self.window_v, self.v.unsqueeze(2)], dim=2)


def attend_one(
    q: Tensor,
    kv: StepKV,
    *,
    mask: Tensor,
    bias: Tensor | None = None,
    dropout: float = 0.0,
) -> Tensor:
    """Attention of one query per (env, head) over [window ; itself], the kernel of an acting
    step: q (N, H, d) -> (N, H, d).

    mask: additive (N, 1, M+1) (0 / -inf), the last column the query's own key; bias: float
    broadcastable to (N, H, M+1), added to the scaled scores. The same math as :func:`attend`
    with L = 1 over the concatenated keys, but the window is read in place (two bmm over N*H
    rows) and the own key enters as one extra score column: no (N, H, M+1, d) copy, and no
    in-place write, so the step is a pure function that ``torch.compile`` can take whole.
    """
    n, h, d = q.shape
    m = kv.window_k.shape[2]
    q = q * (1.0 / math.sqrt(d))
    window = torch.bmm(q.view(n * h, 1, d), kv.window_k.reshape(n * h, m, d).transpose(1, 2))
    own = (q * kv.k).sum(dim=-1, keepdim=True)  # (N, H, 1)
    scores = torch.cat([window.view(n, h, m), own], dim=-1)  # (N, H, M+1)
    if bias is not None:
        scores += bias
    scores += mask
    probs = drop_out(scores.softmax(dim=-1), dropout)
    out = (probs[..., m:] * kv.v).view(n * h, 1, d)  # the own value's share
    out = torch.baddbmm(out, probs[..., :m].reshape(n * h, 1, m), kv.window_v.reshape(n * h, m, d))
    return out.view(n, h, d)


def attention_probs(
    q: Tensor, k: Tensor, *, mask: Tensor | None = None, bias: Tensor | None = None
) -> Tensor:
    """Reference attention weights softmax(q k^T / sqrt(d) + bias), masked: (B, H, L, S)."""
    # Scale the small q, not the (L, S) scores; then add and mask in place: every full-size
    # pass over (B, H, L, S) costs as much as a matmul here, so there are as few as possible.
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)  # (B, H, L, S)
    if bias is not None:
        scores += bias
    if mask is not None and mask.is_floating_point():
        scores += mask
    elif mask is not None:
        scores.masked_fill_(~mask, float("-inf"))
    return scores.softmax(dim=-1)


def sequence_mask(
    length: int,
    memory: int = 0,
    *,
    window: int | None = None,
    causal: bool = True,
    memory_valid: Tensor | None = None,
    starts: Tensor | None = None,
    key_padding: Tensor | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Boolean attention mask for L queries over S = M + L keys ``[memory ; current]``.

    Query i (global index M + i) may see key j when all of these hold:

    * ``causal``: j <= M + i;
    * ``window``: (M + i) - j <= window (the last ``window`` steps plus itself;
      rltrans uses window = M so chunked-with-memory equals whole-sequence);
    * ``memory_valid`` (B, M): a memory slot is visible only if valid (it holds
      a step of the current episode of that sequence);
    * ``starts`` (B, L): True where a new episode begins at that step; a query
      then sees neither memory nor keys from before its episode start;
    * ``key_padding`` (B, S): True where a key is real (False = padding).

    The diagonal is always visible. Returns (B or 1, 1, L, S), ready to
    broadcast over heads.
    """
    total = memory + length
    q_idx = torch.arange(memory, total, device=device).unsqueeze(1)  # (L, 1) global query index
    k_idx = torch.arange(total, device=device).unsqueeze(0)  # (1, S)
    allowed = torch.ones(length, total, dtype=torch.bool, device=device)
    if causal:
        allowed = allowed & (k_idx <= q_idx)
    if window is not None:
        allowed = allowed & (q_idx - k_idx <= window) & (k_idx - q_idx <= window)
    allowed = allowed.unsqueeze(0)  # (1, L, S)

    if starts is not None or memory_valid is not None:
        batch = (starts if starts is not None else memory_valid).shape[0]
        if starts is not None:
            # Episode index of each step: memory is episode 0, every start opens a new one.
            episode = torch.cumsum(starts.long(), dim=1)  # (B, L)
            key_episode = torch.cat([episode.new_zeros(batch, memory), episode], dim=1)  # (B, S)
            same = episode.unsqueeze(2) == key_episode.unsqueeze(1)  # (B, L, S)
        else:
            same = torch.ones(batch, length, total, dtype=torch.bool, device=device)
        if memory_valid is not None:
            valid = torch.cat(
                [memory_valid.bool(), memory_valid.new_ones(batch, length, dtype=torch.bool)], dim=1
            )  # (B, S)
            same = same & valid.unsqueeze(1)
        allowed = allowed & same
    if key_padding is not None:
        allowed = allowed & key_padding.bool().unsqueeze(1)  # (B, 1, S)
    # A query always sees itself: no fully masked row, so no NaN from softmax over -inf.
    diagonal = q_idx == k_idx  # (L, S)
    return (allowed | diagonal).unsqueeze(1)  # (B|1, 1, L, S)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with queries from the current tokens and keys/values from
    ``[memory ; current]``; positional information comes from a pluggable scheme.

    The scheme object (see :func:`rltrans.core.position.build_attention_position`)
    receives the projected heads, prepares the queries, keys and bias its positions need and
    runs them through :func:`attend` in one place (its base class), so every scheme shares
    one kernel. ``project_kv`` is exposed so acting can cache memory keys/values.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        scheme: nn.Module,
        *,
        dropout: float = 0.0,
        kernel: Kernel = "sdpa",
        bias: bool = True,
    ) -> None:
        super().__init__()
        if dim % heads != 0:
            raise ValueError(f"dim={dim} must be divisible by heads={heads}")
        self.heads, self.head_dim = heads, dim // heads
        self.kernel = check_choice("attention kernel", kernel, KERNELS)
        self.dim, self.dropout = dim, dropout
        # One [W_q ; W_k ; W_v] matmul for the current tokens; memory tokens use the k/v rows only.
        self.qkv_proj = nn.Linear(dim, 3 * dim, bias=bias)
        self.out_proj = nn.Linear(dim, dim, bias=bias)
        self.scheme = scheme

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, L, D) -> (B, H, L, d)."""
        b, n, _ = x.shape
        return x.view(b, n, self.heads, self.head_dim).transpose(1, 2)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of tokens x (B, S, D), each (B, H, S, d)."""
        bias = self.qkv_proj.bias[self.dim :] if self.qkv_proj.bias is not None else None
        k, v = F.linear(x, self.qkv_proj.weight[self.dim :], bias).chunk(2, dim=-1)
        return self.split_heads(k), self.split_heads(v)

    def forward(
        self,
        x: Tensor,
        memory_kv: tuple[Tensor, Tensor] | None = None,
        mask: Tensor | None = None,
        *,
        queries: slice | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Attend from x (B, L, D) over ``[memory ; x]``.

        memory_kv: keys and values of the memory tokens, (B, H, M, d) each,
        already projected (training projects the stored hidden states); they are
        concatenated with the current tokens' keys/values. queries: only these tokens
        of x ask (every token is still a key): for schemes where a query's position does
        not enter the scores (``none`` and the absolute ones), with ``mask`` already cut to
        the same rows. Returns the output (B, L or L', D) and the current tokens' own (k, v).
        """
        b, _, dim = x.shape
        if queries is None:
            q, k_cur, v_cur = (self.split_heads(t) for t in self.qkv_proj(x).chunk(3, dim=-1))
        else:
            k_cur, v_cur = self.project_kv(x)
            bias = self.qkv_proj.bias[:dim] if self.qkv_proj.bias is not None else None
            q = self.split_heads(F.linear(x[:, queries], self.qkv_proj.weight[:dim], bias))
        length = q.shape[2]
        if memory_kv is not None:
            k = torch.cat([memory_kv[0], k_cur], dim=2)  # (B, H, M+L, d)
            v = torch.cat([memory_kv[1], v_cur], dim=2)
        else:
            k, v = k_cur, v_cur
        drop = self.dropout if self.training else 0.0
        out = self.scheme(q, k, v, mask=mask, dropout=drop, kernel=self.kernel)  # (B, H, L, d)
        out = out.transpose(1, 2).reshape(b, length, dim)  # (B, L, D)
        return self.out_proj(out), (k_cur, v_cur)

    def step(
        self, x: Tensor, window_k: Tensor, window_v: Tensor, mask: Tensor, context: Any = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One acting step: x (N, D) attends over the cached window and itself.

        window_k, window_v: (N, H, M, d) keys/values of the last M steps (views of the
        cache); mask: additive (N, 1, M+1); context: the scheme's per-step constant (see
        ``step_context`` of the schemes). Returns the output (N, D) and this step's key and
        value (N, H, d) for the cache. The same math as ``forward`` with L = 1 and the
        window as memory (tested equal), in a fraction of its ops, and pure (no writes).
        """
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).view(n, 3, self.heads, self.head_dim).unbind(1)  # (N, H, d)
        drop = self.dropout if self.training else 0.0
        kv = StepKV(window_k, window_v, k, v)
        out = self.scheme.step(q, kv, mask=mask, context=context, dropout=drop)  # (N, H, d)
        return self.out_proj(out.reshape(n, self.dim)), k, v
