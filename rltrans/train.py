"""python -m rltrans.train [group=option ...] [key=value ...]   (--help lists every knob)

Online training (algo=ppo|impala) and offline training of return-conditioned policies
(agent=dt|bc, dataset=<id>) share one run context (rltrans.run) and read top to bottom in
rltrans.trainers.ppo, .impala and .offline. Prints one JSON summary line at the end.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from omegaconf import DictConfig

from rltrans.cli import run_cli
from rltrans.config import ConfigError

Trainer = Callable[[DictConfig, Sequence[str]], dict[str, Any]]


def _ppo(cfg: DictConfig, overrides: Sequence[str]) -> dict[str, Any]:
    from rltrans.trainers.ppo import train_ppo

    return train_ppo(cfg, overrides)


def _offline(cfg: DictConfig, overrides: Sequence[str]) -> dict[str, Any]:
    from rltrans.trainers.offline import train_offline

    return train_offline(cfg, overrides)


def _impala(cfg: DictConfig, overrides: Sequence[str]) -> dict[str, Any]:
    from rltrans.trainers.impala import train_impala

    return train_impala(cfg, overrides)


# Picked once from algo.kind; trainers are imported on demand (DT users need no PPO imports).
TRAINERS: dict[str, Trainer] = {"online": _ppo, "offline": _offline, "impala": _impala}


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse overrides, train, print one JSON summary line."""
    argv = list(sys.argv[1:] if argv is None else argv)

    def run(cfg: DictConfig) -> dict[str, Any]:
        from rltrans.config.resources import check_resources
        from rltrans.run import override_keys, settled_config
        from rltrans.trainers.horizon import fit_horizon

        # agent.horizon: memory and segments that span the task. Before a resume too, so the
        # command line it repeats compares equal to the fitted config the run saved.
        cfg = fit_horizon(cfg, override_keys(argv))
        cfg = settled_config(cfg, argv)  # a resumed run continues its saved config
        # The one estimate, on the final settings: before a folder, env or process exists.
        check_resources(cfg)
        kind = cfg.algo.kind
        if kind not in TRAINERS:
            raise ConfigError(f"algo.kind={kind!r}; valid kinds: {', '.join(TRAINERS)}")
        return TRAINERS[kind](cfg, argv)

    return run_cli(argv, "train", __doc__, run)


if __name__ == "__main__":
    sys.exit(main())
