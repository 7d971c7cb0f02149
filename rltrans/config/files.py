"""Where the shipped YAML lives: the configs/ folder (installed as ``rltrans.configs``), its
groups (sub-folders), each group's options (file names) and the ``kind`` they declare."""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable

from omegaconf import OmegaConf

CONFIG_PACKAGE = "rltrans.configs"  # the top-level configs/ folder, installed as package data


def config_root() -> Traversable:
    """The folder of the shipped YAML configs (works editable and from a wheel)."""
    return files(CONFIG_PACKAGE)


def group_options(group: str) -> list[str]:
    """Options of a config group (the YAML file names in configs/<group>/)."""
    folder = config_root() / group
    if not folder.is_dir():
        return []
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def config_groups() -> list[str]:
    """The config groups (sub-folders of configs/)."""
    root = config_root()
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("__"))


def group_kinds(group: str) -> list[str]:
    """The ``kind`` values the options of a config group declare (configs/<group>/*.yaml)."""
    folder = config_root() / group
    kinds = {
        OmegaConf.create((folder / f"{o}.yaml").read_text()).get("kind")
        for o in group_options(group)
    }
    return sorted(str(k) for k in kinds if k is not None)
