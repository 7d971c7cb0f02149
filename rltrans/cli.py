"""The shell the command-line tools share (rltrans.train, .evaluate, .collect): ``--help``,
``--cfg``, user errors as exit code 2 and the one-line JSON summary."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from omegaconf import OmegaConf

from rltrans.config import ConfigError, config_help, load_config
from rltrans.fsutil import StorageError, UnsafePathError
from rltrans.run.checkpoint import CheckpointError
from rltrans.run.logging import print_summary
from rltrans.spaces import SpaceMismatchError
from rltrans.trainers import stop
from rltrans.version import __version__


def _print_to_pipe(text: str) -> None:
    """Print long output that may be cut short by its reader (``--help | head``) quietly."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # The reader left: point stdout at /dev/null so the interpreter's final flush is silent.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _exiting_at_once(run: Callable, cfg: Any) -> Any:
    """``run(cfg)`` with a second stop signal ending the process at once (one line, no
    traceback); the setting is the command's alone, so a caller in the same process (a test,
    a notebook calling ``main``) keeps its own handling afterwards."""
    before, stop.EXIT_AT_ONCE = stop.EXIT_AT_ONCE, True
    try:
        return run(cfg)
    finally:
        stop.EXIT_AT_ONCE = before


def run_cli(argv: list[str] | None, config_name: str, doc: str, run: Callable) -> int:
    """Shared body of the command-line tools: ``--help``, ``--version``, ``--cfg``, config
    errors and the one-line JSON summary. ``run(cfg) -> summary`` gets a config that passed
    :func:`rltrans.config.load_config`'s checks; exit code 2 for a user error, 128 + the
    signal's number (130 SIGINT, 143 SIGTERM) when the summary's status is "interrupted",
    1 for any other status but "finished", else 0."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--version" in argv:
        print(f"rltrans {__version__}")
        return 0
    overrides = [a for a in argv if a not in ("--cfg", "--help", "-h")]
    try:
        if "--help" in argv or "-h" in argv:
            _print_to_pipe(doc.strip() + "\n\n" + config_help(config_name, overrides))
            return 0
        cfg = load_config(overrides, config_name)  # every bad value stops here, before run()
        if "--cfg" in argv:
            print(OmegaConf.to_yaml(cfg))
            return 0
        summary = _exiting_at_once(run, cfg)
    except KeyboardInterrupt:  # Ctrl-C where no trainer handles it (evaluate, collect)
        print("rltrans: interrupted (SIGINT)", file=sys.stderr)
        return 128 + signal.SIGINT.value
    except (
        ConfigError,
        FileNotFoundError,
        CheckpointError,
        SpaceMismatchError,
        UnsafePathError,
        StorageError,
    ) as err:  # UnsafePathError: a link or a special file met while writing or reading;
        # StorageError: a write the file system refused (full, read-only), what stayed named
        print(f"error: {err}", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, one summary line (rank 0's)
        print_summary(summary)
    status = summary.get("status", "finished")
    if status == "interrupted":  # stopped by SIGINT/SIGTERM: 128 + its number, as a shell says
        return 128 + signal.Signals[summary.get("signal", "SIGINT")].value
    return 0 if status == "finished" else 1
