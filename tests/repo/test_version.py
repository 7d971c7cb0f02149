"""One version, from one place: ``rltrans.version.__version__`` (``rltrans.__version__``).
The packaging metadata reads it, every command prints it with ``--version``, checkpoints record
it and CHANGELOG.md's newest release names it."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

import rltrans
from rltrans.collect import main as collect_main
from rltrans.evaluate import main as evaluate_main
from rltrans.plot import main as plot_main
from rltrans.train import main as train_main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("main", [train_main, evaluate_main, collect_main, plot_main])
def test_every_command_prints_the_package_version(main, capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"rltrans {rltrans.__version__}\n"


def test_the_packaging_metadata_reads_the_one_version():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in text and 'attr = "rltrans.version.__version__"' in text
    assert not re.search(r"^version\s*=\s*\"", text, re.M), "a second version in pyproject.toml"
    installed = importlib.metadata.version("rltrans")
    assert installed == rltrans.__version__, "reinstall with pip install -e ."


def test_the_changelog_names_the_version_as_its_newest_release():
    text = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", text, re.M)
    assert releases and releases[0] == rltrans.__version__, releases
    assert "## [Unreleased]" in text


def test_a_checkpoint_records_the_version_that_wrote_it(tmp_path):
    run = tmp_path / "run"
    args = ["env=gym", "env.id=CartPole-v1", "agent=mlp", "total_steps=256", "env.num_envs=2"]
    assert train_main([*args, "algo.num_steps=128", f"run_dir={run}", "progress=false"]) == 0
    import torch

    payload = torch.load(run / "checkpoints" / "last.pt", weights_only=False)
    assert payload["rltrans_version"] == rltrans.__version__
