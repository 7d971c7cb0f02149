"""The core's dropout: inverted dropout with uniform-sample masks, hash masks when compiled."""

import pytest
import torch

from rltrans.core.attention import attend
from rltrans.core.dropout import Dropout, draw_seeds, dropout, hash_keep, keep_threshold


def test_keep_rate_scale_and_gradient():
    torch.manual_seed(0)
    x = torch.ones(200_000, requires_grad=True)
    y = dropout(x, 0.3)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.7) < 0.005  # ~6 standard deviations
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / 0.7))
    y.sum().backward()
    torch.testing.assert_close(x.grad, y.detach())  # d(x * keep)/dx = keep


def test_half_precision_keeps_its_dtype_and_rate():
    x = torch.ones(100_000, dtype=torch.bfloat16)
    y = dropout(x, 0.1)
    assert y.dtype == torch.bfloat16
    assert abs((y != 0).float().mean().item() - 0.9) < 0.006


def test_identity_when_not_training_or_zero():
    x = torch.randn(5, 7)
    assert dropout(x, 0.5, training=False) is x
    assert dropout(x, 0.0) is x
    module = Dropout(0.5).eval()
    assert module(x) is x
    assert "p=0.5" in repr(module)


@pytest.mark.parametrize("p", [-0.1, 1.0])
def test_bad_probability_is_named(p):
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        Dropout(p)
    with pytest.raises(ValueError, match=str(p)):
        dropout(torch.ones(3), p)


def test_attention_dropout_on_cpu_drops_whole_weights_and_keeps_the_mean():
    """attend(dropout=p) on CPU goes through the math path with this dropout: outputs are
    averages of kept, rescaled weights, so their mean over many draws is the dropout-free one."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 4, 8, dtype=torch.float64) for _ in range(3))
    clean = attend(q, k, v)
    draws = torch.stack([attend(q, k, v, dropout=0.2) for _ in range(4000)])
    assert not torch.allclose(draws[0], clean)
    torch.testing.assert_close(draws.mean(0), clean, atol=0.05, rtol=0)


def test_compiled_dropout_computes_the_hash_masks_and_never_shares_one():
    """Under torch.compile the mask is hash_keep of two seed words per call drawn from torch's
    generator: the output and gradient are those of the eager reference for the same seeds,
    reproducible under manual_seed, and two dropouts of one tensor get two masks."""
    from rltrans.compiling import compiled

    def twice(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return dropout(x, 0.5), dropout(x, 0.5)

    x = torch.randn(40, 100, requires_grad=True)
    fast = compiled(twice)
    torch.manual_seed(3)
    a, b = fast(x)
    (a.sum() + 2 * b.sum()).backward()
    torch.manual_seed(3)
    keep_a = hash_keep(x.shape, draw_seeds(), 0.5)
    keep_b = hash_keep(x.shape, draw_seeds(), 0.5)
    assert not torch.equal(keep_a, keep_b)
    torch.testing.assert_close((a, b), (x * keep_a, x * keep_b), rtol=0, atol=0)
    torch.testing.assert_close(x.grad, keep_a + 2 * keep_b, rtol=0, atol=0)
    torch.manual_seed(3)
    torch.testing.assert_close(fast(x), (a, b), rtol=0, atol=0)


def test_compiled_dropout_keeps_a_half_precision_dtype():
    from rltrans.compiling import compiled

    y = compiled(lambda x: dropout(x, 0.1))(torch.ones(50_000, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16
    assert abs((y != 0).float().mean().item() - 0.9) < 0.008


def test_hash_threshold_is_the_float32_comparison():
    """k >= keep_threshold(p) iff the float32 uniform k / 2^24 >= float32(p), as rand's u >= p."""
    for p in (0.1, 0.25, 0.3, 1 / 3, 0.5, 0.9):
        t = keep_threshold(p)
        p32 = torch.tensor(p, dtype=torch.float32)
        k = torch.tensor([t - 1, t], dtype=torch.float64)
        u = (k / 2**24).to(torch.float32)  # exact: 24-bit integers over 2^24
        assert (u >= p32).tolist() == [False, True], p


def test_hash_masks_look_independent():
    """Keep rate, and no structure between neighbours, rows, columns or successive calls:
    each statistic within ~5 standard deviations of what independent draws give."""
    torch.manual_seed(0)
    rows, cols = 1024, 1024
    n = rows * cols
    kept = hash_keep((rows, cols), draw_seeds(), 0.1) > 0
    assert abs(kept.double().mean().item() - 0.9) < 5 * (0.09 / n) ** 0.5

    def corr(a: torch.Tensor, b: torch.Tensor) -> float:
        return torch.corrcoef(torch.stack([a.flatten(), b.flatten()]).double())[0, 1].item()

    bound = 5 / n**0.5
    assert abs(corr(kept[:, 1:], kept[:, :-1])) < bound  # neighbours in a row
    assert abs(corr(kept[1:], kept[:-1])) < bound  # neighbours in a column
    other = hash_keep((rows, cols), draw_seeds(), 0.1) > 0
    assert abs(corr(kept, other)) < bound  # the next call

    # At p = 0.5 every window of 4 consecutive bits is one of 16 patterns, equally likely.
    bits = (hash_keep((n,), draw_seeds(), 0.5) > 0).long()
    patterns = (bits[:-3] * 8 + bits[1:-2] * 4 + bits[2:-1] * 2 + bits[3:]).bincount(minlength=16)
    expected = (n - 3) / 16
    chi2 = (((patterns.double() - expected) ** 2) / expected).sum().item()
    assert chi2 < 50  # 15 degrees of freedom: P(chi2 > 50) ~ 1e-5 (windows overlap, ~2x var)
    # Per column and per row keep rates at p = 0.5 (chi-square, 1023 degrees of freedom).
    grid = bits.view(rows, cols).double()
    for rate in (grid.mean(0), grid.mean(1)):
        chi2 = (((rate - 0.5) ** 2) / (0.25 / cols)).sum().item()
        assert chi2 < 1023 + 5 * (2 * 1023) ** 0.5


def test_hash_keep_names_a_tensor_past_its_counter():
    with pytest.raises(ValueError, match="2147483648 elements"):
        hash_keep((2**16, 2**15), torch.zeros(2, dtype=torch.int32), 0.1)
