"""Long memory beyond the attention window, read inside a block's attention sub-layer.

A transformer block attends over its last M steps (the window); a long-memory kind adds what
the window has forgotten. Kinds are chosen by name (``BlockConfig.long_memory``):

* ``none``: the window only (reach: layers x M steps).
* ``linear`` (:class:`LinearMemory`): a gated linear-attention state per head, carried for
  the whole episode (Katharopoulos et al. 2020; a per-head decay as in RetNet, a learned
  write gate as in ReLiT/AGaLiTe): reach unbounded, acting cost O(1) in episode length.
* ``delta`` (:class:`DeltaMemory`): the same state written by the gated delta rule (Schlag
  et al. 2021; Yang et al. 2025): each step overwrites what the state recalls for its key, so
  a step seen again and again writes itself once and a cue seen once stays in place.
* ``additive`` (:class:`AdditiveMemory`): the same state written by the sum rule, so a key
  seen n times adds n writings: the state can hold counts, which a normalised read
  (``linear``) or an overwriting one (``delta``) can only approximate.
* ``mixed`` (:class:`MixedMemory`): odd heads write by the delta rule, even heads by the sum
  rule: one memory for an env that does not say whether it asks for single cues held across
  long stretches or for counts.
* ``compressive`` (Rae et al. 2020): every c steps compressed into one of the newest Mc
  slots, read by a softmax attention of its own (:mod:`rltrans.core.compressive`).

The read enters the sub-layer's output through W_o = 0 at initialisation, so an agent starts
as its window-only twin and learns to read the state. Where an episode starts the state
restarts from zero (episode isolation); a training segment starts from the state stored when
it was acted (stop-gradient, like an RNN's state) and computes its steps in parallel from the
closed form of the recurrence, which equals stepping it.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal, NamedTuple, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rltrans.core.compressive import CompressiveMemory, CompressiveState

LongMemoryName = Literal["none", "linear", "delta", "additive", "mixed", "compressive"]
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


def initial_scales(heads: int, longest: float | None = None) -> Tensor:
    """The heads' time scales 1 / (1 - gamma) at initialisation (H,) float64: 16, 128, 1024,
    ... (x8 per head), or with ``longest`` a geometric run from 16 to ``longest`` (one head:
    ``longest``)."""
    steps = torch.arange(heads, dtype=torch.float64)
    if longest is None:
        return FIRST_SCALE * SCALE_STEP**steps
    if not longest >= FIRST_SCALE:
        raise ValueError(f"retention_scale={longest} must be >= {FIRST_SCALE:g} steps or None")
    if heads == 1:
        return torch.tensor([float(longest)], dtype=torch.float64)
    return FIRST_SCALE * (float(longest) / FIRST_SCALE) ** (steps / (heads - 1))


class LinearMemory(nn.Module):
    """The ``linear`` long memory of one block. For head h of width d, with phi(u) =
    elu(u) + 1 and x_t the block's attention input::

        q_t = phi(W_q x_t),  k_t = phi(W_k x_t),  v_t = W_v x_t          (d each)
        beta_t = sigmoid(w_b . x_t + b_b)        write strength of step t (learned, per head)
        gamma = sigmoid(theta)                    retention per step (learned, per head)
        S_t = gamma S_{t-1} + beta_t k_t v_t^T    (d x d)
        z_t = gamma z_{t-1} + beta_t k_t          (d)
        r_t = q_t^T S_t / (q_t . z_t + eps)

    and the sub-layer's output is attention(x_t) + W_o [r_t^1 ; ... ; r_t^H], the decays
    initialised at time scales 16, 128, 1024, ... steps. :meth:`forward` computes a segment
    from the closed form of the recurrence, which equals :meth:`step` applied step by step."""

    State: ClassVar[type] = LinearState  # one layer's state, as the stack carries it

    def __init__(self, dim: int, heads: int, longest: float | None = None) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim={dim} must be divisible by heads={heads}")
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim + heads)  # q, k, v and the write gate's logits
        scales = initial_scales(heads, longest)
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

    def _decay(
        self, starts: Tensor | None, batch: int, length: int, dtype: torch.dtype, device
    ) -> tuple[Tensor, Tensor]:
        """Within a segment of ``length`` steps: decay (B, H, L, L), gamma^(t - s) for s <= t
        in one episode (the weight of step s at t), and carry (B, H, L, 1), gamma^(t + 1)
        while the segment's first episode runs, else 0 (the weight of the state before it)."""
        log_gamma = F.logsigmoid(self.retention).to(dtype).view(1, -1, 1, 1)  # (1, H, 1, 1)
        steps = torch.arange(length, device=device)
        if starts is None:
            starts = torch.zeros(batch, length, dtype=torch.bool, device=device)
        episode = torch.cumsum(starts.long(), dim=1)  # (B, L) episode index in the segment
        same = (episode[:, :, None] == episode[:, None, :]) & (steps[:, None] >= steps[None, :])
        lag = (steps[:, None] - steps[None, :]).clamp(min=0).to(dtype)  # (L, L)
        decay = torch.exp(lag * log_gamma) * same[:, None].to(dtype)
        alive = (episode == 0).to(dtype)[:, None, :, None]  # (B, 1, L, 1)
        carry = torch.exp((steps + 1).to(dtype).view(1, 1, -1, 1) * log_gamma) * alive
        return decay, carry

    def forward(
        self, x: Tensor, state: LinearState, starts: Tensor | None = None
    ) -> tuple[Tensor, LinearState]:
        """A segment x (B, L, D) after ``state`` (B, ...); starts (B, L) bool marks episode
        starts. Returns the read-out (B, L, D) and the state after the segment."""
        q, k, v, beta = self._project(x)  # (B, L, H, d) x3, (B, L, H)
        q, k, v, beta = (t.transpose(1, 2) for t in (q, k, v, beta))  # heads first
        # z is S's column for a constant value 1: one sum rule gives numerator and normaliser
        ones = torch.ones_like(v[..., :1])
        Sz = torch.cat([state.S, state.z.unsqueeze(-1)], dim=-1)  # (B, H, d, d + 1)
        sums, Sz = self._sum_rule(q, k, torch.cat([v, ones], dim=-1), beta, Sz, starts)
        read = sums[..., :-1] / (sums[..., -1:] + EPS)
        new = LinearState(Sz[..., :-1], Sz[..., -1])
        return self.out(read.transpose(1, 2).flatten(-2)), new

    def _sum_rule(
        self, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, S0: Tensor, starts: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """The sum rule S_t = gamma S_{t-1} + beta_t k_t v_t^T over a segment, heads first:
        q, k (B, H, L, d), v (B, H, L, e), beta (B, H, L), S0 (B, H, d, e), with e the value
        width (d + 1 for ``forward``'s normaliser column). Returns the reads q_t^T S_t
        (B, H, L, e) and the state after the segment (B, H, d, e)."""
        b, _, length, _ = q.shape
        decay, carry = self._decay(starts, b, length, q.dtype, q.device)
        return self._sums(q, k, v, beta, S0, decay, carry)

    @staticmethod
    def _sums(
        q: Tensor, k: Tensor, v: Tensor, beta: Tensor, S0: Tensor, decay: Tensor, carry: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The sum rule given the segment's decay and carry (:meth:`_decay`)."""
        weights = decay * beta[:, :, None, :]  # (B, H, L, L): gamma^(t-s) beta_s
        reads = carry * (q @ S0) + ((q @ k.transpose(-1, -2)) * weights) @ v
        last = weights[:, :, -1].unsqueeze(-1)  # (B, H, L, 1): each step's weight at the end
        return reads, carry[:, :, -1:] * S0 + (k * last).transpose(-1, -2) @ v

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


class DeltaMemory(LinearMemory):
    """The ``delta`` long memory of one block, with unit-length q and k::

        q_t = W_q x_t / |W_q x_t|,  k_t = W_k x_t / |W_k x_t|,  v_t = W_v x_t,  beta_t, gamma
        u_t = beta_t (v_t - gamma S_{t-1}^T k_t)      what step t writes
        S_t = gamma S_{t-1} + k_t u_t^T,   r_t = S_t^T q_t

    A segment's u_t are the solution of one unit lower-triangular system (the recurrence
    solved for all steps at once), so training is parallel over the segment as for
    ``linear``. The state has ``linear``'s layout, with z unused (zero)."""

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Unit q, k, v (..., H, d) and beta (..., H) of inputs x (..., D), in float32 or
        wider: the delta rule subtracts recalled values, which bfloat16 would round away."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        qkv, write = self.qkv(x).to(dtype).split((3 * self.dim, self.heads), dim=-1)
        q, k, v = qkv.unflatten(-1, (3, self.heads, self.head_dim)).unbind(-3)
        return F.normalize(q, dim=-1), F.normalize(k, dim=-1), v, torch.sigmoid(write)

    def forward(
        self, x: Tensor, state: LinearState, starts: Tensor | None = None
    ) -> tuple[Tensor, LinearState]:
        """A segment x (B, L, D) after ``state`` (B, ...); starts (B, L) bool marks episode
        starts. Returns the read-out (B, L, D) and the state after the segment."""
        b, length, _ = x.shape
        q, k, v, beta = self._project(x)  # (B, L, H, d) x3, (B, L, H)
        q, k, v, beta = (t.transpose(1, 2) for t in (q, k, v, beta))  # heads first
        decay, carry = self._decay(starts, b, length, q.dtype, x.device)
        read, S = self._delta_rule(q, k, v, beta, state.S.to(q.dtype), decay, carry)
        new = LinearState(S.to(state.S.dtype), state.z)  # z stays zero: unused by delta
        return self.out(read.transpose(1, 2).flatten(-2).to(x.dtype)), new

    @staticmethod
    def _delta_rule(
        q: Tensor, k: Tensor, v: Tensor, beta: Tensor, S0: Tensor, decay: Tensor, carry: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The delta rule over a segment, heads first: q, k, v (B, H, L, d), beta (B, H, L),
        S0 (B, H, d, d), decay and carry as :meth:`_decay` gives them. Returns the reads
        (B, H, L, d) and the state after the segment."""
        length = q.shape[2]
        # u_t + beta_t sum_{s<t} decay[t,s] (k_t . k_s) u_s = beta_t (v_t - carry_t S0^T k_t)
        known = torch.tril(decay * (k @ k.transpose(-1, -2)), diagonal=-1)  # (B, H, L, L)
        system = torch.eye(length, dtype=q.dtype, device=q.device) + beta.unsqueeze(-1) * known
        rhs = beta.unsqueeze(-1) * (v - carry * (k @ S0))  # (B, H, L, d)
        u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        read = carry * (q @ S0) + (decay * (q @ k.transpose(-1, -2))) @ u  # (B, H, L, d)
        last = decay[:, :, -1].unsqueeze(-1)  # (B, H, L, 1): each step's weight at the end
        return read, carry[:, :, -1:] * S0 + (k * last).transpose(-1, -2) @ u

    def _overwrites(self, like: Tensor) -> Tensor | float:
        """Where a head subtracts what it recalls (1: every head; the mixed kind: some)."""
        return 1.0

    def step(self, x: Tensor, state: LinearState) -> tuple[Tensor, LinearState]:
        """One acting step x (N, D) after ``state`` (N, ...) (reset by the caller where an
        episode starts): the read-out (N, D) and the new state."""
        q, k, v, beta = self._project(x)  # (N, H, d) x3, (N, H)
        gamma = self.gamma().to(q.dtype).view(1, -1, 1, 1)  # (1, H, 1, 1)
        S = gamma * state.S.to(q.dtype)
        recalled = (k.unsqueeze(-2) @ S).squeeze(-2)  # (N, H, d) = (gamma S_{t-1})^T k_t
        u = beta.unsqueeze(-1) * (v - self._overwrites(q) * recalled)
        S = S + k.unsqueeze(-1) * u.unsqueeze(-2)
        read = (q.unsqueeze(-2) @ S).squeeze(-2)  # (N, H, d)
        return self.out(read.flatten(-2).to(x.dtype)), LinearState(S.to(state.S.dtype), state.z)


class AdditiveMemory(DeltaMemory):
    """The ``additive`` long memory of one block: the delta kind's unit q and k, no
    normaliser::

        S_t = gamma S_{t-1} + beta_t k_t v_t^T,   r_t = S_t^T q_t

    The read is as large as the writings that match q (up to 1 / (1 - gamma) of them), so it
    suits tasks that aggregate over an episode; ``delta`` keeps single cues better across long
    corridors."""

    def forward(
        self, x: Tensor, state: LinearState, starts: Tensor | None = None
    ) -> tuple[Tensor, LinearState]:
        """A segment x (B, L, D) after ``state`` (B, ...); starts (B, L) bool marks episode
        starts. Returns the read-out (B, L, D) and the state after the segment."""
        q, k, v, beta = self._project(x)  # (B, L, H, d) x3, (B, L, H), unit q and k
        q, k, v, beta = (t.transpose(1, 2) for t in (q, k, v, beta))  # heads first
        read, S = self._sum_rule(q, k, v, beta, state.S.to(q.dtype), starts)  # no normaliser
        new = LinearState(S.to(state.S.dtype), state.z)  # z stays zero: nothing normalises
        return self.out(read.transpose(1, 2).flatten(-2).to(x.dtype)), new

    def step(self, x: Tensor, state: LinearState) -> tuple[Tensor, LinearState]:
        """One acting step x (N, D) after ``state`` (N, ...) (reset by the caller where an
        episode starts): the read-out (N, D) and the new state."""
        q, k, v, beta = self._project(x)  # (N, H, d) x3, (N, H)
        gamma = self.gamma().to(q.dtype).view(1, -1, 1, 1)  # (1, H, 1, 1)
        k = k * beta.unsqueeze(-1)
        S = gamma * state.S.to(q.dtype) + k.unsqueeze(-1) * v.unsqueeze(-2)
        read = (q.unsqueeze(-2) @ S).squeeze(-2)  # (N, H, d)
        return self.out(read.flatten(-2).to(x.dtype)), LinearState(S.to(state.S.dtype), state.z)


LongState = LinearState | CompressiveState  # one layer's state of any long-memory kind


class MixedMemory(DeltaMemory):
    """The ``mixed`` long memory of one block: odd heads write by the delta rule (they
    overwrite), even heads by the sum rule (they count). With H heads the time scales
    alternate between the two rules, so each has a fast and a slow head."""

    def __init__(self, dim: int, heads: int, longest: float | None = None) -> None:
        if heads < 2:
            raise ValueError(
                f"long_memory='mixed' needs heads >= 2 (one per rule), got {heads}; with one head "
                "choose long_memory=delta, additive, linear or none"
            )
        super().__init__(dim, heads, longest)
        heads_ = torch.arange(heads)
        # odd heads overwrite: the slower of each pair of time scales holds single cues longest
        self.register_buffer("order", torch.cat([heads_[1::2], heads_[::2]]), persistent=False)
        self.register_buffer("inverse", torch.argsort(self.order), persistent=False)
        # (1, H, 1): 1 for the heads that subtract what they recall (acting's delta step)
        overwrites = (heads_ % 2).float().view(1, -1, 1)
        self.register_buffer("overwrite_mask", overwrites, persistent=False)
        self.overwriting = heads // 2

    def _split(self, *tensors: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """Each (B, H, ...) tensor's delta heads and sum heads."""
        o = self.overwriting
        ordered = [t.index_select(1, self.order) for t in tensors]
        return [t[:, :o] for t in ordered], [t[:, o:] for t in ordered]

    def _join(self, delta: Tensor, sums: Tensor) -> Tensor:
        """The heads back in their order, from the delta heads' and the sum heads' parts."""
        return torch.cat([delta, sums], dim=1).index_select(1, self.inverse)

    def forward(
        self, x: Tensor, state: LinearState, starts: Tensor | None = None
    ) -> tuple[Tensor, LinearState]:
        """A segment x (B, L, D) after ``state`` (B, ...); starts (B, L) bool marks episode
        starts. Returns the read-out (B, L, D) and the state after the segment."""
        b, length, _ = x.shape
        q, k, v, beta = self._project(x)  # (B, L, H, d) x3, (B, L, H), unit q and k
        q, k, v, beta = (t.transpose(1, 2) for t in (q, k, v, beta))  # heads first
        decay, carry = self._decay(starts, b, length, q.dtype, x.device)
        delta, sums = self._split(q, k, v, beta, state.S.to(q.dtype), decay, carry)
        read_d, S_d = self._delta_rule(*delta)
        read_s, S_s = self._sums(*sums)
        read, S = self._join(read_d, read_s), self._join(S_d, S_s)
        new = LinearState(S.to(state.S.dtype), state.z)  # z stays zero: nothing normalises
        return self.out(read.transpose(1, 2).flatten(-2).to(x.dtype)), new

    def _overwrites(self, like: Tensor) -> Tensor:
        """Per head (1, H, 1): 1 where it writes by the delta rule, 0 where by the sum rule."""
        return self.overwrite_mask.to(like.dtype)


MODULES: dict[str, type[nn.Module]] = {
    "linear": LinearMemory,
    "delta": DeltaMemory,
    "additive": AdditiveMemory,
    "mixed": MixedMemory,
    "compressive": CompressiveMemory,
}
# the kinds with a learned retention per head, whose time scales ``longest`` sets
RETAINING: tuple[str, ...] = tuple(k for k, m in MODULES.items() if issubclass(m, LinearMemory))


def build_long_memory(
    name: LongMemoryName,
    dim: int,
    heads: int,
    *,
    slots: int = 32,
    rate: int = 16,
    longest: float | None = None,
) -> nn.Module | None:
    """The long-memory module of a block, or None for ``none``; ``slots`` and ``rate`` are
    the ``compressive`` kind's Mc and c; ``longest`` is the other kinds' slowest head's initial
    time scale (:func:`initial_scales`)."""
    if name not in LONG_MEMORIES:
        raise ValueError(f"unknown long memory {name!r}; valid choices: {', '.join(LONG_MEMORIES)}")
    if name == "none":
        return None
    if name == "compressive":
        return CompressiveMemory(dim, heads, slots, rate)
    return MODULES[name](dim, heads, longest)


def time_scales(module: LinearMemory) -> Tensor:
    """1 / (1 - gamma) per head: the steps over which each head's state forgets (H,)."""
    return 1.0 / (1.0 - module.gamma().detach().double()).clamp(min=math.ulp(1.0))
