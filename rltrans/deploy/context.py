"""Decision Transformer (and BC) acting as a pure program: the K-step context window is the
state, the target return an input.

State, batch-first, oldest step first (as :class:`rltrans.agents.context_policy.DTState`):
``returns_to_go`` (N, K), ``states`` (N, K, *obs), ``actions`` (N, K[, A]), ``timesteps``
(N, K), ``valid`` (N,) (real steps at the end of the window), ``next_return`` (N,) (the
return-to-go of the next step) and ``time`` (N,) (the episode step of the next observation).

Inputs besides: ``reward`` (N,), the reward of the previous step (anything at an episode's
first step), and ``target_return`` (N,), the return an episode aims for, read where an
episode begins: there (``episode_start``, or an env's very first step, ``time`` 0) the
context empties and the return-to-go restarts from the target; elsewhere it counts the
reward down (Chen et al. 2021, Algorithm 1), as ``load_policy``'s ``act(..., reward=r)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rltrans.agents.context_policy import ContextPolicy, DTState
from rltrans.agents.heads import DiscreteActions
from rltrans.deploy import ExportError
from rltrans.deploy.tensors import categorical_noise_sample, reset_rows

STATE_FIELDS = ("returns_to_go", "states", "actions", "timesteps", "valid", "next_return", "time")
STATE_DOCS = (
    "return-to-go of each context step, raw reward units",
    "observation of each context step, as the env gave it",
    "action of each context step, in the env's values",
    "episode step of each context step",
    "how many steps at the end of the context are real",
    "return-to-go of the next step: the target minus the rewards so far",
    "episode step of the next observation",
)


class ContextProgram(nn.Module):
    """One acting step of a DT/BC policy with flat tensor inputs and outputs.

    Inputs: ``obs``, ``episode_start`` (N,) bool, ``reward`` (N,), ``target_return`` (N,),
    ``noise`` (when sampling), the context tensors. Outputs: ``action``, ``logits``
    (Discrete actions: log-probabilities), the next context tensors.
    """

    def __init__(self, policy: ContextPolicy, *, sample: bool) -> None:
        super().__init__()
        self.policy = policy
        self.discrete = isinstance(policy.action_codec, DiscreteActions)
        if sample and not self.discrete:
            raise ExportError(
                "sample=true: this policy's Box actions are a point prediction (DT/BC regress "
                "them), so there is nothing to sample; export it with sample=false"
            )
        self.sample = sample

    @property
    def output_names(self) -> tuple[str, ...]:
        """The action outputs, in order."""
        return ("action", "logits") if self.discrete else ("action",)

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        """One step (see the class docstring for the order)."""
        obs, start, reward, target, *rest = inputs
        noise, rest = (rest[0], rest[1:]) if self.sample else (None, rest)
        keep = ~start.bool()  # (N,) false where an episode starts
        returns, states, actions, timesteps, valid, next_return, time = (
            reset_rows(t, keep) for t in rest
        )
        # At an episode's first step the return-to-go is the target, else it counts down.
        begins = time == 0
        next_return = torch.where(begins, target.float(), next_return - reward.float())
        state = DTState(returns, states, actions, timesteps, valid, next_return, target, time)
        state = self.policy.push_observation(obs, state, None)
        pred = self.policy.predict_context(state)  # (N, n) logits or (N, A) actions
        codec = self.policy.action_codec
        if self.discrete:
            log_p = torch.log_softmax(pred.float(), dim=-1)
            # argmax of the raw logits, as the policy picks (log_softmax could tie them)
            index = categorical_noise_sample(log_p, noise) if self.sample else pred.argmax(-1)
            action, out = index + codec.start, (log_p,)
        else:
            action, out = codec.select(pred, True), ()
        state = self.policy.record_action(state, action)
        return action, *out, *(getattr(state, name) for name in STATE_FIELDS)
