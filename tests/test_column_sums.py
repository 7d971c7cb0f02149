"""The column-sum pass: the rewritten graph computes what the original did, only where it may."""

import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

import rltrans.compiling
from rltrans.column_sums import MIN_COLUMNS, MIN_ROWS, ColumnSumsAsGemv

aten = torch.ops.aten
R, D, K = 600, 160, 40  # rows (>= MIN_ROWS), columns (>= MIN_COLUMNS), the matmul's other side


def rewrite(fn, *args) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """(original, rewritten) aten graphs of ``fn`` traced on fake copies of ``args``."""
    original = make_fx(fn, tracing_mode="fake")(*args)
    rewritten = make_fx(fn, tracing_mode="fake")(*args)
    ColumnSumsAsGemv()(rewritten.graph)
    rewritten.graph.lint()
    rewritten.recompile()
    return original, rewritten


def sums(gm: torch.fx.GraphModule) -> int:
    """Row sums left in a graph."""
    return sum(n.target is aten.sum.dim_IntList for n in gm.graph.nodes)


def bias_grad(dy, x, w):
    """A Linear's backward: dX, dW and the bias gradient (dY summed over rows)."""
    return dy @ w, dy.t() @ x, dy.sum(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_bias_gradient_becomes_a_gemv_with_the_same_value(dtype):
    """The row sum of a matmul operand is rewritten (no sum left) and the graph's outputs are
    unchanged up to the rounding of another summation order."""
    g = torch.Generator().manual_seed(0)
    dy, x, w = (torch.randn(*s, generator=g, dtype=dtype) for s in ((R, D), (R, K), (D, K)))
    original, rewritten = rewrite(bias_grad, dy, x, w)
    assert sums(original) == 1 and sums(rewritten) == 0
    assert any(n.target is aten.mm.default and n.args[0].target is aten.full.default
               for n in rewritten.graph.nodes)  # fmt: skip
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 0}
    for got, want in zip(rewritten(dy, x, w), original(dy, x, w), strict=True):
        torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("keepdim", [False, True])
def test_sums_over_every_leading_dim_keep_their_shape(keepdim):
    """A (B, L, D) operand summed over (0, 1), with and without keepdim."""
    g = torch.Generator().manual_seed(1)
    dy, w = torch.randn(6, 100, D, generator=g), torch.randn(D, K, generator=g)

    def fn(dy, w):
        return dy @ w, dy.sum((0, 1), keepdim=keepdim)

    original, rewritten = rewrite(fn, dy, w)
    assert sums(rewritten) == 0
    got, want = rewritten(dy, w)[1], original(dy, w)[1]
    assert got.shape == want.shape == ((1, 1, D) if keepdim else (D,))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "case",
    ["no matmul", "last dim", "narrow", "few rows", "transposed", "integer"],
)
def test_sums_the_pass_must_leave_alone(case):
    """Sums Inductor should keep: of a value no matmul reads (it would be materialised only
    for the GEMV), over the last dim, too narrow or too short to pay for a call, of a
    non-contiguous view, of integers."""
    g = torch.Generator().manual_seed(2)
    rows, cols = {"narrow": (R, MIN_COLUMNS - 1), "few rows": (MIN_ROWS - 1, D)}.get(case, (R, D))
    dy, w = torch.randn(rows, cols, generator=g), torch.randn(cols, K, generator=g)
    fn = {
        "no matmul": lambda dy, w: (dy * 2).sum(0),
        "last dim": lambda dy, w: (dy @ w, dy.sum(1)),
        "narrow": lambda dy, w: (dy @ w, dy.sum(0)),
        "few rows": lambda dy, w: (dy @ w, dy.sum(0)),
        "transposed": lambda dy, w: (dy.t() @ dy, dy.t().sum(0)),
        "integer": lambda dy, w: (dy @ w, dy.long().sum(0)),
    }[case]
    original, rewritten = rewrite(fn, dy, w)
    assert sums(rewritten) == sums(original) >= 1


def test_compiled_training_uses_the_pass_and_matches_eager_gradients(monkeypatch):
    """compiled(): the pass runs on the backward graph of a Linear stack and the gradients
    equal eager ones."""
    calls = []
    run = ColumnSumsAsGemv.__call__

    def spy(self, graph):
        calls.append(1)
        run(self, graph)

    monkeypatch.setattr(ColumnSumsAsGemv, "__call__", spy)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(K, D), nn.ReLU(), nn.Linear(D, D))
    twin = nn.Sequential(nn.Linear(K, D), nn.ReLU(), nn.Linear(D, D))
    twin.load_state_dict(net.state_dict())
    x = torch.randn(R, K)
    net(x).square().mean().backward()
    with torch._inductor.config.patch(fx_graph_cache=False):  # run the passes, not a cache hit
        rltrans.compiling.compiled(lambda x: twin(x).square().mean())(x).backward()
    assert calls, "the pass did not run"
    for p, q in zip(net.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6)
