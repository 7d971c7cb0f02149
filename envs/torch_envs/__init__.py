"""Torch-native batched environments: all state in tensors on one device, Gymnasium VectorEnv API.

    >>> from rltrans.envs.torch_envs import make_torch_env
    >>> env = make_torch_env("tmaze", num_envs=64, device="cpu", length=30)
    >>> obs, info = env.reset(seed=0)

All envs autoreset in SAME_STEP mode and return torch tensors; see `base.py` for the
info layout (`final_obs`, `episode`, per-episode keys, each with a `_key` mask).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from rltrans.envs.torch_envs.autoencode import Autoencode
from rltrans.envs.torch_envs.base import TorchVectorEnv
from rltrans.envs.torch_envs.count_recall import CountRecall
from rltrans.envs.torch_envs.passive_tmaze import PassiveTMaze
from rltrans.envs.torch_envs.repeat_first import RepeatFirst
from rltrans.envs.torch_envs.repeat_previous import RepeatPrevious
from rltrans.envs.torch_envs.stateless_cartpole import StatelessCartPole
from rltrans.envs.torch_envs.tmaze import TMaze

__all__ = [
    "TORCH_ENVS",
    "Autoencode",
    "CountRecall",
    "PassiveTMaze",
    "RepeatFirst",
    "RepeatPrevious",
    "StatelessCartPole",
    "TMaze",
    "TorchVectorEnv",
    "env_kwargs",
    "make_torch_env",
]

TORCH_ENVS: dict[str, type[TorchVectorEnv]] = {
    "tmaze": TMaze,
    "repeat_previous": RepeatPrevious,
    "stateless_cartpole": StatelessCartPole,
    # Memory tasks, one kind of memory each, with a length knob (`length`; `k` for
    # repeat_previous) and, where POPGym has the task, its presets (`popgym_presets`).
    "repeat_first": RepeatFirst,  # latch: hold the first symbol
    "count_recall": CountRecall,  # aggregate: counts over the episode
    "autoencode": Autoencode,  # sequence: play a sequence back reversed
    "passive_tmaze": PassiveTMaze,  # one cue over a corridor walked for the agent
}


def env_kwargs(name: str) -> list[str]:
    """Keyword arguments that `make_torch_env(name, ...)` accepts besides num_envs and device."""
    cls = _lookup(name)
    params = inspect.signature(cls.__init__).parameters
    return [p for p in params if p not in ("self", "num_envs", "device")]


def _lookup(name: str) -> type[TorchVectorEnv]:
    """The env class registered under `name`, or a ValueError listing the valid names."""
    if name not in TORCH_ENVS:
        raise ValueError(f"unknown torch env {name!r}; valid names: {sorted(TORCH_ENVS)}")
    return TORCH_ENVS[name]


def make_torch_env(
    name: str, num_envs: int, device: str | torch.device = "cpu", **kwargs: Any
) -> TorchVectorEnv:
    """Build the torch-native vector env `name` with `num_envs` envs on `device`.

    Example:
        >>> env = make_torch_env("repeat_previous", num_envs=8, k=2)

    Raises:
        ValueError: unknown `name` (the message lists the valid names).
        TypeError: a keyword the env does not take (the message lists the valid ones).
    """
    cls = _lookup(name)
    valid = env_kwargs(name)
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise TypeError(
            f"unknown keyword argument(s) {unknown} for torch env {name!r}; valid: {valid}"
        )
    return cls(num_envs=num_envs, device=device, **kwargs)
