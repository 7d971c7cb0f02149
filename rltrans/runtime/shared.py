"""Shared memory between the learner and its actor processes: rollout slots laid out as
fields of one uint8 block, and the learner's weights as one flat tensor per dtype behind a
sequence lock (the parent writes, actors read the newest without stopping it)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rltrans.runtime.remote import map_leaves
from rltrans.types import Tree, tree_map

ALIGN = 64  # bytes between tensor starts in a slot


def parent_alive(parent_pid: int) -> bool:
    """Whether this process's parent is still ``parent_pid`` (an orphan gets another)."""
    return os.getppid() == parent_pid


@dataclass(frozen=True)
class Field:
    """One tensor of a slot: where it starts in the slot and what it holds."""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def slot_layout(template: Tree) -> tuple[Tree, int]:
    """The :class:`Field` tree of a slot holding tensors shaped as ``template``'s, and the
    slot's size in bytes (a multiple of :data:`ALIGN`)."""
    end = 0

    def place(t: Tensor) -> Field:
        nonlocal end
        field = Field(end, t.dtype, tuple(t.shape))
        end += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
        return field

    return tree_map(place, template), max(end, ALIGN)


def slot_views(block: Tensor, layout: Tree, slot: int, slot_bytes: int) -> Tree:
    """Tensors viewing slot ``slot`` of the shared uint8 ``block`` (other leaves pass)."""
    base = slot * slot_bytes

    def view(f: Any) -> Any:
        if not isinstance(f, Field):
            return f
        count = 1
        for d in f.shape:
            count *= d
        nbytes = count * torch.empty((), dtype=f.dtype).element_size()
        start = base + f.offset
        return block[start : start + nbytes].view(f.dtype).view(f.shape)

    return map_leaves(view, layout)


class SharedWeights:
    """A state_dict in shared memory: one flat tensor per dtype, a version, a sequence lock.

    Built in the parent from a template state_dict and sent whole to the actors.
    """

    def __init__(self, state_dict: Mapping[str, Tensor], ctx) -> None:
        self.specs: list[tuple[str, torch.dtype, tuple[int, ...], int]] = []
        sizes: dict[torch.dtype, int] = {}
        for key, t in state_dict.items():
            if isinstance(t, Tensor):
                self.specs.append((key, t.dtype, tuple(t.shape), sizes.get(t.dtype, 0)))
                sizes[t.dtype] = sizes.get(t.dtype, 0) + t.numel()
        self.flats = {str(d): torch.zeros(n, dtype=d).share_memory_() for d, n in sizes.items()}
        self.seq = ctx.Value("q", 0, lock=False)  # odd while the parent writes
        self.version = ctx.Value("q", -1, lock=False)  # -1 until the first publish

    def views(self) -> dict[str, Tensor]:
        """The state_dict as views of the flat tensors."""
        out = {}
        for key, dtype, shape, offset in self.specs:
            count = 1
            for d in shape:
                count *= d
            out[key] = self.flats[str(dtype)][offset : offset + count].view(shape)
        return out

    def write(self, state_dict: Mapping[str, Tensor], version: int, views: dict) -> None:
        """Copy ``state_dict`` in (single writer: the parent)."""
        missing = [k for k in views if k not in state_dict]
        if missing:
            raise KeyError(f"publish: state_dict lacks {missing[:5]} (the pool's agent has them)")
        self.seq.value += 1
        try:
            with torch.no_grad():
                for key, dst in views.items():
                    dst.copy_(state_dict[key].detach().reshape(dst.shape))
            self.version.value = int(version)
        finally:
            self.seq.value += 1

    def read_into(self, agent: torch.nn.Module, views: dict, have: int, parent_pid: int) -> int:
        """Load the newest weights into ``agent`` unless its version ``have`` is the newest;
        returns the version loaded. -1 when nothing was published yet."""
        while True:
            s1 = self.seq.value
            if s1 % 2:  # a publish is under way
                time.sleep(0.0002)
                if not parent_alive(parent_pid):  # died while publishing
                    raise SystemExit(0)
                continue
            version = self.version.value
            if version == have or version < 0:
                return version
            agent.load_state_dict(views, strict=False)
            if self.seq.value == s1:
                return version


__all__ = ["ALIGN", "Field", "SharedWeights", "parent_alive", "slot_layout", "slot_views"]
