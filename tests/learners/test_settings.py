"""The learners' typed settings: one frozen dataclass per algo kind whose fields and defaults
are its YAML file's, built once by the run plan and refused where a key does not belong."""

from __future__ import annotations

import dataclasses

import pytest

import rltrans
from rltrans.config import ConfigError, load_config, to_container
from rltrans.config.run_settings import RUNTIMES
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


FILES = ["algo/ppo", "algo/impala", "algo/offline", "train", *(f"runtime/{k}" for k in RUNTIMES)]


@pytest.mark.parametrize("name", FILES)
def test_the_config_files_are_made_from_the_settings(name):
    """Each knob is defined once, in its field: the shipped YAML file is that field's default
    and help (rewrite with ``python -m rltrans.config.settings_files`` after changing one)."""
    from rltrans.config.files import config_root
    from rltrans.config.settings_files import FILES as MADE
    from rltrans.config.settings_files import render

    assert set(MADE) == set(FILES)
    shipped = (config_root() / f"{name}.yaml").read_text()
    assert shipped == render(name), f"configs/{name}.yaml differs from its settings"


@pytest.mark.parametrize("value", [3e-4, 1.25e-4, 1e-8, 2e6, 0.99, 1.0, 0.0, 100000])
def test_a_generated_default_reads_back_as_the_same_number(value):
    """YAML 1.1 reads 3e-4 as a string: the writer puts in the dot and the exponent's sign."""
    from omegaconf import OmegaConf

    from rltrans.config.settings_files import yaml_value

    assert OmegaConf.create(f"x: {yaml_value(value)}").x == value


def test_a_fields_range_is_its_config_check():
    """The range stated in a field is what the command line refuses, in the usual words."""
    with pytest.raises(ConfigError, match=r"algo\.clip_coef=0: expected null or a number > 0"):
        load_config(["algo.clip_coef=0"])
    with pytest.raises(ConfigError, match=r"algo\.top_fraction=1\.5: expected a number in"):
        load_config(["agent=dt", "algo.top_fraction=1.5"])


def test_two_kinds_sharing_a_key_must_accept_the_same_values():
    from rltrans.config.keys import settings_specs
    from rltrans.learners.settings import knob

    @dataclasses.dataclass(frozen=True)
    class Wide:
        lr: float = knob(1e-3, "learning rate", low=0.0, open_low=True)

    @dataclasses.dataclass(frozen=True)
    class Narrow:
        lr: float = knob(1e-3, "learning rate", low=0.0, high=1.0, open_low=True)

    with pytest.raises(TypeError, match=r"algo\.lr: Narrow accepts a number in"):
        settings_specs("algo", [Wide, Narrow])
