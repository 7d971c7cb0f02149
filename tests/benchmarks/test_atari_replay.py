"""benchmarks/atari_replay.py's table: the pass rule (DT above BC and above the data's mean,
per seed) and the settings line, read from the runs rather than from the command line that
prints the table."""

from __future__ import annotations

import json
from argparse import Namespace
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.helpers.scripts import benchmark_script


@pytest.fixture(scope="module")
def replay():
    with benchmark_script("atari_replay") as module:
        yield module


def _write(out: Path, result) -> None:
    folder = out / "runs" / f"{result.agent}-s{result.seed}"
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps(asdict(result)))


def test_table_counts_seeds_where_dt_beats_bc_and_the_data_mean(replay, tmp_path):
    info = {"rows": 1000, "episodes": 5, "epsilons": [0.0, 1.0], "mean_score": 3.0}
    (tmp_path / "data.json").write_text(json.dumps({**info, "best_score": 9.0}))
    scores = {1: (5.0, 4.0), 2: (5.0, 6.0), 3: (2.5, 1.0)}  # wins: seed 1 only
    for seed, (dt, bc) in scores.items():
        _write(tmp_path, replay.Result("dt", seed, dt, 2.0, "", 10, 32, 3000))
        _write(tmp_path, replay.Result("bc", seed, bc, 9.0, "", 10, 32, 3000))
    args = Namespace(out=str(tmp_path), game="Breakout", context=30, batch=128, train_steps=5)
    replay.table(args)
    text = (tmp_path / "table.md").read_text()
    assert "| 5.0, 5.0, 2.5 | 4.0, 6.0, 1.0 | 1 of 3 | 2.00 |" in text
    # The settings come from the runs, not from this call's (default) options.
    assert "context 10, batch 32, 3,000 gradient steps" in text


def test_settings_list_every_distinct_value(replay):
    runs = [replay.Result("dt", 1, 0.0, 1.0, "", 10, 32, 3000)]
    runs.append(replay.Result("dt", 2, 0.0, 1.0, "", 30, 32, 3000))
    runs.append(replay.Result("bc", 1, 0.0, 1.0, ""))  # written before settings were recorded
    assert replay.settings(runs) == "context ?/10/30, batch ?/32, ?/3,000 gradient steps"
