"""One place that decides how rltrans compiles (``compile=true``).

Two tools, for two kinds of work:

* :func:`compiled` — ``torch.compile`` with Inductor's C++ wrapper, for work that needs
  autograd (the PPO minibatch loss, forward and backward). The C++ wrapper launches the
  compiled kernels from generated C++ instead of generated Python: for PPO's small tensors
  the per-kernel Python overhead is a large share of a step. Measured with
  the PPO setup of ``benchmarks/speed.py --vary agent`` (trxl, 4 x 64, rows interleaved, one
  run): 2,693 SPS with the C++ wrapper against 2,165 with the default one. Shapes are static
  (``dynamic=False``): rollouts and minibatches keep theirs.
* :class:`AheadOfTime` — ``torch.export`` + AOTInductor, for an inference function called
  once per environment step (the acting step). A ``torch.compile``d function still pays
  Dynamo's guard evaluation (~1,000 guards, ~0.23 ms per call for a 3-layer GTrXL step) and
  its Python wrappers on every call; an AOTInductor runner is one C++ call. Measured on the
  3 x 128 GTrXL acting step (16 envs, M=64, rounds interleaved): 0.73x the time of the
  ``torch.compile``d step. The module's parameters and buffers are inputs of the compiled
  program, fetched at every call, so optimiser updates and ``load_state_dict`` need no
  recompilation; so are the per-step contexts derived from the weights (xl's W_kR R), which
  the acting state carries (rebuilt by ``refresh_state``), never constants of the program.
  Compiled programs are kept in Inductor's cache folder (``rltrans-aoti/`` under
  ``TORCHINDUCTOR_CACHE_DIR``, default ``/tmp/torchinductor_<user>``), keyed by the exported
  graph (every op, shape, dtype and literal), torch's version and the CPU's instruction set,
  so a later run with the same model skips the ~15-30 s of C++ compilation.
"""

from __future__ import annotations

import functools
import getpass
import hashlib
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rltrans.accel.static import static_modules, static_paths

# Inductor options of every compiled program (public ``torch.compile`` options).
# fallback_random: random ops run as aten's, so a compiled step draws the same dropout masks
# as an eager one from the same seed (Inductor's own per-element generator was also ~1.6x
# slower for dropout on CPU). Kernels keep the thread count of compile time
# (torch.get_num_threads()): reading it at each call (cpp.dynamic_threads) made a small
# model's compiled PPO update 1.34x slower on one thread, so programs are keyed by it.
KERNEL_OPTIONS: dict[str, Any] = {"fallback_random": True}
OPTIONS: dict[str, Any] = {"cpp_wrapper": True, **KERNEL_OPTIONS}
# AOTInductor packages (torch._inductor.aoti_compile_and_package / aoti_load_package, the
# documented entry points) came with torch 2.6; before that the acting step uses
# torch.compile. (A version test, not hasattr: touching torch._inductor imports the compiler
# stack, ~70 MB resident and ~1.5 s, which an eager run never needs.)
AOTI = torch.torch_version.TorchVersion(torch.__version__) >= (2, 6)


def compiled(
    fn: Callable, *, fullgraph: bool = False, device: Any = "cpu", owner: nn.Module | None = None
) -> Callable:
    """``torch.compile(fn)`` with rltrans' options: static shapes, torch's own random ops and,
    for a program on the CPU, the C++ wrapper. ``owner`` (default: the module ``fn`` is a
    method of) takes its static paths while the program runs (:mod:`rltrans.accel.static`)."""
    # The C++ wrapper saves the Python wrapper's per-call overhead, which on CPU is paid on
    # the critical path. On CUDA, kernel launches are asynchronous and hide it, and the C++
    # wrapper failed to build a backward graph on torch 2.11 ("CudaKernelParamCache not
    # populated"), so CUDA programs keep the Python wrapper.
    options = dict(OPTIONS) if torch.device(device).type == "cpu" else dict(KERNEL_OPTIONS)
    program = torch.compile(fn, fullgraph=fullgraph, dynamic=False, options=options)
    owner = owner if owner is not None else getattr(fn, "__self__", None)
    modules = static_modules(owner) if isinstance(owner, nn.Module) else []
    if not modules:
        return program

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with static_paths(modules):
            return program(*args, **kwargs)

    return run


_NOTICES: set[str] = set()  # one-line notices already given in this process


def _report(line: str) -> None:
    """A one-line notice on stderr, once per job (under torchrun, learner process 0's)."""
    if os.environ.get("RANK", "0") == "0":
        print(line, file=sys.stderr, flush=True)


class _Flat(nn.Module):
    """``fn`` as a function of one flat tuple of tensors, for export: the owner's parameters
    and buffers first (by name), then the tensor leaves of the call's arguments; the
    arguments' structure and non-tensor leaves are fixed (part of the program's key).

    The owner is held outside the module tree, so the exported program lifts no parameters
    of its own (AOTInductor would bake a copy of the weights into the binary).
    """

    def __init__(self, call: _Call, names: list[str], spec: Any) -> None:
        super().__init__()
        self.call, self.names, self.spec = [call], names, spec  # a list hides it from nn.Module

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``fn(*args)`` with the owner's state taken from ``tensors``; outputs flattened."""
        state = dict(zip(self.names, tensors[: len(self.names)], strict=True))
        args = _unflatten(self.spec, iter(tensors[len(self.names) :]))
        out = torch.func.functional_call(self.call[0], state, args)
        leaves: list[torch.Tensor] = []
        _flatten(out, leaves)
        return tuple(leaves)


class _Call(nn.Module):
    """``fn`` as the forward of a module holding ``owner`` (what functional_call needs)."""

    def __init__(self, fn: Callable, owner: nn.Module) -> None:
        super().__init__()
        self.fn, self.owner = fn, owner

    def forward(self, *args: Any) -> Any:
        """``fn(*args)``."""
        return self.fn(*args)


class AheadOfTime:
    """``fn``, a pure function of tensors using ``owner``'s parameters and buffers, compiled
    ahead of time (``torch.export`` + AOTInductor) for each new input signature it meets
    (structure, shapes, dtypes, devices, non-tensor arguments). Off the CPU, on a torch
    before 2.6, or where AOTInductor fails, it uses :func:`compiled` (said once on stderr).

    The parameters and buffers are inputs of the compiled program, read at every call, so
    optimiser updates and ``load_state_dict`` need no recompilation. Compiled packages are
    cached on disk (``rltrans-aoti/`` in Inductor's cache folder), keyed by the exported
    graph, torch's version and the CPU, so a later run of the same model skips the ~15-30 s
    of C++ compilation.

    >>> lin = nn.Linear(3, 2)
    >>> fast = AheadOfTime(lambda x: lin(x).relu(), lin)
    >>> fast(torch.zeros(4, 3)).shape  # compiles at this first call  # doctest: +SKIP
    torch.Size([4, 2])
    """

    def __init__(self, fn: Callable, owner: nn.Module) -> None:
        self.fn, self.owner = fn, owner
        self.runners: dict[tuple, Callable[[list[torch.Tensor]], Any]] = {}

    def __call__(self, *args: Any) -> Any:
        """``fn(*args)`` through the runner compiled for this signature (compiled if new)."""
        leaves: list[torch.Tensor] = []
        spec = _flatten(args, leaves)
        key = (spec, torch.get_num_threads(), *((t.shape, t.dtype, t.device) for t in leaves))
        runner = self.runners.get(key)
        if runner is None:
            runner = self.runners[key] = self._compile(args, spec, leaves)
        return runner(args, leaves)

    def _compile(self, args: tuple, spec: Any, leaves: list[torch.Tensor]) -> Callable:
        """A runner ``(args, leaves) -> fn(*args)`` for this signature."""
        on_cpu = all(t.device.type == "cpu" for t in leaves)
        if on_cpu and not AOTI and not _NOTICES:
            _NOTICES.add("aoti")
            _report(f"compile: torch {torch.__version__} has no AOTInductor packages (2.6+); "
                    f"the acting step uses torch.compile")  # fmt: skip
        if on_cpu and AOTI:
            try:
                return self._ahead_of_time(args, spec, leaves)
            except Exception as err:
                first = str(err).strip().splitlines()[0] if str(err).strip() else ""
                _report(f"compile: AOTInductor failed ({type(err).__name__}: {first[:200]}); "
                        f"the acting step uses torch.compile")  # fmt: skip
        device = "cpu" if on_cpu else "cuda"
        fn = compiled(self.fn, fullgraph=True, device=device, owner=self.owner)
        return lambda args, leaves: fn(*args)

    def _ahead_of_time(self, args: tuple, spec: Any, leaves: list[torch.Tensor]) -> Callable:
        """Export ``fn`` for this signature and load (or compile and cache) its package."""
        # The output's structure, from one eager call that leaves torch's generator as it was.
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            out_spec = _flatten(self.fn(*args), [])
        call = _Call(self.fn, self.owner)
        slots = _state_slots(call)
        names = [name for name, _, _ in slots]
        flat = _Flat(call, names, spec)
        state = [table[leaf] for _, table, leaf in slots]
        with static_paths(static_modules(self.owner)):
            program = torch.export.export(flat, (*state, *leaves), strict=False)
        package = _package_path(program)
        loaded = _load(package)
        if loaded is None:  # not cached (or unreadable): compile, then publish atomically
            package.parent.mkdir(parents=True, exist_ok=True)
            scratch = package.with_name(f".{package.stem}.{os.getpid()}.pt2")
            torch._inductor.aoti_compile_and_package(
                program, package_path=str(scratch), inductor_configs=dict(KERNEL_OPTIONS)
            )
            os.replace(scratch, package)
            loaded = _open(package)

        def runner(args: tuple, leaves: list[torch.Tensor]) -> Any:
            # Parameters and buffers now, read from the modules' own tables (an optimiser step
            # or a reassigned buffer shows; ``getattr`` on modules cost ~0.15 ms per call).
            inputs = [table[leaf] for _, table, leaf in slots]
            return _unflatten(out_spec, iter(loaded(*inputs, *leaves)))

        return runner


# ------------------------------------------------------------------ structure of arguments
# A call's arguments as a hashable structure (tuples, lists, dicts, named tuples) with its
# tensors taken out in order, and back; non-tensor leaves stay in the structure, so a program
# is specialised to their values.
_TENSOR = "<tensor>"


def _flatten(obj: Any, leaves: list[torch.Tensor]) -> Any:
    """The structure of ``obj`` (hashable), appending its tensors to ``leaves``."""
    if isinstance(obj, torch.Tensor):
        leaves.append(obj)
        return _TENSOR
    if isinstance(obj, tuple | list):
        return (type(obj), tuple(_flatten(x, leaves) for x in obj))
    if isinstance(obj, dict):
        return (dict, tuple((k, _flatten(obj[k], leaves)) for k in obj))
    return obj


def _unflatten(spec: Any, leaves: Any) -> Any:
    """``obj`` again from its structure and an iterator over its tensors."""
    if isinstance(spec, str) and spec == _TENSOR:
        return next(leaves)
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], type):
        kind, kids = spec
        if kind is dict:
            return {k: _unflatten(v, leaves) for k, v in kids}
        items = [_unflatten(x, leaves) for x in kids]
        if kind is list:
            return items
        return kind(*items) if hasattr(kind, "_fields") else kind(items)  # named tuples
    return spec


def _load(package: Path) -> Any:
    """The cached compiled package, or None when there is none or it cannot be loaded."""
    if not package.exists():
        return None
    try:
        return _open(package)
    except (RuntimeError, OSError, ValueError):  # truncated or foreign: compile anew
        return None


def _open(package: Path) -> Any:
    """Load a compiled package (one acting thread: no locking between runner threads)."""
    try:
        return torch._inductor.aoti_load_package(str(package), run_single_threaded=True)
    except TypeError:  # torch before run_single_threaded
        return torch._inductor.aoti_load_package(str(package))


def cache_dir() -> Path:
    """Inductor's cache folder: ``TORCHINDUCTOR_CACHE_DIR``, else ``torchinductor_<user>`` in
    the temporary folder (Inductor's own default)."""
    given = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if given:
        return Path(given)
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (some containers)
        user = str(os.getuid())
    return Path(tempfile.gettempdir()) / f"torchinductor_{user}"


def _package_path(program: torch.export.ExportedProgram) -> Path:
    """Where the compiled package of ``program`` is cached: a hash of everything the binary
    depends on (the graph printed with every node's shape and dtype, its tensor constants,
    torch's version, the CPU's instruction set, rltrans' compile options and the thread count
    its kernels are built for)."""
    digest = hashlib.sha256()
    graph = program.graph_module.print_readable(print_output=False, include_stride=True)
    signature = f"{program.graph_signature}{program.call_spec}"
    options = f"{sorted(KERNEL_OPTIONS.items())} threads={torch.get_num_threads()}"
    for part in (graph, signature, torch.__version__, platform.machine(), options):
        digest.update(part.encode())
    digest.update(torch.backends.cpu.get_cpu_capability().encode())
    for name, value in sorted(program.constants.items()):
        digest.update(name.encode())
        if isinstance(value, torch.Tensor):
            digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    return cache_dir() / "rltrans-aoti" / f"{digest.hexdigest()[:32]}.pt2"


def _state_slots(module: nn.Module) -> list[tuple[str, dict[str, Any], str]]:
    """(qualified name, the owning submodule's parameter or buffer table, key) of every
    parameter, then every buffer, in ``named_parameters`` / ``named_buffers`` order. The
    tables are the modules' live dicts, so reading them later sees reassignments."""
    owners = dict(module.named_modules(remove_duplicate=False))
    slots = []
    for kind, named in (
        ("_parameters", module.named_parameters),
        ("_buffers", module.named_buffers),
    ):
        for name, _ in named():
            path, _, leaf = name.rpartition(".")
            slots.append((name, getattr(owners[path], kind), leaf))
    return slots
