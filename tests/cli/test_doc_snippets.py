"""The evaluate guide's Python example (``load_policy`` in a Gymnasium loop) runs as written on
a checkpoint of a tiny CartPole run and prints what a user checks it by: how many episodes
ended and their mean return. (``-m docs`` runs every marked example; this one also holds the
printed line to its promised form, in the default run.)"""

from __future__ import annotations

import re
import runpy
from pathlib import Path

from rltrans.train import main as train_main

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "evaluate.md"


def python_block(section: str) -> str:
    """The first ```python block after the heading ``section``."""
    text = GUIDE.read_text()
    start = text.index(f"\n## {section}\n")
    return re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)


def test_the_load_policy_example_acts_and_prints_its_episodes(tmp_path, capsys, monkeypatch):
    run = tmp_path / "runs" / "cartpole"
    args = ["env=gym", "env.id=CartPole-v1", "agent=mlp", "total_steps=1024", "progress=false"]
    assert train_main([*args, f"run_dir={run}", "torch_threads=1"]) == 0
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)  # the example names runs/cartpole
    script = tmp_path / "example.py"
    script.write_text(python_block("Try it: train CartPole, evaluate, act from Python"))
    runpy.run_path(str(script))
    out = capsys.readouterr().out
    assert re.fullmatch(r"\d+ episodes, mean return \d+\.\d\n", out), out
    assert int(out.split()[0]) >= 4  # 4 envs x 500 steps: every env ends at least once
