"""Exported Decision Transformer and BC policies equal ``load_policy`` over whole episodes:
the context window carried as the program's state, the target return an input, the reward
counted down inside the program and everything reset per env at its episode start."""

from __future__ import annotations

import pytest

import rltrans
from rltrans.deploy.write import acting_program
from rltrans.policy import load_policy
from tests.deploy.helpers import side_by_side
from tests.deploy.offline import TINY, cartpole_envs, collect_cartpole, train_offline


@pytest.fixture(scope="module")
def dataset(minari_root) -> str:
    collect_cartpole("rltrans/export-cp-v0", episodes=12)
    return "rltrans/export-cp-v0"


@pytest.mark.parametrize("kind", sorted(TINY))
def test_onnx_program_equals_load_policy_over_whole_episodes(kind, dataset, tmp_path):
    run = train_offline(tmp_path / kind, dataset, TINY[kind])
    program = tmp_path / f"{kind}.onnx"
    rltrans.export(run, program)
    policy = load_policy(run, torch_threads=None)
    policy.deterministic = True  # the exported program's mode (sample=false)
    target = policy.target_return
    layout = acting_program(policy)
    counts = side_by_side(program, policy, cartpole_envs(4), 3, layout.state_tensors, target)
    assert counts["episodes"] >= 12 and counts["staggered_resets"] >= 3, counts
