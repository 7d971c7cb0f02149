"""The generic learner: optimizer, learning-rate schedule, gradient clipping, AMP, non-finite
checks and the gradient average over learner processes.

A learner knows no environment and no process: it receives batches and returns metrics.
How its steps are made fast (compiled programs, thread plans, minibatches in parts) is its
:class:`~rltrans.accel.Accel`'s business; the learner only asks it for the program to run.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor, nn

from rltrans import distributed
from rltrans.accel import Accel
from rltrans.learners.flat_state import per_parameter_state
from rltrans.learners.settings import OptimizerConfig
from rltrans.types import Aux


class NonFiniteLossError(RuntimeError):
    """Raised when a loss or gradient becomes NaN/inf; the caller keeps its last good checkpoint."""


def fold_aux(loss: Tensor, metrics: dict[str, Tensor], aux: Aux) -> tuple[Tensor, Aux]:
    """An agent's ``aux`` from ``evaluate`` folded into a loss: ``loss_*`` entries join the
    loss, 0-d entries join ``metrics`` (detached); entries with one value per token (e.g.
    ponder steps) are returned apart, detached."""
    per_token = {}
    for name, v in aux.items():
        if name.startswith("loss_"):
            loss = loss + v
        if v.dim() == 0:
            metrics[name] = v.detach()
        else:
            per_token[name] = v.detach()
    return loss, per_token


def check_moment_shapes(saved: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
    """Refuse a saved optimizer state whose per-parameter tensors (Adam's moments, RMSprop's
    averages) do not have their parameter's shape: torch loads them unchecked, and a fused
    step over a moment of another size writes outside it. ValueError naming the entry."""
    groups = saved["param_groups"]
    if len(groups) != len(optimizer.param_groups):
        return  # the optimizer's own load refuses it, saying so
    ids = [i for group in groups for i in group["params"]]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for key, param in zip(ids, params, strict=False):
        for name, moment in saved["state"].get(key, {}).items():
            # every tensor but the step count has its parameter's shape (a 0-d moment too)
            if isinstance(moment, Tensor) and name != "step" and moment.shape != param.shape:
                raise ValueError(
                    f"learner.optimizer.state[{key!r}].{name} has shape {tuple(moment.shape)}, "
                    f"its parameter {tuple(param.shape)}"
                )


def check_group_settings(built: list[set[str]], optimizer: torch.optim.Optimizer) -> None:
    """Refuse loaded param groups that lack a setting the built ones had (``built``: their
    keys): the saved groups replace the built ones whole, and a missing ``lr`` or ``betas``
    would fail only at the first step. ValueError naming the group and the keys."""
    for index, (keys, group) in enumerate(zip(built, optimizer.param_groups, strict=False)):
        missing = sorted(keys - set(group))
        if missing:
            raise ValueError(
                f"learner.optimizer.param_groups[{index}] lacks {', '.join(map(repr, missing))}"
            )


class Learner:
    """Adam(W) with optional linear lr annealing and warmup, global grad-norm clipping, AMP on
    CUDA, and the gradient averaged over learner processes under ``torchrun``."""

    def __init__(
        self,
        model: nn.Module,
        optim: OptimizerConfig,
        *,
        total_updates: int,
        accel: Accel | None = None,
    ) -> None:
        self.model = model
        self.accel = accel or Accel()
        self.params = list(model.parameters())  # what the optimizer trains
        self.max_grad_norm = optim.max_grad_norm
        # fused=True: one kernel for all parameters instead of a loop of small ops per tensor.
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=optim.lr,
            eps=optim.eps,
            weight_decay=optim.weight_decay,
            fused=True,
        )
        total, warmup = max(1, total_updates), optim.warmup_updates

        def factor(update: int) -> float:
            warm = min(1.0, (update + 1) / warmup) if warmup > 0 else 1.0
            decay = max(0.0, 1.0 - update / total) if optim.anneal_lr else 1.0
            return warm * decay

        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)
        device = next(model.parameters()).device
        self.amp = optim.amp and device.type == "cuda"
        # bfloat16 autocast needs no loss scaling; fp16-only GPUs fall back to a GradScaler.
        self.amp_dtype = torch.bfloat16 if self.amp and torch.cuda.is_bf16_supported() else None
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp and self.amp_dtype is None)
        self.device_type = device.type

    def autocast(self) -> contextlib.AbstractContextManager:
        """Mixed-precision context for the forward pass (a no-op on CPU or with amp off)."""
        if not self.amp:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.amp_dtype or torch.float16)

    def step(self, loss: Tensor) -> Tensor:
        """Backward, clip, optimizer step; returns the pre-clip gradient norm. Under
        ``torchrun`` the gradient is averaged over the learner processes before clipping (and
        a non-finite loss on any of them stops all of them at the same step)."""
        self.backward(loss, first=True)
        return self.apply_gradients()

    def backward(self, loss: Tensor, *, first: bool) -> None:
        """Check ``loss`` is finite, then add its gradient (``first`` zeroes them before): a
        gradient step may sum several backward passes before :meth:`apply_gradients`."""
        finite = bool(torch.isfinite(loss))
        if not distributed.all_true(finite):
            where = "" if not finite else " on another learner process"
            raise NonFiniteLossError(
                f"loss is {'non-finite' if finite else loss.item()}{where}; stopping before "
                f"the weights change"
            )
        if first:
            self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()

    def gradients(self, loss: Tensor) -> tuple[Tensor | None, ...] | None:
        """The gradient of ``loss`` for each trained parameter of the model, returned instead
        of accumulated (None if the loss is not finite)."""
        if not bool(torch.isfinite(loss)):
            return None
        return torch.autograd.grad(self.scaler.scale(loss), self.model_params, allow_unused=True)

    def add_gradients(self, grads: tuple[Tensor | None, ...] | None) -> None:
        """Add gradients from :meth:`gradients` to the parameters' (after a backward pass)."""
        if grads is None:
            raise NonFiniteLossError("loss is non-finite; stopping before the weights change")
        for p, g in zip(self.model_params, grads, strict=True):
            if g is None:
                continue
            if p.grad is None:
                p.grad = g
            else:
                p.grad.add_(g)

    @property
    def model_params(self) -> list[Tensor]:
        """The model's own parameters that train."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def apply_gradients(self) -> Tensor:
        """Average over learner processes, clip and step on the summed gradients; returns the
        pre-clip gradient norm."""
        distributed.all_reduce_grads_(self.params)
        self.scaler.unscale_(self.optimizer)
        params = [p for p in self.params if p.grad is not None]
        max_norm = self.max_grad_norm if self.max_grad_norm else float("inf")
        norm = nn.utils.clip_grad_norm_(params, max_norm)
        if not torch.isfinite(norm) and not self.scaler.is_enabled():
            raise NonFiniteLossError(f"gradient norm is {norm.item()}; stopping")
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return norm

    def end_update(self) -> None:
        """Advance the learning-rate schedule by one update (one rollout)."""
        self.scheduler.step()

    @property
    def lr(self) -> float:
        """Current learning rate."""
        return self.optimizer.param_groups[0]["lr"]

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, schedule and scaler state for checkpoints."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (an optimizer state an earlier release saved
        for one flat parameter, as its CPU runs did, is split up per parameter)."""
        try:
            saved = per_parameter_state(state["optimizer"], [p.shape for p in self.params])
        except (KeyError, IndexError, RuntimeError):  # another model's moments
            first = state["optimizer"]["state"].get(0, {})
            shapes = ", ".join(f"{k} {tuple(getattr(v, 'shape', ()))}" for k, v in first.items())
            size = sum(p.numel() for p in self.params)
            raise ValueError(
                f"learner.optimizer.state does not fit this model's {size} trained values "
                f"(its first entry: {shapes})"
            ) from None
        check_moment_shapes(saved, self.optimizer)
        built = [set(group) for group in self.optimizer.param_groups]
        self.optimizer.load_state_dict(saved)  # older torch's groups get defaults here
        check_group_settings(built, self.optimizer)
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
