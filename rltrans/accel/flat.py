"""A model's parameters as views into one flat buffer, and their gradients into another.

:func:`trainable` picks how a learner's optimizer sees a model: :class:`FlatParameters` on
CPU, :class:`PerTensor` elsewhere; both offer ``tensors`` (what the optimizer trains),
``zero_grad``, ``sync`` (after backward) and ``optimizer_state`` (a saved optimizer state in
this layout), so the learner never asks which one it has.

PPO's models are small (~0.2-1M parameters in ~70 tensors), so per-tensor work outside the
compiled loss is a visible share of a CPU minibatch: zeroing, clipping (one norm per tensor)
and AdamW took 1.1-1.7 ms per minibatch at 4 layers x 64 (the PPO setup of
``benchmarks/speed.py --vary agent``, ~13 ms per minibatch) against 0.3-0.4 ms over one flat
tensor, where each is one op; a whole compiled PPO update took 0.94x the time (interleaved
runs).

Each parameter is re-created as a view of the flat parameter (via ``detach``: the optimizer
updates the flat tensor in place and every parameter sees the update), and its ``.grad`` is a
view of the flat gradient, which autograd accumulates into in place. Parameter offsets are
aligned to 64 bytes, so every view starts where vectorised kernels want it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

ALIGN = 16  # elements (64 bytes of float32) between parameter starts


@dataclass(frozen=True)
class FlatLayout:
    """Where each parameter (by shape, in ``model.parameters()`` order) sits in the flat buffer."""

    shapes: tuple[torch.Size, ...]
    offsets: tuple[int, ...]
    size: int

    @staticmethod
    def of(shapes: list[torch.Size]) -> FlatLayout:
        """Consecutive aligned slots for parameters of these shapes."""
        offsets, end = [], 0
        for shape in shapes:
            offsets.append(end)
            end += -(-shape.numel() // ALIGN) * ALIGN
        return FlatLayout(tuple(shapes), tuple(offsets), end)

    def views(self, flat: Tensor) -> list[Tensor]:
        """The per-parameter views of a flat tensor."""
        return [
            flat[o : o + s.numel()].view(s) for o, s in zip(self.offsets, self.shapes, strict=True)
        ]

    def flatten(self, tensors: list[Tensor]) -> Tensor:
        """One zero-padded flat tensor holding per-parameter tensors (e.g. optimizer moments)."""
        flat = tensors[0].new_zeros(self.size)
        for view, t in zip(self.views(flat), tensors, strict=True):
            view.copy_(t)
        return flat


def trainable(model: nn.Module) -> FlatParameters | PerTensor:
    """The parameters an optimizer trains: flat for a CPU model of one dtype with no frozen
    parameter, else the model's own tensors.

    On CUDA the fused and foreach kernels already take many tensors per launch, and cuDNN's
    RNNs keep their weights in a layout of their own, so models there are left as they are.
    """
    params = list(model.parameters())
    kinds = {(p.dtype, p.device.type) for p in params}
    if len(kinds) != 1 or next(iter(kinds))[1] != "cpu" or not all(p.requires_grad for p in params):
        return PerTensor(model)  # frozen parameters would be weight-decayed in a flat buffer
    return FlatParameters(model)


class PerTensor:
    """A model's parameters trained tensor by tensor (the interface of
    :class:`FlatParameters`, doing nothing special)."""

    def __init__(self, model: nn.Module) -> None:
        self.tensors = list(model.parameters())
        self.layout = FlatLayout.of([p.shape for p in self.tensors])

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        """Drop the gradients."""
        optimizer.zero_grad(set_to_none=True)

    def sync(self) -> None:
        """Nothing to check: the gradients are the parameters' own."""

    def optimizer_state(self, state: dict) -> dict:
        """An optimizer state dict saved for this model, per parameter (one saved for flat
        parameters, e.g. on a CPU run, is split up)."""
        if len(self.layout.shapes) > 1 and is_flat_state(state, self.layout):
            return to_per_parameter_state(state, self.layout)
        return state


def is_flat_state(state: dict, layout: FlatLayout) -> bool:
    """Whether an optimizer state dict was saved for one flat parameter of ``layout``."""
    if len(state["param_groups"][0]["params"]) != 1:
        return False
    moments = [v for v in state["state"].get(0, {}).values() if v.dim() > 0]
    return not moments or (moments[0].dim() == 1 and moments[0].numel() == layout.size)


class FlatParameters:
    """Re-create ``model``'s parameters as views of one flat :class:`nn.Parameter` (``.param``)
    with one flat gradient; train ``.param`` with any optimizer.

    >>> net = nn.Linear(3, 2)
    >>> flat = FlatParameters(net)
    >>> net.weight.data_ptr() == flat.param.data_ptr()
    True
    """

    def __init__(self, model: nn.Module) -> None:
        params = list(model.parameters())
        kinds = {(p.dtype, p.device) for p in params}
        if len(kinds) != 1:
            raise ValueError(
                f"flat parameters need one dtype and device, got {sorted(map(str, kinds))}"
            )
        self.layout = FlatLayout.of([p.shape for p in params])
        self.param = nn.Parameter(self.layout.flatten([p.detach() for p in params]))
        self.param.grad = torch.zeros_like(self.param)
        data, grads = self.layout.views(self.param.detach()), self.layout.views(self.param.grad)
        new = {}
        for old, view, grad in zip(params, data, grads, strict=True):
            new[id(old)] = nn.Parameter(view, requires_grad=old.requires_grad)
            new[id(old)].grad = grad
        for module in model.modules():  # every owner (shared parameters included)
            for name, p in list(module._parameters.items()):
                if p is not None and id(p) in new:
                    setattr(module, name, new[id(p)])  # setattr: RNNs refresh their weight lists
        self.links = [(new[id(p)], grad) for p, grad in zip(params, grads, strict=True)]
        self.start = self.param.data_ptr()
        self.tensors = [self.param]  # what the optimizer trains

    def zero_grad(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Zero the flat gradient (never None: autograd must accumulate into its views)."""
        self.param.grad.zero_()

    def optimizer_state(self, state: dict) -> dict:
        """An optimizer state dict for the flat parameter (one saved per parameter, e.g. on
        CUDA, is merged)."""
        return state if is_flat_state(state, self.layout) else to_flat_state(state, self.layout)

    def sync(self) -> None:
        """Check after backward that every parameter still aliases the flat buffers: a
        ``.grad`` replaced (e.g. by ``model.zero_grad()``, which sets None) is copied back and
        relinked; storage moved away (``model.to``, ``load_state_dict(assign=True)``) raises."""
        for (p, grad), offset in zip(self.links, self.layout.offsets, strict=True):
            if p.data_ptr() != self.start + offset * p.element_size():
                raise RuntimeError(
                    "a parameter no longer lives in the learner's flat buffer (the model was "
                    "moved or its parameters replaced after the learner was built); build the "
                    "learner after moving the model"
                )
            if p.grad is not grad:
                if p.grad is None:
                    grad.zero_()
                else:
                    grad.copy_(p.grad)
                p.grad = grad


def to_flat_state(state: dict, layout: FlatLayout) -> dict:
    """An optimizer state dict saved per parameter, converted to one flat parameter (0-d
    entries such as Adam's step count are shared, so the first parameter's is kept)."""
    saved, merged = state["state"], {}
    if saved:
        for k, first in saved[0].items():
            values = [saved[i][k] for i in range(len(layout.shapes))]
            merged[k] = first.clone() if first.dim() == 0 else layout.flatten(values)
    group = {**state["param_groups"][0], "params": [0]}
    return {"state": {0: merged} if merged else {}, "param_groups": [group]}


def to_per_parameter_state(state: dict, layout: FlatLayout) -> dict:
    """An optimizer state dict saved for one flat parameter, converted to per-parameter state."""
    indices = list(range(len(layout.shapes)))
    per: dict[int, dict] = {i: {} for i in indices} if state["state"] else {}
    for k, v in state["state"].get(0, {}).items():
        for i, view in enumerate(layout.views(v) if v.dim() else [v] * len(indices)):
            per[i][k] = view.clone()
    group = {**state["param_groups"][0], "params": indices}
    return {"state": per, "param_groups": [group]}
