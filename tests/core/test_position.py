"""Position schemes against naive per-pair definitions, in float64."""

import math
import re
from pathlib import Path

import pytest
import torch

from rltrans.core.attention import sequence_mask
from rltrans.core.position import (
    POSITIONS,
    ALiBiAttention,
    RotaryAttention,
    ShawAttention,
    XLAttention,
    build_attention_position,
    build_input_position,
    sinusoid,
)

B, H, E = 2, 2, 4
D = H * E


def heads(length):
    return torch.randn(B, H, length, E, dtype=torch.float64)


def softmax_attend(scores, v, mask):
    return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v


def test_xl_shift_equals_naive_terms_b_and_d():
    """(q_i + v) . W_kR R_{(M+i)-j} for every pair, versus the shifted buffer."""
    xl = XLAttention(D, H).double()
    torch.nn.init.normal_(xl.v)
    length, keys = 5, 9
    q = heads(length)
    r = xl.relative_keys(keys, length, q.device)  # (H, W, E) over distances S-1 .. -L
    bd = XLAttention.shift((q + xl.v) @ r.transpose(-1, -2), keys)
    m = keys - length
    for i in range(length):
        for j in range(keys):
            dist = torch.tensor([m + i - j])
            r_ij = xl.r_proj(sinusoid(dist, D).double()).view(H, E)
            naive = ((q[:, :, i] + xl.v[:, 0]) * r_ij).sum(-1)  # (B, H)
            torch.testing.assert_close(bd[:, :, i, j], naive)


def test_xl_attention_equals_naive_scores():
    xl = XLAttention(D, H).double()
    torch.nn.init.normal_(xl.u)
    torch.nn.init.normal_(xl.v)
    q, k, v = heads(4), heads(7), heads(7)
    mask = sequence_mask(4, 3)
    scores = torch.zeros(B, H, 4, 7, dtype=torch.float64)
    for i in range(4):
        for j in range(7):
            r_ij = xl.r_proj(sinusoid(torch.tensor([3 + i - j]), D).double()).view(H, E)
            ac = ((q[:, :, i] + xl.u[:, 0]) * k[:, :, j]).sum(-1)
            bd = ((q[:, :, i] + xl.v[:, 0]) * r_ij).sum(-1)
            scores[:, :, i, j] = (ac + bd) / math.sqrt(E)
    expected = softmax_attend(scores, v, mask)
    for kernel in ("sdpa", "math"):
        torch.testing.assert_close(xl(q, k, v, mask=mask, dropout=0.0, kernel=kernel), expected)


def test_shaw_equals_naive_with_clipping():
    shaw = ShawAttention(E, max_distance=2).double()
    q, k, v = heads(4), heads(6), heads(6)
    mask = sequence_mask(4, 2)
    out = torch.zeros_like(q)
    for i in range(4):
        idx = [min(max(2 + i - j, -2), 2) + 2 for j in range(6)]  # clip((M+i)-j) into the table
        a_k, a_v = shaw.rel_k.weight[idx], shaw.rel_v.weight[idx]  # (S, E)
        scores = ((q[:, :, i : i + 1] * (k + a_k)).sum(-1)) / math.sqrt(E)  # (B, H, S)
        p = scores.masked_fill(~mask[0, 0, i], float("-inf")).softmax(-1)
        out[:, :, i] = (p.unsqueeze(-1) * (v + a_v)).sum(-2)
    torch.testing.assert_close(shaw(q, k, v, mask=mask, dropout=0.0, kernel="math"), out)


def test_shaw_clips_distances_beyond_max():
    shaw = ShawAttention(E, max_distance=3)
    idx = shaw.bucket(4, 10, torch.device("cpu"))
    distance = torch.arange(6, 10).unsqueeze(1) - torch.arange(10).unsqueeze(0)
    assert torch.equal(idx, distance.clamp(-3, 3) + 3)
    assert idx.max() == 6 and idx.min() >= 0


def test_rotary_scores_depend_only_on_relative_offset():
    rot = RotaryAttention(E).double()
    q, k = heads(1), heads(1)
    for shift in (0, 5, 37):
        a = rot.rotate(q, torch.tensor([3 + shift])) @ rot.rotate(k, torch.tensor([1 + shift])).mT
        b = rot.rotate(q, torch.tensor([2])) @ rot.rotate(k, torch.tensor([0])).mT
        torch.testing.assert_close(a, b)
    far = rot.rotate(q, torch.tensor([9])) @ rot.rotate(k, torch.tensor([0])).mT
    assert not torch.allclose(far, b)


def test_rotary_equals_complex_rotation():
    rot = RotaryAttention(E).double()
    x = heads(3)
    pos = torch.tensor([0, 4, 11])
    half = E // 2
    z = torch.complex(x[..., :half], x[..., half:])
    angle = pos.double().unsqueeze(1) * rot.inv_freq.double()
    expected = z * torch.polar(torch.ones_like(angle), angle)
    torch.testing.assert_close(rot.rotate(x, pos), torch.cat([expected.real, expected.imag], -1))


def test_alibi_bias_is_toeplitz_and_matches_definition():
    alibi = ALiBiAttention(4)
    assert torch.allclose(alibi.slopes.flatten(), torch.tensor([2**-2, 2**-4, 2**-6, 2**-8]))
    q, k, v = heads(4), heads(6), heads(6)
    alibi2 = ALiBiAttention(H)
    mask = sequence_mask(4, 2)
    dist = (torch.arange(2, 6).unsqueeze(1) - torch.arange(6)).abs().double()
    scores = q @ k.mT / math.sqrt(E) - alibi2.slopes.double() * dist
    expected = softmax_attend(scores, v, mask)
    for kernel in ("sdpa", "math"):
        torch.testing.assert_close(alibi2(q, k, v, mask=mask, dropout=0.0, kernel=kernel), expected)


@pytest.mark.parametrize("position", POSITIONS)
def test_sdpa_equals_reference_math(position):
    scheme = build_attention_position(position, D, H).double()
    for p in scheme.parameters():
        torch.nn.init.normal_(p)
    q, k, v = heads(5), heads(8), heads(8)
    mask = sequence_mask(5, 3, memory_valid=torch.tensor([[True, False, True], [False] * 3]))
    a = scheme(q, k, v, mask=mask, dropout=0.0, kernel="sdpa")
    b = scheme(q, k, v, mask=mask, dropout=0.0, kernel="math")
    torch.testing.assert_close(a, b)


def test_absolute_input_schemes():
    assert build_input_position("xl", D) is None
    learned = build_input_position("learned", D, max_len=8)
    pos = torch.tensor([[0, 7, 100]])
    torch.testing.assert_close(learned(pos)[0, 2], learned(pos)[0, 1])  # clamped to max_len - 1
    sin = build_input_position("sinusoidal", D)
    assert sin(pos).shape == (1, 3, D)


def test_unknown_position_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown position scheme 'relative'.*none.*xl.*alibi"):
        build_attention_position("relative", D, H)


def test_rotary_needs_even_head_dim():
    with pytest.raises(ValueError, match="even head dimension"):
        RotaryAttention(5)


def test_xl_step_context_is_computed_from_the_current_weights():
    """Nothing is memoised inside the scheme: every call sees the weights as they are now
    (the acting state, not the module, holds a context between weight updates)."""
    xl = XLAttention(D, H).double()
    cpu = torch.device("cpu")
    with torch.no_grad():
        first = xl.step_context(8, cpu, torch.float64)  # (H, M+1, E)
        assert first.shape == (H, 9, E)
        torch.testing.assert_close(first, xl.relative_keys(9, 1, cpu)[:, :9])
        xl.r_proj.weight.mul_(-2.0)  # in place, as an optimizer step writes
        torch.testing.assert_close(xl.step_context(8, cpu, torch.float64), -2.0 * first)
        xl.load_state_dict({k: torch.zeros_like(t) for k, t in xl.state_dict().items()})
        assert xl.step_context(8, cpu, torch.float64).abs().sum() == 0
        assert xl.relative_keys(5, 2, cpu).shape == (H, 7, E)


def test_no_version_counter_is_read_anywhere_in_rltrans():
    """Acting contexts live in the acting state: no module keys a cache on ``_version``."""
    import rltrans

    root = Path(rltrans.__file__).parent
    sources = [*root.rglob("*.py"), *(root.parent / "agents").rglob("*.py")]
    assert len(sources) > 20
    reads = re.compile(r"\._version\b|increment_version")  # a tensor's counter, or a bump
    assert [str(p) for p in sources if reads.search(p.read_text())] == []
