"""Config loading for the command-line tools: Hydra composition with friendly errors and --help.

The YAML files in ``configs/`` are the documentation: every knob carries a
comment where it is defined, and ``--help`` prints them. Composition uses
Hydra's compose API, so a run never changes the working directory or the
logging setup.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from importlib.resources import files
from importlib.resources.abc import Traversable

from omegaconf import DictConfig, OmegaConf

CONFIG_PACKAGE = "rltrans.configs"  # the top-level configs/ folder, installed as package data


def config_root() -> Traversable:
    """The folder of the shipped YAML configs (works editable and from a wheel)."""
    return files(CONFIG_PACKAGE)


class ConfigError(ValueError):
    """A bad group choice, unknown key or malformed override, explained for the user."""


def group_options(group: str) -> list[str]:
    """Options of a config group (the YAML file names in configs/<group>/)."""
    folder = config_root() / group
    if not folder.is_dir():
        return []
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def _valid_keys(config_name: str, full_key: str, overrides: list[str]) -> list[str]:
    """Keys that exist at the parent of ``full_key`` in the config without the bad override."""
    groups = [o for o in overrides if o.split("=")[0] in {"agent", "env", "algo", "dataset"}]
    cfg = _compose(config_name, groups)
    node = cfg
    for part in full_key.split(".")[:-1]:
        node = node.get(part) if isinstance(node, DictConfig) else None
    return sorted(node.keys()) if isinstance(node, DictConfig) else []


def _compose(config_name: str, overrides: list[str]) -> DictConfig:
    from hydra import compose, initialize_config_module

    with initialize_config_module(CONFIG_PACKAGE, version_base="1.3", job_name="rltrans"):
        return compose(config_name, overrides=overrides)


def load_config(overrides: list[str], config_name: str = "train") -> DictConfig:
    """Compose configs/<config_name>.yaml with ``key=value`` overrides, or raise ConfigError."""
    try:
        return _compose(config_name, overrides)
    except Exception as err:  # Hydra raises several exception types; all become ConfigError
        message = str(err)
        missing = re.search(r"Could not override '([^']+)'", message)
        if missing:
            full_key = missing.group(1)
            valid = _valid_keys(config_name, full_key, overrides)
            raise ConfigError(
                f"unknown config key {full_key!r}; valid keys here: {', '.join(valid)}"
            ) from None
        group = re.search(r"Could not find '(\w+)/([^']+)'", message)
        if group:
            name, choice = group.groups()
            raise ConfigError(
                f"unknown {name} {choice!r}; valid choices: {', '.join(group_options(name))}"
            ) from None
        raise ConfigError(message.strip()) from None


def config_help(config_name: str = "train") -> str:
    """The commented YAML of the root config and the options of every group, for --help."""
    root = config_root()
    lines = [(root / f"{config_name}.yaml").read_text().rstrip(), ""]
    if config_name != "train":
        return "\n".join(lines)
    groups = sorted(
        (p for p in root.iterdir() if p.is_dir() and p.name != "__pycache__"), key=lambda p: p.name
    )
    for group_dir in groups:
        lines.append(f"== {group_dir.name}=<option> ==")
        for option in group_options(group_dir.name):
            first = (group_dir / f"{option}.yaml").read_text().splitlines()[0]
            lines.append(f"  {option:20s} {first.lstrip('# ').strip()}")
        lines.append("")
    lines.append("Show one option's knobs: python -m rltrans.train <group>=<option> --cfg")
    return "\n".join(lines)


def to_container(cfg: DictConfig) -> dict:
    """Resolved plain-dict copy of a config (for checkpoints and run_dir/config.yaml)."""
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def run_cli(argv: list[str] | None, config_name: str, doc: str, run: Callable) -> int:
    """Shared body of the command-line tools: ``--help``, ``--cfg``, config errors and the
    one-line JSON summary. ``run(cfg) -> summary``; exit code 2 for a user error, 1 when the
    summary's status is not "finished", else 0."""
    from rltrans.checkpoint import CheckpointError, CheckpointMismatchError
    from rltrans.logging import print_summary

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:
        print(doc.strip() + "\n\n" + config_help(config_name))
        return 0
    try:
        cfg = load_config([a for a in argv if a != "--cfg"], config_name)
        if "--cfg" in argv:
            print(OmegaConf.to_yaml(cfg))
            return 0
        summary = run(cfg)
    except (ConfigError, FileNotFoundError, CheckpointError, CheckpointMismatchError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print_summary(summary)
    return 0 if summary.get("status", "finished") == "finished" else 1
