"""Space utilities: observations -> tensors, which spaces can be encoded, one stored form of a
space and one compatibility check.

Leaves the library encodes: ``Box``, ``Discrete``, ``MultiDiscrete``, ``MultiBinary``; containers
``Dict`` and ``Tuple`` of those (nested). Anything else (``Text``, ``Graph``, ``Sequence``,
``OneOf``, custom spaces such as MiniGrid's ``MissionSpace``) has no fixed-size tensor form; the
error says which part of the observation it is and which wrapper would drop or convert it.
"""

from __future__ import annotations

import hashlib
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


class SpaceMismatchError(ValueError):
    """Two setups (a checkpoint and an env, a dataset and an env, ...) have different spaces."""


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


def _bound_summary(values: np.ndarray) -> float | int | dict[str, Any]:
    """One number when a Box bound is uniform, else min/max plus a digest of the exact values."""
    flat = np.asarray(values).reshape(-1)
    cast = int if np.issubdtype(flat.dtype, np.integer) else float
    if flat.size == 0:
        return {"min": None, "max": None, "digest": ""}
    if np.all(flat == flat[0]):
        return cast(flat[0])
    digest = hashlib.sha1(np.ascontiguousarray(flat, dtype=np.float64).tobytes()).hexdigest()
    return {"min": cast(flat.min()), "max": cast(flat.max()), "digest": digest[:12]}


def space_to_dict(space: spaces.Space) -> dict[str, Any]:
    """Describe a Gymnasium space as a plain dict that checkpoints and JSON can hold."""
    if isinstance(space, spaces.Box):
        return {
            "type": "Box",
            "shape": list(space.shape),
            "dtype": str(space.dtype),
            "low": _bound_summary(space.low),
            "high": _bound_summary(space.high),
        }
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": np.asarray(space.nvec).tolist(),
            "start": np.asarray(space.start).tolist(),
            "dtype": str(space.dtype),
        }
    if isinstance(space, spaces.MultiBinary):
        n = space.n
        return {"type": "MultiBinary", "n": int(n) if np.isscalar(n) else list(np.asarray(n))}
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": {str(k): space_to_dict(v) for k, v in space.items()}}
    if isinstance(space, spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_to_dict(s) for s in space.spaces]}
    # Text, Sequence, Graph, OneOf and custom spaces: their repr is the best stable description.
    return {"type": type(space).__name__, "repr": repr(space)}


def _format_bound(bound: Any) -> str:
    if isinstance(bound, dict):
        return f"[{bound['min']}..{bound['max']}]"
    return str(bound)


def describe(value: Any) -> str:
    """Short human-readable text for a `space_to_dict` description (or any value)."""
    if not (isinstance(value, dict) and "type" in value):
        text = repr(value)
        return text if len(text) <= 300 else text[:297] + "..."
    kind = value["type"]
    if kind == "Box":
        shape = tuple(value["shape"])
        low, high = _format_bound(value["low"]), _format_bound(value["high"])
        return f"Box({low}, {high}, {shape}, {value['dtype']})"
    if kind == "Discrete":
        start = f", start={value['start']}" if value.get("start") else ""
        return f"Discrete({value['n']}{start})"
    if kind == "MultiDiscrete":
        return f"MultiDiscrete({value['nvec']})"
    if kind == "MultiBinary":
        return f"MultiBinary({value['n']})"
    if kind == "Dict":
        inner = ", ".join(f"{k!r}: {describe(v)}" for k, v in value["spaces"].items())
        return f"Dict({inner})"
    if kind == "Tuple":
        return f"Tuple({', '.join(describe(v) for v in value['spaces'])})"
    return str(value.get("repr", kind))


def _differences(saved: Any, current: Any, path: str, out: list[str]) -> None:
    """Collect key paths where two plain descriptions differ (list and tuple compare equal)."""
    saved, current = (x.tolist() if hasattr(x, "tolist") else x for x in (saved, current))
    if isinstance(saved, dict) and isinstance(current, dict):
        for key in {**saved, **current}:
            sub = f"{path}.{key}" if path else str(key)
            if key in saved and key in current:
                _differences(saved[key], current[key], sub, out)
            else:
                out.append(sub)
    elif (
        isinstance(saved, list | tuple)
        and isinstance(current, list | tuple)
        and len(saved) == len(current)
    ):
        for i, (a, b) in enumerate(zip(saved, current, strict=True)):
            _differences(a, b, f"{path}[{i}]", out)
    # bool == int in Python; True and 1 are different descriptions, 4 and 4.0 are not.
    elif not (saved == current and isinstance(saved, bool) == isinstance(current, bool)):
        out.append(path or "<value>")


def check_same_spaces(
    expected: tuple[spaces.Space, spaces.Space],
    actual: tuple[spaces.Space, spaces.Space],
    *,
    expected_label: str = "the checkpoint was trained on",
    actual_label: str = "the env has",
) -> None:
    """The one compatibility check of (observation, action) spaces: raise SpaceMismatchError
    showing both descriptions and the differing parts when they differ.

    Example:
        >>> check_same_spaces(saved_spaces, (env.single_observation_space,
        ...                   env.single_action_space), actual_label="the env has")
    """
    pairs = zip(("observation space", "action space"), expected, actual, strict=True)
    for what, want, got in pairs:
        saved, current = space_to_dict(want), space_to_dict(got)
        diffs: list[str] = []
        _differences(saved, current, "", diffs)
        if diffs:
            where = ", ".join(diffs[:8]) + (" ..." if len(diffs) > 8 else "")
            raise SpaceMismatchError(
                f"{expected_label} {what} {describe(saved)} but {actual_label} "
                f"{describe(current)} (differs in: {where})"
            )


def serialize_space(space: spaces.Space) -> str:
    """The one stored form of a space: exact JSON (Minari's serialisation), rebuildable."""
    from minari.serialization import serialize_space as serialize

    return serialize(space)


def deserialize_space(text: str) -> spaces.Space:
    """The space :func:`serialize_space` wrote."""
    from minari.serialization import deserialize_space as deserialize

    return deserialize(text)
