"""train.yaml's own keys and the runtime section typed: the plan's ``run`` and ``runtime``,
their ranges as the config check."""

from __future__ import annotations

import dataclasses

import pytest

import rltrans
from rltrans.config import ConfigError, load_config, to_container
from rltrans.config.run_settings import (
    LocalRuntime,
    ProcessRuntime,
    RayRuntime,
    RunSettings,
    runtime_settings,
)


def test_the_plan_carries_the_top_level_keys_typed():
    plan = rltrans.plan(seed=7, compile=False, torch_threads=2, checkpoint_every=4)
    run = plan.run
    assert (run.seed, run.compile, run.torch_threads, run.checkpoint_every) == (7, False, 2, 4)
    assert run == RunSettings.from_config(plan.config)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.seed = 1  # type: ignore[misc]
    top = {k for k in plan.config if k not in ("agent", "algo", "env", "runtime")}
    assert top == {f.name for f in dataclasses.fields(RunSettings)}


def test_the_defaults_are_the_files():
    """The shipped train.yaml is written from these fields: its values are their defaults."""
    cfg = load_config([])
    fields = dataclasses.fields(RunSettings)
    assert {f.name: cfg[f.name] for f in fields} == {f.name: f.default for f in fields}


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("checkpoint_every=0", r"checkpoint_every=0: expected an integer >= 1"),
        ("seed=-1", r"seed=-1: expected an integer in \[0, 4294967295\]"),
        ("torch_threads=many", r"torch_threads=many: expected auto or an integer in \[0, 1024\]"),
        ("compile=sometimes", r"compile=sometimes: expected auto or true or false"),
        ("rollout=gpu", r"rollout=gpu: expected one of: auto, device, generic"),
        ("run_dir=''", r"run_dir='': expected null or a non-empty string"),
        ("dataset_kind=hdf5", r"dataset_kind=hdf5: expected one of: auto, minari, dqn_replay"),
    ],
)
def test_a_fields_type_and_range_are_the_config_check(override, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config([override])


@pytest.mark.parametrize("override", ["torch_threads=auto", "compile=auto", "compile=true"])
def test_the_words_a_field_offers_are_accepted(override):
    key, value = override.split("=")
    assert str(load_config([override])[key]).lower() == value


@pytest.mark.parametrize(
    ("runtime", "cls"),
    [("local", LocalRuntime), ("process", ProcessRuntime), ("ray", RayRuntime)],
)
def test_the_plan_types_the_runtime_by_its_kind(runtime, cls):
    plan = rltrans.plan(algo="impala", runtime=runtime, **{"runtime.num_actors": 2})
    assert type(plan.runtime) is cls and plan.runtime.num_actors == 2
    assert plan.runtime == runtime_settings(to_container(plan.config.runtime))


def test_a_runtime_key_of_another_kind_is_unrepresentable():
    """In-process actors have no envs_per_actor: the typed section refuses it by name."""
    assert not hasattr(LocalRuntime(), "envs_per_actor")
    with pytest.raises(ValueError, match=r"runtime\.envs_per_actor: not a key of LocalRuntime"):
        runtime_settings({"kind": "local", "envs_per_actor": 2})
    with pytest.raises(ValueError, match=r"runtime\.kind='gpu'; valid kinds: local, process, ray"):
        runtime_settings({"kind": "gpu"})
