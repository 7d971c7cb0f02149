"""Shared pieces of the command-line tests: a tiny PPO config and the JSON summary line."""

from __future__ import annotations

import json

# T-maze (torch-native, the default env): updates of 4 envs x 16 steps in about a second.
TINY_PPO = [
    "env.num_envs=4",
    "algo.num_steps=16",
    "algo.segment_length=8",
    "algo.num_minibatches=2",
    "algo.epochs=1",
    "agent.dim=16",
    "agent.layers=1",
    "agent.heads=2",
    "agent.memory=8",
    "progress=false",
]


def summary_line(out: str) -> dict:
    """The one JSON summary line a command printed on stdout."""
    lines = [line for line in out.strip().splitlines() if line.startswith("{")]
    assert len(lines) == 1, out
    return json.loads(lines[0])
