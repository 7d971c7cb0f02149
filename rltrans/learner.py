"""Learners: optimizer, learning-rate schedule, gradient clipping, AMP, non-finite checks.

A learner knows no environment and no process: it receives batches and
returns metrics. :class:`Learner` is the generic part;
:class:`PPOLearner` runs PPO's epochs of minibatches over a rollout;
:class:`ImpalaLearner` takes one V-trace gradient step per batch of rollouts.
"""

from __future__ import annotations

import contextlib
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields, is_dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from rltrans import distributed
from rltrans.buffers.rollout import RolloutBuffer
from rltrans.compiling import compiled
from rltrans.core.dropout import Dropout
from rltrans.flat import FlatLayout, flatten, is_flat_state, to_flat_state, to_per_parameter_state
from rltrans.losses.impala import impala_loss
from rltrans.losses.ppo import ppo_loss, standardize
from rltrans.returns import next_values_from
from rltrans.threads import ThreadTuner, tuned
from rltrans.types import Aux, PPOBatch, Segment, tree_leaves, tree_map, tree_stack


class NonFiniteLossError(RuntimeError):
    """Raised when a loss or gradient becomes NaN/inf; the caller keeps its last good checkpoint."""


class Learner:
    """Adam(W) with optional linear lr annealing, global grad-norm clipping and AMP on CUDA."""

    def __init__(
        self,
        model: nn.Module,
        *,
        lr: float,
        total_updates: int,
        anneal_lr: bool = True,
        warmup_updates: int = 0,
        max_grad_norm: float | None = 0.5,
        weight_decay: float = 0.0,
        eps: float = 1e-5,
        amp: bool = False,
    ) -> None:
        self.model = model
        # On CPU the parameters become views of one flat tensor (rltrans.flat): zeroing,
        # clipping and AdamW are then one op each instead of one per tensor.
        self.layout = FlatLayout.of([p.shape for p in model.parameters()])
        self.flat = flatten(model)
        # Listed once: walking the module tree every minibatch cost ~0.3 ms at PPO's sizes.
        self.params = [self.flat.param] if self.flat else list(model.parameters())
        self.max_grad_norm = max_grad_norm
        # fused=True: one kernel for all parameters instead of a loop of small ops per tensor.
        self.optimizer = torch.optim.AdamW(
            self.params, lr=lr, eps=eps, weight_decay=weight_decay, fused=True
        )
        total = max(1, total_updates)

        def factor(update: int) -> float:
            warm = min(1.0, (update + 1) / warmup_updates) if warmup_updates > 0 else 1.0
            decay = max(0.0, 1.0 - update / total) if anneal_lr else 1.0
            return warm * decay

        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)
        device = next(model.parameters()).device
        self.amp = amp and device.type == "cuda"
        # bfloat16 autocast needs no loss scaling; fp16-only GPUs fall back to a GradScaler.
        self.amp_dtype = torch.bfloat16 if self.amp and torch.cuda.is_bf16_supported() else None
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp and self.amp_dtype is None)
        self.device_type = device.type
        self.threads: ThreadTuner | None = None  # torch_threads=auto: times each gradient step
        # Worker threads for a plan in streams (created at the first such step).
        self._workers: ThreadPoolExecutor | None = None
        # The loss a subclass trains through (use_compiled switches eager / compiled).
        self.eager_loss: Any = None
        self.compiled_loss: Any = None

    def use_compiled(self, on: bool) -> None:
        """Train through the compiled loss (``torch.compile`` of :attr:`eager_loss`, forward
        and backward, compiled at its first call and kept) or the eager one."""
        if on and self.compiled_loss is None:
            self.compiled_loss = compiled(self.eager_loss)
        self.loss = self.compiled_loss if on else self.eager_loss

    @property
    def trialing_threads(self) -> bool:
        """True while ``torch_threads=auto`` is still timing thread counts for this learner."""
        return self.threads is not None and self.threads.chosen is None

    def settled_loss(self) -> Any:
        """The loss to train through now: the eager one during thread trials (compiled kernels
        keep the thread count they were built with, so a program compiled during a trial
        would keep the trial's count)."""
        return self.eager_loss if self.trialing_threads else self.loss

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
            if self.flat:
                self.flat.zero_grad()
            else:
                self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()

    def side_grads(
        self, loss_fn: Any, batch: Any, weight: Tensor, threads: int
    ) -> tuple[Any, tuple[Tensor | None, ...] | None]:
        """On a worker thread of a plan in streams: ``loss_fn(batch)`` with ``threads`` torch
        threads and the gradient of ``weight`` x its loss, returned instead of accumulated
        (summed in part order by :meth:`add_grads`, so a step is the same at every timing).
        Returns the rest of ``loss_fn``'s output and the gradients (None if the loss is not
        finite)."""
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        loss, *rest = loss_fn(batch)
        if not bool(torch.isfinite(loss)):
            return rest, None
        scaled = self.scaler.scale(loss * weight)
        return rest, torch.autograd.grad(scaled, self.model_params, allow_unused=True)

    def add_grads(self, grads: tuple[Tensor | None, ...] | None) -> None:
        """Add gradients from :meth:`side_grads` to the parameters' (after a backward pass)."""
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
        """The model's own parameters that train (views of the flat one on CPU)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def workers(self, count: int) -> ThreadPoolExecutor:
        """A pool of ``count`` worker threads (kept; rebuilt if a plan needs more)."""
        if self._workers is None or self._workers._max_workers < count:
            if self._workers is not None:
                self._workers.shutdown()
            self._workers = ThreadPoolExecutor(count, thread_name_prefix="rltrans-stream")
        return self._workers

    def apply_gradients(self) -> Tensor:
        """Average over learner processes, clip and step on the summed gradients; returns the
        pre-clip gradient norm."""
        if self.flat:
            self.flat.sync()  # every gradient landed in the flat buffer
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
        """Restore what :meth:`state_dict` saved (an optimizer state saved per parameter, e.g.
        on CUDA, converts to the flat layout on CPU, and back)."""
        optimizer = state["optimizer"]
        if self.flat and not is_flat_state(optimizer, self.layout):
            optimizer = to_flat_state(optimizer, self.layout)
        elif (
            not self.flat and len(self.layout.shapes) > 1 and is_flat_state(optimizer, self.layout)
        ):
            optimizer = to_per_parameter_state(optimizer, self.layout)
        self.optimizer.load_state_dict(optimizer)
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def draws_random(model: nn.Module) -> bool:
    """True if the model's training forward draws random numbers (dropout with p > 0): parts
    of such a step on several threads would draw from the one generator in racing order."""
    for m in model.modules():
        p = getattr(m, "p", None) if isinstance(m, nn.Dropout | Dropout) else None
        if (p or 0.0) > 0.0 or getattr(m, "dropout", 0.0) > 0.0:
            return True
    return False


def _map_batch(fn: Any, batch: Any) -> Any:
    """``tree_map`` that also enters dataclasses (PPOBatch, Segment) field by field."""
    if is_dataclass(batch):
        kids = {f.name: _map_batch(fn, getattr(batch, f.name)) for f in fields(batch)}
        return type(batch)(**kids)
    return tree_map(fn, batch)


class PPOLearner(Learner):
    """PPO (Schulman et al. 2017): several epochs of shuffled minibatches of segments."""

    def __init__(
        self, model: nn.Module, *, ppo: dict[str, Any], compile: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(model, **kwargs)
        # torch.compile of the minibatch loss, forward and backward (one graph each): fused
        # element-wise kernels instead of thousands of small ops; compiled at the first
        # minibatch (tens of seconds on CPU), reused for every later one (fixed shapes).
        self.eager_loss = self.minibatch_loss
        self.use_compiled(compile)
        self.epochs = ppo["epochs"]
        self.num_minibatches = ppo["num_minibatches"]
        self.target_kl = ppo.get("target_kl")
        # Advantages are standardised over the whole minibatch in update(), before any split.
        self.normalize_advantages = ppo["normalize_advantages"]
        self.loss_kwargs = {k: ppo[k] for k in ("clip_coef", "vf_clip_coef", "ent_coef", "vf_coef")}
        self.loss_kwargs["normalize_advantages"] = False
        chunk_mb = ppo.get("chunk_obs_mb")
        if chunk_mb is not None and not chunk_mb > 0:
            raise ValueError(f"algo.chunk_obs_mb={chunk_mb} must be a positive number or null")
        self.chunk_bytes = None if chunk_mb is None else float(chunk_mb) * 2**20
        # Per-token aux values of the last update, flattened (e.g. ponder steps), for histograms.
        self.distributions: dict[str, Tensor] = {}

    def minibatch_loss(self, batch: PPOBatch) -> tuple[Tensor, dict[str, Tensor], Aux]:
        """PPO loss of one minibatch, its 0-d metrics, and the per-token aux values (detached).

        The agent's ``aux`` from ``evaluate``: ``loss_*`` entries join the loss; 0-d
        entries join the metrics; entries with one value per token are returned apart.
        """
        with self.autocast():
            log_prob, entropy, value, aux = self.model.evaluate(batch.segment)
        loss, metrics = ppo_loss(
            log_prob.float(),
            batch.log_probs,
            batch.advantages,
            value.float(),
            batch.values,
            batch.returns,
            entropy.float(),
            mask=batch.mask,
            **self.loss_kwargs,
        )
        per_token = {}
        for k, v in aux.items():  # e.g. a ponder cost an agent adds to its loss
            if k.startswith("loss_"):
                loss = loss + v
            if v.dim() == 0:
                metrics[k] = v.detach()
            else:
                per_token[k] = v.detach()
        return loss, metrics, per_token

    def parts(self, batch: PPOBatch) -> int:
        """Into how many equal parts a minibatch of B segments is split: the fewest (a divisor
        of B) whose observations, as float32, take at most ``algo.chunk_obs_mb`` each."""
        size = batch.mask.shape[0]
        if self.chunk_bytes is None or size == 1:
            return 1
        floats = sum(leaf.numel() for leaf in tree_leaves(batch.segment.obs))
        need = min(size, max(1, math.ceil(4 * floats / self.chunk_bytes)))
        return next(d for d in range(need, size + 1) if size % d == 0)

    def accumulate(self, batch: PPOBatch) -> tuple[dict[str, Tensor], Aux]:
        """Gradient of one minibatch's loss, summed into the parameters' gradients: in one
        pass, or part by part (each part's loss weighted by its share of the valid steps, so
        the sum is the whole minibatch's gradient, with only one part's activations alive at
        a time). Under a :class:`~rltrans.threads.Plan` of n streams (``torch_threads=auto``)
        the parts come in groups of n that run side by side, one here and the rest on worker
        threads, their gradients summed in part order. Returns the minibatch's metrics (the
        parts' means weighted alike; metrics named ``*_max`` / ``*_min`` the extreme over the
        parts) and per-token aux values."""
        size = batch.mask.shape[0]
        plan = self.threads.plan if self.threads is not None else None
        streams = min(plan.streams, size) if plan is not None else 1
        count = self.parts(batch)
        if streams > 1:  # whole groups of `streams` parts, run side by side
            count = min(size, -(-count // streams) * streams)
        loss_fn = self.settled_loss()
        if count == 1:
            loss, metrics, aux = loss_fn(batch)
            self.backward(loss, first=True)
            return metrics, aux
        total = batch.mask.sum().clamp_min(1)
        parts = [_map_batch(lambda x, i=i: x.tensor_split(count)[i], batch) for i in range(count)]
        weights = [part.mask.sum() / total for part in parts]
        done: list[tuple[dict[str, Tensor], Aux]] = []
        for first in range(0, count, streams):
            group = range(first, min(first + streams, count))
            side = [
                self.workers(streams - 1).submit(
                    self.side_grads, loss_fn, parts[i], weights[i], plan.threads
                )
                for i in group[1:]
            ]  # the group's first part runs here meanwhile
            loss, part_metrics, aux = loss_fn(parts[first])
            self.backward(loss * weights[first], first=first == 0)
            done.append((part_metrics, aux))
            for future in side:
                (part_metrics, aux), grads = future.result()
                self.add_grads(grads)
                done.append((part_metrics, aux))
        metrics: dict[str, Tensor] = {}
        pieces: dict[str, list[Tensor]] = {}
        for i, (part_metrics, aux) in enumerate(done):
            weight = weights[i]
            for k, v in part_metrics.items():  # means over the part's steps -> over all
                if k.endswith(("_max", "_min")):  # extremes (e.g. ACT's ponder_max) stay so
                    pick = torch.maximum if k.endswith("_max") else torch.minimum
                    metrics[k] = v if i == 0 else pick(metrics[k], v)
                else:
                    metrics[k] = metrics.get(k, 0.0) + v * weight
            for k, v in aux.items():
                pieces.setdefault(k, []).append(v)
        return metrics, {k: torch.cat(v) for k, v in pieces.items()}

    def update(self, buffer: RolloutBuffer, generator: torch.Generator | None = None) -> dict:
        """Train on one rollout; returns mean metrics (0-d tensors, no host sync per batch).

        The agent's ``aux`` from ``evaluate``: ``loss_*`` entries join the loss;
        0-d entries are averaged into the metrics; entries with one value per
        token (e.g. ponder steps, (B, L)) are gathered over the first epoch, so
        over every token of the rollout once, into :attr:`distributions`.
        """
        totals: dict[str, Tensor] = {}
        pieces: dict[str, list[Tensor]] = {}
        count = 0
        for epoch in range(self.epochs):
            kls = []
            for batch in buffer.minibatches(self.num_minibatches, generator):
                if self.normalize_advantages:
                    batch = replace(batch, advantages=standardize(batch.advantages, batch.mask))
                with tuned(self.threads):
                    metrics, aux = self.accumulate(batch)
                    metrics["grad_norm"] = self.apply_gradients()
                for k, v in aux.items():  # per-token aux values (e.g. ponder steps)
                    if epoch == 0:
                        pieces.setdefault(k, []).append(v.reshape(-1))
                for k, v in metrics.items():
                    totals[k] = totals.get(k, 0.0) + v.detach().float()
                kls.append(metrics["approx_kl"])
                count += 1
            if self.target_kl is not None and torch.stack(kls).mean() > self.target_kl:
                break  # early stop (Schulman et al. 2017 baselines' target KL)
        self.end_update()
        self.distributions = {k: torch.cat(v) for k, v in pieces.items()}
        out = {k: v / count for k, v in totals.items()}
        out["lr"] = torch.tensor(self.lr)
        return out


class ImpalaLearner(Learner):
    """IMPALA (Espeholt et al. 2018): one gradient step per batch of B rollouts, V-trace over
    the whole rollout of T steps; the segments of L steps (each replayed from its stored
    memory, as PPO does) only bound how far gradients flow back in time.

    The bootstrap V(x_T) after each rollout, like V(final obs) of truncated episodes, is the
    one its actor computed with the behaviour weights (``bootstrap_value``): exact when the
    weights that acted are the learner's (policy lag 0, runtime=local), and otherwise the
    only stale value in the targets, discounted by gamma^(T - s) and the traces. Recomputing
    it would need the memory after the rollout, which a rollout does not carry.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        impala: dict[str, Any],
        compile: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, eps=impala.get("adam_eps", 1e-5), **kwargs)
        if impala.get("optimizer", "rmsprop") == "rmsprop":
            # RMSProp as in the paper (torch adds eps outside the square root, TF inside).
            schedule = self.scheduler.lr_lambdas[0]
            self.optimizer = torch.optim.RMSprop(
                self.params,
                lr=kwargs["lr"],
                alpha=impala["rmsprop_alpha"],
                eps=impala["rmsprop_eps"],
                momentum=impala["rmsprop_momentum"],
            )
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
        pg_rho_bar = impala.get("pg_rho_bar")
        self.loss_kwargs = {
            "gamma": impala["gamma"],
            "rho_bar": impala["rho_bar"],
            "c_bar": impala["c_bar"],
            "pg_rho_bar": pg_rho_bar,
            "lam": impala["vtrace_lambda"],
            "vf_coef": impala["vf_coef"],
            "ent_coef": impala["ent_coef"],
            "normalize_advantages": impala.get("normalize_advantages", False),
            "min_advantage_std": impala.get("min_advantage_std", 0.0),
            "clip_coef": impala.get("clip_coef"),
        }
        self.eager_loss = self.batch_loss
        self.use_compiled(compile)
        self.epochs = int(impala.get("epochs", 1))
        self.num_minibatches = int(impala.get("num_minibatches", 1))
        self.distributions: dict[str, Tensor] = {}

    @staticmethod
    def concat(buffers: list[RolloutBuffer]) -> dict[str, Any]:
        """B rollouts of (T, N_i) as one time-major batch (T, sum N_i), memories likewise."""
        first = buffers[0]
        for b in buffers[1:]:
            if (b.num_steps, b.segment_length) != (first.num_steps, first.segment_length):
                raise ValueError("rollouts of one learner step need the same T and L")

        def cat(*xs: Tensor) -> Tensor:
            return xs[0] if len(xs) == 1 else torch.cat(xs, dim=1)

        def cat_memory(*ms: Tensor) -> Tensor:
            return ms[0] if len(ms) == 1 else torch.cat(ms, dim=0)  # memories are batch-first

        fields = ("actions", "starts", "log_probs", "rewards", "terminated", "truncated")
        out = {f: cat(*(getattr(b, f) for b in buffers)) for f in fields}
        out["final_values"] = cat(*(b.final_values for b in buffers))
        out["obs"] = tree_map(cat, *(b.obs for b in buffers))
        out["memories"] = [
            tree_map(cat_memory, *(b.memories[k] for b in buffers))
            for k in range(len(first.memories))
        ]
        return out

    def replay(
        self, batch: dict[str, Any], segment_length: int
    ) -> tuple[Tensor, Tensor, Tensor, Aux]:
        """Target log-probs, entropies and values (T, N) of a batch from :meth:`concat`: every
        segment of L steps replayed from its stored memory (``agent.evaluate``), as PPO does."""
        steps, envs = batch["starts"].shape
        k = steps // segment_length

        def to_segments(x: Tensor) -> Tensor:  # (T, N, ...) -> (K * N, L, ...)
            x = x.reshape(k, segment_length, envs, *x.shape[2:]).transpose(1, 2)
            return x.reshape(k * envs, segment_length, *x.shape[3:])

        def to_time(x: Tensor) -> Tensor:  # (K * N, L) -> (T, N)
            return x.reshape(k, envs, segment_length).transpose(1, 2).reshape(steps, envs)

        memory = tree_map(lambda m: m.flatten(0, 1), tree_stack(batch["memories"]))
        segment = Segment(
            obs=tree_map(to_segments, batch["obs"]),
            actions=to_segments(batch["actions"]),
            starts=to_segments(batch["starts"]),
            memory=memory,
        )
        with self.autocast():
            log_prob, entropy, value, aux = self.model.evaluate(segment)
        log_prob, entropy, value = (to_time(x.float()) for x in (log_prob, entropy, value))
        return log_prob, entropy, value, aux

    def batch_loss(
        self, batch: dict[str, Any], segment_length: int, bootstrap: Tensor
    ) -> tuple[Tensor, dict[str, Tensor], Aux]:
        """Replay every segment, then the IMPALA loss over the whole (T, N) batch: V-trace
        runs over all T steps; gradients flow only within a segment."""
        log_prob, entropy, value, aux = self.replay(batch, segment_length)
        next_values = next_values_from(
            value.detach(), bootstrap, batch["truncated"], batch["final_values"]
        )
        loss, metrics = impala_loss(
            log_prob,
            batch["log_probs"],
            entropy,
            value,
            next_values,
            batch["rewards"],
            batch["terminated"],
            batch["truncated"],
            **self.loss_kwargs,
        )
        with torch.no_grad():  # k3 estimate of KL(behaviour || target), as PPO reports it
            log_rho = log_prob - batch["log_probs"]
            metrics["approx_kl"] = ((log_rho.exp() - 1.0) - log_rho).mean()
        per_token = {}
        for name, v in aux.items():  # e.g. a ponder cost an agent adds to its loss
            if name.startswith("loss_"):
                loss = loss + v
            if v.dim() == 0:
                metrics[name] = v.detach()
            else:
                per_token[name] = v.detach()
        return loss, metrics, per_token

    @staticmethod
    def select_envs(batch: dict[str, Any], index: Tensor) -> dict[str, Any]:
        """The columns ``index`` of a batch from :meth:`concat` (whole rollouts of some envs)."""
        out = {k: v[:, index] for k, v in batch.items() if k not in ("obs", "memories")}
        out["obs"] = tree_map(lambda x: x[:, index], batch["obs"])
        out["memories"] = [tree_map(lambda m: m[index], m) for m in batch["memories"]]
        return out

    def update(self, buffers: list[RolloutBuffer], bootstrap_values: list[Tensor]) -> dict:
        """``epochs`` passes (1: the paper) over B rollouts (each (T, N_i)) with their bootstrap
        values (N_i,), each pass ``num_minibatches`` gradient steps on disjoint random sets of
        envs (whole rollouts, so V-trace still runs over all T steps), each step replaying its
        minibatch with the current weights (V-trace corrects for the change since the behaviour
        weights); returns the first step's metrics (0-d tensors) and keeps its per-token aux in
        :attr:`distributions`."""
        batch = self.concat(list(buffers))
        bootstrap = torch.cat([v.reshape(-1).float() for v in bootstrap_values])
        envs = bootstrap.numel()
        if not 1 <= self.num_minibatches <= envs:
            raise ValueError(
                f"algo.num_minibatches={self.num_minibatches} must be in 1..{envs} "
                f"(the envs of one learner batch)"
            )
        first = None
        for _ in range(self.epochs):
            if self.num_minibatches == 1:
                parts = [(batch, bootstrap)]
            else:
                order = torch.randperm(envs, device=bootstrap.device)
                parts = [
                    (self.select_envs(batch, index), bootstrap[index])
                    for index in order.tensor_split(self.num_minibatches)
                ]
            for part, part_bootstrap in parts:
                with tuned(self.threads):
                    loss_fn = self.settled_loss()
                    loss, metrics, aux = loss_fn(part, buffers[0].segment_length, part_bootstrap)
                    metrics["grad_norm"] = self.step(loss)
                if first is None:
                    first, first_aux = metrics, aux
        self.end_update()
        self.distributions = {k: v.reshape(-1) for k, v in first_aux.items()}
        out = {k: v.detach().float() for k, v in first.items()}
        out["lr"] = torch.tensor(self.lr)
        return out
