"""Trainers and the horizon fit read of an env only what every Gymnasium vector env exposes:
its spaces, its size, its time limits and its methods. A torch-native task's own class
attributes stay inside envs/, so an agent learns a user's env by the path rltrans's tasks take.

Every attribute read on a torch env from code outside envs/ (and outside Gymnasium's own
VectorEnv base) is recorded while a run trains; any name beyond the facts fails the test. A
user's Gymnasium env is read through Gymnasium alone: ``agent.horizon=auto`` steps it to observe
its episodes' length, and reads nothing of it directly.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gymnasium
import pytest
import yaml

import rltrans.envs.torch_envs.base as base
from rltrans.envs.torch_envs.base import TorchVectorEnv
from rltrans.train import main as train_main
from tests.helpers.user_envs import EPISODES_ID, Episodes

ENVS_DIR = str(Path(base.__file__).resolve().parents[1])
GYMNASIUM_DIR = str(Path(gymnasium.__file__).resolve().parent)
# What any Gymnasium vector env exposes, plus where a torch env's tensors live.
FACTS = {
    "reset", "step", "close", "render", "num_envs", "single_observation_space",
    "single_action_space", "observation_space", "action_space", "metadata", "spec",
    "render_mode", "unwrapped", "time_limit", "max_episode_steps", "device",
}  # fmt: skip


@pytest.fixture
def reads(monkeypatch) -> set[tuple[str, str]]:
    """(attribute, file) of every attribute read on a torch env from outside envs/."""
    seen: set[tuple[str, str]] = set()
    plain = TorchVectorEnv.__getattribute__

    def recording(self, name):
        where = sys._getframe(1).f_code.co_filename
        if not where.startswith((ENVS_DIR, GYMNASIUM_DIR)):
            seen.add((name, Path(where).name))
        return plain(self, name)

    monkeypatch.setattr(TorchVectorEnv, "__getattribute__", recording)
    return seen


def test_the_recorder_sees_a_read_of_a_task_attribute(reads):
    from rltrans.envs.torch_envs import make_torch_env

    env = make_torch_env("count_recall", 1)
    assert env.popgym_presets
    assert ("popgym_presets", Path(__file__).name) in reads


TRAINING = ["total_steps=512", "env.num_envs=4", "progress=false", "torch_threads=1"]
TRAINING += ["compile=false", "algo.eval_every=1"]  # agent.horizon=auto: the fit reads too


@pytest.mark.cli
@pytest.mark.parametrize(
    "algo", [["algo=ppo", "algo.num_steps=64"], ["algo=impala", "algo.num_steps=32"]]
)
@pytest.mark.parametrize("env", ["count_recall", "passive_tmaze", "repeat_first"])
def test_trainers_and_the_horizon_fit_read_only_the_facts_of_an_env(reads, algo, env, tmp_path):
    assert train_main([f"env={env}", *algo, *TRAINING, f"run_dir={tmp_path}"]) == 0
    assert reads, "nothing recorded: the recorder is not in the path"
    beyond = sorted((name, where) for name, where in reads if name not in FACTS)
    assert not beyond, f"task attributes read outside envs/: {beyond}"


@pytest.fixture
def gym_reads(monkeypatch) -> set[tuple[str, str]]:
    """(attribute, file) of every attribute read on a user's Gymnasium env from outside envs/,
    Gymnasium and the env's own code."""
    seen: set[tuple[str, str]] = set()
    plain = gymnasium.Env.__getattribute__

    own = {f.__code__ for f in vars(Episodes).values() if callable(f) and hasattr(f, "__code__")}

    def recording(self, name):
        caller = sys._getframe(1).f_code
        if not caller.co_filename.startswith((ENVS_DIR, GYMNASIUM_DIR)) and caller not in own:
            seen.add((name, Path(caller.co_filename).name))
        return plain(self, name)

    monkeypatch.setattr(Episodes, "__getattribute__", recording)
    return seen


def test_the_gym_recorder_sees_a_read_of_a_hint(gym_reads):
    assert gymnasium.make(EPISODES_ID).unwrapped.myopic
    assert ("myopic", Path(__file__).name) in gym_reads


@pytest.mark.cli
def test_the_horizon_probe_and_the_trainer_read_a_users_env_through_gymnasium_only(
    gym_reads, tmp_path
):
    """The probe steps a user's env to observe its episodes' length (20 here) and reads
    nothing of it beyond Gymnasium's methods: its hint stays unread."""
    env = ["env=gym", f"env.id={EPISODES_ID}", "env.kwargs.length=20", "algo.num_steps=64"]
    assert train_main([*env, *TRAINING, f"run_dir={tmp_path}"]) == 0
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["agent"]["horizon"] == 20
    assert not gym_reads, f"read on a user's env outside Gymnasium: {sorted(gym_reads)}"
