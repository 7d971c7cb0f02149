"""The global random generators' state (Python, NumPy, torch CPU and CUDA) as data a
checkpoint can hold and ``torch.load(weights_only=True)`` reads back, so a resumed run draws
the numbers the interrupted one would have drawn."""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """Capture Python, NumPy (global), torch CPU and CUDA RNG states as weights_only-safe data."""
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": {
            "version": int(py_version),
            "state": torch.tensor(py_state, dtype=torch.int64),
            "gauss_next": None if py_gauss is None else float(py_gauss),
        },
        "numpy": {
            "name": str(np_name),
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64).copy()),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_gauss),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore RNG states captured by `rng_state()`; missing parts are left untouched."""
    if "python" in state:
        py = state["python"]
        py_state = tuple(int(x) for x in py["state"].tolist())
        random.setstate((py["version"], py_state, py["gauss_next"]))
    if "numpy" in state:
        npd = state["numpy"]
        keys = npd["keys"].numpy().astype(np.uint32)
        np.random.set_state(
            (npd["name"], keys, npd["pos"], npd["has_gauss"], npd["cached_gaussian"])
        )
    if "torch" in state:
        torch.set_rng_state(state["torch"].cpu())
    saved_cuda = state.get("cuda") or []
    if saved_cuda:
        if not torch.cuda.is_available():
            warnings.warn("checkpoint holds CUDA RNG states but CUDA is unavailable", stacklevel=2)
            return
        count = torch.cuda.device_count()
        if count != len(saved_cuda):
            warnings.warn(
                f"checkpoint holds {len(saved_cuda)} CUDA RNG states but {count} devices are "
                f"visible; restoring the first {min(count, len(saved_cuda))}",
                stacklevel=2,
            )
        for device, cuda_state in enumerate(saved_cuda[:count]):
            torch.cuda.set_rng_state(cuda_state.cpu(), device)


__all__ = ["restore_rng_state", "rng_state"]
