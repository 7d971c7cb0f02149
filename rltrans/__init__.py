"""rltrans: transformer agents for reinforcement learning on one shared attention core."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rltrans.version import __version__

__all__ = ["RunPlan", "__version__", "export", "learn", "load_policy", "plan"]

if TYPE_CHECKING:
    from rltrans.config.plan import RunPlan
    from rltrans.policy import Policy


def load_policy(path: Any, device: Any = "cpu", torch_threads: int | str | None = "auto") -> Policy:
    """Load a saved policy (checkpoint file or run dir); see :mod:`rltrans.policy`."""
    from rltrans.policy import load_policy as _load

    return _load(path, device, torch_threads)


def plan(*overrides: str, **options: Any) -> RunPlan:
    """A run resolved once from the command line's names; see :func:`rltrans.api.plan`."""
    from rltrans.api import plan as _plan

    return _plan(*overrides, **options)


def learn(run: RunPlan, **callbacks: Any) -> dict[str, Any]:
    """Train a :func:`plan` (``on_log=``, ``on_eval=``); see :func:`rltrans.api.learn`."""
    from rltrans.api import learn as _learn

    return _learn(run, **callbacks)


def __getattr__(name: str) -> Any:
    if name == "RunPlan":  # imported on first use: ``import rltrans`` stays light
        from rltrans.config.plan import RunPlan

        return RunPlan
    if name == "export":  # the module rltrans.export, callable as its export(): see there
        import rltrans.export as module

        return module
    raise AttributeError(f"module 'rltrans' has no attribute {name!r}")
