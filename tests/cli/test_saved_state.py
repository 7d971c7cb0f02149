"""Saved trainer state is checked on resume as the docs say: every field a trainer saves (thread
choices, optimizer groups and moments, the scheduler, reward-scaler statistics, counters, RNG
states) out of its bounds is one ``error:`` line naming the checkpoint file, the field, the
value and what is valid, exit code 2, before anything is built or written; and
``load_policy`` checks its ``torch_threads`` and ``device`` as the command line does."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rltrans.trainers.ppo
from rltrans import load_policy
from rltrans.config import ConfigError
from rltrans.run.context import select_device
from rltrans.train import main as train_main
from tests.cli.test_trust import copy_run, edit_checkpoint, error_text
from tests.helpers.cli import TINY_PPO

# One update of TINY_PPO is 4 envs x 16 steps; the run below saved after two.
UPDATE = 64
SAVED_STEPS = 2 * UPDATE


@pytest.fixture(scope="module")
def auto_run(tmp_path_factory) -> Path:
    """A tiny finished PPO run on CartPole with thread tuners (torch_threads=auto) and a
    reward scaler, so its checkpoint holds every part of PPO's trainer state."""
    run = tmp_path_factory.mktemp("state") / "run"
    args = ["env=gym", "env.id=CartPole-v1", *TINY_PPO, f"total_steps={SAVED_STEPS}"]
    args += ["torch_threads=auto", "tensorboard=false", "compile=false"]
    assert train_main([*args, f"run_dir={run}"]) == 0
    return run


def _group(p: dict) -> dict:
    return p["learner"]["optimizer"]["param_groups"][0]


def _moments(p: dict) -> dict:
    return p["learner"]["optimizer"]["state"][0]


def _scaler_var(p: dict) -> None:
    p["reward_scaler"]["var"] = torch.tensor(-1.0, dtype=torch.float64)


def _negative_second_moment(p: dict) -> None:
    _moments(p)["exp_avg_sq"].view(-1)[3] = -2.0  # one value of the first parameter's


# (edit, the error line after "checkpoint <file>: ")
REFUSED = {
    "thread choice": (
        lambda p: p.update(threads={"learner step": {"chosen": 100000, "streams": 1}}),
        "threads['learner step'].chosen=100000: expected null or an integer in [1, 1024]",
    ),
    "string lr": (
        lambda p: _group(p).update(lr="abc"),
        "learner.optimizer.param_groups[0].lr='abc': expected a number >= 0",
    ),
    "nan lr": (
        lambda p: _group(p).update(lr=math.nan),
        "learner.optimizer.param_groups[0].lr=nan: expected a number >= 0",
    ),
    "beta of 1": (
        lambda p: _group(p).update(betas=(1.0, 0.999)),
        "learner.optimizer.param_groups[0].betas[0]=1.0: expected a number in [0, 1)",
    ),
    "maximize": (
        lambda p: _group(p).update(maximize=True),
        "learner.optimizer.param_groups[0].maximize=True: expected False (rltrans never sets it)",
    ),
    "nan moments": (
        lambda p: _moments(p)["exp_avg"].fill_(math.nan),
        "learner.optimizer.state[0].exp_avg holds",
    ),
    "negative second moment": (
        _negative_second_moment,
        "learner.optimizer.state[0].exp_avg_sq holds 1 value(s) that are not a finite number "
        ">= 0 (the first: -2.0)",
    ),
    "missing second moment": (
        lambda p: _moments(p).pop("exp_avg_sq"),
        "learner.optimizer.state[0] lacks 'exp_avg_sq'",
    ),
    "negative step": (
        lambda p: _moments(p)["step"].fill_(-1.0),
        "learner.optimizer.state[0].step=-1.0: expected a finite number in [0, 2^53)",
    ),
    "scheduler attribute": (
        lambda p: p["learner"]["scheduler"].update(optimizer="x"),
        "learner.scheduler holds 'optimizer', which rltrans never saves",
    ),
    "negative variance": (
        _scaler_var,
        "reward_scaler.var=-1.0: expected a finite number >= 0",
    ),
    "update -1": (lambda p: p.update(update=-1), "update=-1: expected an integer in [0, 2^53)"),
    "update 10^15": (
        lambda p: p.update(update=10**15),
        f"update={10**15} is more than global_step={SAVED_STEPS}: every update takes at least "
        "one step",
    ),
    "global_step 2^62": (
        lambda p: p.update(global_step=2**62),
        f"global_step={2**62}: expected an integer in [0, 2^53)",
    ),
    "compile choice": (
        lambda p: p.update(compile="fast"),
        "compile='fast': expected null or one of: compiled, eager",
    ),
    "numpy position": (
        lambda p: p["rng"]["numpy"].update(pos=10**6),
        "rng.numpy.pos=1000000: expected an integer in [0, 624]",
    ),
    "python rng index": (
        lambda p: p["rng"]["python"]["state"].__setitem__(-1, 700),
        "rng.python: not a valid python generator state",
    ),
    "episodes seen": (
        lambda p: p["episodes"].update(episodes_seen=-3),
        "episodes.episodes_seen=-3: expected an integer in [0, 2^53)",
    ),
}


def _files(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*") if p.is_file()}


def _resume(run: Path) -> tuple[int, str]:
    """Resume ``run`` for one more update in a fresh process (some of these values crashed the
    process itself: a segfault must fail the test, not end the test session)."""
    line = ["resume=true", f"run_dir={run}", f"total_steps={SAVED_STEPS + UPDATE}"]
    done = subprocess.run(
        [sys.executable, "-m", "rltrans.train", *line],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stderr


# Values that crashed the process itself (a segfault): checked in a fresh process.
CRASHED = ("thread choice", "numpy position")


@pytest.mark.parametrize("case", CRASHED)
def test_a_saved_value_that_crashed_the_process_is_one_error(case, auto_run, tmp_path):
    edit, expected = REFUSED[case]
    run = copy_run(auto_run, tmp_path / "run")
    last = edit_checkpoint(run / "checkpoints" / "last.pt", edit)
    before = _files(run)
    code, err = _resume(run)
    assert code == 2, err
    assert err == f"error: checkpoint {last}: {expected}\n"
    assert _files(run) == before  # nothing written: refused before the run folder is taken


@pytest.mark.parametrize("case", sorted(set(REFUSED) - set(CRASHED)))
def test_every_saved_trainer_state_field_is_checked_before_anything_is_built(
    case, auto_run, tmp_path, capsys, monkeypatch
):
    edit, expected = REFUSED[case]
    run = copy_run(auto_run, tmp_path / "run")
    last = edit_checkpoint(run / "checkpoints" / "last.pt", edit)
    before = _files(run)
    built = []
    make_env = rltrans.trainers.ppo.make_env
    monkeypatch.setattr(
        rltrans.trainers.ppo, "make_env", lambda *a, **k: built.append(a) or make_env(*a, **k)
    )
    assert train_main(["resume=true", f"run_dir={run}", f"total_steps={SAVED_STEPS + UPDATE}"]) == 2
    err = error_text(capsys)
    assert err.startswith(f"error: checkpoint {last}: {expected}"), err
    assert len(err.splitlines()) == 1, err
    assert not built  # no env, agent or learner
    assert _files(run) == before


def test_moments_of_another_shape_are_refused_before_the_first_step(auto_run, tmp_path):
    # A fused AdamW step over a moment of 3 values for a parameter of thousands corrupts
    # the heap; the optimizer loads it without a look.
    run = copy_run(auto_run, tmp_path / "run")
    last = edit_checkpoint(
        run / "checkpoints" / "last.pt", lambda p: _moments(p).update(exp_avg=torch.zeros(3))
    )
    code, err = _resume(run)
    assert code == 2, err
    assert err.startswith(f"error: checkpoint {last}: its saved state does not load ("), err
    assert "learner.optimizer.state[0].exp_avg has shape (3,), its parameter (" in err
    assert len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        # The saved groups replace the built ones whole: a missing lr failed at the first step.
        (
            lambda p: _group(p).pop("lr"),
            "its saved state does not load (learner.optimizer.param_groups[0] lacks 'lr')",
        ),
        # The episode window's own check (101 returns for a window of 100) names the file too.
        (
            lambda p: p["episodes"].update(returns=[1.0] * 101),
            "its saved state does not load (episodes.returns: expected a list of at most 100",
        ),
    ],
)
def test_state_refused_as_it_loads_names_the_checkpoint(edit, expected, auto_run, tmp_path, capsys):
    run = copy_run(auto_run, tmp_path / "run")
    last = edit_checkpoint(run / "checkpoints" / "last.pt", edit)
    assert train_main(["resume=true", f"run_dir={run}", f"total_steps={SAVED_STEPS + UPDATE}"]) == 2
    err = error_text(capsys)
    assert err.startswith(f"error: checkpoint {last}: {expected}"), err
    assert len(err.splitlines()) == 1, err


def test_an_untouched_checkpoint_still_resumes(auto_run, tmp_path):
    run = copy_run(auto_run, tmp_path / "run")
    code, err = _resume(run)
    assert code == 0, err


# ----------------------------------------------------------------------------- load_policy


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"torch_threads": 100000}, "torch_threads=100000: expected null or auto or an integer"),
        (
            {"torch_threads": -1},
            "torch_threads=-1: expected null or auto or an integer in [0, 1024]",
        ),
        ({"torch_threads": "abc"}, "torch_threads=abc: expected"),
        ({"torch_threads": True}, "torch_threads=true: expected"),
        ({"device": "gpu"}, "device=gpu: expected auto, cpu, cuda or cuda:<index>"),
    ],
)
def test_load_policy_checks_its_arguments_as_the_command_line_does(
    kwargs, expected, auto_run, monkeypatch
):
    threads = torch.get_num_threads()
    monkeypatch.setattr("rltrans.policy.load_checkpoint", lambda *a, **k: pytest.fail("read"))
    with pytest.raises(ConfigError, match=f"^{re.escape(expected)}"):
        load_policy(auto_run, **kwargs)
    assert torch.get_num_threads() == threads  # refused before anything was set


def test_load_policy_with_too_many_threads_is_an_error_not_a_crash(auto_run):
    # torch.set_num_threads(100000) aborts the process inside the OpenMP runtime.
    code = (
        "import rltrans, sys\n"
        "try:\n"
        f"    rltrans.load_policy({str(auto_run)!r}, torch_threads=100000)\n"
        "except ValueError as err:\n"
        "    print(type(err).__name__, err); sys.exit(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr
    assert done.stdout.startswith("ConfigError torch_threads=100000: expected"), done.stdout


def test_load_policy_on_a_missing_cuda_device_names_the_device(auto_run):
    with pytest.raises(ConfigError) as caught:
        load_policy(auto_run, device="cuda:7")
    text = str(caught.value)
    if not torch.cuda.is_available():
        assert text == "device=cuda:7 but torch sees no CUDA device; use device=cpu or auto"
    elif torch.cuda.device_count() <= 7:
        assert text.startswith("device=cuda:7: no such device; torch sees ")
    assert "corrupt" not in text


def test_a_cuda_index_past_the_devices_is_no_such_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"^device=cuda:7: no such device; torch sees 1 CUDA "):
        select_device("cuda:7")
    assert select_device("cuda:0") == torch.device("cuda", 0)
