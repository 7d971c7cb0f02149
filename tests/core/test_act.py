"""ACT halting (Graves 2016): weights sum to 1, naive-loop equivalence, frozen halted states,
ponder gradient, fixed-depth variant, compile without graph breaks."""

import pytest
import torch
from torch import nn

from rltrans.core.act import HALTINGS, AdaptiveHalting, FixedDepth, build_halting

D, S = 6, 5


def pointwise_step(seed=3):
    """A per-position step function F(s, n) that depends on the step index."""
    torch.manual_seed(seed)
    lin = nn.Linear(D, D).double()
    return lambda s, n: s + torch.tanh(lin(s) + 0.3 * n)


def make_act(bias, weight_std=1.5, seed=0, max_steps=S):
    torch.manual_seed(seed)
    act = AdaptiveHalting(D, max_steps, halting_bias=bias).double()
    nn.init.normal_(act.unit.weight, std=weight_std)  # spread the halting step across positions
    return act


def naive_act(act, step_fn, s0):
    """Graves 2016 section 2 for ONE position, with data-dependent control flow."""
    s, total, probs, states = s0, 0.0, [], []
    for n in range(act.max_steps):
        s = step_fn(s, n)
        h = torch.sigmoid(act.unit(s)).item()
        states.append(s)
        if total + h >= 1 - act.epsilon or n == act.max_steps - 1:
            weights = [*probs, 1.0 - total]
            out = sum(w * st for w, st in zip(weights, states, strict=True))
            return out, n + 1, 1.0 - total, weights
        probs.append(h)
        total += h
    raise AssertionError("unreachable")


# (regime, halting bias, halting weight std): all halt at step 2 (h = 0.88 everywhere), all
# run into the budget (h = 0.0025), or halting steps spread over 1 .. S.
REGIMES = [("early", 2.0, 0.0), ("budget", -6.0, 0.0), ("mixed", -1.0, 1.5)]


@pytest.mark.parametrize(("regime", "bias", "weight_std"), REGIMES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_naive_per_position_loop_and_weights_sum_to_one(regime, bias, weight_std, seed):
    """ACT halting: the masked fixed loop == a naive per-position loop."""
    act, step_fn = make_act(bias, weight_std, seed), pointwise_step(seed)
    x = torch.randn(3, 4, D, dtype=torch.float64)
    res = act(x, step_fn)
    torch.testing.assert_close(res.weights.sum(0), torch.ones(3, 4, dtype=torch.float64))
    assert (res.weights >= 0).all()
    for b in range(3):
        for i in range(4):
            out, n, r, weights = naive_act(act, step_fn, x[b, i])
            torch.testing.assert_close(res.output[b, i], out)
            assert res.steps[b, i].item() == n
            torch.testing.assert_close(res.remainders[b, i].item(), r)
            torch.testing.assert_close(res.ponder_cost[b, i].item(), n + r)
            expected = torch.tensor(weights + [0.0] * (S - n), dtype=torch.float64)
            torch.testing.assert_close(res.weights[:, b, i], expected)
    expected_steps = {"early": {2}, "budget": {S}}.get(regime)
    if expected_steps is not None:
        assert set(res.steps.flatten().tolist()) == expected_steps


def test_weights_sum_to_one_with_mixed_halting_steps():
    act = make_act(-1.0)
    res = act(torch.randn(8, 16, D, dtype=torch.float64) * 2, pointwise_step())
    assert len(res.steps.unique()) >= 3  # positions halt at different steps
    torch.testing.assert_close(res.weights.sum(0), torch.ones(8, 16, dtype=torch.float64))
    # nothing is weighted after the halting step, and the halting step carries R
    after = torch.arange(S).view(S, 1, 1) >= res.steps
    assert (res.weights[after] == 0).all()
    last = res.weights.gather(0, (res.steps - 1).unsqueeze(0))[0]
    torch.testing.assert_close(last, res.remainders)
    assert (res.remainders > act.epsilon).all()


def test_halted_position_is_never_updated():
    """Feature 0 counts steps; position i halts when the count passes feature 1 = -k_i."""
    act = AdaptiveHalting(D, S).double()
    with torch.no_grad():
        act.unit.weight.zero_()
        act.unit.weight[0, :2] = 20.0
        act.unit.bias.fill_(-10.0)  # logit 20 (n - k) - 10: halts at step n = k + 1
    seen = []

    def step_fn(s, n):
        seen.append(s.clone())
        nxt = torch.tanh(s + 1.0)  # every feature moves at every step ...
        nxt[..., 0] = s[..., 0] + 1.0  # ... the clock counts ...
        nxt[..., 1] = s[..., 1]  # ... and the threshold stays put
        return nxt

    x = torch.randn(1, 5, D, dtype=torch.float64)
    k = torch.tensor([0, 1, 2, 3, 4])  # position i halts after k_i + 1 steps (the last at S)
    x[0, :, 0], x[0, :, 1] = 0.0, -k.double()
    res = act(x, step_fn)
    assert res.steps[0].tolist() == [1, 2, 3, 4, 5]
    # seen[n] is the input of step n + 1, i.e. the state after n steps (n = 0 .. S-1):
    # step n changes position i exactly when n <= N_i, and leaves it bit-identical after.
    for i, halted_at in enumerate(res.steps[0].tolist()):
        for n in range(1, S):
            assert torch.equal(seen[n][0, i], seen[n - 1][0, i]) == (n > halted_at)
    # R ~ 1 at the halting step, so the output is the halting state
    assert (res.remainders > 0.999).all()
    for i in range(4):
        torch.testing.assert_close(res.output[0, i], seen[i + 1][0, i], atol=1e-3, rtol=0)


def test_ponder_cost_gradient_reaches_the_halting_unit():
    act = make_act(-1.0)
    lin = nn.Linear(D, D).double()
    res = act(torch.randn(2, 7, D, dtype=torch.float64), lambda s, n: torch.tanh(lin(s)))
    assert (res.steps > 1).any()
    res.ponder_cost.sum().backward()
    assert act.unit.weight.grad.abs().sum() > 0
    assert act.unit.bias.grad.item() < 0  # raising h lowers R = 1 - sum h, so lowers N + R
    assert lin.weight.grad.abs().sum() > 0  # and the states that h was computed from


def test_ponder_cost_has_no_gradient_when_every_position_halts_at_once():
    """N = 1 gives R = 1 whatever h is: the ponder cost is flat in h (Graves 2016)."""
    act = make_act(30.0, weight_std=0.0)
    res = act(torch.randn(2, 3, D, dtype=torch.float64), pointwise_step())
    assert (res.steps == 1).all()
    res.ponder_cost.sum().backward()
    assert act.unit.bias.grad.item() == 0.0


def test_fixed_depth_is_a_weight_tied_stack():
    step_fn = pointwise_step()
    x = torch.randn(2, 3, D, dtype=torch.float64)
    halting = build_halting("none", D, S)
    assert isinstance(halting, FixedDepth) and not list(halting.parameters())
    res = halting(x, step_fn)
    expected = x
    for n in range(S):
        expected = step_fn(expected, n)
    assert torch.equal(res.output, expected)
    assert (res.steps == S).all() and (res.ponder_cost == S + 1).all()
    assert torch.equal(res.weights[-1], torch.ones(2, 3, dtype=torch.float64))
    torch.testing.assert_close(res.weights.sum(0), torch.ones(2, 3, dtype=torch.float64))


def test_compiles_as_one_graph():
    """No .item() and no data-dependent branch: fullgraph tracing raises on any graph break."""
    act = make_act(-1.0)
    lin = nn.Linear(D, D).double()
    compiled = torch.compile(
        lambda x: act(x, lambda s, n: torch.tanh(lin(s) + n)), fullgraph=True, backend="eager"
    )
    x = torch.randn(2, 3, D, dtype=torch.float64)
    got, want = compiled(x), act(x, lambda s, n: torch.tanh(lin(s) + n))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_bad_options_name_the_valid_ones():
    assert HALTINGS == ("act", "none")
    with pytest.raises(ValueError, match="unknown halting 'adaptive'; valid choices: act, none"):
        build_halting("adaptive", D, S)
    with pytest.raises(ValueError, match="epsilon must be in"):
        AdaptiveHalting(D, S, epsilon=1.0)
    with pytest.raises(ValueError, match="max_steps must be >= 1, got 0"):
        build_halting("none", D, 0)
