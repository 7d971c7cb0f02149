"""The static path of a model, switched on from outside while a compiled program is traced.

A model may take shortcuts that depend on the data (skip the per-step loop of a recurrent
segment without episode starts, read only the part of its window an adaptive span reaches)
or on Python-side caches (a table kept in an ``lru_cache``). A compiled graph can do neither:
it cannot branch on a tensor's value, and it must compute what a cache would hand back. A
module that has such shortcuts declares a class attribute ``static_graph = False`` and takes
its static path where it is True. The models never ask whether they are being compiled;
:func:`static_paths` sets the flag on every such module of an owner while
:mod:`rltrans.accel` traces or runs its compiled programs, and clears it after, so eager
calls keep their shortcuts.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from torch import nn

_LOCK = threading.Lock()
_DEPTH: dict[int, int] = {}  # id(module) -> compiled calls under way (threads may overlap)


def static_modules(owner: nn.Module) -> list[nn.Module]:
    """The modules of ``owner`` (itself included) that offer a static path."""
    return [m for m in owner.modules() if hasattr(type(m), "static_graph")]


@contextlib.contextmanager
def static_paths(modules: list[nn.Module]) -> Iterator[None]:
    """``static_graph`` True on ``modules`` inside (nested and concurrent uses count up)."""
    with _LOCK:
        for m in modules:
            _DEPTH[id(m)] = _DEPTH.get(id(m), 0) + 1
            m.static_graph = True
    try:
        yield
    finally:
        with _LOCK:
            for m in modules:
                _DEPTH[id(m)] -= 1
                if not _DEPTH[id(m)]:
                    del _DEPTH[id(m)]
                    del m.static_graph  # the class's False again


__all__ = ["static_modules", "static_paths"]
