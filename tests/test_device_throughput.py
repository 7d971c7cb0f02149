"""benchmarks/device_throughput.py on CPU: its rows (generic, device, and with ``--amp`` the
device path under bfloat16 autocast) and a setup whose gradient turns non-finite."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from rltrans.learners import NonFiniteLossError

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "device_throughput.py"


@pytest.fixture
def module(monkeypatch):
    """benchmarks/device_throughput.py imported as a module."""
    spec = importlib.util.spec_from_file_location("device_throughput", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "device_throughput", mod)
    spec.loader.exec_module(mod)
    return mod


def test_amp_adds_a_bfloat16_device_row(module, monkeypatch, tmp_path):
    out = tmp_path / "rows.json"
    argv = ["device_throughput.py", "--envs", "2", "--agents", "gru", "--updates", "1", "--amp"]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(out)])
    module.main()
    rows = json.loads(out.read_text())["rows"]
    assert [(r["rollout"], r["amp"]) for r in rows] == [
        ("generic", False), ("device", False), ("device", True),
    ]  # fmt: skip
    assert all(r["failed"] is None and r["SPS"] > 0 for r in rows)
    assert rows[0]["x_generic_eager"] == 1.0


def test_the_amp_setup_autocasts_its_learner(module):
    setup = module.Setup("gru", "tmaze", 2, "device", False, "cpu", amp=True)
    assert setup.learner.amp and setup.learner.amp_dtype == torch.bfloat16
    with setup.learner.autocast():
        assert torch.is_autocast_enabled("cpu")
    plain = module.Setup("gru", "tmaze", 2, "device", False, "cpu")
    assert not plain.learner.amp


def test_a_non_finite_gradient_stops_the_setup_and_is_reported(module):
    setup = module.Setup("gru", "tmaze", 2, "generic", False, "cpu")

    def fail(buffer):
        raise NonFiniteLossError("gradient norm is nan; stopping")

    setup.learner.update = fail
    setup.update()
    assert setup.failed == "gradient norm is nan; stopping"
    setup.update()  # a failed setup does nothing more
    assert setup.samples == []
    assert all(math.isnan(v) for v in setup.result().values())
