"""An Inductor graph pass: sums down the rows of a matmul operand become a GEMV.

Backward passes are full of column sums: a Linear's bias gradient is its output gradient
summed over every row (``dY.sum(0)``, ``(B*L, D) -> (D,)``). On CPU, Inductor lowers such a
sum to a loop that, for each group of 8 columns, walks every row with one vector
accumulator: a dependent chain of adds at a row stride of 4*D bytes. For the Decision
Transformer's (3776, 512) MLP gradient that loop took ~0.9 ms, against ~0.2 ms for the same
sum as ``ones(1, R) @ dY`` (one MKL GEMV call that streams the rows); measured one thread,
each in its own compiled graph.

The pass rewrites ``sum(x, dims=all but the last)`` into ``mm(ones(1, R), x.view(R, D))``
where that cannot cost a pass over memory that the graph would not make anyway: ``x`` is a
CPU float tensor, contiguous, at least :data:`MIN_ROWS` x :data:`MIN_COLUMNS`, and it is
already the output or an operand (maybe through a view) of a matmul, so it is materialised
(a bias gradient's ``dY`` always feeds the ``dX`` and ``dW`` GEMMs). Sums of values computed
on the fly (LayerNorm's weight gradient, ``sum(dY * x_hat)``) stay with Inductor, fused into
the kernel that computes them.

In the Decision Transformer's compiled training step (paper config, one thread) the pass
rewrites 19 sums and the step runs 1.015-1.017x faster (median per-step ratio over 60-100
interleaved steps, three runs). The PPO benchmark configs' minibatches (256 rows per
minibatch or per stream) stay below :data:`MIN_ROWS` and are untouched.

The result is the same sum in another order (MKL's), so it matches the rewritten graph to
float rounding, not bit for bit. It is imported only when something is compiled: it needs
``torch._inductor``, which an eager process never loads.
"""

from __future__ import annotations

import contextlib

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch.fx import Graph, Node

aten = torch.ops.aten

MIN_ROWS = 512  # shorter sums: a GEMV call saved nothing (256 x 64: 0.87x, 512 x 128: 1.2x)
MIN_COLUMNS = 128  # narrower: a few cache lines per row, where Inductor's loop is as fast
_MATMULS = (aten.mm.default, aten.addmm.default, aten.bmm.default)
VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)  # reshapes


def _feeds_or_is_a_matmul(x: Node) -> bool:
    """True when ``x`` is materialised anyway: a matmul's output, or (directly or through a
    view or a transpose) one of its operands."""
    base = x
    while base.op == "call_function" and base.target in VIEWS:
        base = base.args[0]
    if base.op == "call_function" and base.target in _MATMULS:
        return True
    views = [u for u in x.users if u.target in (*VIEWS, aten.permute.default, aten.t.default)]
    return any(u.target in _MATMULS for n in (x, *views) for u in n.users)


def _rows_and_columns(node: Node) -> tuple[Node, int, int] | None:
    """(x, R, D) when ``node`` sums a matmul output or operand over all but its last dim, as
    the pass should rewrite; else None."""
    if node.op != "call_function" or node.target is not aten.sum.dim_IntList:
        return None
    x, dims = node.args[0], node.args[1]
    value = x.meta.get("val") if isinstance(x, Node) else None
    if not isinstance(value, torch.Tensor) or dims is None:
        return None
    if value.device.type != "cpu" or value.dtype not in (torch.float32, torch.float64):
        return None
    if value.ndim < 2 or sorted(d % value.ndim for d in dims) != list(range(value.ndim - 1)):
        return None
    if not value.is_contiguous() or not _feeds_or_is_a_matmul(x):
        return None
    columns = int(value.shape[-1])
    rows = value.numel() // max(columns, 1)
    if rows < MIN_ROWS or columns < MIN_COLUMNS:
        return None
    return x, rows, columns


class ColumnSumsAsGemv(CustomGraphPass):
    """Post-grad pass: column sums of matmul operands -> ``ones(1, R) @ x`` (see module)."""

    def __call__(self, graph: Graph) -> None:
        """Rewrite every qualifying sum in ``graph`` in place."""
        for node in list(graph.nodes):
            found = _rows_and_columns(node)
            if found is None:
                continue
            x, rows, columns = found
            value = x.meta["val"]
            keepdim = node.kwargs.get("keepdim", node.args[2] if len(node.args) > 2 else False)
            shape = [1] * (value.ndim - 1) + [columns] if keepdim else [columns]
            with graph.inserting_before(node):
                ones = graph.call_function(
                    aten.full.default,
                    ([1, rows], 1.0),
                    {"dtype": value.dtype, "device": value.device, "pin_memory": False},
                )
                flat = graph.call_function(aten.view.default, (x, [rows, columns]))
                gemv = graph.call_function(aten.mm.default, (ones, flat))  # (1, D)
                out = graph.call_function(aten.view.default, (gemv, shape))
            # Inductor reads shapes and dtypes from meta["val"]: give every new node one.
            with getattr(value, "fake_mode", None) or contextlib.nullcontext():
                ones.meta["val"] = value.new_ones(1, rows)
                flat.meta["val"] = value.view(rows, columns)
                gemv.meta["val"] = ones.meta["val"] @ flat.meta["val"]
                out.meta["val"] = gemv.meta["val"].view(shape)
            node.replace_all_uses_with(out)
            graph.erase_node(node)

    def uuid(self) -> bytes:
        """Cache key of the pass: this file's contents (a change recompiles)."""
        return get_hash_for_files((__file__,))
