"""benchmarks/memory_suite.py on a tiny grid: the table, the results, both pictures, and a
second call that reuses what is on disk instead of training again."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "memory_suite.py"


def run_suite(out: Path) -> subprocess.CompletedProcess:
    args = ["--tasks", "passive_tmaze", "repeat_previous", "--lengths", "2", "4"]
    args += ["--agents", "mlp", "--seeds", "2", "--steps", "1024", "--num-envs", "4"]
    args += ["--task-steps", "repeat_previous=2048"]
    args += ["--eval-every", "1", "--jobs", "2", "--out", str(out)]
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )


def test_the_suite_writes_its_table_and_pictures_and_reuses_finished_runs(tmp_path):
    out = tmp_path / "suite"
    first = run_suite(out)
    assert first.returncode == 0, first.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert len(results) == 2 * 2 * 2  # tasks x lengths x seeds
    assert {(r["task"], r["length"]) for r in results} == {
        (t, n) for t in ("passive_tmaze", "repeat_previous") for n in (2, 4)
    }
    assert all(-1.0 <= r["eval_return"] <= 1.0 and r["sps"] > 0 for r in results)
    table = (out / "table.md").read_text().splitlines()
    assert table[0].startswith("| task | length | agent | env steps |") and len(table) == 2 + 4
    for r in results:  # --task-steps gives repeat_previous its own budget
        budget = 2048 if r["task"] == "repeat_previous" else 1024
        config = (Path(r["run_dir"]) / "config.yaml").read_text()
        assert f"total_steps: {budget}\n" in config
        row = next(row for row in table if row.startswith(f"| {r['task']} | {r['length']} |"))
        assert row.split(" | ")[3] == f"{budget:,}"
    for picture in ("curves.png", "by_length.png"):
        assert (out / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/checkpoints/last.pt")}
    again = run_suite(out)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/checkpoints/last.pt")} == stamps
    reread = json.loads((out / "results.json").read_text())
    assert sorted(reread, key=lambda r: r["run_dir"]) == sorted(results, key=lambda r: r["run_dir"])

    # A finished run without its result (trained elsewhere, or before a crash) is evaluated,
    # not trained again, and keeps the speed it logged while training.
    run = Path(results[0]["run_dir"])
    (run / "result.json").unlink()
    third = run_suite(out)
    assert third.returncode == 0, third.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/checkpoints/last.pt")} == stamps
    redone = json.loads((run / "result.json").read_text())
    assert redone["sps"] == pytest.approx(load_suite().logged_sps(run)) and redone["sps"] > 0


def load_suite():
    """benchmarks/memory_suite.py as a module (its folder on sys.path, as a script has it)."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec = importlib.util.spec_from_file_location("memory_suite", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclass looks its module up
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return module


def test_popgym_levels_set_every_setting_of_the_preset_and_name_their_folders():
    suite = load_suite()
    grid = suite.cells(["repeat_first", "count_recall", "repeat_previous"], [8, 96], "medium")
    assert grid == [("repeat_first", 415), ("count_recall", 103), ("repeat_previous", 31)]
    assert suite.env_overrides("count_recall", 103, "medium") == [
        "env.kwargs.length=103",
        "env.kwargs.num_symbols=4",  # not only the length: medium counts suits
    ]
    assert suite.env_overrides("repeat_previous", 31, "hard") != suite.env_overrides(
        "repeat_previous", 31, "medium"
    )
    assert suite.cells(["autoencode"], [8, 96], None) == [("autoencode", 8), ("autoencode", 96)]
    medium = suite.run_name("count_recall", 103, "gru", 1, "medium")
    assert medium != suite.run_name("count_recall", 103, "gru", 1)  # 2 symbols, not 4


def test_popgym_levels_refuse_a_task_popgym_lacks_and_name_those_it_has():
    with pytest.raises(ValueError, match="no task 'tmaze'.*repeat_first.*autoencode"):
        load_suite().cells(["repeat_first", "tmaze"], [8], "easy")


def test_task_steps_name_the_bad_entry_and_the_tasks_run():
    suite = load_suite()
    assert suite.task_steps(["count_recall=2000"], ["repeat_first", "count_recall"]) == {
        "count_recall": 2000
    }
    for bad in ("tmaze=2000", "count_recall=0", "count_recall=2e6", "count_recall"):
        with pytest.raises(ValueError, match=f"'{bad}'.*repeat_first, count_recall"):
            suite.task_steps([bad], ["repeat_first", "count_recall"])
