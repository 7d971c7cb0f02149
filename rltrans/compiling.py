"""One place that decides how rltrans calls ``torch.compile`` (``compile=true``).

Inductor's C++ wrapper (``cpp_wrapper``) launches the compiled kernels from generated C++
instead of generated Python: for PPO's small tensors the per-kernel Python overhead is a
large share of a step. Measured with ``benchmarks/throughput.py``'s PPO setup (trxl, 4 x 64,
rows interleaved, one run): 2,693 SPS with the C++ wrapper against 2,165 with the default
one; it compiles longer (C++ for the wrapper too). Shapes are static (``dynamic=False``):
rollouts and minibatches keep theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

OPTIONS: dict[str, Any] = {"cpp_wrapper": True}


def compiled(fn: Callable, *, fullgraph: bool = False) -> Callable:
    """``torch.compile(fn)`` with rltrans' options: static shapes, the C++ wrapper."""
    return torch.compile(fn, fullgraph=fullgraph, dynamic=False, options=OPTIONS)
