"""Resume: the config a resumed run continues with (the run folder's saved config, checked
as a file, with the command line's resumable changes), and which keys those may be.

A resumed run continues the run's SAVED config: keys the command line does not mention keep
their saved values, so ``resume=true run_dir=<run>`` continues it as it was; the command line
may change only :data:`RESUMABLE_KEYS` (budget, checkpoint cadence, logging, device,
threads), and any other difference is refused with the keys that differ, saved vs given.
Trust is the current command line's alone: a saved ``trust_env_code`` never carries over.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rltrans.config.compose import to_container
from rltrans.config.errors import ConfigError
from rltrans.config.trust import checked_file_config, read_run_config, refuse_env_code
from rltrans.run.checkpoint import CheckpointManager, load_checkpoint
from rltrans.run.folder import CONFIG_FILE, refuse_links
from rltrans.run.saved_state import check_saved_state

# Keys a resumed run may change; every other key keeps the run's saved value.
RESUMABLE_KEYS: tuple[str, ...] = (
    "total_steps",
    "train_steps",
    "checkpoint_every",
    "keep_checkpoints",
    "tensorboard",
    "progress",
    "device",
    "torch_threads",
    "rollout",
    "trust_env_code",
    "resume",
    "run_dir",
    "overwrite",
)


def override_keys(overrides: Sequence[str]) -> list[str]:
    """The config keys a list of command-line overrides sets (``+a.b=1`` -> ``a.b``)."""
    keys = []
    for item in overrides:
        if "=" not in item or item.startswith("-"):
            continue
        keys.append(item.split("=", 1)[0].lstrip("+~"))
    return keys


def _select(cfg: DictConfig, key: str) -> Any:
    value = OmegaConf.select(cfg, key, default=None)
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def resume_config(saved: DictConfig, given: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """The config a resumed run continues with: the saved one, with the keys the command line
    set taken from it where they are resumable; refuses any other change.

    Keys the command line does not mention keep their saved values, so a resume line need
    not repeat the run's options (``resume=true run_dir=<run>`` continues it as it was).
    """
    changed = []
    merged = saved.copy()
    for key in override_keys(overrides):
        old, new = _select(saved, key), _select(given, key)
        if old == new:
            continue
        if key.split(".")[0] not in RESUMABLE_KEYS:
            changed.append(f"{key}: saved {old!r}, given {new!r}")
            continue
        OmegaConf.update(merged, key, new, force_add=True)
    # Trust is the current command line's alone: a saved value never carries over.
    merged.trust_env_code = bool(given.get("trust_env_code", False))
    if changed:
        raise ConfigError(
            "resume=true continues the run's saved config; these keys differ from it:\n  "
            + "\n  ".join(changed)
            + f"\nOnly {', '.join(k for k in RESUMABLE_KEYS if k not in ('resume', 'run_dir'))}"
            " may change on resume; start a new run for anything else"
        )
    return merged


def settled_config(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """The config a run uses: ``cfg`` for a fresh run; for ``resume=true`` the run's saved
    config with the command line's resumable changes (:func:`resume_config`). Idempotent."""
    if not cfg.resume:
        return cfg
    if cfg.run_dir is None:
        raise ConfigError("resume=true needs run_dir=<the run to continue>")
    run_dir = Path(cfg.run_dir)
    refuse_links(run_dir)
    latest = CheckpointManager(run_dir / "checkpoints").latest()
    if latest is None:
        raise ConfigError(f"resume=true but {run_dir} holds no checkpoint to resume from")
    saved_file = run_dir / CONFIG_FILE
    if not saved_file.is_file():
        raise ConfigError(f"resume=true but {saved_file} (the run's config) is missing")
    saved = read_run_config(saved_file)  # checked like a command line: a file is no authority
    _same_as_checkpoint(saved, latest)
    source = f"the run's config {saved_file}"
    typed = to_container(cfg.env)  # the command line's env: trusted as typed
    refuse_env_code(to_container(saved.env), source, cfg.trust_env_code, typed=typed)
    return resume_config(saved, cfg, overrides)


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> leaf value of a plain config."""
    if not isinstance(data, dict) or not data:
        return {prefix: data}
    out: dict[str, Any] = {}
    for name, value in data.items():
        out.update(_flat(value, f"{prefix}{name}."))
    return {k.rstrip("."): v for k, v in out.items()}


def _same_as_checkpoint(saved: DictConfig, checkpoint: Path) -> None:
    """Refuse a run folder whose config.yaml differs from its checkpoint's own config outside
    the resumable keys (a hand edit would otherwise continue under other settings), and a
    checkpoint whose saved trainer state is out of bounds (before anything is built)."""
    payload = load_checkpoint(checkpoint, mmap=True)  # tensors are read where checked only
    own = to_container(checked_file_config(payload.get("config"), f"checkpoint {checkpoint}"))
    mine = _flat(to_container(saved))
    theirs = _flat(own)
    differ = [
        f"{key}: config.yaml {mine.get(key)!r}, checkpoint {theirs.get(key)!r}"
        for key in sorted(set(mine) | set(theirs))
        if key.split(".")[0] not in RESUMABLE_KEYS and mine.get(key) != theirs.get(key)
    ]
    if differ:
        raise ConfigError(
            f"resume=true: {checkpoint.parent.parent / CONFIG_FILE} differs from the config of "
            f"{checkpoint} (was it edited?):\n  "
            + "\n  ".join(differ)
            + "\nRestore the file, or start a new run with the settings you want"
        )
    check_saved_state(payload, f"checkpoint {checkpoint}")


__all__ = ["RESUMABLE_KEYS", "override_keys", "resume_config", "settled_config"]
