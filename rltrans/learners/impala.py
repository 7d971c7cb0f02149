"""IMPALA's learner (Espeholt et al. 2018): one V-trace gradient step per batch of rollouts."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from rltrans.accel import Accel
from rltrans.buffers.rollout import RolloutBuffer
from rltrans.learners.base import Learner, fold_aux
from rltrans.learners.settings import ImpalaConfig
from rltrans.losses.impala import impala_loss, impala_targets
from rltrans.losses.ppo import moments as standard_moments
from rltrans.returns import next_values_from
from rltrans.types import Aux, Segment, tree_map, tree_stack

TARGET_KEYS = ("gamma", "rho_bar", "c_bar", "pg_rho_bar", "lam", "clip_coef")  # of loss_kwargs


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
        impala: ImpalaConfig,
        *,
        total_updates: int,
        accel: Accel | None = None,
    ) -> None:
        super().__init__(model, impala.optim, total_updates=total_updates, accel=accel)
        self.impala = impala
        if impala.optimizer == "rmsprop":
            # RMSProp as in the paper (torch adds eps outside the square root, TF inside).
            schedule = self.scheduler.lr_lambdas[0]
            self.optimizer = torch.optim.RMSprop(
                self.params,
                lr=impala.lr,
                alpha=impala.rmsprop_alpha,
                eps=impala.rmsprop_eps,
                momentum=impala.rmsprop_momentum,
            )
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
        self.loss_kwargs = {
            "gamma": impala.gamma,
            "rho_bar": impala.rho_bar,
            "c_bar": impala.c_bar,
            "pg_rho_bar": impala.pg_rho_bar,
            "lam": impala.vtrace_lambda,
            "vf_coef": impala.vf_coef,
            "ent_coef": impala.ent_coef,
            "normalize_advantages": impala.normalize_advantages,
            "min_advantage_std": impala.min_advantage_std,
            "clip_coef": impala.clip_coef,
        }
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
        self,
        batch: dict[str, Any],
        segment_length: int,
        bootstrap: Tensor,
        moments: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, dict[str, Tensor], Aux]:
        """Replay every segment, then the IMPALA loss over the whole (T, N) batch: V-trace
        runs over all T steps; gradients flow only within a segment. ``moments``: the
        advantages' mean and std over the batch this one is a part of."""
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
            advantage_moments=moments,
            **self.loss_kwargs,
        )
        with torch.no_grad():  # k3 estimate of KL(behaviour || target), as PPO reports it
            log_rho = log_prob - batch["log_probs"]
            metrics["approx_kl"] = ((log_rho.exp() - 1.0) - log_rho).mean()
        loss, per_token = fold_aux(loss, metrics, aux)
        return loss, metrics, per_token

    def gradient(
        self, batch: dict[str, Any], segment_length: int, bootstrap: Tensor, count: int
    ) -> tuple[dict[str, Tensor], Aux]:
        """The gradient of :meth:`batch_loss` into the parameters, computed over ``count``
        parts of the batch's rollouts (the same gradient: each part's loss weighs by its share
        of the rollouts, and normalised advantages use the whole batch's moments); returns the
        whole batch's metrics and per-token aux."""
        loss_fn = self.accel.program(self.batch_loss, owner=self.model)
        if count == 1:
            loss, metrics, aux = loss_fn(batch, segment_length, bootstrap)
            self.backward(loss, first=True)
            return metrics, aux
        envs = bootstrap.numel()
        parts = [
            (self.select_envs(batch, index), bootstrap[index])
            for index in torch.arange(envs, device=bootstrap.device).tensor_split(count)
        ]
        moments = None
        if self.impala.normalize_advantages:
            advantages = torch.cat([self.advantages(*p, segment_length) for p in parts], dim=1)
            moments = standard_moments(advantages, None)
        totals: dict[str, Tensor] = {}
        auxes: list[Aux] = []
        for k, (part, part_bootstrap) in enumerate(parts):
            share = part_bootstrap.numel() / envs
            loss, metrics, aux = loss_fn(part, segment_length, part_bootstrap, moments)
            self.backward(loss * share, first=k == 0)
            for name, value in metrics.items():
                totals[name] = totals.get(name, 0.0) + value.detach() * share
            auxes.append(aux)
        return totals, {name: torch.cat([a[name].reshape(-1) for a in auxes]) for name in auxes[0]}

    @torch.no_grad()
    def advantages(self, batch: dict[str, Any], bootstrap: Tensor, segment_length: int) -> Tensor:
        """The advantages (T, N) that :meth:`batch_loss` weighs its policy term by, without
        gradients (to standardise them over a batch whose loss runs in parts)."""
        log_prob, _, value, _ = self.replay(batch, segment_length)
        next_values = next_values_from(value, bootstrap, batch["truncated"], batch["final_values"])
        _, advantages = impala_targets(
            log_prob - batch["log_probs"],
            batch["rewards"],
            value,
            next_values,
            batch["terminated"],
            batch["truncated"],
            **{k: self.loss_kwargs[k] for k in TARGET_KEYS},
        )
        return advantages

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
        envs, count = bootstrap.numel(), self.impala.num_minibatches
        if not 1 <= count <= envs:
            raise ValueError(
                f"algo.num_minibatches={count} must be in 1..{envs} (the envs of one learner batch)"
            )
        first = None
        for _ in range(self.impala.epochs):
            if count == 1:
                parts = [(batch, bootstrap)]
            else:
                order = torch.randperm(envs, device=bootstrap.device)
                parts = [
                    (self.select_envs(batch, index), bootstrap[index])
                    for index in order.tensor_split(count)
                ]
            for part, part_bootstrap in parts:
                with self.accel.step():
                    metrics, aux = self.accel.fitting(
                        lambda count, p=part, b=part_bootstrap: self.gradient(
                            p, buffers[0].segment_length, b, count
                        ),
                        size=part_bootstrap.numel(),
                        what="rollouts",
                        hint="a larger algo.num_minibatches makes smaller ones from the start",
                    )
                    metrics["grad_norm"] = self.apply_gradients()
                if first is None:
                    first, first_aux = metrics, aux
        self.end_update()
        self.distributions = {k: v.reshape(-1) for k, v in first_aux.items()}
        out = {k: v.detach().float() for k, v in first.items()}
        out["lr"] = torch.tensor(self.lr)
        return out
