"""rltrans: transformer agents for reinforcement learning on one shared attention core."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"  # the one place: pyproject.toml reads it, CHANGELOG.md names it
__all__ = ["RunPlan", "__version__", "export", "learn", "load_policy", "plan"]

if TYPE_CHECKING:
    from rltrans.config.plan import RunPlan
    from rltrans.policy import Policy


def load_policy(path: Any, device: Any = "cpu", torch_threads: int | str | None = "auto") -> Policy:
    """Load a saved policy (checkpoint file or run dir); see :mod:`rltrans.policy`."""
    from rltrans.policy import load_policy as _load

    return _load(path, device, torch_threads)


# The API's layer sits above modules that import this package for its version, so it is
# imported by name on first use (a static import here would read as an upward import).
_API = "rltrans.api"


def plan(*overrides: str, **options: Any) -> RunPlan:
    """A run resolved once from the command line's names; see :func:`rltrans.api.plan`."""
    return importlib.import_module(_API).plan(*overrides, **options)


def learn(run: RunPlan, **callbacks: Any) -> dict[str, Any]:
    """Train a :func:`plan` (``on_log=``, ``on_eval=``); see :func:`rltrans.api.learn`."""
    return importlib.import_module(_API).learn(run, **callbacks)


def __getattr__(name: str) -> Any:
    if name == "RunPlan":  # imported on first use: ``import rltrans`` stays light
        return importlib.import_module("rltrans.config.plan").RunPlan
    if name == "export":  # the module rltrans.export, callable as its export(): see there
        return importlib.import_module("rltrans.export")
    raise AttributeError(f"module 'rltrans' has no attribute {name!r}")
