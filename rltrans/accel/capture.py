"""A pure function of tensors replayed from a CUDA graph, or run as it is where there is none.

An acting step of a small transformer is a few dozen kernels per layer, each too short to
hide the host's launch of the next: on a GPU the device waits on Python. A CUDA graph
(``torch.cuda.CUDAGraph``, public since torch 1.10) records the kernels of one call and
replays them with a single launch. :class:`Captured` records ``fn`` once per input
signature (structure, shapes, strides, dtypes, device) into static input buffers, taking
``owner``'s static paths while it records (:mod:`rltrans.accel.static`), and at each call
copies the inputs in, replays, and returns copies of the outputs (so a later call, e.g. a
bootstrap value between two steps, cannot overwrite what the caller holds).

Random draws inside ``fn`` use torch's default CUDA generator, which graphs support (each
replay advances its offset). Parameters are read where they live, so optimiser steps and
``load_state_dict`` (both in place) show in the next replay without a new capture.

Where CUDA graphs are not available (a CPU tensor, no CUDA build), :class:`Captured` calls
``fn`` itself: the same numbers, the same code path above it, tested on the CPU. Where
recording fails (an op that reads a value on the host), it says so once on stderr and calls
``fn`` for that signature from then on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rltrans.accel.compile import _flatten, _report, _unflatten
from rltrans.accel.static import static_modules, static_paths

WARMUP = 3  # eager calls on a side stream before capture (lazy inits, autotuning)


class Captured:
    """``fn`` replayed from one CUDA graph per input signature on CUDA; ``fn`` elsewhere."""

    def __init__(
        self, fn: Callable, *, owner: nn.Module | None = None, warmup: int = WARMUP
    ) -> None:
        self.fn, self.warmup = fn, warmup
        self.modules = static_modules(owner) if owner is not None else []
        # per input signature: (graph, static inputs, static outputs), or None where the
        # recording failed (that signature then runs eagerly)
        self.graphs: dict[tuple, tuple[Any, list[torch.Tensor], Any] | None] = {}

    def __call__(self, *args: Any) -> Any:
        """``fn(*args)``: replayed where the inputs are CUDA tensors, else called."""
        leaves: list[torch.Tensor] = []
        spec = _flatten(args, leaves)
        if not leaves or not all(t.is_cuda for t in leaves):
            return self.fn(*args)
        key = (spec, *((t.shape, t.dtype, t.device, t.stride()) for t in leaves))
        entry = self.graphs.get(key)
        if entry is None:
            try:
                entry = self._capture(spec, leaves)
            except RuntimeError as err:  # an op that cannot be recorded: run eagerly
                entry = None
                first = (str(err).strip().splitlines() or [""])[0]
                _report(f"rollout: the acting step cannot be replayed from a CUDA graph "
                        f"({first[:200]}); it runs eagerly")  # fmt: skip
            self.graphs[key] = entry
        if entry is None:
            return self.fn(*args)
        graph, static, out = entry
        for slot, value in zip(static, leaves, strict=True):
            if slot.data_ptr() != value.data_ptr():
                slot.copy_(value)
        graph.replay()
        return _clone(out)

    def _capture(self, spec: Any, leaves: list[torch.Tensor]) -> tuple:
        """Warm ``fn`` up on a side stream, then record one call on static inputs."""
        static = [t.clone() for t in leaves]
        args = _unflatten(spec, iter(static))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        # ``owner``'s static paths: no branch on a tensor's value (a host read) while recording
        with static_paths(self.modules):
            with torch.cuda.stream(side):
                for _ in range(self.warmup):
                    self.fn(*args)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self.fn(*args)
        return graph, static, out


def _clone(obj: Any) -> Any:
    """``obj`` with every tensor copied (structure kept)."""
    leaves: list[torch.Tensor] = []
    spec = _flatten(obj, leaves)
    return _unflatten(spec, iter([t.clone() for t in leaves]))


__all__ = ["Captured"]
