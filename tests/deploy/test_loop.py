"""A user's loop: the exported quickstart T-maze policy and a DT on a collected CartPole
dataset, each run by a 20-line ONNX Runtime loop that imports nothing from rltrans
(tests/deploy/loop.py, the deploy guide's loop), solve their tasks in 100 of 100 episodes."""

from __future__ import annotations

import ast
import inspect

import pytest

import rltrans
from rltrans.envs.torch_envs import make_torch_env
from rltrans.train import main as train_main
from tests.deploy.helpers import TINY_RUN  # skips the module without the export extra
from tests.deploy.offline import LIMIT, TRAINED_DT, cartpole_envs, collect_cartpole, train_offline

loop = pytest.importorskip("tests.deploy.loop")  # the user's loop imports onnxruntime itself

# The quickstart command (GTrXL + PPO on the T-maze) made small: a corridor of 2, one layer.
TMAZE = ["agent.dim=16", "agent.heads=2", "agent.layers=1", "env.kwargs.length=2"]
TMAZE += ["env.num_envs=16", "algo.num_steps=16", "algo.num_minibatches=2", "algo.lr=2e-3"]
TMAZE += ["total_steps=12288", "seed=1", *TINY_RUN[-3:-1]]  # progress, tensorboard off


def test_the_loop_imports_nothing_from_rltrans_and_is_twenty_lines():
    tree = ast.parse(inspect.getsource(loop))
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names and not [n for n in names if n.split(".")[0] in ("rltrans", "tests")], names
    lines = inspect.getsource(loop.play).splitlines()[2:]  # after the def and its docstring
    assert len(lines) <= 20, len(lines)


def test_exported_tmaze_policy_succeeds_in_every_episode(tmp_path):
    run = tmp_path / "tmaze"
    assert train_main([*TMAZE, f"run_dir={run}"]) == 0
    program = tmp_path / "tmaze.onnx"
    rltrans.export(run, program)
    envs = make_torch_env("tmaze", num_envs=10, length=2)
    ended = loop.play(str(program), envs, episodes=100)
    assert len(ended) == 100 and all(success for _, success in ended), ended


def test_exported_dt_reaches_the_best_return_in_every_episode(minari_root, tmp_path):
    collect_cartpole("rltrans/export-cp-best-v0", episodes=100)
    run = train_offline(tmp_path / "dt", "rltrans/export-cp-best-v0", TRAINED_DT)
    program = tmp_path / "dt.onnx"
    rltrans.export(run, program)  # the sidecar's target_return default: the data's best, 40
    ended = loop.play(str(program), cartpole_envs(10), episodes=100)
    assert len(ended) == 100 and all(ret == LIMIT for ret, _ in ended), ended
