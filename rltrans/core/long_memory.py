"""Long memory beyond the attention window, read inside a block's attention sub-layer.

A transformer block attends over its last M steps (the window); a long-memory kind adds what
the window has forgotten. Kinds are chosen by name (``BlockConfig.long_memory``):

* ``none``: the window only (reach: layers x M steps).
* ``linear``: a gated linear-attention state per head, carried for the whole episode: reach
  unbounded, acting cost O(1) in episode length, retention learned. For head h of width d,
  with phi(u) = elu(u) + 1 (Katharopoulos et al. 2020) and x_t the block's attention input::

      q_t = phi(W_q x_t),  k_t = phi(W_k x_t),  v_t = W_v x_t          (d each)
      beta_t = sigmoid(w_b . x_t + b_b)        write strength of step t (learned, per head)
      gamma = sigmoid(theta)                    retention per step (learned, per head)
      S_t = gamma S_{t-1} + beta_t k_t v_t^T    (d x d)
      z_t = gamma z_{t-1} + beta_t k_t          (d)
      r_t = q_t^T S_t / (q_t . z_t + eps)

  and the sub-layer's output is attention(x_t) + W_o [r_t^1 ; ... ; r_t^H]. A per-head
  decay as in RetNet (Sun et al. 2023), initialised at time scales 16, 128, 1024, ... steps,
  a learned write gate as in ReLiT/AGaLiTe (Pramanik et al. 2023), and W_o = 0 at
  initialisation, so an agent starts as its window-only twin and learns to read the state.
  Where an episode starts S and z restart from zero (episode isolation). A training segment
  starts from the state stored when it was acted (stop-gradient, like an RNN's state), and
  computes its steps in parallel from the closed form of the recurrence (:meth:`forward`),
  which equals stepping it (:meth:`step`).
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LongMemoryName = Literal["none", "linear"]
LONG_MEMORIES: tuple[str, ...] = get_args(LongMemoryName)
EPS = 1e-6  # keeps the normaliser away from 0 (q . z > 0 always: phi > 0, beta > 0)
FIRST_SCALE, SCALE_STEP = 16.0, 8.0  # head h forgets over ~16 * 8^h steps at initialisation


class LinearState(NamedTuple):
    """One layer's linear-memory state: S (..., H, d, d) and z (..., H, d)."""

    S: Tensor
    z: Tensor


def feature_map(u: Tensor) -> Tensor:
    """phi(u) = elu(u) + 1 > 0."""
    return F.elu(u) + 1.0


class LinearMemory(nn.Module):
    """The ``linear`` long memory of one block (see the module docstring)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim={dim} must be divisible by heads={heads}")
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim + heads)  # q, k, v and the write gate's logits
        scales = FIRST_SCALE * SCALE_STEP ** torch.arange(heads, dtype=torch.float64)
        self.retention = nn.Parameter(torch.log(scales - 1.0).float())  # sigmoid = 1 - 1/scale
        self.out = nn.Linear(dim, dim)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def empty_state(self, batch: int, device=None, dtype=None) -> LinearState:
        """Zero state for ``batch`` sequences."""
        h, d = self.heads, self.head_dim
        return LinearState(
            torch.zeros(batch, h, d, d, device=device, dtype=dtype),
            torch.zeros(batch, h, d, device=device, dtype=dtype),
        )

    def gamma(self) -> Tensor:
        """Retention per step of each head (H,)."""
        return torch.sigmoid(self.retention)

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """q, k, v (..., H, d) and beta (..., H) of inputs x (..., D)."""
        qkv, write = self.qkv(x).split((3 * self.dim, self.heads), dim=-1)
        q, k, v = qkv.unflatten(-1, (3, self.heads, self.head_dim)).unbind(-3)
        return feature_map(q), feature_map(k), v, torch.sigmoid(write)

    def forward(
        self, x: Tensor, state: LinearState, starts: Tensor | None = None
    ) -> tuple[Tensor, LinearState]:
        """A segment x (B, L, D) after ``state`` (B, ...); starts (B, L) bool marks episode
        starts. Returns the read-out (B, L, D) and the state after the segment."""
        b, length, _ = x.shape
        q, k, v, beta = self._project(x)  # (B, L, H, d) x3, (B, L, H)
        q, k, v, beta = (t.transpose(1, 2) for t in (q, k, v, beta))  # heads first
        log_gamma = F.logsigmoid(self.retention).to(x.dtype).view(1, -1, 1, 1)  # (1, H, 1, 1)
        steps = torch.arange(length, device=x.device)
        if starts is None:
            starts = torch.zeros(b, length, dtype=torch.bool, device=x.device)
        episode = torch.cumsum(starts.long(), dim=1)  # (B, L) episode index in the segment
        # decay[t, s] = gamma^(t - s) for s <= t in one episode: the weight of step s at t.
        same = (episode[:, :, None] == episode[:, None, :]) & (steps[:, None] >= steps[None, :])
        lag = (steps[:, None] - steps[None, :]).clamp(min=0).to(x.dtype)  # (L, L)
        decay = torch.exp(lag * log_gamma) * same[:, None].to(x.dtype)  # (B, H, L, L)
        weights = decay * beta[:, :, None, :]  # (B, H, L, L): gamma^(t-s) beta_s
        # carry[t] = gamma^(t+1) while the segment's first episode runs, else 0.
        alive = (episode == 0).to(x.dtype)[:, None, :, None]  # (B, 1, L, 1)
        carry = torch.exp((steps + 1).to(x.dtype).view(1, 1, -1, 1) * log_gamma) * alive
        scores = (q @ k.transpose(-1, -2)) * weights  # (B, H, L, L)
        num = carry * (q @ state.S) + scores @ v  # (B, H, L, d)
        den = carry[..., 0] * (q @ state.z.unsqueeze(-1))[..., 0] + scores.sum(-1)  # (B, H, L)
        read = num / (den.unsqueeze(-1) + EPS)
        last = weights[:, :, -1]  # (B, H, L): weight of each step in the final state
        new = LinearState(
            carry[:, :, -1:] * state.S + (k * last.unsqueeze(-1)).transpose(-1, -2) @ v,
            carry[:, :, -1, :] * state.z + (k * last.unsqueeze(-1)).sum(-2),
        )
        return self.out(read.transpose(1, 2).flatten(-2)), new

    def step(self, x: Tensor, state: LinearState) -> tuple[Tensor, LinearState]:
        """One acting step x (N, D) after ``state`` (N, ...) (reset by the caller where an
        episode starts): the read-out (N, D) and the new state."""
        q, k, v, beta = self._project(x)  # (N, H, d) x3, (N, H)
        gamma = self.gamma().to(x.dtype).view(1, -1, 1)  # (1, H, 1)
        k = k * beta.unsqueeze(-1)
        S = gamma.unsqueeze(-1) * state.S + k.unsqueeze(-1) * v.unsqueeze(-2)
        z = gamma * state.z + k
        num = (q.unsqueeze(-2) @ S).squeeze(-2)  # (N, H, d)
        read = num / ((q * z).sum(-1, keepdim=True) + EPS)
        return self.out(read.flatten(-2)), LinearState(S, z)


def build_long_memory(name: LongMemoryName, dim: int, heads: int) -> LinearMemory | None:
    """The long-memory module of a block, or None for ``none``."""
    if name not in LONG_MEMORIES:
        raise ValueError(f"unknown long memory {name!r}; valid choices: {', '.join(LONG_MEMORIES)}")
    return LinearMemory(dim, heads) if name == "linear" else None


def time_scales(module: LinearMemory) -> Tensor:
    """1 / (1 - gamma) per head: the steps over which each head's state forgets (H,)."""
    return 1.0 / (1.0 - module.gamma().detach().double()).clamp(min=math.ulp(1.0))
