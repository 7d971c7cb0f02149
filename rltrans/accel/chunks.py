"""A minibatch's gradient in parts: fewer activations alive at once, or parts side by side.

A minibatch of B segments may be split into equal parts along B (``algo.chunk_obs_mb``:
the fewest parts whose observations, as float32, fit the given size), each part's loss
weighted by its share of the valid steps, so the summed gradients are the whole
minibatch's gradient with only one part's activations alive at a time. Under a thread
:class:`~rltrans.accel.threads.Plan` of n streams (``torch_threads=auto``), parts come in
groups of n run side by side, one on the calling thread and the rest on worker threads
with one torch thread each; their gradients are summed in part order, so a step is the
same at every timing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields, is_dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from rltrans.types import Aux, tree_leaves, tree_map

# A loss function of a batch: (loss, 0-d metrics, per-token aux values).
LossFn = Callable[[Any], tuple[Tensor, dict[str, Tensor], Aux]]


class Accumulates(Protocol):
    """What a learner offers for a gradient built in parts."""

    def backward(self, loss: Tensor, *, first: bool) -> None:
        """Add loss's gradient to the parameters' (``first`` zeroes them before)."""

    def gradients(self, loss: Tensor) -> tuple[Tensor | None, ...] | None:
        """loss's gradient, returned (None if the loss is not finite)."""

    def add_gradients(self, grads: tuple[Tensor | None, ...] | None) -> None:
        """Add gradients from :meth:`gradients` to the parameters'."""


def map_batch(fn: Callable[[Tensor], Tensor], batch: Any) -> Any:
    """``tree_map`` that also enters dataclasses (PPOBatch, Segment) field by field."""
    if is_dataclass(batch):
        kids = {f.name: map_batch(fn, getattr(batch, f.name)) for f in fields(batch)}
        return type(batch)(**kids)
    return tree_map(fn, batch)


def part_count(batch: Any, chunk_bytes: float | None) -> int:
    """Into how many equal parts a minibatch of B segments is split: the fewest (a divisor
    of B) whose observations, as float32, take at most ``chunk_bytes`` each."""
    size = batch.mask.shape[0]
    if chunk_bytes is None or size == 1:
        return 1
    floats = sum(leaf.numel() for leaf in tree_leaves(batch.segment.obs))
    need = min(size, max(1, math.ceil(4 * floats / chunk_bytes)))
    return next(d for d in range(need, size + 1) if size % d == 0)


def more_parts(size: int, count: int) -> int:
    """The fewest parts above ``count`` that split ``size`` segments equally, at least twice
    as many (at most ``size``, one segment each)."""
    return next(d for d in range(min(2 * count, size), size + 1) if size % d == 0)


class Parts:
    """Runs a minibatch's loss and gradient in parts (see the module docstring)."""

    def __init__(self) -> None:
        self._workers: ThreadPoolExecutor | None = None
        self._count = 0

    def workers(self, count: int) -> ThreadPoolExecutor:
        """A pool of ``count`` worker threads (kept; rebuilt if a plan needs more)."""
        if self._workers is None or self._count < count:
            if self._workers is not None:
                self._workers.shutdown()
            self._workers = ThreadPoolExecutor(count, thread_name_prefix="rltrans-stream")
            self._count = count
        return self._workers

    def accumulate(
        self,
        loss_fn: LossFn,
        batch: Any,
        learner: Accumulates,
        *,
        count: int,
        streams: int = 1,
        threads: int = 1,
    ) -> tuple[dict[str, Tensor], Aux]:
        """Gradient of ``loss_fn(batch)`` summed into the learner's parameters, in ``count``
        parts (rounded up to whole groups of ``streams``); returns the minibatch's metrics
        (the parts' means weighted by their valid steps; ``*_max`` / ``*_min`` the extreme
        over the parts) and per-token aux values."""
        size = batch.mask.shape[0]
        streams = min(streams, size)
        if streams > 1:  # whole groups of `streams` parts, run side by side
            count = min(size, -(-count // streams) * streams)
        if count == 1:
            loss, metrics, aux = loss_fn(batch)
            learner.backward(loss, first=True)
            return metrics, aux
        total = batch.mask.sum().clamp_min(1)
        parts = [map_batch(lambda x, i=i: x.tensor_split(count)[i], batch) for i in range(count)]
        weights = [part.mask.sum() / total for part in parts]
        done: list[tuple[dict[str, Tensor], Aux]] = []
        for first in range(0, count, streams):
            group = range(first, min(first + streams, count))
            side = [
                self.workers(streams - 1).submit(
                    _side, loss_fn, parts[i], weights[i], learner, threads
                )
                for i in group[1:]
            ]  # the group's first part runs here meanwhile
            loss, part_metrics, aux = loss_fn(parts[first])
            learner.backward(loss * weights[first], first=first == 0)
            done.append((part_metrics, aux))
            for future in side:
                (part_metrics, aux), grads = future.result()
                learner.add_gradients(grads)
                done.append((part_metrics, aux))
        return _merge(done, weights)


def _side(
    loss_fn: LossFn, batch: Any, weight: Tensor, learner: Accumulates, threads: int
) -> tuple[tuple[dict[str, Tensor], Aux], tuple[Tensor | None, ...] | None]:
    """On a worker thread: ``loss_fn(batch)`` with ``threads`` torch threads, and the gradient
    of ``weight`` x its loss, returned instead of accumulated."""
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    loss, *rest = loss_fn(batch)
    return tuple(rest), learner.gradients(loss * weight)


def _merge(
    done: list[tuple[dict[str, Tensor], Aux]], weights: list[Tensor]
) -> tuple[dict[str, Tensor], Aux]:
    """The parts' metrics and aux values as the whole minibatch's."""
    metrics: dict[str, Tensor] = {}
    pieces: dict[str, list[Tensor]] = {}
    for i, (part_metrics, aux) in enumerate(done):
        for k, v in part_metrics.items():  # means over the part's steps -> over all
            if k.endswith(("_max", "_min")):  # extremes (e.g. ACT's ponder_max) stay so
                pick = torch.maximum if k.endswith("_max") else torch.minimum
                metrics[k] = v if i == 0 else pick(metrics[k], v)
            else:
                metrics[k] = metrics.get(k, 0.0) + v * weights[i]
        for k, v in aux.items():
            pieces.setdefault(k, []).append(v)
    return metrics, {k: torch.cat(v) for k, v in pieces.items()}
