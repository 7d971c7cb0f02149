"""Action heads: reference math in float64, shapes with leading dims, env mapping, gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import distributions as td

from rltrans.agents.heads import (
    BernoulliHead,
    CategoricalHead,
    GaussianHead,
    MultiCategoricalHead,
    build_action_head,
)

IN = 8
LEAD = (3, 5)  # (B, L)


def _features(seed: int = 0) -> torch.Tensor:
    return torch.randn(
        *LEAD, IN, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )


def _double_head(space: spaces.Space) -> torch.nn.Module:
    head = build_action_head(space, IN).double()
    # Larger output weights than the 0.01 init, so the distributions are far from uniform.
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.7)
    return head


def test_discrete_matches_torch_categorical() -> None:
    space = spaces.Discrete(6, start=2)
    head = _double_head(space)
    assert isinstance(head, CategoricalHead)
    assert head.action_shape == () and head.action_dtype == torch.long
    h = _features()
    dist, ref = head(h), td.Categorical(logits=head.logits(h))
    a = dist.sample()
    assert a.shape == LEAD and a.dtype == torch.long
    torch.testing.assert_close(dist.log_prob(a), ref.log_prob(a))
    torch.testing.assert_close(dist.entropy(), ref.entropy())
    torch.testing.assert_close(dist.mode(), head.logits(h).argmax(-1))
    env_a = head.env_action(a.reshape(-1))
    assert all(space.contains(int(x)) for x in env_a)
    np.testing.assert_array_equal(env_a, a.reshape(-1).numpy() + 2)


def test_multidiscrete_equals_sum_of_independent_categoricals() -> None:
    nvec = [3, 5, 2]
    space = spaces.MultiDiscrete(nvec, start=[0, -2, 1])
    head = _double_head(space)
    assert isinstance(head, MultiCategoricalHead)
    assert head.action_shape == (3,) and head.action_dtype == torch.long
    h = _features()
    refs = [td.Categorical(logits=x) for x in torch.split(head.logits(h), nvec, dim=-1)]
    dist = head(h)
    a = dist.sample()
    assert a.shape == (*LEAD, 3)
    torch.testing.assert_close(
        dist.log_prob(a), sum(r.log_prob(a[..., k]) for k, r in enumerate(refs))
    )
    torch.testing.assert_close(dist.entropy(), sum(r.entropy() for r in refs))
    torch.testing.assert_close(dist.mode(), torch.stack([r.logits.argmax(-1) for r in refs], -1))
    env_a = head.env_action(a.reshape(-1, 3))
    assert all(space.contains(x) for x in env_a)


def test_multidiscrete_padded_sampling_frequencies() -> None:
    """Sampling through the -inf padding draws each entry from its own categorical only."""
    space = spaces.MultiDiscrete([2, 4])
    head = build_action_head(space, IN)
    torch.nn.init.normal_(head.logits.weight, std=1.0)
    dist = head(torch.randn(1, IN).expand(20000, IN))
    a = dist.sample()
    assert a[:, 0].max() <= 1 and a[:, 1].max() <= 3  # never a padded slot
    probs = dist.log_p[0].exp()  # (2, 4), padded slots zero
    assert probs[0, 2:].sum() == 0
    for k, n in enumerate([2, 4]):
        freq = torch.bincount(a[:, k], minlength=n).double() / len(a)
        torch.testing.assert_close(freq, probs[k, :n].double(), atol=0.02, rtol=0)


def test_multidiscrete_2d_nvec_shape() -> None:
    space = spaces.MultiDiscrete([[2, 3], [4, 2]])
    head = build_action_head(space, IN)
    dist = head(torch.randn(*LEAD, IN))
    a = dist.sample()
    assert head.action_shape == (2, 2) and a.shape == (*LEAD, 2, 2)
    assert dist.log_prob(a).shape == LEAD and dist.entropy().shape == LEAD
    assert all(space.contains(x) for x in head.env_action(a.reshape(-1, 2, 2)))


@pytest.mark.parametrize("shape", [(3,), (2, 3), ()])
def test_gaussian_matches_torch_normal(shape: tuple[int, ...]) -> None:
    space = spaces.Box(-1.0, 1.0, shape, np.float32)
    head = _double_head(space)
    assert isinstance(head, GaussianHead)
    assert head.action_shape == shape and head.action_dtype == torch.float32
    h = _features()
    dist = head(h)
    mean = head.mean(h).reshape(*LEAD, *shape)
    ref = td.Independent(td.Normal(mean, head.log_std.exp().expand_as(mean)), len(shape))
    a = dist.sample()
    assert a.shape == (*LEAD, *shape)
    torch.testing.assert_close(dist.log_prob(a), ref.log_prob(a))
    torch.testing.assert_close(dist.entropy(), ref.entropy())
    # Entropy of a diagonal Gaussian: sum_d (1/2) log(2 pi e sigma_d^2), whatever the mean.
    expected = (0.5 * torch.log(2 * math.pi * math.e * head.log_std.exp() ** 2)).sum()
    torch.testing.assert_close(dist.entropy(), expected.expand(LEAD))
    torch.testing.assert_close(dist.mode(), mean)


def test_gaussian_env_action_clips_but_samples_stay_unbounded() -> None:
    space = spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 0.5], np.float32))
    head = build_action_head(space, IN)
    with torch.no_grad():
        head.log_std.fill_(1.5)  # std ~4.5: most samples fall outside the bounds
    a = head(torch.randn(64, IN)).sample()
    assert (a[:, 1] > 0.5).any()  # the stored sample is not clipped
    env_a = head.env_action(a)
    assert env_a.dtype == np.float32 and all(space.contains(x) for x in env_a)
    np.testing.assert_allclose(env_a, np.clip(a.numpy(), space.low, space.high))
    torch.testing.assert_close(head.env_action_tensor(a), torch.as_tensor(env_a))


def test_multibinary_matches_torch_bernoulli() -> None:
    space = spaces.MultiBinary([2, 3])
    head = _double_head(space)
    assert isinstance(head, BernoulliHead)
    assert head.action_shape == (2, 3) and head.action_dtype == torch.long
    h = _features()
    dist = head(h)
    ref = td.Independent(td.Bernoulli(logits=head.logits(h).reshape(*LEAD, 2, 3)), 2)
    a = dist.sample()
    assert a.shape == (*LEAD, 2, 3) and set(a.unique().tolist()) <= {0, 1}
    torch.testing.assert_close(dist.log_prob(a), ref.log_prob(a.double()))
    torch.testing.assert_close(dist.entropy(), ref.entropy())
    torch.testing.assert_close(dist.mode(), (ref.base_dist.probs > 0.5).long())
    env_a = head.env_action(a.reshape(-1, 2, 3))
    assert env_a.dtype == np.int8 and all(space.contains(x) for x in env_a)


@pytest.mark.parametrize(
    "space",
    [
        spaces.Discrete(4),
        spaces.MultiDiscrete([3, 2]),
        spaces.Box(-1, 1, (2,), np.float32),
        spaces.MultiBinary(3),
    ],
)
def test_gradients_reach_log_std_and_logits(space: spaces.Space) -> None:
    head = build_action_head(space, IN)
    h = torch.randn(*LEAD, IN, requires_grad=True)
    dist = head(h)
    a = dist.sample()  # as stored in a rollout: no gradient through the action
    assert not a.requires_grad
    (dist.log_prob(a).mean() + dist.entropy().mean()).backward()
    for name, p in head.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert h.grad.abs().sum() > 0


def test_small_init_gives_near_uniform_policy() -> None:
    head = build_action_head(spaces.Discrete(6), 64)
    ent = head(torch.randn(32, 64)).entropy()
    torch.testing.assert_close(ent, torch.full((32,), math.log(6)), atol=1e-2, rtol=0)


@pytest.mark.parametrize(
    "space",
    [
        spaces.Dict({"a": spaces.Discrete(2)}),
        spaces.Box(0, 5, (2,), np.int64),
        spaces.Text(5),
    ],
)
def test_unsupported_action_space_lists_supported(space: spaces.Space) -> None:
    with pytest.raises(ValueError, match=r"not supported; supported: Discrete, MultiDiscrete, Box"):
        build_action_head(space, IN)


def test_categorical_samples_follow_the_probabilities():
    """The Gumbel-max sampler draws from softmax(logits), masked (-inf) entries never."""
    from rltrans.agents.heads import CategoricalDist

    probs = torch.tensor([0.1, 0.2, 0.7, 0.0])
    dist = CategoricalDist(probs.log().expand(100_000, 4), event_ndim=0)
    freq = torch.bincount(dist.sample(), minlength=4).float() / 100_000
    torch.testing.assert_close(freq, probs, atol=0.01, rtol=0)
    assert freq[3] == 0
