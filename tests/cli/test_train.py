"""Command-line training and evaluation: short runs, config errors, resume after SIGKILL,
corrupt and mismatched checkpoints, NaN detection."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from rltrans import load_policy
from rltrans.evaluate import main as evaluate_main
from rltrans.run.checkpoint import load_checkpoint
from rltrans.train import main as train_main
from tests.helpers.cli import TINY_PPO, summary_line

ROOT = Path(__file__).resolve().parents[2]
TINY = [*TINY_PPO, "tensorboard=true"]


def test_short_run_writes_everything_and_evaluates(tmp_path, capsys):
    run = tmp_path / "run"
    assert train_main([*TINY, "total_steps=128", f"run_dir={run}"]) == 0
    summary = summary_line(capsys.readouterr().out)
    assert summary["status"] == "finished" and summary["global_step"] == 128
    assert summary["updates"] == 2
    assert (run / "config.yaml").is_file()
    assert list((run / "tb").glob("events.out.tfevents.*"))
    payload = load_checkpoint(run / "checkpoints" / "last.pt")
    assert payload["global_step"] == 128 and payload["config"]["agent"]["dim"] == 16

    assert evaluate_main([f"checkpoint={run}", "episodes=6"]) == 0
    result = summary_line(capsys.readouterr().out)
    assert result["episodes"] == 6
    assert {"mean_return", "std_return", "mean_length", "success_rate"} <= set(result)

    policy = load_policy(run)
    state = policy.initial_state(3)
    obs = np.zeros((3, 4), dtype=np.float32)
    action, state = policy.act(obs, state, np.ones(3, dtype=bool))
    assert isinstance(action, np.ndarray) and action.shape == (3,)
    assert policy.action_space.contains(action[0])


@pytest.mark.parametrize("agent", ["trxl", "trxl_i", "lstm", "mlp"])
def test_every_agent_config_trains(agent, tmp_path, capsys):
    args = [f"agent={agent}", *TINY, "total_steps=64", f"run_dir={tmp_path}", "tensorboard=false"]
    if agent in ("lstm", "mlp"):
        args = [a for a in args if not a.startswith(("agent.heads", "agent.memory"))]
    assert train_main(args) == 0
    assert summary_line(capsys.readouterr().out)["status"] == "finished"


def test_gymnasium_env_trains(tmp_path, capsys):
    args = ["env=gym", "env.id=CartPole-v1", *TINY, "total_steps=64", f"run_dir={tmp_path}"]
    assert train_main(args) == 0
    assert summary_line(capsys.readouterr().out)["global_step"] == 64


def test_bad_group_choice_lists_valid_ones(capsys):
    assert train_main(["agent=gtrxxl"]) == 2
    err = capsys.readouterr().err
    assert "unknown agent 'gtrxxl'; valid choices: " in err
    assert all(name in err for name in ("gtrxl", "lstm", "mlp", "trxl", "trxl_i"))


def test_unknown_key_lists_valid_keys(capsys):
    assert train_main(["algo.lrr=0.1"]) == 2
    err = capsys.readouterr().err
    assert "unknown config key 'algo.lrr'" in err and "lr," in err and "gamma" in err


def test_unknown_builder_option_names_valid_choices(tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = [*TINY, "agent.position=relative", "total_steps=16", f"run_dir={run_dir}"]
    assert train_main(args) == 2
    err = capsys.readouterr().err
    assert "agent.position=relative" in err and "rotary" in err and "xl" in err
    assert not run_dir.exists()  # refused before anything was built


def test_help_documents_the_knobs(capsys):
    assert train_main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "total_steps" in out and "agent=<option>" in out and "gtrxl" in out


def test_corrupt_checkpoint_gives_clear_error(tmp_path, capsys):
    bad = tmp_path / "last.pt"
    bad.write_bytes(b"not a checkpoint at all")
    assert evaluate_main([f"checkpoint={bad}"]) == 2
    assert "corrupt" in capsys.readouterr().err


def test_resume_with_another_env_is_refused_naming_the_key(tmp_path, capsys):
    assert train_main([*TINY, "total_steps=64", f"run_dir={tmp_path}"]) == 0
    capsys.readouterr()
    args = [
        "env=stateless_cartpole",
        *TINY,
        "total_steps=128",
        f"run_dir={tmp_path}",
        "resume=true",
    ]
    assert train_main(args) == 2
    err = capsys.readouterr().err
    assert "resume=true continues the run's saved config" in err
    assert "env: saved" in err and "stateless_cartpole" in err


class NaNRewardAfter(gym.Wrapper):
    """Test wrapper: rewards become NaN after ``after`` steps (to trigger NaN detection)."""

    def __init__(self, env: gym.Env, after: int = 100) -> None:
        super().__init__(env)
        self.after, self.count = after, 0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.count += 1
        return obs, float("nan") if self.count > self.after else reward, terminated, truncated, info


def test_nan_stops_training_and_keeps_last_good_checkpoint(tmp_path, capsys):
    wrapper = "[{path: tests.cli.test_train.NaNRewardAfter, kwargs: {after: 40}}]"
    args = ["env=gym", f"env.wrappers={wrapper}", *TINY, "total_steps=4096", "checkpoint_every=1"]
    assert train_main([*args, f"run_dir={tmp_path}"]) == 1
    captured = capsys.readouterr()
    assert "training stopped" in captured.err and "Last good checkpoint" in captured.err
    assert summary_line(captured.out)["status"] == "stopped"
    payload = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert all(torch.isfinite(v).all() for v in payload["model"].values())
    assert payload["global_step"] < 4096


def test_sigkill_then_resume_continues_the_step_count(tmp_path):
    run = tmp_path / "run"
    args = [*TINY, "total_steps=100000", "checkpoint_every=1", f"run_dir={run}", "torch_threads=1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rltrans.train", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    ckpts = run / "checkpoints"
    deadline = time.time() + 120
    while time.time() < deadline and len(list(ckpts.glob("step_*.pt"))) < 3:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(list(ckpts.glob("step_*.pt"))) >= 3, proc.stderr.read().decode()
    killed_at = load_checkpoint(ckpts / "last.pt")["global_step"]

    total = killed_at + 2 * 64
    resumed = subprocess.run(
        [
            sys.executable,
            "-m",
            "rltrans.train",
            *args[:-3],
            f"total_steps={total}",
            f"run_dir={run}",
            "resume=true",
            "torch_threads=1",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr
    summary = summary_line(resumed.stdout)
    assert summary["global_step"] == total
    assert load_checkpoint(ckpts / "last.pt")["update"] == total // 64
