"""The ``compressive`` long memory (Rae et al. 2020, "Compressive Transformers"): every block
of c consecutive steps of an episode (c = ``compression_rate``) is compressed by a 1-D
convolution of kernel and stride c into one slot, and the newest Mc slots
(``compressed_slots``) are kept: reach Mc x c steps, acting cost O(Mc) per step. The step
reads them by softmax attention of its own (the window's softmax is untouched)::

    c_j = b + sum_{i<c} W_i x_{jc+i}         slot j of the steps jc .. jc + c - 1
    k_j = W_k c_j,  v_j = W_v c_j            projected once, when the block completes
    q_t = W_q x_t
    r_t = sum_j softmax_j(q_t . k_j / sqrt(d)) v_j   over the newest Mc slots completed
                                                     before step t in its episode (0: none)

per head, and the sub-layer adds W_o [r^1 ; ... ; r^H] (W_o = 0 at initialisation). The
paper compresses the slots as they leave the window; here a block is compressed when it
completes, so the slots overlap the window's last M steps (the reach counts from the
current step). The state holds the slots' keys and values, their validity, the partial
sum of the block in progress and its phase; a segment computes every step's read at once,
and gradient reaches the convolution through the blocks completed within the segment (the
paper trains it by an attention-reconstruction loss instead).
"""

from __future__ import annotations

import math
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor, nn


class CompressiveState(NamedTuple):
    """One layer's compressive-memory state: the slots' keys and values (..., Mc, D), oldest
    first, their validity (..., Mc) (1.0 or 0.0), the partial sum of the block in progress
    (..., D) and its phase (...,): how many of its c steps are in (a float, so a reset zeroes
    every field alike)."""

    keys: Tensor
    values: Tensor
    valid: Tensor
    partial: Tensor
    phase: Tensor


class CompressiveMemory(nn.Module):
    """The ``compressive`` long memory of one block (see the module docstring)."""

    State: ClassVar[type] = CompressiveState

    def __init__(self, dim: int, heads: int, slots: int = 32, rate: int = 16) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim={dim} must be divisible by heads={heads}")
        for name, value in (("compressed_slots", slots), ("compression_rate", rate)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.slots, self.rate = slots, rate
        self.compress = nn.Conv1d(dim, dim, kernel_size=rate, stride=rate)
        self.query = nn.Linear(dim, dim)
        self.key_value = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, dim)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def empty_state(self, batch: int, device=None, dtype=None) -> CompressiveState:
        """Zero state for ``batch`` sequences: no slot, no partial block."""
        zeros = lambda *shape: torch.zeros(*shape, device=device, dtype=dtype)  # noqa: E731
        m, d = self.slots, self.dim
        return CompressiveState(
            zeros(batch, m, d), zeros(batch, m, d), zeros(batch, m), zeros(batch, d), zeros(batch)
        )

    def _terms(self, x: Tensor, phase: Tensor) -> Tensor:
        """W_i x for each step's phase i (..., D): its term of the block's convolution."""
        every = torch.einsum("...i,oic->...co", x, self.compress.weight.to(x.dtype))  # (..., c, D)
        return torch.take_along_dim(every, phase[..., None, None], dim=-2).squeeze(-2)

    def _slot(self, total: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values (..., D) of a completed block's convolution sum."""
        return self.key_value(total + self.compress.bias).chunk(2, dim=-1)

    def _read(self, q: Tensor, keys: Tensor, values: Tensor, visible: Tensor) -> Tensor:
        """Attention of queries q (B, L, D) over slots (B, S, D) where visible (B, L, S)."""
        heads = lambda t: t.unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)  # noqa: E731
        q, k, v = heads(q), heads(keys), heads(values)  # (B, H, ., d)
        logits = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)  # (B, H, L, S)
        visible = visible.unsqueeze(1)
        # a query with no visible slot gets equal finite logits, then weights 0: a read of 0
        logits = logits.masked_fill(~visible, torch.finfo(logits.dtype).min)
        weights = torch.softmax(logits, dim=-1) * visible.to(logits.dtype)
        return self.out((weights @ v).transpose(1, 2).flatten(-2))

    def forward(
        self, x: Tensor, state: CompressiveState, starts: Tensor | None = None
    ) -> tuple[Tensor, CompressiveState]:
        """A segment x (B, L, D) after ``state`` (B, ...); starts (B, L) bool marks episode
        starts. Returns the read-out (B, L, D) and the state after the segment."""
        b, length, _ = x.shape
        c, m, device = self.rate, self.slots, x.device
        steps = torch.arange(length + 1, device=device)  # step L: where the next segment starts
        if starts is None:
            starts = torch.zeros(b, length, dtype=torch.bool, device=device)
        starts = torch.cat([starts, starts.new_zeros(b, 1)], dim=1)  # (B, L + 1)
        episode = torch.cumsum(starts.long(), dim=1)
        first = episode == 0  # steps that continue the stored state's episode
        last_start = torch.cummax(torch.where(starts, steps, -1), dim=1).values
        since = torch.where(first, state.phase.long()[:, None] + steps, steps - last_start)
        phase = since % c  # (B, L + 1): the phase each step writes at
        begin = steps - phase  # the first step of each step's block (< 0: begun before)
        terms = self._terms(x, phase[:, :length])  # (B, L, D)
        # block_sum[t] = sum of terms in t's block up to t, plus the stored partial sum
        same = (steps[None, :length] >= begin[:, :, None]) & (
            steps[None, :length] <= steps[:, None]
        )
        inherited = (first & (begin < 0)).to(x.dtype)[..., None] * state.partial[:, None].to(
            x.dtype
        )
        sums = same[:, :, :length].to(x.dtype) @ terms + inherited  # (B, L + 1, D) incl. step L
        done = (phase == c - 1)[:, :length]  # (B, L): steps that complete a block
        new_k, new_v = self._slot(sums[:, :length])  # (B, L, D) each, used where done
        # visibility for each step t <= L: old slot j iff valid, t in the first episode and
        # fewer than Mc blocks completed since (j >= blocks done before t); new slot s iff
        # done, s < t in t's episode, and fewer than Mc blocks completed between them
        before = torch.cumsum(done.long(), dim=1) - done.long()  # blocks done before s
        before = torch.cat([before, before[:, -1:] + done[:, -1:].long()], dim=1)  # (B, L + 1)
        old = (
            (state.valid > 0)[:, None, :]
            & first[:, :, None]
            & (torch.arange(m, device=device)[None, None, :] >= before[:, :, None])
        )  # (B, L + 1, Mc)
        new = (
            done[:, None, :]
            & (steps[None, None, :length] < steps[None, :, None])
            & (episode[:, None, :length] == episode[:, :, None])
            & (before[:, :, None] - before[:, None, :length] - 1 < m)
        )  # (B, L + 1, L)
        visible = torch.cat([old, new], dim=2)  # (B, L + 1, Mc + L)
        keys = torch.cat([state.keys.to(x.dtype), new_k], dim=1)
        values = torch.cat([state.values.to(x.dtype), new_v], dim=1)
        read = self._read(self.query(x), keys, values, visible[:, :length])
        # the state after the segment: what step L would see, right-aligned into Mc slots
        after = visible[:, length]  # (B, Mc + L)
        rank = after.flip(1).long().cumsum(1).flip(1) - 1  # visible ones after each, 0 = newest
        place = torch.arange(m, device=device)[None, :, None] == (m - 1 - rank)[:, None, :]
        place = (place & after[:, None, :]).to(x.dtype)  # (B, Mc, Mc + L)
        dtype = state.keys.dtype
        new_state = CompressiveState(
            (place @ keys).to(dtype),
            (place @ values).to(dtype),
            place.sum(-1).to(dtype),
            sums[:, length].to(dtype),  # the block in progress (0 where none is)
            phase[:, length].to(dtype),
        )
        return read, new_state

    def step(self, x: Tensor, state: CompressiveState) -> tuple[Tensor, CompressiveState]:
        """One acting step x (N, D) after ``state`` (N, ...) (reset by the caller where an
        episode starts): the read-out (N, D) and the new state."""
        visible = (state.valid > 0).unsqueeze(1)  # (N, 1, Mc): read before this step writes
        read = self._read(
            self.query(x).unsqueeze(1), state.keys.to(x.dtype), state.values.to(x.dtype), visible
        )
        phase = state.phase.long()
        # this step's term of the convolution: one (D, D) matrix per env, not all c of them
        weight = self.compress.weight.to(x.dtype).permute(2, 0, 1)[phase]  # (N, D, D)
        partial = state.partial.to(x.dtype) + (weight @ x.unsqueeze(-1)).squeeze(-1)
        done = (phase == self.rate - 1).unsqueeze(-1)  # (N, 1)
        k, v = self._slot(partial)
        shift = lambda old, new: torch.cat([old[:, 1:], new.unsqueeze(1)], dim=1)  # noqa: E731
        dtype = state.keys.dtype
        keys = torch.where(done.unsqueeze(-1), shift(state.keys, k.to(dtype)), state.keys)
        values = torch.where(done.unsqueeze(-1), shift(state.values, v.to(dtype)), state.values)
        valid = torch.where(done, shift(state.valid, torch.ones_like(state.phase)), state.valid)
        new = CompressiveState(
            keys,
            values,
            valid,
            torch.where(done, 0.0, partial).to(dtype),
            torch.where(done[:, 0], 0.0, state.phase + 1.0),
        )
        return read[:, 0], new
