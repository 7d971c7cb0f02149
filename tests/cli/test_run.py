"""The run context's guarantees (rltrans/run/context.py), through the command-line entry points:
run folders (a finished run is never overwritten by accident, one writer at a time, a dead
writer's lock is taken over, default names never collide), checkpoints whose config names
code to call are refused without running it (older checkpoints that name rltrans's own
classes still load), and a build error leaves no run folder behind."""

from __future__ import annotations

import datetime as dt
import multiprocessing
import os
import signal
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import rltrans.run.context
from rltrans import load_policy
from rltrans.collect import main as collect_main
from rltrans.evaluate import main as evaluate_main
from rltrans.run.checkpoint import CheckpointError, load_checkpoint
from rltrans.run.context import RunFolderLock, default_run_dir, payload_spaces
from rltrans.train import main as train_main
from tests.helpers.cli import TINY_PPO, summary_line

ROOT = Path(__file__).resolve().parents[2]
# T-maze (torch-native, the default env): 2 updates of 4 envs x 16 steps in about a second.
TINY = [*TINY_PPO, "torch_threads=1"]


def overwrite_override() -> str:
    """``overwrite=true``, or ``+overwrite=true`` while configs/train.yaml lacks the key."""
    keys = OmegaConf.load(ROOT / "configs" / "train.yaml").keys()
    return "overwrite=true" if "overwrite" in keys else "+overwrite=true"


def one_error_line(err: str) -> str:
    """The single line a refused command prints on stderr."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def step_files(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").glob("step_*.pt"))


# ----------------------------------------------------------------------------- run folders


def test_fresh_run_into_a_folder_with_checkpoints_is_refused_and_overwrite_replaces_it(
    tmp_path, capsys
):
    run = tmp_path / "run"
    assert train_main([*TINY, "total_steps=64", f"run_dir={run}"]) == 0
    capsys.readouterr()
    last, config = run / "checkpoints" / "last.pt", run / "config.yaml"
    before = {p: p.read_bytes() for p in (last, config)}
    steps_before = step_files(run)

    # The same command again (say, from shell history): refused, nothing touched.
    assert train_main([*TINY, "total_steps=128", "seed=2", f"run_dir={run}"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(run) in line and "resume=true" in line and "overwrite=true" in line
    assert {p: p.read_bytes() for p in (last, config)} == before
    assert step_files(run) == steps_before

    # overwrite=true starts over: nothing of the old run stays.
    args = [*TINY, "total_steps=128", "seed=2", f"run_dir={run}", overwrite_override()]
    assert train_main(args) == 0, capsys.readouterr().err
    assert summary_line(capsys.readouterr().out)["global_step"] == 128
    payload = load_checkpoint(last)
    assert payload["global_step"] == 128 and payload["config"]["seed"] == 2
    assert step_files(run) == ["step_000000000128.pt"]  # the old run's step_64 is gone
    assert OmegaConf.load(config).seed == 2
    assert len(list((run / "tb").glob("events.out.tfevents.*"))) == 1


def _hold_lock(run_dir: str, ready, release) -> None:
    """Child process: take the run folder's lock as a running training would, then wait."""
    lock = RunFolderLock(Path(run_dir))
    lock.acquire()
    ready.send(os.getpid())
    release.recv()  # never answered: the parent SIGKILLs this process
    os._exit(0)


def test_second_run_is_refused_while_the_first_holds_the_folder_and_a_dead_owner_is_taken_over(
    tmp_path, capsys
):
    run = tmp_path / "run"
    run.mkdir()
    ctx = multiprocessing.get_context("fork")
    ready_recv, ready_send = ctx.Pipe(duplex=False)
    release_recv, _release_send = ctx.Pipe(duplex=False)  # held open: the child waits on it
    child = ctx.Process(target=_hold_lock, args=(str(run), ready_send, release_recv))
    child.start()
    try:
        assert ready_recv.poll(30), "the child never took the lock"
        holder = ready_recv.recv()

        assert train_main([*TINY, "total_steps=64", f"run_dir={run}"]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert str(run) in line and "in use" in line and str(holder) in line
        assert run.is_dir() and not (run / "checkpoints").exists()  # the owner's folder stays
    finally:
        os.kill(child.pid, signal.SIGKILL)  # the owner dies without releasing anything
        child.join(30)
    assert child.exitcode == -signal.SIGKILL
    assert (run / ".lock").exists()  # its lock file is left behind; the OS dropped the lock

    assert train_main([*TINY, "total_steps=64", f"run_dir={run}"]) == 0
    assert summary_line(capsys.readouterr().out)["global_step"] == 64
    assert load_checkpoint(run / "checkpoints" / "last.pt")["global_step"] == 64


class _FrozenClock(dt.datetime):
    """datetime whose now() is always the same second."""

    @classmethod
    def now(cls, tz=None):
        return cls(2024, 1, 2, 3, 4, 5)


def test_default_run_folders_started_in_the_same_second_differ(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rltrans.run.context, "datetime", _FrozenClock)
    a, b = default_run_dir("tmaze-gtrxl", 1), default_run_dir("tmaze-gtrxl", 1)
    assert a != b
    assert a.parent == b.parent == Path("runs")
    assert a.name.startswith("tmaze-gtrxl-s1-20240102-030405-")
    assert b.name.startswith("tmaze-gtrxl-s1-20240102-030405-")

    # Two trainings without run_dir, in the same (frozen) second: two folders, both complete.
    monkeypatch.chdir(tmp_path)
    dirs = []
    for _ in range(2):
        assert train_main([*TINY, "total_steps=64", "tensorboard=false"]) == 0
        dirs.append(Path(summary_line(capsys.readouterr().out)["run_dir"]))
    assert dirs[0] != dirs[1]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(d.name for d in dirs)
    for d in dirs:
        assert load_checkpoint(tmp_path / d / "checkpoints" / "last.pt")["global_step"] == 64


# ----------------------------------------------------------------------------- build errors


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["env=gym", "env.id=NoSuchEnv-v0", "agent.heads=2"], ["env", "NoSuchEnv-v0"]),
        (["agent.heads=3"], ["agent.heads", "agent.dim"]),
    ],
    ids=["unknown-env-id", "heads-not-dividing-dim"],
)
def test_build_errors_exit_2_in_one_line_and_leave_no_run_folder(args, names, tmp_path, capsys):
    run = tmp_path / "new" / "run"
    tiny = [a for a in TINY if not a.startswith("agent.heads")]
    assert train_main([*tiny, *args, "total_steps=64", f"run_dir={run}"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert all(name in line for name in names), line
    assert not run.exists()


# ----------------------------------------------------------------------------- checkpoints


@pytest.fixture(scope="module")
def cartpole_checkpoint(tmp_path_factory) -> Path:
    """last.pt of a tiny CartPole run (a kind gym env: evaluate and collect can use it)."""
    run = tmp_path_factory.mktemp("cartpole") / "run"
    args = ["env=gym", "env.id=CartPole-v1", *TINY, "total_steps=64", "tensorboard=false"]
    assert train_main([*args, f"run_dir={run}"]) == 0
    return run / "checkpoints" / "last.pt"


def rewrite_agent_config(source: Path, target: Path, agent: dict) -> Path:
    """A copy of a real checkpoint whose config's agent section is ``agent``, written as an
    attacker would (plain torch.save); it passes torch.load(weights_only=True)."""
    payload = torch.load(source, weights_only=True)
    payload["config"]["agent"] = agent
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, target)
    assert torch.load(target, weights_only=True)["config"]["agent"] == agent
    return target


def _opener(path: Path) -> dict:
    return {"_target_": "builtins.open", "file": str(path), "mode": "w"}


def _hostile_agents(agent: dict, victim: Path) -> dict[str, dict]:
    knobs = {k: v for k, v in agent.items() if k != "kind"}
    opener = _opener(victim)
    encoder = dict(agent["encoder"])
    return {
        "extra-knob": {**agent, "x": opener},
        "top-level-target": {"_target_": "builtins.dict", "x": opener},
        "top-level-open": {"_target_": "builtins.open", "file": str(victim), "mode": "w"},
        "in-a-list": {**agent, "x": [1, {"y": [opener]}]},
        "in-encoder": {**agent, "encoder": {**encoder, "x": opener}},
        "in-encoder-list": {**agent, "encoder": {**encoder, "layers": [{"inner": opener}]}},
        "legacy-target-with-nested": {
            "_target_": "agents.memory_agent.MemoryAgent",
            **knobs,
            "encoder": {**encoder, "x": opener},
        },
        "kind-names-code": {**agent, "kind": "builtins.open"},
    }


HOSTILE = [
    "extra-knob",
    "top-level-target",
    "top-level-open",
    "in-a-list",
    "in-encoder",
    "in-encoder-list",
    "legacy-target-with-nested",
    "kind-names-code",
]


@pytest.mark.parametrize("variant", HOSTILE)
def test_checkpoint_config_naming_code_is_refused_without_running_it(
    variant, cartpole_checkpoint, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    victim = tmp_path / "x.txt"
    agent = load_checkpoint(cartpole_checkpoint)["config"]["agent"]
    assert agent["kind"] == "memory" and "encoder" in agent
    hostile = _hostile_agents(agent, victim)[variant]
    path = rewrite_agent_config(cartpole_checkpoint, tmp_path / "evil" / "last.pt", hostile)

    with pytest.raises(CheckpointError) as caught:
        load_policy(path)
    message = str(caught.value)
    problems = [line for line in message.splitlines() if "checkpoint" in line]
    assert problems and all(str(path) in line for line in problems), message
    assert all("_target_" in line or "kind" in line for line in problems), message

    assert evaluate_main([f"checkpoint={path}", "episodes=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and ("_target_" in err or "agent.kind" in err), err

    args = [f"policy={path}", "dataset_id=rltrans/x-v0", "env_id=CartPole-v1", "episodes=1"]
    assert collect_main([*args, "progress=false"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and ("_target_" in err or "agent.kind" in err), err

    assert not victim.exists()  # nothing named by the file was called
    assert not (tmp_path / "minari").exists() or not any((tmp_path / "minari").rglob("x-v0"))
    assert sorted(p.name for p in tmp_path.iterdir()) in (["evil"], ["evil", "minari"])


@pytest.mark.parametrize(
    "target", ["agents.memory_agent.MemoryAgent", "rltrans.agents.memory_agent.MemoryAgent"]
)
def test_checkpoint_of_the_older_layout_still_loads(target, cartpole_checkpoint, tmp_path, capsys):
    original = load_checkpoint(cartpole_checkpoint)
    agent = original["config"]["agent"]
    legacy = {"_target_": target, **{k: v for k, v in agent.items() if k != "kind"}}
    path = rewrite_agent_config(cartpole_checkpoint, tmp_path / "old" / "last.pt", legacy)

    policy = load_policy(path)
    state = policy.agent.state_dict()
    assert state.keys() == original["model"].keys()
    for name, value in original["model"].items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=0, msg=name)
    obs = torch.zeros(2, 4)
    action, _ = policy.act(obs.numpy(), policy.initial_state(2))
    assert action.shape == (2,)

    assert evaluate_main([f"checkpoint={path}", "episodes=2", "num_envs=2"]) == 0
    assert summary_line(capsys.readouterr().out)["episodes"] == 2


def rewrite_env_config(source: Path, target: Path, **env: object) -> Path:
    """A copy of a real checkpoint whose config's env section has the given entries."""
    payload = torch.load(source, weights_only=True)
    payload["config"]["env"].update(env)
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, target)
    return target


@pytest.mark.parametrize(
    "env",
    [
        {"id": "this:CartPole-v1"},  # importing `this` prints the Zen of Python
        {"wrappers": [{"path": "tests.helpers.kill.KillAtStep"}]},
        {"wrappers": [{"path": "gymnasium.wrappers.RecordVideo", "kwargs": {"video_folder": "v"}}]},
    ],
)
def test_checkpoint_env_config_naming_code_is_refused_unless_trusted(
    env, cartpole_checkpoint, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    path = rewrite_env_config(cartpole_checkpoint, tmp_path / "evil" / "last.pt", **env)
    assert evaluate_main([f"checkpoint={path}", "episodes=1"]) == 2
    captured = capsys.readouterr()
    line = one_error_line(captured.err)
    assert "names code to import" in line and "trust_env_code=true" in line
    assert "Beautiful is better than ugly" not in captured.out  # `this` was never imported
    args = [f"policy={path}", "dataset_id=rltrans/x-v0", "episodes=1", "progress=false"]
    assert collect_main(args) == 2
    assert "names code to import" in one_error_line(capsys.readouterr().err)


def test_trusted_env_code_runs_and_wrapper_paths_must_name_wrapper_classes(
    cartpole_checkpoint, tmp_path, capsys
):
    path = rewrite_env_config(
        cartpole_checkpoint, tmp_path / "a" / "last.pt", id="this:CartPole-v1"
    )
    assert evaluate_main([f"checkpoint={path}", "episodes=1", "trust_env_code=true"]) == 0
    assert "Beautiful is better than ugly" in capsys.readouterr().out
    victim = tmp_path / "x.txt"
    opener = {"path": "builtins.open", "kwargs": {"file": str(victim), "mode": "w"}}
    path = rewrite_env_config(cartpole_checkpoint, tmp_path / "b" / "last.pt", wrappers=[opener])
    assert evaluate_main([f"checkpoint={path}", "episodes=1", "trust_env_code=true"]) == 2
    assert "not a gymnasium.Wrapper subclass" in capsys.readouterr().err
    assert not victim.exists()


def test_format_1_checkpoints_still_load(cartpole_checkpoint, tmp_path, capsys):
    """The layout earlier rltrans wrote: format_version 1, spaces as a description dict plus
    exact JSON under *_json keys, the agent named by an import path."""
    from rltrans.spaces import space_to_dict

    payload = torch.load(cartpole_checkpoint, weights_only=True)
    obs_json, act_json = payload["observation_space"], payload["action_space"]
    spaces = payload_spaces(payload)
    agent = payload["config"]["agent"]
    payload["config"]["agent"] = {
        "_target_": "agents.memory_agent.MemoryAgent",
        **{k: v for k, v in agent.items() if k != "kind"},
    }
    payload.update(
        format_version=1,
        observation_space=space_to_dict(spaces[0]),
        action_space=space_to_dict(spaces[1]),
        observation_space_json=obs_json,
        action_space_json=act_json,
    )
    path = tmp_path / "v1" / "last.pt"
    path.parent.mkdir()
    torch.save(payload, path)
    policy = load_policy(path)
    assert policy.observation_space == spaces[0]
    assert evaluate_main([f"checkpoint={path}", "episodes=2", "num_envs=2"]) == 0
    assert summary_line(capsys.readouterr().out)["episodes"] == 2
