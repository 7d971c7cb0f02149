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


# Code an env config may name without the user's say-so when it comes from a file (a
# checkpoint): gymnasium's and rltrans's own modules, ale-py's registrations and minigrid's
# (env=minigrid_memory names its ids and wrappers).
TRUSTED_ROOTS = ("gymnasium", "ale_py", "minigrid", "rltrans")
# Trusted modules' wrappers that write files or open windows.
SIDE_EFFECT_WRAPPERS = ("RecordVideo", "HumanRendering")


def _trusted(path: str) -> bool:
    return any(path == root or path.startswith(root + ".") for root in TRUSTED_ROOTS)


def untrusted_code(cfg: Mapping[str, Any]) -> list[str]:
    """The code building an env config would import or call beyond gymnasium, ale-py and
    rltrans (an ``env.id`` module prefix, ``env.wrappers`` paths), as ``key: path`` lines."""
    found = []
    env_id = str(cfg.get("id") or "")
    if ":" in env_id and not _trusted(env_id.split(":", 1)[0]):
        found.append(f"env.id: module {env_id.split(':', 1)[0]!r}")
    for i, entry in enumerate(cfg.get("wrappers") or []):
        path = str(entry.get("path", "")) if isinstance(entry, Mapping) else str(entry)
        if not _trusted(path) or path.rsplit(".", 1)[-1] in SIDE_EFFECT_WRAPPERS:
            found.append(f"env.wrappers[{i}].path: {path!r}")
    return found


def is_torch_env(envs: VectorEnv) -> bool:
    """True for torch-native envs (actions and observations stay tensors on the device)."""
    from rltrans.envs.torch_envs import TorchVectorEnv

    return isinstance(envs.unwrapped, TorchVectorEnv)
