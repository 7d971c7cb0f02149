"""RunSpeed: a run's speed choices made in one call from its settings, as the trainers use it."""

from __future__ import annotations

import torch
from torch import nn

from rltrans.accel.run_speed import ACTING, LEARNER, RunSpeed, SpeedSettings

CPU = torch.device("cpu")


def test_what_a_trainer_checkpoints_keeps_its_keys():
    """The thread and compile choices go into checkpoints as ``threads`` and ``compile``,
    the keys every earlier run folder holds."""
    speed = RunSpeed(SpeedSettings(compile="auto", torch_threads="auto"), CPU, 10)
    parts = speed.parts()
    assert set(parts) == {"threads", "compile"}
    assert set(parts["threads"]) == {LEARNER}
    assert parts["compile"].state_dict() is None  # auto: not decided before measuring


def test_compile_true_compiles_from_the_start_and_says_so_when_the_run_starts(capsys):
    speed = RunSpeed(SpeedSettings(compile=True), CPU, 10)
    assert speed.accel.compiling
    assert "compile=true" not in capsys.readouterr().err  # not while the run still builds
    speed.start(10)
    assert "compile=true: the first update compiles" in capsys.readouterr().err
    eager = RunSpeed(SpeedSettings(compile=False), CPU, 10)
    eager.start(10)
    assert not eager.accel.compiling and not eager.compile_due()
    assert "compile=" not in capsys.readouterr().err


def test_threads_auto_tunes_the_calls_named_and_a_fixed_count_none():
    both = RunSpeed(SpeedSettings(torch_threads="auto"), CPU, 1, calls=(LEARNER, ACTING))
    assert set(both.threads) == {LEARNER, ACTING}
    assert both.accel.threads is both.threads[LEARNER]
    fixed = RunSpeed(SpeedSettings(torch_threads=1), CPU, 1, calls=(LEARNER, ACTING))
    assert not fixed.threads and fixed.accel.threads is None


def test_minibatch_parts_run_as_streams_only_for_a_model_without_random_draws():
    """Dropout's draws from one generator would race between streams: no streams then."""

    def stream_plans(**kw) -> list:
        tuner = RunSpeed(SpeedSettings(torch_threads="auto"), CPU, 1, **kw).threads[LEARNER]
        return [plan for plan in tuner.plans if plan.streams > 1]

    plain = nn.Sequential(nn.Linear(2, 2))
    dropping = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1))
    many_threads = (
        max(RunSpeed(SpeedSettings(torch_threads="auto"), CPU, 1).threads[LEARNER].counts) > 1
    )
    assert bool(stream_plans(streams_for=plain)) == many_threads
    assert not stream_plans(streams_for=dropping)
    assert not stream_plans()


def test_the_actor_acts_through_the_compiled_step_and_the_acting_tuner():
    class Actor:
        rollout = None

        def __init__(self) -> None:
            self.loop = type("Loop", (), {"threads": None})()
            self.policy = None

        def use_policy(self, policy) -> None:
            self.policy = policy

    agent = nn.Linear(2, 2)  # no compilable acting step: the agent itself acts
    speed = RunSpeed(SpeedSettings(torch_threads="auto"), CPU, 1, calls=(LEARNER, ACTING))
    actor = Actor()
    speed.act_through(actor, agent)
    assert actor.policy is agent and actor.loop.threads is speed.threads[ACTING]
