"""Run logging: TensorBoard events read back, summaries, episode tracking, progress, JSON line."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from rltrans.run.logging import (
    EPISODIC_RETURN,
    LOSSES,
    PERF,
    EpisodeTracker,
    MetricLogger,
    prefixed,
    print_summary,
)
from rltrans.run.progress import ProgressBar


def _read_events(tb_dir: Path) -> tuple[dict[str, list[tuple[int, float]]], list[str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0, "histograms": 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    scalars = {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
        for tag in tags["scalars"]
    }
    return scalars, tags["histograms"]


def test_events_are_written_and_read_back(tmp_path: Path) -> None:
    with MetricLogger(tmp_path) as logger:
        logger.log(
            100,
            {
                "charts/episodic_return": 12.5,
                **prefixed(LOSSES, {"policy": torch.tensor(-0.25), "value": torch.tensor(3)}),
                "perf/env_ms": np.float32(1.5),
            },
        )
        logger.log(200, {"charts/episodic_return": torch.tensor(20.0), "losses/policy": 0.5})
        logger.log_histogram(200, "charts/returns", np.array([1.0, 2.0, np.nan, 4.0]))
    scalars, histograms = _read_events(tmp_path / "tb")
    assert scalars["charts/episodic_return"] == [(100, 12.5), (200, 20.0)]
    assert scalars["losses/policy"] == [(100, -0.25), (200, 0.5)]
    assert scalars["losses/value"] == [(100, 3.0)]
    assert scalars["perf/env_ms"] == [(100, 1.5)]
    assert histograms == ["charts/returns"]


def test_summary_holds_the_latest_value_of_every_metric(tmp_path: Path) -> None:
    logger = MetricLogger(tmp_path, use_tensorboard=False)
    logger.log(1, {"losses/policy": torch.tensor(1.0), "perf/env_ms": 2.0})
    logger.log(2, {"losses/policy": torch.tensor(0.5), EPISODIC_RETURN: None})
    assert logger.summary() == {"losses/policy": 0.5, "perf/env_ms": 2.0}
    assert logger.last_step("losses/policy") == 2
    assert logger.last_step("perf/env_ms") == 1
    assert not (tmp_path / "tb").exists()
    logger.close()
    with pytest.raises(RuntimeError, match="closed"):
        logger.log(3, {"losses/policy": 0.0})


def test_log_rejects_non_scalar_tensors_and_bad_names(tmp_path: Path) -> None:
    logger = MetricLogger(tmp_path, use_tensorboard=False)
    with pytest.raises(ValueError, match=r"'losses/policy' has shape \(3,\)"):
        logger.log(0, {"losses/policy": torch.zeros(3)})
    with pytest.raises(ValueError, match="metric name"):
        logger.log(0, {"": 1.0})
    assert prefixed("perf", {"env_ms": 1}) == {"perf/env_ms": 1}
    assert prefixed(PERF, {"env_ms": 1}) == {"perf/env_ms": 1}


def _vector_info(
    done: list[bool], returns: list[float], lengths: list[int], as_torch: bool
) -> dict[str, object]:
    convert = torch.tensor if as_torch else np.array
    return {
        "episode": {
            "r": convert(np.where(done, returns, 0.0)),
            "l": convert(np.where(done, lengths, 0)),
            "t": convert(np.zeros(len(done))),
        },
        "_episode": convert(np.array(done)),
    }


@pytest.mark.parametrize("as_torch", [False, True])
def test_episode_tracker_respects_masks(as_torch: bool) -> None:
    tracker = EpisodeTracker(window=3)
    assert tracker.mean_return is None and tracker.success_rate is None
    assert tracker.update({}) == []
    finished = tracker.update(
        _vector_info([True, False, True], [1.0, 99.0, 3.0], [10, 7, 30], as_torch)
    )
    assert [(e.env_index, e.ret, e.length, e.success) for e in finished] == [
        (0, 1.0, 10, None),
        (2, 3.0, 30, None),
    ]
    assert tracker.mean_return == 2.0 and tracker.mean_length == 20.0
    assert tracker.success_rate is None, "no env reported success"
    # Two more episodes push the first one out of the window of 3.
    tracker.update(_vector_info([False, True, True], [0.0, 5.0, 7.0], [0, 50, 70], as_torch))
    assert tracker.mean_return == pytest.approx((3.0 + 5.0 + 7.0) / 3)
    assert tracker.episodes_seen == 4
    assert tracker.metrics()[EPISODIC_RETURN] == pytest.approx(5.0)


@pytest.mark.parametrize("as_torch", [False, True])
def test_episode_tracker_success_flags_and_masks(as_torch: bool) -> None:
    convert = torch.tensor if as_torch else np.array
    tracker = EpisodeTracker()
    info = _vector_info([True, True, True, False], [1.0, 2.0, 3.0, 4.0], [1, 2, 3, 4], as_torch)
    # env 1 finished without reporting success; env 3 reported success but did not finish.
    info["success"] = convert(np.array([True, True, False, True]))
    info["_success"] = convert(np.array([True, False, True, True]))
    finished = tracker.update(info)
    assert [e.success for e in finished] == [True, None, False]
    assert tracker.success_rate == 0.5
    assert tracker.metrics()["charts/success_rate"] == 0.5


def test_episode_tracker_reads_same_step_final_info() -> None:
    tracker = EpisodeTracker()
    info = _vector_info([False, True], [0.0, 9.0], [0, 9], as_torch=False)
    info["final_info"] = {"success": np.array([False, True]), "_success": np.array([False, True])}
    info["_final_info"] = np.array([False, True])
    info["success"] = np.array([False, False])  # belongs to the freshly reset episode
    info["_success"] = np.array([False, True])
    (episode,) = tracker.update(info)
    assert episode.env_index == 1 and episode.success is True


def test_episode_tracker_requires_the_mask_for_vector_infos() -> None:
    tracker = EpisodeTracker()
    with pytest.raises(ValueError, match="_episode"):
        tracker.update({"episode": {"r": np.array([1.0, 2.0]), "l": np.array([1, 2])}})
    # A single env's info (scalars, no mask) is one finished episode.
    (episode,) = tracker.update({"episode": {"r": 4.0, "l": 2}})
    assert (episode.ret, episode.length) == (4.0, 2)


def test_episode_tracker_restores_its_window_and_refuses_a_damaged_one() -> None:
    tracker = EpisodeTracker(window=3)
    tracker.update({"episode": {"r": 1.5, "l": 4}, "success": True})
    restored = EpisodeTracker(window=3)
    restored.load_state_dict(tracker.state_dict())
    assert restored.metrics() == tracker.metrics() and restored.episodes_seen == 1
    good = tracker.state_dict()
    damaged = [
        ("lengths", [[[4]]], "episodes.lengths holds list"),  # a nested list (a fuzzed file)
        ("lengths", ["4"], "episodes.lengths holds str"),
        ("lengths", [-1], "episodes.lengths holds int -1"),
        ("returns", [float("nan")], "episodes.returns holds float nan"),
        ("successes", [1], "episodes.successes holds int"),
        ("returns", [0.0] * 4, "at most 3 values"),
        ("episodes_seen", True, "episodes_seen=True"),
    ]
    for key, value, message in damaged:
        with pytest.raises(ValueError, match=message):
            EpisodeTracker(window=3).load_state_dict({**good, key: value})


def test_print_summary_is_one_valid_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    print_summary(
        {
            "mean_return": np.float32(1.5),
            "loss": float("nan"),
            "best": math.inf,
            "steps": torch.tensor(7),
            "returns": np.array([1.0, -np.inf]),
            "note": "two\nlines",
            "path": Path("runs/x"),
        }
    )
    out = capsys.readouterr().out
    assert out.endswith("\n") and out.count("\n") == 1
    assert json.loads(out) == {
        "mean_return": 1.5,
        "loss": None,
        "best": None,
        "steps": 7,
        "returns": [1.0, None],
        "note": "two\nlines",
        "path": "runs/x",
    }


def test_progress_bar_prints_lines_when_not_a_tty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLTRANS_NO_PROGRESS", raising=False)
    stream = io.StringIO()  # not a TTY
    with ProgressBar(1000, "train", every_s=0.0, stream=stream) as bar:
        assert not bar.interactive
        bar.update(250, ret=12.345678)
        bar.update(250, ret=None)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3, lines  # one per update (every_s=0) plus the final line on close
    assert lines[0].startswith("train: 250/1.00k step (25%)")
    assert "SPS" in lines[0] and "ret=12.35" in lines[0]
    assert "(50%)" in lines[1] and "ret=-" in lines[1]
    assert "elapsed" in lines[-1] and "eta" in lines[-1]


def test_resumed_progress_bar_rates_only_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A resumed run's bar starts at the checkpoint; those steps are not this process's work,
    so the rate and the ETA ignore them (resuming a finished run once showed '109M SPS')."""
    monkeypatch.delenv("RLTRANS_NO_PROGRESS", raising=False)
    stream = io.StringIO()
    now = [100.0]
    monkeypatch.setattr("rltrans.run.progress.time.monotonic", lambda: now[0])
    bar = ProgressBar(1_000_000, "train", every_s=0.0, stream=stream, initial=900_000)
    now[0] = 102.0  # one update, 2 s later
    bar.update(1_000)
    assert bar.n == 901_000 and bar.sps == 500.0  # 1,000 steps in 2 s, not 901,000
    line = stream.getvalue().splitlines()[0]
    assert "901k/1.00M step (90%)" in line and "500 SPS" in line
    assert "eta 0:03:18" in line  # 99,000 steps left at 500/s


def test_progress_lines_name_their_rate_and_time_the_eta_from_the_first_update(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """evaluate counts episodes: its rate is episodes/s, not SPS. A slow start (envs built,
    the first update's warm-up) does not stretch the ETA once later updates show the rate."""
    monkeypatch.delenv("RLTRANS_NO_PROGRESS", raising=False)
    now = [0.0]
    monkeypatch.setattr("rltrans.run.progress.time.monotonic", lambda: now[0])
    stream = io.StringIO()
    bar = ProgressBar(100, "evaluate", "episode", every_s=0.0, stream=stream)
    now[0] = 60.0  # the first 10 episodes end a minute in: 50 s of it was the start
    bar.update(10)
    now[0] = 70.0  # then 10 episodes per 10 s
    bar.update(10)
    first, second = stream.getvalue().splitlines()
    assert "episodes/s" in first and "SPS" not in first
    assert "eta 0:09:00" in first  # at the only rate known yet: 90 left at 10 / 60 s
    assert "eta 0:01:20" in second  # 80 left at 1 episode/s, not 80 / (20 / 70 s) = 4:40
    train = ProgressBar(1000, "train", every_s=0.0, stream=io.StringIO())
    offline = ProgressBar(1000, "train", "grad step", every_s=0.0, stream=io.StringIO())
    assert (train.rate_label, offline.rate_label) == ("SPS", "grad steps/s")


def test_progress_bar_is_quiet_between_intervals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLTRANS_NO_PROGRESS", raising=False)
    stream = io.StringIO()
    bar = ProgressBar(None, "collect", unit="episode", every_s=3600.0, stream=stream)
    bar.update(1)
    (first,) = stream.getvalue().splitlines()  # at once: the run is under way
    assert first.startswith("collect: 1.00 episode")
    for _ in range(49):
        bar.update(1)
    assert stream.getvalue().splitlines() == [first]
    bar.close()
    bar.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("collect: 50.0 episode")  # once on close
    quick = io.StringIO()
    with ProgressBar(10, "eval", every_s=3600.0, stream=quick, quiet_if_quick=True) as bar:
        bar.update(10)
    assert quick.getvalue() == ""  # quick work says nothing


def test_progress_bar_env_var_disables_the_tty_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    class FakeTTY(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("RLTRANS_NO_PROGRESS", "1")
    with ProgressBar(10, "train", every_s=0.0, stream=FakeTTY()) as bar:
        assert not bar.interactive
    monkeypatch.setenv("RLTRANS_NO_PROGRESS", "0")
    stream = FakeTTY()
    with ProgressBar(10, "train", stream=stream) as bar:
        assert bar.interactive
        bar.update(10, ret=1.0)
    assert "ret=1" in stream.getvalue() and "100%" in stream.getvalue()
