"""Gates and blocks."""

import pytest
import torch

from rltrans.core.block import BlockConfig, build_block
from rltrans.core.gates import GATES, GRUGate, build_gate

D = 32


def relative_change(gate, x, y):
    return ((gate(x, y) - x).norm() / x.norm()).item()


def test_gru_gate_at_init_is_close_to_identity():
    """With b_g = 2 the update gate starts near 0.12, so g(x, y) stays near x."""
    x, y = torch.randn(256, D), torch.randn(256, D)
    assert relative_change(GRUGate(D, gate_bias=2.0), x, y) < 0.2
    # ... and the larger the bias, the closer to identity; with b_g = 0 it is not.
    assert relative_change(GRUGate(D, gate_bias=6.0), x, y) < 0.01
    assert relative_change(GRUGate(D, gate_bias=0.0), x, y) > 0.35


def test_gru_gate_equations():
    g = GRUGate(4, gate_bias=2.0).double()
    x, y = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    w_r, w_z, w_g = g.w.weight.chunk(3)
    u_r, u_z = g.u.weight.chunk(2)
    r = torch.sigmoid(y @ w_r.T + x @ u_r.T)
    z = torch.sigmoid(y @ w_z.T + x @ u_z.T - 2.0)
    h = torch.tanh(y @ w_g.T + (r * x) @ g.u_g.weight.T)
    torch.testing.assert_close(g(x, y), (1 - z) * x + z * h)


@pytest.mark.parametrize("name", GATES)
def test_every_gate_shapes_and_gradients(name):
    gate = build_gate(name, D)
    x = torch.randn(2, 5, D, requires_grad=True)
    y = torch.randn(2, 5, D, requires_grad=True)
    out = gate(x, y)
    assert out.shape == x.shape
    out.sum().backward()
    assert x.grad.abs().sum() > 0 and y.grad.abs().sum() > 0


def test_unknown_gate_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown gate 'lstm'; valid choices: residual, input"):
        build_gate("lstm", D)


def test_block_placements_and_errors():
    """Pre-norm normalises each sub-layer's input, post-norm each gated sum; the other slots
    are the identity, and the LayerNorms keep their one name in the state_dict."""
    pre = build_block(BlockConfig(dim=D, heads=4, norm="pre"))
    post = build_block(BlockConfig(dim=D, heads=4, norm="post"))
    assert tuple(pre.placement)[0::2] == (pre.norm1, pre.norm2)
    assert tuple(post.placement)[1::2] == (post.norm1, post.norm2)
    for slot in (*tuple(pre.placement)[1::2], *tuple(post.placement)[0::2]):
        assert isinstance(slot, torch.nn.Identity)
    assert pre.state_dict().keys() == post.state_dict().keys()
    assert {"norm1.weight", "norm2.bias"} <= pre.state_dict().keys()
    with pytest.raises(ValueError, match="unknown norm placement 'sandwich'; valid choices: pre"):
        BlockConfig(dim=D, heads=4, norm="sandwich")
    with pytest.raises(ValueError, match="unknown sublayer activation 'gelu'"):
        BlockConfig(dim=D, heads=4, sublayer_activation="gelu")


def test_pre_norm_block_output_is_identity_plus_branches():
    """Pre-norm with residual gates keeps an identity path: zeroing both branches returns x."""
    block = build_block(BlockConfig(dim=D, heads=4, norm="pre", gate="residual"))
    with torch.no_grad():
        block.attn.out_proj.weight.zero_()
        block.attn.out_proj.bias.zero_()
        block.mlp.net[-1].weight.zero_()
        block.mlp.net[-1].bias.zero_()
    x = torch.randn(2, 3, D)
    torch.testing.assert_close(block(x)[0], x)
