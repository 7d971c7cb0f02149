"""Trainers and the horizon fit read of an env only what every Gymnasium vector env exposes:
its spaces, its size, its time limits and its methods. A torch-native task's own class
attributes stay inside envs/, so an agent learns a user's env by the path rltrans's tasks take.

Every attribute read on a torch env from code outside envs/ (and outside Gymnasium's own
VectorEnv base) is recorded while a run trains; any name beyond the facts fails the test.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gymnasium
import pytest

import rltrans.envs.torch_envs.base as base
from rltrans.envs.torch_envs.base import TorchVectorEnv
from rltrans.train import main as train_main

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


@pytest.mark.parametrize(
    "algo", [["algo=ppo", "algo.num_steps=64"], ["algo=impala", "algo.num_steps=32"]]
)
@pytest.mark.parametrize("env", ["count_recall", "passive_tmaze", "repeat_first"])
def test_trainers_and_the_horizon_fit_read_only_the_facts_of_an_env(reads, algo, env, tmp_path):
    assert train_main([f"env={env}", *algo, *TRAINING, f"run_dir={tmp_path}"]) == 0
    assert reads, "nothing recorded: the recorder is not in the path"
    beyond = sorted((name, where) for name, where in reads if name not in FACTS)
    assert not beyond, f"task attributes read outside envs/: {beyond}"
