"""PPO's learner (Schulman et al. 2017): several epochs of shuffled minibatches of segments."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor, nn

from rltrans.accel import Accel
from rltrans.buffers.rollout import RolloutBuffer
from rltrans.learners.base import Learner, fold_aux
from rltrans.learners.settings import PPOConfig
from rltrans.losses.ppo import ppo_loss, standardize
from rltrans.types import Aux, PPOBatch


class PPOLearner(Learner):
    """PPO over a rollout: ``epochs`` passes of ``num_minibatches`` shuffled minibatches of
    segments, each replayed from its stored memory; early stop at ``target_kl``."""

    def __init__(
        self,
        model: nn.Module,
        ppo: PPOConfig,
        *,
        total_updates: int,
        accel: Accel | None = None,
    ) -> None:
        super().__init__(model, ppo.optim, total_updates=total_updates, accel=accel)
        self.ppo = ppo
        # Advantages are standardised once in update(), over the minibatch (PPO2 baselines,
        # CleanRL) or the rollout (advantage_scope), so the loss takes them as they are.
        self.loss_kwargs = {
            "clip_coef": ppo.clip_coef,
            "vf_clip_coef": ppo.vf_clip_coef,
            "ent_coef": ppo.ent_coef,
            "vf_coef": ppo.vf_coef,
        }
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
        ppo = self.ppo
        per_minibatch = ppo.normalize_advantages and ppo.advantage_scope == "minibatch"
        if ppo.normalize_advantages and ppo.advantage_scope == "rollout":
            # min_advantage_std: divide by max(std, it), so a rollout or minibatch with no
            # reward in it (a long corridor) keeps its advantages small, not scaled-up noise
            buffer.advantages = standardize(buffer.advantages, None, ppo.min_advantage_std)
        for epoch in range(ppo.epochs):
            kls = []
            for batch in buffer.minibatches(ppo.num_minibatches, generator):
                if per_minibatch:
                    advantages = standardize(batch.advantages, batch.mask, ppo.min_advantage_std)
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
            if ppo.target_kl is not None and torch.stack(kls).mean() > ppo.target_kl:
                break  # early stop (Schulman et al. 2017 baselines' target KL)
        self.end_update()
        self.distributions = {k: torch.cat(v) for k, v in pieces.items()}
        out = {k: v / count for k, v in totals.items()}
        out["lr"] = torch.tensor(self.lr)
        return out
