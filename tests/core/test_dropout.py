"""The core's dropout: inverted dropout with uniform-sample masks, eager and compiled alike."""

import pytest
import torch

from rltrans.core.attention import attend
from rltrans.core.dropout import Dropout, dropout


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


@pytest.mark.cli
def test_compiled_dropout_draws_the_eager_masks_and_never_shares_one():
    """Programs compiled by rltrans keep torch's random ops, so from the same seed a compiled
    step draws the very masks the eager one does (outputs and gradients equal to the bit),
    and two dropouts of one tensor get two masks."""
    from rltrans.accel.compile import compiled

    def twice(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return dropout(x, 0.5), dropout(x, 0.5)

    x = torch.randn(40, 100, requires_grad=True)
    torch.manual_seed(3)
    a, b = twice(x)
    (a.sum() + 2 * b.sum()).backward()
    eager_grad, x.grad = x.grad, None
    assert not torch.equal(a != 0, b != 0)
    fast = compiled(twice)
    torch.manual_seed(3)
    fa, fb = fast(x)
    (fa.sum() + 2 * fb.sum()).backward()
    torch.testing.assert_close((fa, fb), (a, b), rtol=0, atol=0)
    torch.testing.assert_close(x.grad, eager_grad, rtol=0, atol=0)


@pytest.mark.cli
def test_compiled_dropout_keeps_a_half_precision_dtype():
    from rltrans.accel.compile import compiled

    y = compiled(lambda x: dropout(x, 0.1))(torch.ones(50_000, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16
    assert abs((y != 0).float().mean().item() - 0.9) < 0.008


@pytest.mark.cli
def test_importing_the_core_registers_nothing_with_torch():
    """The core's dropout is plain tensor code: no custom op under an ``rltrans`` namespace
    (registering one at import broke torch 2.4, whose schema inference differs)."""
    import subprocess
    import sys

    code = (
        "import torch, rltrans.core.attention, rltrans.core.block\n"
        "print(hasattr(torch.ops, 'rltrans') and len(list(torch.ops.rltrans)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() in ("False", "0"), out.stdout
