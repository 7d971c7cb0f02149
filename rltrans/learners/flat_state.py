"""Optimizer states saved by earlier releases, read back per parameter.

Until this release a learner on CPU trained its model's parameters as views of one flat
tensor, so a checkpoint written by a CPU run holds its optimizer state for one parameter:
each moment a vector with every parameter's values in ``model.parameters()`` order, each
parameter starting at a multiple of 16 elements (zeros between). The learner now trains the
parameters as they are; :func:`per_parameter_state` splits such a state up, so those run
folders still resume. Nothing writes the flat layout any more.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

ALIGN = 16  # elements between parameter starts in the flat layout


def flat_offsets(shapes: Sequence[torch.Size]) -> tuple[list[int], int]:
    """Each parameter's offset in the flat layout, and the layout's total size."""
    offsets, end = [], 0
    for shape in shapes:
        offsets.append(end)
        end += -(-shape.numel() // ALIGN) * ALIGN
    return offsets, end


def is_flat_state(state: dict, shapes: Sequence[torch.Size]) -> bool:
    """Whether an optimizer state dict was saved for one flat parameter of these shapes."""
    if len(shapes) < 2 or len(state["param_groups"][0]["params"]) != 1:
        return False
    moments = [v for v in state["state"].get(0, {}).values() if v.dim() > 0]
    size = flat_offsets(shapes)[1]
    return not moments or (moments[0].dim() == 1 and moments[0].numel() == size)


def per_parameter_state(state: dict, shapes: Sequence[torch.Size]) -> dict:
    """``state`` per parameter: split up where it was saved for one flat parameter (0-d
    entries such as Adam's step count go to every parameter), else as it is."""
    if not is_flat_state(state, shapes):
        return state
    offsets, _ = flat_offsets(shapes)
    indices = list(range(len(shapes)))
    per: dict[int, dict] = {i: {} for i in indices} if state["state"] else {}
    for key, value in state["state"].get(0, {}).items():
        for i, (offset, shape) in enumerate(zip(offsets, shapes, strict=True)):
            part = value[offset : offset + shape.numel()].reshape(shape) if value.dim() else value
            per[i][key] = part.clone()
    group = {**state["param_groups"][0], "params": indices}
    return {"state": per, "param_groups": [group]}
