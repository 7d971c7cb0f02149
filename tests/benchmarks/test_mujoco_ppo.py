"""benchmarks/mujoco_ppo.py's speed stage reads both scripts' cumulative SPS logs the same
way: the whole-run rate is the last one, and the second half's rate leaves a compile or a
warm-up at the start out exactly."""

from __future__ import annotations

import pytest

from tests.helpers.scripts import benchmark_script


@pytest.fixture(scope="module")
def bench():
    with benchmark_script("mujoco_ppo") as module:
        yield module


def test_the_second_half_rate_leaves_a_slow_start_out(bench):
    # 30 updates of 2,048 steps: the first takes 60 s (a compile), then 1,000 SPS throughout.
    steps = [2048.0 * (i + 1) for i in range(30)]
    seconds = [60.0 + 2.048 * i for i in range(30)]
    speed = bench.steady_rate(steps, [s / t for s, t in zip(steps, seconds, strict=True)])
    assert speed.steady == pytest.approx(1000.0)
    assert speed.whole == pytest.approx(steps[-1] / seconds[-1])
    assert speed.whole < 0.6 * speed.steady  # the whole run pays for the compile


def test_too_few_logs_for_a_second_half_are_refused(bench):
    with pytest.raises(ValueError, match="too few for a second half"):
        bench.steady_rate([2048.0], [1000.0])
