"""The mask-saving pass: dropout masks are saved, not copied and not recomputed in backward."""

from functools import partial

import torch
import torch.nn.functional as F
from functorch.compile import aot_function, make_boxed_func, min_cut_rematerialization_partition
from torch import nn

import rltrans.compiling
from rltrans.core.dropout import Dropout, draw_seeds, hash_keep, saved_mask
from rltrans.saved_masks import SaveDropoutMasks

aten = torch.ops.aten
B, T, D, P = 4, 30, 64, 0.1  # a (B, T, D) activation, dropout p


def dropped_norm(x: torch.Tensor, w: torch.Tensor, seeds: torch.Tensor, *, copy: bool):
    """LayerNorm(x @ w * keep).sum(), keep as compiled dropout makes it (``copy``: through the
    opaque ``saved_mask`` copy; else the bare hash)."""
    keep = hash_keep(x.shape[:-1] + w.shape[-1:], seeds, P)  # a view of a flat hash
    if copy:
        keep = saved_mask(keep)
    return F.layer_norm(x @ w * keep, (D,)).sum()


def partitioned(fn, *args, joint_pass=None):
    """(forward graph, backward graph, output, input gradients) of ``fn`` split by Inductor's
    partitioner, ``joint_pass`` run on the joint graph first."""
    graphs = {}

    def keep(name):
        def compiler(gm, _inputs):
            graphs[name] = gm
            return make_boxed_func(gm.forward)

        return compiler

    def partition(joint, inputs, **kwargs):
        if joint_pass is not None:
            joint_pass(joint.graph)
            joint.recompile()
        return min_cut_rematerialization_partition(joint, inputs, compiler="inductor", **kwargs)

    run = aot_function(fn, fw_compiler=keep("fw"), bw_compiler=keep("bw"), partition_fn=partition)
    out = run(*args)
    leaves = [a for a in args if a.requires_grad]
    grads = torch.autograd.grad(out, leaves)
    return graphs["fw"], graphs["bw"], out, grads


def targets(gm: torch.fx.GraphModule) -> set:
    """The ops a graph calls."""
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


def inputs():
    """x, w (both requiring gradients) and one dropout call's seeds."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, D, generator=g, requires_grad=True)
    w = torch.randn(D, D, generator=g, requires_grad=True)
    return x, w, torch.tensor([123456789, -987654321], dtype=torch.int32)


def test_the_mask_is_saved_once_without_the_copy_and_gives_the_same_results():
    """With the pass the forward has no copy and the backward no hash (it reads the saved
    mask); output and gradients are those of the graph with the copy, bit for bit."""
    x, w, seeds = inputs()
    copied = partial(dropped_norm, copy=True)
    fw, bw, out, grads = partitioned(copied, x, w, seeds, joint_pass=SaveDropoutMasks())
    _, _, want_out, want_grads = partitioned(copied, x, w, seeds)
    assert saved_mask._opoverload not in targets(fw) | targets(bw)
    assert aten.bitwise_xor.Tensor in targets(fw)  # the hash runs in the forward ...
    assert not targets(bw) & {aten.bitwise_xor.Tensor, aten.arange.start_step}  # ... only
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    torch.testing.assert_close(grads, want_grads, rtol=0, atol=0)


def test_an_untagged_mask_is_recomputed_in_backward():
    """The control that makes the test above meaningful: a bare hash mask (no copy, no tag)
    is recomputed by the backward graph, hash and all."""
    x, w, seeds = inputs()
    _, bw, _, _ = partitioned(partial(dropped_norm, copy=False), x, w, seeds)
    assert aten.bitwise_xor.Tensor in targets(bw)


def test_compiled_training_uses_the_pass_and_keeps_the_hash_masks(monkeypatch):
    """compiled(): the pass runs on the joint graph of a model with dropout, and outputs and
    gradients are those of the eager reference masks (hash_keep of the same seeds)."""
    calls = []
    run = SaveDropoutMasks.__call__

    def spy(self, graph):
        calls.append(sum(n.target is saved_mask._opoverload for n in graph.nodes))
        run(self, graph)

    monkeypatch.setattr(SaveDropoutMasks, "__call__", spy)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(D, D), Dropout(P), nn.LayerNorm(D), Dropout(P))
    x = torch.randn(B, T, D)
    with torch._inductor.config.patch(fx_graph_cache=False):  # run the passes, not a cache hit
        torch.manual_seed(7)
        rltrans.compiling.compiled(lambda x: net(x).square().mean())(x).backward()
    assert calls == [2], "the pass did not see the two dropout masks"
    got = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    torch.manual_seed(7)
    keep1 = hash_keep((B, T, D), draw_seeds(), P)
    keep2 = hash_keep((B, T, D), draw_seeds(), P)
    linear, norm = net[0], net[2]
    (norm(linear(x) * keep1) * keep2).square().mean().backward()
    for g, p in zip(got, net.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6)
