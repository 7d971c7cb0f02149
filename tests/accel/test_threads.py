"""torch_threads=auto: the tuner keeps the fewest threads within 10 % of the fastest, measured
on the calls themselves; trainers report and checkpoint the choice; a resume keeps it."""

from __future__ import annotations

import pytest
import torch

from rltrans import load_policy
from rltrans.accel import threads
from rltrans.accel.threads import Plan, ThreadTuner, candidates
from rltrans.evaluate import main as evaluate_main
from rltrans.run.checkpoint import load_checkpoint
from rltrans.runtime.pool import pool_arguments
from rltrans.train import main as train_main


class VirtualClock:
    """Stands in for the tuner's ``time``: ``sleep`` advances ``perf_counter`` exactly, so a
    test's timings are what it says they are, however busy the machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> VirtualClock:
    """The tuner reads a virtual clock: no timing of a test using it depends on the load."""
    virtual = VirtualClock()
    monkeypatch.setattr(threads, "time", virtual)
    return virtual


def run_calls(tuner: ThreadTuner, seconds: dict[int, float], calls: int) -> list[int]:
    """``calls`` entries of the tuner; each call sleeps ``seconds[threads in use]``; returns
    the thread count of every call."""
    used = []
    for _ in range(calls):
        with tuner:
            n = torch.get_num_threads()
            used.append(n)
            threads.time.sleep(seconds[n])
    return used


@pytest.mark.parametrize(
    ("seconds", "chosen"),
    [
        ({1: 0.04, 2: 0.02}, 2),  # 2x faster on two threads
        ({1: 0.02, 2: 0.04}, 1),  # slower on two
        ({1: 0.050, 2: 0.048}, 1),  # within 10 %: the fewest threads
    ],
)
def test_keeps_the_fewest_threads_within_10_percent_of_the_fastest(seconds, chosen, clock):
    lines = []
    tuner = ThreadTuner("learner step", (1, 2), trials=3, warmup=1, report=lines.append)
    used = run_calls(tuner, seconds, 8)
    assert used == [1, 2, 1, 2, 1, 2, 1, 2]  # interleaved: noise hits both alike
    assert tuner.chosen == chosen
    assert lines == [lines[0]] and f"learner step uses {chosen} thread" in lines[0]
    assert run_calls(tuner, seconds, 3) == [chosen] * 3  # decided: no more trials


def test_warmup_calls_are_not_counted(clock):
    """A slow first call at each count (compilation) does not decide the choice."""
    tuner = ThreadTuner("acting step", (1, 2), trials=3, warmup=1)
    slow_first = iter([0.2, 0.2])
    used = []
    for _ in range(8):
        with tuner:
            n = torch.get_num_threads()
            used.append(n)
            threads.time.sleep(next(slow_first, None) or (0.04 if n == 1 else 0.02))
    one, two = (Plan(n) for n in (1, 2))
    assert tuner.chosen == 2 and len(tuner.times[one]) == len(tuner.times[two]) == 3


def test_a_restored_or_single_choice_never_times(clock):
    restored = ThreadTuner("learner step", (1, 2))
    restored.load_state_dict({"chosen": 2})
    assert run_calls(restored, {1: 0.0, 2: 0.0}, 3) == [2, 2, 2]
    assert restored.times == {Plan(1): [], Plan(2): []}
    assert ThreadTuner("x", (1,)).chosen == 1
    assert restored.state_dict() == {"chosen": 2, "streams": 1}


def test_streams_are_a_plan_of_their_own(clock):
    """With streams, n one-thread streams are tried beside each count; the fewest cores
    within 10 % of the fastest win, the faster plan where two use as many cores; the choice
    round-trips through a checkpoint, and a tuner without streams takes its thread count."""
    one, two, streams = Plan(1), Plan(2), Plan(1, 2)
    for seconds, chosen in (
        ({one: 0.06, two: 0.04, streams: 0.03}, streams),
        ({one: 0.06, two: 0.03, streams: 0.04}, two),
        ({one: 0.031, two: 0.03, streams: 0.02}, streams),  # 1 thread not within 10 %
        ({one: 0.030, two: 0.03, streams: 0.029}, one),
    ):
        lines = []
        tuner = ThreadTuner("learner step", (1, 2), streams=True, trials=2, report=lines.append)
        assert tuner.plans == (one, two, streams)
        used = []
        for _ in range(9):
            with tuner:
                used.append((tuner.plan, torch.get_num_threads()))
                threads.time.sleep(seconds[tuner.plan])
        assert used == [(one, 1), (two, 2), (streams, 1)] * 3
        assert tuner.chosen_plan == chosen and tuner.plan == chosen
        assert f"learner step uses {chosen} (median 1 thread " in lines[0]
        restored = ThreadTuner("learner step", (1, 2), streams=True)
        restored.load_state_dict(tuner.state_dict())
        assert restored.chosen_plan == chosen
    plain = ThreadTuner("learner step", (1, 2))
    plain.load_state_dict({"chosen": 1, "streams": 2})
    assert plain.chosen_plan == one and str(streams) == "2 streams x 1 thread"


def test_candidates_and_the_omp_cap(monkeypatch):
    assert candidates(1) == (1,) and candidates(2) == (1, 2)
    assert candidates(6) == (1, 2, 4, 6) and candidates(8) == (1, 2, 4, 8)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert threads.available_cores() == 2
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert threads.available_cores() == 8


TINY = ["env.kwargs.length=4", "algo.num_steps=16", "agent.dim=16", "progress=false"]


@pytest.mark.cli
def test_train_reports_checkpoints_and_resumes_the_choice(tmp_path, capsys, monkeypatch):
    """torch_threads=auto (the default) on 2 cores: both kinds of call are tuned and reported
    during the first update, the choice lands in the checkpoint, and a resumed run reuses it
    without measuring again."""
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    args = [*TINY, "total_steps=512", f"run_dir={tmp_path}"]
    assert train_main(args) == 0
    err = capsys.readouterr().err
    assert "torch_threads=auto: learner step uses" in err
    assert "torch_threads=auto: acting step uses" in err
    payload = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    saved = payload["threads"]
    assert set(saved) == {"learner step", "acting step"}
    assert all(state["chosen"] in (1, 2) for state in saved.values())
    assert train_main([*TINY, "total_steps=1024", f"run_dir={tmp_path}", "resume=true"]) == 0
    assert "torch_threads=auto" not in capsys.readouterr().err
    # evaluate and load_policy tune their acting calls the same way.
    assert evaluate_main([f"checkpoint={tmp_path}", "episodes=4", "num_envs=1"]) == 0
    assert "torch_threads=auto: acting step uses" in capsys.readouterr().err
    assert load_policy(tmp_path).threads.counts == (1, 2)
    assert load_policy(tmp_path, torch_threads=1).threads is None


@pytest.mark.cli
def test_a_fixed_count_tunes_nothing_and_actor_processes_use_one(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    args = [*TINY, "total_steps=256", "torch_threads=1", f"run_dir={tmp_path}"]
    assert train_main(args) == 0
    assert "torch_threads=auto" not in capsys.readouterr().err
    from rltrans.config import load_config

    for value, expected in (("auto", 1), ("0", 1), ("3", 3)):
        cfg = load_config(["algo=impala", "runtime=process", f"torch_threads={value}"])
        assert pool_arguments(cfg)[1]["torch_threads"] == expected


def test_a_hopeless_plan_is_not_timed_again(clock):
    """A plan 10x slower than another in two counted calls (oversubscribed threads on a busy
    machine) is dropped from the trials: it costs its warm-up and two calls, not six."""
    lines = []
    tuner = ThreadTuner("learner step", (1, 2), trials=4, warmup=1, report=lines.append)
    used = run_calls(tuner, {1: 0.01, 2: 0.1}, 8)
    assert used == [1, 2, 1, 2, 1, 2, 1, 1]  # after two counted calls 2 is not tried again
    assert tuner.dropped == [Plan(2)] and len(tuner.times[Plan(2)]) == 2
    assert tuner.chosen == 1 and "2 threads over 3x slower, dropped" in lines[0]
    # Within the factor both are timed to the end, as before.
    close = ThreadTuner("learner step", (1, 2), trials=4, warmup=1)
    assert run_calls(close, {1: 0.01, 2: 0.02}, 10) == [1, 2] * 5 and not close.dropped
