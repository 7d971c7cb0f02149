"""compile=auto never bets more than a tenth of the rest of a run: the update that compiles
runs under that deadline, is dropped past it (the run goes on eager from the state before
it), and every outcome is remembered for the workload, so a later run does not pay again."""

from __future__ import annotations

import json
import signal
import time

import pytest

from rltrans.accel import run_speed
from rltrans.accel.auto import AutoCompile, CompileOverBudget, Memory, deadline, workload_key
from rltrans.train import main as train_main
from tests.helpers.cli import TINY_PPO, summary_line


def chooser(updates: int, memory: Memory, key: str = "k", **kw) -> tuple[AutoCompile, list]:
    calls: list[str] = []
    auto = AutoCompile(
        updates,
        enable=lambda: calls.append("enable"),
        disable=lambda: calls.append("disable"),
        memory=memory,
        key=key,
        **kw,
    )
    return auto, calls


def test_the_compiling_update_gets_a_tenth_of_the_rest_as_its_deadline(tmp_path):
    memory = Memory(tmp_path / "m.json")
    auto, calls = chooser(1000, memory)
    assert not auto.compile_due()
    auto.after_update(1.2)
    auto.after_update(1.0)  # 998 updates left x 1.0 s: 99.8 s > 60 s to compile
    assert auto.compile_due() and auto.budget_s == pytest.approx(99.8)
    assert calls == ["enable"]
    auto.after_update(50.0)  # the compiling update, within its budget
    assert not auto.compile_due() and auto.budget_s is None


def test_over_budget_goes_eager_and_a_later_run_of_the_workload_stays_eager(tmp_path):
    memory = Memory(tmp_path / "m.json")
    lines: list[str] = []
    auto, calls = chooser(1000, memory, report=lines.append)
    auto.after_update(1.0)
    auto.after_update(1.0)
    auto.over_budget(CompileOverBudget(auto.budget_s))
    assert auto.choice == "eager" and calls == ["enable", "disable"]
    assert lines[-1] == (
        "compile=auto: back to eager (compiling took over 100 s, 10% of the run; the update "
        "was dropped and rerun)"
    )
    assert json.loads(memory.path.read_text())["k"]["choice"] == "eager"
    later, later_calls = chooser(1000, Memory(memory.path), report=lines.append)
    for _ in range(5):
        later.after_update(1.0)
    assert later.choice == "eager" and later_calls == [] and not later.compile_due()
    assert lines[-1].startswith("compile=auto: staying eager, as an earlier run of this workload")
    other, other_calls = chooser(1000, Memory(memory.path), key="other")  # another workload
    other.after_update(1.0)
    other.after_update(1.0)
    assert other_calls == ["enable"]


def test_a_workload_that_compiled_faster_compiles_again_without_the_estimate(tmp_path):
    memory = Memory(tmp_path / "m.json")
    auto, _ = chooser(1000, memory)
    for seconds in (1.0, 1.0, 30.0, 0.5, 0.5):  # eager, eager, compiling, compiled, compiled
        auto.after_update(seconds)
    assert auto.choice == "compiled" and memory.get("k")["choice"] == "compiled"
    short, calls = chooser(20, Memory(memory.path))  # a 2 s budget: too short to estimate
    short.after_update(1.0)
    short.after_update(1.0)
    assert calls == ["enable"] and short.budget_s == pytest.approx(1.8)


def test_a_memory_file_that_cannot_be_read_remembers_nothing(tmp_path):
    path = tmp_path / "m.json"
    path.write_text("{not json")
    assert Memory(path).get("k") is None
    path.write_text(json.dumps({"k": {"choice": "always"}}))
    assert Memory(path).get("k") is None  # not a choice
    folder = tmp_path / "dir.json"
    folder.mkdir()
    Memory(folder).put("k", "eager", "x")  # not writable as a file: no error, nothing kept
    assert Memory(folder).get("k") is None


def test_the_deadline_interrupts_a_wait_and_restores_the_handler():
    before = signal.getsignal(signal.SIGUSR1)
    start = time.monotonic()
    with pytest.raises(CompileOverBudget), deadline(0.2, lambda: CompileOverBudget(0.2)):
        time.sleep(30)  # a blocking wait, as on a compiler subprocess
    assert time.monotonic() - start < 5
    with deadline(5.0, lambda: CompileOverBudget(5.0)):
        pass  # ended in time: nothing raised, then or later
    time.sleep(0.1)
    assert signal.getsignal(signal.SIGUSR1) is before
    with deadline(None, lambda: CompileOverBudget(0)):
        time.sleep(0.01)


def test_the_key_names_the_workload():
    assert workload_key({"agent": 1}, "cpu") == workload_key({"agent": 1}, "cpu")
    assert workload_key({"agent": 1}, "cpu") != workload_key({"agent": 2}, "cpu")


@pytest.mark.cli
def test_a_run_whose_compile_runs_over_budget_drops_that_update_and_finishes_eager(
    tmp_path, capsys, monkeypatch
):
    """A real compile cut off by its deadline: with no compile time expected, a 6-update run
    tries it under a budget of a tenth of a few tenths of a second; the compiling update is
    dropped, rerun eager, and the run ends as planned. The next run of the workload does not
    try again."""
    monkeypatch.setattr(run_speed, "COMPILE_SECONDS", 0.0)
    args = [*TINY_PPO, "compile=auto", "total_steps=384", "torch_threads=1", "progress=false"]
    assert train_main([*args, f"run_dir={tmp_path / 'a'}"]) == 0
    out, err = capsys.readouterr()
    summary = summary_line(out)
    assert summary["status"] == "finished" and summary["global_step"] == 384
    assert summary["updates"] == 6
    assert "compile=auto: compiling (" in err
    assert "compile=auto: back to eager (compiling took over" in err
    assert train_main([*args, f"run_dir={tmp_path / 'b'}"]) == 0
    _, err = capsys.readouterr()
    assert "compile=auto: staying eager, as an earlier run of this workload found" in err
    assert "compile=auto: compiling" not in err
