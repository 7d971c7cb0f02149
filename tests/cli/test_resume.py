"""Resume: a run SIGKILLed between two checkpoints and resumed ends exactly as the same run
uninterrupted (weights and logged metrics, PPO and offline DT), its TensorBoard steps stay
unique and increasing, and a resume continues the run's SAVED config (only the budget and
logging may change; other differences are refused naming the keys)."""

from __future__ import annotations

import copy
import itertools
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from rltrans.collect import main as collect_main
from rltrans.run.checkpoint import load_checkpoint
from rltrans.run.context import Run
from rltrans.train import main as train_main
from rltrans.trainers import ppo as ppo_trainer
from tests.helpers.cli import TINY_PPO, summary_line
from tests.helpers.kill import KILL_ENV

ROOT = Path(__file__).resolve().parents[2]
KILLER = "env.wrappers=[{path: tests.helpers.kill.KillAtStep}]"
PPO_TINY = [*TINY_PPO, "torch_threads=1"]
# Wall-clock metrics differ between any two runs; everything else must be identical.
WALL_CLOCK = re.compile(r"^(charts/SPS|perf/)")


def scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of a run as TensorBoard shows it: (step, value) in file order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def deterministic(curves: dict[str, list[tuple[int, float]]]) -> dict:
    return {tag: points for tag, points in curves.items() if not WALL_CLOCK.match(tag)}


def run_killed(args: list[str], kill_at: int, cwd: Path, extra_env: dict | None = None) -> None:
    """Train in a subprocess whose env wrapper SIGKILLs it at env step ``kill_at``."""
    env = {
        **os.environ,
        **(extra_env or {}),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        KILL_ENV: str(kill_at),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "rltrans.train", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == -9, f"expected SIGKILL, got {proc.returncode}:\n{proc.stderr}"


def wait_for_a_new_second(run: Path) -> None:
    """TensorBoard reads a folder's event files in name order, and a name holds the writer's
    start second and then its pid: a resumed writer started in the same second as the
    killed one could sort before it. Real resumes come seconds later; make sure here."""
    stamps = [int(p.name.split(".")[3]) for p in (run / "tb").glob("events.out.tfevents.*")]
    while stamps and int(time.time()) <= max(stamps):
        time.sleep(0.05)


def assert_same_run(resumed: Path, uninterrupted: Path, checkpoint_step: int) -> None:
    """Same final weights (exactly) and the same deterministic metrics at the same steps; the
    resumed run's steps strictly increase per tag (nothing logged twice after the kill)."""
    a = load_checkpoint(resumed / "checkpoints" / "last.pt")
    b = load_checkpoint(uninterrupted / "checkpoints" / "last.pt")
    assert a["global_step"] == b["global_step"]
    assert a["model"].keys() == b["model"].keys()
    for name, value in b["model"].items():
        torch.testing.assert_close(a["model"][name], value, rtol=0, atol=0, msg=name)

    got, want = scalars(resumed), scalars(uninterrupted)
    for tag, points in got.items():
        steps = [s for s, _ in points]
        assert all(x < y for x, y in itertools.pairwise(steps)), (tag, steps)
    got, want = deterministic(got), deterministic(want)
    assert got.keys() == want.keys()
    for tag in sorted(want):
        at_checkpoint = [p for p in want[tag] if p[0] == checkpoint_step]
        assert got[tag] == want[tag], (
            f"{tag}: resumed {got[tag]} != uninterrupted {want[tag]} (checkpoint at step "
            f"{checkpoint_step}, uninterrupted logged {at_checkpoint} there)"
        )


# ----------------------------------------------------------------------------- PPO


def test_ppo_sigkill_between_checkpoints_then_resume_equals_an_uninterrupted_run(tmp_path):
    # 5 updates of 64 steps, checkpoints after updates 2 and 4 (and at the end). The killed
    # run dies in update 4's rollout: it logged update 3 (step 192) after its last
    # checkpoint (step 128), which the resumed run logs again.
    steps = 16  # algo.num_steps: env steps per sub-env per update
    args = ["env=gym", "env.id=CartPole-v1", KILLER, *PPO_TINY, "total_steps=320"]
    # agent.horizon=null: auto's random-action episodes would count towards the kill step
    args += ["checkpoint_every=2", "agent.horizon=null"]
    killed, whole = tmp_path / "killed", tmp_path / "whole"

    run_killed([*args, f"run_dir={killed}"], kill_at=3 * steps + 5, cwd=tmp_path)
    assert load_checkpoint(killed / "checkpoints" / "last.pt")["global_step"] == 128
    assert sorted(p.name for p in (killed / "checkpoints").glob("step_*.pt")) == [
        "step_000000000128.pt"
    ]
    logged = scalars(killed)["losses/value"]
    assert [s for s, _ in logged] == [64, 128, 192]  # the purge has something to do

    wait_for_a_new_second(killed)
    assert train_main([*args, f"run_dir={killed}", "resume=true"]) == 0
    assert train_main([*args, f"run_dir={whole}"]) == 0
    assert_same_run(killed, whole, checkpoint_step=128)


# ----------------------------------------------------------------------------- offline

LIMIT = 40  # CartPole step limit of the dataset and of the evaluation env


@pytest.fixture
def dataset(tmp_path, monkeypatch, capsys) -> str:
    """rltrans/cp-resume-v0: scripted and random CartPole episodes, written by the CLI."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    args = [
        "dataset_id=rltrans/cp-resume-v0",
        "env_id=CartPole-v1",
        "policy=rltrans.envs.scripted:CartPoleController",
        "epsilon=[0,1]",
        "episodes=8",
        "num_envs=4",
        f"max_episode_steps={LIMIT}",
        "progress=false",
    ]
    assert collect_main(args) == 0
    where = tmp_path / "minari" / "rltrans" / "cp-resume-v0"  # said before it collects
    assert f"collecting rltrans/cp-resume-v0 into {where} ($MINARI_DATASETS_PATH)" in (
        capsys.readouterr().err
    )
    return "rltrans/cp-resume-v0"


OFFLINE_TINY = {
    "dt": ["agent.dim=16", "agent.layers=1", "agent.context=4"],
    "bc": ["agent.dim=16", "agent.layers=1", "agent.history=4"],
}


def offline_killable(agent: str, dataset: str, *schedule: str) -> list[str]:
    """A tiny 6-step offline run whose evaluations (one episode, target 40) step the killing
    env; ``schedule``: its evaluation and checkpoint knobs."""
    return [
        f"agent={agent}",
        f"dataset={dataset}",
        "env=gym",
        "env.id=CartPole-v1",
        "env.num_envs=1",  # = targets x episodes, as the trainer saves it
        f"env.kwargs={{max_episode_steps: {LIMIT}}}",
        KILLER,
        *OFFLINE_TINY[agent],
        "algo.batch_size=8",
        "algo.log_every=1",
        *schedule,
        "algo.eval_episodes=1",
        f"algo.eval_targets=[{LIMIT}]",
        "progress=false",
        "torch_threads=1",
        "train_steps=6",
    ]


@pytest.mark.parametrize("agent", ["dt", "bc"])
def test_offline_sigkill_between_checkpoints_then_resume_equals_an_uninterrupted_run(
    agent, dataset, tmp_path, capsys
):
    # 6 gradient steps, losses logged every step, an evaluation (one episode, target 40) and
    # a checkpoint every 2 steps. The evaluation env carries the killer: the killed run dies
    # on the first env step of its second evaluation (step 4), after its first checkpoint
    # (step 2) and after logging the losses of steps 3 and 4.
    args = offline_killable(agent, dataset, "algo.eval_every=2")
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    assert train_main([*args, f"run_dir={whole}"]) == 0
    capsys.readouterr()
    first_eval = scalars(whole)["eval/length_mean"]
    assert [s for s, _ in first_eval] == [2, 4, 6]
    first_length = int(first_eval[0][1])  # env steps of the first evaluation

    minari = {"MINARI_DATASETS_PATH": os.environ["MINARI_DATASETS_PATH"]}
    run_killed(
        [*args, f"run_dir={killed}"], kill_at=first_length + 1, cwd=tmp_path, extra_env=minari
    )
    assert load_checkpoint(killed / "checkpoints" / "last.pt")["global_step"] == 2
    logged = scalars(killed)
    assert [s for s, _ in logged["losses/action"]] == [1, 2, 3, 4]
    assert [s for s, _ in logged["eval/return_mean"]] == [2]

    wait_for_a_new_second(killed)
    assert train_main([*args, f"run_dir={killed}", "resume=true"]) == 0
    assert summary_line(capsys.readouterr().out)["train_steps"] == 6
    assert_same_run(killed, whole, checkpoint_step=2)


def test_offline_sigkill_in_a_run_that_evaluates_only_at_its_end_loses_at_most_save_every(
    dataset, tmp_path, capsys
):
    # 6 gradient steps, evaluated only at the end (algo.eval_every=0), a checkpoint every 2
    # steps (algo.save_every=2). The killed run dies on the first env step of its final
    # evaluation: its newest checkpoint is step 4, and the resumed run redoes steps 5 and 6.
    args = offline_killable("dt", dataset, "algo.eval_every=0", "algo.save_every=2")
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    assert train_main([*args, f"run_dir={whole}"]) == 0
    capsys.readouterr()
    minari = {"MINARI_DATASETS_PATH": os.environ["MINARI_DATASETS_PATH"]}
    run_killed([*args, f"run_dir={killed}"], kill_at=1, cwd=tmp_path, extra_env=minari)
    assert load_checkpoint(killed / "checkpoints" / "last.pt")["global_step"] == 4
    assert [s for s, _ in scalars(killed)["losses/action"]] == [1, 2, 3, 4, 5, 6]

    wait_for_a_new_second(killed)
    assert train_main([*args, f"run_dir={killed}", "resume=true"]) == 0
    assert summary_line(capsys.readouterr().out)["train_steps"] == 6
    assert_same_run(killed, whole, checkpoint_step=4)


def test_offline_resume_with_the_original_command_line_is_accepted(dataset, tmp_path, capsys):
    """Repeating a run's own command line with resume=true is no config change, also when it
    picks the evaluation env (the trainer saves env.num_envs = targets x episodes)."""
    run = tmp_path / "run"
    args = ["agent=bc", f"dataset={dataset}", *OFFLINE_TINY["bc"], "algo.batch_size=8"]
    args += ["env=gym", "env.id=CartPole-v1", f"env.kwargs={{max_episode_steps: {LIMIT}}}"]
    args += ["algo.eval_episodes=1", f"algo.eval_targets=[{LIMIT}]", "progress=false"]
    assert train_main([*args, "train_steps=2", f"run_dir={run}"]) == 0
    capsys.readouterr()
    assert train_main([*args, "train_steps=4", f"run_dir={run}", "resume=true"]) == 0, (
        capsys.readouterr().err
    )
    assert summary_line(capsys.readouterr().out)["train_steps"] == 4


def test_offline_resume_with_only_the_run_folder_continues_the_saved_run(dataset, tmp_path, capsys):
    """``resume=true run_dir=<run>`` alone continues an offline (BC) run as it was: the
    trainer, like everything else, comes from the saved config."""
    run = tmp_path / "run"
    args = ["agent=bc", f"dataset={dataset}", *OFFLINE_TINY["bc"], "algo.batch_size=8"]
    args += ["algo.eval_episodes=0", "progress=false", "torch_threads=1"]
    assert train_main([*args, "train_steps=2", f"run_dir={run}"]) == 0
    capsys.readouterr()
    assert train_main(["resume=true", f"run_dir={run}", "train_steps=4"]) == 0, (
        capsys.readouterr().err
    )
    assert summary_line(capsys.readouterr().out)["train_steps"] == 4
    payload = load_checkpoint(run / "checkpoints" / "last.pt")
    assert payload["global_step"] == 4 and payload["config"]["agent"]["kind"] == "bc"


# ----------------------------------------------------------------------------- saved config


class Interrupted(Exception):
    """Raised by the patched Run.save_payload right after the first checkpoint is written."""


def test_resume_continues_the_saved_config_and_refuses_other_changes(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    built = []
    real_make_env = ppo_trainer.make_env

    def recording_make_env(cfg, **kwargs):
        built.append(copy.deepcopy(cfg))  # the trainer hands plain data
        return real_make_env(cfg, **kwargs)

    monkeypatch.setattr(ppo_trainer, "make_env", recording_make_env)

    # A T-maze run of corridor length 4 (default 10), stopped right after its first checkpoint.
    real_save = Run.save_payload

    def save_then_stop(self, step, *args, **kwargs):
        real_save(self, step, *args, **kwargs)
        raise Interrupted

    args = ["env=tmaze", "env.kwargs.length=4", *PPO_TINY, "total_steps=128"]
    with monkeypatch.context() as patch:
        patch.setattr(Run, "save_payload", save_then_stop)
        with pytest.raises(Interrupted):
            train_main([*args, "checkpoint_every=1", f"run_dir={run}"])
    capsys.readouterr()
    assert load_checkpoint(run / "checkpoints" / "last.pt")["global_step"] == 64
    assert built[-1]["kwargs"]["length"] == 4

    # resume=true run_dir=... alone: the saved run, length 4 and all, continues to its end.
    assert train_main(["resume=true", f"run_dir={run}"]) == 0
    captured = capsys.readouterr()
    assert summary_line(captured.out)["global_step"] == 128, captured.err
    assert built[-1]["kwargs"]["length"] == 4
    saved = OmegaConf.load(run / "config.yaml")
    assert saved.env.kwargs.length == 4 and saved.agent.dim == 16 and saved.total_steps == 128
    payload = load_checkpoint(run / "checkpoints" / "last.pt")
    assert payload["global_step"] == 128 and payload["config"]["env"]["kwargs"]["length"] == 4

    # Any other change is refused, naming each key with its saved and given values.
    before = (run / "checkpoints" / "last.pt").read_bytes(), (run / "config.yaml").read_bytes()
    for change, expected in [
        (["env.kwargs.length=6"], ["env.kwargs.length: saved 4, given 6"]),
        (["agent.dim=32"], ["agent.dim: saved 16, given 32"]),
        (
            ["env.kwargs.length=6", "agent.dim=32", "total_steps=192"],
            ["env.kwargs.length: saved 4, given 6", "agent.dim: saved 16, given 32"],
        ),
    ]:
        assert train_main(["resume=true", f"run_dir={run}", *change]) == 2
        err = capsys.readouterr().err
        assert all(line in err for line in expected), err
        assert "total_steps" not in err.split("Only")[0]  # a resumable key is no difference
    after = (run / "checkpoints" / "last.pt").read_bytes(), (run / "config.yaml").read_bytes()
    assert after == before

    # Only a larger budget: continues to it, still on the saved corridor.
    assert train_main(["resume=true", f"run_dir={run}", "total_steps=192"]) == 0
    assert summary_line(capsys.readouterr().out)["global_step"] == 192
    assert built[-1]["kwargs"]["length"] == 4
    saved = OmegaConf.load(run / "config.yaml")
    assert saved.total_steps == 192 and saved.env.kwargs.length == 4
    assert load_checkpoint(run / "checkpoints" / "last.pt")["global_step"] == 192
