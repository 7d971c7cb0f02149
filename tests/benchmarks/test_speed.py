"""benchmarks/speed.py on CPU: the variations' command line, the paired rounds every whole-run
variation shares, and the in-process setups (the rollout rows, bfloat16, a setup whose
gradient turns non-finite, eager rows that stay eager)."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

from rltrans.learners import NonFiniteLossError
from tests.helpers.scripts import benchmark_script


@pytest.fixture(scope="module")
def speed():
    with benchmark_script("speed") as module:
        yield module


@pytest.fixture(scope="module")
def inprocess(speed):
    return sys.modules["speed_inprocess"]


def test_paired_rounds_alternate_the_order_and_keep_each_rows_results(speed):
    seen = []

    def measure(name, row, r):
        seen.append((r, name))
        return {name: row * (r + 1), **({"b again": -r} if name == "b" else {})}

    results = speed.paired([("a", 1), ("b", 10), ("c", 100)], 3, measure)
    assert seen == [(0, "a"), (0, "b"), (0, "c"), (1, "c"), (1, "b"), (1, "a"),
                    (2, "a"), (2, "b"), (2, "c")]  # fmt: skip
    assert results == {"a": [1, 2, 3], "b": [10, 20, 30], "b again": [0, -1, -2],
                       "c": [100, 200, 300]}  # fmt: skip


def test_a_ratio_is_the_median_of_the_rounds_ratios(speed):
    # round by round: 2.0, 1.0, 4.0 (the ratio of the medians would be 4 / 2 = 2.0 as well,
    # so the second case tells them apart: 3 / 1, 1 / 3, 4 / 1 -> median 3.0, medians 3 / 1)
    assert speed.ratio_median([2, 3, 8], [1, 3, 2]) == 2.0
    assert speed.ratio_median([3, 1, 4], [1, 3, 1]) == 3.0
    with pytest.raises(ValueError):
        speed.ratio_median([1, 2], [1])


def test_the_command_line_names_the_variations(speed, capsys):
    with pytest.raises(SystemExit) as exit_:
        speed.main([])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--vary is required: one of " + ", ".join(speed.VARIATIONS) in err
    with pytest.raises(SystemExit):
        speed.main(["--vary", "warp"])
    assert "invalid choice: 'warp'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # an option of another variation is refused
        speed.main(["--vary", "compile", "--base", "/tmp"])
    assert "unrecognized arguments: --base" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        speed.main(["--vary", "commit", "--help"])
    assert exit_.value.code == 0 and "--base" in capsys.readouterr().out


def test_every_variation_parses_its_defaults(speed, monkeypatch):
    ran = {}
    for name in speed.VARIATIONS:
        monkeypatch.setitem(
            speed.VARIATIONS, name, lambda args, name=name: ran.update({name: args})
        )
    for name in list(speed.VARIATIONS):
        speed.main(["--vary", name, *(["--base", "/tmp"] if name == "commit" else [])])
    assert set(ran) == set(speed.VARIATIONS)
    assert ran["defaults"].flags == [] and ran["flags"].flags == speed.FLAGS
    assert (ran["defaults"].steps, ran["defaults"].rounds) == (25_000, 2)
    assert (ran["runtime"].steps, ran["runtime"].warmup) == (30720, 2560)
    assert ran["compile"].settings == ["auto", "false"]


@pytest.mark.cli
def test_rollout_amp_adds_a_bfloat16_device_row(speed, tmp_path):
    out = tmp_path / "rows.json"
    speed.main(["--vary", "rollout", "--envs", "2", "--agents", "gru", "--updates", "1",
                "--amp", "--out", str(out)])  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    assert [(r["rollout"], r["amp"]) for r in rows] == [
        ("generic", False), ("device", False), ("device", True),
    ]  # fmt: skip
    assert all(r["failed"] is None and r["SPS"] > 0 for r in rows)
    assert rows[0]["x_generic_eager"] == 1.0


def test_the_amp_setup_autocasts_its_learner(inprocess):
    gru = [*inprocess.ROLLOUT_AGENTS["gru"], "env=tmaze", "env.num_envs=2"]
    setup = inprocess.Setup(gru, rollout="device", amp=True)
    assert setup.learner.amp and setup.learner.amp_dtype == torch.bfloat16
    with setup.learner.autocast():
        assert torch.is_autocast_enabled("cpu")
    assert not inprocess.Setup(gru).learner.amp


def test_an_eager_row_is_eager_whatever_the_configs_compile_says(inprocess):
    """The config's compile=auto is a run's choice, not the row's: compiled=False is eager."""
    trxl = [*inprocess.AGENT_ROWS["trxl"], "env=tmaze", *inprocess.SMALL]
    assert not inprocess.Setup(trxl).accel.compiling
    assert inprocess.Setup(trxl, compiled=True).accel.compiling


def test_a_non_finite_gradient_stops_the_setup_and_is_reported(inprocess):
    setup = inprocess.Setup(["agent=gru", "env=tmaze", "env.num_envs=2"])

    def fail(buffer):
        raise NonFiniteLossError("gradient norm is nan; stopping")

    setup.learner.update = fail
    setup.update()
    assert setup.failed == "gradient norm is nan; stopping"
    setup.update()  # a failed setup does nothing more
    assert setup.samples == []
    assert all(math.isnan(v) for v in setup.result().values())
    assert all(math.isnan(v) for v in setup.result("cpu").values())
