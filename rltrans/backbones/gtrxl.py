"""Transformer stacks with segment memory: GTrXL, TrXL and TrXL-I.

One class, :class:`TransformerStack`, built from :mod:`rltrans.core` blocks;
the three named architectures are presets of its options (Parisotto et al.
2019, figure 1):

=========  ======  ==========  ========  ==========
preset     norm    activation  gate      position
=========  ======  ==========  ========  ==========
gtrxl      pre     relu        gru       xl
trxl       post    none        residual  xl
trxl_i     pre     relu        residual  xl
=========  ======  ==========  ========  ==========

Memory semantics (Dai et al. 2019, section 3.2, with an explicit window): each
layer attends over its stored inputs of the previous M steps (stop-gradient)
and the current segment, and every query sees at most the last M steps plus
itself. With that window, running a sequence in chunks with memory gives the
same outputs as running it whole, and acting one step at a time with the
cache in :class:`rltrans.memory.MemoryState` gives the same outputs again.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from rltrans.backbones.base import BackboneOutput, StepOutput
from rltrans.core.block import BlockConfig, build_block
from rltrans.core.long_memory import LongState
from rltrans.core.position import build_input_position
from rltrans.memory import (
    Memory,
    MemoryState,
    WindowedMemory,
    last_steps,
    next_window_validity,
)

PRESETS: dict[str, dict[str, Any]] = {
    "gtrxl": {"norm": "pre", "sublayer_activation": "relu", "gate": "gru", "position": "xl"},
    "trxl": {"norm": "post", "sublayer_activation": "none", "gate": "residual", "position": "xl"},
    "trxl_i": {"norm": "pre", "sublayer_activation": "relu", "gate": "residual", "position": "xl"},
}


def preset_config(name: str, dim: int, heads: int, **overrides: Any) -> BlockConfig:
    """The BlockConfig of ``gtrxl``, ``trxl`` or ``trxl_i``; overrides change its options."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid choices: {', '.join(PRESETS)}")
    return BlockConfig(dim=dim, heads=heads, **{**PRESETS[name], **overrides})


def check_stack_options(config: BlockConfig, memory: int, chunk: int | None) -> None:
    """Refuse a memory size M or chunk length a stack built from ``config`` cannot run with."""
    if memory < 0:
        raise ValueError(f"memory must be >= 0, got {memory}")
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk must be >= 1 or None, got {chunk}")
    if config.long_memory != "none" and memory < 1:
        raise ValueError(
            f"long_memory={config.long_memory!r} is carried from segment to segment in the "
            f"stack's memory: it needs memory >= 1, got {memory}"
        )
    if config.adaptive_span and memory < 1:
        raise ValueError(
            "adaptive_span learns how much of the memory window to read: it needs "
            f"memory >= 1, got {memory}"
        )


class TransformerStack(WindowedMemory, nn.Module):
    """A stack of Y TransformerBlocks, all built from one BlockConfig, with optional segment
    memory of M steps.

    >>> stack = TransformerStack(BlockConfig(dim=32, heads=4), layers=2, memory=8)
    >>> mem = stack.empty_memory(batch=3)
    >>> out = stack(torch.randn(3, 5, 32), mem)
    >>> out.hidden.shape, out.memory.hidden.shape
    (torch.Size([3, 5, 32]), torch.Size([3, 2, 8, 32]))
    """

    pure_step: ClassVar[bool] = True  # step_begin / step_outputs / step_end
    ponders: ClassVar[bool] = False
    selects_outputs: ClassVar[bool] = True  # forward(outputs=...)
    # True while rltrans.accel traces a compiled program: no data-dependent shortcut.
    static_graph = False

    def __init__(
        self, config: BlockConfig, layers: int, *, memory: int = 0, chunk: int | None = None
    ) -> None:
        super().__init__()
        check_stack_options(config, memory, chunk)
        self.config, self.layers, self.memory = config, layers, memory
        # A training segment longer than ``chunk`` steps runs chunk by chunk (see forward).
        self.chunk = chunk
        self.dim, self.heads, self.causal = config.dim, config.heads, config.causal
        self.input_position = build_input_position(
            config.position, config.dim, max_len=config.max_len
        )
        # Queries may be cut to the wanted outputs in the last layer only where a query's
        # position does not enter the attention scores.
        self.position_free_queries = config.position in ("none", "sinusoidal", "learned")
        self.blocks = nn.ModuleList(build_block(config) for _ in range(layers))
        # Each layer's span reach for eager acting steps, read when an acting state is built
        # or refreshed (step_contexts); the whole window until then.
        self.acting_reach: tuple[int, ...] = (memory,) * layers
        # Pre-norm leaves the residual stream unnormalised: close with a LayerNorm (GPT-2's ln_f).
        self.final_norm = nn.LayerNorm(config.dim) if config.norm == "pre" else nn.Identity()

    @property
    def memory_slots(self) -> int:
        """One memory window per layer."""
        return self.layers

    def memory_blocks(self) -> list:
        """One block per layer reads that layer's cached inputs."""
        return list(self.blocks)

    @property
    def long_memory(self) -> bool:
        """Whether the blocks read a long memory beyond the window."""
        return self.config.long_memory != "none"

    def _long_state(self, batch: int, device, dtype, layer_first: bool) -> tuple[Tensor, ...]:
        """Zero long-memory state of every layer: () without a long memory."""
        if not self.long_memory:
            return ()
        states = [b.long.empty_state(batch, device, dtype) for b in self.blocks]
        dim = 0 if layer_first else 1
        return tuple(torch.stack(parts, dim=dim) for parts in zip(*states, strict=True))

    def empty_memory(self, batch: int, device=None, dtype=None) -> Memory:
        """All-invalid training memory for ``batch`` sequences (and a zero long memory)."""
        memory = super().empty_memory(batch, device, dtype)
        return memory._replace(long=self._long_state(batch, device, dtype, layer_first=False))

    def initial_state(self, envs: int, device=None, dtype=None) -> MemoryState:
        """All-invalid acting state for ``envs`` environments (and a zero long memory)."""
        state = super().initial_state(envs, device, dtype)
        long = self._long_state(envs, state.keys.device, state.keys.dtype, layer_first=True)
        return state._replace(long=long)

    def add_input_position(self, x: Tensor, positions: Tensor) -> Tensor:
        """Add the absolute position embedding, if the scheme has one."""
        if self.input_position is None:
            return x
        return x + self.input_position(positions).to(x.dtype)

    def forward(
        self,
        x: Tensor,
        memory: Memory | None = None,
        *,
        starts: Tensor | None = None,
        key_padding: Tensor | None = None,
        positions: Tensor | None = None,
        outputs: slice | None = None,
    ) -> BackboneOutput:
        """Run a segment x (B, L, D) after ``memory``; return outputs and the next memory.

        starts (B, L) bool: True where a new episode begins (memory and earlier
        steps become invisible from there on). key_padding (B, L) bool: True for
        real tokens (only without memory). positions (B, L) long: absolute
        positions for absolute schemes (default: steps since episode start).
        outputs: return only these positions (B, L', D); with a position-free scheme
        the last layer then computes queries, MLP and final norm for them alone (the
        Decision Transformer needs only its state tokens: ~18 % fewer FLOPs at 3 layers).

        With ``chunk`` set, a segment after ``memory`` that is longer runs as consecutive
        chunks of ``chunk`` steps (truncated backpropagation through time over the segment):
        the outputs are the same, attention costs O(chunk (M + chunk)) per step instead of
        O(L (M + L)), the window's memory is stop-gradient between chunks as between
        segments, and a long memory's state passes from chunk to chunk with its gradient, so
        a step's loss reaches every earlier step of the segment through it.
        """
        whole = key_padding is None and positions is None and outputs is None
        if self.chunk and memory is not None and x.shape[1] > self.chunk and whole:
            return self._chunked(x, memory, starts)
        return self._segment(x, memory, starts, key_padding, positions, outputs)

    def _chunked(self, x: Tensor, memory: Memory, starts: Tensor | None) -> BackboneOutput:
        """``forward`` over chunks of ``self.chunk`` steps (see there)."""
        hidden, out = [], None
        for c in range(0, x.shape[1], self.chunk):
            part = None if starts is None else starts[:, c : c + self.chunk]
            out = self._segment(x[:, c : c + self.chunk], memory, part, long_grad=c > 0)
            hidden.append(out.hidden)
            memory = out.memory
        return BackboneOutput(torch.cat(hidden, dim=1), memory, out.aux)

    def _segment(
        self,
        x: Tensor,
        memory: Memory | None,
        starts: Tensor | None,
        key_padding: Tensor | None = None,
        positions: Tensor | None = None,
        outputs: slice | None = None,
        *,
        long_grad: bool = False,
    ) -> BackboneOutput:
        """One pass over a segment (``forward`` without chunks); ``long_grad`` keeps the
        gradient of the long memory's state in ``memory`` (a chunk after the first)."""
        if self.memory == 0:
            memory = None  # a memoryless stack passes no memory on
        m = self.memory if memory is not None else 0
        if memory is not None and memory.hidden.shape[2] != self.memory:
            got = memory.hidden.shape[2]
            raise ValueError(f"memory holds {got} steps, the stack expects {self.memory}")
        positions, mask = self.segment_context(x, memory, starts, key_padding, positions)
        h = self.add_input_position(x, positions)
        new_hidden, new_long = [], []
        cut = outputs is not None and self.position_free_queries
        long_before = self._long_before(memory, x, keep_grad=long_grad)
        for i, block in enumerate(self.blocks):
            mem_kv, block_mask = None, mask
            if memory is not None:
                mem_h = memory.hidden[:, i].detach()  # stop-gradient into memory (Dai et al. 2019)
                new_hidden.append(last_steps(torch.cat([mem_h, h.detach()], dim=1), m))  # (B, M, D)
                keep = self.span_reach(block)  # M, or fewer with an adaptive span
                mem_kv = block.memory_kv(mem_h[:, m - keep :])
                block_mask = mask[..., m - keep :]
            if block.span is not None:
                block_mask = block.span.segment_mask(block_mask, x.shape[1], self.memory, x.dtype)
            long = None if long_before is None else (long_before[i], starts)
            if cut and i == len(self.blocks) - 1:
                block_mask = block_mask[:, :, outputs]
                h, _, long = block(h, mem_kv, block_mask, queries=outputs, long=long)
            else:
                h, _, long = block(h, mem_kv, block_mask, long=long)
            new_long.append(long)
        if outputs is not None and not cut:
            h = h[:, outputs]
        out = self.final_norm(h)
        aux = self.span_aux()
        if memory is None:
            return BackboneOutput(out, None, aux)
        hidden = torch.stack(new_hidden, dim=1)  # (B, Y, M, D)
        validity = next_window_validity(memory.valid, starts, positions, self.memory)
        long_after = ()
        if self.long_memory:
            long_after = tuple(torch.stack(parts, dim=1) for parts in zip(*new_long, strict=True))
        return BackboneOutput(out, Memory(hidden, *validity, long_after), aux)

    @property
    def adaptive_span(self) -> bool:
        """Whether each head learns its attention span (:mod:`rltrans.core.span`)."""
        return self.config.adaptive_span

    def span_reach(self, block: nn.Module) -> int:
        """How many of the last M steps ``block`` attends over: M, or with an adaptive span
        the steps its longest head can still weight (eager only: a compiled step keeps its
        static M and masks the rest)."""
        if block.span is None or self.static_graph:
            return self.memory
        return block.span.reach(self.memory)

    def span_aux(self) -> dict[str, Tensor]:
        """``spans`` (Y, H): every head's learned span in steps (with gradient, for the L1
        cost); empty without an adaptive span."""
        if not self.adaptive_span:
            return {}
        return {"spans": torch.stack([b.span.spans(self.memory) for b in self.blocks])}

    def _long_before(
        self, memory: Memory | None, x: Tensor, *, keep_grad: bool = False
    ) -> list[LongState] | None:
        """Each layer's long-memory state before a segment (stop-gradient unless
        ``keep_grad``: a segment learns from the state it was acted with, as an RNN from its
        stored state); zero where no memory is given; None without a long memory."""
        if not self.long_memory:
            return None
        long = memory.long if memory is not None else ()
        if not long:
            long = self._long_state(x.shape[0], x.device, x.dtype, layer_first=False)
        cut = (lambda t: t) if keep_grad else Tensor.detach
        return [b.long.State(*(cut(t[:, i]) for t in long)) for i, b in enumerate(self.blocks)]

    @torch.no_grad()
    def step(self, x: Tensor, state: MemoryState, done: Tensor | None = None) -> StepOutput:
        """Act one step for N envs with the key/value cache: O(M) attention per layer.

        x (N, D); done (N,) bool marks envs whose episode starts at this step.
        Updates the state's tensors in place and returns it (with the cursor moved).
        """
        state, inputs = self.step_begin(state, done, x.dtype)
        out, *cache = self.step_outputs(x, *inputs)
        return StepOutput(out, self.step_end(state, *cache), {})

    def step_contexts(self, device: torch.device, dtype: torch.dtype) -> tuple[Any, ...]:
        """Each layer's per-step context for a window of M steps (see ``step_context``).

        Also notes each layer's span reach for the eager acting steps (:attr:`acting_reach`):
        its host read happens here, once per weight update, not at every step and layer (a
        device sync each on CUDA). The weights do not change between refreshes."""
        self.acting_reach = tuple(self.span_reach(b) for b in self.blocks)
        return tuple(b.attn.scheme.step_context(self.memory, device, dtype) for b in self.blocks)

    def step_begin(
        self, state: MemoryState, done: Tensor | None, dtype: torch.dtype
    ) -> tuple[MemoryState, tuple]:
        """The state work before a step: forget ended episodes, build the mask; returns the
        state and the inputs of :meth:`step_outputs` after x: (time, window_k, window_v, mask,
        contexts). The contexts are the state's own (built with it or at its last refresh),
        so a compiled step takes them as inputs."""
        if len(state.contexts) != len(self.blocks):
            raise ValueError("the acting state lacks step contexts: build it with initial_state")
        if done is not None:
            state = state.reset_where(done.bool())
        mask = state.step_mask(dtype)  # (N, 1, M+1): the valid window and the query itself
        window_k, window_v = state.windows()  # (Y, N, H, M, D/H) views
        return state, (state.time, window_k, window_v, mask, state.contexts, state.long)

    def step_end(
        self, state: MemoryState, hidden: Tensor, keys: Tensor, values: Tensor, *long: Tensor
    ) -> MemoryState:
        """The state work after a step: cache its layer inputs and keys/values (and the new
        long-memory state), move on."""
        state.store(slice(None), hidden, keys, values)
        for old, new in zip(state.long, long, strict=True):
            old.copy_(new)
        return state.advance()

    def step_outputs(
        self,
        x: Tensor,
        time: Tensor,
        window_k: Tensor,
        window_v: Tensor,
        mask: Tensor,
        contexts: tuple[Any, ...],
        long: tuple[Tensor, ...] = (),
    ) -> tuple[Tensor, ...]:
        """The math of one acting step as a pure function (no writes, so it can be compiled):
        x (N, D) at episode times ``time`` (N,) over the cached windows (Y, N, H, M, D/H) and
        the long-memory state (layer-first; () without one).

        Returns the output (N, D) and, for the cache, every layer's input (Y, N, D), this
        step's keys and values (Y, N, H, D/H) and the new long-memory state (none without one).
        """
        h = self.add_input_position(x, time)  # (N, D)
        hidden, keys, values, new_long = [], [], [], []
        for i, block in enumerate(self.blocks):
            hidden.append(h)
            state = block.long.State(*(t[i] for t in long)) if long else None
            wk, wv, block_mask, context = window_k[i], window_v[i], mask, contexts[i]
            if block.span is not None:  # the window's last K steps, weighted by the span
                m = self.memory
                keep = m if self.static_graph else self.acting_reach[i]
                wk, wv, block_mask = (
                    wk[:, :, m - keep :],
                    wv[:, :, m - keep :],
                    mask[..., m - keep :],
                )
                context = block.attn.scheme.crop_context(context, m, keep)
                block_mask = block.span.step_mask(block_mask, m)
            h, k, v, state = block.step(h, wk, wv, block_mask, context, state)
            keys.append(k)
            values.append(v)
            new_long.append(state)
        cache = (torch.stack(hidden), torch.stack(keys), torch.stack(values))
        if long:  # plain lists: the compiled step is traced by torch >= 2.4's dynamo
            cache += tuple(torch.stack([s[j] for s in new_long]) for j in range(len(long)))
        return self.final_norm(h), *cache
