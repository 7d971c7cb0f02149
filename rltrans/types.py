"""Batch dataclasses and the small tree helpers that let buffers hold any observation
or memory structure (tensor, dict, tuple, NamedTuple) without string-keyed plumbing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

Tree = Any  # a Tensor, or a dict / tuple / list / NamedTuple of Trees
Aux = dict[str, Tensor]  # an agent's auxiliary outputs by name (e.g. a ponder cost)


def tree_map(fn: Callable[..., Any], tree: Tree, *rest: Tree) -> Tree:
    """Apply fn to every tensor leaf (zipping leaves of trees of the same structure)."""
    if isinstance(tree, Tensor):
        return fn(tree, *rest)
    if isinstance(tree, dict):
        return {k: tree_map(fn, v, *(r[k] for r in rest)) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # NamedTuple
        return type(tree)(*(tree_map(fn, *vals) for vals in zip(tree, *rest, strict=True)))
    if isinstance(tree, (tuple, list)):
        return type(tree)(tree_map(fn, *vals) for vals in zip(tree, *rest, strict=True))
    return tree  # non-tensor leaves (ints such as a ring cursor) pass through


def tree_leaves(tree: Tree) -> list[Tensor]:
    """All tensor leaves of a tree."""
    out: list[Tensor] = []
    tree_map(lambda t: out.append(t), tree)
    return out


def tree_stack(trees: list[Tree], dim: int = 0) -> Tree:
    """Stack a list of same-structure trees leaf by leaf."""
    return tree_map(lambda *ts: torch.stack(ts, dim=dim), *trees)


@dataclass
class Segment:
    """B training sequences of L consecutive steps each, with the memory that precedes them.

    obs:     tree of (B, L, ...) observations as the agent saw them
    actions: (B, L, ...) actions taken (unclipped samples)
    starts:  (B, L) bool, True where an episode begins (memory before it is invisible)
    memory:  backbone memory of the B sequences, batch-first (stored once per segment)
    """

    obs: Tree
    actions: Tensor
    starts: Tensor
    memory: Tree


@dataclass
class PPOBatch:
    """A minibatch of segments plus what PPO needs per step, all (B, L)."""

    segment: Segment
    log_probs: Tensor
    values: Tensor
    advantages: Tensor
    returns: Tensor
    mask: Tensor
