"""Exported programs equal ``load_policy`` over whole episodes: for every online agent, ONNX
Runtime and the PyTorch policy act side by side in a vector env whose episodes end at
different steps; actions are equal, logits and values within 1e-5, and the memory each
program hands back equals the policy's own state after every step (so it is carried through
and reset per env)."""

from __future__ import annotations

import pytest

import rltrans
from rltrans.deploy.write import acting_program
from rltrans.envs.torch_envs import make_torch_env
from rltrans.policy import load_policy
from tests.deploy.helpers import AGENTS, side_by_side, train_tiny


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_onnx_program_equals_load_policy_over_whole_episodes(agent, tmp_path):
    run = train_tiny(tmp_path, agent)
    program = tmp_path / f"{agent}.onnx"
    summary = rltrans.export(run, program, value=True)
    assert summary["program"] == str(program)
    policy = load_policy(run, torch_threads=None)
    layout = acting_program(policy)  # the policy's state as the program lays it out
    envs = make_torch_env("stateless_cartpole", num_envs=4)
    counts = side_by_side(program, policy, envs, 3, layout.state_tensors)
    assert counts["episodes"] >= 12 and counts["staggered_resets"] >= 3, counts
