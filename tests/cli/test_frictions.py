"""A newcomer's first hour: evaluate video=true on the quickstart's T-maze run, a missing
renderer as one error line, a GIF never written through a symlink, the agent=gru preset and
its one-line hint, and torch_threads=auto reporting times and a busy machine."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch
from PIL import Image

from rltrans.accel import threads
from rltrans.accel.threads import ThreadTuner
from rltrans.config import load_config
from rltrans.evaluate import main as evaluate_main
from rltrans.run.checkpoint import load_checkpoint
from rltrans.train import main as train_main
from tests.helpers.cli import TINY_PPO, summary_line
from tests.runtime import renderable

FAST = ["torch_threads=1", "compile=false"]  # training: no timing of threads or compiling
ONE_THREAD = "torch_threads=1"  # evaluation


def train(run: Path, *args: str) -> Path:
    """A tiny training run into ``run`` (which it returns)."""
    tiny = TINY_PPO
    if "agent=mlp" in args:  # a memoryless agent has no heads or window to set
        tiny = [a for a in TINY_PPO if not a.startswith(("agent.heads=", "agent.memory="))]
    assert train_main([*tiny, *FAST, f"run_dir={run}", *args]) == 0
    return run


@pytest.fixture(scope="module")
def tmaze_run(tmp_path_factory) -> Path:
    """The quickstart's env and agent (T-maze, gtrxl), a few thousand steps at agent.dim=16."""
    return train(tmp_path_factory.mktemp("tmaze") / "run", "total_steps=2048")


# ------------------------------------------------------------------------------ video


def test_evaluate_video_on_the_quickstart_tmaze_writes_the_gif(tmaze_run, capsys):
    capsys.readouterr()
    assert evaluate_main([f"checkpoint={tmaze_run}", "episodes=2", "video=true", ONE_THREAD]) == 0
    summary = summary_line(capsys.readouterr().out)
    gif = tmaze_run / "videos" / "eval.gif"
    assert summary["video"] == str(gif)
    with Image.open(gif) as image:
        # Env 0's first episode, frames of 3 x 11 cells of 12 pixels (corridor 10).
        assert image.format == "GIF" and image.size == (11 * 12, 3 * 12)
        assert image.n_frames >= 2
    assert [p.name for p in gif.parent.iterdir()] == ["eval.gif"]  # no temp file left


def test_a_symlinked_gif_is_refused_not_written_through(tmp_path, capsys):
    """videos/eval.gif linking to a file outside the run: refused before any episode is
    played (exit 2, one line), and the file it points to keeps its content."""
    env = ["env=gym", f"env.id={renderable.__name__}:rltrans_tests/Blink-v0", "env.num_envs=2"]
    run = train(tmp_path / "run", *env, "agent=mlp", "total_steps=64", "tensorboard=false")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (run / "videos").mkdir()
    (run / "videos" / "eval.gif").symlink_to(victim)
    capsys.readouterr()
    args = [f"checkpoint={run}", "episodes=2", "video=true", "trust_env_code=true", ONE_THREAD]
    assert evaluate_main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "eval.gif is a symbolic link" in err, err
    assert victim.read_text() == "precious"
    assert (run / "videos" / "eval.gif").is_symlink()  # left as the user made it


def test_a_missing_renderer_is_one_error_line_naming_what_to_install(tmp_path, monkeypatch, capsys):
    """CartPole draws with pygame: without it, exit 2 and one line, no traceback."""
    run = train(tmp_path / "run", "env=gym", "agent=mlp", "total_steps=64", "tensorboard=false")
    monkeypatch.setitem(sys.modules, "pygame", None)  # `import pygame` fails, as uninstalled
    capsys.readouterr()
    assert evaluate_main([f"checkpoint={run}", "episodes=1", "video=true", ONE_THREAD]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: video=true: this env cannot draw frames: pygame is not")
    assert 'pip install "gymnasium[classic-control]"' in err and "rltrans[render]" in err


# ------------------------------------------------------------------------------ agent=gru


def test_gru_preset_trains_and_matches_the_lstm_presets_widths(tmp_path, capsys):
    gru, lstm = (load_config([f"agent={name}"]).agent for name in ("gru", "lstm"))
    # POPGym's recurrent baselines: 256 units, one layer, after 128-wide layers.
    assert (gru.backbone, gru.dim, gru.layers, gru.encoder.hidden_dim) == ("gru", 256, 1, 128)
    assert {**gru, "backbone": "lstm"} == dict(lstm)
    run = tmp_path / "run"
    tiny = ["env.num_envs=4", "algo.num_steps=16", "algo.segment_length=8", "progress=false"]
    assert train_main(["agent=gru", "total_steps=64", *tiny, *FAST, f"run_dir={run}"]) == 0
    assert summary_line(capsys.readouterr().out)["status"] == "finished"
    agent = load_checkpoint(run / "checkpoints" / "last.pt")["config"]["agent"]
    assert (agent["backbone"], agent["dim"]) == ("gru", 256)
    assert train_main(["--help"]) == 0
    assert "    gru " in capsys.readouterr().out  # listed among the agent options


def test_backbone_gru_on_the_default_agent_is_one_line_pointing_at_agent_gru(tmp_path, capsys):
    run = tmp_path / "run"
    assert train_main(["agent.backbone=gru", f"run_dir={run}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not run.exists(), err
    assert err.startswith("error: agent.backbone=gru: the agent preset's transformer knobs (")
    assert "position" in err and "use agent=gru instead of agent.backbone=gru" in err
    # Another unknown key is still its own line.
    assert train_main(["agent.backbone=gru", "agent.bogus=1", f"run_dir={run}"]) == 2
    err = capsys.readouterr().err
    assert "agent.bogus" in err and "use agent=gru" in err


# ------------------------------------------------------------------------------ threads


class FakeClock:
    """time.perf_counter for the tuner: each call lasts the next of the given milliseconds."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def run_tuner(monkeypatch, ms: dict[int, list[float]]) -> tuple[ThreadTuner, list[str]]:
    """A 1-vs-2-thread tuner fed calls of ``ms[threads]`` milliseconds, in turn."""
    clock = FakeClock()
    monkeypatch.setattr(threads, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    lines: list[str] = []
    tuner = ThreadTuner("acting step", (1, 2), trials=5, warmup=0, report=lines.append)
    calls = {n: iter(times) for n, times in ms.items()}
    while tuner.chosen is None:
        with tuner:
            clock.now += next(calls[torch.get_num_threads()]) / 1e3
    return tuner, lines


def test_thread_report_prints_milliseconds_beside_the_ratio(monkeypatch):
    tuner, lines = run_tuner(monkeypatch, {1: [10.0] * 5, 2: [5.0, 5.1, 4.9, 5.0, 5.0]})
    assert tuner.chosen == 2 and len(lines) == 1
    assert (
        lines[0]
        == "torch_threads=auto: acting step uses 2 threads (median 1 thread 10 ms, 2 threads 5 ms)"
    )


@pytest.mark.parametrize(
    "slow_two",
    [
        [300.0, 0.6, 500.0, 400.0, 0.7],  # a busy core: "2 threads: 0.00x"
        [1.0, 2.0, 50.0, 3.0, 100.0],  # a median that looks 3x faster, from scattered calls
    ],
)
def test_thread_timings_too_noisy_to_compare_keep_the_fewest_threads(monkeypatch, slow_two):
    one = [0.5] * 5 if slow_two[0] > 100 else [10.0] * 5
    tuner, lines = run_tuner(monkeypatch, {1: one, 2: slow_two})
    assert tuner.chosen == 1 and len(lines) == 1
    assert "uses 1 thread (busy machine, times overlap: " in lines[0]
    assert len(lines[0]) < 160  # one line beside the progress bar
    low, high = min(slow_two), max(slow_two)
    assert f"2 threads {low:.3g}-{high:.3g} ms" in lines[0]  # the spread that hid the difference
    assert " ms)" in lines[0]  # and the medians in ms


# ----------------------------------------------------------------------------- long evaluations


def test_a_long_evaluation_shows_progress_and_a_short_one_stays_quiet(
    tmaze_run, capsys, monkeypatch
):
    monkeypatch.setenv("RLTRANS_PROGRESS_EVERY_S", "0")
    assert evaluate_main([f"checkpoint={tmaze_run}", "episodes=40"]) == 0
    assert "evaluate: " in capsys.readouterr().err
    monkeypatch.setenv("RLTRANS_PROGRESS_EVERY_S", "3600")
    assert evaluate_main([f"checkpoint={tmaze_run}", "episodes=4"]) == 0
    assert "evaluate: " not in capsys.readouterr().err


def test_an_evaluation_past_max_steps_is_one_error_line(tmaze_run, capsys):
    assert evaluate_main([f"checkpoint={tmaze_run}", "episodes=50", "max_steps=3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: evaluation exceeded max_steps=3") and "Traceback" not in err
