"""Periodic evaluation of online training (algo.eval_every / algo.eval_episodes): the eval/
tags appear every eval_every updates, a run trains exactly the same with or without it (PPO,
IMPALA), a SIGKILLed run with evaluation resumes as an uninterrupted one, and the logged
return is what ``python -m rltrans.evaluate`` plays for the same checkpoint and seed."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from rltrans.evaluate import main as evaluate_main
from rltrans.run.checkpoint import load_checkpoint
from rltrans.train import main as train_main
from rltrans.trainers.common import EVAL_SEED_OFFSET
from tests.cli.test_resume import assert_same_run, deterministic, scalars, wait_for_a_new_second
from tests.cli.test_stop import IMPALA_LOCAL, PPO, PROCESS, Training
from tests.helpers.cli import summary_line

EVAL_TAGS = ("eval/episodic_return", "eval/episodic_length", "eval/success_rate")
EVAL = ["algo.eval_every=2", "algo.eval_episodes=3"]  # 3 episodes on 3 of the 4 envs


def train(args: list[str], run: Path, capsys) -> dict:
    assert train_main([*args, f"run_dir={run}"]) == 0
    return summary_line(capsys.readouterr().out)


def same_weights(a: Path, b: Path) -> bool:
    x = load_checkpoint(a / "checkpoints" / "last.pt")["model"]
    y = load_checkpoint(b / "checkpoints" / "last.pt")["model"]
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in y)


@pytest.mark.parametrize("algo", ["ppo", "impala"])
def test_evaluation_is_logged_every_eval_every_updates_and_changes_no_training(
    algo, tmp_path, capsys
):
    # 5 updates of 64 steps: evaluations after updates 2 and 4 (T-maze: success reported).
    args = [*(PPO if algo == "ppo" else IMPALA_LOCAL), "total_steps=320"]
    if algo == "impala":
        args = [a for a in args if not a.startswith(("env=", "env."))]
        args += ["env=tmaze", "env.num_envs=4"]
    evaluated, plain = tmp_path / "evaluated", tmp_path / "plain"
    summary = train([*args, *EVAL], evaluated, capsys)
    train(args, plain, capsys)

    logged = scalars(evaluated)
    for tag in EVAL_TAGS:
        assert [s for s, _ in logged[tag]] == [128, 256], tag
    assert summary["eval_return"] == pytest.approx(logged["eval/episodic_return"][-1][1])
    assert summary["eval_length"] == pytest.approx(logged["eval/episodic_length"][-1][1])
    assert summary["eval_success_rate"] == pytest.approx(logged["eval/success_rate"][-1][1])

    # The same training: weights, and every deterministic metric but the evaluation's.
    assert same_weights(evaluated, plain)
    trained = {k: v for k, v in deterministic(logged).items() if not k.startswith("eval/")}
    assert trained == deterministic(scalars(plain))


def test_impala_process_learner_evaluates_its_own_agent(tmp_path, capsys):
    args = [*PROCESS, "total_steps=256", "algo.eval_every=2", "algo.eval_episodes=2"]
    summary = train(args, tmp_path / "run", capsys)
    logged = scalars(tmp_path / "run")
    assert [s for s, _ in logged["eval/episodic_return"]] == [128, 256]
    assert summary["eval_return"] == pytest.approx(logged["eval/episodic_return"][-1][1])
    assert "eval_success_rate" not in summary  # CartPole reports no success


def test_sigkill_then_resume_with_evaluation_equals_an_uninterrupted_run(tmp_path, capsys):
    """Evaluation after every update and a checkpoint every 2: killed anywhere after its
    first checkpoint, the run resumes to the same weights and metrics (eval/ ones included)
    as one never killed."""
    args = [*PPO, "checkpoint_every=2", "algo.eval_every=1", "algo.eval_episodes=3"]
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    with Training([*args, "total_steps=64000000", f"run_dir={killed}"], tmp_path) as training:
        training.wait_for_updates(3)
        training.signal(signal.SIGKILL)
        assert training.finish()[0] == -signal.SIGKILL
    saved = load_checkpoint(killed / "checkpoints" / "last.pt")["update"]
    total = f"total_steps={64 * max(saved + 3, 6)}"

    wait_for_a_new_second(killed)
    assert train_main(["resume=true", f"run_dir={killed}", total, "progress=false"]) == 0
    assert train_main([*args, total, f"run_dir={whole}"]) == 0
    capsys.readouterr()
    assert_same_run(killed, whole, checkpoint_step=64 * saved)
    assert "eval/episodic_return" in scalars(whole)


def test_logged_evaluation_is_what_rltrans_evaluate_plays(tmp_path, capsys):
    """The evaluation after the last update plays the final checkpoint's policy: the CLI
    with the evaluation's seed and envs gives the same episodes."""
    run = tmp_path / "run"
    args = [*PPO, "total_steps=384", "algo.eval_every=6", "algo.eval_episodes=6"]
    summary = train(args, run, capsys)
    assert "eval_return" in summary
    seed = 1 + EVAL_SEED_OFFSET  # cfg.seed = 1
    cli = [f"checkpoint={run}", "episodes=6", "num_envs=4", f"seed={seed}", "torch_threads=1"]
    assert evaluate_main(cli) == 0
    played = summary_line(capsys.readouterr().out)
    assert played["mean_return"] == pytest.approx(summary["eval_return"], abs=1e-6)
    assert played["mean_length"] == pytest.approx(summary["eval_length"])
    assert played["success_rate"] == pytest.approx(summary["eval_success_rate"])
