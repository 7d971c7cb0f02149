"""The learners' typed settings: one frozen dataclass per algo kind whose fields and defaults
are its YAML file's, built once by the run plan and refused where a key does not belong."""

from __future__ import annotations

import dataclasses

import pytest

import rltrans
from rltrans.config import ConfigError, load_config, to_container
from rltrans.learners.settings import (
    ImpalaConfig,
    OfflineConfig,
    PPOConfig,
    algo_settings,
)

ALGO_FILES = {"ppo": PPOConfig, "ppo_memory": PPOConfig, "impala": ImpalaConfig}
ALGO_FILES |= {"impala_paper": ImpalaConfig, "offline": OfflineConfig}


def defaults(cls: type) -> dict:
    """A settings class's fields with their defaults."""
    out = {}
    for f in dataclasses.fields(cls):
        out[f.name] = f.default_factory() if callable(f.default_factory) else f.default
    return out


def algo_section(name: str) -> dict:
    """The composed ``algo`` section of ``algo=<name>`` (with an agent that trains on it)."""
    agent = ["agent=dt"] if name == "offline" else []
    return to_container(load_config([*agent, f"algo={name}"]).algo)


@pytest.mark.parametrize("name", ["ppo", "impala", "offline"])
def test_defaults_are_the_yaml_files(name):
    """A learner built in Python with no arguments trains as the command line's defaults."""
    algo = algo_section(name)
    settings = algo_settings(algo)
    expected = {k: tuple(v) if isinstance(v, list) else v for k, v in algo.items()}
    assert dataclasses.asdict(settings) == expected
    own = defaults(type(settings))
    if name == "offline":  # the DQN Replay reader's options live in the YAML file only
        own.pop("dqn_replay"), expected.pop("dqn_replay")
    assert own == expected


@pytest.mark.parametrize("name", sorted(ALGO_FILES))
def test_every_algo_file_resolves_to_its_kinds_settings(name):
    settings = algo_settings(algo_section(name))
    assert type(settings) is ALGO_FILES[name]


def test_a_key_of_another_kind_is_refused_naming_it():
    with pytest.raises(
        ValueError, match=r"algo\.rho_bar: not a key of PPOConfig \(kind 'online'\)"
    ):
        algo_settings({"kind": "online", "rho_bar": 1.0})
    with pytest.raises(ValueError, match=r"algo.kind='dqn'; valid kinds: online, impala, offline"):
        algo_settings({"kind": "dqn"})


def test_settings_are_frozen_and_their_optimizer_follows_them():
    ppo = PPOConfig(lr=1e-3, max_grad_norm=None, amp=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ppo.lr = 1.0  # type: ignore[misc]
    assert (ppo.optim.lr, ppo.optim.max_grad_norm, ppo.optim.amp) == (1e-3, None, True)
    impala = ImpalaConfig(adam_eps=1e-3)
    assert impala.optim.eps == 1e-3
    offline = OfflineConfig(warmup_updates=7, weight_decay=0.5)
    assert (offline.optim.warmup_updates, offline.optim.weight_decay) == (7, 0.5)


def test_the_plan_carries_the_typed_section_of_its_config():
    plan = rltrans.plan(algo="impala", **{"algo.rho_bar": 0.5, "algo.eval_episodes": 3})
    assert isinstance(plan.algo, ImpalaConfig)
    assert plan.algo == algo_settings(to_container(plan.config.algo))
    assert (plan.algo.rho_bar, plan.algo.eval_episodes) == (0.5, 3)
    with pytest.raises(ConfigError, match="algo.kind"):
        rltrans.plan(**{"algo.kind": "dqn"})
