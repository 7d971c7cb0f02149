"""Test helper: a Gymnasium wrapper that SIGKILLs its own process at a given env step.

Used as ``env.wrappers=[{path: tests.helpers.kill.KillAtStep}]``. It kills ONLY when the
environment variable :data:`KILL_ENV` is set (to the step count at which to die), so the
same config trains normally in the uninterrupted and the resumed run: a resumed run keeps the
saved config, wrappers included, and must not die again.

Before dying it flushes every open TensorBoard ``SummaryWriter`` of the process, so the
events an interrupted run logged after its last checkpoint are on disk (as after any of
SummaryWriter's periodic flushes) and a resume has to purge them.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
from typing import Any

import gymnasium as gym

KILL_ENV = "RLTRANS_TEST_KILL_AT_STEP"


def flush_tensorboard_writers() -> int:
    """Flush every live torch SummaryWriter in this process; returns how many."""
    module = sys.modules.get("torch.utils.tensorboard.writer")
    if module is None:
        return 0
    # type() rather than isinstance(): some lazy module objects warn when asked their class.
    writers = [obj for obj in gc.get_objects() if issubclass(type(obj), module.SummaryWriter)]
    for writer in writers:
        writer.flush()
    return len(writers)


class KillAtStep(gym.Wrapper):
    """Counts ``step`` calls of this sub-env (resets do not count) and sends SIGKILL to its own
    process at step ``$RLTRANS_TEST_KILL_AT_STEP`` (never when the variable is unset). Sub-envs
    of a sync vector env step together, so sub-env 0 is the one that fires."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.count = 0
        at = os.environ.get(KILL_ENV)
        self.kill_at = int(at) if at else None

    def step(self, action: Any):
        self.count += 1
        if self.kill_at is not None and self.count == self.kill_at:
            flush_tensorboard_writers()
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return self.env.step(action)
