"""The attention kernel, masks and multi-head attention."""

import math

import pytest
import torch

from rltrans.core.attention import (
    MultiHeadAttention,
    StepKV,
    attend,
    attend_one,
    sequence_mask,
)
from rltrans.core.position import POSITIONS, build_attention_position

D, H = 16, 4


def naive_attention(q, k, v, mask=None):
    """Per-query loop of softmax(q.k / sqrt(head_dim)) v."""
    b, h, length, e = q.shape
    out = torch.zeros_like(q)
    for bi in range(b):
        for hi in range(h):
            for i in range(length):
                scores = torch.stack([q[bi, hi, i] @ k[bi, hi, j] for j in range(k.shape[2])])
                scores = scores / math.sqrt(e)
                if mask is not None:
                    m = mask.expand(b, h, length, k.shape[2])[bi, hi, i]
                    scores = scores.masked_fill(~m, float("-inf"))
                out[bi, hi, i] = scores.softmax(0) @ v[bi, hi]
    return out


@pytest.mark.parametrize("kernel", ["sdpa", "math"])
def test_attend_matches_naive_loop_with_head_dim_scaling(kernel):
    q = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    k, v = (torch.randn(2, 3, 7, 8, dtype=torch.float64) for _ in range(2))
    mask = sequence_mask(5, 2)
    got = attend(q, k, v, mask=mask, kernel=kernel)
    torch.testing.assert_close(got, naive_attention(q, k, v, mask))


def test_attend_sdpa_equals_math_with_bias_and_mask():
    q, k, v = (torch.randn(2, 4, 6, 8, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(4, 6, 6, dtype=torch.float64)
    mask = sequence_mask(6, 0)
    a = attend(q, k, v, mask=mask, bias=bias, kernel="sdpa")
    b = attend(q, k, v, mask=mask, bias=bias, kernel="math")
    torch.testing.assert_close(a, b)


def test_mha_without_position_equals_torch_multihead_attention():
    """Same weights, same outputs as nn.MultiheadAttention: projections and 1/sqrt(head_dim)."""
    ours = MultiHeadAttention(D, H, build_attention_position("none", D, H)).double()
    ref = torch.nn.MultiheadAttention(D, H, batch_first=True).double()
    with torch.no_grad():
        ref.in_proj_weight.copy_(ours.qkv_proj.weight)
        ref.in_proj_bias.copy_(ours.qkv_proj.bias)
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    x = torch.randn(3, 7, D, dtype=torch.float64)
    causal = torch.triu(torch.ones(7, 7, dtype=torch.bool), 1)  # torch: True = masked
    expected, _ = ref(x, x, x, attn_mask=causal, need_weights=False)
    got, _ = ours(x, None, sequence_mask(7, 0))
    torch.testing.assert_close(got, expected)


def test_sequence_mask_rules():
    starts = torch.tensor([[False, False, True, False]])
    valid = torch.tensor([[False, True, True]])
    m = sequence_mask(4, 3, window=3, memory_valid=valid, starts=starts)[0, 0]
    expected = torch.tensor(
        [
            # mem0   mem1   mem2   cur0   cur1   cur2   cur3
            [False, True, True, True, False, False, False],  # slot 0 invalid
            [False, True, True, True, True, False, False],  # window 3: mem0 out of reach anyway
            [False, False, False, False, False, True, False],  # new episode: only itself
            [False, False, False, False, False, True, True],
        ]
    )
    assert torch.equal(m, expected)


def test_sequence_mask_never_fully_masks_a_row():
    padding = torch.zeros(2, 5, dtype=torch.bool)  # every key is padding
    m = sequence_mask(5, 0, key_padding=padding, memory_valid=None)
    assert m.any(-1).all()
    q = k = v = torch.randn(2, 1, 5, 4)
    for kernel in ("sdpa", "math"):
        assert torch.isfinite(attend(q, k, v, mask=m, kernel=kernel)).all()


@pytest.mark.parametrize("position", POSITIONS)
def test_no_nan_with_fully_invalid_memory(position):
    attn = MultiHeadAttention(D, H, build_attention_position(position, D, H))
    x, mem = torch.randn(2, 3, D), torch.randn(2, 5, D)
    mask = sequence_mask(3, 5, memory_valid=torch.zeros(2, 5, dtype=torch.bool))
    out, _ = attn(x, attn.project_kv(mem), mask)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters() if p.grad is not None)


def test_unknown_kernel_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown attention kernel 'flash3'.*sdpa, math"):
        MultiHeadAttention(D, H, build_attention_position("none", D, H), kernel="flash3")


def test_heads_must_divide_dim():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, 4, build_attention_position("none", 10, 4))


@pytest.mark.parametrize("kernel", ["sdpa", "math"])
@pytest.mark.parametrize("length", [1, 5])
def test_additive_float_mask_equals_boolean_mask(kernel, length):
    """An additive 0/-inf mask (built once per acting step) means the same as the boolean one,
    with and without a bias, for a single query (the acting path) and for several."""
    q = torch.randn(2, 3, length, 8, dtype=torch.float64)
    k, v = (torch.randn(2, 3, 7, 8, dtype=torch.float64) for _ in range(2))
    mask = sequence_mask(length, 7 - length, memory_valid=torch.rand(2, 7 - length) > 0.5)
    additive = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    bias = torch.randn(3, length, 7, dtype=torch.float64)
    for b in (None, bias):
        expected = attend(q, k, v, mask=mask, bias=b, kernel="math")
        got = attend(q, k, v, mask=additive, bias=b, kernel=kernel)
        torch.testing.assert_close(got, expected)
    torch.testing.assert_close(attend(q, k, v, mask=mask), naive_attention(q, k, v, mask))


def test_attend_one_equals_attend_over_window_and_own_key():
    """The acting kernel: a window read in place plus the own key as an extra column ==
    attend() with L = 1 over [window ; own], with a bias and a mask hiding some slots."""
    torch.manual_seed(0)
    n, m, e = 3, 5, D // H
    ring_k, ring_v = torch.randn(n, H, 2 * m, e), torch.randn(n, H, 2 * m, e)
    kv = StepKV(ring_k[:, :, 2 : 2 + m], ring_v[:, :, 2 : 2 + m], *torch.randn(2, n, H, e))
    q, bias = torch.randn(n, H, e), torch.randn(n, H, m + 1)
    visible = torch.rand(n, 1, m + 1) > 0.4
    visible[..., -1] = True  # the own key is always visible
    mask = torch.zeros(visible.shape).masked_fill_(~visible, float("-inf"))
    got = attend_one(q, kv, mask=mask, bias=bias)
    keys, values = kv.full()
    want = attend(
        q.unsqueeze(2),
        keys,
        values,
        mask=visible.unsqueeze(1),
        bias=bias.unsqueeze(2),
        kernel="math",
    )
    torch.testing.assert_close(got, want.squeeze(2))


@pytest.mark.parametrize("position", POSITIONS)
def test_mha_step_equals_forward_with_window_as_memory(position):
    """MultiHeadAttention.step (acting) == forward with L = 1 and the window as memory, for
    every position scheme, and returns the step's own key/value."""
    torch.manual_seed(0)
    n, m = 3, 6
    mha = MultiHeadAttention(D, H, build_attention_position(position, D, H)).double()
    for name, p in mha.named_parameters():
        if name.endswith((".u", ".v")):
            torch.nn.init.normal_(p, std=0.5)
    x, memory = torch.randn(n, 1, D).double(), torch.randn(n, m, D).double()
    window_k, window_v = mha.project_kv(memory)
    valid = torch.rand(n, m) > 0.3
    mask = sequence_mask(1, m, window=m, memory_valid=valid)
    want, (k, v) = mha(x, (window_k, window_v), mask)
    additive = torch.zeros(mask.shape, dtype=x.dtype).masked_fill_(~mask, float("-inf"))
    context = mha.scheme.step_context(m, x.device, x.dtype)
    got, k_step, v_step = mha.step(x[:, 0], window_k, window_v, additive[:, 0], context)
    torch.testing.assert_close(got, want[:, 0])
    torch.testing.assert_close(k_step, k[:, :, 0])
    torch.testing.assert_close(v_step, v[:, :, 0])
