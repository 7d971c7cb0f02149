"""python -m rltrans.plot: runs of one config (up to the seed) become one mean curve with a 95 %
band, interpolated onto the steps the group logged; the CSV holds the numbers the PNG draws;
bad arguments are one error line with exit code 2. Runs are written through rltrans's own
MetricLogger (TensorBoard events), so the reader reads what training writes."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from rltrans.plot import main as plot_main
from rltrans.run.logging import EPISODIC_RETURN, MetricLogger
from tests.helpers.cli import summary_line

# The PNG needs the plot extra (part of dev); the error tests run without it.
DRAWS = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason='needs pip install "rltrans[plot]"'
)


def make_run(
    path: Path,
    values: dict[int, float],
    seed: int,
    dim: int = 16,
    agent: dict | None = None,
    **metrics,
) -> Path:
    """A run folder: config.yaml (``agent`` for its agent section) and events of
    charts/episodic_return (plus ``metrics``)."""
    path.mkdir(parents=True)
    agent = agent or {"dim": dim, "backbone": "gtrxl"}
    config = {"agent": agent, "seed": seed, "run_dir": str(path)}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    with MetricLogger(path) as logger:
        for step, value in values.items():
            logger.log(step, {EPISODIC_RETURN: value, **metrics})
    return path


def read_rows(path: Path) -> dict[str, list[dict[str, float]]]:
    """The CSV's rows by group, numbers as floats."""
    rows: dict[str, list[dict[str, float]]] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            group = row.pop("group")
            rows.setdefault(group, []).append({k: float(v) for k, v in row.items()})
    return rows


def plot(tmp_path: Path, capsys, *args: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of a plot run writing into tmp_path."""
    code = plot_main([*args, f"out={tmp_path / 'c.png'}", f"csv={tmp_path / 'c.csv'}"])
    out, err = capsys.readouterr()
    return code, out, err


@DRAWS
def test_seeds_of_one_config_become_their_mean_with_a_band(tmp_path, capsys):
    a = make_run(tmp_path / "a1", {0: 1.0, 10: 3.0, 20: 5.0}, seed=1)
    b = make_run(tmp_path / "a2", {0: 3.0, 10: 7.0, 20: 9.0}, seed=2)
    c = make_run(tmp_path / "b1", {0: 0.0, 10: 1.0, 20: 2.0}, seed=1, dim=32)
    code, out, _ = plot(tmp_path, capsys, str(a), str(b), str(c))
    assert code == 0
    assert (tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")
    summary = summary_line(out)
    groups = {g["label"]: g["runs"] for g in summary["groups"]}
    # seed and run_dir differ within a group; the label is the key that differs between them
    assert groups == {"agent.dim=16": [str(a), str(b)], "agent.dim=32": [str(c)]}
    rows = read_rows(tmp_path / "c.csv")
    two = rows["agent.dim=16"]
    assert [r["step"] for r in two] == [0, 10, 20]
    assert [r["mean"] for r in two] == [2.0, 5.0, 7.0]  # the mean of the two seeds
    assert all(r["n_seeds"] == 2 for r in two)
    # the bootstrap mean of 2 seeds is the lower one, their mean or the higher one with
    # probability 1/4, 1/2, 1/4: its 95 % interval is the two seeds' range
    assert [(r["low"], r["high"]) for r in two] == [(1.0, 3.0), (3.0, 7.0), (5.0, 9.0)]
    one = rows["agent.dim=32"]
    assert [(r["mean"], r["low"], r["high"], r["n_seeds"]) for r in one] == [
        (0.0, 0.0, 0.0, 1),
        (1.0, 1.0, 1.0, 1),
        (2.0, 2.0, 2.0, 1),
    ]


def test_the_band_of_four_seeds_is_the_bootstrap_interval_inside_their_range():
    from rltrans.plot import Curve, mean_band

    x = np.array([0.0, 1.0])
    values = (-1.0, 0.0, 0.0, 1.0)
    seeds = [Curve(Path(f"s{i}"), x, np.array([v, -v])) for i, v in enumerate(values)]
    group = mean_band("g", seeds)
    assert list(group.mean) == [0.0, 0.0]
    # the mean of 4 seeds drawn with replacement, over all 256 equally likely draws: P(-1) =
    # 0.4 %, P(<= -0.75) = 3.5 %, so its 2.5 and 97.5 percentiles are -0.75 and 0.75 (with 2
    # or 3 seeds an extreme has mass >= 3.7 %: the band is their range)
    assert list(group.low) == [-0.75, -0.75]
    assert list(group.high) == [0.75, 0.75]
    t_half = 3.182 * np.std(values, ddof=1) / 2  # a t interval: +-1.30 for a [-1, 1] metric
    assert group.high[0] < 1.0 < t_half


@DRAWS
def test_lines_are_labelled_by_the_fewest_keys_that_tell_them_apart(tmp_path, capsys):
    gtrxl = {"backbone": "gtrxl", "memory": 32, "heads": 4, "dim": 64}
    gru = {"backbone": "gru", "memory": 0, "heads": 1, "dim": 64}
    a = make_run(tmp_path / "a", {0: 0.0, 10: 1.0}, seed=1, agent=gtrxl)
    b = make_run(tmp_path / "b", {0: 0.0, 10: 1.0}, seed=1, agent=gru)
    c = make_run(tmp_path / "c", {0: 0.0, 10: 1.0}, seed=1, agent={**gru, "dim": 128})
    code, out, _ = plot(tmp_path, capsys, str(a), str(b), str(c))
    assert code == 0
    labels = [g["label"] for g in summary_line(out)["groups"]]
    assert labels == [
        "agent.backbone=gtrxl agent.dim=64",
        "agent.backbone=gru agent.dim=64",
        "agent.backbone=gru agent.dim=128",
    ]


@DRAWS
def test_seeds_logged_at_other_steps_are_interpolated_and_counted_where_they_span(tmp_path, capsys):
    a = make_run(tmp_path / "a", {0: 0.0, 10: 2.0, 20: 4.0, 30: 6.0}, seed=1)
    b = make_run(tmp_path / "b", {0: 10.0, 20: 20.0}, seed=2)  # fewer points, shorter
    code, _, _ = plot(tmp_path, capsys, str(a), str(b))
    assert code == 0
    (rows,) = read_rows(tmp_path / "c.csv").values()
    by_step = {r["step"]: r for r in rows}
    assert by_step[10]["mean"] == pytest.approx((2.0 + 15.0) / 2)  # b at 10: half-way
    assert by_step[10]["n_seeds"] == 2
    assert (by_step[30]["mean"], by_step[30]["n_seeds"]) == (6.0, 1)  # beyond b's last step


@DRAWS
def test_a_resumed_runs_purged_events_are_not_plotted(tmp_path, capsys):
    """As TensorBoard shows it: events written after the checkpoint a run resumed from are
    replaced by the resumed run's."""
    run = make_run(tmp_path / "a", {0: 0.0, 10: 1.0, 20: 2.0, 30: 3.0}, seed=1)
    with MetricLogger(run, purge_step=20) as logger:
        for step in (20, 30):
            logger.log(step, {EPISODIC_RETURN: -1.0})
    assert plot(tmp_path, capsys, str(run))[0] == 0
    (rows,) = read_rows(tmp_path / "c.csv").values()
    assert [(r["step"], r["mean"]) for r in rows] == [(0, 0.0), (10, 1.0), (20, -1.0), (30, -1.0)]


@DRAWS
def test_another_tag_and_wall_time(tmp_path, capsys):
    run = make_run(tmp_path / "a", {0: 0.0, 10: 1.0}, seed=1, **{"losses/value": 0.5})
    code, out, _ = plot(tmp_path, capsys, str(run), "tag=losses/value", "x=time")
    assert code == 0 and summary_line(out)["tag"] == "losses/value"
    (rows,) = read_rows(tmp_path / "c.csv").values()
    assert rows[0]["step"] == 0.0 and all(r["mean"] == 0.5 for r in rows)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["{empty}"], "error: {empty}: not a run folder (no config.yaml)"),
        (["{run}", "tag=charts/nope"], "error: tag=charts/nope: {run} logged no such scalar; "),
        (["{run}", "x=wall"], "error: x=wall: expected one of: step, time"),
        (["{run}", "tga=charts/x"], "error: tga=charts/x: neither a run folder nor an option"),
        ([], "error: no run folders given"),
    ],
)
def test_bad_arguments_are_one_error_line_with_exit_code_2(tmp_path, capsys, args, expected):
    run = make_run(tmp_path / "run", {0: 1.0}, seed=1)
    (tmp_path / "empty").mkdir()
    names = {"run": str(run), "empty": str(tmp_path / "empty")}
    code, _, err = plot(tmp_path, capsys, *(a.format(**names) for a in args))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(expected.format(**names)), err
    if "tag=" in expected:
        assert "its tags: charts/episodic_return" in err  # what the run has
    assert not (tmp_path / "c.png").exists() and not (tmp_path / "c.csv").exists()


def test_missing_matplotlib_names_the_extra(tmp_path, capsys, monkeypatch):
    run = make_run(tmp_path / "run", {0: 1.0}, seed=1)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    code, _, err = plot(tmp_path, capsys, str(run))
    assert code == 2
    assert (
        err
        == 'error: the PNG needs matplotlib, which is not installed: pip install "rltrans[plot]"\n'
    )
