"""Collected CartPole datasets and DT/BC runs trained on them, for the export tests."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym

from rltrans.collect import main as collect_main
from rltrans.train import main as train_main

LIMIT = 40  # CartPole's step limit in these datasets: the best return, and the best target
OFFLINE = ["progress=false", "tensorboard=false", "algo.log_every=100"]
TINY = {  # a few gradient steps: policies whose episodes end at scattered steps
    "dt": ["agent=dt", "agent.dim=16", "agent.layers=1", "agent.context=4", "train_steps=20"],
    "bc": ["agent=bc", "agent.dim=16", "agent.layers=1", "agent.history=4", "train_steps=20"],
}
# A DT that reaches the data's best return in every episode at the best target.
TRAINED_DT = [
    "agent=dt",
    "agent.dim=32",
    "agent.layers=1",
    "agent.context=4",
    "agent.dropout=0",
    "algo.batch_size=32",
    "algo.lr=1e-3",
    "train_steps=1500",
]


def collect_cartpole(dataset_id: str, episodes: int) -> None:
    """The scripted controller's episodes and random ones, half each, cut at LIMIT steps."""
    args = [
        f"dataset_id={dataset_id}",
        "env_id=CartPole-v1",
        "policy=rltrans.envs.scripted:CartPoleController",
        "epsilon=[0,1]",
        f"episodes={episodes}",
        "num_envs=10",
        f"max_episode_steps={LIMIT}",
        "progress=false",
    ]
    assert collect_main(args) == 0


def train_offline(run: Path, dataset_id: str, knobs: list[str]) -> Path:
    """An offline run on ``dataset_id``."""
    assert train_main([f"dataset={dataset_id}", *knobs, *OFFLINE, f"run_dir={run}"]) == 0
    return run


def cartpole_envs(n: int) -> gym.vector.VectorEnv:
    """n CartPoles cut at LIMIT steps, reset in the step that ends an episode."""
    return gym.make_vec(
        "CartPole-v1",
        num_envs=n,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        max_episode_steps=LIMIT,
    )
