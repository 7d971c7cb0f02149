"""The two scores of benchmarks/popgym_score.py and the seeds of popgym_suite.py: the MMER
(POPGym's score, Morad et al. 2023) read back from a run folder equals the running maximum of
the 100-episode training mean computed by hand, normalised as the deterministic score is; an
older result without it gets it from its run's logs, or shows "-"; ``--seed N`` runs seed N
alone and refuses ``--seeds``.

The run folders are written as a training run writes them, with no training: finished episodes
go through the trainer's episode window (EpisodeTracker, window 100) and its logger, once per
"update"."""

from __future__ import annotations

import json
from argparse import Namespace
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from rltrans.run.logging import EpisodeTracker, MetricLogger
from tests.helpers.scripts import benchmark_script

pytest.importorskip("tensorboard")

REPEAT_FIRST = "popgym:popgym-RepeatFirstEasy-v0"  # returns in [-1, 1]
CART_POLE = "popgym:popgym-PositionOnlyCartPoleEasy-v0"  # returns in [0, 1]
STEPS_PER_UPDATE = 2048


@pytest.fixture(scope="module")
def scoring():
    with benchmark_script("popgym_score") as module:
        yield module


@pytest.fixture(scope="module")
def suite(scoring):
    """popgym_suite.py, importing the scoring module above: one Result class for both."""
    with benchmark_script("popgym_suite") as module:
        yield module


def write_run(run: Path, updates: list[list[float]], evaluated: float | None = None) -> None:
    """A run folder whose training finished the episodes ``updates[k]`` (their returns) in
    update k, logged at the end of each update as the trainer logs them; with ``evaluated``, an
    evaluation of that mean return after each update too."""
    run.mkdir(parents=True)
    tracker = EpisodeTracker(window=100)  # the PPO trainer's window
    with MetricLogger(run) as logger:
        for k, returns in enumerate(updates, 1):
            if returns:  # Gymnasium's RecordEpisodeStatistics layout, one env per episode
                n = len(returns)
                episode = {"r": np.array(returns), "l": np.full(n, 10)}
                tracker.update({"episode": episode, "_episode": np.ones(n, dtype=bool)})
            evaluation = {} if evaluated is None else {"eval/episodic_return": evaluated}
            logger.log(
                k * STEPS_PER_UPDATE, {**tracker.metrics(), "charts/SPS": 1000.0, **evaluation}
            )


# Four updates: 80 episodes of 0.0; 40 of 0.8; 100 of -0.5; 30 of 0.9. The window of the last
# 100 after each: 0.0; (60 x 0.0 + 40 x 0.8) / 100 = 0.32; -0.5; (70 x -0.5 + 30 x 0.9) / 100
# = -0.08. Its running maximum ends at 0.32 (the mean of this update's episodes alone would
# give 0.9, the mean of every episode so far 32 / 120 = 0.267).
UPDATES = [[0.0] * 80, [0.8] * 40, [-0.5] * 100, [0.9] * 30]


def test_mmer_is_the_best_mean_of_the_last_100_training_episodes(scoring, tmp_path):
    write_run(tmp_path / "run", UPDATES)
    assert scoring.mmer(tmp_path / "run") == pytest.approx(0.32, abs=1e-6)  # float32 events
    # the same by the definition, from every finished episode in order
    done = [ret for returns in UPDATES for ret in returns]
    ends = np.cumsum([len(returns) for returns in UPDATES])
    windows = [np.mean(done[:end][-100:]) for end in ends]
    assert scoring.mmer(tmp_path / "run") == pytest.approx(max(windows), abs=1e-6)


def test_a_run_with_fewer_than_100_episodes_averages_those_it_has(scoring, tmp_path):
    # nothing finished in the first update (nothing logged); then 0.3, then (0.9 - 2) / 5
    write_run(tmp_path / "run", [[], [0.1, 0.3, 0.5], [-1.0, -1.0]])
    assert scoring.mmer(tmp_path / "run") == pytest.approx(0.3, abs=1e-6)


def test_a_run_that_logged_no_training_episode_has_no_mmer(scoring, tmp_path):
    write_run(tmp_path / "none", [[], []])
    assert scoring.mmer(tmp_path / "none") is None
    assert scoring.mmer(tmp_path / "no-logs") is None  # no TensorBoard events at all


def test_the_mmer_is_normalised_as_the_deterministic_score(scoring):
    # POPGym's 0.5 x + 0.5 on an env whose returns lie in [-1, 1] ...
    assert scoring.score(REPEAT_FIRST, 0.32) == pytest.approx(0.5 * 0.32 + 0.5)
    # ... and the return itself on a cart-pole, whose returns lie in [0, 1]
    assert scoring.score(CART_POLE, 0.32) == pytest.approx(0.32)


def old_result(scoring, run: Path):
    """A finished run's result.json as the suite wrote it before it kept the MMER."""
    result = scoring.Result("RepeatFirst", "easy", "popgym", "gru", 1, 0.5, 0.75, None, 900.0, "")
    fields = asdict(result)
    del fields["mmer"], fields["mmer_score"]
    run.mkdir(parents=True, exist_ok=True)
    (run / "result.json").write_text(json.dumps(fields))


def test_an_older_result_gets_its_mmer_from_its_runs_logs(scoring, suite, tmp_path):
    cell = suite.Cell("RepeatFirst", "easy", "popgym", "gru", 1)
    write_run(tmp_path / cell.name, UPDATES)
    old_result(scoring, tmp_path / cell.name)
    result = suite.one_run(cell, REPEAT_FIRST, Namespace(out=str(tmp_path)))  # trains nothing
    assert (result.eval_return, result.score) == (0.5, 0.75)
    assert result.mmer == pytest.approx(0.32, abs=1e-6)
    assert result.mmer_score == pytest.approx(0.66, abs=1e-6)
    kept = json.loads((tmp_path / cell.name / "result.json").read_text())
    assert kept["mmer_score"] == result.mmer_score  # written back: read once


def test_the_table_shows_both_scores_and_a_dash_where_the_mmer_is_unknown(scoring, suite, tmp_path):
    cell = suite.Cell("RepeatFirst", "easy", "popgym", "gru", 1)
    old_result(scoring, tmp_path / cell.name)  # its logs are gone
    lost = suite.one_run(cell, REPEAT_FIRST, Namespace(out=str(tmp_path)))
    assert lost.mmer is None and lost.mmer_score is None
    known = scoring.Result("RepeatFirst", "easy", "popgym", "gtrxl", 1, 0.0, 0.5, None, 800.0, "")
    known.mmer, known.mmer_score = 0.32, 0.66
    text = scoring.table(
        [lost, known],
        [("RepeatFirst", "easy", "popgym")],
        ["gtrxl", "gru"],
        {("RepeatFirst", "easy"): 0.25},
        {"RepeatFirstEasy": 200_000},
    )
    lines = text.splitlines()
    assert "| deterministic score (final policy, 100 evaluated episodes): mean" in lines[0]
    assert "| MMER (POPGym's score: best 100-episode training mean): mean" in lines[0]
    assert "| RepeatFirstEasy | gtrxl | 200,000 | 0.50 (0.50-0.50) | 0.66 (0.66-0.66) |" in text
    assert "| RepeatFirstEasy | gru | 200,000 | 0.75 (0.75-0.75) | - |" in text
    head = next(line for line in lines if line.startswith("| level |"))
    assert head.startswith(
        "| level | envs | gtrxl: deterministic score | gru: deterministic score "
        "| gtrxl: MMER | gru: MMER |"
    )
    # gru leads on the one env above chance by the deterministic score; by the MMER: unknown
    assert "| easy | 1 | 0.500 | 0.750 | 0.660 | - | 1 / - | 0 / - | 1 / - |" in lines


@pytest.mark.parametrize(
    ("argv", "seeds"),
    [(["--seed", "3"], [3]), (["--seeds", "2"], [1, 2]), ([], [1, 2, 3]), (["--quick"], [1])],
)
def test_seed_runs_that_one_seed_and_seeds_runs_1_to_n(suite, argv, seeds):
    _, args = suite.parse(argv)
    assert args.seed_list == seeds


def test_seed_and_seeds_together_are_refused(suite, capsys):
    with pytest.raises(SystemExit) as exit_:
        suite.parse(["--seed", "3", "--seeds", "2"])
    assert exit_.value.code == 2
    assert "argument --seeds: not allowed with argument --seed" in capsys.readouterr().err


def test_the_level_summary_counts_the_leads_by_each_score(scoring):
    # gtrxl's final policy is ahead (0.9 against 0.6), the GRU's training episodes (0.8 and 0.7)
    def result(agent: str, score: float, best: float):
        r = scoring.Result("RepeatFirst", "easy", "popgym", agent, 1, 0.0, score, None, 1.0, "")
        r.mmer, r.mmer_score = 0.0, best
        return r

    results = [result("gtrxl", 0.9, 0.7), result("gru", 0.6, 0.8)]
    chance = {("RepeatFirst", "easy"): 0.25}
    head, _, line = scoring.summary(results, ["gtrxl", "gru"], chance).splitlines()
    assert head.endswith(
        "| envs above chance (det / MMER) | gtrxl ahead (det / MMER) | gru ahead (det / MMER) |"
    )
    assert line == "| easy | 1 | 0.900 | 0.600 | 0.700 | 0.800 | 1 / 1 | 1 / 0 | 0 / 1 |"


def finished_run(scoring, run: Path, agent: str, seed: int, steps: int, value: float) -> None:
    """A run folder as the suite leaves it: its saved config, its training logs and result."""
    write_run(run, UPDATES, evaluated=value)
    (run / "config.yaml").write_text(f"total_steps: {steps}\nseed: {seed}\n")
    result = scoring.Result("RepeatFirst", "easy", "popgym", agent, seed, value, 0.0, None, 9.0, "")
    (run / "result.json").write_text(json.dumps(asdict(result)))


def test_collect_tables_the_finished_runs_of_several_folders(scoring, suite, tmp_path, capsys):
    pytest.importorskip("popgym")
    first, second, out = tmp_path / "first", tmp_path / "second", tmp_path / "table"
    finished_run(scoring, first / "RepeatFirstEasy-gru-s1", "gru", 1, 200_000, 0.5)
    finished_run(scoring, first / "RepeatFirstEasy-gtrxl-s1", "gtrxl", 1, 200_000, 1.0)
    finished_run(scoring, second / "RepeatFirstEasy-gtrxl-s2", "gtrxl", 2, 200_000, 0.0)
    (second / "RepeatFirstEasy-gru-s2").mkdir()  # still training: a config, no result
    (second / "RepeatFirstEasy-gru-s2" / "config.yaml").write_text("total_steps: 200000\n")
    suite.main(["--collect", str(first), str(second), "--out", str(out)])
    printed = capsys.readouterr().out
    assert "# 1 unfinished runs left out: RepeatFirstEasy-gru-s2" in printed
    text = (out / "table.md").read_text()
    # gtrxl over both folders' seeds: returns 1.0 and 0.0 are scores 1.0 and 0.5; the MMER of
    # each run's logs (0.32, score 0.66)
    assert "| RepeatFirstEasy | gtrxl | 200,000 | 0.75 (0.50-1.00) | 0.66 (0.66-0.66) |" in text
    assert "| RepeatFirstEasy | gru | 200,000 | 0.75 (0.75-0.75) | 0.66 (0.66-0.66) |" in text
    kept = json.loads((out / "results.json").read_text())
    assert sorted(r["run_dir"] for r in kept) == sorted(
        str(run) for run in (*first.iterdir(), second / "RepeatFirstEasy-gtrxl-s2")
    )
    assert (out / "bars.png").is_file() and (out / "curves.png").is_file()


def test_collect_names_a_run_found_twice_and_a_folder_with_none(scoring, suite, tmp_path, capsys):
    pytest.importorskip("popgym")
    for folder in ("first", "second"):
        finished_run(scoring, tmp_path / folder / "RepeatFirstEasy-gru-s1", "gru", 1, 1024, 0.5)
    with pytest.raises(SystemExit) as exit_:
        suite.main(["--collect", str(tmp_path / "first"), str(tmp_path / "second")])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert f"the run RepeatFirstEasy-gru-s1 is in both {tmp_path / 'first'}" in error
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        suite.main(["--collect", str(tmp_path / "empty")])
    assert f"--collect {tmp_path / 'empty'}: no finished run" in capsys.readouterr().err
