"""A run folder written by release 0.2.0 (tests/data/release_0_2_0/ppo: a 2-update PPO run on
the T-maze, tiny model, seed 5) still evaluates to the returns 0.2.0 gave and resumes to the
weights 0.2.0's own resume reached. The figures were measured with 0.2.0 on this folder:

    python -m rltrans.evaluate checkpoint=<folder> episodes=16 deterministic=false seed=3
    python -m rltrans.train resume=true run_dir=<copy> total_steps=256 torch_threads=1
"""

import math
import shutil
from pathlib import Path

from rltrans.evaluate import main as evaluate_main
from rltrans.run.checkpoint import load_checkpoint
from rltrans.train import main as train_main
from tests.helpers.cli import summary_line

RELEASE_RUN = Path(__file__).resolve().parents[1] / "data" / "release_0_2_0" / "ppo"
EVALUATED = {"mean_return": -1.68125, "std_return": 0.146709, "mean_length": 22.0}
RESUMED_WEIGHT_SUM = -3.17631579161025  # sum of every float tensor of the model at step 256


def _copy(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(RELEASE_RUN, run)
    return run


def test_a_release_checkpoint_evaluates_to_its_returns(tmp_path, capsys):
    run = _copy(tmp_path)
    args = [f"checkpoint={run}", "episodes=16", "deterministic=false", "seed=3"]
    assert evaluate_main([*args, "torch_threads=1", "progress=false"]) == 0
    result = summary_line(capsys.readouterr().out)
    for key, value in EVALUATED.items():
        assert math.isclose(result[key], value, rel_tol=1e-5), (key, result[key], value)


def test_a_release_run_resumes_to_the_weights_the_release_reached(tmp_path, capsys):
    run = _copy(tmp_path)
    args = ["resume=true", f"run_dir={run}", "total_steps=256", "torch_threads=1"]
    assert train_main(args) == 0
    summary = summary_line(capsys.readouterr().out)
    assert summary["status"] == "finished" and summary["global_step"] == 256
    model = load_checkpoint(run / "checkpoints" / "last.pt")["model"]
    total = sum(float(v.double().sum()) for v in model.values() if v.is_floating_point())
    assert math.isclose(total, RESUMED_WEIGHT_SUM, rel_tol=1e-6), total
