"""PPO's learner (Schulman et al. 2017): several epochs of shuffled minibatches of segments."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from rltrans.buffers.rollout import RolloutBuffer
from rltrans.learners.base import Learner, fold_aux
from rltrans.losses.ppo import ppo_loss, standardize
from rltrans.types import Aux, PPOBatch

ADVANTAGE_SCOPES = ("minibatch", "rollout")


class PPOLearner(Learner):
    """PPO over a rollout: ``epochs`` passes of ``num_minibatches`` shuffled minibatches of
    segments, each replayed from its stored memory; early stop at ``target_kl``."""

    def __init__(self, model: nn.Module, *, ppo: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.epochs = ppo["epochs"]
        self.num_minibatches = ppo["num_minibatches"]
        self.target_kl = ppo.get("target_kl")
        # Advantages are standardised over the whole minibatch in update(), before any split.
        self.normalize_advantages = ppo["normalize_advantages"]
        # divide by max(std, this): a minibatch whose advantages are all near 0 (no reward in
        # it, e.g. the corridor of a long T-maze) keeps them small instead of scaling noise up
        self.min_advantage_std = float(ppo.get("min_advantage_std", 0.0))
        # "minibatch" (PPO2 baselines, CleanRL) or "rollout": one mean and std for the whole
        # rollout, so a minibatch without the rollout's rare rewards keeps its advantages small
        self.advantage_scope = ppo.get("advantage_scope", "minibatch")
        if self.advantage_scope not in ADVANTAGE_SCOPES:
            raise ValueError(
                f"algo.advantage_scope={self.advantage_scope!r}: expected one of {ADVANTAGE_SCOPES}"
            )
        self.loss_kwargs = {k: ppo[k] for k in ("clip_coef", "vf_clip_coef", "ent_coef", "vf_coef")}
        self.loss_kwargs["normalize_advantages"] = False
        # Per-token aux values of the last update, flattened (e.g. ponder steps), for histograms.
        self.distributions: dict[str, Tensor] = {}

    def minibatch_loss(self, batch: PPOBatch) -> tuple[Tensor, dict[str, Tensor], Aux]:
        """PPO loss of one minibatch, its 0-d metrics, and the per-token aux values."""
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
        loss, per_token = fold_aux(loss, metrics, aux)
        return loss, metrics, per_token

    def update(self, buffer: RolloutBuffer, generator: torch.Generator | None = None) -> dict:
        """Train on one rollout; returns mean metrics (0-d tensors, no host sync per batch).

        Per-token aux values (e.g. ponder steps, (B, L)) are gathered over the first epoch,
        so over every token of the rollout once, into :attr:`distributions`.
        """
        totals: dict[str, Tensor] = {}
        pieces: dict[str, list[Tensor]] = {}
        count = 0
        per_minibatch = self.normalize_advantages and self.advantage_scope == "minibatch"
        if self.normalize_advantages and self.advantage_scope == "rollout":
            buffer.advantages = standardize(buffer.advantages, None, self.min_advantage_std)
        for epoch in range(self.epochs):
            kls = []
            for batch in buffer.minibatches(self.num_minibatches, generator):
                if per_minibatch:
                    advantages = standardize(batch.advantages, batch.mask, self.min_advantage_std)
                    batch = replace(batch, advantages=advantages)
                with self.accel.step():
                    metrics, aux = self.accel.gradient(self.minibatch_loss, batch, self)
                    metrics["grad_norm"] = self.apply_gradients()
                for k, v in aux.items():
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
