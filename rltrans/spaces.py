"""Batched observations -> torch tensors, and the check of which observation spaces can be encoded.

Leaves the library encodes: ``Box``, ``Discrete``, ``MultiDiscrete``, ``MultiBinary``; containers
``Dict`` and ``Tuple`` of those (nested). Anything else (``Text``, ``Graph``, ``Sequence``,
``OneOf``, custom spaces such as MiniGrid's ``MissionSpace``) has no fixed-size tensor form; the
error says which part of the observation it is and which wrapper would drop or convert it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

ENCODABLE_LEAVES: tuple[type[spaces.Space], ...] = (
    spaces.Box,
    spaces.Discrete,
    spaces.MultiDiscrete,
    spaces.MultiBinary,
)

TensorTree = torch.Tensor | dict[str, "TensorTree"] | tuple["TensorTree", ...]


class UnsupportedSpaceError(ValueError):
    """An observation (sub-)space has no tensor encoding; the message names its key path."""


def _key_path(path: tuple[str | int, ...]) -> str:
    """``("a", 0)`` -> ``obs["a"][0]``."""
    return "obs" + "".join(f'["{k}"]' if isinstance(k, str) else f"[{k}]" for k in path)


def _unsupported_message(
    space: spaces.Space, path: tuple[str | int, ...], root: spaces.Space
) -> str:
    where, kind = _key_path(path), type(space).__name__
    lead = f"observation {where} has space {kind}, which has no fixed-size tensor encoding"
    supported = ", ".join(c.__name__ for c in ENCODABLE_LEAVES) + " (inside Dict/Tuple)"
    if len(path) == 1 and isinstance(root, spaces.Dict | spaces.Tuple):
        # A top-level key: gymnasium's FilterObservation keeps only the listed keys (or indices).
        keep = [
            k
            for k, sub in (
                root.spaces.items() if isinstance(root, spaces.Dict) else enumerate(root)
            )
            if k != path[0] and find_unsupported(sub) is None
        ]
        fix = (
            "drop it with gymnasium.wrappers.FilterObservation, e.g. in the env config: "
            "wrappers: [{path: gymnasium.wrappers.FilterObservation, "
            f"kwargs: {{filter_keys: {keep}}}}}]"
        )
    else:
        fix = (
            "convert or drop it with gymnasium.wrappers.TransformObservation (it takes a Python "
            "function: put a small wrapper in a module and add it to the env config's "
            "wrappers: [{path: your_module.YourWrapper}])"
        )
    return f"{lead}; encodable spaces: {supported}. To use this env, {fix}."


def find_unsupported(
    space: spaces.Space, path: tuple[str | int, ...] = ()
) -> tuple[tuple[str | int, ...], spaces.Space] | None:
    """Returns (key path, space) of the first sub-space that cannot be encoded, else None."""
    if isinstance(space, ENCODABLE_LEAVES):
        return None
    if isinstance(space, spaces.Dict):
        children: Any = space.spaces.items()
    elif isinstance(space, spaces.Tuple):
        children = enumerate(space.spaces)
    else:
        return path, space
    for key, sub in children:
        found = find_unsupported(sub, (*path, key))
        if found is not None:
            return found
    return None


def check_encodable(space: spaces.Space) -> None:
    """Raises :class:`UnsupportedSpaceError` naming the first sub-space that cannot be encoded."""
    found = find_unsupported(space)
    if found is not None:
        path, sub = found
        raise UnsupportedSpaceError(_unsupported_message(sub, path, space))


def _leaf_to_tensor(x: Any, device: torch.device | str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        t = x
    else:
        arr = np.asarray(x)
        # float64 (MuJoCo, many Box envs) halves to float32 on the host, before any transfer.
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        t = torch.from_numpy(np.ascontiguousarray(arr))
    if t.dtype == torch.float64:
        t = t.float()
    # uint8 images stay uint8 until the encoder (4x less to move than float32). Blocking copy:
    # non_blocking device->host copies may be read before they land.
    return t.to(device)


def obs_to_tensor(obs: Any, space: spaces.Space, device: torch.device | str = "cpu") -> TensorTree:
    """Converts a batched observation (numpy or torch, dims (N, ...)) to tensors on ``device``.

    ``space`` is the *single-env* observation space (``envs.single_observation_space``); it gives
    the Dict/Tuple structure. Dict -> dict of tensors, Tuple -> tuple, leaves -> tensors with
    float64 cast to float32 and every other dtype (uint8 images, int64 indices) kept.

    Example::

        obs, _ = envs.reset()
        x = obs_to_tensor(obs, envs.single_observation_space, "cuda")
    """
    check_encodable(space)
    return _to_tensor_tree(obs, space, device)


def _to_tensor_tree(obs: Any, space: spaces.Space, device: torch.device | str) -> TensorTree:
    if isinstance(space, spaces.Dict):
        if not isinstance(obs, Mapping):
            raise TypeError(f"a Dict observation space needs a mapping, got {type(obs).__name__}")
        return {k: _to_tensor_tree(obs[k], sub, device) for k, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(
            _to_tensor_tree(o, sub, device) for o, sub in zip(obs, space.spaces, strict=True)
        )
    return _leaf_to_tensor(obs, device)


def normalizes_states(space: spaces.Space) -> bool:
    """Whether states of `space` are standardised with the dataset mean/std.

    Box observations are, except uint8 ones (images: the encoder scales them by 1/255, as DT's
    Atari code does); Discrete observations are indices for an embedding.
    """
    return isinstance(space, spaces.Box) and space.dtype != np.uint8
