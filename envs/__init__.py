"""Environment construction from an env config (configs/env/*.yaml).

Two kinds, one API (Gymnasium 1.x VectorEnv with SAME_STEP autoreset):

* ``kind: torch`` -- torch-native batched envs (:mod:`rltrans.envs.torch_envs`), state in tensors
  on the training device;
* ``kind: gym`` -- any registered Gymnasium id (``module:EnvId`` too), Sync/Async
  vectorised, Atari preprocessing for ALE ids (:mod:`rltrans.envs.gym_vec`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from gymnasium.vector import VectorEnv


def _make_torch(cfg: Mapping[str, Any], seed: int, device, training: bool) -> VectorEnv:
    from rltrans.envs.torch_envs import make_torch_env

    return make_torch_env(cfg["name"], cfg["num_envs"], device=device, **(cfg.get("kwargs") or {}))


def _make_gym(cfg: Mapping[str, Any], seed: int, device, training: bool) -> VectorEnv:
    from rltrans.envs.gym_vec import make_vector_env

    return make_vector_env(
        cfg["id"],
        cfg["num_envs"],
        vectorization=cfg.get("vectorization", "sync"),
        wrappers=list(cfg.get("wrappers") or []),
        seed=seed,
        atari=cfg.get("atari", "auto"),
        training=training,
        env_kwargs=dict(cfg.get("kwargs") or {}),
    )


ENV_KINDS: dict[str, Callable[..., VectorEnv]] = {"torch": _make_torch, "gym": _make_gym}


def make_env(
    cfg: Mapping[str, Any], *, seed: int, device: torch.device | str = "cpu", training: bool = True
) -> VectorEnv:
    """Build the vector env an env config describes (``training=False`` for evaluation)."""
    kind = cfg.get("kind")
    if kind not in ENV_KINDS:
        raise ValueError(f"unknown env kind {kind!r}; valid kinds: {', '.join(ENV_KINDS)}")
    return ENV_KINDS[kind](cfg, seed, device, training)


def is_torch_env(envs: VectorEnv) -> bool:
    """True for torch-native envs (actions and observations stay tensors on the device)."""
    from rltrans.envs.torch_envs import TorchVectorEnv

    return isinstance(envs.unwrapped, TorchVectorEnv)
