"""Universal Transformer backbone: one shared block looped in depth, with ACT.

Dehghani et al. 2019, section 2.1: the same block (weights tied across depth) refines every
position for up to S = ``max_steps`` depth steps, the coordinate embedding P^t (the position
signal plus a sinusoid of the depth step t) added before each,

    H^t = Block(H^{t-1} + P^t),   t = 1 .. S,

and Adaptive Computation Time (Graves 2016; :mod:`rltrans.core.act`) decides per position
when to stop, the output the halting-weighted mean of the H^t (``halting="none"``: H^S).
Absolute position schemes are added at every depth step at each token's episode time;
relative ones act inside attention, and P^t is then the depth sinusoid alone.

``coordinate_scale`` (default 1, the paper's) scales P^t: the unit sinusoid was sized for
token embeddings scaled up by sqrt(D), and an RL encoder's output is far smaller, so P^t,
the same for every token, would make the tokens look alike to attention and to the halting
unit (``configs/agent/ut_act.yaml`` uses 0.1; ``benchmarks/ut_act.py`` measures it).

Memory (one per depth step), as :class:`rltrans.backbones.gtrxl.TransformerStack` with
Y = S: at depth t a query attends over the stored depth-t inputs H^{t-1} + P^t of the last
M steps (stop-gradient) and of the segment, so chunked equals whole and cached acting equals
both. A halted position keeps its state but is still fed through the block, so every depth
slot is always filled and keys never depend on how long other tokens pondered.

Interface: as every backbone (:mod:`rltrans.backbones.base`), with ``ponders = True``: the
``aux`` holds ``ponder_cost`` (B, L) = N + R (add ``tau * ponder_cost`` to the loss; it
carries the gradient to the halting unit), ``ponder_steps`` N, ``remainders`` R,
``halt_prob_mean`` and ``halting_weights`` (S, B, L); from ``step`` each per env. Its step
writes the cache between depth steps, so ``pure_step = False``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from rltrans.backbones.base import BackboneOutput, StepOutput
from rltrans.core.act import ACTOutput, HaltingName, build_halting
from rltrans.core.block import BlockConfig, build_block
from rltrans.core.position import build_input_position, sinusoid
from rltrans.memory import Memory, MemoryState, WindowedMemory, last_steps, next_window_validity


def act_aux(result: ACTOutput) -> dict[str, Tensor]:
    """The aux dict of a halting loop: ponder cost, N, R, mean h (B, L) and weights (S, B, L)."""
    steps = result.steps.to(result.remainders.dtype)  # (B, L) float, for means and logging
    return {
        "ponder_cost": result.ponder_cost,
        "ponder_steps": steps,
        "remainders": result.remainders,
        "halt_prob_mean": result.halt_probs.sum(0) / steps,
        "halting_weights": result.weights,
    }


def check_universal_options(config: BlockConfig, memory: int, coordinate_scale: float) -> None:
    """Refuse a memory size M, coordinate scale or block option the Universal Transformer
    cannot run with (its depth steps share one block)."""
    if memory < 0:
        raise ValueError(f"memory must be >= 0, got {memory}")
    if coordinate_scale < 0:
        raise ValueError(f"coordinate_scale must be >= 0, got {coordinate_scale}")
    if config.long_memory != "none":  # its depth steps share one block: one state per step
        raise ValueError(
            f"long_memory={config.long_memory!r} is for the gtrxl, trxl and trxl_i stacks; "
            "the Universal Transformer takes long_memory=none"
        )
    if config.adaptive_span:
        raise ValueError(
            "adaptive_span is for the gtrxl, trxl and trxl_i stacks; the Universal "
            "Transformer takes adaptive_span=false"
        )


class UniversalTransformer(WindowedMemory, nn.Module):
    """One shared TransformerBlock, built from ``config``, applied up to ``max_steps`` times
    with ACT halting.

    The BlockConfig defaults make the shared block a GTrXL block. ``halting_bias``
    initialises the halting unit (see :class:`rltrans.core.act.AdaptiveHalting`).
    ``coordinate_scale`` multiplies the coordinate embedding P^t (depth sinusoid and
    absolute position signal; see the module docstring).

    >>> ut = UniversalTransformer(BlockConfig(dim=32, heads=4), max_steps=4, memory=8)
    >>> mem = ut.empty_memory(batch=3)
    >>> y, mem, aux = ut(torch.randn(3, 5, 32), mem)
    >>> y.shape, mem.hidden.shape, aux["ponder_cost"].shape
    (torch.Size([3, 5, 32]), torch.Size([3, 4, 8, 32]), torch.Size([3, 5]))
    """

    pure_step: ClassVar[bool] = False  # the depth loop writes the cache between depth steps
    ponders: ClassVar[bool] = True  # aux holds the ACT outputs
    selects_outputs: ClassVar[bool] = False

    def __init__(
        self,
        config: BlockConfig,
        *,
        max_steps: int = 6,
        memory: int = 0,
        halting: HaltingName = "act",
        act_epsilon: float = 0.01,
        halting_bias: float = -1.0,
        coordinate_scale: float = 1.0,
    ) -> None:
        super().__init__()
        check_universal_options(config, memory, coordinate_scale)
        dim = config.dim
        self.config, self.memory, self.coordinate_scale = config, memory, coordinate_scale
        self.dim, self.heads, self.causal = dim, config.heads, config.causal
        self.halting = build_halting(
            halting, dim, max_steps, epsilon=act_epsilon, halting_bias=halting_bias
        )
        self.max_steps = max_steps
        self.input_position = build_input_position(config.position, dim, max_len=config.max_len)
        self.block = build_block(config)
        # Depth half of the coordinate embedding, sinusoid(t) for t = 1 .. S (Dehghani §2.1).
        depth = coordinate_scale * sinusoid(torch.arange(1, max_steps + 1), dim)  # (S, D)
        self.register_buffer("depth_signal", depth, persistent=False)
        # Pre-norm leaves the residual stream unnormalised: close with a LayerNorm.
        self.final_norm = nn.LayerNorm(dim) if config.norm == "pre" else nn.Identity()

    @property
    def memory_slots(self) -> int:
        """One memory window per depth step."""
        return self.max_steps

    def memory_blocks(self) -> list:
        """The one shared block reads the cached inputs of every depth step."""
        return [self.block] * self.memory_slots

    def step_contexts(self, device: torch.device, dtype: torch.dtype) -> tuple[Any, ...]:
        """The shared block's per-step context, used at every depth step."""
        return (self.block.attn.scheme.step_context(self.memory, device, dtype),)

    def coordinates(self, h: Tensor, step: int, position: Tensor | None) -> Tensor:
        """Block input H + P^t at depth ``step`` (0-based): depth sinusoid plus position signal."""
        u = h + self.depth_signal[step].to(h.dtype)  # (B, L, D)
        return u if position is None else u + position

    def position_signal(self, positions: Tensor, dtype: torch.dtype) -> Tensor | None:
        """Absolute position embedding (B, L, D) of episode times, None for relative schemes."""
        if self.input_position is None:
            return None
        return self.coordinate_scale * self.input_position(positions).to(dtype)

    def forward(
        self,
        x: Tensor,
        memory: Memory | None = None,
        *,
        starts: Tensor | None = None,
        key_padding: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> BackboneOutput:
        """Run a segment x (B, L, D) after ``memory``; return outputs, next memory and aux.

        starts (B, L) bool: True where a new episode begins. key_padding (B, L)
        bool: True for real tokens (only without memory). positions (B, L) long:
        episode times for absolute schemes (default: steps since episode start).
        """
        m = self.memory if memory is not None else 0
        if memory is not None and memory.hidden.shape[1:3] != (self.max_steps, self.memory):
            got = tuple(memory.hidden.shape[1:3])
            want = (self.max_steps, self.memory)
            raise ValueError(f"memory holds (depth steps, steps) = {got}, expected {want}")
        positions, mask = self.segment_context(x, memory, starts, key_padding, positions)
        position = self.position_signal(positions, x.dtype)
        block_inputs: list[Tensor] = []  # depth-t block inputs H^{t-1} + P^t, (B, L, D) each

        def depth_step(h: Tensor, step: int) -> Tensor:
            u = self.coordinates(h, step, position)
            block_inputs.append(u)
            mem_kv = None
            if memory is not None:
                # stop-gradient into memory (Dai et al. 2019), one entry per depth step
                mem_kv = self.block.memory_kv(memory.hidden[:, step].detach())
            return self.block(u, mem_kv, mask)[0]

        result = self.halting(x, depth_step)
        out, aux = self.final_norm(result.output), act_aux(result)
        if memory is None:
            return BackboneOutput(out, None, aux)
        hidden = torch.stack(
            [
                last_steps(torch.cat([memory.hidden[:, t].detach(), u.detach()], dim=1), m)
                for t, u in enumerate(block_inputs)
            ],  # (B, M, D) each
            dim=1,
        )  # (B, S, M, D)
        valid, time = next_window_validity(memory.valid, starts, positions, self.memory)
        return BackboneOutput(out, Memory(hidden, valid, time), aux)

    @torch.no_grad()
    def step(self, x: Tensor, state: MemoryState, done: Tensor | None = None) -> StepOutput:
        """Act one step for N envs with the per-depth key/value cache: O(S M) attention.

        x (N, D); done (N,) bool marks envs whose episode starts at this step.
        Updates the state's tensors in place and returns it (cursor moved) and aux
        with (N,) tensors (``halting_weights`` (S, N)).
        """
        if done is not None:
            state = state.reset_where(done.bool())
        mask = state.step_mask(x.dtype)  # (N, 1, M+1): the valid window and the query itself
        position = self.position_signal(state.time.unsqueeze(1), x.dtype)  # (N, 1, D) | None

        window_k, window_v = state.windows()  # (S, N, H, M, D/H) views
        (context,) = state.contexts  # built with the state or at its last refresh

        def depth_step(h: Tensor, step: int) -> Tensor:
            u = self.coordinates(h, step, position)[:, 0]  # (N, D)
            out, k, v, _ = self.block.step(u, window_k[step], window_v[step], mask, context)
            state.store(step, u, k, v)
            return out.unsqueeze(1)  # (N, 1, D)

        result = self.halting(x.unsqueeze(1), depth_step)
        aux = {name: value[..., 0] for name, value in act_aux(result).items()}
        return StepOutput(self.final_norm(result.output[:, 0]), state.advance(), aux)
