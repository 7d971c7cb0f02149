"""Adaptive Computation Time (Graves 2016, "Adaptive Computation Time for RNNs", section 2).

A state is refined by a step function s^n = F(s^{n-1}, n) for up to S =
``max_steps`` steps; after each step a halting unit gives, per position,

    halting probability  h^n = sigmoid(w . s^n + b)
    halting step         N   = min{n : h^1 + ... + h^n >= 1 - epsilon}, at most S
    remainder            R   = 1 - (h^1 + ... + h^{N-1})
    halting weights      p^n = h^n for n < N,  p^N = R,  p^n = 0 for n > N
    output               out = sum_n p^n s^n   (the mean-field state update)
    ponder cost          P   = N + R

N is piecewise constant, so the ponder cost's gradient reaches the halting
unit through R only (-dR/dh^n = 1 for n < N), as in the paper.

Machinery: the loop always runs S steps; halting is a mask, never a branch.
A halted position keeps its state (``torch.where``) and takes no weight, so
there is no ``.item()``, no host synchronisation per step and no
data-dependent control flow: the loop traces under ``torch.compile`` as one
graph. Halted positions are still computed (and discarded) at later steps;
that is the price of a static graph, and what lets a Universal Transformer
give later queries keys for every position at every depth.

Two halting variants share one call, ``halting(state, step_fn) -> ACTOutput``:

* ``"act"``: :class:`AdaptiveHalting`, the scheme above;
* ``"none"``: :class:`FixedDepth`, exactly S steps with all weight on the last
  (a plain weight-tied deep network; no halting parameters at all).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple, get_args

import torch
from torch import Tensor, nn

from rltrans.choices import check_choice

HaltingName = Literal["act", "none"]
HALTINGS: tuple[str, ...] = get_args(HaltingName)

# step_fn(state (B, L, D), n) -> next state (B, L, D); n = 0 .. S-1 is the step index.
StepFn = Callable[[Tensor, int], Tensor]


class ACTOutput(NamedTuple):
    """Result of a halting loop over S steps for positions of shape (B, L).

    output:       (B, L, D) halting-weighted mean of the states, sum_n p^n s^n.
    ponder_cost:  (B, L) N + R (differentiable through R).
    steps:        (B, L) long, N, the number of updates each position received.
    remainders:   (B, L) R, the weight of the last step.
    weights:      (S, B, L) p^n; sums to 1 over S at every position.
    halt_probs:   (S, B, L) raw h^n while the position ran, 0 after it halted.
    """

    output: Tensor
    ponder_cost: Tensor
    steps: Tensor
    remainders: Tensor
    weights: Tensor
    halt_probs: Tensor


def _check_steps(max_steps: int) -> int:
    """Validate the step budget S."""
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    return max_steps


def _check_epsilon(epsilon: float) -> float:
    """Validate ACT's epsilon (a position halts once its h sum to 1 - epsilon)."""
    if not 0.0 < epsilon < 1.0:
        raise ValueError(f"act epsilon must be in (0, 1), got {epsilon}")
    return epsilon


def check_halting(name: HaltingName, max_steps: int, epsilon: float = 0.01) -> None:
    """Refuse what :func:`build_halting` would: an unknown name, S < 1, epsilon outside (0, 1)."""
    check_choice("halting", name, HALTINGS)
    if name == "act":
        _check_epsilon(epsilon)
    _check_steps(max_steps)


class AdaptiveHalting(nn.Module):
    """ACT halting over a step function (Graves 2016, section 2).

    ``halting_bias`` initialises b. The Universal Transformer's reference
    hyper-parameters start at b = +1 (h ~ 0.73 while w . s is small, so
    positions halt at about step 2 at initialisation). rltrans defaults to
    b = -1 (h ~ 0.27, halting near step 4): a fresh model already uses several
    weight-tied steps, and the ponder cost, whose gradient raises the h^n (it
    lowers R), trims depth where the task allows. A more negative b starts
    closer to max_steps (b = -2: about step 9).

    >>> act = AdaptiveHalting(dim=8, max_steps=5)
    >>> res = act(torch.randn(2, 3, 8), lambda s, n: torch.tanh(s + 1))
    >>> res.output.shape, res.weights.shape
    (torch.Size([2, 3, 8]), torch.Size([5, 2, 3]))
    """

    def __init__(
        self, dim: int, max_steps: int, *, epsilon: float = 0.01, halting_bias: float = -1.0
    ) -> None:
        super().__init__()
        epsilon = _check_epsilon(epsilon)
        self.max_steps, self.epsilon = _check_steps(max_steps), epsilon
        self.unit = nn.Linear(dim, 1)  # the halting unit: h = sigmoid(w . s + b)
        nn.init.constant_(self.unit.bias, halting_bias)

    def forward(self, state: Tensor, step_fn: StepFn) -> ACTOutput:
        """Refine ``state`` (B, L, D) with ``step_fn`` until each position halts."""
        shape = state.shape[:-1]  # (B, L)
        threshold = 1.0 - self.epsilon
        cum = state.new_zeros(shape)  # h^1 + ... + h^n over the steps that did not halt
        running = torch.ones(shape, dtype=torch.bool, device=state.device)
        steps = torch.zeros(shape, dtype=torch.long, device=state.device)
        remainders = state.new_zeros(shape)
        output = torch.zeros_like(state)
        weights, probs = [], []
        for n in range(self.max_steps):
            # A halted position copies its state forward: it is never updated again.
            state = torch.where(running.unsqueeze(-1), step_fn(state, n), state)  # (B, L, D)
            h = torch.sigmoid(self.unit(state)).squeeze(-1)  # (B, L)
            # halting step N; the budget forces halting at step S (N <= S)
            last = n == self.max_steps - 1
            halt = running if last else running & (cum + h >= threshold)
            carry_on = running & ~halt
            p = torch.where(halt, 1.0 - cum, torch.where(carry_on, h, 0.0))  # halting weights
            remainders = torch.where(halt, 1.0 - cum, remainders)  # remainder R
            cum = cum + torch.where(carry_on, h, 0.0)
            steps = steps + running.long()
            output = output + p.unsqueeze(-1) * state  # weighted mean of the states
            probs.append(torch.where(running, h, 0.0))
            weights.append(p)
            running = carry_on
        ponder = steps.to(remainders.dtype) + remainders  # ponder cost N + R
        return ACTOutput(
            output, ponder, steps, remainders, torch.stack(weights), torch.stack(probs)
        )  # weights and probs: (S, B, L)


class FixedDepth(nn.Module):
    """No halting: exactly S steps, all weight on the last (a weight-tied deep network).

    The ACT quantities are reported with h = 0 throughout, so N = S, R = 1 and
    the ponder cost is the constant S + 1 (no gradient).
    """

    def __init__(self, max_steps: int) -> None:
        super().__init__()
        self.max_steps = _check_steps(max_steps)

    def forward(self, state: Tensor, step_fn: StepFn) -> ACTOutput:
        """Apply ``step_fn`` S times to ``state`` (B, L, D)."""
        for n in range(self.max_steps):
            state = step_fn(state, n)
        shape = state.shape[:-1]  # (B, L)
        steps = torch.full(shape, self.max_steps, dtype=torch.long, device=state.device)
        ones = state.new_ones(shape)
        weights = state.new_zeros(self.max_steps, *shape)  # (S, B, L)
        weights[-1] = 1.0
        probs = state.new_zeros(self.max_steps, *shape)
        return ACTOutput(state, steps.to(state.dtype) + ones, steps, ones, weights, probs)


def build_halting(
    name: HaltingName,
    dim: int,
    max_steps: int,
    *,
    epsilon: float = 0.01,
    halting_bias: float = -1.0,
) -> AdaptiveHalting | FixedDepth:
    """The halting loop for a name: ``"act"`` (Graves 2016) or ``"none"`` (fixed depth)."""
    check_choice("halting", name, HALTINGS)
    if name == "act":
        return AdaptiveHalting(dim, max_steps, epsilon=epsilon, halting_bias=halting_bias)
    return FixedDepth(max_steps)
