"""One place that decides how rltrans compiles (``compile=true``).

Two tools, for two kinds of work:

* :func:`compiled` — ``torch.compile`` with Inductor's C++ wrapper, for work that needs
  autograd (the PPO minibatch loss, forward and backward). The C++ wrapper launches the
  compiled kernels from generated C++ instead of generated Python: for PPO's small tensors
  the per-kernel Python overhead is a large share of a step. Measured with
  ``benchmarks/throughput.py``'s PPO setup (trxl, 4 x 64, rows interleaved, one run): 2,693
  SPS with the C++ wrapper against 2,165 with the default one. Shapes are static
  (``dynamic=False``): rollouts and minibatches keep theirs.
* :class:`AheadOfTime` — ``torch.export`` + AOTInductor, for an inference function called
  once per environment step (the acting step). A ``torch.compile``d function still pays
  Dynamo's guard evaluation (~1,000 guards, ~0.23 ms per call for a 3-layer GTrXL step) and
  its Python wrappers on every call; an AOTInductor runner is one C++ call. Measured on the
  3 x 128 GTrXL acting step (16 envs, M=64, rounds interleaved): 0.73x the time of the
  ``torch.compile``d step. The module's parameters and buffers are inputs of the compiled
  program, fetched at every call, so optimiser updates and ``load_state_dict`` need no
  recompilation.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

OPTIONS: dict[str, Any] = {"cpp_wrapper": True}


def compiled(fn: Callable, *, fullgraph: bool = False) -> Callable:
    """``torch.compile(fn)`` with rltrans' options: static shapes, the C++ wrapper."""
    return torch.compile(fn, fullgraph=fullgraph, dynamic=False, options=OPTIONS)


class _Bound(nn.Module):
    """``fn`` as the forward of a module that holds ``owner`` (what functional_call needs)."""

    def __init__(self, fn: Callable, owner: nn.Module) -> None:
        super().__init__()
        self.fn, self.owner = fn, owner

    def forward(self, *args: Any) -> Any:
        """``fn(*args)``."""
        return self.fn(*args)


class _StateAsInput(nn.Module):
    """``fn`` with the owner's parameters and buffers as its first argument (for export).

    The bound module is held outside the module tree, so the exported program lifts no
    parameters of its own (AOTInductor would bake a copy of the weights into the binary).
    """

    def __init__(self, bound: _Bound) -> None:
        super().__init__()
        self.bound = [bound]  # a list hides it from nn.Module

    def forward(self, state: dict[str, torch.Tensor], *args: Any) -> Any:
        """``fn(*args)`` with the owner's parameters and buffers taken from ``state``."""
        return torch.func.functional_call(self.bound[0], state, args)


class AheadOfTime:
    """``fn``, a pure function of tensors using ``owner``'s parameters and buffers, compiled
    ahead of time (``torch.export`` + AOTInductor) for each new input signature it meets
    (shapes, dtypes, devices, non-tensor arguments). Off the CPU it uses :func:`compiled`.

    >>> lin = nn.Linear(3, 2)
    >>> fast = AheadOfTime(lambda x: lin(x).relu(), lin)
    >>> fast(torch.zeros(4, 3)).shape  # compiles at this first call  # doctest: +SKIP
    torch.Size([4, 2])
    """

    def __init__(self, fn: Callable, owner: nn.Module) -> None:
        self.bound = _Bound(fn, owner)
        self.runners: dict[tuple, Callable[[tuple, list[Any]], Any]] = {}

    def __call__(self, *args: Any) -> Any:
        """``fn(*args)`` through the runner compiled for this signature (compiled if new)."""
        leaves, spec = pytree.tree_flatten(args)
        key = (spec, *(_signature(leaf) for leaf in leaves))
        runner = self.runners.get(key)
        if runner is None:
            runner = self.runners[key] = self._compile(args)
        return runner(args, leaves)

    def _compile(self, args: tuple) -> Callable[[tuple, list[Any]], Any]:
        """A runner ``(args, leaves) -> fn(*args)`` for the signature of ``args``."""
        leaves = pytree.tree_leaves(args)
        if any(isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in leaves):
            fn = compiled(self.bound.fn, fullgraph=True)
            return lambda args, leaves: fn(*args)
        slots = _state_slots(self.bound)
        state = {name: getattr(module, leaf) for name, module, leaf in slots}
        program = torch.export.export(_StateAsInput(self.bound), (state, *args), strict=False)
        folder = tempfile.mkdtemp(prefix="rltrans-aoti-")
        try:  # the loader has extracted and loaded the library: the package can go
            package = torch._inductor.aoti_compile_and_package(
                program, package_path=f"{folder}/step.pt2"
            )
            loaded = torch._inductor.aoti_load_package(package, run_single_threaded=True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        out_spec = pytree.treespec_loads(loaded.loader.get_call_spec()[1])
        run = loaded.loader.boxed_run

        def runner(args: tuple, leaves: list[Any]) -> Any:
            # Parameters and buffers now (an optimiser step or a reassigned buffer shows).
            inputs = [getattr(module, leaf) for _, module, leaf in slots]
            inputs += [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
            return pytree.tree_unflatten(run(inputs), out_spec)

        return runner


def _state_slots(module: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(qualified name, owning submodule, attribute) of every parameter, then every buffer,
    in ``named_parameters`` / ``named_buffers`` order (the exported program's input order)."""
    owners = dict(module.named_modules(remove_duplicate=False))
    names = [n for n, _ in module.named_parameters()] + [n for n, _ in module.named_buffers()]
    slots = []
    for name in names:
        path, _, leaf = name.rpartition(".")
        slots.append((name, owners[path], leaf))
    return slots


def _signature(leaf: Any) -> Any:
    """What a compiled program is specialised to: a tensor's shape, dtype and device, or a
    non-tensor leaf's value."""
    if isinstance(leaf, torch.Tensor):
        return (tuple(leaf.shape), leaf.dtype, leaf.device)
    return leaf
