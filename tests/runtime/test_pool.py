"""IMPALA's in-process actor pool: closing it after a signal does not wait on its envs."""

from __future__ import annotations

import time

import numpy as np
from gymnasium.vector import AsyncVectorEnv

from rltrans.runtime.pool import LocalPool
from tests.envs.test_gym_vec import SlowStep
from tests.runtime.test_rollout import small_agent


def test_a_pool_cut_short_by_a_signal_closes_without_awaiting_its_async_workers():
    """A step sent to an actor's async workers and never read back (a signal stopped the
    rollout there): ``close(cut_short=True)`` terminates the workers at once, where
    Gymnasium's close would wait a minute for the step."""
    envs = AsyncVectorEnv([SlowStep, SlowStep], context="fork")
    pool = LocalPool(
        [envs], small_agent(envs, "mlp"), num_steps=4, segment_length=4, seed=0, device="cpu"
    )
    envs.step_async(np.zeros(2, np.int64))
    start = time.monotonic()
    pool.close(cut_short=True)
    assert time.monotonic() - start < 20
    assert envs.closed and not any(p.is_alive() for p in envs.processes)
