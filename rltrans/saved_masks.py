"""An Inductor graph pass: compiled dropout saves the mask its forward computed, with no copy.

Inside a compiled graph, :func:`rltrans.core.dropout.dropout` computes its keep mask from a
keyed integer hash and passes it through ``rltrans::saved_mask``, a copy that Inductor cannot
see through. The copy is there for the partitioner that splits the joint forward-backward
graph. A mask computed from two seed words and an element index costs nothing to keep alive,
so the partitioner would rather recompute it in backward. Then Inductor fuses the hash into
whichever kernel reads the mask, LayerNorm's included, and it runs once per pass of that
kernel over its row. An opaque op's output cannot be recomputed, so the mask is saved.

The copy costs a pass over the mask: ~3 ms of the Decision Transformer's ~180 ms training
step (paper config, one thread). This pass runs on the joint graph before the partitioner.
It removes each copy and tags the hash's result ``MUST_SAVE``, which the partitioner honours
(through views too). So the forward computes the mask once, in the kernel that uses it, and
writes it out for backward. Measured: the compiled DT step 1.020-1.023x faster (median
per-step ratios of 60 and 100 interleaved steps), with masks, outputs and gradients bit for
bit those of the copy.

It is imported only when something is compiled: it needs ``torch._inductor``, which an
eager process never loads.
"""

from __future__ import annotations

from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch.fx import Graph, Node
from torch.utils.checkpoint import CheckpointPolicy

from rltrans import column_sums
from rltrans.core.dropout import saved_mask


def _save(node: Node) -> None:
    """Tag ``node`` and the bases it is a view of as values the partitioner must save."""
    while True:
        node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
        if node.op != "call_function" or node.target not in column_sums.VIEWS:
            return
        node = node.args[0]


class SaveDropoutMasks(CustomGraphPass):
    """Joint-graph pass: ``rltrans::saved_mask(m)`` -> ``m``, tagged ``MUST_SAVE`` (see module)."""

    def __call__(self, graph: Graph) -> None:
        """Rewrite every mask copy in ``graph`` in place."""
        copy = saved_mask._opoverload
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not copy:
                continue
            mask = node.args[0]
            _save(mask)
            node.replace_all_uses_with(mask)
            graph.erase_node(node)

    def uuid(self) -> bytes:
        """Cache key of the pass: its files' contents (a change recompiles)."""
        return get_hash_for_files((__file__, column_sums.__file__))
