"""rltrans: transformer agents for reinforcement learning on one shared attention core."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"  # the one place: pyproject.toml reads it, CHANGELOG.md names it
__all__ = ["__version__", "load_policy"]

if TYPE_CHECKING:
    from rltrans.policy import Policy


def load_policy(path: Any, device: Any = "cpu", torch_threads: int | str | None = "auto") -> Policy:
    """Load a saved policy (checkpoint file or run dir); see :mod:`rltrans.policy`."""
    from rltrans.policy import load_policy as _load

    return _load(path, device, torch_threads)
