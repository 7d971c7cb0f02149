"""Per-env memory of transformer policies, as explicit tensors.

Two forms, both plain data (no hidden ``self.memory`` in modules):

* :class:`Memory` is what the learner receives: for each training sequence the
  M layer inputs that precede it, per layer, with a validity mask. It is stored
  once per training segment, never per step.
* :class:`MemoryState` is what an acting loop carries: the same window plus a
  key/value cache, laid out as a double ring buffer of 2M slots so that one
  step writes O(1) slots and reads the last M steps, in time order, as a view,
  and the per-step contexts the attention schemes derive from the weights alone
  (Transformer-XL's W_kR R, rotary's cos/sin tables).

Ring layout: before step t the cursor c = t mod M and slots [c, c + M) hold
steps t - M .. t - 1 in order: the window the step attends over, read in place
(:meth:`MemoryState.windows`). Step t is then stored at slot c + M and
``advance`` copies it to its twin slot c for all layers at once; the next window
[c + 1, c + 1 + M) holds t - M + 1 .. t. No copy of the window is ever made
while acting.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from rltrans.core.attention import sequence_mask


class Memory(NamedTuple):
    """Training-time memory of B sequences.

    hidden: (B, Y, M, D) layer inputs of the M steps before the sequence (stop-gradient).
    All fields are batch-first, so buffers can store and index any backbone's memory alike.
    valid:  (B, M) bool, True where the slot holds a step of the sequence's current episode.
    time:   (B,) long, steps since episode start of the sequence's first token (for absolute
            position schemes; ignored by relative ones).
    long:   the long memory's state before the sequence, batch-first (``linear``: S (B, Y, H,
            d, d) and z (B, Y, H, d); :mod:`rltrans.core.long_memory`), () without one.
    """

    hidden: Tensor
    valid: Tensor
    time: Tensor
    long: tuple[Tensor, ...] = ()

    @staticmethod
    def empty(layers: int, batch: int, size: int, dim: int, device=None, dtype=None) -> Memory:
        """An all-invalid memory, as at the very start of training."""
        return Memory(
            hidden=torch.zeros(batch, layers, size, dim, device=device, dtype=dtype),
            valid=torch.zeros(batch, size, dtype=torch.bool, device=device),
            time=torch.zeros(batch, dtype=torch.long, device=device),
        )

    def index(self, idx: Tensor | slice) -> Memory:
        """Select sequences by index along B."""
        long = tuple(t[idx] for t in self.long)
        return Memory(self.hidden[idx], self.valid[idx], self.time[idx], long)


class MemoryState(NamedTuple):
    """Acting-time memory of N envs with a key/value cache (see the module docstring).

    hidden: (Y, N, 2M, D) layer inputs;  keys, values: (Y, N, H, 2M, D/H) cache;
    valid: (N, 2M) bool;  time: (N,) long steps since episode start;  cursor: t mod M;
    contexts: one ``step_context`` per attention block (its scheme's constants for a window
    of M steps, e.g. xl's W_kR R (H, M+1, D/H)), derived from the weights when the state is
    created or refreshed (:meth:`WindowedMemory.refresh_state`), not per env.
    long: the long memory's state, layer-first (``linear``: S (Y, N, H, d, d), z (Y, N, H, d)),
    () without one; a step replaces its values in place.
    """

    hidden: Tensor
    keys: Tensor
    values: Tensor
    valid: Tensor
    time: Tensor
    cursor: int
    contexts: tuple[Any, ...] = ()
    long: tuple[Tensor, ...] = ()

    @staticmethod
    def empty(
        layers: int, envs: int, size: int, dim: int, heads: int, device=None, dtype=None
    ) -> MemoryState:
        """An all-invalid state for ``envs`` environments and a window of ``size`` steps."""
        head_dim = dim // heads
        kv_shape = (layers, envs, heads, 2 * size, head_dim)
        return MemoryState(
            hidden=torch.zeros(layers, envs, 2 * size, dim, device=device, dtype=dtype),
            keys=torch.zeros(kv_shape, device=device, dtype=dtype),
            values=torch.zeros(kv_shape, device=device, dtype=dtype),
            valid=torch.zeros(envs, 2 * size, dtype=torch.bool, device=device),
            time=torch.zeros(envs, dtype=torch.long, device=device),
            cursor=0,
        )

    @property
    def size(self) -> int:
        """Window length M."""
        return self.valid.shape[1] // 2

    def window(self) -> slice:
        """Slots holding the last M steps, oldest first."""
        return slice(self.cursor, self.cursor + self.size)

    def reset_where(self, done: Tensor) -> MemoryState:
        """Forget everything of the envs where ``done`` (N,) is True (a new episode starts)."""
        self.valid.masked_fill_(done.unsqueeze(1), False)
        self.time.masked_fill_(done, 0)
        for t in self.long:  # (Y, N, ...): the long memory restarts from zero too
            t.masked_fill_(done.view(1, -1, *([1] * (t.dim() - 2))), 0.0)
        return self

    def to_memory(self) -> Memory:
        """Copy the current window out as a training :class:`Memory` (one copy per segment)."""
        w = self.window()
        # Copies even where the view is already contiguous (one env, one layer): the state's
        # tensors are written in place by later steps.
        copy = lambda t: t.transpose(0, 1).clone(memory_format=torch.contiguous_format)  # noqa: E731
        hidden = copy(self.hidden[:, :, w])  # (N, Y, M, D)
        long = tuple(copy(t) for t in self.long)  # batch-first
        return Memory(hidden, self.valid[:, w].clone(), self.time.clone(), long)

    def step_mask(self, dtype: torch.dtype) -> Tensor:
        """(N, 1, M+1) additive attention mask (0 or -inf) of the current step over
        [window ; itself], built once per step for all layers.

        The window is the slice [c, c+M) of the validity; the step itself (last column) is
        always visible. Nothing is written: ``advance`` marks the step valid."""
        c, m = self.cursor, self.size
        mask = torch.zeros(self.valid.shape[0], 1, m + 1, dtype=dtype, device=self.valid.device)
        mask[:, 0, :m].masked_fill_(~self.valid[:, c : c + m], float("-inf"))
        return mask

    def windows(self) -> tuple[Tensor, Tensor]:
        """Cached keys and values of the last M steps, (Y, N, H, M, D/H) each, as views."""
        w = self.window()
        return self.keys[:, :, :, w], self.values[:, :, :, w]

    def store(self, layers: int | slice, hidden: Tensor, key: Tensor, value: Tensor) -> None:
        """Store this step's input hidden ((Y,) N, D) and key/value ((Y,) N, H, D/H) of one
        layer or a slice of layers at slot c + M (``advance`` copies it to its twin)."""
        slot = self.cursor + self.size
        self.hidden[layers, :, slot] = hidden
        self.keys[layers, :, :, slot] = key
        self.values[layers, :, :, slot] = value

    def advance(self) -> MemoryState:
        """Copy the step (slot c + M, all layers) to its twin slot c, mark it valid, move on."""
        c, m = self.cursor, self.size
        self.hidden[:, :, c] = self.hidden[:, :, c + m]
        self.keys[:, :, :, c] = self.keys[:, :, :, c + m]
        self.values[:, :, :, c] = self.values[:, :, :, c + m]
        self.valid[:, c] = True
        self.valid[:, c + m] = True
        self.time.add_(1)
        return self._replace(cursor=(self.cursor + 1) % self.size)


def last_steps(x: Tensor, size: int) -> Tensor:
    """The last ``size`` entries along dim 1 of x (B, S, ...); empty for size 0 (unlike -0:)."""
    return x[:, x.shape[1] - size :]


def next_window_validity(
    valid: Tensor, starts: Tensor | None, positions: Tensor, size: int
) -> tuple[Tensor, Tensor]:
    """Validity (B, M) of the memory window after a segment, and its episode time (B,).

    valid: (B, M) of the memory before the segment; positions (B, L) episode
    times of the segment's tokens. Only steps of the episode running at the
    segment's end stay visible.
    """
    b, length = positions.shape
    valid = torch.cat([valid, valid.new_ones(b, length)], dim=1)  # (B, M+L)
    if starts is not None:
        episode = torch.cumsum(starts.long(), dim=1)  # (B, L) episode index within the segment
        key_episode = torch.cat([episode.new_zeros(b, size), episode], dim=1)  # (B, M+L)
        valid = valid & (key_episode == episode[:, -1:])
    return last_steps(valid, size), positions[:, -1] + 1


class WindowedMemory:
    """Memory plumbing shared by the stacks that keep M steps of Y inputs (GTrXL: Y layers;
    Universal Transformer: Y depth steps). Subclasses set ``memory_slots`` (Y), ``memory`` (M),
    ``dim`` and ``heads``."""

    memory_slots: int
    memory: int
    causal: bool
    dim: int
    heads: int

    def step_contexts(self, device: torch.device, dtype: torch.dtype) -> tuple[Any, ...]:
        """The per-step contexts of the attention blocks for a window of M steps."""
        raise NotImplementedError  # pragma: no cover - defined by the stacks

    def empty_memory(self, batch: int, device=None, dtype=None) -> Memory:
        """All-invalid training memory for ``batch`` sequences."""
        return Memory.empty(self.memory_slots, batch, self.memory, self.dim, device, dtype)

    def initial_state(self, envs: int, device=None, dtype=None) -> MemoryState:
        """All-invalid acting state (with a key/value cache) for ``envs`` environments."""
        if self.memory < 1:
            raise ValueError("acting with a cache needs memory >= 1")
        sizes = (self.memory_slots, envs, self.memory, self.dim, self.heads)
        state = MemoryState.empty(*sizes, device, dtype)
        with torch.no_grad():
            return state._replace(contexts=self.step_contexts(state.keys.device, state.keys.dtype))

    def state_to_memory(self, state: MemoryState) -> Memory:
        """Copy the acting window out as the training memory of a segment that starts now."""
        return state.to_memory()

    def memory_blocks(self) -> list:
        """The block that reads each of the Y cached inputs (its ``memory_kv`` projects them)."""
        raise NotImplementedError  # pragma: no cover

    @torch.no_grad()
    def refresh_state(self, state: MemoryState) -> MemoryState:
        """Re-derive from the current weights everything the acting state caches: the
        keys/values (from the cached inputs) and the per-step contexts.

        The cache holds keys/values computed when each step was acted; after a weight update
        the learner replays the same stored inputs with the new weights, so without this the
        first M steps of the next rollout would attend to stale keys (and every step to a
        stale W_kR R), and the PPO ratio would start away from 1. The runtime calls this at
        the start of every rollout; nothing else notices a weight change.
        """
        for i, block in enumerate(self.memory_blocks()):
            k, v = block.memory_kv(state.hidden[i])  # (N, H, 2M, D/H) each
            state.keys[i].copy_(k)
            state.values[i].copy_(v)
        return state._replace(contexts=self.step_contexts(state.keys.device, state.keys.dtype))

    def segment_context(
        self,
        x: Tensor,
        memory: Memory | None,
        starts: Tensor | None,
        key_padding: Tensor | None,
        positions: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        """Positions (B, L) (default: steps since episode start) and the windowed attention
        mask (B|1, 1, L, M+L) of a training segment x (B, L, D) that follows ``memory``."""
        b, length = x.shape[:2]
        if positions is None:
            time0 = memory.time if memory is not None else x.new_zeros(b, dtype=torch.long)
            positions = episode_positions(starts, time0, length)
        mask = sequence_mask(
            length,
            self.memory if memory is not None else 0,
            window=self.memory if self.memory > 0 else None,
            causal=self.causal,
            memory_valid=memory.valid if memory is not None else None,
            starts=starts,
            key_padding=key_padding,
            device=x.device,
        )
        return positions, mask


def episode_positions(starts: Tensor | None, time0: Tensor, length: int) -> Tensor:
    """(B, L) steps since episode start for a segment whose first token is at ``time0`` (B,)."""
    idx = torch.arange(length, device=time0.device).expand(time0.shape[0], length)  # (B, L)
    if starts is None:
        return time0.unsqueeze(1) + idx
    last_start = torch.where(starts.bool(), idx, torch.full_like(idx, -1)).cummax(dim=1).values
    return torch.where(last_start >= 0, idx - last_start, time0.unsqueeze(1) + idx)
